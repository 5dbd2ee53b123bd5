//! The register-blocked kernel: `out[i, j] = sum_t x[i, t] * w[j, t]` for a
//! block of weight rows, then the epilogue, compiled once per instruction set.
//!
//! Weights are out-major (`[n, k]`, each output feature's row contiguous).
//! Two shapes of the same loop, chosen by the number of rows `m` of `x`:
//!
//! - **Streaming** (`m <= STREAM_MAX_ROWS`, decode at small batches): one
//!   weight row at a time, front to back, with `U` vectors of `k` in flight
//!   per row of `x` (`MR x U` accumulators). The block's weights are then a
//!   single sequential read, which is what the hardware prefetcher follows
//!   best: on the Zen 4 dev machine one row at a time read the LM head at
//!   about 19 GB/s where four interleaved rows read it at 13-14 (a
//!   dev-machine measurement under load, not yet in docs/performance.md).
//!   At 4 rows streaming also beat the tiled path: batch 4 decode steps
//!   took 27.7 ms against 42.3 (GPT-2 124M f32, context 128, Zen 4 with
//!   AVX-512, 2 threads, medians of 5 interleaved runs on a loaded machine).
//!   The step is bound by this read.
//! - **Tiled** (more rows, up to [`super::lane_project::PANEL_MIN_ROWS`];
//!   more take [`super::panel`]): `NR = 4` weight rows against up to `MR` rows of
//!   `x` (`MR x 4` accumulators): each weight vector, once in a register,
//!   feeds `MR` rows, and the other row groups find the 4 weight rows in
//!   L1/L2. While the first row group runs, the next 4 weight rows are
//!   prefetched, so the read of the next tile overlaps this one's arithmetic.
//!   `MR` is 4 on AVX-512 (16 accumulators of its 32 registers) and 2 on AVX2
//!   and the portable path (8 of 16).
//!
//! Accumulators are summed across lanes at the end (plus a scalar tail when
//! `k` is not a multiple of the vector width). The entry points
//! ([`run_avx512`], [`run_avx2`], [`run_portable`]) are `#[target_feature]`
//! functions into which everything here, the [`super::lanes`] operations and
//! the [`super::epilogue`] included, is inlined; [`run_on`] picks one by the
//! detected ISA. (bf16 weights on a CPU with AVX512_BF16 take
//! [`super::dot_bf16`] instead.)

use super::epilogue::{apply_rows, RowEpilogue};
use super::lanes::{Lanes, Portable, WeightElem};
use super::split::Block;
use crate::ops::cpu::isa::CpuIsa;

/// A block of f32 activations against weights of type `W`.
pub type LaneBlock<'a, W> = Block<'a, f32, W>;

/// Weight rows per tile on the tiled path.
const NR: usize = 4;

/// Most rows of `x` that take the streaming path.
pub const STREAM_MAX_ROWS: usize = 4;

/// Where one tile reads and writes: `MR` rows of `x` (stride `k`) against
/// `NW` weight rows (stride `k`), into `out` (row stride `ldo`).
#[derive(Clone, Copy)]
struct Tile<W> {
    x: *const f32,
    w: *const W,
    k: usize,
    out: *mut f32,
    ldo: usize,
}

/// `x[i] . w[j]` for `MR` rows and `NW` weight rows, `U` vectors of `k` per
/// accumulator chain; with `PF`, prefetches the `NW` weight rows after these.
///
/// # Safety
/// `t.x` must hold `MR` rows and `t.w` `NW` rows of `t.k` elements; `t.out`
/// must be valid for `MR` rows of `NW` writes; `L`'s features must be present.
#[inline(always)]
unsafe fn tile<
    L: Lanes,
    W: WeightElem,
    const MR: usize,
    const NW: usize,
    const U: usize,
    const PF: bool,
>(
    t: Tile<W>,
) {
    let Tile { x, w, k, out, ldo } = t;
    let mut acc = [[[L::zero(); U]; NW]; MR];
    let unrolled = k - k % (U * L::WIDTH);
    let vectors = k - k % L::WIDTH;
    let mut at = 0;
    while at < unrolled {
        for u in 0..U {
            accumulate::<L, W, MR, NW, U, PF>(&mut acc, t, at + u * L::WIDTH, u);
        }
        at += U * L::WIDTH;
    }
    while at < vectors {
        accumulate::<L, W, MR, NW, U, PF>(&mut acc, t, at, 0);
        at += L::WIDTH;
    }
    for (i, rows) in acc.iter().enumerate() {
        for (j, chains) in rows.iter().enumerate() {
            let mut v = chains[0];
            for &c in &chains[1..] {
                v = L::add(v, c);
            }
            let mut s = L::sum(v);
            for t in vectors..k {
                s += *x.add(i * k + t) * (*w.add(j * k + t)).to_f32();
            }
            *out.add(i * ldo + j) = s;
        }
    }
}

