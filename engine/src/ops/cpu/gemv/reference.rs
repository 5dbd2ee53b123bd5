//! What the kernels' tests check against (tests only): the plain scalar
//! loop of a projection with its epilogue, in f64, and the random operands
//! the tests draw.

use rand::rngs::StdRng;
use rand::Rng;

use super::epilogue::{gelu_tanh, RowEpilogue};
use super::lanes::WeightElem;

/// `len` values near a normal distribution (a sum of uniforms), some of
/// them large.
pub fn normal(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| (0..4).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * 1.7)
        .collect()
}

/// `sum_t x[i, t] w[j, t]` in f64 (weights widened exactly), then the
/// epilogue in the kernels' order: `x` `[m, k]`, `w` `[n, k]`; returns
/// `[m, n]`.
pub fn project<W: WeightElem>(
    x: &[f32],
    w: &[W],
    (m, k, n): (usize, usize, usize),
    e: &RowEpilogue<'_>,
) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s: f64 = (0..k)
                .map(|t| f64::from(x[i * k + t]) * f64::from(w[j * k + t].to_f32()))
                .sum();
            if let Some(b) = e.bias {
                s += f64::from(b[j]);
            }
            if e.gelu {
                s = f64::from(gelu_tanh(s as f32));
            }
            if let Some(r) = e.residual {
                s += f64::from(r[i * n + j]);
            }
            out[i * n + j] = s;
        }
    }
    out
}
