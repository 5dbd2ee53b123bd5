//! The multi-row kernel (decode at [`super::lane_project::PANEL_MIN_ROWS`]
//! rows or more): `out[i, j] = sum_t x[i, t] * w[j, t]` with the rows of
//! `x` across the vector lanes and each weight element broadcast, then the
//! epilogue.
//!
//! At 16 rows a projection is bound by arithmetic, not by the weight read,
//! so what counts is how many loads each FMA costs and where they come
//! from. Vectorizing along `k` (as [`super::tile`] does) takes a vector of
//! `x` and one of `w` per pair of operands and a horizontal sum per output;
//! with both in registers at most 2x4 outputs fit AVX2's 16 registers
//! (6 loads per 8 FMAs), and the 16 rows of `x` (16 x 3072 floats for the
//! MLP's down projection) do not fit L1, so every pair of rows reloads them
//! from L2. Here instead (the BLIS shape, the operands' roles chosen for
//! decode):
//!
//! - `x` is repacked once per call ([`Panels`]) `k`-major in panels of
//!   [`PANEL_ROWS`] (16) rows: the 16 rows' values at one `t` are one
//!   64-byte line, two AVX2 vectors or one AVX-512 vector.
//! - The weights stay as stored (out-major `[n, k]`, no packing): a tile of
//!   `WJ` weight rows is read front to back, one element per row and step,
//!   each broadcast to every lane (`vbroadcastss` from memory, one load) and
//!   multiplied into `WJ x XV` accumulators, one per weight row and vector
//!   of the panel. On AVX2 `WJ = 6, XV = 2`: 12 accumulators, 2 panel
//!   vectors and a broadcast in 15 of the 16 registers, 8 loads per 12
//!   FMAs, so the FMA units set the pace (about 86 GFLOP/s a core from L1
//!   on the Zen 3 dev machine, its peak). On AVX-512 `WJ = 12, XV = 1`.
//! - Each weight is loaded once per panel (once per call at 16 rows or
//!   fewer). The sums need no horizontal reduction: lane `r` of accumulator
//!   `(j, v)` is output `(16 g + 8 v + r, j)` (with 8-lane vectors); they
//!   are written out through a small transposing buffer.
//! - While a tile computes, it prefetches the next tile's weights (the
//!   tiles of a block are contiguous), a share every 16 steps, so the read
//!   from DRAM overlaps the arithmetic: at 16 rows that took the GPT-2 step's
//!   projections from 33 ms to 26 ms (f32, same machine, best of 25).
//!
//! bf16 weights are widened into an f32 scratch tile once per tile (one
//! vector load and shift per 8 elements), then multiplied like f32 ones:
//! widening while broadcasting made LLVM load each element into a general
//! register and broadcast from there (4 instructions a weight, not 1). A
//! panel of 8 rows or fewer (what is left of `m` past whole panels) runs
//! with `XV = 1` on AVX2.
//!
//! Entry points per ISA ([`run_avx512`], [`run_avx2`], [`run_portable`]) are
//! `#[target_feature]` functions into which all of this is inlined, as in
//! [`super::tile`]; [`run_on`] picks one.

use super::epilogue::{apply_rows, RowEpilogue};
use super::lanes::{Lanes, Portable, WeightElem};
use super::split::Block;
use crate::ops::cpu::isa::CpuIsa;

/// Rows of `x` per panel: two AVX2 vectors, one AVX-512 vector.
pub const PANEL_ROWS: usize = 16;

/// Steps of `k` between prefetches of the next tile's lines (16: one line
/// of each f32 weight row).
const PF_STEPS: usize = 16;

/// `x` `[m, k]` repacked `k`-major in panels of [`PANEL_ROWS`] rows: row `i`'s
/// element `t` is at `(i / 16) * 16 k + 16 t + i % 16`; the rows past `m` in
/// the last panel are 0.
pub struct Panels {
    data: Vec<f32>,
    m: usize,
    k: usize,
}

impl Panels {
    /// Packs `x` `[m, k]` (row-major).
    ///
    /// # Panics
    /// If `x` is shorter than `m * k`.
    pub fn pack(x: &[f32], m: usize, k: usize) -> Self {
        let mut data = vec![0.0f32; m.div_ceil(PANEL_ROWS) * PANEL_ROWS * k];
        for (i, row) in x[..m * k].chunks_exact(k.max(1)).enumerate() {
            let panel = &mut data[(i / PANEL_ROWS) * PANEL_ROWS * k..];
            for (t, &v) in row.iter().enumerate() {
                panel[t * PANEL_ROWS + i % PANEL_ROWS] = v;
            }
        }
        Self { data, m, k }
    }
}

