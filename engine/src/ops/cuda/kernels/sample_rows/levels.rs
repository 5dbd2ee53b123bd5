//! One level of the radix descent of [`super::search`]: which keys it
//! walks (every cached key, or the candidates gathered once few are left)
//! and how it bins them.
//!
//! The keys of interest lie in `[lo, hi]`; their common leading bits are
//! known, so the search starts below them and fixes up to [`DIGIT_BITS`] more
//! bits a level: each level histograms the keys that still match the prefix
//! (a count, or a mass `exp(s - s_max)` in f32) and picks a digit from the
//! top, so at most 11 levels pin the exact key. Each unit walks its share of
//! the cached keys and adds each pending key into its own [`BINS`] registers
//! (an unrolled select per bin: no atomics, no plane operation inside the
//! walk, so a unit skips what is not pending); then each warp sums its lanes'
//! bins with plane sums and the warps meet in shared memory in a fixed order,
//! so the sums, hence the thresholds, are deterministic. (The first version
//! binned 32 digits a level with ballots, one round per distinct digit in
//! each warp's 32 keys: on a wide row's first levels, where nearly every key
//! is pending across many digits, that serial loop cost most of a top-p row's
//! time.)

use cubecl::prelude::*;

use crate::ops::cuda::kernels::reduce::value_of;

/// Bits a radix level fixes (at most).
pub const DIGIT_BITS: u32 = 3;
/// Bins of a radix level (`2^DIGIT_BITS`).
pub const BINS: usize = 8;
/// Candidates a level may gather (see [`SWEEP_GATHERED`]): 8 KB of shared memory.
pub const CANDIDATES: usize = 2048;

/// Where the candidates start in `bins_u` (after the bins: the cube totals
/// at `0..BINS`, warp `w`'s at `(w + 1) * BINS`).
pub fn candidates_at(warps: usize) -> usize {
    warps * 32
}

/// What a radix level walks (a `u32` array of 4, these slots: a struct
/// whose fields a level mutated did not pass CubeCL's verification when the
/// kernel compiled on the device, H200 call 34; an array does). A
/// level walks every cached key until the keys it leaves pending fit in
/// [`CANDIDATES`]; the next level then gathers them (in a fixed order: warp
/// by warp, each warp's in key order) into `bins_u` from [`candidates_at`]
/// while it bins them, and every later level walks that short list alone.
/// Slot: walk the gathered candidates (1) or every key (0).
pub const SWEEP_GATHERED: usize = 0;
/// Slot: gather this level's pending keys while walking every key (1).
pub const SWEEP_GATHER: usize = 1;
/// Slot: how many candidates are (or are being) gathered.
pub const SWEEP_N: usize = 2;
/// Slot: the previous level's chosen digit (whose per-warp counts place
/// each warp's candidates).
pub const SWEEP_DIGIT: usize = 3;

/// One radix level: over the keys `>= lo` whose bits above `hi_shift`
/// equal `prefix` (walking what `sweep` says), each digit's (bits
/// `shift..hi_shift`, at most [`DIGIT_BITS`] of them) count into
/// `bins_u[0..BINS]` and, `with_mass`, mass `exp(s - s_max)` into
/// `bins_f[0..BINS]` (cube totals, in a fixed order). With `first`, also
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
    sweep: &Array<u32>,
    #[comptime] with_mass: bool,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) -> f32 {
    let tid = UNIT_POS_Y as usize * 32 + UNIT_POS_X as usize;
    let mut count = Array::<u32>::new(BINS);
    let mut mass = Array::<f32>::new(BINS);
    #[unroll]
    for d in 0..BINS {
        count[d] = 0u32;
        mass[d] = f32::new(0.0);
    }
    let digits = Digits {
        lo,
        prefix,
        hi_shift,
        shift,
        s_max,
        in_k,
        first,
    };
    let mut z = f32::new(0.0);
    if sweep[SWEEP_GATHERED] == 1u32 {
        let at = comptime!(candidates_at(warps));
        let n = sweep[SWEEP_N] as usize;
        let mut i = tid;
        while i < n {
            z += bin_key(bins_u[at + i], &digits, &mut count, &mut mass, with_mass);
            i += comptime!(warps * 32);
        }
    } else {
        z = walk_keys(
            keys, bins_u, &digits, sweep, &mut count, &mut mass, with_mass, vocab, warps,
        );
    }
    bin_totals(&count, &mass, bins_u, bins_f, with_mass, warps);
    z
}

/// A level's digit: which keys are pending and which bits are binned.
#[derive(CubeType, Clone, Copy)]
struct Digits {
    lo: u32,
    prefix: u32,
    hi_shift: u32,
    shift: u32,
    s_max: f32,
    in_k: u32,
    first: bool,
}

