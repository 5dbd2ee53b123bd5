//! The f32-lane projection, its kernel chosen by row count: below
//! [`PANEL_MIN_ROWS`] rows of `x` the kernels of [`tile`] (streaming up to
//! 4 rows, then 2x4 tiles), from there the panel kernel of [`panel`], which
//! packs `x` once per call and is bound by arithmetic rather than loads.
//! Both run on the blocks of [`super::split`]. f32 weights, and bf16 weights
//! widened to f32 (on CPUs without AVX512_BF16), come here.
//!
//! The crossover, measured on the 2-core Zen 3 dev machine (AVX2, GPT-2
//! 124M's projections and LM head, 2026-11-29): at 16 rows the panel kernel
//! took 26-30 ms a step against 37-40 for the tiled kernel (f32), at 9 rows
//! about the same as the tiled kernel, and below that more (its 16-lane
//! panels do the same work at 5 rows as at 16).

use super::epilogue::RowEpilogue;
use super::lanes::WeightElem;
use super::panel::{self, Panels};
use super::split::for_each_block;
use super::tile;
use crate::ops::cpu::isa::CpuIsa;

/// Fewest rows of `x` that take the panel kernel.
pub const PANEL_MIN_ROWS: usize = 9;

/// `x W^T + b` with the epilogue on the f32-lane kernels: `x` `[m, k]`,
/// `w` `[n, k]` (out-major, f32 or bf16 widened exactly), `bias` `[n]`,
/// `residual` `[m, n]`; returns `[m, n]` row-major. (bf16 weights go
/// through [`super::bf16_weights::project`], which rounds `x` first.)
///
/// # Panics
/// If a slice is shorter than its shape says (the caller checked the shapes).
pub fn project<W: WeightElem>(
    isa: CpuIsa,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[W],
    n: usize,
    epilogue: &RowEpilogue<'_>,
) -> Vec<f32> {
    epilogue.check(m, n);
    if m < PANEL_MIN_ROWS {
        // SAFETY: each block writes only its own columns; `isa` was
        // detected on this CPU.
        return unsafe {
            for_each_block(x, m, k, w, n, |block, out| {
                tile::run_on(isa, block, out, epilogue)
            })
        };
    }
    let panels = Panels::pack(x, m, k);
    // SAFETY: as above; `panels` is this `x` packed.
    unsafe {
        for_each_block(x, m, k, w, n, |block, out| {
            panel::run_on(isa, &panels, block, out, epilogue)
        })
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::ops::cpu::gemv::reference::{self, normal};

    /// Rows 1..17 and 33 (streaming, tiled, one partial or whole panel,
    /// three panels), `k` not a multiple of the vector width, `n` not a multiple
    /// of any tile, f32 and bf16 weights, with and without the epilogue, on
    /// every ISA this CPU has: each output within f32 rounding of the
    /// scalar reference.
    fn check_every_shape<W: WeightElem>(to_w: impl Fn(f32) -> W) {
        let mut rng = StdRng::seed_from_u64(49);
        let shapes = [(1, 1), (7, 13), (37, 5), (300, 25), (13, 7)];
        for (m, (k, n)) in (1..=17).chain([33]).flat_map(|m| shapes.map(|s| (m, s))) {
            let x = normal(&mut rng, m * k);
            let w: Vec<W> = normal(&mut rng, n * k).into_iter().map(&to_w).collect();
            let (bias, residual) = (normal(&mut rng, n), normal(&mut rng, m * n));
            let full = RowEpilogue {
                bias: Some(&bias),
                gelu: true,
                residual: Some(&residual),
            };
            for e in [RowEpilogue::default(), full] {
                let want = reference::project(&x, &w, (m, k, n), &e);
                for isa in CpuIsa::available() {
                    let got = project(isa, &x, m, k, &w, n, &e);
                    for (at, (&g, &r)) in got.iter().zip(&want).enumerate() {
                        let tol = 1e-5 * (1.0 + r.abs()) + 1e-6 * k as f64;
                        assert!(
                            (f64::from(g) - r).abs() < tol,
                            "{isa} m {m} k {k} n {n} at {at}: {g} vs {r}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn f32_weights_match_the_scalar_reference_at_every_row_count() {
        check_every_shape::<f32>(|v| v);
    }

    #[test]
    fn bf16_weights_match_the_scalar_reference_at_every_row_count() {
        check_every_shape::<bf16>(bf16::from_f32);
    }
}
