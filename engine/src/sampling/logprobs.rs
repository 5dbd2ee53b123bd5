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
//! it runs on the device: gather the rows that asked, `log_softmax` over the
//! vocabulary, gather each row's sampled id, Burn's `topk_with_indices` for the
//! alternatives, then ONE device->host read of `[rows, 1 + 2n]` floats (the
//! sampled logprob, n values, n ids; ids below 2^24 are exact in f32).
//!
//! Where shapes are bucketed (CUDA) the rows that asked and `n` are padded
//! to powers of two (padding rows repeat the first, their results unread):
//! the device's reductions and top-k are tuned per shape, and a step with a
//! new count of rows asking, or a prompt-logprobs request of a new length,
//! then meets a shape already tuned instead of autotuning mid-traffic.

use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, FloatDType};

use crate::error::EngineError;
use crate::types::TokenLogprobs;

/// Logprobs of row `i`'s sampled token `sampled[i]` and its `top_n[i]` most
/// likely alternatives, for the rows whose `top_n[i]` is set; `None` for the
/// others. `logits` is `[B, V]` with `B >= sampled.len()` (rows past them are
/// padding and are never read). `bucketed`: pad the work's shapes (module
/// docs).
pub fn logprobs(
    logits: Tensor<2>,
    sampled: &[u32],
    top_n: &[Option<usize>],
    bucketed: bool,
) -> Result<Vec<Option<TokenLogprobs>>, EngineError> {
    let [b, vocab] = logits.dims();
    let rows: Vec<usize> = (0..sampled.len().min(top_n.len()).min(b))
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
    let (r, n) = match bucketed {
        true => (
            rows.len().next_power_of_two(),
            n.next_power_of_two().min(vocab),
        ),
        false => (rows.len(), n),
    };
    let mut padded = rows.clone();
    padded.resize(r, rows[0]);
    let device = logits.device();
    let ints = |values: Vec<i32>, shape: [usize; 2]| -> Tensor<2, Int> {
        Tensor::from_data(TensorData::new(values, shape), &device)
    };
    let row_ids = ints(padded.iter().map(|&i| i as i32).collect(), [r, 1]).reshape([r]);
    let chosen = ints(padded.iter().map(|&i| sampled[i] as i32).collect(), [r, 1]);

    let log_probs = log_softmax(logits.select(0, row_ids).cast(DType::F32), 1); // [R, V]
    let mut parts = vec![log_probs.clone().gather(1, chosen)]; // [R, 1]
    if n > 0 {
        let (values, ids) = log_probs.topk_with_indices(n, 1); // [R, n] each
        parts.push(values);
        parts.push(ids.cast(FloatDType::F32));
    }
    let width = 1 + 2 * n;
    let host: Vec<f32> = Tensor::cat(parts, 1)
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
        let got = logprobs(l, &[2, 0, 1], &[Some(2), None, Some(0)], false).unwrap();
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
        assert_eq!(logprobs(l, &[1], &[None], true).unwrap(), vec![None]);
    }

    #[test]
    fn top_n_larger_than_the_vocabulary_is_cut_to_it() {
        let l = logits(&[&[0.0, 1.0]]);
        let got = logprobs(l, &[1], &[Some(20)], false).unwrap();
        let top = &got[0].as_ref().unwrap().top;
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 0]);
        let mass: f32 = top.iter().map(|t| t.1.exp()).sum();
        assert!((mass - 1.0).abs() < 1e-5);
    }

    #[test]
    fn bucketed_shapes_give_the_same_results() {
        // Three rows asking (padded to four), top-3 (padded to four).
        let rows: Vec<Vec<f32>> = (0..5)
            .map(|r| {
                (0..7)
                    .map(|t| ((r * 7 + t * 3) % 11) as f32 * 0.3)
                    .collect()
            })
            .collect();
        let slices: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let asks = [Some(3), None, Some(1), Some(3), None];
        let sampled = [4, 0, 2, 6, 1];
        let plain = logprobs(logits(&slices), &sampled, &asks, false).unwrap();
        let padded = logprobs(logits(&slices), &sampled, &asks, true).unwrap();
        assert_eq!(plain, padded);
        assert_eq!(padded[2].as_ref().unwrap().top.len(), 1, "as many as asked");
    }
}
