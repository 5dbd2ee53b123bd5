//! Per-row token choice on the device, ending in ONE device->host read of the
//! `[B]` chosen ids (never the logits).
//!
//! - A batch of only greedy rows takes the fast path: `argmax`.
//! - Otherwise (in f32): `probs = softmax(logits / temperature)`; top-k and
//!   top-p keep `{i : probs_i >= tau}` where `tau` is the largest threshold that
//!   still keeps at least `k` tokens and at least `top_p` of the mass. `tau` is
//!   found per row by bisection (a fixed number of vectorized compare+sum
//!   passes), because Burn's sort falls back to a host round trip on CubeCL.
//!   Then inverse-CDF sampling: `cumsum` of the kept probabilities in vocab
//!   order, and the first index whose cumsum reaches `u * total`, where `u` is
//!   the row's uniform draw from its sequence's seeded host RNG (uploaded as
//!   `[B, 1]`). Greedy rows in a mixed batch get the argmax.

use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, TensorData};

use super::EngineError;

/// Bisection passes for the top-k/top-p threshold (f32 resolution).
const THRESHOLD_ITERS: usize = 24;

/// How one row picks its token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowChoice {
    Greedy,
    Sample {
        temperature: f32,
        /// 0 = off.
        top_k: usize,
        /// >= 1.0 = off.
        top_p: f32,
        /// Uniform draw in (0, 1) for this row and step.
        uniform: f32,
    },
}

fn floats<B: Backend>(values: Vec<f32>, device: &B::Device) -> Tensor<B, 2> {
    let n = values.len();
    Tensor::<B, 2>::from_data(TensorData::new(values, [n, 1]), (device, DType::F32))
}

/// Picks one token per row of `logits` (`[B, vocab]`); `rows.len() == B`.
pub fn sample<B: Backend>(
    logits: Tensor<B, 2>,
    rows: &[RowChoice],
) -> Result<Vec<u32>, EngineError> {
    let [b, v] = logits.dims();
    let device = logits.device();
    let ids = if rows.iter().all(|r| matches!(r, RowChoice::Greedy)) {
        logits.argmax(1)
    } else {
        sample_rows(logits.cast(DType::F32), rows, b, v, &device)
    };
    let data = ids
        .reshape([b])
        .try_into_data()
        .map_err(|e| EngineError::Device(format!("{e:?}")))?;
    Ok(data
        .iter::<i64>()
        .map(|x| x.clamp(0, u32::MAX as i64) as u32)
        .collect())
}

