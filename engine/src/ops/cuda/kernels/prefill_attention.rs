//! Causal prefill attention on tensor cores over a step's segments: queries
//! straight from the fused `qkv` projection, keys and values straight from
//! the paged cache. No gather, no mask tensor, no `[Q, T]` scores in global
//! memory.
//!
//! A prefill step is one flat sequence of `T` new tokens (`qkv` `[T, 3E]`);
//! row `r` of the step owns the tokens `cu_seqlens[r] .. cu_seqlens[r + 1]`,
//! whose query `i` sits at position `start[r] + i` of its sequence and sees
//! positions `0 ..= start[r] + i`. Their K/V, the step's own included
//! (written first, in every layer), are in the `[H, S, D]` caches, found
//! through the row's block table. A fresh prompt (`start = 0`), a chunk after
//! earlier chunks and a prefix-cache hit are the same case.
//!
//! One cube per (tile, head), 4 warps of 16 queries each. A tile is up to 64
//! consecutive queries of one row (`tiles`: `(row, first query)` pairs
//! planned on the host, `crate::ops::plan::prefill_tiles`), so no cube
//! straddles two rows; a padding tile's first query is past its row's end
//! and its cube returns at once. The cube stages its Q tile, then the keys
//! its last query sees in 64-position chunks of K (and V) in shared memory,
//! each row looked up through the block table (positions past the tile's
//! last visible one read position 0's row: finite values that get weight
//! 0), with 16-byte loads and shared stores by all four warps. Each warp keeps its Q rows as four 16x16 `wmma` A fragments and
//! walks the chunks once, with an online softmax (flash attention):
//!
//! 1. `S = Q K^T` (16 x 64) goes to the warp's shared score tile, where two
//!    lanes per row (32 columns each) update the row's max and sum of `exp`
//!    and write `P = exp(S - max)` (0 past the query's position, f16);
//! 2. `P V` goes through fresh accumulators back to the score tile, and each
//!    lane folds it into its 32 values of `O`, held in registers, after
//!    rescaling them to the new max (`wmma` accumulators cannot be scaled
//!    per row in place, so `O` does not live in fragments).
//!
//! (Those steps are in `super::prefill_chunk`.) Position 0, in the first
//! chunk, is visible to every query, so every row's max is finite from the
//! first chunk on. At the end each lane divides its `O` by the row's sum
//! into its warp's P tile, and the warp copies its real queries' rows out in
//! 16-byte vectors into `out` `[T, E]`, which starts zeroed: padding tokens
//! (in no row) stay 0. Shared tiles have padded rows (`LD`, `SLD`) against
//! bank conflicts.
//!
//! Tried and measured slower (H200, 2026-11-29): sharing a short prompt's
//! key chunks among several cubes and merging their partial outputs in a
//! second kernel (flash-decoding's split) left the kernel at 24 us a layer
//! at GPT-2 1 x 256 (the partial writes cost what the shorter chains saved)
//! and added a 5 us merge.
//!
//! The tiles are 64 dimensions wide; a head dimension below 64 (the tiny
//! test model's 16, any model's up to 64) is staged padded: Q's padding
//! columns are zeros, so K's (real values from column 0) add nothing to
//! `S`; those of V give columns of `O` that are never written. So every head dimension up to 64 runs on
//! this one kernel, none on the autotuned tensor-op path.

use cubecl::prelude::*;

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn::prelude::Shape;
use burn_cubecl::tensor::CubeTensor;

use super::prefill_chunk::{load_a, rescale_add_pv, scores, softmax_chunk, SLD};
pub use super::prefill_stage::PREFILL_WARPS;
use super::prefill_stage::{stage, stage_paged, KeyChunk, LD};
use crate::ops::cuda::extension::cuda_kernel;
use crate::ops::cuda::launch::{vector_size, zeros_contiguous};

