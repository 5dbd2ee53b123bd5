//! The threshold searches of [`super::sample_rows_kernel`] and the cube-wide
//! reductions they use, over the row's keys cached in shared memory.
//!
//! **Radix descent over the u32 key space.** The keys of interest lie in
//! `[lo, hi]`; their common leading bits are known, so the search starts
//! below them and fixes up to 5 more bits a level (32 bins, one per lane):
//! each level histograms the keys that still match the prefix (a count, or
//! a mass `exp(s - s_max)` in f32) and picks a digit from the top, so at
//! most 7 levels pin the exact key. Each warp bins its 32 keys a round with
//! ballots: the lanes holding the first pending key's digit are counted
//! (`count_ones` of a ballot) and their masses added (`plane_sum`), and lane
//! `d` keeps bin `d`'s running total; an LLM row's keys fall in a few
//! digits, so a round costs a few ballots, not 32. Warps meet in shared
//! memory in a fixed order, so the sums, hence the thresholds, are
//! deterministic. Every loop holding a plane operation runs the same rounds
//! on all lanes of a warp (keys past the vocabulary are masked, not
//! skipped).

use cubecl::prelude::*;

use crate::ops::cuda::kernels::reduce::{cube_reduce, value_of, OP_SUM};

/// One radix level: over the keys `>= lo` whose bits above `hi_shift`
/// equal `prefix`, each digit's (bits `shift..hi_shift`) count into
/// `bins_u[0..32]` and, `with_mass`, mass `exp(s - s_max)` into
/// `bins_f[0..32]` (cube totals, in a fixed order). With `first`, also
/// returns this unit's share of `Z`, the mass of the keys `>= in_k`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn histogram(
    keys: &Shared<[u32]>,
    bins_u: &mut Shared<[u32]>,
    bins_f: &mut Shared<[f32]>,
    lo: u32,
    prefix: u32,
    hi_shift: u32,
    shift: u32,
    s_max: f32,
    in_k: u32,
    first: bool,
    #[comptime] with_mass: bool,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) -> f32 {
    let lane = UNIT_POS_X;
    let warp = UNIT_POS_Y as usize;
    let tid = warp * 32 + lane as usize;
    let digit_mask = (1u32 << (hi_shift - shift)) - 1;
    let mut my_count = 0u32;
    let mut my_mass = f32::new(0.0);
    let mut z = f32::new(0.0);
    for r in 0..comptime!(vocab.div_ceil(warps * 32)) {
        let i = r * comptime!(warps * 32) + tid;
        let mut key = 0u32;
        if i < vocab {
            key = keys[i];
        }
        // `>> (hi_shift - 1) >> 1`: a shift by 32 is undefined.
        let pending = key >= lo && ((key >> (hi_shift - 1)) >> 1) == prefix;
        let digit = (key >> shift) & digit_mask;
        let mut w = f32::new(0.0);
        if comptime![with_mass] {
            let in_z = first && key >= in_k;
            if pending || in_z {
                w = (value_of(key) - s_max).exp();
            }
            if in_z {
                z += w;
            }
        }
        // Bin the warp's pending keys, one distinct digit at a time.
        let mut left = pending;
        let mut todo = plane_ballot(left).extract(0usize);
        while todo != 0u32 {
            let leader = todo.find_first_set() - 1;
            let lead_digit = plane_shuffle(digit, leader);
            let mine = left && digit == lead_digit;
            let n = plane_ballot(mine).extract(0usize).count_ones();
            let mut m = f32::new(0.0);
            if comptime![with_mass] {
                m = plane_sum(select(mine, w, f32::new(0.0)));
            }
            if lane == lead_digit {
                my_count += n;
                my_mass += m;
            }
            left = left && !mine;
            todo = plane_ballot(left).extract(0usize);
        }
    }
    // Lane d of each warp holds the warp's bin d; thread d adds them up in
    // warp order into entry d (its own column: no other thread touches it).
    bins_u[warp * 32 + lane as usize] = my_count;
    bins_f[warp * 32 + lane as usize] = my_mass;
    sync_cube();
    if tid < 32 {
        let mut c = bins_u[tid];
        let mut m = bins_f[tid];
        #[unroll]
        for w in 1..warps {
            c += bins_u[w * 32 + tid];
            m += bins_f[w * 32 + tid];
        }
        bins_u[tid] = c;
        bins_f[tid] = m;
    }
    sync_cube();
    z
}

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
    while hi_shift > 0 {
        let width = select(hi_shift > 5, 5u32, hi_shift);
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
    while hi_shift > 0 {
        let width = select(hi_shift > 5, 5u32, hi_shift);
        let shift = hi_shift - width;
        let z = histogram(
            keys, bins_u, bins_f, lo, prefix, hi_shift, shift, s_max, in_k, first, true, vocab,
            warps,
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
        sync_cube();
    }
    select(short, lo, prefix)
}
