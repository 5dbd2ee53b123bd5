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
//! last visible one read as zeros), with 16-byte loads shared by all four
//! warps. Each warp keeps its Q rows as four 16x16 `wmma` A fragments and
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
//! Position 0, in the first chunk, is visible to every query, so every
//! row's max is finite from the first chunk on. At the end each lane divides
//! its `O` by the row's sum and writes its real queries' rows, as `F`, into
//! `out` `[T, E]`, which starts zeroed: padding tokens (in no row) stay 0.
//! Shared tiles have padded rows (`LD`, `SLD`) against bank conflicts.
//!
//! The tiles are 64 dimensions wide; a head dimension below 64 (the tiny
//! test model's 16, any model's up to 64) is staged zero-padded: the
//! padding columns of Q and K add nothing to `S`, those of V give columns
//! of `O` that are never written. So every head dimension up to 64 runs on
//! this one kernel, none on the autotuned tensor-op path.

use cubecl::prelude::*;

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn::prelude::Shape;
use burn_cubecl::tensor::CubeTensor;

use super::mma::{fragment, zeroed_accumulator};
pub use super::prefill_stage::PREFILL_WARPS;
use super::prefill_stage::{stage, stage_paged, KeyChunk, LD};
use crate::ops::cuda::extension::cuda_kernel;
use crate::ops::cuda::launch::{vector_size, zeros_contiguous};

/// Row stride of the f32 score tiles (64 columns + 4 padding).
const SLD: usize = 68;

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
    out: &mut Tensor<F>,
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
    let mut n_q = len - q0;
    if n_q > 64 {
        n_q = 64;
    }
    let visible = start + q0 + n_q;
    let table = row * tables.stride(0);

    let mut q_s = Shared::<[F]>::new_slice(comptime!(64 * LD));
    let mut k_s = Shared::<[F]>::new_slice(comptime!(64 * LD));
    let mut v_s = Shared::<[F]>::new_slice(comptime!(64 * LD));
    let mut s_s = Shared::<[f32]>::new_slice(comptime!(PREFILL_WARPS * 16 * SLD));
    let s_tile = warp * comptime!(16 * SLD);

    let (q_row, q_end) = (first + q0, first + len);
    stage(qkv, &mut q_s, q_row, q_end, col, n_embd, head_dim, vs);
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
    let mut o = Array::<f32>::new(32usize);
    #[unroll]
    for j in 0..32 {
        o[j] = f32::new(0.0);
    }
    // The row's running max and sum of `exp` (online softmax).
    let mut ml = Array::<f32>::new(2usize);
    ml[0] = f32::new(-1.0e30);
    ml[1] = f32::new(0.0);
    let chunks = (visible - 1) / 64 + 1; // visible >= 1
    for ch in 0..chunks {
        let pos0 = ch * 64;
        sync_cube();
        let chunk = KeyChunk {
            table,
            pos0,
            visible,
            head,
        };
        stage_paged(
            k_cache, v_cache, tables, &chunk, &mut k_s, &mut v_s, head_dim, block_size, vs,
        );
        sync_cube();
        scores(&k_s, &mut s_s, s_tile, &qa0, &qa1, &qa2, &qa3);
        sync_plane();
        let (p_at, key0) = (q_at + r * LD + c0, pos0 + c0);
        let alpha = softmax_chunk(&s_s, &mut p_s, &mut ml, at, p_at, key0, query_pos, scale);
        sync_plane();
        rescale_add_pv(&v_s, &p_s, &mut s_s, &mut o, s_tile, q_at, at, alpha);
    }

    if local < n_q {
        let row_out = (first + q0 + local) * n_embd + col + c0;
        write_row(out, &o, f32::new(1.0) / ml[1], row_out, c0, head_dim);
    }
}

/// This lane's 32 values of `O` times `inv_l` into `out[row_out..]`, those
/// of its columns (from `c0`) below `head_dim`.
#[cube]
fn write_row<F: Float>(
    out: &mut Tensor<F>,
    o: &Array<f32>,
    inv_l: f32,
    row_out: usize,
    c0: usize,
    #[comptime] head_dim: usize,
) {
    #[unroll]
    for j in 0..32 {
        if c0 + j < head_dim {
            out[row_out + j] = F::cast_from(o[j] * inv_l);
        }
    }
}

/// One chunk's online-softmax step for this lane's 32 keys (`key0..`, its
/// scores at `s_s[at..]`, visible up to `query`): the row's new max and the
/// rescale of what came before into `ml` (`[max, sum]`), this chunk's
/// unnormalized `P` into `p_s[p_at..]`. Returns the rescale factor of `O`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn softmax_chunk<F: Float>(
    s_s: &Shared<[f32]>,
    p_s: &mut Shared<[F]>,
    ml: &mut Array<f32>,
    at: usize,
    p_at: usize,
    key0: usize,
    query: usize,
    scale: f32,
) -> f32 {
    let m = ml[0];
    let mx = visible_row_max(s_s, at, key0, query, scale);
    let mut m_new = m;
    if mx > m_new {
        m_new = mx;
    }
    let alpha = (m - m_new).exp();
    let mut sum = f32::new(0.0);
    #[unroll]
    for j in 0..32 {
        let mut w = f32::new(0.0);
        if key0 + j <= query {
            w = (s_s[at + j] * scale - m_new).exp();
        }
        sum += w;
        p_s[p_at + j] = F::cast_from(w);
    }
    sum += plane_shuffle_xor(sum, 1u32);
    ml[1] = ml[1] * alpha + sum;
    ml[0] = m_new;
    alpha
}