/// One vector of `k` at `off` into chain `u` of every accumulator.
///
/// # Safety
/// As [`tile`], with `off + L::WIDTH <= k`.
#[inline(always)]
unsafe fn accumulate<
    L: Lanes,
    W: WeightElem,
    const MR: usize,
    const NW: usize,
    const U: usize,
    const PF: bool,
>(
    acc: &mut [[[L::V; U]; NW]; MR],
    t: Tile<W>,
    off: usize,
    u: usize,
) {
    let mut wv = [L::zero(); NW];
    for (j, v) in wv.iter_mut().enumerate() {
        let row = t.w.add(j * t.k + off);
        if PF {
            L::prefetch(row.wrapping_add(NW * t.k));
        }
        *v = W::load::<L>(row);
    }
    for (i, rows) in acc.iter_mut().enumerate() {
        let xv = L::load(t.x.add(i * t.k + off));
        for (a, &wj) in rows.iter_mut().zip(&wv) {
            a[u] = L::fma(xv, wj, a[u]);
        }
    }
}

/// The streaming path for one weight row: `mr <= STREAM_MAX_ROWS` (4) rows
/// of `x`, with enough chains (4 for one row, 2 per row above) to keep the
/// loads going.
///
/// # Safety
/// As [`tile`] with `NW = 1`.
#[inline(always)]
unsafe fn stream<L: Lanes, W: WeightElem>(mr: usize, t: Tile<W>) {
    match mr {
        1 => tile::<L, W, 1, 1, 4, false>(t),
        2 => tile::<L, W, 2, 1, 2, false>(t),
        3 => tile::<L, W, 3, 1, 2, false>(t),
        _ => tile::<L, W, 4, 1, 2, false>(t),
    }
}

/// The tiled path for `NW` weight rows and `mr <= 4` rows of `x`; `first`
/// (the first row group) prefetches the next tile's weight rows.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn tiled<L: Lanes, W: WeightElem, const NW: usize>(mr: usize, first: bool, t: Tile<W>) {
    match (mr, first) {
        (1, false) => tile::<L, W, 1, NW, 1, false>(t),
        (2, false) => tile::<L, W, 2, NW, 1, false>(t),
        (3, false) => tile::<L, W, 3, NW, 1, false>(t),
        (_, false) => tile::<L, W, 4, NW, 1, false>(t),
        (1, true) => tile::<L, W, 1, NW, 1, true>(t),
        (2, true) => tile::<L, W, 2, NW, 1, true>(t),
        (3, true) => tile::<L, W, 3, NW, 1, true>(t),
        (_, true) => tile::<L, W, 4, NW, 1, true>(t),
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
    b: LaneBlock<'_, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    let Block { x, m, k, w, n, .. } = b;
    let (x, w) = (x.as_ptr(), w.as_ptr());
    let out_block = out.add(b.col);
    let at = |i: usize, j: usize| Tile {
        x: x.add(i * k),
        w: w.add(j * k),
        k,
        out: out_block.add(i * b.ldo + j),
        ldo: b.ldo,
    };
    if m <= STREAM_MAX_ROWS {
        for j in 0..n {
            stream::<L, W>(m, at(0, j));
        }
    } else {
        let mut j = 0;
        while j < n {
            let whole = n - j >= NR;
            let mut i = 0;
            while i < m {
                let mr = (m - i).min(MR_MAX);
                if whole {
                    tiled::<L, W, NR>(mr, i == 0, at(i, j));
                } else {
                    tiled::<L, W, 1>(mr, false, at(i, j));
                }
                i += mr;
            }
            j += if whole { NR } else { 1 };
        }
    }
    apply_rows(out, b.ldo, m, b.col, n, epilogue);
}

/// [`run`] compiled for AVX-512F.
///
/// # Safety
/// As [`run`]; the CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn run_avx512<W: WeightElem>(
    b: LaneBlock<'_, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    run::<super::lanes::Avx512, W, 4>(b, out, epilogue)
}

/// [`run`] compiled for AVX2 and FMA.
///
/// # Safety
/// As [`run`]; the CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn run_avx2<W: WeightElem>(
    b: LaneBlock<'_, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    run::<super::lanes::Avx2, W, 2>(b, out, epilogue)
}

/// [`run`] in plain Rust.
///
/// # Safety
/// As [`run`].
pub unsafe fn run_portable<W: WeightElem>(
    b: LaneBlock<'_, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    run::<Portable, W, 2>(b, out, epilogue)
}

/// The block on `isa`'s entry point (AVX-512 for [`CpuIsa::Avx512Bf16`]:
/// its f32 lanes are AVX-512's).
///
/// # Safety
/// As [`run`]; `isa` must be available on this CPU.
pub unsafe fn run_on<W: WeightElem>(
    isa: CpuIsa,
    block: LaneBlock<'_, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx512 | CpuIsa::Avx512Bf16 => run_avx512(block, out, epilogue),
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx2 => run_avx2(block, out, epilogue),
        _ => run_portable(block, out, epilogue),
    }
}
