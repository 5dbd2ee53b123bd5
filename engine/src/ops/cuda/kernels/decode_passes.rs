//! The three passes of the paged decode attention kernel
//! ([`super::attention`]) over a cube's chunk of positions `lo..hi`: the
//! scores (K rows), their exponentials, and the weighted sum of the V rows.
//! Both row passes walk the chunk two positions a round per lane group, the
//! rows read in place through the sequence's block table.

use cubecl::prelude::*;

/// Pass 2 over positions `lo..hi`: `p[t] = exp(p[t] - m)`; returns this
/// unit's sum of them.
#[cube]
pub fn exponentials(
    p: &mut Shared<[f32]>,
    m: f32,
    lo: usize,
    hi: usize,
    #[comptime] warps: usize,
) -> f32 {
    let mut sum = f32::new(0.0);
    let mut t = lo + (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    while t < hi {
        let e_t = (p[t] - m).exp();
        p[t] = e_t;
        sum += e_t;
        t += comptime!(warps * 32);
    }
    sum
}

/// The cache slot of position `t` of sequence `b`, through its block table.
#[cube]
fn slot_of<I: Numeric>(
    tables: &Tensor<I>,
    b: usize,
    t: usize,
    #[comptime] block_size: usize,
) -> usize {
    let block = u32::cast_from(tables[b * tables.stride(0) + (t / block_size) * tables.stride(1)]);
    block as usize * block_size + t % block_size
}

/// Pass 1 over positions `lo..hi`: the scores into `p[t]`; returns this
/// lane's max (`-1e30` if it saw none). Each group takes two positions a
/// round (`ta`, and `tb` one cube-round later), both rows' loads issued
/// before the shuffles, so twice the bytes are in flight per warp; a
/// position past `hi` reads position `lo` instead and is dropped. `k_cache`
/// is `mut` only because the kernel that passes it writes it (CubeCL does
/// not reborrow).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn scores<F: Float, I: Numeric, N: Size>(
    q: &Array<f32>,
    k_cache: &mut Tensor<Vector<F, N>>,
    tables: &Tensor<I>,
    p: &mut Shared<[f32]>,
    b: usize,
    h: usize,
    lo: usize,
    hi: usize,
    #[comptime] block_size: usize,
    #[comptime] warps: usize,
    #[comptime] lanes_per_pos: usize,
    #[comptime] vectors_per_lane: usize,
    #[comptime] vs: usize,
) -> f32 {
    let lane = UNIT_POS_X as usize;
    let group = lane / lanes_per_pos;
    let sub = lane % lanes_per_pos;
    let groups_per_warp = comptime!(32 / lanes_per_pos);
    let round = comptime!(warps * (32 / lanes_per_pos));
    let k_head = h * k_cache.stride(0);
    let mut m = f32::new(-1.0e30);
    let mut t0 = lo + UNIT_POS_Y as usize * groups_per_warp;
    while t0 < hi {
        let ta = t0 + group;
        let tb = ta + round;
        let (a_ok, b_ok) = (ta < hi, tb < hi);
        let row_a = key_row(
            k_cache,
            tables,
            b,
            select(a_ok, ta, lo),
            k_head,
            sub,
            block_size,
            vectors_per_lane,
            vs,
        );
        let row_b = key_row(
            k_cache,
            tables,
            b,
            select(b_ok, tb, lo),
            k_head,
            sub,
            block_size,
            vectors_per_lane,
            vs,
        );
        let mut sa = f32::new(0.0);
        let mut sb = f32::new(0.0);
        #[unroll]
        for c in 0..vectors_per_lane {
            let ka = k_cache[row_a + c];
            let kb = k_cache[row_b + c];
            #[unroll]
            for j in 0..vs {
                sa += q[c * vs + j] * f32::cast_from(ka.extract(j));
                sb += q[c * vs + j] * f32::cast_from(kb.extract(j));
            }
        }
        let mut mask = 1u32;
        while mask < comptime!(lanes_per_pos as u32) {
            sa += plane_shuffle_xor(sa, mask);
            sb += plane_shuffle_xor(sb, mask);
            mask *= 2;
        }
        if a_ok {
            if sub == 0 {
                p[ta] = sa;
            }
            if sa > m {
                m = sa;
            }
        }
        if b_ok {
            if sub == 0 {
                p[tb] = sb;
            }
            if sb > m {
                m = sb;
            }
        }
        t0 += comptime!(2 * warps * (32 / lanes_per_pos));
    }
    m
}

