//! The scheduler thread: owns the engine (and so the KV cache) and runs the
//! continuous-batching loop.
//!
//! One iteration:
//! 1. take every command waiting on the channel (submit, cancel, cancel-all);
//! 2. one prefill step of at most `--prefill-max-tokens` tokens: the next
//!    chunks of prompts already admitted, then requests admitted from the
//!    wait queue ([`admitting`]; the scheduling policy may first let the
//!    front of the queue preempt running requests, [`preemption`]) with what
//!    is left of the budget ([`chunking`]); requests whose prompt completes
//!    get their first token;
//! 3. one batched decode step over up to `--max-batch-size` decoding
//!    sequences, rotating through them when there are more; if the step
//!    needs more fresh blocks than are free, the policy's victims are
//!    preempted first;
//! 4. publish gauges.
//!
//! **Overlap** (on unless `--no-async-scheduling`): step 3 queues the decode
//! step on the device and then sends the events of the step queued by the
//! previous iteration ([`StepEngine::decode_async`]), so everything the
//! thread does between two decode steps (the events, the commands, the
//! prefill planning, the next step's inputs) runs while the GPU computes.
//! A request that ended in the previous step may be in the step just
//! queued: the engine drops that row's token. Before preempting for a
//! decode step, or when no decode step runs, the queued step is judged
//! first ([`Worker::settle`]), so a preempted client has every token it
//! was going to see and the blocks of finished requests are free.
//!
//! The engine is the one owner of sequence state ([`StepEngine`]): which
//! sequences still prefill, which decode, how many tokens each emitted, which
//! blocks each holds. The worker keeps what each request's client needs
//! ([`Client`]: its event channel, span, priority), the wait queue
//! ([`WaitQueue`], which holds the scheduling policy built from the knobs)
//! and the decode rotation cursor. Admission and preemption are free
//! functions ([`admitting`], [`preemption`]) the loop hands this state to;
//! the worker's fields are its own. Finished sequences come back from each
//! engine step as an event list; their KV blocks were released inside the
//! step. When there is nothing to do the thread blocks on the command
//! channel: no busy loop, no polling sleep.
//!
//! A client that leaves is noticed two ways: its stream task sends
//! `Command::Cancel` (the usual path, also for requests waiting, preempted
//! ones included), and a failed event send while emitting tokens. Either way
//! the sequence leaves the batch at once and its blocks are freed. A stop
//! string matched by the stream task takes the same path
//! (`CancelReason::StopString`) and is counted as finished.

use std::sync::Arc;
use std::time::Instant;

use ember_engine::{EngineError, FinishReason, PrefillChunk, SeqId, StepEngine, StepOutput};
use tokio::sync::mpsc;

use super::admitting::{self, Room};
use super::chunking;
use super::guarded::guarded;
use super::knobs::SchedulerKnobs;
use super::policy;
use super::preemption;
use super::queue::{Client, RunningSet, WaitQueue, Waiting};
use super::request::{CancelReason, Command, Event, FinishKind, QueuedRequest};
use super::rotation::rotation;
use super::stats::SchedulerStats;

