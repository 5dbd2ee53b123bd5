//! Reductions over each row of the vocabulary, choosing their device in one
//! place: the argmax ([`argmax_rows`]), the logprobs' log-softmax values
//! ([`logprob_rows`]) and a step's sparse logit edits ([`edit_rows`]). On a CUDA tensor they run Ember's kernels
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

/// On CUDA, `logits` `[B, V]` as f32 with the edits `idx` (flat `b * V +
/// t`, distinct), `add`, `rep` and `sub` (`[N]`, f32) applied: `x + add`,
/// then divided by `rep` if positive or multiplied if not, less `sub`
/// (`crate::sampling::transforms`, whose tensor ops are the reference).
/// `None` off CUDA (the caller runs the tensor ops).
pub fn edit_rows(
    logits: &Tensor<2>,
    idx: &Tensor<1, Int>,
    add: &Tensor<1>,
    rep: &Tensor<1>,
    sub: &Tensor<1>,
) -> Option<Tensor<2>> {
    #[cfg(feature = "cuda")]
    if super::cuda::on_cube(logits) {
        let out = Tensor::<2>::empty(logits.dims(), (&logits.device(), DType::F32));
        return Some(super::cuda::logit_edits(
            out,
            logits.clone(),
            idx.clone(),
            add.clone(),
            rep.clone(),
            sub.clone(),
        ));
    }
    let _ = (logits, idx, add, rep, sub);
    None
}
