//! The scheduler thread: owns the engine (and so the KV cache) and runs the
//! continuous-batching loop.
//!
//! One iteration:
//! 1. take every command waiting on the channel (submit, cancel, cancel-all);
//! 2. one prefill step of at most `--prefill-max-tokens` tokens: the next
//!    chunks of prompts already admitted, then requests admitted from the
//!    pending queue ([`admission::plan`]; a prefix-cache hit skips the cached
//!    part of a prompt) with what is left of the budget ([`chunking`]);
//!    requests whose prompt completes get their first token;
//! 3. run one batched decode step over up to `--max-batch-size` decoding
//!    sequences, rotating through them when there are more;
//! 4. publish gauges.
//!
//! The engine is the one owner of sequence state ([`StepEngine`]): which
//! sequences still prefill, which decode, how many tokens each emitted. The
//! worker keeps only what each request's client needs ([`Running`]: its
//! event channel, its span, its prefill chunk count) and the decode rotation
//! cursor. Finished sequences come back from each engine step as an event
//! list; their KV blocks were released inside the step. When there is
//! nothing to do the thread blocks on the command channel: no busy loop, no
//! polling sleep.
//!
//! A client that leaves is noticed two ways: its stream task sends
//! `Command::Cancel` (the usual path, also for requests still queued), and a
//! failed event send while emitting tokens. Either way the sequence leaves the
//! batch at once and its blocks are freed. A stop string matched by the
//! stream task takes the same path (`CancelReason::StopString`): the sequence
//! leaves the batch before the next step (or its next prefill chunk) and is
//! counted as finished.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use ember_engine::{
    AdmissionCost, EngineError, FinishReason, PrefillChunk, SeqId, StepEngine, StepOutput,
};
use tokio::sync::mpsc;

use super::admission::{self, AdmissionBudget, Candidate};
use super::chunking;
use super::knobs::SchedulerKnobs;
use super::request::{Admission, CancelReason, Command, Event, FinishKind, QueuedRequest};
use super::rotation::rotation;
use super::stats::SchedulerStats;

/// What the worker keeps of an admitted request: its client's side.
#[derive(Debug)]
struct Running {
    events: mpsc::UnboundedSender<Event>,
    /// Prefill steps that computed part of its prompt so far.
    chunks: u32,
    /// The request's span, entered for this thread's lines about it.
    span: tracing::Span,
}

pub(crate) struct Worker<E: StepEngine> {
    engine: E,
    knobs: SchedulerKnobs,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Submitted, not yet admitted; FIFO.
    pending: VecDeque<QueuedRequest>,
    /// Admitted and not finished (prefilling or decoding).
    running: HashMap<SeqId, Running>,
    /// Decode rotation: the next step starts at the first decoding id at or
    /// after this one (wrapping), so with more decoding sequences than
    /// `--max-batch-size` every one gets its turn.
    decode_from: SeqId,
    stats: Arc<SchedulerStats>,
    iteration: u64,
}

impl<E: StepEngine> Worker<E> {
    pub(crate) fn new(
        engine: E,
        knobs: SchedulerKnobs,
        commands: mpsc::UnboundedReceiver<Command>,
        stats: Arc<SchedulerStats>,
    ) -> Self {
        SchedulerStats::set(&stats.kv_blocks_total, engine.kv_blocks_total());
        Self {
            engine,
            knobs,
            commands,
            pending: VecDeque::new(),
            running: HashMap::new(),
            decode_from: 0,
            stats,
            iteration: 0,
        }
    }

    /// Runs until every [`SchedulerHandle`](super::SchedulerHandle) is dropped.
    pub(crate) fn run(mut self) {
        loop {
            if self.is_idle() {
                // Nothing to do: block until a command arrives.
                match self.commands.blocking_recv() {
                    Some(cmd) => self.handle(cmd),
                    None => break,
                }
            }
            if self.drain_commands() {
                self.cancel_all(CancelReason::Shutdown);
                break;
            }
            if !self.is_idle() {
                self.iterate();
            }
            self.publish_gauges();
        }
        self.publish_gauges();
        tracing::info!("scheduler thread stopped");
    }

