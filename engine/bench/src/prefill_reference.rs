//! The prefill attention check's reference, computed on the host in f64:
//! causal attention of a step's flat queries over a paged K/V cache, one
//! plain loop per (row, head, query), straight from the definition.
//!
//! It replaces the tensor-op reference in `--check-kernels`' prefill cases:
//! that one gathered and multiplied on the device, and each new shape's
//! matmul autotune cost ~90 s on an H200 (2026-11-29), so the later cases
//! never ran inside a device call. This one takes milliseconds and shares
//! no code with the kernel or the tensor ops.

/// The cache and step the reference reads: `qkv` `[T, 3E]` row-major
/// (queries in columns `0..E`), the caches `k`, `v` `[H, S, D]` row-major,
/// blocks of `block` slots.
pub struct PagedStep<'a> {
    pub qkv: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub heads: usize,
    pub head_dim: usize,
    pub slots: usize,
    pub block: usize,
}

/// `[tokens, E]` attention outputs of `rows` (`(queries, start)`, their
/// tokens laid out one row after another from token 0) with block
/// `tables` (one per row): query `i` of a row sits at position `start + i`
/// and sees positions `0 ..= start + i`, position `p` at slot `table[p /
/// block] * block + p % block`. Tokens past the rows' (padding) stay 0.
pub fn prefill_attention(
    step: &PagedStep<'_>,
    rows: &[(usize, usize)],
    tables: &[Vec<u32>],
    tokens: usize,
) -> Vec<f32> {
    let (h, d) = (step.heads, step.head_dim);
    let e = h * d;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f32; tokens * e];
    let mut token = 0;
    for (&(queries, start), table) in rows.iter().zip(tables) {
        let slot = |p: usize| table[p / step.block] as usize * step.block + p % step.block;
        for i in 0..queries {
            let seen = start + i + 1;
            for head in 0..h {
                let q = &step.qkv[token * 3 * e + head * d..][..d];
                let at = |p: usize| (head * step.slots + slot(p)) * d;
                let scores: Vec<f64> = (0..seen)
                    .map(|p| {
                        let kr = &step.k[at(p)..][..d];
                        scale
                            * q.iter()
                                .zip(kr)
                                .map(|(&a, &b)| a as f64 * b as f64)
                                .sum::<f64>()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                let row = &mut out[token * e + head * d..][..d];
                for (p, w) in weights.iter().enumerate() {
                    let vr = &step.v[at(p)..][..d];
                    for (o, &x) in row.iter_mut().zip(vr) {
                        *o += (w / sum * x as f64) as f32;
                    }
                }
            }
            token += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One head of 2 dims over 4 slots in blocks of 2.
    fn one_head<'a>(qkv: &'a [f32], k: &'a [f32], v: &'a [f32]) -> PagedStep<'a> {
        PagedStep {
            qkv,
            k,
            v,
            heads: 1,
            head_dim: 2,
            slots: 4,
            block: 2,
        }
    }

    #[test]
    fn one_key_gives_its_value_and_equal_keys_average_the_values() {
        // A row of 2 queries from position 0 whose table maps block 0 to
        // slots 2..4.
        let qkv = [
            1.0, 0.0, 0., 0., 0., 0., /* token 1 */ 1.0, 0.0, 0., 0., 0., 0.,
        ];
        let k = [9.0, 9.0, 9.0, 9.0, 0.5, 0.0, 0.5, 0.0];
        let v = [7.0, 7.0, 7.0, 7.0, 2.0, 4.0, 6.0, 8.0];
        let out = prefill_attention(&one_head(&qkv, &k, &v), &[(2, 0)], &[vec![1]], 3);
        // Query 0 sees slot 2 alone; query 1 sees slots 2 and 3, equal
        // scores; the padding token stays 0.
        let want = [2.0, 4.0, 4.0, 6.0, 0.0, 0.0];
        assert!(
            out.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{out:?}"
        );
    }

    #[test]
    fn a_start_shifts_the_causal_window() {
        // A chunk of one query at position 1 sees positions 0 and 1.
        let qkv = [0.0; 6];
        let k = [0.0; 8];
        let v = [1.0, 0.0, 3.0, 0.0, 100.0, 100.0, 100.0, 100.0];
        let out = prefill_attention(&one_head(&qkv, &k, &v), &[(1, 1)], &[vec![0]], 1);
        assert_eq!(out, [2.0, 0.0]);
    }
}
