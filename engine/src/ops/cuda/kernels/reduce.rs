//! Cube-wide reductions the kernels share (each warp reduces with plane
//! operations, then the warps meet in shared memory, in a fixed order), and
//! the order-preserving u32 key of an f32 that the sampling and vocabulary
//! kernels compare and reduce instead of floats.

use cubecl::prelude::*;

/// Component `d` of the cube's `sum(p V)`: the warps' rows of `partial` added.
#[cube]
pub fn sum_warps(
    partial: &Shared<[f32]>,
    d: usize,
    #[comptime] warps: usize,
    #[comptime] head_dim: usize,
) -> f32 {
    let mut v = f32::new(0.0);
    #[unroll]
    for w in 0..warps {
        v += partial[w * head_dim + d];
    }
    v
}

/// Cube-wide reductions' operations (comptime).
pub const OP_MAX: u32 = 0;
pub const OP_MIN: u32 = 1;
pub const OP_SUM: u32 = 2;

/// `op` of every unit's `v` over the cube, in a fixed order: each warp
/// reduces with a plane operation, its lane 0 writes the result to
/// `scratch` (one entry per warp), and every unit combines those in warp
/// order, so every unit returns the same value. `scratch` is reusable on
/// return. The one cube reduction of the kernels, for u32 keys and counts
/// and f32 values alike.
#[cube]
pub fn cube_reduce<N: Numeric>(
    v: N,
    scratch: &mut Shared<[N]>,
    #[comptime] op: u32,
    #[comptime] warps: usize,
) -> N {
    let mut w = v;
    if comptime![op == OP_MAX] {
        w = plane_max(v);
    }
    if comptime![op == OP_MIN] {
        w = plane_min(v);
    }
    if comptime![op == OP_SUM] {
        w = plane_sum(v);
    }
    if UNIT_POS_X == 0 {
        scratch[UNIT_POS_Y as usize] = w;
    }
    sync_cube();
    let mut r = scratch[0];
    #[unroll]
    for i in 1..warps {
        let x = scratch[i];
        if comptime![op == OP_MAX] {
            r = select(x > r, x, r);
        }
        if comptime![op == OP_MIN] {
            r = select(x < r, x, r);
        }
        if comptime![op == OP_SUM] {
            r += x;
        }
    }
    sync_cube();
    r
}

/// The order-preserving key of `s` (`-0` made `+0`; `row_sampler::key_of`).
#[cube]
pub fn key_of(s: f32) -> u32 {
    let mut bits = u32::reinterpret(s);
    if bits == 0x8000_0000u32 {
        bits = 0u32;
    }
    let mut key = bits | 0x8000_0000u32;
    if bits >= 0x8000_0000u32 {
        key = !bits;
    }
    key
}

/// The f32 whose key is `key` (`row_sampler::value_of`).
#[cube]
pub fn value_of(key: u32) -> f32 {
    let mut bits = !key;
    if key >= 0x8000_0000u32 {
        bits = key & 0x7FFF_FFFFu32;
    }
    f32::reinterpret(bits)
}