/// See the module doc. `qkv` `[T, 3E]` and the caches `[H, S, D]` read as
/// vectors of `vs` elements; `out` `[T, E]` contiguous and zeroed; `D =
/// head_dim <= 64`. `CUBE_POS_X` picks the tile, `CUBE_POS_Y` the head.
#[cube(launch, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub fn prefill_attention_kernel<F: Float, I: Numeric, N: Size>(
    qkv: &Tensor<Vector<F, N>>,
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    tables: &Tensor<I>,
    cu_seqlens: &Tensor<I>,
    starts: &Tensor<I>,
    tiles: &Tensor<I>,
    out: &mut Tensor<Vector<F, N>>,
    scale: f32,
    #[comptime] n_embd: usize,
    #[comptime] head_dim: usize,
    #[comptime] block_size: usize,
    #[comptime] vs: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let warp = UNIT_POS_Y as usize;
    let lane = UNIT_POS_X as usize;
    let tile_at = CUBE_POS_X as usize * tiles.stride(0);
    let row = u32::cast_from(tiles[tile_at]) as usize;
    let q0 = u32::cast_from(tiles[tile_at + tiles.stride(1)]) as usize;
    let first = u32::cast_from(cu_seqlens[row]) as usize;
    let len = u32::cast_from(cu_seqlens[row + 1]) as usize - first;
    if q0 >= len {
        // A padding tile (the whole cube returns: no barrier is left waiting).
        terminate!();
    }
    let start = u32::cast_from(starts[row]) as usize;
    let head = CUBE_POS_Y as usize;
    let col = head * head_dim;
    // The tile's queries: flat rows `first + q0 ..`, `n_q` of them real, at
    // positions `start + q0 ..`; the last one sees the first `visible`.
    let n_q = select(len - q0 < 64, len - q0, 64usize);
    let visible = start + q0 + n_q;
    let table = row * tables.stride(0);
    let mut q_s = Shared::<[Vector<F, N>]>::new_slice(comptime!(64 * LD / vs));
    let mut k_s = Shared::<[Vector<F, N>]>::new_slice(comptime!(64 * LD / vs));
    let mut v_s = Shared::<[Vector<F, N>]>::new_slice(comptime!(64 * LD / vs));
    let mut s_s = Shared::<[f32]>::new_slice(comptime!(PREFILL_WARPS * 16 * SLD));
    let s_tile = warp * comptime!(16 * SLD);
    let (row0, row_end) = (first + q0, first + len);
    stage(qkv, &mut q_s, row0, row_end, col, n_embd, head_dim, vs);
    sync_cube();
    let q_at = warp * comptime!(16 * LD);
    let qa0 = load_a(&q_s, q_at);
    let qa1 = load_a(&q_s, q_at + 16);
    let qa2 = load_a(&q_s, q_at + 32);
    let qa3 = load_a(&q_s, q_at + 48);
    // Once in fragments, the warp's Q rows make room for its P tile (at `q_at`).
    let mut p_s = q_s;
    // This lane's share of the warp's rows: row `r`, columns `c0..c0 + 32`;
    // its slice of `O` lives in registers.
    let r = lane / 2;
    let c0 = (lane % 2) * 32;
    let local = warp * 16 + r;
    let query_pos = start + q0 + local;
    let at = s_tile + r * SLD + c0;
    let mut o = filled(32usize, f32::new(0.0));
    // The row's running max and sum of `exp` (online softmax).
    let mut ml = softmax_start();
    // Every key chunk the tile's last query sees (`visible >= 1`).
    let chunks = (visible - 1) / 64 + 1;
    for ch in 0..chunks {
        sync_cube();
        let chunk = KeyChunk {
            table,
            pos0: ch * 64,
            visible,
            head,
        };
        stage_paged(
            k_cache, v_cache, tables, &chunk, &mut k_s, &mut v_s, head_dim, block_size, vs,
        );
        sync_cube();
        scores(&k_s, &mut s_s, s_tile, &qa0, &qa1, &qa2, &qa3);
        sync_plane();
        let (p_at, key0) = (q_at + r * LD + c0, ch * 64 + c0);
        let alpha = softmax_chunk(
            &s_s, &mut p_s, &mut ml, at, p_at, key0, query_pos, scale, vs,
        );
        sync_plane();
        rescale_add_pv(&v_s, &p_s, &mut s_s, &mut o, s_tile, q_at, at, alpha);
    }
    // The warp's rows, normalized, through its P tile (no longer read)
    // into `out`: whole 16-byte vectors, a row's 128 bytes together.
    let rows = OutRows {
        token0: first + q0 + warp * 16,
        count: select(n_q > warp * 16, n_q - warp * 16, 0usize),
        col,
    };
    let inv_l = f32::new(1.0) / ml[1];
    write_rows(
        out, &mut p_s, &o, inv_l, q_at, r, c0, &rows, n_embd, head_dim, vs,
    );
}

/// The online softmax's state before any key: max `-1e30`, sum 0.
#[cube]
fn softmax_start() -> Array<f32> {
    let mut ml = Array::<f32>::new(2usize);
    ml[0] = f32::new(-1.0e30);
    ml[1] = f32::new(0.0);
    ml
}

/// A new array of `n` copies of `value`.
#[cube]
fn filled(#[comptime] n: usize, value: f32) -> Array<f32> {
    let mut a = Array::<f32>::new(n);
    #[unroll]
    for j in 0..n {
        a[j] = value;
    }
    a
}

/// Where a warp's output rows go: flat tokens `token0 ..`, `count` of them
/// real, from column `col` of `out`.
#[derive(CubeType)]
struct OutRows {
    token0: usize,
    count: usize,
    col: usize,
}

