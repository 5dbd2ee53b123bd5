//! The scheduler thread: owns the engine (and so the KV cache) and runs the
//! continuous-batching loop.
//!
//! One iteration:
//! 1. take every command waiting on the channel (submit, cancel, cancel-all);
//! 2. admit from the pending queue ([`admission::plan`]) and run the admitted
//!    requests in one batched prefill; their first tokens go out;
//! 3. run one batched decode step over up to `--max-batch-size` running
//!    sequences, rotating through the running set when it is larger;
//! 4. publish gauges.
//!
//! Finished sequences come back from each engine step as an event list; their
//! KV blocks were released inside the step. When there is nothing to do the
//! thread blocks on the command channel: no busy loop, no polling sleep.
//!
//! A client that leaves is noticed two ways: its stream task sends
//! `Command::Cancel` (the usual path, also for requests still queued), and a
//! failed event send while emitting tokens. Either way the sequence leaves the
//! batch at once and its blocks are freed. A stop string matched by the
//! stream task takes the same path (`CancelReason::StopString`): the sequence
//! leaves the batch before the next step and is counted as finished.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use super::admission::{self, AdmissionBudget, Candidate};
use super::request::{Admission, CancelReason, Event, FinishKind, QueuedRequest};
use super::stats::SchedulerStats;
use super::Command;
use crate::cli::SchedulerKnobs;
use crate::engine::{Engine, EngineError, FinishReason, SeqId, SequenceRequest, StepOutput};

/// A sequence between admission and its last token.
#[derive(Debug)]
struct Running {
    events: mpsc::UnboundedSender<Event>,
    /// Tokens sent so far (the next token's index).
    generated: u32,
    /// The request's span, entered for this thread's lines about it.
    span: tracing::Span,
}

pub(crate) struct Worker {
    engine: Engine,
    knobs: SchedulerKnobs,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Submitted, not yet admitted; FIFO.
    pending: VecDeque<QueuedRequest>,
    running: HashMap<SeqId, Running>,
    /// Decode rotation order. May hold ids that already finished (skipped and
    /// dropped when reached), so finishing never scans this queue.
    decode_order: VecDeque<SeqId>,
    stats: Arc<SchedulerStats>,
    iteration: u64,
}

impl Worker {
    pub(crate) fn new(
        engine: Engine,
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
            decode_order: VecDeque::new(),
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
            Command::Submit(req) => self.pending.push_back(req),
            Command::Cancel { id, reason } => self.cancel(id, reason),
            Command::CancelAll => self.cancel_all(CancelReason::Shutdown),
        }
    }

    /// One scheduler iteration: admission + prefill, then one decode step.
    fn iterate(&mut self) {
        self.iteration += 1;
        SchedulerStats::bump(&self.stats.iterations);
        if self.admit_and_prefill() {
            // Readers (GetServerInfo, metrics) see admissions before the
            // decode step runs, not an iteration late.
            self.publish_gauges();
        }
        self.decode_step();
    }

    /// True if anything was admitted.
    fn admit_and_prefill(&mut self) -> bool {
        // Requests whose client already left are dropped before planning.
        self.pending.retain(|r| {
            let gone = r.events.is_closed();
            if gone {
                SchedulerStats::bump(&self.stats.cancelled);
            }
            !gone
        });
        let budget = AdmissionBudget {
            max_requests: self.knobs.prefill_max_batch_size,
            max_prompt_tokens: self.knobs.prefill_max_tokens,
            free_running_slots: self.knobs.max_running().saturating_sub(self.running.len()),
            free_blocks: self.engine.kv_blocks_free(),
        };
        let engine = &self.engine;
        let n = admission::plan(
            budget,
            self.pending.iter().map(|r| Candidate {
                prompt_tokens: r.prompt.len(),
                blocks: engine.blocks_required(r.prompt.len(), r.max_new_tokens),
            }),
        );
        if n == 0 {
            return false;
        }
        let admission = Admission {
            admitted_at: Instant::now(),
            prefill_batch_size: n as u32,
            iteration: self.iteration,
        };
        let mut seqs = Vec::with_capacity(n);
        for req in self.pending.drain(..n) {
            // Dropping the permit frees the request's place in the pending queue.
            let QueuedRequest {
                id,
                prompt,
                max_new_tokens,
                ignore_eos,
                sampling,
                stop_token_ids,
                logprobs,
                events,
                span,
                ..
            } = req;
            span.in_scope(|| {
                tracing::debug!(
                    prefill_batch_size = n,
                    iteration = self.iteration,
                    "admitted"
                )
            });
            let _ = events.send(Event::Admitted(admission));
            self.running.insert(
                id,
                Running {
                    events,
                    generated: 0,
                    span,
                },
            );
            self.decode_order.push_back(id);
            seqs.push(SequenceRequest {
                id,
                prompt,
                max_new_tokens,
                ignore_eos,
                sampling,
                stop_token_ids,
                logprobs,
            });
        }
        self.stats
            .admitted
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        let ids: Vec<SeqId> = seqs.iter().map(|s| s.id).collect();
        let result = guarded(|| self.engine.prefill(seqs));
        self.apply(result, &ids);
        true
    }

    fn decode_step(&mut self) {
        let max = self.knobs.max_batch_size;
        let mut ids = Vec::with_capacity(max.min(self.running.len()));
        for _ in 0..self.decode_order.len() {
            if ids.len() == max {
                break;
            }
            let Some(id) = self.decode_order.pop_front() else {
                break;
            };
            if self.running.contains_key(&id) {
                ids.push(id);
                self.decode_order.push_back(id);
            }
        }
        if ids.is_empty() {
            return;
        }
        let result = guarded(|| self.engine.decode(&ids));
        self.apply(result, &ids);
    }

    /// Sends a step's tokens and finish events; on an engine failure fails
    /// every request of the step and frees its blocks.
    fn apply(&mut self, result: Result<StepOutput, EngineError>, ids: &[SeqId]) {
        let out = match result {
            Ok(out) => out,
            Err(err) => {
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
                return;
            }
        };
        let now = Instant::now();
        let mut gone = Vec::new();
        for t in out.tokens {
            if let Some(r) = self.running.get_mut(&t.id) {
                let sent = r.events.send(Event::Token {
                    index: r.generated,
                    token_id: t.token,
                    at: now,
                    logprobs: t.logprobs,
                });
                r.generated += 1;
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
                    .in_scope(|| tracing::debug!(reason = ?kind, tokens = r.generated, "finished"));
                let _ = r.events.send(Event::Finished {
                    kind,
                    completion_tokens: r.generated,
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

    /// Removes a request wherever it is; frees its blocks if it was running.
    fn cancel(&mut self, id: SeqId, reason: CancelReason) {
        let (events, generated, span) = if let Some(r) = self.running.remove(&id) {
            self.engine.release(id);
            (r.events, r.generated, r.span)
        } else if let Some(pos) = self.pending.iter().position(|r| r.id == id) {
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
            .map(|r| r.id)
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
        SchedulerStats::set(&s.queue_depth, self.pending.len());
        SchedulerStats::set(&s.active_sequences, self.running.len());
        SchedulerStats::set(&s.kv_blocks_used, self.engine.kv_blocks_used());
        crate::metrics::record_gauges(
            self.pending.len(),
            self.running.len(),
            self.engine.kv_blocks_used(),
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
            crate::logging::panic_message(panic.as_ref())
        ))),
    }
}
