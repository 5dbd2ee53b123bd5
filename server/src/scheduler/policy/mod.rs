//! Scheduling policies: the [`Policy`] seam (`seam.rs`) and its two
//! implementations, [`FcfsPolicy`] (`fcfs.rs`) and [`PriorityPolicy`]
//! (`priority.rs`).
//!
//! [`build`] is the one place that turns the configured
//! [`SchedulingPolicy`] into a policy; nothing else matches on that enum. The
//! scheduler's wait queue holds the policy object (ordering, aging) and
//! preemption asks it for victims; the service asks it whether a request's
//! `priority` is acceptable.

mod fcfs;
mod priority;
mod seam;

pub use fcfs::FcfsPolicy;
pub use priority::PriorityPolicy;
pub use seam::{Policy, PriorityRefused, QueueEntry, QueueKey, RunningSeq};

use super::knobs::SchedulingPolicy;

/// The policy `config` names.
pub fn build(config: SchedulingPolicy) -> Box<dyn Policy> {
    match config {
        SchedulingPolicy::Fcfs => Box::new(FcfsPolicy),
        SchedulingPolicy::Priority { aging } => Box::new(PriorityPolicy { aging }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn build_gives_the_configured_policy() {
        let fcfs = build(SchedulingPolicy::Fcfs);
        assert!(fcfs.check_priority(1).is_err());
        assert!(!fcfs.ages());
        let priority = build(SchedulingPolicy::Priority { aging: None });
        assert_eq!(priority.check_priority(1), Ok(()));
        assert!(!priority.ages());
        let aging = Some(Duration::from_secs(30));
        assert!(build(SchedulingPolicy::Priority { aging }).ages());
    }
}
