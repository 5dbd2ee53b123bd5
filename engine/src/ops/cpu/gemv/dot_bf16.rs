//! The native bf16 kernel: `out[i, j] = sum_t x[i, t] * w[j, t]` with both
//! operands in bf16, on AVX512_BF16's `vdpbf16ps`, then the epilogue.
//!
//! `vdpbf16ps` takes 32 bf16 of each operand (one 64-byte cache line of
//! weights), multiplies them (exactly: a bf16 product fits an f32) and adds
//! each adjacent pair into one of 16 f32 lanes. Weights are out-major
//! (`[n, k]`), so a weight row's consecutive elements are exactly the pairs
//! it wants: a vector of `x` and a vector of one weight row, one instruction,
//! 32 products, no widening. The caller rounds `x` to bf16 once per call
//! ([`super::bf16_weights`]).
//!
//! Each output is the sum of one accumulator's 16 lanes. Rather than reduce
//! each accumulator across its lanes (about 8 instructions for one output),
//! 16 accumulators are reduced together into one vector of 16 outputs
//! ([`lane_sums`]: 45 instructions, about 3 per output), which matters once
//! the kernel is bound by arithmetic (decode at 16 rows).
//!
//! Two shapes, chosen by the rows `m` of `x`, as in [`super::tile`]:
//!
//! - **Streaming** (`m <= STREAM_MAX_ROWS`): one weight row at a time, front
//!   to back (a single sequential read, which the prefetcher follows best),
//!   against every row of `x`; the accumulators of a group of `16 / m`
//!   weight rows are reduced together.
//! - **Tiled** (more rows): 4 weight rows against up to 4 rows of `x` (16
//!   accumulators); each weight vector, once loaded, feeds 4 rows, the other
//!   row groups find the 4 weight rows in L1, and the first row group
//!   prefetches the next 4.
//!
//! A `k` that is not a multiple of 32 ends with one masked load of each
//! operand (the missing elements read as 0). Everything is inlined into the
//! `#[target_feature]` entry point [`run`], called only when
//! [`crate::ops::cpu::CpuIsa::Avx512Bf16`] was detected.

use std::arch::x86_64::*;
use std::mem::transmute;

use half::bf16;

use super::epilogue::{apply_rows, RowEpilogue};
use super::split::Block;

/// A block of bf16 activations against bf16 weights.
pub type Bf16Block<'a> = Block<'a, bf16, bf16>;

/// bf16 elements per vector: 16 pairs, one per f32 lane.
const WIDTH: usize = 32;

/// Most rows of `x` that take the streaming path.
pub const STREAM_MAX_ROWS: usize = 4;

/// Weight rows per tile on the tiled path.
const NR: usize = 4;

/// Where a group or tile reads and writes: rows of `x` and of `w` (both
/// `k` long), and its first output (row stride `ldo`).
#[derive(Clone, Copy)]
struct Operands {
    x: *const bf16,
    w: *const bf16,
    k: usize,
    out: *mut f32,
    ldo: usize,
}

/// 32 bf16 from `p` (unaligned).
///
/// # Safety
/// The CPU must have AVX-512F and AVX512_BF16; `p` valid for 32 reads.
#[inline(always)]
unsafe fn load(p: *const bf16) -> __m512bh {
    transmute(_mm512_loadu_si512(p.cast()))
}

/// The first `mask.count_ones()` bf16 from `p`, the rest 0 (masked-off
/// elements are never read).
///
/// # Safety
/// The CPU must have AVX-512BW and AVX512_BF16; `p` valid for the unmasked reads.
#[inline(always)]
unsafe fn load_masked(p: *const bf16, mask: u32) -> __m512bh {
    transmute(_mm512_maskz_loadu_epi16(mask, p.cast()))
}

/// Lane `l` of the result is the sum of `v[l]`'s 16 lanes: pairs of
/// vectors are interleaved and added, four times, halving the vectors and
/// doubling the sources per vector each time.
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
pub unsafe fn lane_sums(v: &[__m512; 16]) -> __m512 {
    // No closures here or below: they would not inherit the entry point's
    // target features.
    // Per 128-bit block: (a0+a2, b0+b2, a1+a3, b1+b3) of the pair (a, b).
    let mut pairs = [_mm512_setzero_ps(); 8];
    for (i, p) in pairs.iter_mut().enumerate() {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        *p = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    // Per 128-bit block: one partial sum of each of 4 vectors.
    let mut quads = [_mm512_setzero_ps(); 4];
    for (i, q) in quads.iter_mut().enumerate() {
        let c = _mm512_castps_pd(pairs[2 * i]);
        let d = _mm512_castps_pd(pairs[2 * i + 1]);
        *q = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(c, d)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)),
        );
    }
    // 128-bit blocks (0 + 1, 2 + 3) of two quads side by side.
    let mut halves = [_mm512_setzero_ps(); 2];
    for (i, h) in halves.iter_mut().enumerate() {
        let (a, b) = (quads[2 * i], quads[2 * i + 1]);
        *h = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        );
    }
    let [a, b] = halves;
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
    )
}

