//! The paged decode attention kernel: one query per sequence over its paged
//! K/V context, read in place through the block table.
//!
//! One cube per (head, sequence), `warps` warps. A warp is split into groups
//! of `lanes_per_pos` lanes; a group takes one position at a time and each of
//! its lanes loads `vectors_per_lane` 16-byte vectors of that position's K
//! (or V) row, so a warp reads whole rows with wide, coalesced loads
//! (head_dim 64 in f16: 8 lanes per position, 4 positions per warp per
//! round). The three passes:
//!
//! 1. scores: each lane dots its slice of the row with its slice of the
//!    (pre-scaled) query, a `plane_shuffle_xor` butterfly sums the group, the
//!    score goes to shared memory; the max is reduced over the cube;
//! 2. `exp(s - max)` in shared memory, the sum reduced over the cube;
//! 3. each lane accumulates `p * V` for its slice in registers over its
//!    group's positions, a butterfly across the groups of the warp gives the
//!    warp's partial, and the warps' partials are added in shared memory.
//!
//! Every loop that contains a shuffle runs the same number of rounds on all
//! lanes of a warp (positions past the length are masked, not skipped), as
//! `__shfl_xor_sync` needs.

use cubecl::prelude::*;

/// See the module doc. `qkv` `[B, 3E]`, caches `[H, S, D]`, both read as
/// vectors of `N` (`vs` elements; `width = vectors_per_lane * vs` per lane); `tables` `[B, W]`, `lens` `[B]`; `out` `[B, E]` contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_attention_kernel<F: Float, I: Numeric, N: Size>(
    qkv: &Tensor<Vector<F, N>>,
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    tables: &Tensor<I>,
    lens: &Tensor<I>,
    out: &mut Tensor<F>,
    scale: f32,
    #[comptime] block_size: usize,
    #[comptime] head_dim: usize,
    #[comptime] max_context: usize,
    #[comptime] warps: usize,
    #[comptime] lanes_per_pos: usize,
    #[comptime] vectors_per_lane: usize,
    #[comptime] vs: usize,
    #[comptime] width: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let h = CUBE_POS_X as usize;
    let b = CUBE_POS_Y as usize;
    let lane = UNIT_POS_X as usize;
    let warp = UNIT_POS_Y as usize;
    let tid = warp * 32 + lane;
    let threads = warps * 32;
    let group = lane / lanes_per_pos;
    let sub = lane % lanes_per_pos;
    let groups_per_warp = 32 / lanes_per_pos;
    let round = warps * groups_per_warp;
    let e = k_cache.shape(0) * head_dim;
    let mut len = u32::cast_from(lens[b * lens.stride(0)]) as usize;
    if len > max_context {
        len = max_context;
    }
    let mut p = Shared::<[f32]>::new_slice(max_context);
    let mut per_warp = Shared::<[f32]>::new_slice(warps);
    let mut partial = Shared::<[f32]>::new_slice(warps * head_dim);

    // This lane's slice of the query, pre-scaled, in registers.
    let mut q = Array::<f32>::new(width);
    let q_base = (b * qkv.stride(0) + h * head_dim) / vs + sub * vectors_per_lane;
    #[unroll]
    for c in 0..vectors_per_lane {
        let v = qkv[q_base + c];
        #[unroll]
        for j in 0..vs {
            q[c * vs + j] = f32::cast_from(v.extract(j)) * scale;
        }
    }

    // Pass 1: scores and the max.
    let table_row = b * tables.stride(0);
    let k_head = h * k_cache.stride(0);
    let mut m = f32::new(-1.0e30);
    let mut t0 = warp * groups_per_warp;
    while t0 < len {
        let t = t0 + group;
        let mut s = f32::new(0.0);
        if t < len {
            let block = u32::cast_from(tables[table_row + (t / block_size) * tables.stride(1)]);
            let slot = block as usize * block_size + t % block_size;
            let base = (k_head + slot * k_cache.stride(1)) / vs + sub * vectors_per_lane;
            #[unroll]
            for c in 0..vectors_per_lane {
                let k = k_cache[base + c];
                #[unroll]
                for j in 0..vs {
                    s += q[c * vs + j] * f32::cast_from(k.extract(j));
                }
            }
        }
        let mut mask = 1u32;
        while mask < comptime!(lanes_per_pos as u32) {
            s += plane_shuffle_xor(s, mask);
            mask *= 2;
        }
        if t < len {
            if sub == 0 {
                p[t] = s;
            }
            if s > m {
                m = s;
            }
        }
        t0 += round;
    }
    let warp_max = plane_max(m);
    if lane == 0 {
        per_warp[warp] = warp_max;
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

    // Pass 2: exponentials and their sum.
    let mut sum = f32::new(0.0);
    let mut t = tid;
    while t < len {
        let e_t = (p[t] - m).exp();
        p[t] = e_t;
        sum += e_t;
        t += threads;
    }
    let warp_sum = plane_sum(sum);
    if lane == 0 {
        per_warp[warp] = warp_sum;
    }
    sync_cube();
    let mut total = f32::new(0.0);
    #[unroll]
    for w in 0..warps {
        total += per_warp[w];
    }

    // Pass 3: this lane's slice of sum(p * V) over its group's positions.
    let v_head = h * v_cache.stride(0);
    let mut acc = Array::<f32>::new(width);
    #[unroll]
    for i in 0..width {
        acc[i] = f32::new(0.0);
    }
    t0 = warp * groups_per_warp;
    while t0 < len {
        let t = t0 + group;
        if t < len {
            let block = u32::cast_from(tables[table_row + (t / block_size) * tables.stride(1)]);
            let slot = block as usize * block_size + t % block_size;
            let base = (v_head + slot * v_cache.stride(1)) / vs + sub * vectors_per_lane;
            let weight = p[t];
            #[unroll]
            for c in 0..vectors_per_lane {
                let v = v_cache[base + c];
                #[unroll]
                for j in 0..vs {
                    acc[c * vs + j] += weight * f32::cast_from(v.extract(j));
                }
            }
        }
        t0 += round;
    }
    // Butterfly across the groups of the warp (lanes with the same `sub`).
    #[unroll]
    for i in 0..width {
        let mut mask = 16u32;
        while mask >= comptime!(lanes_per_pos as u32) {
            acc[i] += plane_shuffle_xor(acc[i], mask);
            mask /= 2;
        }
    }
    if group == 0 {
        #[unroll]
        for i in 0..width {
            partial[warp * head_dim + sub * width + i] = acc[i];
        }
    }
    sync_cube();
    let mut d = tid;
    while d < head_dim {
        let mut v = f32::new(0.0);
        #[unroll]
        for w in 0..warps {
            v += partial[w * head_dim + d];
        }
        out[b * e + h * head_dim + d] = F::cast_from(v / total);
        d += threads;
    }
}
