//! Chunked prefill: how one iteration's prefill token budget is shared.
//!
//! Each scheduler iteration runs at most one prefill step of at most
//! `--prefill-max-tokens` tokens, then a decode step for the running
//! requests. A prompt longer than what is left of the budget is prefilled a
//! chunk per iteration, so a long prompt delays the running streams by one
//! budget's worth of compute per token, not by its whole prefill.
//!
//! The budget goes first-come first-served: prompts already being prefilled,
//! in admission order, then newly admitted ones
//! ([`super::admission::plan`] decides how many), each taking what it has
//! left or what is left of the budget, whichever is smaller. The engine runs
//! every chunk of a step in one forward pass over its cached context
//! ([`ember_engine::Engine::prefill_step`]).

/// Chunk sizes for prompts with `remaining` tokens each (in order), under a
/// budget of `budget` tokens and at most `max_rows` rows. The result is as
/// long as the number of prompts that get tokens this step (a prefix of
/// `remaining`); prompts with nothing remaining get no row.
pub fn split(
    budget: usize,
    max_rows: usize,
    remaining: impl IntoIterator<Item = usize>,
) -> Vec<usize> {
    let mut left = budget;
    let mut chunks = Vec::new();
    for r in remaining {
        if left == 0 || chunks.len() == max_rows || r == 0 {
            break;
        }
        let n = r.min(left);
        chunks.push(n);
        left -= n;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_come_first_served_until_the_budget_is_spent() {
        assert_eq!(split(100, 8, [30, 30, 30, 30, 30]), [30, 30, 30, 10]);
        assert_eq!(split(100, 8, [250]), [100]);
        assert_eq!(split(100, 8, [40, 250, 5]), [40, 60]);
        assert_eq!(split(100, 8, []), Vec::<usize>::new());
        assert_eq!(split(0, 8, [5]), Vec::<usize>::new());
    }

    #[test]
    fn rows_cap_the_step() {
        assert_eq!(split(100, 2, [10, 10, 10]), [10, 10]);
        assert_eq!(split(100, 0, [10]), Vec::<usize>::new());
    }

    #[test]
    fn a_long_prompt_takes_ceil_len_over_budget_steps() {
        let (budget, mut left, mut steps) = (64, 1000usize, 0);
        while left > 0 {
            let c = split(budget, 1, [left]);
            assert!(c[0] <= budget);
            left -= c[0];
            steps += 1;
        }
        assert_eq!(steps, 1000usize.div_ceil(64));
    }
}