/// Stores the outputs of accumulators `acc[i * G + j]` (row `i` of `x`,
/// weight row `j < g`) at `out[i * ldo + j]`.
///
/// # Safety
/// As [`lane_sums`]; `out` valid for those writes.
#[inline(always)]
unsafe fn store<const MR: usize, const G: usize>(
    acc: &[__m512; 16],
    g: usize,
    out: *mut f32,
    ldo: usize,
) {
    let sums = lane_sums(acc);
    if MR == 1 && G == 16 && g == 16 {
        _mm512_storeu_ps(out, sums);
        return;
    }
    let mut lanes = [0.0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), sums);
    for i in 0..MR {
        for j in 0..g {
            *out.add(i * ldo + j) = lanes[i * G + j];
        }
    }
}

/// The streaming path: `g <= G` weight rows one after the other, each
/// against `MR` rows of `x` with `U` accumulator chains per row (`MR * G
/// == 16`).
///
/// # Safety
/// `o.x` must hold `MR` rows and `o.w` `g` rows of `o.k`; `o.out` valid for
/// `MR` rows of `g` writes; the CPU must have AVX-512F/BW and AVX512_BF16.
#[inline(always)]
unsafe fn stream<const MR: usize, const G: usize, const U: usize>(o: Operands, g: usize) {
    let Operands { x, w, k, out, ldo } = o;
    let whole = k / WIDTH;
    let unrolled = whole - whole % U;
    let tail = k % WIDTH;
    let mut acc = [_mm512_setzero_ps(); 16];
    for j in 0..g {
        let row = w.add(j * k);
        let mut chains = [[_mm512_setzero_ps(); U]; MR];
        let mut v = 0;
        while v < unrolled {
            for u in 0..U {
                let wv = load(row.add((v + u) * WIDTH));
                for (i, c) in chains.iter_mut().enumerate() {
                    c[u] = _mm512_dpbf16_ps(c[u], load(x.add(i * k + (v + u) * WIDTH)), wv);
                }
            }
            v += U;
        }
        for v in unrolled..whole {
            let wv = load(row.add(v * WIDTH));
            for (i, c) in chains.iter_mut().enumerate() {
                c[0] = _mm512_dpbf16_ps(c[0], load(x.add(i * k + v * WIDTH)), wv);
            }
        }
        if tail > 0 {
            let mask = (1u32 << tail) - 1;
            let wv = load_masked(row.add(whole * WIDTH), mask);
            for (i, c) in chains.iter_mut().enumerate() {
                let xv = load_masked(x.add(i * k + whole * WIDTH), mask);
                c[0] = _mm512_dpbf16_ps(c[0], xv, wv);
            }
        }
        for (i, c) in chains.iter().enumerate() {
            let mut sum = c[0];
            for &chain in &c[1..] {
                sum = _mm512_add_ps(sum, chain);
            }
            acc[i * G + j] = sum;
        }
    }
    store::<MR, G>(&acc, g, out, ldo);
}

/// The tiled path: `NW` weight rows interleaved against `MR` rows of `x`,
/// one accumulator each (`MR * NW <= 16`); with `prefetch`, asks for the
/// `NW` weight rows after these.
///
/// # Safety
/// As [`stream`] with `NW` weight rows.
#[inline(always)]
unsafe fn tile<const MR: usize, const NW: usize>(o: Operands, prefetch: bool) {
    let Operands { x, w, k, out, ldo } = o;
    let whole = k / WIDTH;
    let tail = k % WIDTH;
    let mut acc = [_mm512_setzero_ps(); 16];
    let mut wv = [transmute::<__m512, __m512bh>(_mm512_setzero_ps()); NW];
    for v in 0..whole {
        let off = v * WIDTH;
        for (j, wj) in wv.iter_mut().enumerate() {
            let p = w.add(j * k + off);
            if prefetch {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(NW * k).cast());
            }
            *wj = load(p);
        }
        for i in 0..MR {
            let xv = load(x.add(i * k + off));
            for (j, &wj) in wv.iter().enumerate() {
                acc[i * NW + j] = _mm512_dpbf16_ps(acc[i * NW + j], xv, wj);
            }
        }
    }
    if tail > 0 {
        let (off, mask) = (whole * WIDTH, (1u32 << tail) - 1);
        for (j, wj) in wv.iter_mut().enumerate() {
            *wj = load_masked(w.add(j * k + off), mask);
        }
        for i in 0..MR {
            let xv = load_masked(x.add(i * k + off), mask);
            for (j, &wj) in wv.iter().enumerate() {
                acc[i * NW + j] = _mm512_dpbf16_ps(acc[i * NW + j], xv, wj);
            }
        }
    }
    store::<MR, NW>(&acc, NW, out, ldo);
}

