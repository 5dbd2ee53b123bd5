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
/// columns from `col`) into `tile` (vectors of `vs`; row stride `LD`
/// elements), 16 bytes per load and per shared store, all the cube's
/// threads at once, every load issued before any value is stored. The
/// columns from `head_dim` to 64 become zeros (they meet the padding
/// columns of K, which [`stage_paged`] leaves holding real values); rows at
/// or past `row_end` repeat row `row0` (finite values whose outputs are
/// never written).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stage<F: Float, N: Size>(
    qkv: &Tensor<Vector<F, N>>,
    tile: &mut Shared<[Vector<F, N>]>,
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
    let mut vals = Array::<Vector<F, N>>::new(rounds);
    #[unroll]
    for i in 0..rounds {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        let (r, c) = (idx / per_row, (idx % per_row) * vs);
        let row = select(row0 + r < row_end, row0 + r, row0);
        let real = c < head_dim;
        let v = qkv[(row * comptime!(3 * n_embd) + col + select(real, c, 0usize)) / vs];
        vals[i] = select(real, v, Vector::<F, N>::zeroed());
    }
    #[unroll]
    for i in 0..rounds {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        tile[((idx / per_row) * LD + (idx % per_row) * vs) / vs] = vals[i];
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
/// into `k_tile` and `v_tile` (vectors of `vs`; row stride `LD` elements),
/// each position's slot looked up once in the block `tables`; 16 bytes per
/// load and per shared store, all the cube's threads at once. The table
/// entries are loaded together, then every K and V load is issued before
/// any value is stored: two memory round trips a chunk.
///
/// Nothing is zeroed, which is what keeps the chunk's instruction stream
/// short (a select and a repack per element were a quarter of the kernel's
/// stall samples, ncu 2026-11-29): a position at or past the chunk's
/// `visible` reads position 0's row and a column from `head_dim` on reads
/// column 0 (finite values at valid addresses). Those positions get
/// weight 0 in the softmax (no query sees them), so their values add `0 *
/// finite`; the padding columns of K meet Q's zeroed ones ([`stage`]), and
/// those of V make columns of `O` that are never written.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_paged<F: Float, I: Numeric, N: Size>(
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    tables: &Tensor<I>,
    chunk: &KeyChunk,
    k_tile: &mut Shared<[Vector<F, N>]>,
    v_tile: &mut Shared<[Vector<F, N>]>,
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
    let mut ks = Array::<Vector<F, N>>::new(rounds);
    let mut vals = Array::<Vector<F, N>>::new(rounds);
    #[unroll]
    for i in 0..rounds {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        let (pos, c) = (pos0 + idx / per_row, (idx % per_row) * vs);
        let at = select(pos < visible, pos, 0usize);
        let slot = blocks[i] as usize * block_size + at % block_size;
        let col = select(c < head_dim, c, 0usize);
        ks[i] = k_cache[(head * k_cache.stride(0) + slot * k_cache.stride(1) + col) / vs];
        vals[i] = v_cache[(head * v_cache.stride(0) + slot * v_cache.stride(1) + col) / vs];
    }
    #[unroll]
    for i in 0..rounds {
        let idx = tid + i * comptime!(32 * PREFILL_WARPS);
        let at = ((idx / per_row) * LD + (idx % per_row) * vs) / vs;
        k_tile[at] = ks[i];
        v_tile[at] = vals[i];
    }
}
