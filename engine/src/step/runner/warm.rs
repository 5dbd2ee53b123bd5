//! Warming what serving will meet beyond the step shapes: the kernels over
//! each row of the vocabulary that logprobs and prompt logprobs run
//! ([`StepRunner::warm_vocab_kernels`]), compiled before SERVING.

use burn::prelude::*;

use super::StepRunner;
use crate::error::EngineError;
use crate::ops::vocab::argmax_rows;
use crate::sampling::logprobs;

impl StepRunner {
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
        Ok(())
    }
}
