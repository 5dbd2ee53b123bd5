//! Preemption: the scheduler's moves on the engine's seam
//! ([`StepEngine::preempt`]). Whom to preempt is the scheduling policy's
//! call ([`Policy`](super::policy::Policy), asked through the wait queue
//! that holds it). Two moments call for it:
//!
//! - **A decode step needs blocks the pool does not have** (sequences grow a
//!   block at a time): the policy's decode victim is preempted (the newest
//!   under fcfs; under priority the lowest priority, newest among equals:
//!   vLLM V1's victims) until the step's fresh blocks are free; a victim in
//!   the step leaves it.
//! - **The front of the wait queue cannot be admitted** for want of a running
//!   slot or of blocks: the policy may name a running request to preempt for
//!   it (never under fcfs; under priority the lowest-priority running
//!   request, while its priority is lower, a larger number, than the
//!   front's).
//!
//! A preempted request's blocks are freed by the engine (its computed full
//! blocks stay in the prefix cache until evicted), it goes back to the wait
//! queue at the front of its priority with what resuming needs, and its
//! client gets `Event::Preempted`. Admitted again, it recomputes its prompt
//! and the tokens it had emitted (prefix-cache hits while the blocks live)
//! and its stream goes on with the next token: no gap, no repeat. Cancels and
//! deadlines reach it in the wait queue like any waiting request.
//!
//! Free functions over the state they are handed (the engine, the wait
//! queue, the running set, the stats), like admission's.

use std::time::Instant;

use ember_engine::{SeqId, StepEngine};

use super::admitting::admissible_blocks;
use super::policy::RunningSeq;
use super::queue::{RunningSet, WaitQueue, Waiting};
use super::request::Event;
use super::stats::SchedulerStats;

/// Makes room for a decode step over `ids` (module docs): victims in `ids`
/// leave it.
pub fn make_room_for_decode<E: StepEngine>(
    engine: &mut E,
    waiting: &mut WaitQueue,
    running: &mut RunningSet,
    stats: &SchedulerStats,
    ids: &mut Vec<SeqId>,
) {
    while engine.blocks_to_grow(ids) > engine.kv_blocks_free() {
        let Some(victim) = waiting.policy().victim_for_decode(&running_seqs(running)) else {
            return;
        };
        preempt(engine, waiting, running, stats, victim);
        ids.retain(|&id| id != victim);
    }
}

/// Makes room for the front of the wait queue, if the policy lets it
/// preempt (module docs); `max_running` is the running cap.
pub fn make_room_for_front<E: StepEngine>(
    engine: &mut E,
    waiting: &mut WaitQueue,
    running: &mut RunningSet,
    stats: &SchedulerStats,
    max_running: usize,
) {
    let now = Instant::now();
    waiting.order(now);
    while let Some(front) = waiting.front() {
        let key = waiting.key(front, now);
        // The policy first: under fcfs there is never a victim, and the
        // front is not priced for nothing.
        let Some(victim) = waiting
            .policy()
            .victim_for_waiting(&key, &running_seqs(running), now)
        else {
            return;
        };
        let blocks = engine.admission_cost(&front.seq).blocks;
        if running.len() < max_running && blocks <= admissible_blocks(engine, running) {
            return;
        }
        preempt(engine, waiting, running, stats, victim);
    }
}

/// The running requests as the policy sees them.
fn running_seqs(running: &RunningSet) -> Vec<RunningSeq> {
    running
        .iter()
        .map(|(&id, c)| RunningSeq {
            id,
            priority: c.priority,
            enqueued_at: c.enqueued_at,
        })
        .collect()
}

/// Preempts running request `id` (module docs).
fn preempt<E: StepEngine>(
    engine: &mut E,
    waiting: &mut WaitQueue,
    running: &mut RunningSet,
    stats: &SchedulerStats,
    id: SeqId,
) {
    let Some(client) = running.remove(&id) else {
        return;
    };
    let Some(seq) = engine.preempt(id) else {
        // The engine does not know it (a bug): nothing to resume.
        tracing::error!(id, "preempting a sequence the engine does not know");
        SchedulerStats::bump(&stats.failed);
        let _ = client.events.send(Event::Failed {
            message: "the engine lost the sequence".into(),
        });
        return;
    };
    let at = Instant::now();
    client.span.in_scope(|| {
        tracing::debug!(
            generated = seq.resumed_tokens(),
            priority = client.priority,
            "preempted"
        )
    });
    SchedulerStats::bump(&stats.preemptions);
    crate::metrics::preempted();
    let _ = client.events.send(Event::Preempted { at });
    waiting.push(
        Waiting {
            seq,
            client,
            permit: None,
        },
        at,
    );
}
