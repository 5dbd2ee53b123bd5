//! The wait queue: requests not running, new or preempted, in the order
//! admission takes them, and the running set's type.
//!
//! The queue holds the server's scheduling [`Policy`] and is kept sorted by
//! the key the policy gives each waiting request ([`QueueKey`]: priority as
//! the policy counts it, preempted before new, then arrival); admission
//! takes from the front. Under a policy whose keys age
//! ([`Policy::ages`]) the order is refreshed ([`WaitQueue::order`]) before
//! each admission. Preemption asks the same policy object for its victims
//! ([`WaitQueue::policy`]).
//!
//! A request's client side ([`Client`]: its event channel, span, priority)
//! travels with it between this queue and the running set ([`RunningSet`]).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use ember_engine::{SeqId, SequenceRequest};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::policy::{Policy, QueueEntry, QueueKey};
use super::request::Event;

/// A request's client side, from submission to its end.
#[derive(Debug)]
pub struct Client {
    /// Where its events go; closed when the client left.
    pub events: mpsc::UnboundedSender<Event>,
    /// Its tracing span, entered for this thread's lines about it.
    pub span: tracing::Span,
    /// Lower is served first (0 under fcfs).
    pub priority: i32,
    /// When the service queued it (aging counts from here).
    pub enqueued_at: Instant,
    /// Prefill steps that computed part of its prompt before its first token.
    pub chunks: u32,
    /// Whether its prompt completed and `Prefilled` was sent (a resumed
    /// request's recompute sends nothing).
    pub prefilled: bool,
    /// The sequence whose prompt it waits for (see `QueuedRequest::follows`).
    pub follows: Option<SeqId>,
}

/// Admitted and not finished (prefilling or decoding): each one's client.
pub type RunningSet = HashMap<SeqId, Client>;

/// A request waiting for admission.
#[derive(Debug)]
pub struct Waiting {
    /// What the engine runs; `seq.resume` is set on a preempted request.
    pub seq: SequenceRequest,
    pub client: Client,
    /// Its place in the bounded pending queue: a new request's, dropped at
    /// admission; a preempted request holds none.
    pub permit: Option<OwnedSemaphorePermit>,
}

impl Waiting {
    pub fn id(&self) -> SeqId {
        self.seq.id
    }

    /// Whether it was preempted (and resumes by recompute when admitted).
    pub fn is_preempted(&self) -> bool {
        self.seq.resume.is_some()
    }
}

/// Waiting requests in admission order (see the module docs).
#[derive(Debug)]
pub struct WaitQueue {
    items: VecDeque<Waiting>,
    policy: Box<dyn Policy>,
}

impl WaitQueue {
    pub fn new(policy: Box<dyn Policy>) -> Self {
        Self {
            items: VecDeque::new(),
            policy,
        }
    }

    /// The scheduling policy the queue is ordered by.
    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    /// `w`'s place in the queue at `now` (aging applied).
    pub fn key(&self, w: &Waiting, now: Instant) -> QueueKey {
        let entry = QueueEntry {
            id: w.id(),
            priority: w.client.priority,
            enqueued_at: w.client.enqueued_at,
            preempted: w.is_preempted(),
        };
        self.policy.queue_key(&entry, now)
    }

    /// Queues `w` at its place.
    pub fn push(&mut self, w: Waiting, now: Instant) {
        let k = self.key(&w, now);
        let at = self.items.partition_point(|x| self.key(x, now) <= k);
        self.items.insert(at, w);
    }

    /// Re-sorts by the keys at `now` (aging moves requests forward; nothing
    /// to do under a policy whose keys never change).
    pub fn order(&mut self, now: Instant) {
        if self.policy.ages() {
            let mut items = std::mem::take(&mut self.items);
            items
                .make_contiguous()
                .sort_by_cached_key(|w| self.key(w, now));
            self.items = items;
        }
    }

    pub fn front(&self) -> Option<&Waiting> {
        self.items.front()
    }

    pub fn pop_front(&mut self) -> Option<Waiting> {
        self.items.pop_front()
    }

    /// Takes request `id` out, wherever it is.
    pub fn remove(&mut self, id: SeqId) -> Option<Waiting> {
        let pos = self.items.iter().position(|w| w.id() == id)?;
        self.items.remove(pos)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Waiting> {
        self.items.iter()
    }

    /// Keeps the requests `keep` says yes to; returns the others. Runs every
    /// scheduler iteration: when every request stays, nothing is moved.
    pub fn take_unless(&mut self, keep: impl Fn(&Waiting) -> bool) -> Vec<Waiting> {
        if self.items.iter().all(&keep) {
            return Vec::new();
        }
        let (kept, gone): (VecDeque<_>, VecDeque<_>) =
            std::mem::take(&mut self.items).into_iter().partition(&keep);
        self.items = kept;
        gone.into()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ember_engine::ResumeState;

    use super::*;
    use crate::scheduler::policy::{FcfsPolicy, PriorityPolicy};

    fn waiting(id: SeqId, priority: i32, preempted: bool, enqueued_at: Instant) -> Waiting {
        let mut seq = SequenceRequest::greedy(id, vec![1, 2], 4);
        if preempted {
            seq.resume = Some(ResumeState {
                generated: vec![3],
                prompt_scored: 0,
            });
        }
        let (events, _) = mpsc::unbounded_channel();
        Waiting {
            seq,
            client: Client {
                events,
                span: tracing::Span::none(),
                priority,
                enqueued_at,
                chunks: 0,
                prefilled: false,
                follows: None,
            },
            permit: None,
        }
    }

    fn ids(q: &WaitQueue) -> Vec<SeqId> {
        q.iter().map(Waiting::id).collect()
    }

    #[test]
    fn fcfs_is_arrival_order_with_preempted_requests_in_front() {
        let now = Instant::now();
        let mut q = WaitQueue::new(Box::new(FcfsPolicy));
        for (id, prio, pre) in [(5, 0, false), (3, 0, false), (9, 0, true), (7, 0, true)] {
            q.push(waiting(id, prio, pre, now), now);
        }
        assert_eq!(ids(&q), [7, 9, 3, 5]);
        assert_eq!(q.remove(9).map(|w| w.id()), Some(9));
        assert_eq!(q.pop_front().map(|w| w.id()), Some(7));
        assert_eq!(ids(&q), [3, 5]);
    }

    #[test]
    fn priority_orders_by_priority_then_class_then_arrival() {
        let now = Instant::now();
        let mut q = WaitQueue::new(Box::new(PriorityPolicy { aging: None }));
        q.push(waiting(1, 10, false, now), now);
        q.push(waiting(2, 0, false, now), now);
        q.push(waiting(3, 10, true, now), now);
        q.push(waiting(4, -5, false, now), now);
        q.push(waiting(5, 0, false, now), now);
        assert_eq!(ids(&q), [4, 2, 5, 3, 1]);
    }

    #[test]
    fn aging_moves_a_long_waiting_request_forward() {
        let t0 = Instant::now();
        let aging = Duration::from_secs(10);
        let mut q = WaitQueue::new(Box::new(PriorityPolicy { aging: Some(aging) }));
        q.push(waiting(1, 5, false, t0), t0);
        let later = t0 + Duration::from_secs(31); // 3 periods: 5 -> 2
        q.push(waiting(2, 3, false, later), later);
        q.push(waiting(3, 2, false, later), later);
        q.order(later);
        assert_eq!(
            ids(&q),
            [1, 3, 2],
            "request 1 aged to 2, ahead of 3 by arrival"
        );
        assert_eq!(q.front().map(|w| q.key(w, later).priority), Some(2));
    }
}
