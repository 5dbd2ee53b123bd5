//! [`SchedulerKnobs`]: the continuous-batching loop's own knobs. The CLI
//! builds them from its flags (validated there); the scheduler, and the
//! service for what it reports and checks, read them.

use std::time::Duration;

/// Which waiting request is admitted first, and whom a preemption takes
/// (`--scheduling-policy`, vLLM's names): the configuration value only. The
/// rules are [`super::policy`]'s, and [`super::policy::build`] is the one
/// place that matches on this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulingPolicy {
    /// First come, first served ([`super::policy::FcfsPolicy`]).
    Fcfs,
    /// By `priority` (lower first), then arrival
    /// ([`super::policy::PriorityPolicy`]); a waiting request's priority
    /// improves by one every `aging` it has waited (the starvation guard;
    /// `None`: never).
    Priority { aging: Option<Duration> },
}

/// The scheduler's knobs, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerKnobs {
    /// Decode batch knob: most sequences in one decode step.
    pub max_batch_size: usize,
    /// Prefill batch knob: most requests admitted into one prefill step.
    pub prefill_max_batch_size: usize,
    /// Most prompt tokens computed in one iteration's prefill step.
    pub prefill_max_tokens: usize,
    /// Most requests waiting for admission.
    pub max_pending: usize,
    /// Largest `max_new_tokens` a request may ask for.
    pub max_new_tokens_limit: usize,
    /// Admission order and preemption victims.
    pub policy: SchedulingPolicy,
    /// Overlap the host with the GPU: queue each decode step before judging
    /// the previous one (`--no-async-scheduling` turns it off; vLLM's name).
    pub async_scheduling: bool,
}

impl SchedulerKnobs {
    /// Most sequences that may be running (admitted, not finished) at once. The
    /// prefill knob may exceed the decode knob, so admission alone can fill a
    /// larger running set; decode then rotates through it `max_batch_size` at a
    /// time.
    pub fn max_running(&self) -> usize {
        self.max_batch_size.max(self.prefill_max_batch_size)
    }
}
