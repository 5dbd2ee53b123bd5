//! The CPU row sampler: one row's token from its logits, and the executable
//! spec of the device kernel (`ops::cuda::kernels::sample_rows`), which
//! computes the same thresholds ([`RowTrace`]) with the same f32 operations.
//!
//! **Semantics** (transformers' warper order; the filters keep the
//! INTERSECTION of their sets):
//! - A token whose bit in `allowed` is 0, or whose logit is NaN, is absent.
//!   Greedy rows ([`RowParams::is_greedy`]) take the argmax of the raw
//!   logits, lowest index on ties (0 if no token is present).
//! - `s_i = l_i / T` (a division), `-0` made `+0`; every comparison below is
//!   on `key(s)`, the order-preserving u32 of the f32 ([`key_of`]).
//! - top-k (`0 < k < #present`): `tau_k` = the k-th largest key (every token
//!   tied with it kept).
//! - min-p (`min_p > 0`): `key(s_max + ln(min_p))`.
//! - top-p (`top_p < 1`): over `K = {key >= tau_k}` with `w_i = exp(s_i -
//!   s_max)` and `Z = sum_K w`, a token is kept iff the mass of the tokens
//!   strictly above it is `< p Z` (tied tokens kept or dropped together):
//!   the threshold is the smallest key `t >= lower = max(tau_k, key_minp,
//!   key_min)` with `mass{key > t} < p Z` (`lower` if the mass at or above
//!   it is already short of `p Z`, or `>= key_max`; `top_p <= 0` keeps the
//!   top key only).
//! - threshold = `min(max(lower, t_p), key_max)`: the top token is always
//!   kept. The token is the argmax over kept tokens of `s_i + g(seed, pos,
//!   i)` ([`super::philox`]), lowest index on ties: an exact draw from the
//!   renormalized `softmax(s)` over the kept set.
//! - `s_max` not finite (every present logit `-inf`, or an overflow): the
//!   argmax.
//!
//! **Cost**, O(V) a row, no sort of the row: one scan (keys, max, min,
//! count); top-k by `select_nth_unstable` on the keys; top-p by a histogram
//! of `w` over the top 16 key bits (f64, vocabulary order) scanned from the
//! top, the boundary bucket resolved exactly by sorting its few tokens;
//! then one Gumbel pass that computes Philox only for groups of 4 tokens
//! that could still win and logarithms only for tokens within the
//! leading-zero bound of the best so far. Scratch buffers are per thread, so
//! rows can run in parallel (rayon) without allocating each time.

use std::cell::RefCell;

use rayon::prelude::*;

use super::philox::{gumbel, noise_bound, noise_words, token_noise};
use crate::ops::row_params::{RowParams, FLOAT_COLS, INT_COLS, NOISE_MAX};

/// What each pass of one row found: the kernel's trace holds the first four
/// (`RowTrace::words`), so a GPU check can compare it pass by pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowTrace {
    /// Pass 1: the lowest index of the largest key (0 if none is present).
    pub argmax: u32,
    /// The top-k threshold key; 0 when top-k is off (or the row is greedy).
    pub tau_k: u32,
    /// The top-p threshold key (`lower` when top-p is off); 0 for greedy rows.
    pub top_p: u32,
    /// The final threshold key; 0 for greedy rows.
    pub threshold: u32,
    /// The chosen token.
    pub token: u32,
}

impl RowTrace {
    fn argmax_only(argmax: u32) -> Self {
        RowTrace {
            argmax,
            tau_k: 0,
            top_p: 0,
            threshold: 0,
            token: argmax,
        }
    }

    /// The kernel's trace columns (`row_params::TRACE_COLS`), bit patterns.
    pub fn words(&self) -> [i32; 4] {
        [self.argmax, self.tau_k, self.top_p, self.threshold].map(|w| w as i32)
    }
}

