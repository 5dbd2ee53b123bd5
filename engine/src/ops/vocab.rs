//! Reductions over each row of the vocabulary, choosing their device in one
//! place: the argmax ([`argmax_rows`]) and the logprobs' log-softmax values
//! ([`logprob_rows`]). On a CUDA tensor they run Ember's kernels
//! (`cuda::kernels::vocab_rows`: one plan whatever the shape, so nothing is
//! autotuned while serving); elsewhere Burn's tensor ops, which are also
//! their reference.

use burn::prelude::*;
#[cfg(feature = "cuda")]
use burn::tensor::DType;

/// The argmax of each row of `logits` `[B, V]`, `[B, 1]` (the lowest index
/// of a tie on CUDA).
pub fn argmax_rows(logits: Tensor<2>) -> Tensor<2, Int> {
    #[cfg(feature = "cuda")]
    if super::cuda::on_cube(&logits) {
        let [b, _] = logits.dims();
        let ids = Tensor::<2, Int>::empty([b, 1], &logits.device());
        return super::cuda::vocab_argmax(ids, logits);
    }
    logits.argmax(1)
}

/// On CUDA, for each of `rows` (`[R]`, rows of `logits` `[B, V]`): the
/// log-softmax value (f32) of its token in `chosen` (`[R]`), then its `n`
/// largest values and their ids as f32: `[R, 1 + 2n]`. `None` off CUDA (the
/// caller runs the tensor ops).
pub fn logprob_rows(
    logits: &Tensor<2>,
    rows: &Tensor<1, Int>,
    chosen: &Tensor<1, Int>,
    n: usize,
) -> Option<Tensor<2>> {
    #[cfg(feature = "cuda")]
    if super::cuda::on_cube(logits) {
        let [r] = rows.dims();
        let out = Tensor::<2>::empty([r, 1 + 2 * n], (&logits.device(), DType::F32));
        return Some(super::cuda::vocab_logprobs(
            out,
            logits.clone(),
            rows.clone(),
            chosen.clone(),
            n,
        ));
    }
    let _ = (logits, rows, chosen, n);
    None
}
