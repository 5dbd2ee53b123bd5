//! Per-row token choice on the device, ending in ONE device->host read of the
//! `[B]` chosen ids (never the logits).
//!
//! - A batch whose every row takes the argmax of the raw logits
//!   ([`SamplingTable::takes_graph_argmax`]) takes the fast path: `argmax`
//!   (or the one a replayed decode graph already computed).
//! - Otherwise (in f32): `probs = softmax(logits / temperature)`; top-k and
//!   top-p keep `{i : probs_i >= tau}` where `tau` is the largest threshold that
//!   still keeps at least `k` tokens and at least `top_p` of the mass; min-p
//!   then drops tokens less likely than `min_p` times the row's most likely
//!   one (transformers' `MinPLogitsWarper`). `tau` is
//!   found per row by bisection (a fixed number of vectorized compare+sum
//!   passes), because Burn's sort falls back to a host round trip on CubeCL.
//!   Then inverse-CDF sampling: `cumsum` of the kept probabilities in vocab
//!   order, and the first index whose cumsum reaches `u * total`, where `u` is
//!   the row's uniform draw from its sequence's seeded host RNG. Greedy rows in
//!   a mixed batch get the argmax.
//! - A step's rows arrive as a [`SamplingTable`]; the per-row parameters are
//!   written into [`SamplingParamsRows`], device buffers a decode bucket
//!   rewrites in place each step.

use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::DType;

use super::table::SamplingTable;
use super::transforms;
use crate::error::EngineError;
use crate::ops::InputBuffer;

/// Bisection passes for the top-k/top-p threshold (f32 resolution).
const THRESHOLD_ITERS: usize = 24;

/// Per-row sampling parameters as `[B, 1]` device tensors (f32), written from
/// a step's [`SamplingTable`]. Decode keeps one per bucket and rewrites it in
/// place each step; prefill builds a fresh one.
#[derive(Debug)]
pub struct SamplingParamsRows {
    temperatures: InputBuffer<2, Float>,
    /// Tokens the threshold must keep (V = no top-k).
    top_ks: InputBuffer<2, Float>,
    /// Mass the kept tokens must reach (0 = no top-p).
    top_ps: InputBuffer<2, Float>,
    /// Least probability relative to the row's most likely token (0 = no
    /// min-p).
    min_ps: InputBuffer<2, Float>,
    uniforms: InputBuffer<2, Float>,
    /// 1 for rows that take the argmax, 0 for sampled rows.
    greedy: InputBuffer<2, Int>,
    /// Host-side summary of the last write: every row takes the argmax of the
    /// raw logits (the fast path).
    argmax_only: bool,
    /// Some row filters by top-k or top-p (the threshold search runs).
    filtering: bool,
    /// Some row filters by min-p.
    min_p: bool,
    /// Some row samples (else every row takes an argmax).
    any_sampled: bool,
    /// The last write's logit transforms, uploaded with it (before the
    /// forward: [`transforms`]); `None` when no row changes its logits.
    transforms: Option<transforms::Prepared>,
    /// The vocabulary's bitmask positions, made on the first step with an
    /// allowed set.
    token_bits: Option<transforms::TokenBits>,
    rows: usize,
    vocab: usize,
    device: Device,
}

impl SamplingParamsRows {
    /// Buffers for `rows` rows over a vocabulary of `vocab` tokens, all greedy.
    pub fn new(rows: usize, vocab: usize, device: &Device) -> Self {
        let f = || InputBuffer::zeros_dtype([rows, 1], device, DType::F32);
        Self {
            temperatures: f(),
            top_ks: f(),
            top_ps: f(),
            min_ps: f(),
            uniforms: f(),
            greedy: InputBuffer::zeros([rows, 1], device),
            argmax_only: true,
            filtering: false,
            min_p: false,
            any_sampled: false,
            transforms: None,
            token_bits: None,
            rows,
            vocab,
            device: device.clone(),
        }
    }

