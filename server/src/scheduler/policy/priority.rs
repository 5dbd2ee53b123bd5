//! `--scheduling-policy priority`: by the request's `priority` (lower
//! first, vLLM's convention), then arrival.
//!
//! - **Any `priority`** is accepted.
//! - **Wait queue**: a request's key is its priority improved by one for
//!   every `aging` period it has waited since it was first enqueued
//!   (`--priority-aging-s`, the starvation guard; `None`: never), so the
//!   queue is re-sorted before each admission; preempted first, then arrival
//!   among equals.
//! - **Preemption for the queue**: the front of the wait queue, when it
//!   cannot get a running slot or its blocks, preempts the running request
//!   with the lowest priority (the largest key; the newest among equals)
//!   while that one's key is worse than the front's. A running request's
//!   key is aged like a waiting one's (from when it was first queued, at the
//!   same instant): both improve at the same rate, so the request a
//!   preemption sends back to the queue never outranks the one that took
//!   its place, and two requests cannot preempt each other in turn.
//! - **Preemption for a decode step**: the running request with the lowest
//!   priority, the newest among equals (vLLM V1's victim:
//!   `max(running, key=(priority, arrival))`).

use std::time::{Duration, Instant};

use ember_engine::SeqId;

use super::seam::{Policy, PriorityRefused, QueueEntry, QueueKey, RunningSeq};

/// See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityPolicy {
    /// A waiting request's priority improves by one every `aging`.
    pub aging: Option<Duration>,
}

impl PriorityPolicy {
    /// `priority` improved by one for every `aging` period since
    /// `enqueued_at` (as given without aging).
    fn aged(&self, priority: i32, enqueued_at: Instant, now: Instant) -> i64 {
        let aged = self.aging.filter(|a| !a.is_zero()).map_or(0, |a| {
            now.saturating_duration_since(enqueued_at).as_nanos() / a.as_nanos()
        });
        i64::from(priority) - aged.min(i64::MAX as u128) as i64
    }

    /// The running request with the largest `key` (newest among equals)
    /// that `eligible` lets go.
    fn lowest(
        running: &[RunningSeq],
        key: impl Fn(&RunningSeq) -> i64,
        eligible: impl Fn(i64) -> bool,
    ) -> Option<SeqId> {
        running
            .iter()
            .map(|r| (key(r), r.id))
            .filter(|&(k, _)| eligible(k))
            .max()
            .map(|(_, id)| id)
    }
}

impl Policy for PriorityPolicy {
    fn check_priority(&self, _priority: i32) -> Result<(), PriorityRefused> {
        Ok(())
    }

    fn queue_key(&self, entry: &QueueEntry, now: Instant) -> QueueKey {
        QueueKey::new(self.aged(entry.priority, entry.enqueued_at, now), entry)
    }

    fn ages(&self) -> bool {
        self.aging.is_some()
    }

    fn victim_for_waiting(
        &self,
        front: &QueueKey,
        running: &[RunningSeq],
        now: Instant,
    ) -> Option<SeqId> {
        let key = |r: &RunningSeq| self.aged(r.priority, r.enqueued_at, now);
        Self::lowest(running, key, |k| k > front.priority)
    }