/// Writes the warp's 16 output rows into `out` `[T, E]`: this lane's 32
/// values of `O` (row `r`, columns from `c0`) times `inv_l` go into the
/// warp's tile (`tile` from element `tile_at`, row stride `LD`),
/// then the lanes copy the tile's real rows (`rows`) out in vectors of
/// `vs`, the columns below `head_dim`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_rows<F: Float, N: Size>(
    out: &mut Tensor<Vector<F, N>>,
    tile: &mut Shared<[Vector<F, N>]>,
    o: &Array<f32>,
    inv_l: f32,
    tile_at: usize,
    r: usize,
    c0: usize,
    rows: &OutRows,
    #[comptime] n_embd: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    #[unroll]
    for g in 0..comptime!(32 / vs) {
        let mut packed = Vector::<F, N>::empty();
        #[unroll]
        for k in 0..vs {
            packed.insert(k, F::cast_from(o[comptime!(g * vs + k)] * inv_l));
        }
        tile[(tile_at + r * LD + c0 + comptime!(g * vs)) / vs] = packed;
    }
    sync_plane();
    let lane = UNIT_POS_X as usize;
    let per_row = comptime!(64 / vs);
    #[unroll]
    for i in 0..comptime!(16 * 64 / vs / 32) {
        let v = lane + i * 32;
        let (row, c) = (v / per_row, (v % per_row) * vs);
        if row < rows.count && c < head_dim {
            out[((rows.token0 + row) * n_embd + rows.col + c) / vs] =
                tile[(tile_at + row * LD + c) / vs];
        }
    }
}

cuda_kernel! {
    /// Causal prefill attention over a step's segments of the flat `qkv`
    /// (`[T, 3E]`, head_dim up to 64): row `r`'s queries are `cu_seqlens[r] ..
    /// cu_seqlens[r + 1]` at positions from `starts[r]`, its keys and values
    /// read from the layer's `[H, S, D]` storage through `tables` (`[R, W]`,
    /// blocks of `block_size`); one cube per `tiles` entry (`[n, 2]`: row,
    /// first query) and head. Returns `[T, E]`, padding tokens 0.
    #[fusion(dtype = qkv, shape = { let [n, e3] = qkv.dims::<2>(); Shape::new([n, e3 / 3]) })]
    pub fn PrefillAttention::prefill_attention(
        qkv: Tensor<2>,
        #[in_place] k_cache: Tensor<3>,
        #[in_place] v_cache: Tensor<3>,
        // The 2-D operands are read at their strides: CUDA pitches a narrow
        // tensor's rows (the `[n, 2]` tiles), and a copy to contiguous would
        // cost a launch in every layer.
        #[in_place] tables: Tensor<2, Int>,
        cu_seqlens: Tensor<1, Int>,
        starts: Tensor<1, Int>,
        #[in_place] tiles: Tensor<2, Int>,
        block_size: usize,
    ) -> Tensor<2>
}

/// Launches [`prefill_attention_kernel`]: one cube per entry of `tiles` and
/// head, over contiguous `qkv` `[T, 3E]` and the `[H, S, D]` caches (blocks
/// of `block_size`), with the segments' `tables`, `cu_seqlens` and `starts`
/// (see [`prefill_attention`]). Returns `[T, E]`, zeroed where no tile
/// writes.
#[allow(clippy::too_many_arguments)]
pub fn launch(
    qkv: CubeTensor,
    k_cache: CubeTensor,
    v_cache: CubeTensor,
    tables: CubeTensor,
    cu_seqlens: CubeTensor,
    starts: CubeTensor,
    tiles: CubeTensor,
    block_size: usize,
) -> CubeTensor {
    let [rows, e3] = qkv.shape().dims::<2>();
    let e = e3 / 3;
    let cache_strides = k_cache.meta.strides();
    let [heads, _, head_dim] = k_cache.shape().dims::<3>();
    assert!(
        cache_strides[2] == 1
            && v_cache.meta.strides() == cache_strides
            && heads * head_dim == e
            && head_dim <= 64,
        "prefill attention: the K/V caches must be row-major [H, S, D] storage, D <= 64"
    );
    let [n_tiles, _] = tiles.shape().dims::<2>();
    // The kernel writes each real query's row; padding tokens stay 0.
    let out = zeros_contiguous(&qkv, [rows, e]);
    if n_tiles == 0 {
        return out; // padding only (an unbucketed warmup step)
    }
    let (f, i) = (qkv.dtype, tables.dtype);
    let vs = vector_size(&qkv, &[head_dim, e3, cache_strides[0], cache_strides[1]]);
    prefill_attention_kernel::launch(
        &qkv.client,
        CubeCount::Static(n_tiles as u32, heads as u32, 1),
        CubeDim::new_2d(32, PREFILL_WARPS as u32),
        vs,
        qkv.clone().into_tensor_arg(),
        k_cache.into_tensor_arg(),
        v_cache.into_tensor_arg(),
        tables.into_tensor_arg(),
        cu_seqlens.into_tensor_arg(),
        starts.into_tensor_arg(),
        tiles.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        1.0 / (head_dim as f32).sqrt(),
        e,
        head_dim,
        block_size,
        vs,
        [dtype_to_storage_type(f), dtype_to_storage_type(i)],
    );
    out
}
