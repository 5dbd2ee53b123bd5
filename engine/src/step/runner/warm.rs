//! Warming what serving will meet beyond the step shapes: the projection
//! kernels timed against each other at every step shape's rows
//! ([`StepRunner::tune_projections`]), the kernels over each row of the
//! vocabulary that logprobs and prompt logprobs run, and on CUDA every
//! compile-time variant of the sampling kernel and of the counts' update
//! ([`StepRunner::warm_vocab_kernels`]), compiled before SERVING.

use burn::prelude::*;

use super::StepRunner;
use crate::error::EngineError;
use crate::ops::vocab::argmax_rows;
use crate::ops::{LinearShape, TunedShape};
use crate::sampling::logprobs;

impl StepRunner {
    /// Times the projection kernels against each other at the shapes of
    /// decode steps of `buckets` rows (every projection and the LM head)
    /// and of prefill steps of `tokens` flat tokens (every projection; a
    /// prefill step's LM head sees its rows, a decode bucket), and records
    /// the fastest for each (CUDA). Returns the timings.
    pub fn tune_projections(&self, buckets: &[usize], tokens: &[usize]) -> Vec<TunedShape> {
        let c = &self.config;
        let e = c.n_embd;
        let at = |rows, n, k, lm_head| LinearShape {
            rows,
            n,
            k,
            lm_head,
        };
        let body = |rows| {
            [
                at(rows, 3 * e, e, false),
                at(rows, e, e, false),
                at(rows, 4 * e, e, false),
                at(rows, e, 4 * e, false),
            ]
        };
        let mut shapes: Vec<LinearShape> = buckets
            .iter()
            .flat_map(|&rows| {
                body(rows)
                    .into_iter()
                    .chain([at(rows, c.vocab_size, e, true)])
            })
            .collect();
        let mut tokens: Vec<usize> = tokens
            .iter()
            .copied()
            .filter(|t| !buckets.contains(t))
            .collect();
        tokens.sort_unstable();
        tokens.dedup();
        shapes.extend(tokens.into_iter().flat_map(body));
        self.ops.tune_linear(&self.device, &shapes)
    }

    /// Runs the vocabulary kernels once (`crate::ops::vocab`: the logprobs'
    /// log-softmax with a top-n, and the argmax) so that they are compiled
    /// before SERVING. On CUDA they are Ember's own, one plan for every row
    /// count and `n` (issue 46: Burn's reductions and `topk` tuned one key
    /// per row bucket and `n`, 1-33 s each, on the scheduler thread when a
    /// request met them first), so one run covers every shape.
    pub fn warm_vocab_kernels(&mut self) -> Result<(), EngineError> {
        let vocab = self.config.vocab_size;
        let logits = Tensor::<2>::zeros([2, vocab], &self.device);
        logprobs(logits.clone(), &[0, 1], &[Some(2), Some(0)])?;
        argmax_rows(logits)
            .try_into_data()
            .map_err(|e| EngineError::Device(format!("{e:?}")))?;
        #[cfg(feature = "cuda")]
        if crate::ops::cuda::is_cube_device(&self.device) {
            self.warm_sampling_variants()?;
        }
        Ok(())
    }

    /// The sampling kernel with and without a mask and penalty counts (its
    /// compile-time switches: which a step takes depends on what earlier
    /// requests left in the step's buffers, so the warm requests cannot
    /// reach them all), and the counts' update both ways, each once on one
    /// greedy row (issue 46: a first deploy compiled three of them after
    /// SERVING).
    #[cfg(feature = "cuda")]
    fn warm_sampling_variants(&mut self) -> Result<(), EngineError> {
        use crate::ops::cuda::{count_chosen, sample_rows};
        use crate::ops::row_params::{slot_row_len, FLOAT_COLS, INT_COLS};
        use burn::tensor::DType;
        let (vocab, dev) = (self.config.vocab_size, &self.device);
        let logits = Tensor::<2>::zeros([1, vocab], dev);
        let floats = Tensor::<2>::zeros([1, FLOAT_COLS], (dev, DType::F32));
        let ints = Tensor::<2, Int>::zeros([1, INT_COLS], dev);
        let positions = Tensor::<1, Int>::zeros([1], dev);
        let allowed = Tensor::<2, Int>::zeros([1, vocab.div_ceil(32)], dev);
        // One row of the slot table (`crate::sampling::penalty_state`).
        let counts = Tensor::<2, Int>::zeros([1, slot_row_len(vocab)], dev);
        for (mask, with_counts) in [(false, false), (true, false), (false, true), (true, true)] {
            let ids = sample_rows(
                logits.clone(),
                floats.clone(),
                ints.clone(),
                positions.clone(),
                mask.then(|| allowed.clone()),
                with_counts.then(|| counts.clone()),
                None,
            );
            for undo in [false, true] {
                let _ = count_chosen(counts.clone(), ids.clone(), ints.clone(), undo);
            }
        }
        counts
            .try_into_data()
            .map(drop)
            .map_err(|e| EngineError::Device(format!("{e:?}")))
    }
}