/// `k` steps of `NJ` f32 weight rows against the first `XV` vectors of a
/// panel's lines, into `sums[j][lane]`.
///
/// # Safety
/// `xp` must hold `k` lines of [`PANEL_ROWS`] f32, each of `rows` `k`
/// elements; `XV * L::WIDTH <= PANEL_ROWS`; `L`'s features must be present.
#[inline(always)]
unsafe fn dot_panel<L: Lanes, const NJ: usize, const XV: usize>(
    xp: *const f32,
    rows: [*const f32; NJ],
    k: usize,
    next: (*const u8, usize),
    sums: &mut [[f32; PANEL_ROWS]; NJ],
) {
    let mut acc = [[L::zero(); XV]; NJ];
    let (next, bytes_per_step) = next;
    let mut s = 0;
    while s < k {
        // The lines of the next tile this chunk's share of the read covers.
        let from = next.wrapping_add(s * bytes_per_step);
        for line in 0..bytes_per_step * PF_STEPS / 64 {
            L::prefetch(from.wrapping_add(line * 64));
        }
        let end = (s + PF_STEPS).min(k);
        while s < end {
            let mut xs = [L::zero(); XV];
            for (v, x) in xs.iter_mut().enumerate() {
                *x = L::load(xp.add(s * PANEL_ROWS + v * L::WIDTH));
            }
            for (a, &r) in acc.iter_mut().zip(&rows) {
                let wv = L::splat(r.add(s));
                for (a, &x) in a.iter_mut().zip(&xs) {
                    *a = L::fma(x, wv, *a);
                }
            }
            s += 1;
        }
    }
    for (a, line) in acc.iter().zip(sums.iter_mut()) {
        for (v, &a) in a.iter().enumerate() {
            L::store(line.as_mut_ptr().add(v * L::WIDTH), a);
        }
    }
}

/// `NJ` weight rows from `w` against every panel, written to
/// `out[i * ldo + j]`; bf16 rows are widened into `scratch` first, once for
/// all panels.
///
/// # Safety
/// As [`run`]; `w` must hold `NJ` rows of `k`, `scratch` `NJ * k` f32 for
/// bf16, and `out` the tile's `NJ` columns of `m` rows.
#[inline(always)]
unsafe fn tile<L: Lanes, W: WeightElem, const NJ: usize, const XV: usize>(
    panels: &Panels,
    w: *const W,
    scratch: *mut f32,
    out: *mut f32,
    ldo: usize,
) {
    let Panels { ref data, m, k } = *panels;
    let mut rows = [w; NJ];
    for (j, r) in rows.iter_mut().enumerate() {
        *r = w.add(j * k);
    }
    let rows = W::f32_rows::<L, NJ>(rows, k, scratch);
    let next = (
        w.wrapping_add(NJ * k).cast::<u8>(),
        NJ * std::mem::size_of::<W>(),
    );
    let mut i = 0;
    while i < m {
        let xp = data.as_ptr().add(i * k);
        let n = (m - i).min(PANEL_ROWS);
        let mut sums = [[0.0f32; PANEL_ROWS]; NJ];
        if XV == 1 || n <= L::WIDTH {
            dot_panel::<L, NJ, 1>(xp, rows, k, next, &mut sums);
        } else {
            dot_panel::<L, NJ, XV>(xp, rows, k, next, &mut sums);
        }
        for r in 0..n {
            for (j, line) in sums.iter().enumerate() {
                *out.add((i + r) * ldo + j) = line[r];
            }
        }
        i += PANEL_ROWS;
    }
}

/// The block's products into `out` (the whole `[m, ldo]` output), then its
/// epilogue on the columns it wrote: tiles of `WJ` weight rows (single rows
/// at the end) in order, each against every panel while it is in cache.
///
/// # Safety
/// `panels` must be `x` of the block packed; `out` must be valid for
/// `m * ldo` elements, no other thread may touch the block's columns
/// meanwhile, `w.len() >= n * k`, `col + n <= ldo`; `L`'s features must be
/// present.
#[inline(always)]
unsafe fn run<L: Lanes, W: WeightElem, const WJ: usize, const XV: usize>(
    panels: &Panels,
    b: Block<'_, f32, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    let k = panels.k;
    let mut scratch = vec![0.0f32; if W::WIDENS { WJ * k } else { 0 }];
    let s = scratch.as_mut_ptr();
    let mut j = 0;
    while j < b.n {
        let (w, at) = (b.w.as_ptr().add(j * k), out.add(b.col + j));
        if b.n - j >= WJ {
            tile::<L, W, WJ, XV>(panels, w, s, at, b.ldo);
            j += WJ;
        } else {
            tile::<L, W, 1, XV>(panels, w, s, at, b.ldo);
            j += 1;
        }
    }
    apply_rows(out, b.ldo, panels.m, b.col, b.n, epilogue);
}

