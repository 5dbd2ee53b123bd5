//! Warming what serving will meet beyond the step shapes: the reductions
//! over the vocabulary that logprobs and prompt logprobs run
//! ([`StepRunner::warm_reductions`]), so they are tuned before SERVING.

use burn::prelude::*;

use super::StepRunner;
use crate::error::EngineError;
use crate::sampling::logprobs;

/// One row count in each of CubeCL's autotune buckets for a reduction over
/// the vocabulary (its keys round the row count up to a power of 8: 1, 8,
/// 64, 512, 4096, 32768), the smallest of each, up to `max_rows`.
pub(super) fn reduce_buckets(max_rows: usize) -> Vec<usize> {
    [1, 2, 9, 65, 513, 4097]
        .into_iter()
        .filter(|&r| r <= max_rows.max(1))
        .collect()
}

impl StepRunner {
    /// Runs the reductions over the vocabulary that logprobs and prompt
    /// logprobs meet (log-softmax in f32, the chosen token's value) and the
    /// argmax, at one row count in each autotune bucket up to `max_rows`
    /// ([`reduce_buckets`]), so that a logprobs request does not tune them
    /// on the scheduler thread while serving (issue 46: a first deploy's
    /// traffic met 25 tunings, 20 of them these). Not the top-n
    /// alternatives: Burn's `topk` has one autotune key per padded `n` and
    /// row bucket, and tuning one takes 1-33 s on an H200 (8-33 s at n = 32:
    /// all of them made a first start 124 s), so they still tune on first use
    /// (counted and named by the server) until a kernel of Ember's own,
    /// chosen by rule, replaces `topk`. Returns the row counts run.
    pub fn warm_reductions(&mut self, max_rows: usize) -> Result<Vec<usize>, EngineError> {
        let vocab = self.config.vocab_size;
        let buckets = reduce_buckets(max_rows);
        for &rows in &buckets {
            let logits = Tensor::<2>::zeros([rows, vocab], &self.device);
            let sampled = vec![0u32; rows];
            logprobs(logits.clone(), &sampled, &vec![Some(0); rows], true)?;
            logits
                .argmax(1)
                .try_into_data()
                .map_err(|e| EngineError::Device(format!("{e:?}")))?;
        }
        Ok(buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::reduce_buckets;

    #[test]
    fn one_row_count_per_power_of_eight_bucket() {
        assert_eq!(reduce_buckets(1), [1]);
        assert_eq!(reduce_buckets(64), [1, 2, 9]);
        assert_eq!(reduce_buckets(256), [1, 2, 9, 65]);
        assert_eq!(reduce_buckets(8192), [1, 2, 9, 65, 513, 4097]);
    }
}
