//! The capacity flags: how big the KV cache is (`--kv-blocks`,
//! `--kv-memory-mb`, `--gpu-memory-utilization`) and how the scheduler
//! shares it (`--scheduling-policy`, `--priority-aging-s`), with vLLM's names
//! and meanings where vLLM has the flag.

use std::time::Duration;

use ember_engine::KvBudget;

use super::flag_error::{positive, FlagError};
use crate::scheduler::SchedulingPolicy;

/// `--scheduling-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyFlag {
    /// First come, first served (requests' `priority` must be 0).
    Fcfs,
    /// By request `priority` (lower first), then arrival; a waiting request
    /// may preempt running ones of lower priority.
    Priority,
}

/// The capacity flags (see the module docs).
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// KV cache capacity in blocks. Wins over --kv-memory-mb and
    /// --gpu-memory-utilization.
    #[arg(long, env = "EMBER_KV_BLOCKS")]
    pub kv_blocks: Option<usize>,

    /// KV cache memory in MiB, capped by what every running sequence at full
    /// context can use. Wins over --gpu-memory-utilization.
    #[arg(long, env = "EMBER_KV_MEMORY_MB")]
    pub kv_memory_mb: Option<usize>,

    /// The share of the GPU's total memory this server may use (vLLM's
    /// meaning): the KV cache gets what the weights, the largest step's
    /// workspace and anything else already on the GPU leave of it, capped by
    /// what --max-batch-size sequences at full context can use. The CPU
    /// takes a quarter of the available RAM instead. In (0, 1].
    #[arg(long, env = "EMBER_GPU_MEMORY_UTILIZATION", default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,

    /// Which waiting request is served first: fcfs (arrival order), or
    /// priority (each request's `priority`, lower first; a waiting request
    /// that cannot get a running slot or KV blocks preempts running requests
    /// of lower priority).
    #[arg(long, env = "EMBER_SCHEDULING_POLICY", value_enum, default_value_t = PolicyFlag::Fcfs)]
    pub scheduling_policy: PolicyFlag,

    /// With --scheduling-policy priority: a waiting request's priority
    /// improves by one for every this many seconds it has waited, so a
    /// stream of urgent requests cannot starve the others forever. 0 = off.
    #[arg(long, env = "EMBER_PRIORITY_AGING_S", default_value_t = 30.0)]
    pub priority_aging_s: f64,
}

impl CapacityArgs {
    /// The KV budget the flags ask for (the first given of --kv-blocks,
    /// --kv-memory-mb, else the device share).
    pub fn kv_budget(&self) -> Result<KvBudget, FlagError> {
        let u = self.gpu_memory_utilization;
        if !(u > 0.0 && u <= 1.0) {
            return Err(FlagError(format!(
                "--gpu-memory-utilization must be in (0, 1], got {u}"
            )));
        }
        Ok(match (self.kv_blocks, self.kv_memory_mb) {
            (Some(b), _) => KvBudget::Blocks(positive("kv-blocks", b)?),
            (None, Some(mb)) => {
                KvBudget::Memory(positive("kv-memory-mb", mb)?.saturating_mul(1 << 20))
            }
            (None, None) => KvBudget::Device {
                gpu_memory_utilization: u,
            },
        })
    }

    /// The scheduling policy the flags ask for.
    pub fn policy(&self) -> Result<SchedulingPolicy, FlagError> {
        let s = self.priority_aging_s;
        if !(s.is_finite() && s >= 0.0) {
            return Err(FlagError(format!(
                "--priority-aging-s must be a non-negative number of seconds, got {s}"
            )));
        }
        Ok(match self.scheduling_policy {
            PolicyFlag::Fcfs => SchedulingPolicy::Fcfs,
            PolicyFlag::Priority => SchedulingPolicy::Priority {
                aging: (s > 0.0).then(|| Duration::from_secs_f64(s)),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    #[command(allow_negative_numbers = true)]
    struct Probe {
        #[command(flatten)]
        capacity: CapacityArgs,
    }

    fn parse(args: &[&str]) -> CapacityArgs {
        let mut full = vec!["probe"];
        full.extend_from_slice(args);
        Probe::try_parse_from(full).expect("clap parses").capacity
    }

    #[test]
    fn the_device_share_is_the_default_and_explicit_sizes_win() {
        assert_eq!(
            parse(&[]).kv_budget().unwrap(),
            KvBudget::Device {
                gpu_memory_utilization: 0.9
            }
        );
        assert_eq!(
            parse(&["--kv-memory-mb", "2", "--gpu-memory-utilization", "0.5"])
                .kv_budget()
                .unwrap(),
            KvBudget::Memory(2 << 20)
        );
        assert_eq!(
            parse(&["--kv-blocks", "64", "--kv-memory-mb", "2"])
                .kv_budget()
                .unwrap(),
            KvBudget::Blocks(64)
        );
    }

    #[test]
    fn policies_and_bad_values_name_their_flag() {
        assert_eq!(parse(&[]).policy().unwrap(), SchedulingPolicy::Fcfs);
        assert_eq!(
            parse(&["--scheduling-policy", "priority"])
                .policy()
                .unwrap(),
            SchedulingPolicy::Priority {
                aging: Some(Duration::from_secs(30))
            }
        );
        assert_eq!(
            parse(&["--scheduling-policy", "priority", "--priority-aging-s", "0"])
                .policy()
                .unwrap(),
            SchedulingPolicy::Priority { aging: None }
        );
        for (args, flag) in [
            (
                &["--gpu-memory-utilization", "0"][..],
                "--gpu-memory-utilization",
            ),
            (
                &["--gpu-memory-utilization", "1.5"][..],
                "--gpu-memory-utilization",
            ),
            (&["--kv-memory-mb", "0"][..], "--kv-memory-mb"),
            (&["--kv-blocks", "0"][..], "--kv-blocks"),
        ] {
            let err = parse(args).kv_budget().unwrap_err().to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
        let err = parse(&["--priority-aging-s", "-1"]).policy().unwrap_err();
        assert!(err.to_string().contains("--priority-aging-s"), "{err}");
        let err = Probe::try_parse_from(["probe", "--scheduling-policy", "lifo"])
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("--scheduling-policy"), "{err}");
    }
}
