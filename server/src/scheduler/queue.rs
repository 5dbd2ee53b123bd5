//! The wait queue: requests not running, new or preempted, in the order
//! admission takes them.
//!
//! Every waiting request has a key `(priority, class, id)`; the queue is
//! kept sorted by it and admission takes from the front:
//! - `priority`: 0 for all under `fcfs`; under `priority` the request's own
//!   (lower first), improved by one for every `aging` period it has waited
//!   since it was first enqueued (the starvation guard), so the order is
//!   refreshed ([`WaitQueue::order`]) before each admission;
//! - `class`: 0 for a preempted request, 1 for a new one, so a preempted
//!   request goes back to the front of its priority (vLLM's FCFS prepends
//!   preempted requests too);
//! - `id`: arrival order (the scheduler hands out rising ids).
//!
//! A request's client side ([`Client`]: its event channel, span, priority)
//! travels with it between this queue and the running set.

use std::collections::VecDeque;
use std::time::Instant;

use ember_engine::{SeqId, SequenceRequest};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::knobs::SchedulingPolicy;
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
    policy: SchedulingPolicy,
}

impl WaitQueue {
    pub fn new(policy: SchedulingPolicy) -> Self {
        Self {
            items: VecDeque::new(),
            policy,
        }
    }

    /// The priority admission orders by at `now` (aging applied).
    pub fn effective_priority(&self, client: &Client, now: Instant) -> i64 {
        match self.policy {
            SchedulingPolicy::Fcfs => 0,
            SchedulingPolicy::Priority { aging } => {
                let aged = aging
                    .filter(|a| !a.is_zero())
                    .map_or(0, |a| (now - client.enqueued_at).as_nanos() / a.as_nanos());
                i64::from(client.priority) - aged.min(i64::MAX as u128) as i64
            }
        }
    }

    fn key(&self, w: &Waiting, now: Instant) -> (i64, u8, SeqId) {
        let class = u8::from(!w.is_preempted());
        (self.effective_priority(&w.client, now), class, w.id())
    }

    /// Queues `w` at its place.
    pub fn push(&mut self, w: Waiting, now: Instant) {
        let k = self.key(&w, now);
        let at = self.items.partition_point(|x| self.key(x, now) <= k);
        self.items.insert(at, w);
    }

    /// Re-sorts by the keys at `now` (aging moves requests forward; nothing
    /// to do under fcfs, whose keys never change).
    pub fn order(&mut self, now: Instant) {
        if matches!(self.policy, SchedulingPolicy::Priority { aging: Some(_) }) {
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

    fn waiting(id: SeqId, priority: i32, preempted: bool, enqueued_at: Instant) -> Waiting {
        let mut seq = SequenceRequest::greedy(id, vec![1, 2], 4);
        if preempted {
            seq.resume = Some(ResumeState {
                generated: vec![3],
                rng_draws: 0,
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
        let mut q = WaitQueue::new(SchedulingPolicy::Fcfs);
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
        let mut q = WaitQueue::new(SchedulingPolicy::Priority { aging: None });
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
        let mut q = WaitQueue::new(SchedulingPolicy::Priority { aging: Some(aging) });
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
        assert_eq!(q.effective_priority(&q.front().unwrap().client, later), 2);
    }
}
