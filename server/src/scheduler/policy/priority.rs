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
//!   with the lowest priority (the largest number; the newest among equals)
//!   while that one's priority is lower than the front's key. A running
//!   request's own priority counts (it does not age).
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
    /// The lowest-priority running request (newest among equals) that
    /// `eligible` lets go.
    fn lowest(running: &[RunningSeq], eligible: impl Fn(&RunningSeq) -> bool) -> Option<SeqId> {
        running
            .iter()
            .filter(|r| eligible(r))
            .max_by_key(|r| (r.priority, r.id))
            .map(|r| r.id)
    }
}

impl Policy for PriorityPolicy {
    fn check_priority(&self, _priority: i32) -> Result<(), PriorityRefused> {
        Ok(())
    }

    fn queue_key(&self, entry: &QueueEntry, now: Instant) -> QueueKey {
        let aged = self.aging.filter(|a| !a.is_zero()).map_or(0, |a| {
            now.saturating_duration_since(entry.enqueued_at).as_nanos() / a.as_nanos()
        });
        let priority = i64::from(entry.priority) - aged.min(i64::MAX as u128) as i64;
        QueueKey::new(priority, entry)
    }

    fn ages(&self) -> bool {
        self.aging.is_some()
    }

    fn victim_for_waiting(&self, front: &QueueKey, running: &[RunningSeq]) -> Option<SeqId> {
        Self::lowest(running, |r| i64::from(r.priority) > front.priority)
    }

    fn victim_for_decode(&self, running: &[RunningSeq]) -> Option<SeqId> {
        Self::lowest(running, |_| true)
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
        seqs.iter()
            .map(|&(id, priority)| RunningSeq { id, priority })
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
        assert_eq!(NO_AGING.victim_for_waiting(&front(0), &r), Some(3));
        assert_eq!(NO_AGING.victim_for_waiting(&front(4), &r), Some(3));
        assert_eq!(NO_AGING.victim_for_waiting(&front(5), &r), None);
        assert_eq!(NO_AGING.victim_for_waiting(&front(-3), &r[3..]), Some(4));
    }
}
