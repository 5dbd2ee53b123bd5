//! The device side of the sampling noise and of the key order: the same
//! f32 and u32 operations, in the same order, as `crate::sampling::philox`
//! and `crate::sampling::row_sampler`, so both samplers give the same token
//! for the same logits (the key order itself is `super::super::reduce`'s).

use cubecl::prelude::*;

use crate::ops::row_params::{
    LN_2, NOISE_SLACK, PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1, STREAM_SAMPLE,
    TWO_POW_M32,
};

/// Philox4x32-10 of counter `[c0, c1, STREAM_SAMPLE, 0]` and key `[k0,
/// k1]`, into `out[0..4]` (the 32x32 -> 64-bit products as `mul_hi` and a
/// wrapping `*`).
#[cube]
pub fn philox(out: &mut Array<u32>, c0: u32, c1: u32, k0: u32, k1: u32) {
    let m0 = comptime!(PHILOX_M0);
    let m1 = comptime!(PHILOX_M1);
    let mut x0 = c0;
    let mut x1 = c1;
    let mut x2 = comptime!(STREAM_SAMPLE).runtime();
    let mut x3 = 0u32;
    let mut key0 = k0;
    let mut key1 = k1;
    #[unroll]
    for round in 0..PHILOX_ROUNDS {
        if comptime![round > 0] {
            key0 += comptime!(PHILOX_W0);
            key1 += comptime!(PHILOX_W1);
        }
        let hi0 = u32::mul_hi(m0, x0);
        let lo0 = m0 * x0;
        let hi1 = u32::mul_hi(m1, x2);
        let lo1 = m1 * x2;
        let y0 = hi1 ^ x1 ^ key0;
        let y2 = hi0 ^ x3 ^ key1;
        x0 = y0;
        x1 = lo1;
        x2 = y2;
        x3 = lo0;
    }
    out[0] = x0;
    out[1] = x1;
    out[2] = x2;
    out[3] = x3;
}

/// The Gumbel variate of word `x` (`crate::sampling::philox::gumbel`): the
/// lower half's `v` and the upper half's `w` are the same expression of `x`
/// and `!x`.
#[cube]
pub fn gumbel(x: u32) -> f32 {
    let upper = x >= 0x8000_0000u32;
    let word = select(upper, !x, x);
    let v = (f32::cast_from(word) + f32::new(0.5)) * comptime!(TWO_POW_M32);
    // Upper half: E = -ln(w).
    let mut e = -v.ln();
    if !upper {
        // Lower half: E = -ln(1 - v) by Goldberg's ln1p.
        let u = f32::new(1.0) - v;
        if u == f32::new(1.0) {
            e = v;
        } else {
            e = u.ln() * v / (u - f32::new(1.0));
        }
    }
    -e.ln()
}

/// An upper bound of `gumbel(x)` from `x`'s leading zeros
/// (`crate::sampling::philox::noise_bound`).
#[cube]
pub fn noise_bound(x: u32) -> f32 {
    f32::cast_from(x.leading_zeros() + 1) * comptime!(LN_2) + comptime!(NOISE_SLACK)
}