/// The first vector of this lane's slice of position `t`'s row in `cache`
/// (head offset `head`), through sequence `b`'s block table.
#[cube]
#[allow(clippy::too_many_arguments)]
fn key_row<F: Float, I: Numeric, N: Size>(
    cache: &mut Tensor<Vector<F, N>>,
    tables: &Tensor<I>,
    b: usize,
    t: usize,
    head: usize,
    sub: usize,
    #[comptime] block_size: usize,
    #[comptime] vectors_per_lane: usize,
    #[comptime] vs: usize,
) -> usize {
    let slot = slot_of(tables, b, t, block_size);
    (head + slot * cache.stride(1)) / vs + sub * vectors_per_lane
}

/// Pass 3 over positions `lo..hi`: `sum(p[t] * V[t])`, one row of `D` per
/// warp in `partial` (`[warps, D]`; the caller syncs before reading it).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn weighted_values<F: Float, I: Numeric, N: Size>(
    v_cache: &mut Tensor<Vector<F, N>>,
    tables: &Tensor<I>,
    p: &Shared<[f32]>,
    partial: &mut Shared<[f32]>,
    b: usize,
    h: usize,
    lo: usize,
    hi: usize,
    #[comptime] block_size: usize,
    #[comptime] warps: usize,
    #[comptime] lanes_per_pos: usize,
    #[comptime] vectors_per_lane: usize,
    #[comptime] vs: usize,
    #[comptime] width: usize,
) {
    let lane = UNIT_POS_X as usize;
    let warp = UNIT_POS_Y as usize;
    let group = lane / lanes_per_pos;
    let sub = lane % lanes_per_pos;
    let groups_per_warp = comptime!(32 / lanes_per_pos);
    let v_head = h * v_cache.stride(0);
    let mut acc = Array::<f32>::new(width);
    #[unroll]
    for i in 0..width {
        acc[i] = f32::new(0.0);
    }
    // Two positions a round per group, as in `scores` (a position past `hi`
    // reads position `lo` with weight 0).
    let round = comptime!(warps * (32 / lanes_per_pos));
    let mut t0 = lo + warp * groups_per_warp;
    while t0 < hi {
        let ta = t0 + group;
        let tb = ta + round;
        let (a_ok, b_ok) = (ta < hi, tb < hi);
        let (ta, tb) = (select(a_ok, ta, lo), select(b_ok, tb, lo));
        let row_a = key_row(
            v_cache,
            tables,
            b,
            ta,
            v_head,
            sub,
            block_size,
            vectors_per_lane,
            vs,
        );
        let row_b = key_row(
            v_cache,
            tables,
            b,
            tb,
            v_head,
            sub,
            block_size,
            vectors_per_lane,
            vs,
        );
        let wa = select(a_ok, p[ta], f32::new(0.0));
        let wb = select(b_ok, p[tb], f32::new(0.0));
        #[unroll]
        for c in 0..vectors_per_lane {
            let va = v_cache[row_a + c];
            let vb = v_cache[row_b + c];
            #[unroll]
            for j in 0..vs {
                acc[c * vs + j] +=
                    wa * f32::cast_from(va.extract(j)) + wb * f32::cast_from(vb.extract(j));
            }
        }
        t0 += comptime!(2 * warps * (32 / lanes_per_pos));
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
            partial[warp * comptime!(vectors_per_lane * vs * lanes_per_pos) + sub * width + i] =
                acc[i];
        }
    }
}
