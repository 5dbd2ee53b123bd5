//! Live scheduler state that handlers may read without asking the scheduler
//! thread: gauges and counters in atomics, written only by that thread (and by
//! the service for the counters it owns: received, rejected).
//!
//! Reads are relaxed snapshots: good for `GetServerInfo`, metrics and the
//! shutdown wait, never used to make scheduling decisions.

use std::sync::atomic::{AtomicU64, Ordering};

/// Gauges and counters of the scheduler, shared through an `Arc`.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Requests in the pending queue (submitted, not yet admitted).
    pub queue_depth: AtomicU64,
    /// Sequences admitted and not finished.
    pub active_sequences: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    /// Generate calls that reached the handler.
    pub received: AtomicU64,
    pub admitted: AtomicU64,
    /// Finished with EOS, LENGTH or STOP (a stop token, or a stop string the
    /// service matched).
    pub finished: AtomicU64,
    /// Cancelled by client disconnect or server shutdown.
    pub cancelled: AtomicU64,
    /// Refused before queueing: validation, queue full, draining, not ready.
    pub rejected: AtomicU64,
    /// Ended by an engine failure.
    pub failed: AtomicU64,
    pub deadline_exceeded: AtomicU64,
    /// Running requests preempted (blocks freed, resumed later by recompute).
    pub preemptions: AtomicU64,
    pub iterations: AtomicU64,
    /// Prompt tokens of admitted requests looked up in the prefix cache (0
    /// with the cache off).
    pub prefix_cache_queried_tokens: AtomicU64,
    /// Of those, tokens found cached (not computed).
    pub prefix_cache_hit_tokens: AtomicU64,
}

impl SchedulerStats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, value: usize) {
        gauge.store(value as u64, Ordering::Relaxed);
    }
}
