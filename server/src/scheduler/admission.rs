//! Admission policy: how many requests leave the pending queue this iteration.
//!
//! Strict FIFO: requests are admitted from the front of the queue until one
//! does not fit, and nothing behind it jumps ahead (so a large request is never
//! starved by a stream of small ones). A request fits while all four hold:
//! - the batch has fewer than `--prefill-max-batch-size` requests;
//! - the batch's prompt tokens stay within `--prefill-max-tokens`;
//! - the running set stays within [`SchedulerKnobs::max_running`](crate::cli::SchedulerKnobs::max_running);
//! - its KV blocks (prompt + max_new_tokens, reserved whole at admission) are
//!   free. Running out of blocks is a normal outcome: the request waits.

/// What the current iteration can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionBudget {
    /// `--prefill-max-batch-size`.
    pub max_requests: usize,
    /// `--prefill-max-tokens`.
    pub max_prompt_tokens: usize,
    /// Running slots left: max_running - running.
    pub free_running_slots: usize,
    /// Free KV blocks.
    pub free_blocks: usize,
}

/// One queued request as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub prompt_tokens: usize,
    pub blocks: usize,
}

/// Number of requests to admit from the front of `queue` (in queue order).
pub fn plan(budget: AdmissionBudget, queue: impl IntoIterator<Item = Candidate>) -> usize {
    let max = budget.max_requests.min(budget.free_running_slots);
    let (mut n, mut tokens, mut blocks) = (0, 0, 0);
    for c in queue {
        if n == max
            || tokens + c.prompt_tokens > budget.max_prompt_tokens
            || blocks + c.blocks > budget.free_blocks
        {
            break;
        }
        n += 1;
        tokens += c.prompt_tokens;
        blocks += c.blocks;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> AdmissionBudget {
        AdmissionBudget {
            max_requests: 4,
            max_prompt_tokens: 100,
            free_running_slots: 10,
            free_blocks: 50,
        }
    }

    fn same(n: usize, prompt_tokens: usize, blocks: usize) -> Vec<Candidate> {
        vec![
            Candidate {
                prompt_tokens,
                blocks
            };
            n
        ]
    }

    #[test]
    fn prefill_batch_knob_caps_requests() {
        assert_eq!(plan(budget(), same(10, 1, 1)), 4);
    }

    #[test]
    fn token_budget_caps_batch() {
        assert_eq!(plan(budget(), same(10, 30, 1)), 3);
    }

    #[test]
    fn running_slots_cap_batch() {
        let b = AdmissionBudget {
            free_running_slots: 2,
            ..budget()
        };
        assert_eq!(plan(b, same(10, 1, 1)), 2);
    }

    #[test]
    fn kv_blocks_cap_batch_and_requests_wait() {
        assert_eq!(plan(budget(), same(10, 1, 20)), 2);
        let b = AdmissionBudget {
            free_blocks: 5,
            ..budget()
        };
        assert_eq!(plan(b, same(3, 1, 20)), 0);
    }

    #[test]
    fn fifo_no_overtaking() {
        let q = [
            Candidate {
                prompt_tokens: 1,
                blocks: 1,
            },
            Candidate {
                prompt_tokens: 1,
                blocks: 60,
            },
            Candidate {
                prompt_tokens: 1,
                blocks: 1,
            },
        ];
        assert_eq!(plan(budget(), q), 1);
    }

    #[test]
    fn empty_queue() {
        assert_eq!(plan(budget(), []), 0);
    }
}