/// The sampling path; `logits` is f32 `[B, V]`; returns ids `[B, 1]`.
fn sample_rows<B: Backend>(
    logits: Tensor<B, 2>,
    rows: &[RowChoice],
    b: usize,
    v: usize,
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let mut temps = Vec::with_capacity(b);
    let mut ks = Vec::with_capacity(b);
    let mut ps = Vec::with_capacity(b);
    let mut us = Vec::with_capacity(b);
    let mut greedy = Vec::with_capacity(b);
    let mut filtering = false;
    for row in rows {
        match *row {
            RowChoice::Greedy => {
                temps.push(1.0);
                ks.push(v as f32);
                ps.push(0.0);
                us.push(0.5);
                greedy.push(true);
            }
            RowChoice::Sample {
                temperature,
                top_k,
                top_p,
                uniform,
            } => {
                let top_k_on = top_k > 0 && top_k < v;
                let p = if top_p >= 1.0 { 0.0 } else { top_p.max(0.0) };
                // The threshold keeps >= k tokens: with top-k off, k = 1 lets
                // top-p alone decide, and k = V (with p = 0) keeps every token.
                let k = match (top_k_on, p > 0.0) {
                    (true, _) => top_k,
                    (false, true) => 1,
                    (false, false) => v,
                };
                filtering |= k < v;
                temps.push(temperature.max(1e-6));
                ks.push(k as f32);
                ps.push(p);
                us.push(uniform.clamp(f32::MIN_POSITIVE, 1.0));
                greedy.push(false);
            }
        }
    }
    let shape = [b, v];
    let mut probs = softmax(logits.clone() / floats::<B>(temps, device), 1);

    if filtering {
        let k = floats::<B>(ks, device);
        let p = floats::<B>(ps, device);
        // Invariant: `lo` satisfies both constraints; the answer lies in [lo, hi].
        let mut lo = Tensor::<B, 2>::zeros([b, 1], (device, DType::F32));
        let mut hi = probs.clone().max_dim(1);
        for _ in 0..THRESHOLD_ITERS {
            let mid = (lo.clone() + hi.clone()) * 0.5;
            let keep = probs.clone().greater_equal(mid.clone().expand(shape));
            let count = keep.clone().float().cast(DType::F32).sum_dim(1);
            let mass = probs.clone().mask_fill(keep.bool_not(), 0.0).sum_dim(1);
            let ok = count
                .greater_equal(k.clone())
                .bool_and(mass.greater_equal(p.clone()));
            lo = lo.mask_where(ok.clone(), mid.clone());
            hi = hi.mask_where(ok.bool_not(), mid);
        }
        probs = probs.clone().mask_fill(probs.lower(lo.expand(shape)), 0.0);
    }

    let cum = probs.cumsum(1);
    let total = cum.clone().slice([0..b, v - 1..v]);
    let threshold = floats::<B>(us, device) * total;
    let picked = cum
        .lower(threshold.expand(shape))
        .int()
        .sum_dim(1)
        .clamp_max(v as i64 - 1); // [B, 1]

    if greedy.iter().any(|&g| g) {
        let mask = Tensor::<B, 2, Bool>::from_data(TensorData::new(greedy, [b, 1]), device);
        picked.mask_where(mask, logits.argmax(1))
    } else {
        picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestBackend = burn::backend::NdArray<f32>;

    fn logits(rows: &[&[f32]]) -> Tensor<TestBackend, 2> {
        let v = rows[0].len();
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_data(TensorData::new(flat, [rows.len(), v]), &Default::default())
    }

    fn s(temperature: f32, top_k: usize, top_p: f32, uniform: f32) -> RowChoice {
        RowChoice::Sample {
            temperature,
            top_k,
            top_p,
            uniform,
        }
    }

    #[test]
    fn greedy_is_argmax() {
        let l = logits(&[&[0.1, 3.0, 0.2], &[5.0, 1.0, 0.0]]);
        assert_eq!(sample(l, &[RowChoice::Greedy; 2]).unwrap(), [1, 0]);
    }

    #[test]
    fn inverse_cdf_follows_the_uniform() {
        // probs = [0.25, 0.25, 0.5] (log-probs), cumsum [0.25, 0.5, 1.0].
        let row: &[f32] = &[0.25f32.ln(), 0.25f32.ln(), 0.5f32.ln()];
        let l = logits(&[row, row, row, row]);
        let rows = [
            s(1.0, 0, 1.0, 0.1),
            s(1.0, 0, 1.0, 0.4),
            s(1.0, 0, 1.0, 0.9),
            RowChoice::Greedy,
        ];
        assert_eq!(sample(l, &rows).unwrap(), [0, 1, 2, 2]);
    }

    #[test]
    fn top_k_and_top_p_drop_the_tail() {
        // probs = [0.1, 0.6, 0.3]
        let row: &[f32] = &[0.1f32.ln(), 0.6f32.ln(), 0.3f32.ln()];
        let l = logits(&[row, row, row, row]);
        let rows = [
            s(1.0, 1, 1.0, 0.99), // top-1 -> token 1
            s(1.0, 2, 1.0, 0.99), // {1, 2}: cum [0, .6, .9] of .9 -> u .99 -> token 2
            s(1.0, 2, 1.0, 0.01), // first kept token in vocab order -> 1
            s(1.0, 0, 0.5, 0.99), // nucleus 0.5 -> {1}
        ];
        assert_eq!(sample(l, &rows).unwrap(), [1, 2, 1, 1]);
    }
}
