//! The register-blocked kernel: `out[i, j] = sum_t x[i, t] * w[j, t]` for a
//! block of weight rows, then the epilogue, compiled once per instruction set.
//!
//! Weights are out-major (`[n, k]`, each output feature's row contiguous), so
//! the kernel streams `NR = 4` weight rows side by side, front to back, once:
//! for every vector of `k` it loads one vector from each of the 4 rows and
//! one from each of up to `MR` rows of `x`, and does `MR x 4` fused
//! multiply-adds into as many vector accumulators, which are summed across
//! lanes at the end. With few rows (decode) the weight read is the whole
//! cost, and it runs as 4 sequential streams the hardware prefetcher follows;
//! with more rows each weight vector, once in a register, feeds `MR` rows, and
//! further row groups find the 4 weight rows in L1/L2 (they are visited
//! before moving on to the next 4). `MR` is 4 on AVX-512 (16 accumulators of
//! its 32 registers) and 2 on AVX2 and the portable path (8 of 16).
//!
//! The entry points ([`run_avx512`], [`run_avx2`], [`run_portable`]) are
//! `#[target_feature]` functions into which everything here, the
//! [`super::lanes`] operations and the [`super::epilogue`] included, is
//! inlined; the caller ([`super::project`]) picks one by the detected ISA.

use super::epilogue::{apply_rows, Epilogue};
use super::lanes::{Lanes, Portable, WeightElem};

/// Weight rows per tile.
const NR: usize = 4;

/// One block of work: `n` weight rows (of `k`) against all `m` rows of `x`,
/// written to columns `col .. col + n` of the `[m, ldo]` output.
#[derive(Clone, Copy)]
pub struct Block<'a, W> {
    /// `[m, k]`, row-major.
    pub x: &'a [f32],
    pub m: usize,
    pub k: usize,
    /// The block's weight rows, `[n, k]`.
    pub w: &'a [W],
    pub n: usize,
    /// First output column of the block.
    pub col: usize,
    /// Row stride of the output.
    pub ldo: usize,
}

/// `MR x NR'` accumulators over the whole `k`, then their lane sums (plus the
/// scalar tail of `k`) into `out` (row stride `ldo`).
///
/// # Safety
/// `x` must hold `MR` rows of stride `ldx` and `w` `NW` rows of stride `ldw`,
/// each of at least `k` elements; `out` must be valid for `MR` rows of `NW`
/// writes at stride `ldo`; `L`'s features must be present.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<L: Lanes, W: WeightElem, const MR: usize, const NW: usize>(
    x: *const f32,
    ldx: usize,
    w: *const W,
    ldw: usize,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[L::zero(); NW]; MR];
    let body = k - k % L::WIDTH;
    let mut at = 0;
    while at < body {
        let mut wv = [L::zero(); NW];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = W::load::<L>(w.add(j * ldw + at));
        }
        for (i, row) in acc.iter_mut().enumerate() {
            let xv = L::load(x.add(i * ldx + at));
            for (a, &wj) in row.iter_mut().zip(&wv) {
                *a = L::fma(xv, wj, *a);
            }
        }
        at += L::WIDTH;
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, &a) in row.iter().enumerate() {
            let mut s = L::sum(a);
            for t in body..k {
                s += *x.add(i * ldx + t) * (*w.add(j * ldw + t)).to_f32();
            }
            *out.add(i * ldo + j) = s;
        }
    }
}

/// Up to `MR_MAX` rows of `x` against `NW` weight rows.
///
/// # Safety
/// As [`tile`], with `mr <= MR_MAX <= 4` rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<L: Lanes, W: WeightElem, const NW: usize>(
    mr: usize,
    x: *const f32,
    k: usize,
    w: *const W,
    out: *mut f32,
    ldo: usize,
) {
    match mr {
        1 => tile::<L, W, 1, NW>(x, k, w, k, k, out, ldo),
        2 => tile::<L, W, 2, NW>(x, k, w, k, k, out, ldo),
        3 => tile::<L, W, 3, NW>(x, k, w, k, k, out, ldo),
        _ => tile::<L, W, 4, NW>(x, k, w, k, k, out, ldo),
    }
}

/// The block's products into `out` (the whole `[m, ldo]` output), then its
/// epilogue on the columns it wrote.
///
/// # Safety
/// `out` must be valid for `m * ldo` elements, no other thread may touch the
/// block's columns meanwhile, the block must fit (`x.len() >= m * k`,
/// `w.len() >= n * k`, `col + n <= ldo`), and `L`'s features must be present.
#[inline(always)]
unsafe fn run<L: Lanes, W: WeightElem, const MR_MAX: usize>(
    b: Block<'_, W>,
    out: *mut f32,
    epilogue: &Epilogue<'_>,
) {
    let Block { x, m, k, w, n, .. } = b;
    let (x, w) = (x.as_ptr(), w.as_ptr());
    let out_block = out.add(b.col);
    let mut j = 0;
    while j < n {
        let whole = n - j >= NR;
        let mut i = 0;
        while i < m {
            let mr = (m - i).min(MR_MAX);
            let (xi, wj, o) = (x.add(i * k), w.add(j * k), out_block.add(i * b.ldo + j));
            if whole {
                rows::<L, W, NR>(mr, xi, k, wj, o, b.ldo);
            } else {
                rows::<L, W, 1>(mr, xi, k, wj, o, b.ldo);
            }
            i += mr;
        }
        j += if whole { NR } else { 1 };
    }
    apply_rows(out, b.ldo, m, b.col, n, epilogue);
}

/// [`run`] compiled for AVX-512F.
///
/// # Safety
/// As [`run`]; the CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn run_avx512<W: WeightElem>(b: Block<'_, W>, out: *mut f32, epilogue: &Epilogue<'_>) {
    run::<super::lanes::Avx512, W, 4>(b, out, epilogue)
}

/// [`run`] compiled for AVX2 and FMA.
///
/// # Safety
/// As [`run`]; the CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn run_avx2<W: WeightElem>(b: Block<'_, W>, out: *mut f32, epilogue: &Epilogue<'_>) {
    run::<super::lanes::Avx2, W, 2>(b, out, epilogue)
}

/// [`run`] in plain Rust.
///
/// # Safety
/// As [`run`].
pub unsafe fn run_portable<W: WeightElem>(b: Block<'_, W>, out: *mut f32, epilogue: &Epilogue<'_>) {
    run::<Portable, W, 2>(b, out, epilogue)
}