/// The max over this lane's 32 scores at `s_s[at..]` (keys `key0..`) that
/// `query` may see, scaled, combined with its partner lane's (the row's
/// other 32 keys).
#[cube]
fn visible_row_max(s_s: &Shared<[f32]>, at: usize, key0: usize, query: usize, scale: f32) -> f32 {
    let mut mx = f32::new(-1.0e30);
    #[unroll]
    for j in 0..32 {
        let v = s_s[at + j] * scale;
        if key0 + j <= query && v > mx {
            mx = v;
        }
    }
    let other = plane_shuffle_xor(mx, 1u32);
    if other > mx {
        mx = other;
    }
    mx
}

/// `O = O * alpha + P V` for this chunk: the warp's `P` tile (at `p_tile`
/// of `p_s`) times the staged `V`, through the warp's score tile (at
/// `s_tile`), into this lane's 32 columns of `O` (its row and columns at
/// `at` of the score tile).
#[cube]
#[allow(clippy::too_many_arguments)]
fn rescale_add_pv<F: Float>(
    v_s: &Shared<[F]>,
    p_s: &Shared<[F]>,
    s_s: &mut Shared<[f32]>,
    o: &mut Array<f32>,
    s_tile: usize,
    p_tile: usize,
    at: usize,
    alpha: f32,
) {
    let pv0 = zeroed_accumulator();
    let pv1 = zeroed_accumulator();
    let pv2 = zeroed_accumulator();
    let pv3 = zeroed_accumulator();
    #[unroll]
    for kc in 0..4 {
        let pa = load_a(p_s, p_tile + kc * 16);
        accumulate_pv(v_s, kc * 16 * LD, &pa, &pv0, &pv1, &pv2, &pv3);
    }
    store_s(s_s, s_tile, &pv0);
    store_s(s_s, s_tile + 16, &pv1);
    store_s(s_s, s_tile + 32, &pv2);
    store_s(s_s, s_tile + 48, &pv3);
    sync_plane();
    #[unroll]
    for j in 0..32 {
        o[j] = o[j] * alpha + s_s[at + j];
    }
    sync_plane();
}

/// A row-major 16x16 A fragment of a shared tile at `at` (row stride `LD`).
#[cube]
fn load_a<F: Float>(tile: &Shared<[F]>, at: usize) -> cmma::Matrix<F> {
    let mut a = fragment::<F>(cmma::MatrixIdent::A, cmma::MatrixLayout::RowMajor);
    cmma::load(
        &mut a,
        tile.slice(at, at + comptime!(15 * LD + 16)),
        comptime!(LD as u32),
    );
    a
}

/// `S = Q K^T` for the warp's 16 queries and the 64 staged keys, into the
/// warp's score tile at `s_tile` (row stride `SLD`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn scores<F: Float>(
    k_s: &Shared<[F]>,
    s_s: &mut Shared<[f32]>,
    s_tile: usize,
    qa0: &cmma::Matrix<F>,
    qa1: &cmma::Matrix<F>,
    qa2: &cmma::Matrix<F>,
    qa3: &cmma::Matrix<F>,
) {
    let span = comptime!(15 * LD + 16);
    let ld = comptime!(LD as u32);
    let mut kb = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::ColMajor);
    #[unroll]
    for t in 0..4 {
        let s = zeroed_accumulator();
        let at = t * 16 * LD;
        cmma::load(&mut kb, k_s.slice(at, at + span), ld);
        cmma::execute(qa0, &kb, &s, &s);
        cmma::load(&mut kb, k_s.slice(at + 16, at + 16 + span), ld);
        cmma::execute(qa1, &kb, &s, &s);
        cmma::load(&mut kb, k_s.slice(at + 32, at + 32 + span), ld);
        cmma::execute(qa2, &kb, &s, &s);
        cmma::load(&mut kb, k_s.slice(at + 48, at + 48 + span), ld);
        cmma::execute(qa3, &kb, &s, &s);
        store_s(s_s, s_tile + t * 16, &s);
    }
}

/// `O[:, 16c..16c+16] += P V[:, 16c..16c+16]` for the four blocks of dims,
/// with `p` one 16-key block of P and V's matching 16 rows at `v_at`.
#[cube]
fn accumulate_pv<F: Float>(
    v_s: &Shared<[F]>,
    v_at: usize,
    p: &cmma::Matrix<F>,
    o0: &cmma::Matrix<f32>,
    o1: &cmma::Matrix<f32>,
    o2: &cmma::Matrix<f32>,
    o3: &cmma::Matrix<f32>,
) {
    let span = comptime!(15 * LD + 16);
    let ld = comptime!(LD as u32);
    let mut vb = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::RowMajor);
    cmma::load(&mut vb, v_s.slice(v_at, v_at + span), ld);
    cmma::execute(p, &vb, o0, o0);
    cmma::load(&mut vb, v_s.slice(v_at + 16, v_at + 16 + span), ld);
    cmma::execute(p, &vb, o1, o1);
    cmma::load(&mut vb, v_s.slice(v_at + 32, v_at + 32 + span), ld);
    cmma::execute(p, &vb, o2, o2);
    cmma::load(&mut vb, v_s.slice(v_at + 48, v_at + 48 + span), ld);
    cmma::execute(p, &vb, o3, o3);
}

/// Stores a 16x16 f32 fragment into a score tile at `at` (row stride `SLD`).
#[cube]
fn store_s(s_s: &mut Shared<[f32]>, at: usize, frag: &cmma::Matrix<f32>) {
    cmma::store(
        s_s.slice_mut(at, at + comptime!(15 * SLD + 16)),
        frag,
        comptime!(SLD as u32),
        cmma::MatrixLayout::RowMajor,
    );
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
    let out = zeros_contiguous(&qkv, [rows, e]);
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
