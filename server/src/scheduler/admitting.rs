//! Taking requests from the front of the wait queue into the engine: how
//! many this iteration ([`admission::plan`]), admitting them (a new request
//! gets its `Admitted` event; a preempted one resumes silently), and the
//! requests dropped on the way (client gone, refused by the engine).
//!
//! A watermark of free blocks (1% of the pool, at least one) is kept while
//! anything runs, as vLLM does: admitting into the last few blocks would
//! have the next decode steps preempt at once.

use std::time::Instant;

use ember_engine::{AdmissionCost, EngineError, PrefillChunk, StepEngine};

use super::admission::{self, AdmissionBudget, Candidate};
use super::queue::Waiting;
use super::request::{Admission, Event};
use super::stats::SchedulerStats;
use super::worker::{guarded, Worker};

impl<E: StepEngine> Worker<E> {
    /// Admits requests from the front of the wait queue into the engine
    /// (their input's blocks taken, cached prefix found) and returns their
    /// first chunks, at most `rows` of them within `budget` tokens.
    pub(super) fn admit(&mut self, budget: usize, rows: usize) -> Vec<PrefillChunk> {
        self.drop_gone_clients();
        self.waiting.order(Instant::now());
        let n = self.plan_admission(budget, rows);
        let mut admitted = Vec::with_capacity(n);
        let mut left = budget;
        for _ in 0..n {
            let Some(front) = self.waiting.front() else {
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
            // Dropping the permit frees a new request's place in the queue.
            let Some(Waiting { seq, client, .. }) = self.waiting.pop_front() else {
                break;
            };
            let resumed = seq.resume.is_some();
            let input_len = seq.input_len();
            if !resumed {
                self.record_prefix_lookup(input_len, cached);
            }
            let tokens = (input_len - cached).min(left).max(1);
            left = left.saturating_sub(tokens);
            self.running.insert(seq.id, client);
            admitted.push((PrefillChunk { id: seq.id, tokens }, cached, resumed));
        }
        self.announce(&admitted);
        admitted.into_iter().map(|(chunk, ..)| chunk).collect()
    }

    /// Free blocks admission may plan with: all of them when nothing runs,
    /// else all but the watermark (module docs).
    pub(super) fn admissible_blocks(&self) -> usize {
        let free = self.engine.kv_blocks_free();
        if self.running.is_empty() {
            return free;
        }
        let watermark = (self.engine.kv_blocks_total() / 100).max(1);
        free.saturating_sub(watermark)
    }

    /// Requests whose client already left are dropped before planning.
    fn drop_gone_clients(&mut self) {
        let gone = self.waiting.take_unless(|w| !w.client.events.is_closed());
        SchedulerStats::add(&self.stats.cancelled, gone.len() as u64);
    }

    /// Whether `w` must wait for the sequence it follows to compute its
    /// prompt (still queued, or admitted and prefilling).
    fn waits_for_leader(&self, w: &Waiting) -> bool {
        w.client.follows.is_some_and(|leader| {
            self.running.get(&leader).is_some_and(|c| !c.prefilled)
                || self.waiting.iter().any(|x| x.id() == leader)
        })
    }

    /// How many requests from the front of the queue this iteration admits:
    /// the planner's count, cut at the first one that waits for its leader.
    fn plan_admission(&self, budget: usize, rows: usize) -> usize {
        let planned = self.plan_by_budget(budget, rows);
        self.waiting
            .iter()
            .take(planned)
            .position(|w| self.waits_for_leader(w))
            .unwrap_or(planned)
    }

    /// How many requests from the front of the queue fit this iteration.
    fn plan_by_budget(&self, budget: usize, rows: usize) -> usize {
        let plan = AdmissionBudget {
            max_requests: rows,
            max_prompt_tokens: budget,
            free_running_slots: self.knobs.max_running().saturating_sub(self.running.len()),
            free_blocks: self.admissible_blocks(),
        };
        let engine = &self.engine;
        admission::plan(
            plan,
            self.waiting.iter().map(|w| {
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
    fn fail_front(&mut self, err: &EngineError) {
        if let Some(w) = self.waiting.pop_front() {
            let id = w.id();
            w.client
                .span
                .in_scope(|| tracing::error!(%err, id, "admission failed"));
            SchedulerStats::bump(&self.stats.failed);
            let _ = w.client.events.send(Event::Failed {
                message: err.to_string(),
            });
        }
    }

    /// Sends each newly admitted request its `Admitted` event (a resumed one
    /// was admitted before: it gets nothing).
    fn announce(&self, admitted: &[(PrefillChunk, usize, bool)]) {
        let admitted_at = Instant::now();
        let fresh = admitted.iter().filter(|a| !a.2).count();
        for (chunk, cached, _) in admitted.iter().filter(|a| !a.2) {
            if let Some(c) = self.running.get(&chunk.id) {
                c.span.in_scope(|| {
                    tracing::debug!(
                        prefill_batch_size = fresh,
                        iteration = self.iteration,
                        cached_prompt_tokens = cached,
                        "admitted"
                    )
                });
                let _ = c.events.send(Event::Admitted(Admission {
                    admitted_at,
                    prefill_batch_size: fresh as u32,
                    iteration: self.iteration,
                    cached_prompt_tokens: *cached as u32,
                }));
            }
        }
        SchedulerStats::add(&self.stats.admitted, fresh as u64);
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
}