    /// Writes `table`'s rows (rows past them are greedy padding), and uploads
    /// the logit transforms of rows that change their logits. When every row
    /// takes the argmax nothing is uploaded: that path reads no parameters.
    pub fn write(&mut self, table: &SamplingTable) {
        debug_assert!(table.len() <= self.rows);
        self.argmax_only = table.all_take_graph_argmax();
        self.transforms = table.any_changes_logits().then(|| {
            let (v, device) = (self.vocab, &self.device);
            let bits = self
                .token_bits
                .get_or_insert_with(|| transforms::TokenBits::new(v, device));
            transforms::Prepared::new(table, self.rows, v, bits, device)
        });
        self.any_sampled = (0..table.len()).any(|i| !table.is_greedy(i));
        if self.argmax_only || !self.any_sampled {
            self.filtering = false;
            self.min_p = false;
            return;
        }
        let (n, v) = (self.rows, self.vocab);
        let mut temps = vec![1.0f32; n];
        let mut ks = vec![v as f32; n];
        let mut ps = vec![0.0f32; n];
        let mut min_ps = vec![0.0f32; n];
        let mut us = vec![0.5f32; n];
        let mut greedy = vec![1i32; n];
        let mut filtering = false;
        for i in 0..table.len() {
            if table.is_greedy(i) {
                continue;
            }
            let s = &table.sampling[i];
            let top_k = s.top_k_limit().filter(|&k| k < v);
            let p = if s.top_p >= 1.0 {
                0.0
            } else {
                s.top_p.max(0.0)
            };
            // The threshold keeps >= k tokens: with top-k off, k = 1 lets
            // top-p alone decide, and k = V (with p = 0) keeps every token.
            let k = match (top_k, p > 0.0) {
                (Some(k), _) => k,
                (None, true) => 1,
                (None, false) => v,
            };
            filtering |= k < v;
            temps[i] = s.temperature.max(1e-6);
            ks[i] = k as f32;
            ps[i] = p;
            min_ps[i] = s.min_p;
            us[i] = table.uniform[i].clamp(f32::MIN_POSITIVE, 1.0);
            greedy[i] = 0;
        }
        self.temperatures.write(temps);
        self.top_ks.write(ks);
        self.top_ps.write(ps);
        self.min_p = min_ps.iter().any(|&m| m > 0.0);
        self.min_ps.write(min_ps);
        self.uniforms.write(us);
        self.greedy.write(greedy);
        self.filtering = filtering;
    }
}

/// Picks one token per row of `logits` (`[B, vocab]`, B = the parameters'
/// rows, last written from `table`) and reads back the table's rows' ids:
/// the step's one device->host read. `argmax` (`[B, 1]`), where the step
/// already computed it (a replayed decode graph does), stands in for the
/// argmax of the raw logits. Rows whose logits change first
/// ([`SamplingTable::changes_logits`]) are chosen from the changed logits
/// ([`super::transforms`]).
pub fn sample(
    logits: Tensor<2>,
    argmax: Option<Tensor<2, Int>>,
    params: &SamplingParamsRows,
    table: &SamplingTable,
) -> Result<Vec<u32>, EngineError> {
    let [b, _] = logits.dims();
    debug_assert_eq!(b, params.rows);
    let ids = if params.argmax_only {
        argmax.unwrap_or_else(|| logits.argmax(1))
    } else {
        let (logits, argmax) = if let Some(prepared) = &params.transforms {
            let changed = transforms::apply(logits.cast(DType::F32), prepared);
            (changed.clone(), changed.argmax(1))
        } else {
            let argmax = argmax.unwrap_or_else(|| logits.clone().argmax(1));
            (logits.cast(DType::F32), argmax)
        };
        if params.any_sampled {
            draw(logits, argmax, params)
        } else {
            argmax
        }
    };
    // The whole `[B, 1]` buffer as it is (no reshape or slice queued before
    // the read: a greedy step's ids come straight from the graph's output);
    // the padding rows are dropped on the host.
    let data = ids
        .try_into_data()
        .map_err(|e| EngineError::Device(format!("{e:?}")))?;
    Ok(data
        .iter::<i64>()
        .take(table.len().min(b))
        .map(|x| x.clamp(0, u32::MAX as i64) as u32)
        .collect())
}

