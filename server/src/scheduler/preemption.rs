//! Preemption: the scheduler's policy on the engine's seam
//! ([`StepEngine::preempt`]). Two moments call for it:
//!
//! - **A decode step needs blocks the pool does not have** (sequences grow a
//!   block at a time): running requests are preempted, lowest priority first
//!   and newest among equals (vLLM V1's victim), until the step's fresh
//!   blocks are free; a victim in the step leaves it.
//! - **Under `--scheduling-policy priority`, the front of the wait queue
//!   cannot be admitted** for want of a running slot or of blocks: the
//!   lowest-priority running request is preempted while its priority is
//!   lower (a larger number) than the front's.
//!
//! A preempted request's blocks are freed by the engine (its computed full
//! blocks stay in the prefix cache until evicted), it goes back to the wait
//! queue at the front of its priority with what resuming needs, and its
//! client gets `Event::Preempted`. Admitted again, it recomputes its prompt
//! and the tokens it had emitted (prefix-cache hits while the blocks live)
//! and its stream goes on with the next token: no gap, no repeat. Cancels and
//! deadlines reach it in the wait queue like any waiting request.

use std::time::Instant;

use ember_engine::{SeqId, StepEngine};

use super::knobs::SchedulingPolicy;
use super::queue::Waiting;
use super::request::Event;
use super::stats::SchedulerStats;
use super::worker::Worker;

impl<E: StepEngine> Worker<E> {
    /// Makes room for a decode step over `ids` (module docs): victims in
    /// `ids` leave it.
    pub(super) fn make_room_for_decode(&mut self, ids: &mut Vec<SeqId>) {
        while self.engine.blocks_to_grow(ids) > self.engine.kv_blocks_free() {
            let Some(victim) = self.victim(None) else {
                return;
            };
            self.preempt(victim);
            ids.retain(|&id| id != victim);
        }
    }

    /// Under the priority policy, makes room for the front of the wait queue
    /// by preempting lower-priority running requests (module docs).
    pub(super) fn make_room_for_front(&mut self) {
        if !matches!(self.knobs.policy, SchedulingPolicy::Priority { .. }) {
            return;
        }
        let now = Instant::now();
        self.waiting.order(now);
        loop {
            let Some(front) = self.waiting.front() else {
                return;
            };
            let priority = self.waiting.effective_priority(&front.client, now);
            let blocks = self.engine.admission_cost(&front.seq).blocks;
            let slot = self.running.len() < self.knobs.max_running();
            if slot && blocks <= self.admissible_blocks() {
                return;
            }
            let Some(victim) = self.victim(Some(priority)) else {
                return;
            };
            self.preempt(victim);
        }
    }

    /// The running request to preempt: the lowest priority (the largest
    /// number), the newest among equals; with `below`, only one whose
    /// priority is lower than that.
    fn victim(&self, below: Option<i64>) -> Option<SeqId> {
        self.running
            .iter()
            .filter(|(_, c)| below.is_none_or(|p| i64::from(c.priority) > p))
            .max_by_key(|(&id, c)| (c.priority, id))
            .map(|(&id, _)| id)
    }

    /// Preempts running request `id` (module docs).
    fn preempt(&mut self, id: SeqId) {
        let Some(client) = self.running.remove(&id) else {
            return;
        };
        let Some(seq) = self.engine.preempt(id) else {
            // The engine does not know it (a bug): nothing to resume.
            tracing::error!(id, "preempting a sequence the engine does not know");
            SchedulerStats::bump(&self.stats.failed);
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
        SchedulerStats::bump(&self.stats.preemptions);
        crate::metrics::preempted();
        let _ = client.events.send(Event::Preempted { at });
        self.waiting.push(
            Waiting {
                seq,
                client,
                permit: None,
            },
            at,
        );
    }
}
