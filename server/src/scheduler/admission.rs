//! Admission planning: how many requests leave the wait queue this iteration.
//!
//! In queue order, whatever the order is (the scheduling policy sets it:
//! arrival under fcfs, priority then arrival under priority): requests are
//! admitted from the front of the queue until one does not fit, and nothing
//! behind it jumps ahead (so a large request is never starved by a stream of
//! small ones). A request fits while all four hold:
//! - the prefill step has fewer than `--prefill-max-batch-size` rows (prompts
//!   still being prefilled in chunks take rows first);
//! - some of the iteration's `--prefill-max-tokens` budget is left: the
//!   request's uncached prompt tokens take what is left, and what does not
//!   fit is prefilled in later iterations ([`super::chunking`]);
//! - the running set stays within [`SchedulerKnobs::max_running`](super::knobs::SchedulerKnobs::max_running);
//! - its KV blocks (prompt + max_new_tokens, reserved whole at admission, less
//!   the cached prefix blocks other sequences already hold) are free. Running
//!   out of blocks is a normal outcome: the request waits.

/// What the current iteration can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionBudget {
    /// Prefill rows left: `--prefill-max-batch-size` less continuing chunks.
    pub max_requests: usize,
    /// Prefill tokens left of the iteration's `--prefill-max-tokens`.
    pub max_prompt_tokens: usize,
    /// Running slots left: max_running - running.
    pub free_running_slots: usize,
    /// Free KV blocks.
    pub free_blocks: usize,
}

/// One queued request as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Prompt tokens to compute (not found in the prefix cache).
    pub prompt_tokens: usize,
    /// Free KV blocks admission takes.
    pub blocks: usize,
}

/// Number of requests to admit from the front of `queue` (in queue order).
/// The queue is read lazily: nothing past the first request that does not
/// fit is looked at.
pub fn plan(budget: AdmissionBudget, queue: impl IntoIterator<Item = Candidate>) -> usize {
    let max = budget.max_requests.min(budget.free_running_slots);
    let (mut n, mut tokens, mut blocks) = (0, 0, 0);
    for c in queue {
        if n == max || tokens >= budget.max_prompt_tokens || blocks + c.blocks > budget.free_blocks
        {
            break;
        }
        n += 1;
        tokens += c.prompt_tokens.min(budget.max_prompt_tokens - tokens);
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
    fn token_budget_caps_batch_and_the_last_one_is_chunked() {
        // 30 + 30 + 30 + (10 of 30): the fourth starts with a chunk.
        assert_eq!(plan(budget(), same(10, 30, 1)), 4);
        let b = AdmissionBudget {
            max_requests: 10,
            ..budget()
        };
        assert_eq!(plan(b, same(10, 50, 1)), 2);
        assert_eq!(plan(b, same(10, 51, 1)), 2);
        // A prompt longer than the whole budget is admitted alone.
        assert_eq!(plan(b, same(10, 500, 1)), 1);
        let spent = AdmissionBudget {
            max_prompt_tokens: 0,
            ..b
        };
        assert_eq!(plan(spent, same(10, 1, 1)), 0);
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
    fn nothing_overtakes_the_front() {
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