/// [`run`] compiled for AVX-512F: 12 weight rows x 1 vector.
///
/// # Safety
/// As [`run`]; the CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn run_avx512<W: WeightElem>(
    panels: &Panels,
    b: Block<'_, f32, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    run::<super::lanes::Avx512, W, 12, 1>(panels, b, out, epilogue)
}

/// [`run`] compiled for AVX2 and FMA: 6 weight rows x 2 vectors.
///
/// # Safety
/// As [`run`]; the CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn run_avx2<W: WeightElem>(
    panels: &Panels,
    b: Block<'_, f32, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    run::<super::lanes::Avx2, W, 6, 2>(panels, b, out, epilogue)
}

/// [`run`] in plain Rust: 4 weight rows x 2 vectors of 8.
///
/// # Safety
/// As [`run`].
pub unsafe fn run_portable<W: WeightElem>(
    panels: &Panels,
    b: Block<'_, f32, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    run::<Portable, W, 4, 2>(panels, b, out, epilogue)
}

/// The block on `isa`'s entry point (AVX-512 for [`CpuIsa::Avx512Bf16`]:
/// its f32 lanes are AVX-512's).
///
/// # Safety
/// As [`run`]; `isa` must be available on this CPU.
pub unsafe fn run_on<W: WeightElem>(
    isa: CpuIsa,
    panels: &Panels,
    block: Block<'_, f32, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx512 | CpuIsa::Avx512Bf16 => run_avx512(panels, block, out, epilogue),
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx2 => run_avx2(panels, block, out, epilogue),
        _ => run_portable(panels, block, out, epilogue),
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;
    use crate::ops::cpu::gemv::reference::{self, normal};
    use crate::ops::cpu::gemv::split::for_each_block;

    #[test]
    fn packing_puts_each_rows_step_in_its_lane_and_pads_with_zeros() {
        let (m, k) = (17, 3);
        let x: Vec<f32> = (0..m * k).map(|v| v as f32 + 1.0).collect();
        let p = Panels::pack(&x, m, k);
        assert_eq!(p.data.len(), 2 * PANEL_ROWS * k);
        for i in 0..m {
            for t in 0..k {
                let at = (i / PANEL_ROWS) * PANEL_ROWS * k + t * PANEL_ROWS + i % PANEL_ROWS;
                assert_eq!(p.data[at], x[i * k + t]);
            }
        }
        let pad = &p.data[PANEL_ROWS * k..];
        assert_eq!(pad.iter().filter(|&&v| v != 0.0).count(), k);
    }

    /// The panel kernel itself at the row counts the streaming kernel
    /// takes in production (1..4), so every lane count is covered; 5..17
    /// and more go through `lane_project`'s tests.
    #[test]
    fn few_rows_on_the_panel_kernel_match_the_scalar_reference() {
        let mut rng = StdRng::seed_from_u64(7);
        for (m, k, n) in [(1, 9, 13), (2, 31, 7), (3, 64, 12), (4, 5, 1)] {
            let x = normal(&mut rng, m * k);
            let w32 = normal(&mut rng, n * k);
            let w16: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
            let e = RowEpilogue::default();
            let panels = Panels::pack(&x, m, k);
            for isa in CpuIsa::available() {
                // SAFETY: each block writes only its own columns; `isa` is
                // available; `panels` is `x` packed.
                let (got32, got16) = unsafe {
                    (
                        for_each_block(&x, m, k, &w32, n, |b, o| run_on(isa, &panels, b, o, &e)),
                        for_each_block(&x, m, k, &w16, n, |b, o| run_on(isa, &panels, b, o, &e)),
                    )
                };
                let want32 = reference::project(&x, &w32, (m, k, n), &e);
                let want16 = reference::project(&x, &w16, (m, k, n), &e);
                for (got, want) in [(got32, want32), (got16, want16)] {
                    for (at, (&g, &r)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (f64::from(g) - r).abs() < 1e-4,
                            "{isa} m {m} at {at}: {g} vs {r}"
                        );
                    }
                }
            }
        }
    }
}
