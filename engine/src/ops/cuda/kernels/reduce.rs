//! Cube-wide reductions the attention kernel shares: each warp reduces with
//! plane operations, then the warps meet in shared memory.

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

/// The max of every unit's `v` over the cube (`per_warp` is scratch).
#[cube]
pub fn cube_max(v: f32, per_warp: &mut Shared<[f32]>, #[comptime] warps: usize) -> f32 {
    let warp_max = plane_max(v);
    if UNIT_POS_X == 0 {
        per_warp[UNIT_POS_Y as usize] = warp_max;
    }
    sync_cube();
    let mut m = per_warp[0];
    #[unroll]
    for w in 1..warps {
        let other = per_warp[w];
        if other > m {
            m = other;
        }
    }
    sync_cube();
    m
}

/// The sum of every unit's `v` over the cube (`per_warp` is scratch; not
/// reusable before the next `sync_cube`).
#[cube]
pub fn cube_sum(v: f32, per_warp: &mut Shared<[f32]>, #[comptime] warps: usize) -> f32 {
    let warp_sum = plane_sum(v);
    if UNIT_POS_X == 0 {
        per_warp[UNIT_POS_Y as usize] = warp_sum;
    }
    sync_cube();
    let mut total = f32::new(0.0);
    #[unroll]
    for w in 0..warps {
        total += per_warp[w];
    }
    total
}
