//! The [`Policy`] trait: every rule that differs between scheduling
//! policies, behind one seam the scheduler calls (vLLM's `RequestQueue`
//! plays this part there), and the plain values that cross it.
//!
//! A policy decides four things and nothing else:
//! - which `priority` a request may ask for ([`Policy::check_priority`],
//!   asked by the service before it queues the request);
//! - where a waiting request stands in the wait queue, aging included
//!   ([`Policy::queue_key`], [`Policy::ages`]);
//! - whom the front of the wait queue may preempt when it cannot be admitted
//!   ([`Policy::victim_for_waiting`]);
//! - whom a decode step short of blocks preempts
//!   ([`Policy::victim_for_decode`]).
//!
//! It sees no queue, no engine and no client: plain values in, a key or a
//! sequence id out. The scheduler does the moving (`queue.rs`,
//! `admitting.rs`, `preemption.rs`); the implementations are `fcfs.rs` and
//! `priority.rs`, and `policy::build` picks one from the configuration.

use std::fmt;
use std::time::Instant;

use ember_engine::SeqId;

/// A waiting request as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueEntry {
    /// Its sequence id; the scheduler hands out rising ids, so it is the
    /// arrival order.
    pub id: SeqId,
    /// The priority it asked for (lower first).
    pub priority: i32,
    /// When the service queued it (aging counts from here).
    pub enqueued_at: Instant,
    /// Whether it was preempted (it waits to resume).
    pub preempted: bool,
}

/// A waiting request's place in the wait queue: the queue is kept sorted by
/// it, lowest first, and admission takes from the front. The fields compare
/// in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueKey {
    /// Lower first: the request's priority as the policy counts it now.
    pub priority: i64,
    /// `false` first: a preempted request goes back to the front of its
    /// priority (vLLM's FCFS prepends preempted requests too).
    pub new: bool,
    /// Arrival order among equals.
    pub arrival: SeqId,
}

impl QueueKey {
    /// `entry`'s key at `priority`: preempted first, then arrival.
    pub fn new(priority: i64, entry: &QueueEntry) -> Self {
        Self {
            priority,
            new: !entry.preempted,
            arrival: entry.id,
        }
    }
}

/// A running request (prefilling or decoding) as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunningSeq {
    pub id: SeqId,
    /// The priority it asked for.
    pub priority: i32,
    /// When it was first queued: a policy that ages waiting requests ages a
    /// running one the same way when it weighs it against the queue, so a
    /// request it preempts (which keeps aging from the same instant) cannot
    /// preempt its preemptor back.
    pub enqueued_at: Instant,
}

/// A `priority` the policy cannot honour; the service refuses the request
/// naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{priority} given, but {reason}")]
pub struct PriorityRefused {
    pub priority: i32,
    /// Why, and what to do about it.
    pub reason: &'static str,
}

/// The rules one scheduling policy sets (module docs).
pub trait Policy: fmt::Debug + Send {
    /// Whether a request may ask for `priority` (checked before queueing).
    fn check_priority(&self, priority: i32) -> Result<(), PriorityRefused>;

    /// `entry`'s place in the wait queue at `now`.
    fn queue_key(&self, entry: &QueueEntry, now: Instant) -> QueueKey;

    /// Whether keys change while requests wait: if so the queue is re-sorted
    /// before each admission.
    fn ages(&self) -> bool;

    /// The running request to preempt for the front of the wait queue (its
    /// key `front`, computed at `now`), which cannot get a running slot or
    /// its blocks; `None`: the front waits.
    fn victim_for_waiting(
        &self,
        front: &QueueKey,
        running: &[RunningSeq],
        now: Instant,
    ) -> Option<SeqId>;

    /// The running request to preempt when a decode step needs more fresh
    /// blocks than are free; `None` only when nothing runs.
    fn victim_for_decode(&self, running: &[RunningSeq]) -> Option<SeqId>;
}
