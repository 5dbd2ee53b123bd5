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
/// from `head_dim` to 64, become zeros.
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
    #[unroll]
    for i in 0..comptime!(64 * 64 / vs / (32 * PREFILL_WARPS)) {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        let r = idx / per_row;
        let c = (idx % per_row) * vs;
        let row = row0 + r;
        if row < row_end && c < head_dim {
            let v = qkv[(row * comptime!(3 * n_embd) + col + c) / vs];
            #[unroll]
            for j in 0..vs {
                tile[r * LD + c + j] = v.extract(j);
            }
        } else {
            #[unroll]
            for j in 0..vs {
                tile[r * LD + c + j] = F::new(0.0);
            }
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

/// Copies the K (or V) rows of `chunk` from the `[H, S, head_dim]` `cache`
/// into `tile` (row stride `LD`), each position's slot looked up in the
/// block `tables`; 16 bytes per load, all the cube's threads at once.
/// Positions at or past the chunk's `visible`, and the columns from
/// `head_dim` to 64, become zeros.
#[cube]
pub(super) fn stage_paged<F: Float, I: Numeric, N: Size>(
    cache: &Tensor<Vector<F, N>>,
    tables: &Tensor<I>,
    chunk: &KeyChunk,
    tile: &mut Shared<[F]>,
    #[comptime] head_dim: usize,
    #[comptime] block_size: usize,
    #[comptime] vs: usize,
) {
    let (table, pos0, visible, head) = (chunk.table, chunk.pos0, chunk.visible, chunk.head);
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let per_row = comptime!(64 / vs);
    let head_at = head * cache.stride(0);
    #[unroll]
    for i in 0..comptime!(64 * 64 / vs / (32 * PREFILL_WARPS)) {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        let r = idx / per_row;
        let c = (idx % per_row) * vs;
        let pos = pos0 + r;
        if pos < visible && c < head_dim {
            let entry = table + (pos / block_size) * tables.stride(1);
            let block = u32::cast_from(tables[entry]) as usize;
            let slot = block * block_size + pos % block_size;
            let v = cache[(head_at + slot * cache.stride(1) + c) / vs];
            #[unroll]
            for j in 0..vs {
                tile[r * LD + c + j] = v.extract(j);
            }
        } else {
            #[unroll]
            for j in 0..vs {
                tile[r * LD + c + j] = F::new(0.0);
            }
        }
    }
}
