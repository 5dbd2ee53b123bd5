//! Pass 1 of the sampling kernel (its module docs): one read of a row's
//! logits, biased and penalized where the row has a penalty slot, into the
//! keys the later passes search, with the row's max, argmax, min and count.

use cubecl::prelude::*;

use crate::ops::cuda::kernels::reduce::{cube_reduce, key_of, OP_MAX, OP_MIN, OP_SUM};
use crate::ops::row_params::COUNT_MASK;

/// Logits each unit loads at once in pass 1.
const UNROLL: usize = 8;

/// A row's penalties (`row_params`' module docs): `on` when it has a
/// penalty slot, whose counts start at `base` in the slot table (`[S, 2V]`);
/// `bias` when the slot also holds its logit bias (`V` further).
#[derive(CubeType)]
pub struct Penalty {
    pub on: bool,
    pub bias: bool,
    pub base: usize,
    pub repetition: f32,
    pub frequency: f32,
    pub presence: f32,
}

/// `l` with the penalties of a token whose counts-table entry is `entry`
/// (nonzero: the sequence has the token), in `crate::sampling::transforms`'
/// order and f32 operations.
#[cube]
fn penalized(l: f32, entry: u32, penalty: &Penalty) -> f32 {
    let count = entry & comptime!(COUNT_MASK);
    let mut x = l;
    if x > f32::new(0.0) {
        x /= penalty.repetition;
    } else {
        x *= penalty.repetition;
    }
    let mut subtract = penalty.frequency * f32::cast_from(count);
    if count > 0u32 {
        subtract += penalty.presence;
    }
    x - subtract
}

/// Pass 1 over row `row` (module doc): the keys of `l / temperature`
/// (`divide`) or `l` (biased, then penalized, first where `penalty.on`)
/// into `keys`, then
/// `stats` = [max key, lowest index of it (0 if nothing is present), min
/// key, count of present tokens].
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn scan_row<F: Float, I: Int>(
    logits: &Tensor<F>,
    allowed: &Tensor<I>,
    counts: &Tensor<I>,
    penalty: &Penalty,
    keys: &mut Shared<[u32]>,
    red_u: &mut Shared<[u32]>,
    stats: &mut Shared<[u32]>,
    row: usize,
    temperature: f32,
    divide: bool,
    masked: bool,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) {
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let threads = comptime!(warps * 32);
    let step = comptime!(warps * 32 * UNROLL);
    let base = row * logits.stride(0);
    let words_at = row * allowed.stride(0);
    let mut best_key = 0u32;
    let mut best_index = 0xFFFF_FFFFu32;
    let mut min_key = 0xFFFF_FFFFu32;
    let mut count = 0u32;
    let mut values = Array::<f32>::new(UNROLL);
    let mut entries = Array::<u32>::new(UNROLL);
    let mut biases = Array::<f32>::new(UNROLL);
    for r in 0..comptime!(vocab.div_ceil(warps * 32 * UNROLL)) {
        // All loads first (an index past the row reads its last logit).
        #[unroll]
        for u in 0..UNROLL {
            let i = r * step + u * threads + tid;
            let at = select(i < vocab, i, comptime!(vocab - 1));
            values[u] = f32::cast_from(logits[base + at]);
            entries[u] = 0u32;
            biases[u] = f32::new(0.0);
            if penalty.on {
                entries[u] = u32::cast_from(counts[penalty.base + at]);
            }
            if penalty.bias {
                let bits = u32::cast_from(counts[penalty.base + vocab + at]);
                biases[u] = f32::reinterpret(bits);
            }
        }
        #[unroll]
        for u in 0..UNROLL {
            let i = r * step + u * threads + tid;
            if i < vocab {
                let mut l = values[u];
                if penalty.bias {
                    l += biases[u];
                }
                if entries[u] != 0u32 {
                    l = penalized(l, entries[u], penalty);
                }
                let mut present = !l.is_nan();
                if masked {
                    let word = u32::cast_from(allowed[words_at + i / 32]);
                    present = present && ((word >> u32::cast_from(i % 32)) & 1u32) == 1u32;
                }
                let mut s = l;
                if divide {
                    s = l / temperature;
                }
                let mut key = 0u32;
                if present {
                    key = key_of(s);
                }
                keys[i] = key;
                // A unit's indices increase, so `>` keeps its lowest.
                if key > best_key {
                    best_key = key;
                    best_index = i as u32;
                }
                if key != 0u32 {
                    count += 1;
                    min_key = select(key < min_key, key, min_key);
                }
            }
        }
    }
    let key_max = cube_reduce(best_key, red_u, OP_MAX, warps);
    let holder = select(best_key == key_max, best_index, 0xFFFF_FFFFu32);
    let argmax = cube_reduce(holder, red_u, OP_MIN, warps);
    let key_min = cube_reduce(min_key, red_u, OP_MIN, warps);
    let present = cube_reduce(count, red_u, OP_SUM, warps);
    if tid == 0 {
        stats[0] = key_max;
        stats[1] = select(key_max == 0u32, 0u32, argmax);
        stats[2] = key_min;
        stats[3] = present;
    }
    sync_cube();
}