/// Walks every cached key into this unit's bins ([`bin_key`]); with the
/// sweep's gather slot set, also copies the pending keys into the
/// candidates, each warp from its offset (the counts of the sweep's digit in
/// the warps before it, read before anything is written). Returns this
/// unit's share of `Z`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn walk_keys(
    keys: &Shared<[u32]>,
    bins_u: &mut Shared<[u32]>,
    digits: &Digits,
    sweep: &Array<u32>,
    count: &mut Array<u32>,
    mass: &mut Array<f32>,
    #[comptime] with_mass: bool,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) -> f32 {
    let lane = UNIT_POS_X;
    let warp = UNIT_POS_Y as usize;
    let tid = warp * 32 + lane as usize;
    let gather = sweep[SWEEP_GATHER] == 1u32;
    // Where this warp's candidates start, past the bins.
    let mut base = 0u32;
    if gather {
        let digit = sweep[SWEEP_DIGIT] as usize;
        for w in 0..warp {
            base += bins_u[(w + 1) * BINS + digit];
        }
        sync_cube();
    }
    let at = comptime!(candidates_at(warps) as u32);
    let below = (1u32 << lane) - 1;
    let mut z = f32::new(0.0);
    // The same rounds on every lane (the ballot); keys past the vocabulary
    // read as absent (0).
    for r in 0..comptime!(vocab.div_ceil(warps * 32)) {
        let i = r * comptime!(warps * 32) + tid;
        let mut key = 0u32;
        if i < vocab {
            key = keys[i];
        }
        z += bin_key(key, digits, count, mass, with_mass);
        if gather {
            let pending = is_pending(key, digits);
            let ballot = plane_ballot(pending).extract(0usize);
            if pending {
                bins_u[(at + base + (ballot & below).count_ones()) as usize] = key;
            }
            base += ballot.count_ones();
        }
    }
    z
}

/// Whether `key` is still in the search: `>= lo` with the level's prefix.
#[cube]
fn is_pending(key: u32, digits: &Digits) -> bool {
    // `>> (hi_shift - 1) >> 1`: a shift by 32 is undefined.
    key >= digits.lo && ((key >> (digits.hi_shift - 1)) >> 1) == digits.prefix
}

/// Adds `key` into this unit's bins if it is pending (its digit's count
/// and, `with_mass`, mass); returns its mass where it counts toward `Z`
/// (the first level, keys `>= in_k`), else 0.
#[cube]
fn bin_key(
    key: u32,
    digits: &Digits,
    count: &mut Array<u32>,
    mass: &mut Array<f32>,
    #[comptime] with_mass: bool,
) -> f32 {
    let pending = is_pending(key, digits);
    let mut in_z = false;
    if comptime![with_mass] {
        in_z = digits.first && key >= digits.in_k;
    }
    let mut z = f32::new(0.0);
    if pending || in_z {
        let mut w = f32::new(0.0);
        if comptime![with_mass] {
            w = (value_of(key) - digits.s_max).exp();
        }
        if in_z {
            z = w;
        }
        if pending {
            let digit_mask = (1u32 << (digits.hi_shift - digits.shift)) - 1;
            let digit = (key >> digits.shift) & digit_mask;
            #[unroll]
            for d in 0..BINS {
                let hit = digit == d as u32;
                count[d] += select(hit, 1u32, 0u32);
                if comptime![with_mass] {
                    mass[d] += select(hit, w, f32::new(0.0));
                }
            }
        }
    }
    z
}

/// The cube's totals of every unit's `count` and `mass` bins into
/// `bins_u[0..BINS]` and `bins_f[0..BINS]`: plane sums into warp `w`'s row
/// at `(w + 1) * BINS` (kept: the next level's gathering reads them), then
/// added up in warp order by unit `d` into entry `d`.
#[cube]
fn bin_totals(
    count: &Array<u32>,
    mass: &Array<f32>,
    bins_u: &mut Shared<[u32]>,
    bins_f: &mut Shared<[f32]>,
    #[comptime] with_mass: bool,
    #[comptime] warps: usize,
) {
    let lane = UNIT_POS_X as usize;
    let warp = UNIT_POS_Y as usize;
    let tid = warp * 32 + lane;
    let row = (warp + 1) * BINS;
    #[unroll]
    for d in 0..BINS {
        let c = plane_sum(count[d]);
        let mut m = f32::new(0.0);
        if comptime![with_mass] {
            m = plane_sum(mass[d]);
        }
        if lane == 0 {
            bins_u[row + d] = c;
            bins_f[row + d] = m;
        }
    }
    sync_cube();
    if tid < BINS {
        let mut c = bins_u[BINS + tid];
        let mut m = bins_f[BINS + tid];
        #[unroll]
        for w in 1..warps {
            c += bins_u[(w + 1) * BINS + tid];
            m += bins_f[(w + 1) * BINS + tid];
        }
        bins_u[tid] = c;
        bins_f[tid] = m;
    }
    sync_cube();
}

/// The walk of the level after one that chose `digit`, whose keys (its
/// bin's count, `left`) are still pending: as it was, or gathering them now
/// when they fit, or walking what was gathered.
#[cube]
pub fn advance(sweep: &mut Array<u32>, left: u32, digit: u32) {
    sweep[SWEEP_DIGIT] = digit;
    if sweep[SWEEP_GATHER] == 1u32 {
        sweep[SWEEP_GATHER] = 0u32;
        sweep[SWEEP_GATHERED] = 1u32;
    } else if sweep[SWEEP_GATHERED] == 0u32 && left as usize <= CANDIDATES {
        sweep[SWEEP_GATHER] = 1u32;
        sweep[SWEEP_N] = left;
    }
}

/// A sweep over every key (the first level's), into `sweep`.
#[cube]
pub fn full_sweep(sweep: &mut Array<u32>) {
    #[unroll]
    for i in 0..4 {
        sweep[i] = 0u32;
    }
}