/// The streaming path over all the block's weight rows, in groups of
/// `16 / m`.
///
/// # Safety
/// As [`run`], with `1 <= m <= STREAM_MAX_ROWS`.
#[inline(always)]
unsafe fn stream_rows(b: Bf16Block<'_>, out: *mut f32) {
    let group = 16 / b.m.next_power_of_two();
    let mut j = 0;
    while j < b.n {
        let g = group.min(b.n - j);
        let o = Operands {
            x: b.x.as_ptr(),
            w: b.w.as_ptr().add(j * b.k),
            k: b.k,
            out: out.add(b.col + j),
            ldo: b.ldo,
        };
        match b.m {
            1 => stream::<1, 16, 2>(o, g),
            2 => stream::<2, 8, 2>(o, g),
            3 => stream::<3, 4, 1>(o, g),
            _ => stream::<4, 4, 1>(o, g),
        }
        j += group;
    }
}

/// The tiled path: tiles of [`NR`] weight rows (single rows at the end)
/// against row groups of up to 4.
///
/// # Safety
/// As [`run`].
#[inline(always)]
unsafe fn tiled_rows(b: Bf16Block<'_>, out: *mut f32) {
    let mut j = 0;
    while j < b.n {
        let whole = b.n - j >= NR;
        let mut i = 0;
        while i < b.m {
            let mr = (b.m - i).min(4);
            let o = Operands {
                x: b.x.as_ptr().add(i * b.k),
                w: b.w.as_ptr().add(j * b.k),
                k: b.k,
                out: out.add(i * b.ldo + b.col + j),
                ldo: b.ldo,
            };
            let first = i == 0;
            match (mr, whole) {
                (1, true) => tile::<1, NR>(o, first),
                (2, true) => tile::<2, NR>(o, first),
                (3, true) => tile::<3, NR>(o, first),
                (_, true) => tile::<4, NR>(o, first),
                (1, false) => tile::<1, 1>(o, false),
                (2, false) => tile::<2, 1>(o, false),
                (3, false) => tile::<3, 1>(o, false),
                (_, false) => tile::<4, 1>(o, false),
            }
            i += mr;
        }
        j += if whole { NR } else { 1 };
    }
}

/// The block's products into `out` (the whole `[m, ldo]` output), then its
/// epilogue on the columns it wrote.
///
/// # Safety
/// The CPU must have AVX-512F, AVX-512BW and AVX512_BF16; `out` must be
/// valid for `m * ldo` elements, no other thread may touch the block's
/// columns meanwhile, and the block must fit (`x.len() >= m * k`,
/// `w.len() >= n * k`, `col + n <= ldo`).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn run(b: Bf16Block<'_>, out: *mut f32, epilogue: &RowEpilogue<'_>) {
    if b.m == 0 || b.n == 0 {
        return;
    }
    if b.m <= STREAM_MAX_ROWS {
        stream_rows(b, out);
    } else {
        tiled_rows(b, out);
    }
    apply_rows(out, b.ldo, b.m, b.col, b.n, epilogue);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_sums_puts_each_vectors_sum_in_its_lane() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let values: Vec<[f32; 16]> = (0..16)
            .map(|v| {
                std::array::from_fn(|l| (v * 16 + l) as f32 * if l % 3 == 0 { -1.0 } else { 1.0 })
            })
            .collect();
        // SAFETY: the CPU has AVX-512F (checked above).
        let got = unsafe { sums_of(&values) };
        for (v, lanes) in values.iter().enumerate() {
            assert_eq!(got[v], lanes.iter().sum::<f32>(), "vector {v}");
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn sums_of(values: &[[f32; 16]]) -> [f32; 16] {
        let mut v = [_mm512_setzero_ps(); 16];
        for (vi, lanes) in v.iter_mut().zip(values) {
            *vi = _mm512_loadu_ps(lanes.as_ptr());
        }
        let mut out = [0.0f32; 16];
        _mm512_storeu_ps(out.as_mut_ptr(), lane_sums(&v));
        out
    }
}
