//! A sampled row after its scan (passes 2-4 of [`super::sample_rows_kernel`]
//! and the rejection draw that may spare them; the module doc of `super`
//! explains each): the token, and the keys the trace records.

use cubecl::prelude::*;

use super::choice::{choose, unit_masses};
use super::params::RowParams;
use super::search::{kth_largest, top_p_threshold};
use crate::ops::cuda::kernels::reduce::{cube_reduce, key_of, value_of, OP_SUM};

/// What the scan found over the row's keys (pass 1).
#[derive(CubeType)]
pub struct ScanStats {
    pub key_max: u32,
    /// The lowest index holding `key_max`.
    pub argmax: u32,
    pub key_min: u32,
    /// Tokens present (not masked out, not NaN).
    pub present: u32,
}

/// Slots of [`sample_truncated`]'s output: the token, then the keys the
/// trace records (0 where a pass did not run).
pub const OUT_TOKEN: usize = 0;
pub const OUT_TAU_K: usize = 1;
pub const OUT_TOP_P_KEY: usize = 2;
pub const OUT_THRESHOLD: usize = 3;

/// The token of a sampled row (tempered, not top-k 1) whose keys hold a
/// finite max, at sampled position `pos`, into `out` (`OUT_*`, zeroed by
/// the caller): a rejection draw first for top-p without top-k (outside
/// trace mode), else (or when it is rejected) the top-k and top-p
/// thresholds and the Gumbel-max choice above them. `red_*` and `bins_*`
/// are the cube's reduction and histogram scratch.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn sample_truncated(
    keys: &Shared<[u32]>,
    red_u: &mut Shared<[u32]>,
    red_f: &mut Shared<[f32]>,
    bins_u: &mut Shared<[u32]>,
    bins_f: &mut Shared<[f32]>,
    p: &RowParams,
    stats: &ScanStats,
    pos: u32,
    out: &mut Array<u32>,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
    #[comptime] write_trace: bool,
) {
    let s_max = value_of(stats.key_max);
    let mut key_min_p = 0u32;
    if p.min_p > f32::new(0.0) {
        key_min_p = key_of(s_max + p.min_p.ln());
    }
    out[OUT_TOKEN] = stats.argmax;
    let mut decided = false;
    if comptime![!write_trace] {
        let k_off = p.top_k == 0 || p.top_k >= stats.present;
        if k_off && p.top_p > f32::new(0.0) && p.top_p < f32::new(1.0) {
            let lower = select(key_min_p > stats.key_min, key_min_p, stats.key_min);
            let candidate = choose(
                keys,
                red_u,
                red_f,
                s_max,
                stats.argmax,
                lower,
                pos,
                p.seed_lo,
                p.seed_hi,
                vocab,
                warps,
            );
            if nucleus_holds(keys, red_f, p.top_p, stats, candidate, s_max, vocab, warps) {
                out[OUT_TOKEN] = candidate;
                decided = true;
            }
        }
    }
    if !decided {
        let threshold = thresholds(
            keys, bins_u, bins_f, red_f, p, stats, key_min_p, s_max, out, vocab, warps,
        );
        out[OUT_THRESHOLD] = threshold;
        out[OUT_TOKEN] = choose(
            keys,
            red_u,
            red_f,
            s_max,
            stats.argmax,
            threshold,
            pos,
            p.seed_lo,
            p.seed_hi,
            vocab,
            warps,
        );
    }
}

/// Whether `candidate` lies in the nucleus: the mass of the keys above its
/// own is under `top_p` of `Z` (the rejection test, one pass of masses).
#[cube]
#[allow(clippy::too_many_arguments)]
fn nucleus_holds(
    keys: &Shared<[u32]>,
    red_f: &mut Shared<[f32]>,
    top_p: f32,
    stats: &ScanStats,
    candidate: u32,
    s_max: f32,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) -> bool {
    let mut part = Array::<f32>::new(2usize);
    let above = keys[candidate as usize];
    unit_masses(keys, &mut part, stats.key_min, above, s_max, vocab, warps);
    let z = cube_reduce(part[0], red_f, OP_SUM, warps);
    let mass = cube_reduce(part[1], red_f, OP_SUM, warps);
    mass < top_p * z
}

/// Passes 2 and 3: the top-k key (into `out[OUT_TAU_K]`, where top-k
/// cuts), then the top-p key (into `out[OUT_TOP_P_KEY]`) over what top-k
/// and min-p keep; returns the final threshold, the lower of the top-p key
/// and the max key.
#[cube]
#[allow(clippy::too_many_arguments)]
fn thresholds(
    keys: &Shared<[u32]>,
    bins_u: &mut Shared<[u32]>,
    bins_f: &mut Shared<[f32]>,
    red_f: &mut Shared<[f32]>,
    p: &RowParams,
    stats: &ScanStats,
    key_min_p: u32,
    s_max: f32,
    out: &mut Array<u32>,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) -> u32 {
    let key_min = stats.key_min;
    let key_max = stats.key_max;
    let mut tau_k = 0u32;
    if p.top_k > 0 && p.top_k < stats.present {
        tau_k = kth_largest(
            keys, bins_u, bins_f, key_min, key_max, p.top_k, vocab, warps,
        );
    }
    out[OUT_TAU_K] = tau_k;
    let in_k = select(tau_k > key_min, tau_k, key_min);
    let lower = select(key_min_p > in_k, key_min_p, in_k);
    let mut top_p_key = lower;
    if p.top_p < f32::new(1.0) {
        let nucleus = p.top_p > f32::new(0.0);
        if !nucleus {
            top_p_key = key_max;
        } else if lower < key_max {
            top_p_key = top_p_threshold(
                keys, bins_u, bins_f, red_f, lower, key_max, in_k, s_max, p.top_p, vocab, warps,
            );
        }
    }
    out[OUT_TOP_P_KEY] = top_p_key;
    select(top_p_key < key_max, top_p_key, key_max)
}