/// The order-preserving u32 of `s` (`-0` first made `+0`): negative values
/// have every bit flipped, the others their sign bit set. Absent tokens
/// carry key 0, below every real value's (`key(-inf) = 0x007F_FFFF`).
pub fn key_of(s: f32) -> u32 {
    let mut bits = s.to_bits();
    if bits == 0x8000_0000 {
        bits = 0;
    }
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// The f32 whose key is `key` (inverse of [`key_of`]).
pub fn value_of(key: u32) -> f32 {
    f32::from_bits(if key >> 31 == 1 {
        key & 0x7FFF_FFFF
    } else {
        !key
    })
}

/// The token for one row: `logits` `[V]`, `pos` the position being
/// sampled, `allowed` an optional `[ceil(V / 32)]` bitmask.
pub fn sample_row(logits: &[f32], params: &RowParams, pos: u32, allowed: Option<&[u32]>) -> u32 {
    trace_row(logits, params, pos, allowed).token
}

/// [`sample_row`] with what each pass found.
pub fn trace_row(
    logits: &[f32],
    params: &RowParams,
    pos: u32,
    allowed: Option<&[u32]>,
) -> RowTrace {
    SCRATCH.with(|s| {
        let scratch = &mut s.borrow_mut();
        if params.is_greedy() {
            return RowTrace::argmax_only(scan(logits, 1.0, allowed, &mut scratch.keys).argmax);
        }
        sampled(scratch, logits, params, pos, allowed)
    })
}

/// The CPU sampler over the kernel's inputs, as host data: `logits` `[B,
/// vocab]`, the parameter columns `floats` `[B, FLOAT_COLS]` and `ints` `[B,
/// INT_COLS]` (`crate::ops::row_params`), `positions` `[B]`, `allowed` `[B,
/// ceil(vocab / 32)]` words (read only for rows whose flag says so). Rows
/// run in parallel. What a GPU check compares the kernel's ids (and trace)
/// with, on identical inputs.
pub fn trace_rows_host(
    logits: &[f32],
    vocab: usize,
    floats: &[f32],
    ints: &[i32],
    positions: &[i32],
    allowed: Option<&[u32]>,
) -> Vec<RowTrace> {
    let words = vocab.div_ceil(32);
    (0..positions.len())
        .into_par_iter()
        .map(|b| {
            let (params, has_allowed) = RowParams::from_columns(
                &floats[b * FLOAT_COLS..(b + 1) * FLOAT_COLS],
                &ints[b * INT_COLS..(b + 1) * INT_COLS],
            );
            let mask = allowed
                .filter(|_| has_allowed)
                .map(|a| &a[b * words..(b + 1) * words]);
            let row = &logits[b * vocab..(b + 1) * vocab];
            trace_row(row, &params, positions[b] as u32, mask)
        })
        .collect()
}

/// Per-thread scratch: the row's keys, a copy for the top-k selection, the
/// top-p histogram and its boundary bucket.
#[derive(Default)]
struct Scratch {
    keys: Vec<u32>,
    select: Vec<u32>,
    mass: Vec<f64>,
    bucket: Vec<(u32, f64)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Pass 1 over a row: the largest and smallest present key, the lowest
/// index holding the largest, and how many tokens are present.
struct Scan {
    key_max: u32,
    key_min: u32,
    argmax: u32,
    present: u32,
}

/// Pass 1: each token's key of `l / temperature` (0 if absent) into `keys`,
/// then their summary. Simple loops the compiler vectorizes: ~4x faster
/// than one loop that keeps every statistic.
fn scan(logits: &[f32], temperature: f32, allowed: Option<&[u32]>, keys: &mut Vec<u32>) -> Scan {
    let key = |l: f32| {
        if l.is_nan() {
            0
        } else {
            key_of(l / temperature)
        }
    };
    keys.clear();
    match allowed {
        None => keys.extend(logits.iter().map(|&l| key(l))),
        Some(mask) => keys.extend(logits.iter().enumerate().map(|(i, &l)| {
            let bit = (mask[i / 32] >> (i % 32)) & 1;
            if bit == 1 {
                key(l)
            } else {
                0
            }
        })),
    }
    let key_max = keys.iter().copied().max().unwrap_or(0);
    let present = keys.iter().filter(|&&k| k != 0).count() as u32;
    let key_min = keys
        .iter()
        .map(|&k| if k == 0 { u32::MAX } else { k })
        .min()
        .unwrap_or(u32::MAX);
    let argmax = if key_max == 0 {
        0
    } else {
        keys.iter().position(|&k| k == key_max).unwrap_or(0) as u32
    };
    Scan {
        key_max,
        key_min,
        argmax,
        present,
    }
}

/// A sampled row (module docs), pass by pass.
fn sampled(
    scratch: &mut Scratch,
    logits: &[f32],
    params: &RowParams,
    pos: u32,
    allowed: Option<&[u32]>,
) -> RowTrace {
    let Scratch {
        keys,
        select,
        mass,
        bucket,
    } = scratch;
    let scan = scan(logits, params.temperature, allowed, keys);
    let s_max = value_of(scan.key_max);
    if scan.present == 0 || !s_max.is_finite() {
        return RowTrace::argmax_only(scan.argmax);
    }
    let k = params.top_k;
    let tau_k = if k > 0 && k < scan.present {
        kth_largest(keys, k, select)
    } else {
        0
    };
    let key_min_p = if params.min_p > 0.0 {
        key_of(s_max + params.min_p.ln())
    } else {
        0
    };
    let lower = tau_k.max(key_min_p).max(scan.key_min);
    let top_p = if params.top_p < 1.0 {
        if params.top_p > 0.0 && lower < scan.key_max {
            let range = PRange {
                in_k: tau_k.max(scan.key_min),
                lower,
                key_max: scan.key_max,
            };
            top_p_threshold(keys, s_max, range, params.top_p, mass, bucket)
        } else if params.top_p > 0.0 {
            lower
        } else {
            scan.key_max
        }
    } else {
        lower
    };
    let threshold = top_p.min(scan.key_max);
    let token = gumbel_argmax(keys, s_max, scan.argmax, threshold, params.seed, pos);
    RowTrace {
        argmax: scan.argmax,
        tau_k,
        top_p,
        threshold,
        token,
    }
}

/// The `k`-th largest present key (`0 < k <= #present`).
fn kth_largest(keys: &[u32], k: u32, select: &mut Vec<u32>) -> u32 {
    select.clear();
    select.extend(keys.iter().copied().filter(|&key| key != 0));
    *select
        .select_nth_unstable_by(k as usize - 1, |a, b| b.cmp(a))
        .1
}

/// The keys the top-p search works over: `K = {key >= in_k}` holds the mass
/// `Z`; the threshold is searched in `[lower, key_max]`.
struct PRange {
    in_k: u32,
    lower: u32,
    key_max: u32,
}

/// The top-p threshold (module docs): the smallest key `t >= lower` with
/// `mass{key > t} < p Z`, or `lower` when `mass{key >= lower} < p Z`.
fn top_p_threshold(
    keys: &[u32],
    s_max: f32,
    range: PRange,
    p: f32,
    mass: &mut Vec<f64>,
    bucket: &mut Vec<(u32, f64)>,
) -> u32 {
    let weight = |key: u32| f64::from((value_of(key) - s_max).exp());
    // Z over K, and the mass of each 16-bit bucket of [lower, key_max].
    let first = range.lower >> 16;
    mass.clear();
    mass.resize(((range.key_max >> 16) - first + 1) as usize, 0.0);
    let mut z = 0f64;
    for &key in keys.iter().filter(|&&key| key >= range.in_k) {
        let w = weight(key);
        z += w;
        if key >= range.lower {
            mass[((key >> 16) - first) as usize] += w;
        }
    }
    let target = f64::from(p) * z;
    // The boundary bucket: the highest one where the mass from the top
    // reaches the target; `above` is the mass of the buckets over it.
    let mut above = 0f64;
    let Some(b) = (0..mass.len()).rev().find(|&b| {
        let reaches = above + mass[b] >= target;
        if !reaches {
            above += mass[b];
        }
        reaches
    }) else {
        return range.lower;
    };
    let b = b as u32 + first;
    // Resolve it exactly: its tokens by key, descending (a stable sort, so
    // equal keys add up in vocabulary order).
    bucket.clear();
    bucket.extend(
        keys.iter()
            .filter(|&&key| key >= range.lower && key >> 16 == b)
            .map(|&key| (key, weight(key))),
    );
    bucket.sort_by_key(|x| std::cmp::Reverse(x.0));
    let mut i = 0;
    let mut t = range.lower;
    while i < bucket.len() {
        // Every token at this key has `above` strictly above it (< target:
        // the first key of the bucket always qualifies).
        let key = bucket[i].0;
        t = key;
        while i < bucket.len() && bucket[i].0 == key {
            above += bucket[i].1;
            i += 1;
        }
        if above >= target {
            break;
        }
    }
    t
}

/// The last pass: the argmax over present keys `>= threshold` of `s_i +
/// g_i`, lowest index on ties, starting from the top token `argmax` (always
/// kept). A group of 4 gets its Philox words only if one of its tokens
/// could beat the best so far with the largest noise, a token its
/// logarithms only if it could with its word's bound.
fn gumbel_argmax(
    keys: &[u32],
    s_max: f32,
    argmax: u32,
    threshold: u32,
    seed: u64,
    pos: u32,
) -> u32 {
    let mut best_i = argmax;
    let mut best = s_max + token_noise(seed, pos, argmax);
    for (group, chunk) in keys.chunks(4).enumerate() {
        let could = |key: u32, best: f32| key >= threshold && value_of(key) + NOISE_MAX >= best;
        if !chunk.iter().any(|&key| could(key, best)) {
            continue;
        }
        let words = noise_words(seed, pos, group as u32);
        for (j, &key) in chunk.iter().enumerate() {
            let s = value_of(key);
            if key < threshold || s + noise_bound(words[j]) < best {
                continue;
            }
            let v = s + gumbel(words[j]);
            let i = (group * 4 + j) as u32;
            if v > best || (v == best && i < best_i) {
                best = v;
                best_i = i;
            }
        }
    }
    best_i
}