    /// Handles every command waiting on the channel. True if every handle is
    /// gone (the server stopped).
    fn drain_commands(&mut self) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(cmd) => self.handle(cmd),
                Err(mpsc::error::TryRecvError::Empty) => return false,
                Err(mpsc::error::TryRecvError::Disconnected) => return true,
            }
        }
    }

    fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.running.is_empty()
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(req) => self.pending.push_back(*req),
            Command::Cancel { id, reason } => self.cancel(id, reason),
            Command::CancelAll => self.cancel_all(CancelReason::Shutdown),
        }
    }

    /// One scheduler iteration: a prefill step (continuing chunks and
    /// admissions), then one decode step.
    fn iterate(&mut self) {
        self.iteration += 1;
        SchedulerStats::bump(&self.stats.iterations);
        if self.prefill_step() {
            // Readers (GetServerInfo, metrics) see admissions before the
            // decode step runs, not an iteration late.
            self.publish_gauges();
        }
        self.decode_step();
    }

    /// Runs this iteration's prefill step; true if it admitted anything.
    fn prefill_step(&mut self) -> bool {
        let mut chunks = self.continuing_chunks();
        let spent: usize = chunks.iter().map(|c| c.tokens).sum();
        let admitted = self.admit(
            self.knobs.prefill_max_tokens.saturating_sub(spent),
            self.knobs
                .prefill_max_batch_size
                .saturating_sub(chunks.len()),
        );
        let any_admitted = !admitted.is_empty();
        chunks.extend(admitted);
        if chunks.is_empty() {
            return false;
        }
        let ids: Vec<SeqId> = chunks.iter().map(|c| c.id).collect();
        let result = guarded(|| self.engine.prefill_step(&chunks));
        if result.is_ok() {
            // Still prefilling after the step: the rest completed their prompt.
            let unfinished: Vec<SeqId> = self.engine.to_prefill().iter().map(|p| p.0).collect();
            for id in &ids {
                if let Some(r) = self.running.get_mut(id) {
                    r.chunks += 1;
                    if !unfinished.contains(id) {
                        let _ = r.events.send(Event::Prefilled { chunks: r.chunks });
                    }
                }
            }
        }
        self.apply(result, &ids);
        any_admitted
    }

    /// The next chunks of prompts admitted in earlier iterations, oldest
    /// first, within the iteration's token budget and row cap.
    fn continuing_chunks(&self) -> Vec<PrefillChunk> {
        let waiting = self.engine.to_prefill();
        let sizes = chunking::split(
            self.knobs.prefill_max_tokens,
            self.knobs.prefill_max_batch_size,
            waiting.iter().map(|&(_, left)| left),
        );
        waiting
            .into_iter()
            .zip(sizes)
            .map(|((id, _), tokens)| PrefillChunk { id, tokens })
            .collect()
    }

    /// Admits requests from the front of the pending queue into the engine
    /// (blocks reserved, cached prefix found) and returns their first chunks,
    /// at most `rows` of them within `budget` tokens.
    fn admit(&mut self, budget: usize, rows: usize) -> Vec<PrefillChunk> {
        self.drop_gone_clients();
        let n = self.plan_admission(budget, rows);
        let mut admitted = Vec::with_capacity(n);
        let mut left = budget;
        for _ in 0..n {
            let Some(front) = self.pending.front() else {
                break;
            };
            let cached = match guarded(|| self.engine.admit(&front.seq)) {
                Ok(cached) => cached,
                // The plan's estimate was off: wait for blocks like any request.
                Err(EngineError::OutOfBlocks { .. }) => break,
                Err(err) => {
                    self.fail_front(&err);
                    continue;
                }
            };
            // Dropping the permit frees the request's place in the pending queue.
            let Some(req) = self.pending.pop_front() else {
                break;
            };
            let prompt_len = req.seq.prompt.len();
            self.record_prefix_lookup(prompt_len, cached);
            let tokens = (prompt_len - cached).min(left).max(1);
            left = left.saturating_sub(tokens);
            let id = req.id();
            self.running.insert(
                id,
                Running {
                    events: req.events,
                    chunks: 0,
                    span: req.span,
                },
            );
            admitted.push((PrefillChunk { id, tokens }, cached));
        }
        self.announce(&admitted);
        admitted.into_iter().map(|(chunk, _)| chunk).collect()
    }

    /// Requests whose client already left are dropped before planning.
    fn drop_gone_clients(&mut self) {
        let stats = &self.stats;
        self.pending.retain(|r| {
            let gone = r.events.is_closed();
            if gone {
                SchedulerStats::bump(&stats.cancelled);
            }
            !gone
        });
    }

    /// How many requests from the front of the queue this iteration admits.
    fn plan_admission(&self, budget: usize, rows: usize) -> usize {
        let plan = AdmissionBudget {
            max_requests: rows,
            max_prompt_tokens: budget,
            free_running_slots: self.knobs.max_running().saturating_sub(self.running.len()),
            free_blocks: self.engine.kv_blocks_free(),
        };
        let engine = &self.engine;
        admission::plan(
            plan,
            self.pending.iter().map(|r| {
                let AdmissionCost {
                    blocks,
                    cached_tokens,
                } = engine.admission_cost(&r.seq);
                Candidate {
                    prompt_tokens: r.seq.prompt.len() - cached_tokens,
                    blocks,
                }
            }),
        )
    }

    /// Fails the request at the front of the queue, which the engine refused.
    fn fail_front(&mut self, err: &EngineError) {
        if let Some(req) = self.pending.pop_front() {
            req.span
                .in_scope(|| tracing::error!(%err, id = req.id(), "admission failed"));
            SchedulerStats::bump(&self.stats.failed);
            let _ = req.events.send(Event::Failed {
                message: err.to_string(),
            });
        }
    }

    /// Sends each newly admitted request its `Admitted` event.
    fn announce(&self, admitted: &[(PrefillChunk, usize)]) {
        let admitted_at = Instant::now();
        for (chunk, cached) in admitted {
            if let Some(r) = self.running.get(&chunk.id) {
                r.span.in_scope(|| {
                    tracing::debug!(
                        prefill_batch_size = admitted.len(),
                        iteration = self.iteration,
                        cached_prompt_tokens = cached,
                        "admitted"
                    )
                });
                let _ = r.events.send(Event::Admitted(Admission {
                    admitted_at,
                    prefill_batch_size: admitted.len() as u32,
                    iteration: self.iteration,
                    cached_prompt_tokens: *cached as u32,
                }));
            }
        }
        SchedulerStats::add(&self.stats.admitted, admitted.len() as u64);
    }

    /// Counts one admitted prompt's prefix-cache lookup.
    fn record_prefix_lookup(&self, prompt_tokens: usize, cached: usize) {
        if !self.engine.prefix_caching() {
            return;
        }
        SchedulerStats::add(
            &self.stats.prefix_cache_queried_tokens,
            prompt_tokens as u64,
        );
        SchedulerStats::add(&self.stats.prefix_cache_hit_tokens, cached as u64);
        crate::metrics::record_prefix_cache(prompt_tokens as u64, cached as u64);
    }

    /// One decode step over up to `--max-batch-size` decoding sequences,
    /// starting at the rotation cursor.
    fn decode_step(&mut self) {
        let decoding = self.engine.decoding();
        let ids = rotation(&decoding, self.decode_from, self.knobs.max_batch_size);
        let Some(&last) = ids.last() else {
            return;
        };
        self.decode_from = last + 1;
        let result = guarded(|| self.engine.decode(&ids));
        self.apply(result, &ids);
    }

    /// Sends a step's tokens and finish events; on an engine failure fails
    /// every request of the step and frees its blocks.
    fn apply(&mut self, result: Result<StepOutput, EngineError>, ids: &[SeqId]) {
        let out = match result {
            Ok(out) => out,
            Err(err) => return self.fail_step(&err, ids),
        };
        let now = Instant::now();
        let mut gone = Vec::new();
        for t in out.tokens {
            if let Some(r) = self.running.get(&t.id) {
                let sent = r.events.send(Event::Token {
                    index: t.index as u32,
                    token_id: t.token,
                    at: now,
                    logprobs: t.logprobs,
                });
                if sent.is_err() {
                    gone.push(t.id);
                }
            }
        }
        for f in out.finished {
            if let Some(r) = self.running.remove(&f.id) {
                let kind = match f.reason {
                    FinishReason::Eos => FinishKind::Eos,
                    FinishReason::Length => FinishKind::Length,
                    FinishReason::StopToken(token) => FinishKind::StopToken(token),
                };
                // Counted before the client can see the end of its stream.
                SchedulerStats::bump(&self.stats.finished);
                r.span
                    .in_scope(|| tracing::debug!(reason = ?kind, tokens = f.generated, "finished"));
                let _ = r.events.send(Event::Finished {
                    kind,
                    completion_tokens: f.generated as u32,
                });
            }
        }
        if !gone.is_empty() {
            // A stream task that stops on its own (deadline) sends its cancel
            // command before it drops the receiver: take waiting commands first
            // so the request is counted under the reason it gave.
            self.drain_commands();
            for id in gone {
                self.cancel(id, CancelReason::ClientGone);
            }
        }
    }

    /// Fails every request of a step the engine could not run.
    fn fail_step(&mut self, err: &EngineError, ids: &[SeqId]) {
        tracing::error!(%err, batch = ids.len(), "engine step failed");
        for id in ids {
            if let Some(r) = self.running.remove(id) {
                r.span
                    .in_scope(|| tracing::debug!(%err, "failed with its batch"));
                self.engine.release(*id);
                let _ = r.events.send(Event::Failed {
                    message: err.to_string(),
                });
                SchedulerStats::bump(&self.stats.failed);
            }
        }
    }

    /// Removes a request wherever it is; frees its blocks if it was running.
    fn cancel(&mut self, id: SeqId, reason: CancelReason) {
        let (events, generated, span) = if let Some(r) = self.running.remove(&id) {
            let generated = self.engine.release(id).unwrap_or(0);
            (r.events, generated as u32, r.span)
        } else if let Some(pos) = self.pending.iter().position(|r| r.id() == id) {
            match self.pending.remove(pos) {
                Some(r) => (r.events, 0, r.span),
                None => return,
            }
        } else {
            return; // already finished
        };
        span.in_scope(|| tracing::debug!(?reason, generated, "cancelled"));
        match reason {
            CancelReason::DeadlineExceeded => SchedulerStats::bump(&self.stats.deadline_exceeded),
            CancelReason::ClientGone | CancelReason::Shutdown => {
                SchedulerStats::bump(&self.stats.cancelled)
            }
            CancelReason::StopString => SchedulerStats::bump(&self.stats.finished),
        }
        let _ = events.send(Event::Finished {
            kind: FinishKind::Cancelled,
            completion_tokens: generated,
        });
    }

    fn cancel_all(&mut self, reason: CancelReason) {
        let ids: Vec<SeqId> = self
            .pending
            .iter()
            .map(QueuedRequest::id)
            .chain(self.running.keys().copied())
            .collect();
        if !ids.is_empty() {
            tracing::warn!(
                requests = ids.len(),
                "cancelling every queued and running request"
            );
        }
        for id in ids {
            self.cancel(id, reason);
        }
    }

    fn publish_gauges(&self) {
        let s = &self.stats;
        let used = self.engine.kv_blocks_used();
        SchedulerStats::set(&s.queue_depth, self.pending.len());
        SchedulerStats::set(&s.active_sequences, self.running.len());
        SchedulerStats::set(&s.kv_blocks_used, used);
        crate::metrics::record_gauges(
            self.pending.len(),
            self.running.len(),
            used,
            self.engine.kv_blocks_total(),
        );
    }
}

/// Runs an engine call, turning a panic inside Burn (e.g. a device error) into
/// an `EngineError` so one bad batch fails its requests instead of the thread.
fn guarded<T>(f: impl FnOnce() -> Result<T, EngineError>) -> Result<T, EngineError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => Err(EngineError::Device(format!(
            "engine panicked: {}",
            ember_engine::panics::panic_message(panic.as_ref())
        ))),
    }
}