/// The sampling path (temperature, top-k/top-p, inverse CDF); `logits` is
/// f32 `[B, V]`, `argmax` `[B, 1]` (the greedy rows' pick); returns ids
/// `[B, 1]`.
fn draw(logits: Tensor<2>, argmax: Tensor<2, Int>, params: &SamplingParamsRows) -> Tensor<2, Int> {
    let [b, v] = logits.dims();
    let shape = [b, v];
    let mut probs = softmax(logits.clone() / params.temperatures.tensor(), 1);

    if params.filtering {
        let k = params.top_ks.tensor();
        let p = params.top_ps.tensor();
        // Invariant: `lo` satisfies both constraints; the answer lies in [lo, hi].
        let mut lo = Tensor::<2>::zeros([b, 1], (&logits.device(), DType::F32));
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
    if params.min_p {
        // min-p keeps tokens at least min_p times as likely as the row's most
        // likely one (always kept by the filters above), after temperature.
        let floor = probs.clone().max_dim(1) * params.min_ps.tensor();
        probs = probs
            .clone()
            .mask_fill(probs.lower(floor.expand(shape)), 0.0);
    }

    let cum = probs.cumsum(1);
    let total = cum.clone().slice([0..b, v - 1..v]);
    let threshold = params.uniforms.tensor() * total;
    let picked = cum
        .lower(threshold.expand(shape))
        .int()
        .sum_dim(1)
        .clamp_max(v as i64 - 1); // [B, 1]

    let greedy = params.greedy.tensor().equal_elem(1);
    picked.mask_where(greedy, argmax)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::params::SamplingParams;
    use crate::sampling::table::RowSampling;
    use crate::sampling::test_logits::logits;

    fn s(temperature: f32, top_k: i32, top_p: f32, uniform: f32) -> RowSampling {
        let params = SamplingParams {
            temperature,
            top_k,
            top_p,
            ..SamplingParams::greedy()
        };
        RowSampling::plain(params, uniform, None)
    }

    const G: fn() -> RowSampling = RowSampling::greedy;

    fn table(rows: &[RowSampling]) -> SamplingTable {
        let mut t = SamplingTable::with_capacity(rows.len());
        rows.iter().for_each(|r| t.push(r.clone()));
        t
    }

    fn pick(l: Tensor<2>, rows: &[RowSampling]) -> Vec<u32> {
        let [b, v] = l.dims();
        let mut params = SamplingParamsRows::new(b, v, &Device::flex());
        let t = table(rows);
        params.write(&t);
        sample(l, None, &params, &t).unwrap()
    }

    #[test]
    fn greedy_is_argmax() {
        let l = logits(&[&[0.1, 3.0, 0.2], &[5.0, 1.0, 0.0]]);
        assert_eq!(pick(l, &[G(), G()]), [1, 0]);
    }

    #[test]
    fn a_precomputed_argmax_serves_the_greedy_rows_and_padding_is_dropped() {
        // The ids a replayed graph computed are what greedy rows get (here
        // deliberately not the logits' argmax, to tell them apart), in a
        // mixed batch too; rows past `take` (padding) are not returned.
        let l = logits(&[&[0.1, 3.0, 0.2], &[5.0, 1.0, 0.0], &[0.0, 0.0, 9.0]]);
        let given = || {
            Tensor::<2, Int>::from_data(TensorData::new(vec![2i64, 1, 0], [3, 1]), &Device::flex())
        };
        let mut params = SamplingParamsRows::new(3, 3, &Device::flex());
        let greedy = table(&[G(), G()]);
        params.write(&greedy);
        assert_eq!(
            sample(l.clone(), Some(given()), &params, &greedy).unwrap(),
            [2, 1]
        );
        // Row 1 samples with all its mass on token 0; row 0 stays greedy.
        let hot = logits(&[&[0.1, 3.0, 0.2], &[50.0, 0.0, 0.0], &[0.0, 0.0, 9.0]]);
        let mixed = table(&[G(), s(1.0, 0, 1.0, 0.5)]);
        params.write(&mixed);
        assert_eq!(sample(hot, Some(given()), &params, &mixed).unwrap(), [2, 0]);
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
            G(),
        ];
        assert_eq!(pick(l, &rows), [0, 1, 2, 2]);
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
        assert_eq!(pick(l, &rows), [1, 2, 1, 1]);
    }

    #[test]
    fn a_greedy_row_with_edits_ignores_the_graphs_argmax_and_others_keep_it() {
        let l = logits(&[&[0.1, 3.0, 0.2], &[5.0, 1.0, 0.0]]);
        let given =
            Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 0], [2, 1]), &Device::flex());
        // Row 0: token 1 banned -> token 2; row 1 takes the given argmax.
        let banned = RowSampling {
            banned: vec![1],
            ..G()
        };
        let t = table(&[banned, G()]);
        let mut params = SamplingParamsRows::new(2, 3, &Device::flex());
        params.write(&t);
        assert_eq!(sample(l, Some(given), &params, &t).unwrap(), [2, 0]);
    }

    #[test]
    fn padding_rows_are_greedy_and_not_read_back() {
        let row: &[f32] = &[0.1f32.ln(), 0.6f32.ln(), 0.3f32.ln()];
        let pad: &[f32] = &[9.0, 0.0, 0.0];
        let l = logits(&[row, pad, pad]);
        assert_eq!(pick(l, &[s(1.0, 0, 1.0, 0.05)]), [0]);
    }
}