    fn victim_for_decode(&self, running: &[RunningSeq]) -> Option<SeqId> {
        Self::lowest(running, |r| i64::from(r.priority), |_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_AGING: PriorityPolicy = PriorityPolicy { aging: None };

    fn entry(id: SeqId, priority: i32, preempted: bool, enqueued_at: Instant) -> QueueEntry {
        QueueEntry {
            id,
            priority,
            enqueued_at,
            preempted,
        }
    }

    fn running(seqs: &[(SeqId, i32)]) -> Vec<RunningSeq> {
        let enqueued_at = Instant::now();
        seqs.iter()
            .map(|&(id, priority)| RunningSeq {
                id,
                priority,
                enqueued_at,
            })
            .collect()
    }

    #[test]
    fn any_priority_is_accepted() {
        for p in [0, 1, -7, i32::MIN, i32::MAX] {
            assert_eq!(NO_AGING.check_priority(p), Ok(()));
        }
    }

    #[test]
    fn keys_order_by_priority_then_preempted_then_arrival() {
        let now = Instant::now();
        let key = |id, p, pre| NO_AGING.queue_key(&entry(id, p, pre, now), now);
        let mut keys = [
            key(1, 10, false),
            key(2, 0, false),
            key(3, 10, true),
            key(4, -5, false),
            key(5, 0, false),
        ];
        keys.sort();
        assert_eq!(keys.map(|k| k.arrival), [4, 2, 5, 3, 1]);
        assert!(!NO_AGING.ages());
    }

    #[test]
    fn aging_improves_a_waiting_priority_by_one_per_period() {
        let t0 = Instant::now();
        let policy = PriorityPolicy {
            aging: Some(Duration::from_secs(10)),
        };
        assert!(policy.ages());
        let e = entry(1, 5, false, t0);
        let at = |s| policy.queue_key(&e, t0 + Duration::from_secs(s)).priority;
        assert_eq!([at(0), at(9), at(10), at(31), at(100)], [5, 5, 4, 2, -5]);
        // A clock read before the request was queued ages nothing.
        assert_eq!(
            policy
                .queue_key(&entry(1, 5, false, t0 + Duration::from_secs(5)), t0)
                .priority,
            5
        );
        // A zero period is no aging (the flags never give one).
        let zero = PriorityPolicy {
            aging: Some(Duration::ZERO),
        };
        assert_eq!(
            zero.queue_key(&e, t0 + Duration::from_secs(100)).priority,
            5
        );
    }

    #[test]
    fn the_decode_victim_is_the_lowest_priority_then_the_newest() {
        let r = running(&[(1, 9), (2, 0), (3, 9), (4, -1)]);
        assert_eq!(NO_AGING.victim_for_decode(&r), Some(3));
        assert_eq!(NO_AGING.victim_for_decode(&r[1..2]), Some(2));
        assert_eq!(NO_AGING.victim_for_decode(&[]), None);
    }

    #[test]
    fn the_front_preempts_only_a_lower_priority_than_its_key() {
        let now = Instant::now();
        let r = running(&[(1, 3), (2, 5), (3, 5), (4, 0)]);
        let front = |p| NO_AGING.queue_key(&entry(9, p, false, now), now);
        let victim = |f, r: &[RunningSeq]| NO_AGING.victim_for_waiting(&front(f), r, now);
        assert_eq!(victim(0, &r), Some(3));
        assert_eq!(victim(4, &r), Some(3));
        assert_eq!(victim(5, &r), None);
        assert_eq!(victim(-3, &r[3..]), Some(4));
    }

    #[test]
    fn with_aging_a_preempted_request_cannot_preempt_its_preemptor_back() {
        // A (priority 5) has waited 30 s; B (priority 3) arrived 40 s ago and
        // runs. Aging by 10 s: A's key 2, B's 3 - 4 = -1 (B aged too, from
        // its own arrival), so A may not preempt B. With B's key taken
        // unaged (3, the old rule) A would, and B, back in the queue at key
        // -1, would then preempt A (running at 5): churn.
        let policy = PriorityPolicy {
            aging: Some(Duration::from_secs(10)),
        };
        let now = Instant::now() + Duration::from_secs(100);
        let at = |s| now - Duration::from_secs(s);
        let a = policy.queue_key(&entry(1, 5, false, at(30)), now);
        let b_running = RunningSeq {
            id: 2,
            priority: 3,
            enqueued_at: at(40),
        };
        assert_eq!(a.priority, 2);
        assert_eq!(policy.victim_for_waiting(&a, &[b_running], now), None);
        // Whichever of two requests runs, the other never outranks it in
        // turn, over a minute of aging.
        for t in 0..60 {
            let now = now + Duration::from_secs(t);
            let a_running = RunningSeq {
                id: 1,
                priority: 5,
                enqueued_at: at(30),
            };
            let b_waiting = policy.queue_key(&entry(2, 3, true, at(40)), now);
            let a_waiting = policy.queue_key(&entry(1, 5, true, at(30)), now);
            let b_preempts_a = policy
                .victim_for_waiting(&b_waiting, &[a_running], now)
                .is_some();
            let a_preempts_b = policy
                .victim_for_waiting(&a_waiting, &[b_running], now)
                .is_some();
            assert!(!(b_preempts_a && a_preempts_b), "churn at +{t} s");
            assert!(!a_preempts_b, "A outranks B at +{t} s");
        }
        // An old low-priority request aged past a newer running one still
        // takes its place (the starvation guard holds).
        let young = RunningSeq {
            id: 3,
            priority: 3,
            enqueued_at: now,
        };
        assert_eq!(policy.victim_for_waiting(&a, &[young], now), Some(3));
    }
}
