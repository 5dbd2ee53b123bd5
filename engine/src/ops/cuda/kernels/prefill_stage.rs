//! The staging of the prefill attention kernel (`super::prefill_attention`,
//! its module docs): a tile of queries from the fused `qkv` projection, and
//! a chunk of keys or values from the paged cache, into shared memory, each
//! zero-padded to 64 rows of 64 dimensions.

use cubecl::prelude::*;

use crate::ops::plan::PREFILL_TILE;

/// Warps per cube, 16 queries each.
pub const PREFILL_WARPS: usize = PREFILL_TILE / 16;
/// Row stride of the f16 shared tiles (64 columns + 8 padding).
pub(super) const LD: usize = 72;

/// Copies 64 rows of `head_dim` columns of `qkv` (rows from `row0`,
/// columns from `col`) into `tile` (row stride `LD`), 16 bytes per load, all
/// the cube's threads at once; rows at or past `row_end`, and the columns
/// from `head_dim` to 64, become zeros. Every load is issued (at a valid
/// address) before any value is stored, so they are all in flight at once.
#[cube]
pub(super) fn stage<F: Float, N: Size>(
    qkv: &Tensor<Vector<F, N>>,
    tile: &mut Shared<[F]>,
    row0: usize,
    row_end: usize,
    col: usize,
    #[comptime] n_embd: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let per_row = comptime!(64 / vs);
    let rounds = comptime!(64 * 64 / vs / (32 * PREFILL_WARPS));
    let mut vals = Array::<F>::new(comptime!(rounds * vs));
    #[unroll]
    for i in 0..rounds {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        let (r, c) = (idx / per_row, (idx % per_row) * vs);
        let inside = row0 + r < row_end && c < head_dim;
        // Outside, the tile's first row and column: always real.
        let row = select(inside, row0 + r, row0);
        let v = qkv[(row * comptime!(3 * n_embd) + col + select(inside, c, 0usize)) / vs];
        #[unroll]
        for j in 0..vs {
            vals[i * vs + j] = select(inside, v.extract(j), F::new(0.0));
        }
    }
    store(tile, &vals, vs);
}

/// Stores this unit's staged values `vals` (`rounds` vectors of `vs`, in
/// the order [`stage`] and [`stage_paged`] load them) into `tile`.
#[cube]
fn store<F: Float>(tile: &mut Shared<[F]>, vals: &Array<F>, #[comptime] vs: usize) {
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let per_row = comptime!(64 / vs);
    #[unroll]
    for i in 0..comptime!(64 * 64 / vs / (32 * PREFILL_WARPS)) {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        let (r, c) = (idx / per_row, (idx % per_row) * vs);
        #[unroll]
        for j in 0..vs {
            tile[r * LD + c + j] = vals[i * vs + j];
        }
    }
}

/// A chunk of one row's keys (or values): positions `pos0 .. pos0 + 64`
/// of head `head`, those below `visible` real, found through the row's
/// block table (its entries from `table` in the tables).
#[derive(CubeType)]
pub struct KeyChunk {
    pub table: usize,
    pub pos0: usize,
    pub visible: usize,
    pub head: usize,
}

/// Copies the K and V rows of `chunk` from the `[H, S, head_dim]` caches
/// into `k_tile` and `v_tile` (row stride `LD`), each position's slot looked
/// up once in the block `tables`; 16 bytes per load, all the cube's threads
/// at once. Positions at or past the chunk's `visible`, and the columns from
/// `head_dim` to 64, become zeros. The table entries are loaded together,
/// then every K and V load is issued (at a valid address: position 0's slot
/// outside the chunk) before any value is stored: two memory round trips a
/// chunk. Loading under a branch, one position at a time, left each load
/// waiting for the last (up to 16 round trips a chunk).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_paged<F: Float, I: Numeric, N: Size>(
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    tables: &Tensor<I>,
    chunk: &KeyChunk,
    k_tile: &mut Shared<[F]>,
    v_tile: &mut Shared<[F]>,
    #[comptime] head_dim: usize,
    #[comptime] block_size: usize,
    #[comptime] vs: usize,
) {
    let (table, pos0, visible, head) = (chunk.table, chunk.pos0, chunk.visible, chunk.head);
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let per_row = comptime!(64 / vs);
    let rounds = comptime!(64 * 64 / vs / (32 * PREFILL_WARPS));
    let mut blocks = Array::<u32>::new(rounds);
    #[unroll]
    for i in 0..rounds {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        let pos = pos0 + idx / per_row;
        let at = select(pos < visible, pos, 0usize);
        blocks[i] = u32::cast_from(tables[table + (at / block_size) * tables.stride(1)]);
    }
    let mut ks = Array::<F>::new(comptime!(rounds * vs));
    let mut vals = Array::<F>::new(comptime!(rounds * vs));
    #[unroll]
    for i in 0..rounds {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        let (pos, c) = (pos0 + idx / per_row, (idx % per_row) * vs);
        let inside = pos < visible && c < head_dim;
        let at = select(inside, pos, 0usize);
        let slot = blocks[i] as usize * block_size + at % block_size;
        let k = k_cache[(head * k_cache.stride(0)
            + slot * k_cache.stride(1)
            + select(inside, c, 0usize))
            / vs];
        let v = v_cache[(head * v_cache.stride(0)
            + slot * v_cache.stride(1)
            + select(inside, c, 0usize))
            / vs];
        #[unroll]
        for j in 0..vs {
            ks[i * vs + j] = select(inside, k.extract(j), F::new(0.0));
            vals[i * vs + j] = select(inside, v.extract(j), F::new(0.0));
        }
    }
    store(k_tile, &ks, vs);
    store(v_tile, &vals, vs);
}
