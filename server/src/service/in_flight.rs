//! Requests accepted and not yet ended, counted so that a draining server
//! can wait for the last one to end.
//!
//! Each accepted request holds an [`InFlight`] guard from its submit to the
//! end of its stream task (its last message handed to the transport). The
//! count lives in a `watch` channel: dropping a guard updates it, and
//! [`InFlightTracker::idle`] wakes on that update, so the shutdown drain is
//! signalled, not polled (mini-redis's habit of waiting on a channel rather
//! than sleeping in a loop).

use std::sync::Arc;

use tokio::sync::watch;

/// The count of requests in flight; cheap to clone.
#[derive(Debug, Clone)]
pub struct InFlightTracker {
    count: Arc<watch::Sender<u64>>,
}

impl Default for InFlightTracker {
    fn default() -> Self {
        Self {
            count: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl InFlightTracker {
    /// Counts one more request until the returned guard is dropped.
    pub fn enter(&self) -> InFlight {
        self.count.send_modify(|n| *n += 1);
        InFlight {
            count: Arc::clone(&self.count),
        }
    }

    /// Requests in flight now.
    pub fn count(&self) -> u64 {
        *self.count.borrow()
    }

    /// Resolves once no request is in flight (at once if none is).
    pub async fn idle(&self) {
        let mut rx = self.count.subscribe();
        // The sender lives in `self`, so the channel cannot close under us.
        let _ = rx.wait_for(|&n| n == 0).await;
    }
}

/// One request in flight (see [`InFlightTracker::enter`]).
#[derive(Debug)]
pub struct InFlight {
    count: Arc<watch::Sender<u64>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.count.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn idle_resolves_when_the_last_guard_drops() {
        let tracker = InFlightTracker::default();
        tracker.idle().await; // nothing in flight
        let a = tracker.enter();
        let b = tracker.enter();
        assert_eq!(tracker.count(), 2);
        let waiter = tokio::spawn({
            let tracker = tracker.clone();
            async move { tracker.idle().await }
        });
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "one request is still in flight");
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("idle resolves after the last drop")
            .unwrap();
        assert_eq!(tracker.count(), 0);
    }
}
