//! Log-probabilities of the sampled tokens and their most likely alternatives.
//!
//! Kept out of [`super::sampler::sample`] on purpose: sampling is part of the
//! decode step that is replayed as a CUDA graph (fixed work per batch shape),
//! while logprobs are optional per request. The runner calls [`logprobs`]
//! after sampling, only for a step where at least one row asked, with the
//! logits tensor sampling read; a step where no row asked does no extra work.
//!
//! The distribution is the model's own: `log_softmax` of the raw logits in
//! f32, at temperature 1 and before top-k/top-p (vLLM's default convention), so
//! a sampled token's logprob does not depend on the sampling parameters. All of
//! it runs on the device, then ONE device->host read of `[rows, 1 + 2n]`
//! floats (the sampled logprob, n values, n ids; ids below 2^24 are exact in
//! f32). On CUDA one kernel computes the table
//! (`crate::ops::vocab::logprob_rows`: one plan for every row count and `n`,
//! so a new shape tunes and compiles nothing while serving); elsewhere the
//! tensor ops do: gather the rows that asked, `log_softmax` over the
//! vocabulary, gather each row's sampled id, `topk_with_indices`.

use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, FloatDType};

use crate::error::EngineError;
use crate::ops::vocab::logprob_rows;
use crate::types::TokenLogprobs;

/// Logprobs of row `i`'s sampled token `sampled[i]` and its `top_n[i]` most
/// likely alternatives, for the rows whose `top_n[i]` is set; `None` for the
/// others. `logits` is `[B, V]` with `B >= sampled.len()` (rows past them are
/// padding and are never read).
pub fn logprobs(
    logits: Tensor<2>,
    sampled: &[u32],
    top_n: &[Option<usize>],
) -> Result<Vec<Option<TokenLogprobs>>, EngineError> {
    logprobs_from(logits, 0, sampled, top_n)
}

/// [`logprobs`] of the rows from `first` on: entry `i` is row `first + i`
/// of `logits` (a prefill step's scored positions follow its sampled rows).
pub fn logprobs_from(
    logits: Tensor<2>,
    first: usize,
    sampled: &[u32],
    top_n: &[Option<usize>],
) -> Result<Vec<Option<TokenLogprobs>>, EngineError> {
    let [b, vocab] = logits.dims();
    let rows: Vec<usize> = (0..sampled.len().min(top_n.len()).min(b.saturating_sub(first)))
        .filter(|&i| top_n[i].is_some())
        .collect();
    let mut out = vec![None; sampled.len()];
    if rows.is_empty() {
        return Ok(out);
    }
    let n = rows
        .iter()
        .filter_map(|&i| top_n[i])
        .max()
        .unwrap_or(0)
        .min(vocab);
    let r = rows.len();
    let device = logits.device();
    let ints = |values: Vec<i32>| -> Tensor<1, Int> {
        Tensor::from_data(TensorData::new(values, [r]), &device)
    };
    let row_ids = ints(rows.iter().map(|&i| (first + i) as i32).collect());
    let chosen = ints(rows.iter().map(|&i| sampled[i] as i32).collect());
    let table = match logprob_rows(&logits, &row_ids, &chosen, n) {
        Some(table) => table,
        None => tensor_ops(logits, row_ids, chosen, n),
    };
    let width = 1 + 2 * n;
    let host: Vec<f32> = table
        .try_into_data()
        .map_err(|e| EngineError::Device(format!("{e:?}")))?
        .iter::<f32>()
        .collect();
    for (&row, values) in rows.iter().zip(host.chunks_exact(width)) {
        let asked = top_n[row].unwrap_or(0).min(n);
        let top = (0..asked)
            .map(|j| (values[1 + n + j] as u32, values[1 + j]))
            .collect();
        out[row] = Some(TokenLogprobs {
            logprob: values[0],
            top,
        });
    }
    Ok(out)
}

/// The `[R, 1 + 2n]` table [`logprobs`] reads, from tensor ops: rows
/// `row_ids` of `logits`, their `chosen` token's log-softmax value, their
/// top `n` values and ids.
fn tensor_ops(
    logits: Tensor<2>,
    row_ids: Tensor<1, Int>,
    chosen: Tensor<1, Int>,
    n: usize,
) -> Tensor<2> {
    let [r] = row_ids.dims();
    let log_probs = log_softmax(logits.select(0, row_ids).cast(DType::F32), 1); // [R, V]
    let mut parts = vec![log_probs.clone().gather(1, chosen.reshape([r, 1]))]; // [R, 1]
    if n > 0 {
        let (values, ids) = log_probs.topk_with_indices(n, 1); // [R, n] each
        parts.push(values);
        parts.push(ids.cast(FloatDType::F32));
    }
    Tensor::cat(parts, 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::test_logits::logits;

    #[test]
    fn rows_that_asked_get_their_logprob_and_sorted_alternatives() {
        // Row 0: probs [0.1, 0.6, 0.3] (as log-probs shifted by 5, which
        // log_softmax removes); row 1 asked nothing; row 2 asks top-0; row 3
        // is padding.
        let row0: Vec<f32> = [0.1f32, 0.6, 0.3].iter().map(|p| p.ln() + 5.0).collect();
        let l = logits(&[&row0, &[1.0, 2.0, 3.0], &[0.0, 0.0, 0.0], &[9.0, 9.0, 9.0]]);
        let got = logprobs(l, &[2, 0, 1], &[Some(2), None, Some(0)]).unwrap();
        assert_eq!(got.len(), 3);
        let r0 = got[0].as_ref().unwrap();
        assert!((r0.logprob - 0.3f32.ln()).abs() < 1e-5, "{r0:?}");
        assert_eq!(r0.top.len(), 2);
        assert_eq!((r0.top[0].0, r0.top[1].0), (1, 2));
        assert!((r0.top[0].1 - 0.6f32.ln()).abs() < 1e-5);
        assert!((r0.top[1].1 - 0.3f32.ln()).abs() < 1e-5);
        assert_eq!(got[1], None);
        let r2 = got[2].as_ref().unwrap();
        assert!((r2.logprob - (1.0f32 / 3.0).ln()).abs() < 1e-5);
        assert!(r2.top.is_empty());
    }

    #[test]
    fn nobody_asked_means_nothing_computed() {
        let l = logits(&[&[1.0, 2.0]]);
        assert_eq!(logprobs(l, &[1], &[None]).unwrap(), vec![None]);
    }

    #[test]
    fn top_n_larger_than_the_vocabulary_is_cut_to_it() {
        let l = logits(&[&[0.0, 1.0]]);
        let got = logprobs(l, &[1], &[Some(20)]).unwrap();
        let top = &got[0].as_ref().unwrap().top;
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 0]);
        let mass: f32 = top.iter().map(|t| t.1.exp()).sum();
        assert!((mass - 1.0).abs() < 1e-5);
    }
}
