//! Taking requests from the front of the wait queue into the engine: how
//! many this iteration ([`admission::plan`]), admitting them (a new request
//! gets its `Admitted` event; a preempted one resumes silently), and the
//! requests dropped on the way (client gone, refused by the engine).
//!
//! Free functions over the state they are handed (the engine, the wait
//! queue, the running set, the stats): the worker owns that state and calls
//! [`admit`] once per iteration; preemption asks [`admissible_blocks`].
//!
//! A watermark of free blocks (1% of the pool, at least one) is kept while
//! anything runs, as vLLM does: admitting into the last few blocks would
//! have the next decode steps preempt at once.

use std::time::Instant;

use ember_engine::{AdmissionCost, EngineError, PrefillChunk, StepEngine};

use super::admission::{self, AdmissionBudget, Candidate};
use super::guarded::guarded;
use super::queue::{RunningSet, WaitQueue, Waiting};
use super::request::{Admission, Event};
use super::stats::SchedulerStats;

/// What this iteration's prefill step leaves for admissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// Prefill tokens left of `--prefill-max-tokens`.
    pub tokens: usize,
    /// Prefill rows left of `--prefill-max-batch-size`.
    pub rows: usize,
    /// Most requests running at once (`SchedulerKnobs::max_running`).
    pub max_running: usize,
}

/// Admits requests from the front of `waiting` into `engine` (their input's
/// blocks taken, cached prefix found), moves them to `running` and returns
/// their first chunks, within `room`. `iteration` goes into their
/// `Admitted` events.
pub fn admit<E: StepEngine>(
    engine: &mut E,
    waiting: &mut WaitQueue,
    running: &mut RunningSet,
    room: Room,
    stats: &SchedulerStats,
    iteration: u64,
) -> Vec<PrefillChunk> {
    drop_gone_clients(waiting, stats);
    waiting.order(Instant::now());
    let n = plan_admission(engine, waiting, running, room);
    let mut admitted = Vec::with_capacity(n);
    let mut left = room.tokens;
    for _ in 0..n {
        let Some(front) = waiting.front() else {
            break;
        };
        let cached = match guarded(|| engine.admit(&front.seq)) {
            Ok(cached) => cached,
            // The plan's estimate was off: wait for blocks like any request.
            Err(EngineError::OutOfBlocks { .. }) => break,
            Err(err) => {
                fail_front(waiting, stats, &err);
                continue;
            }
        };
        // Dropping the permit frees a new request's place in the queue.
        let Some(Waiting { seq, client, .. }) = waiting.pop_front() else {
            break;
        };
        let resumed = seq.resume.is_some();
        let input_len = seq.input_len();
        if !resumed {
            record_prefix_lookup(engine, stats, input_len, cached);
        }
        let tokens = (input_len - cached).min(left).max(1);
        left = left.saturating_sub(tokens);
        running.insert(seq.id, client);
        admitted.push((PrefillChunk { id: seq.id, tokens }, cached, resumed));
    }
    announce(running, &admitted, stats, iteration);
    admitted.into_iter().map(|(chunk, ..)| chunk).collect()
}

/// Free blocks admission may plan with: all of them when nothing runs,
/// else all but the watermark (module docs).
pub fn admissible_blocks(engine: &impl StepEngine, running: &RunningSet) -> usize {
    let free = engine.kv_blocks_free();
    if running.is_empty() {
        return free;
    }
    let watermark = (engine.kv_blocks_total() / 100).max(1);
    free.saturating_sub(watermark)
}

/// Requests whose client already left are dropped before planning.
fn drop_gone_clients(waiting: &mut WaitQueue, stats: &SchedulerStats) {
    let gone = waiting.take_unless(|w| !w.client.events.is_closed());
    SchedulerStats::add(&stats.cancelled, gone.len() as u64);
}

/// Whether `w` must wait for the sequence it follows to compute its
/// prompt (still queued, or admitted and prefilling).
fn waits_for_leader(w: &Waiting, waiting: &WaitQueue, running: &RunningSet) -> bool {
    w.client.follows.is_some_and(|leader| {
        running.get(&leader).is_some_and(|c| !c.prefilled)
            || waiting.iter().any(|x| x.id() == leader)
    })
}

/// How many requests from the front of the queue this iteration admits:
/// the planner's count, cut at the first one that waits for its leader.
fn plan_admission(
    engine: &impl StepEngine,
    waiting: &WaitQueue,
    running: &RunningSet,
    room: Room,
) -> usize {
    let planned = plan_by_budget(engine, waiting, running, room);
    waiting
        .iter()
        .take(planned)
        .position(|w| waits_for_leader(w, waiting, running))
        .unwrap_or(planned)
}

/// How many requests from the front of the queue fit this iteration.
fn plan_by_budget(
    engine: &impl StepEngine,
    waiting: &WaitQueue,
    running: &RunningSet,
    room: Room,
) -> usize {
    let plan = AdmissionBudget {
        max_requests: room.rows,
        max_prompt_tokens: room.tokens,
        free_running_slots: room.max_running.saturating_sub(running.len()),
        free_blocks: admissible_blocks(engine, running),
    };
    admission::plan(
        plan,
        waiting.iter().map(|w| {
            let AdmissionCost {
                blocks,
                cached_tokens,
            } = engine.admission_cost(&w.seq);
            Candidate {
                prompt_tokens: w.seq.input_len() - cached_tokens,
                blocks,
            }
        }),
    )
}

/// Fails the request at the front of the queue, which the engine refused.
fn fail_front(waiting: &mut WaitQueue, stats: &SchedulerStats, err: &EngineError) {
    if let Some(w) = waiting.pop_front() {
        let id = w.id();
        w.client
            .span
            .in_scope(|| tracing::error!(%err, id, "admission failed"));
        SchedulerStats::bump(&stats.failed);
        let _ = w.client.events.send(Event::Failed {
            message: err.to_string(),
        });
    }
}

/// Sends each newly admitted request its `Admitted` event (a resumed one
/// was admitted before: it gets nothing).
fn announce(
    running: &RunningSet,
    admitted: &[(PrefillChunk, usize, bool)],
    stats: &SchedulerStats,
    iteration: u64,
) {
    let admitted_at = Instant::now();
    let fresh = admitted.iter().filter(|a| !a.2).count();
    for (chunk, cached, _) in admitted.iter().filter(|a| !a.2) {
        if let Some(c) = running.get(&chunk.id) {
            c.span.in_scope(|| {
                tracing::debug!(
                    prefill_batch_size = fresh,
                    iteration,
                    cached_prompt_tokens = cached,
                    "admitted"
                )
            });
            let _ = c.events.send(Event::Admitted(Admission {
                admitted_at,
                prefill_batch_size: fresh as u32,
                iteration,
                cached_prompt_tokens: *cached as u32,
            }));
        }
    }
    SchedulerStats::add(&stats.admitted, fresh as u64);
}

/// Counts one admitted prompt's prefix-cache lookup.
fn record_prefix_lookup(
    engine: &impl StepEngine,
    stats: &SchedulerStats,
    prompt_tokens: usize,
    cached: usize,
) {
    if !engine.prefix_caching() {
        return;
    }
    SchedulerStats::add(&stats.prefix_cache_queried_tokens, prompt_tokens as u64);
    SchedulerStats::add(&stats.prefix_cache_hit_tokens, cached as u64);
    crate::metrics::record_prefix_cache(prompt_tokens as u64, cached as u64);
}
