//! The threshold searches of [`super::sample_rows_kernel`] and the cube-wide
//! reductions they use, over the row's keys cached in shared memory.
//!
//! **Radix descent over the u32 key space**, a level at a time
//! ([`super::levels`]): each level histograms the keys still in the search
//! and picks a digit from the top, fixing up to 3 more bits of the answer.

use cubecl::prelude::*;

use super::levels::{advance, full_sweep, histogram, DIGIT_BITS};
use crate::ops::cuda::kernels::reduce::{cube_reduce, OP_SUM};

/// The bits below the common prefix of `lo` and `hi` (0 if equal).
#[cube]
fn free_bits(lo: u32, hi: u32) -> u32 {
    32u32 - (lo ^ hi).leading_zeros()
}

/// The top `32 - hi_shift` bits of `hi` (`hi` itself if `hi_shift == 0`).
#[cube]
fn top_bits(hi: u32, hi_shift: u32) -> u32 {
    let mut prefix = hi;
    if hi_shift > 0 {
        prefix = (hi >> (hi_shift - 1)) >> 1;
    }
    prefix
}

/// The `k`-th largest key in `[lo, hi]` (at least `k` keys are `>= lo`; 0
/// marks absent tokens): the largest `t` with `count{key >= t} >= k`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn kth_largest(
    keys: &Shared<[u32]>,
    bins_u: &mut Shared<[u32]>,
    bins_f: &mut Shared<[f32]>,
    lo: u32,
    hi: u32,
    k: u32,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) -> u32 {
    let mut hi_shift = free_bits(lo, hi);
    let mut prefix = top_bits(hi, hi_shift);
    // Keys above the current prefix's range (fewer than k).
    let mut above = 0u32;
    let mut sweep = Array::<u32>::new(4usize);
    full_sweep(&mut sweep);
    while hi_shift > 0 {
        let width = select(hi_shift > DIGIT_BITS, DIGIT_BITS, hi_shift);
        let shift = hi_shift - width;
        histogram(
            keys,
            bins_u,
            bins_f,
            lo,
            prefix,
            hi_shift,
            shift,
            f32::new(0.0),
            0u32,
            false,
            &sweep,
            false,
            vocab,
            warps,
        );
        // The highest digit with `above + count{digit' >= digit} >= k`.
        let bins = 1u32 << width;
        let mut chosen = 0u32;
        let mut found = false;
        let mut cum = above;
        for j in 0..bins {
            let d = bins - 1 - j;
            let c = bins_u[d as usize];
            if !found {
                if cum + c >= k {
                    chosen = d;
                    found = true;
                } else {
                    cum += c;
                }
            }
        }
        above = cum;
        prefix = (prefix << width) | chosen;
        hi_shift = shift;
        advance(&mut sweep, bins_u[chosen as usize], chosen);
        sync_cube();
    }
    prefix
}

/// The top-p threshold: the smallest key `t >= lo` (`lo < hi = key_max`)
/// with `mass{key > t} < p Z`, `Z` the mass of the keys `>= in_k`; `lo`
/// when the mass of the keys `>= lo` is already short of `p Z`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn top_p_threshold(
    keys: &Shared<[u32]>,
    bins_u: &mut Shared<[u32]>,
    bins_f: &mut Shared<[f32]>,
    red_f: &mut Shared<[f32]>,
    lo: u32,
    hi: u32,
    in_k: u32,
    s_max: f32,
    p: f32,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) -> u32 {
    let mut hi_shift = free_bits(lo, hi);
    let mut prefix = top_bits(hi, hi_shift);
    // Mass above the current prefix's range (< target).
    let mut above = f32::new(0.0);
    let mut target = f32::new(0.0);
    let mut first = true;
    let mut short = false;
    let mut sweep = Array::<u32>::new(4usize);
    full_sweep(&mut sweep);
    while hi_shift > 0 {
        let width = select(hi_shift > DIGIT_BITS, DIGIT_BITS, hi_shift);
        let shift = hi_shift - width;
        let z = histogram(
            keys, bins_u, bins_f, lo, prefix, hi_shift, shift, s_max, in_k, first, &sweep, true,
            vocab, warps,
        );
        if first {
            target = p * cube_reduce(z, red_f, OP_SUM, warps);
        }
        // The highest digit with `above + mass{digit' >= digit} >= target`.
        let bins = 1u32 << width;
        let mut chosen = 0u32;
        let mut found = false;
        let mut cum = above;
        for j in 0..bins {
            let d = bins - 1 - j;
            let m = bins_f[d as usize];
            if !found {
                if cum + m >= target {
                    chosen = d;
                    found = true;
                } else {
                    cum += m;
                }
            }
        }
        if !found {
            // First level: the keys >= lo hold less than the target, so lo
            // is the answer. Later (rounding only): keep the whole range.
            short = first;
            cum -= bins_f[0];
        }
        above = cum;
        prefix = (prefix << width) | chosen;
        hi_shift = select(short, 0u32, shift);
        first = false;
        advance(&mut sweep, bins_u[chosen as usize], chosen);
        sync_cube();
    }
    select(short, lo, prefix)
}
