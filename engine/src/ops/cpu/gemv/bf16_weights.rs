//! Projections with bf16 weights (`--cpu-weights bf16`): what is computed,
//! and which kernel computes it.
//!
//! **What.** Both operands in bf16: `x` is rounded to bf16 (to nearest
//! even) once per call, then `y = sum_t x[t] w[t]` with every product exact
//! in f32 (two 8-bit significands) and the sums in f32; the epilogue in f32.
//! That is what AVX512_BF16's `vdpbf16ps` computes, and the fallback
//! computes the same on every other CPU, so a model gives the same numbers
//! (up to the order of the f32 sums) whatever the CPU. Rounding `x` as well
//! as the weights adds a second error of the same size as the weights'
//! (about 2^-9 relative per element, independent of it); the logit error and
//! greedy agreement this gives are measured in docs/performance.md.
//!
//! **Which.** On [`CpuIsa::Avx512Bf16`] the native kernel
//! ([`super::dot_bf16`]) reads `x` as bf16; everywhere else the f32-lane
//! kernels ([`super::lane_project`]) widen each weight to f32 and read `x`
//! as f32 values already rounded to bf16, so their products are the same.

use half::bf16;

use super::epilogue::RowEpilogue;
use super::lane_project;
#[cfg(target_arch = "x86_64")]
use super::split::for_each_block;
use crate::ops::cpu::isa::CpuIsa;

/// `x W^T + b` with the epilogue, `x` and `w` rounded to bf16 (see the
/// module docs): `x` `[m, k]`, `w` `[n, k]` (out-major), `bias` `[n]`,
/// `residual` `[m, n]`; returns `[m, n]` row-major.
///
/// # Panics
/// If a slice is shorter than its shape says (the caller checked the shapes).
pub fn project(
    isa: CpuIsa,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[bf16],
    n: usize,
    epilogue: &RowEpilogue<'_>,
) -> Vec<f32> {
    epilogue.check(m, n);
    let x = &x[..m * k];
    #[cfg(target_arch = "x86_64")]
    if isa.native_bf16() {
        let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        // SAFETY: each block writes only its own columns; AVX512_BF16 (and
        // AVX-512F/BW) were detected on this CPU (`isa`).
        return unsafe {
            for_each_block(&xb, m, k, w, n, |block, out| {
                super::dot_bf16::run(block, out, epilogue)
            })
        };
    }
    let rounded: Vec<f32> = x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
    lane_project::project(isa, &rounded, m, k, w, n, epilogue)
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::ops::cpu::gemv::reference::{self, normal};

    /// `sum_t bf16(x) bf16(w)` in f64, with the epilogue.
    fn exact(x: &[f32], w: &[bf16], m: usize, k: usize, n: usize, e: &RowEpilogue<'_>) -> Vec<f64> {
        let rounded: Vec<f32> = x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        reference::project(&rounded, w, (m, k, n), e)
    }

    /// Every ISA this CPU has (the native kernel where there is
    /// AVX512_BF16, then each fallback, forced), row counts across the
    /// streaming and tiled shapes, output counts across whole and partial
    /// groups and tiles, `k` with and without a masked tail, with and
    /// without the epilogue: each against the exact sum of the same bf16
    /// products, and each against the portable path.
    #[test]
    fn every_isa_computes_the_bf16_products_and_agrees_with_the_portable_path() {
        let mut rng = StdRng::seed_from_u64(32);
        for (m, k, n) in [
            (1, 64, 16),
            (1, 768, 37),
            (1, 33, 5),
            (2, 96, 19),
            (3, 70, 9),
            (4, 128, 17),
            (5, 31, 7),
            (16, 200, 33),
            (16, 768, 68),
            (7, 1, 5),
        ] {
            let x = normal(&mut rng, m * k);
            let w: Vec<bf16> = normal(&mut rng, n * k)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let (bias, residual) = (normal(&mut rng, n), normal(&mut rng, m * n));
            for epilogue in [
                RowEpilogue::default(),
                RowEpilogue {
                    bias: Some(&bias),
                    gelu: true,
                    residual: Some(&residual),
                },
            ] {
                let want = exact(&x, &w, m, k, n, &epilogue);
                let portable = project(CpuIsa::Portable, &x, m, k, &w, n, &epilogue);
                for isa in CpuIsa::available() {
                    let got = project(isa, &x, m, k, &w, n, &epilogue);
                    for (idx, (&g, &e)) in got.iter().zip(&want).enumerate() {
                        // f32 sums of k products of size ~3: ~k * 2^-24 * 3 each.
                        let tol = 1e-5 * (1.0 + e.abs()) + 1e-6 * k as f64;
                        assert!(
                            (f64::from(g) - e).abs() < tol,
                            "{isa} m {m} k {k} n {n} at {idx}: {g} vs exact {e}"
                        );
                        let p = f64::from(portable[idx]);
                        assert!(
                            (f64::from(g) - p).abs() < 2.0 * tol,
                            "{isa} m {m} k {k} n {n} at {idx}: {g} vs portable {p}"
                        );
                    }
                }
            }
        }
    }
}
