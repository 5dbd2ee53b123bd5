//! `--scheduling-policy fcfs` (the default): first come, first served.
//!
//! Every request has priority 0 (another is refused), so the wait queue is
//! arrival order with preempted requests in front; keys never change (no
//! aging). The front of the queue never preempts anyone: it waits for a slot
//! and blocks. A decode step short of blocks preempts the newest running
//! request (vLLM's FCFS victim: the last of its running list).

use std::time::Instant;

use ember_engine::SeqId;

use super::seam::{Policy, PriorityRefused, QueueEntry, QueueKey, RunningSeq};

/// See the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FcfsPolicy;

impl Policy for FcfsPolicy {
    fn check_priority(&self, priority: i32) -> Result<(), PriorityRefused> {
        if priority == 0 {
            return Ok(());
        }
        // vLLM refuses the same.
        Err(PriorityRefused {
            priority,
            reason: "the server schedules first come, first served: \
                     start it with --scheduling-policy priority",
        })
    }

    fn queue_key(&self, entry: &QueueEntry, _now: Instant) -> QueueKey {
        QueueKey::new(0, entry)
    }

    fn ages(&self) -> bool {
        false
    }

    fn victim_for_waiting(
        &self,
        _front: &QueueKey,
        _running: &[RunningSeq],
        _now: Instant,
    ) -> Option<SeqId> {
        None
    }

    fn victim_for_decode(&self, running: &[RunningSeq]) -> Option<SeqId> {
        running.iter().map(|r| r.id).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: SeqId, preempted: bool) -> QueueEntry {
        QueueEntry {
            id,
            priority: 0,
            enqueued_at: Instant::now(),
            preempted,
        }
    }

    #[test]
    fn only_priority_zero_is_accepted() {
        assert_eq!(FcfsPolicy.check_priority(0), Ok(()));
        for p in [1, -1, i32::MAX] {
            let err = FcfsPolicy.check_priority(p).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "{p} given, but the server schedules first come, first served: \
                     start it with --scheduling-policy priority"
                )
            );
        }
    }

    #[test]
    fn keys_are_arrival_order_with_preempted_requests_first_and_never_age() {
        let now = Instant::now();
        let later = now + std::time::Duration::from_secs(3600);
        let key = |id, pre| FcfsPolicy.queue_key(&entry(id, pre), now);
        assert!(key(9, true) < key(3, false));
        assert!(key(7, true) < key(9, true));
        assert!(key(3, false) < key(5, false));
        assert_eq!(key(5, false), FcfsPolicy.queue_key(&entry(5, false), later));
        assert!(!FcfsPolicy.ages());
    }

    #[test]
    fn victims_are_the_newest_for_decode_and_none_for_the_queue() {
        let enqueued_at = Instant::now();
        let running = [2, 9, 4].map(|id| RunningSeq {
            id,
            priority: 0,
            enqueued_at,
        });
        assert_eq!(FcfsPolicy.victim_for_decode(&running), Some(9));
        assert_eq!(FcfsPolicy.victim_for_decode(&[]), None);
        let front = QueueKey::new(0, &entry(1, true));
        assert_eq!(
            FcfsPolicy.victim_for_waiting(&front, &running, enqueued_at),
            None
        );
    }
}