pub(crate) struct Worker<E: StepEngine> {
    engine: E,
    knobs: SchedulerKnobs,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Submitted or preempted, not running; in the policy's order.
    waiting: WaitQueue,
    /// Admitted and not finished (prefilling or decoding): each one's client.
    running: RunningSet,
    /// Decode rotation: the next step starts at the first decoding id at or
    /// after this one (wrapping), so with more decoding sequences than
    /// `--max-batch-size` every one gets its turn.
    decode_from: SeqId,
    stats: Arc<SchedulerStats>,
    /// Iterations run (1 for the first); admissions report theirs.
    iteration: u64,
    /// The sequences of the decode step the engine has queued and not yet
    /// judged (the overlapped loop): failed with it if judging it fails.
    queued: Vec<SeqId>,
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
            waiting: WaitQueue::new(policy::build(knobs.policy)),
            knobs,
            commands,
            running: RunningSet::new(),
            decode_from: 0,
            stats,
            iteration: 0,
            queued: Vec::new(),
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
                // A kernel tuned in that iteration held every request up.
                crate::autotune_watch::report_new();
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
        self.waiting.is_empty() && self.running.is_empty()
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(req) => self.enqueue(*req),
            Command::Cancel { id, reason } => self.cancel(id, reason),
            Command::CancelAll => self.cancel_all(CancelReason::Shutdown),
        }
    }

    fn enqueue(&mut self, req: QueuedRequest) {
        let waiting = Waiting {
            seq: req.seq,
            client: Client {
                events: req.events,
                span: req.span,
                priority: req.priority,
                enqueued_at: req.enqueued_at,
                chunks: 0,
                prefilled: false,
                follows: req.follows,
            },
            permit: Some(req.pending_permit),
        };
        self.waiting.push(waiting, Instant::now());
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
        // Preempting for the front of the queue first, so no chunk of this
        // step belongs to a sequence that leaves.
        preemption::make_room_for_front(
            &mut self.engine,
            &mut self.waiting,
            &mut self.running,
            &self.stats,
            self.knobs.max_running(),
        );
        let mut chunks = self.continuing_chunks();
        let admitted = self.admit(&chunks);
        let any_admitted = !admitted.is_empty();
        chunks.extend(admitted);
        if chunks.is_empty() {
            return false;
        }
        let ids: Vec<SeqId> = chunks.iter().map(|c| c.id).collect();
        let result = guarded(|| self.engine.prefill_step(&chunks));
        if result.is_ok() {
            self.count_chunks(&ids);
        }
        self.apply(result, &ids);
        any_admitted
    }

    /// Admits from the wait queue into what `continuing` leaves of the
    /// prefill step; returns the admitted requests' first chunks.
    fn admit(&mut self, continuing: &[PrefillChunk]) -> Vec<PrefillChunk> {
        let spent: usize = continuing.iter().map(|c| c.tokens).sum();
        let room = Room {
            tokens: self.knobs.prefill_max_tokens.saturating_sub(spent),
            rows: self
                .knobs
                .prefill_max_batch_size
                .saturating_sub(continuing.len()),
            max_running: self.knobs.max_running(),
        };
        admitting::admit(
            &mut self.engine,
            &mut self.waiting,
            &mut self.running,
            room,
            &self.stats,
            self.iteration,
        )
    }

    /// Counts a prefill step's chunk for each of `ids` still prefilling its
    /// prompt, and sends `Prefilled` to those it completed (once per request:
    /// a resumed request's recompute is not a client-visible prefill).
    fn count_chunks(&mut self, ids: &[SeqId]) {
        let unfinished: Vec<SeqId> = self.engine.to_prefill().iter().map(|p| p.0).collect();
        for id in ids {
            if let Some(c) = self.running.get_mut(id).filter(|c| !c.prefilled) {
                c.chunks += 1;
                if !unfinished.contains(id) {
                    c.prefilled = true;
                    let _ = c.events.send(Event::Prefilled { chunks: c.chunks });
                }
            }
        }
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

    /// One decode step over up to `--max-batch-size` decoding sequences,
    /// starting at the rotation cursor, after making room for the blocks it
    /// takes (judging the queued step first when that may preempt).
    fn decode_step(&mut self) {
        let mut ids = self.next_decode_ids();
        if self.engine.has_pending()
            && self.engine.blocks_to_grow(&ids) > self.engine.kv_blocks_free()
        {
            self.settle();
            ids = self.next_decode_ids();
        }
        preemption::make_room_for_decode(
            &mut self.engine,
            &mut self.waiting,
            &mut self.running,
            &self.stats,
            &mut ids,
        );
        let Some(&last) = ids.last() else {
            return self.settle();
        };
        self.decode_from = last + 1;
        let result = match self.knobs.async_scheduling {
            true => guarded(|| self.engine.decode_async(&ids)),
            false => guarded(|| self.engine.decode(&ids)),
        };
        if let Err(EngineError::OutOfBlocks { needed, free }) = result {
            // Only if making room failed (it cannot, short of a bug): the
            // sequences stay as they were and the next iteration tries again.
            tracing::warn!(needed, free, "decode step skipped: out of KV blocks");
            return;
        }
        // What a failure fails: this step's sequences and the queued step's.
        let mut stepped = match self.engine.has_pending() {
            true => std::mem::replace(&mut self.queued, ids.clone()),
            false => std::mem::take(&mut self.queued),
        };
        stepped.extend_from_slice(&ids);
        self.apply(result, &stepped);
    }

    /// The next decode step's sequences: up to `--max-batch-size` from the
    /// rotation cursor.
    fn next_decode_ids(&self) -> Vec<SeqId> {
        rotation(
            &self.engine.decoding(),
            self.decode_from,
            self.knobs.max_batch_size,
        )
    }

    /// Judges the decode step the engine has queued, if any, and sends its
    /// events.
    fn settle(&mut self) {
        if !self.engine.has_pending() {
            return;
        }
        let queued = std::mem::take(&mut self.queued);
        let result = guarded(|| self.engine.flush());
        self.apply(result, &queued);
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
        for p in out.prompt_logprobs {
            if let Some(c) = self.running.get(&p.id) {
                let _ = c.events.send(Event::PromptLogprobs {
                    first: p.first,
                    logprobs: p.logprobs,
                });
            }
        }
        for t in out.tokens {
            if let Some(c) = self.running.get(&t.id) {
                let sent = c.events.send(Event::Token {
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
            if let Some(c) = self.running.remove(&f.id) {
                let kind = match f.reason {
                    FinishReason::Eos => FinishKind::Eos,
                    FinishReason::Length => FinishKind::Length,
                    FinishReason::StopToken(token) => FinishKind::StopToken(token),
                    FinishReason::ConstraintFailed => FinishKind::ConstraintFailed,
                };
                // Counted before the client can see the end of its stream.
                let counter = match kind {
                    FinishKind::ConstraintFailed => &self.stats.failed,
                    _ => &self.stats.finished,
                };
                SchedulerStats::bump(counter);
                c.span
                    .in_scope(|| tracing::debug!(reason = ?kind, tokens = f.generated, "finished"));
                let _ = c.events.send(Event::Finished {
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
            if let Some(c) = self.running.remove(id) {
                c.span
                    .in_scope(|| tracing::debug!(%err, "failed with its batch"));
                self.engine.release(*id);
                let _ = c.events.send(Event::Failed {
                    message: err.to_string(),
                });
                SchedulerStats::bump(&self.stats.failed);
            }
        }
    }

    /// Removes a request wherever it is (running, waiting, preempted); frees
    /// its blocks if it was running.
    fn cancel(&mut self, id: SeqId, reason: CancelReason) {
        let (client, generated) = if let Some(c) = self.running.remove(&id) {
            (c, self.engine.release(id).unwrap_or(0))
        } else if let Some(w) = self.waiting.remove(id) {
            (w.client, w.seq.resumed_tokens())
        } else {
            return; // already finished
        };
        client
            .span
            .in_scope(|| tracing::debug!(?reason, generated, "cancelled"));
        match reason {
            CancelReason::DeadlineExceeded => SchedulerStats::bump(&self.stats.deadline_exceeded),
            CancelReason::ClientGone | CancelReason::Shutdown => {
                SchedulerStats::bump(&self.stats.cancelled)
            }
            CancelReason::StopString => SchedulerStats::bump(&self.stats.finished),
        }
        let _ = client.events.send(Event::Finished {
            kind: FinishKind::Cancelled,
            completion_tokens: generated as u32,
        });
    }

    fn cancel_all(&mut self, reason: CancelReason) {
        let ids: Vec<SeqId> = self
            .waiting
            .iter()
            .map(Waiting::id)
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
        SchedulerStats::set(&s.queue_depth, self.waiting.len());
        SchedulerStats::set(&s.active_sequences, self.running.len());
        SchedulerStats::set(&s.kv_blocks_used, used);
        crate::metrics::record_gauges(
            self.waiting.len(),
            self.running.len(),
            used,
            self.engine.kv_blocks_total(),
        );
    }
}
