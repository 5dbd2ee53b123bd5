//! Pass 4 of [`super::sample_rows_kernel`], the Gumbel-max choice over the
//! kept keys, and the masses its rejection test reads (the module doc of
//! `super` explains both).

use cubecl::prelude::*;

use super::noise::{gumbel, noise_bound, philox};
use crate::ops::cuda::kernels::reduce::{cube_reduce, value_of, OP_MAX, OP_MIN};
use crate::ops::row_params::NOISE_MAX;

/// This unit's share of `Z`, the mass `exp(s - s_max)` of the keys `>=
/// in_k` (the same terms as `search::histogram`'s), into `out[0]`, and of
/// the mass of those `> above` into `out[1]`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn unit_masses(
    keys: &Shared<[u32]>,
    out: &mut Array<f32>,
    in_k: u32,
    above: u32,
    s_max: f32,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) {
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let mut z = f32::new(0.0);
    let mut m = f32::new(0.0);
    let mut i = tid;
    while i < vocab {
        let key = keys[i];
        if key >= in_k {
            let w = (value_of(key) - s_max).exp();
            z += w;
            if key > above {
                m += w;
            }
        }
        i += comptime!(warps * 32);
    }
    out[0] = z;
    out[1] = m;
}

/// Pass 4 (module doc): the argmax of `s_i + g_i` over the keys `>=
/// threshold` (which keeps `argmax`), lowest index on ties.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn choose(
    keys: &Shared<[u32]>,
    red_u: &mut Shared<[u32]>,
    red_f: &mut Shared<[f32]>,
    s_max: f32,
    argmax: u32,
    threshold: u32,
    pos: u32,
    seed_lo: u32,
    seed_hi: u32,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
) -> u32 {
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let mut words = Array::<u32>::new(4usize);
    let mut group_keys = Array::<u32>::new(4usize);
    philox(&mut words, pos, argmax / 4, seed_lo, seed_hi);
    let mut best = s_max + gumbel(words[(argmax % 4) as usize]);
    let mut best_index = argmax;
    let noise_max = comptime!(NOISE_MAX);
    let mut c = tid;
    while c < comptime!(vocab.div_ceil(4)) {
        let mut could = false;
        #[unroll]
        for j in 0..4usize {
            let i = c * 4 + j;
            let mut key = 0u32;
            if i < vocab {
                key = keys[i];
            }
            group_keys[j] = key;
            could = could || (key >= threshold && value_of(key) + noise_max >= best);
        }
        if could {
            philox(&mut words, pos, c as u32, seed_lo, seed_hi);
            #[unroll]
            for j in 0..4usize {
                let key = group_keys[j];
                let s = value_of(key);
                if key >= threshold && s + noise_bound(words[j]) >= best {
                    let v = s + gumbel(words[j]);
                    let i = (c * 4 + j) as u32;
                    if v > best || (v == best && i < best_index) {
                        best = v;
                        best_index = i;
                    }
                }
            }
        }
        c += comptime!(warps * 32);
    }
    let top = cube_reduce(best, red_f, OP_MAX, warps);
    let holder = select(best == top, best_index, 0xFFFF_FFFFu32);
    cube_reduce(holder, red_u, OP_MIN, warps)
}
