//! The paged decode attention kernel: one query per sequence over its paged
//! K/V context, read in place through the block table.
//!
//! One cube per (head, sequence, split), `warps` warps. A sequence's visible
//! positions are cut into `splits` contiguous chunks, one per cube along
//! `CUBE_POS_Z`, so that a small batch (12 (head, sequence) pairs at batch 1)
//! still fills the GPU (flash-decoding). A warp is split into groups of
//! `lanes_per_pos` lanes; a group takes two positions a round (both loads in
//! flight before either is used) and each of its lanes loads
//! `vectors_per_lane` 16-byte vectors of each position's K (or V) row, so a
//! warp reads whole rows with wide, coalesced loads (head_dim 64 in f16: 8
//! lanes per position, 8 positions per warp per round). Over its chunk a
//! cube runs three passes:
//!
//! 1. scores: each lane dots its slice of the row with its slice of the
//!    (pre-scaled) query, a `plane_shuffle_xor` butterfly sums the group, the
//!    score goes to shared memory; the max is reduced over the cube;
//! 2. `exp(s - max)` in shared memory, the sum reduced over the cube;
//! 3. each lane accumulates `p * V` for its slice in registers over its
//!    group's positions, a butterfly across the groups of the warp gives the
//!    warp's partial, and the warps' partials are added in shared memory.
//!
//! With one split the cube writes `sum(p V) / sum(p)`. With several, each
//! cube publishes its chunk's unnormalized output, max and sum to `partials`
//! (f32, `D + 2` per split), then counts itself in on `arrivals[pair]`
//! (device-scope fence first, `sync_storage`); the cube that arrives last
//! rescales the chunks to their common max, writes the output and sets the
//! counter back to zero for the next launch (or graph replay). No second
//! kernel, no host involvement.
//!
//! With `write_new` the kernel also does the step's KV write (one launch
//! fewer per layer): the cube whose chunk holds the sequence's newest
//! position (`len - 1`, the step's own token) first copies that token's K
//! and V rows of head `h` from `qkv` to the cache at `slots[b]`
//! ([`super::cache_write::write_head_rows`]), then syncs before reading the
//! chunk; every other chunk holds only older positions.
//!
//! Every loop that contains a shuffle runs the same number of rounds on all
//! lanes of a warp (positions past the chunk are masked, not skipped), as
//! `__shfl_xor_sync` needs.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn::prelude::Shape;
use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cache_write::write_head_rows;
use super::decode_passes::{exponentials, scores, weighted_values};
use super::reduce::{cube_reduce, sum_warps, OP_MAX, OP_SUM};
use super::split_combine::publish_and_combine;
use crate::ops::cuda::extension::cuda_kernel;
use crate::ops::cuda::launch::{empty_like, or_stand_in, vector_size};
use crate::ops::plan::{self, attention_lanes};

/// See the module doc. `qkv` `[B, 3E]`, caches `[H, S, D]`, both read as
/// vectors of `N` (`vs` elements; `width = vectors_per_lane * vs` per lane);
/// `tables` `[B, W]`, `lens` `[B]`; `out` `[B, E]` contiguous. With
/// `splits > 1`: `partials` holds `B * H * splits * (D + 2)` f32 and
/// `arrivals` `B * H` counters that are zero on entry (and left at zero);
/// with one split neither is touched. With `write_new`, `slots` `[B]` is
/// where each sequence's new K/V rows go (written here, see the module doc).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_attention_kernel<F: Float, I: Numeric, N: Size>(
    qkv: &Tensor<Vector<F, N>>,
    k_cache: &mut Tensor<Vector<F, N>>,
    v_cache: &mut Tensor<Vector<F, N>>,
    tables: &Tensor<I>,
    lens: &Tensor<I>,
    slots: &Tensor<I>,
    out: &mut Tensor<F>,
    partials: &mut Tensor<f32>,
    arrivals: &mut Tensor<Atomic<u32>>,
    scale: f32,
    #[comptime] block_size: usize,
    #[comptime] head_dim: usize,
    #[comptime] max_context: usize,
    #[comptime] warps: usize,
    #[comptime] lanes_per_pos: usize,
    #[comptime] vectors_per_lane: usize,
    #[comptime] vs: usize,
    #[comptime] width: usize,
    #[comptime] splits: usize,
    #[comptime] write_new: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let h = CUBE_POS_X as usize;
    let b = CUBE_POS_Y as usize;
    let lane = UNIT_POS_X as usize;
    let warp = UNIT_POS_Y as usize;
    let tid = warp * 32 + lane;
    let heads = k_cache.shape(0);
    let len = visible_len(lens, b, max_context);
    // This cube's chunk of positions, `lo..hi`.
    let chunk = (len + comptime!(splits - 1)) / splits;
    let mut lo = CUBE_POS_Z as usize * chunk;
    if lo > len {
        lo = len;
    }
    let mut hi = lo + chunk;
    if hi > len {
        hi = len;
    }
    let mut p = Shared::<[f32]>::new_slice(max_context);
    let mut per_warp = Shared::<[f32]>::new_slice(warps);
    let mut partial = Shared::<[f32]>::new_slice(warps * head_dim);

    // This lane's slice of the query, pre-scaled, in registers.
    let mut q = Array::<f32>::new(width);
    let q_at = (b * qkv.stride(0) + h * head_dim) / vs + (lane % lanes_per_pos) * vectors_per_lane;
    load_scaled(qkv, &mut q, q_at, scale, vectors_per_lane, vs);
    if comptime![write_new] {
        // Uniform over the cube: only the chunk holding `len - 1` writes.
        if lo < hi && hi == len {
            let slot = u32::cast_from(slots[b * slots.stride(0)]) as usize;
            write_head_rows(qkv, k_cache, v_cache, b, h, slot, tid, head_dim, vs);
            sync_cube();
        }
    }

    let lane_max = scores(
        &q,
        k_cache,
        tables,
        &mut p,
        b,
        h,
        lo,
        hi,
        block_size,
        warps,
        lanes_per_pos,
        vectors_per_lane,
        vs,
    );
    let m = cube_reduce(lane_max, &mut per_warp, OP_MAX, warps);

    let sum = exponentials(&mut p, m, lo, hi, warps);
    let total = cube_reduce(sum, &mut per_warp, OP_SUM, warps);

    weighted_values(
        v_cache,
        tables,
        &p,
        &mut partial,
        b,
        h,
        lo,
        hi,
        block_size,
        warps,
        lanes_per_pos,
        vectors_per_lane,
        vs,
        width,
    );
    sync_cube();
    let pair = b * heads + h;
    finish(
        &partial, partials, arrivals, out, pair, m, total, warps, head_dim, splits,
    );
}

/// The cube's output for (sequence, head) `pair`: its warps' `partial`
/// sums over `total` into `out` (one split), or published beside the other
/// splits' and combined by the last to arrive.
#[cube]
#[allow(clippy::too_many_arguments)]
fn finish<F: Float>(
    partial: &Shared<[f32]>,
    partials: &mut Tensor<f32>,
    arrivals: &mut Tensor<Atomic<u32>>,
    out: &mut Tensor<F>,
    pair: usize,
    m: f32,
    total: f32,
    #[comptime] warps: usize,
    #[comptime] head_dim: usize,
    #[comptime] splits: usize,
) {
    let row_at = pair * head_dim;
    if comptime![splits == 1] {
        let mut d = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
        while d < head_dim {
            let v = sum_warps(partial, d, warps, head_dim);
            out[row_at + d] = F::cast_from(v / total);
            d += comptime!(warps * 32);
        }
    } else {
        publish_and_combine(
            partial, partials, arrivals, out, pair, row_at, m, total, warps, head_dim, splits,
        );
    }
}

/// Positions sequence `b` attends over: its length, at most `max_context`.
#[cube]
fn visible_len<I: Numeric>(lens: &Tensor<I>, b: usize, #[comptime] max_context: usize) -> usize {
    let mut len = u32::cast_from(lens[b * lens.stride(0)]) as usize;
    if len > max_context {
        len = max_context;
    }
    len
}

/// `vectors_per_lane` vectors of `qkv` from vector `at`, times `scale`, into `q`.
#[cube]
fn load_scaled<F: Float, N: Size>(
    qkv: &Tensor<Vector<F, N>>,
    q: &mut Array<f32>,
    at: usize,
    scale: f32,
    #[comptime] vectors_per_lane: usize,
    #[comptime] vs: usize,
) {
    #[unroll]
    for c in 0..vectors_per_lane {
        let v = qkv[at + c];
        #[unroll]
        for j in 0..vs {
            q[c * vs + j] = f32::cast_from(v.extract(j)) * scale;
        }
    }
}

cuda_kernel! {
    /// Decode attention over the paged cache: one query per sequence (the Q
    /// third of `qkv` `[B, 3E]`) against the layer's `[H, S, D]` storage,
    /// through `tables` `[B, W]` (blocks of `block_size`) and `lens` `[B]`
    /// (at most `max_context`). Returns `[B, E]`. With `arrivals` (at least
    /// `B * H` zeroed 32-bit counters, left at zero afterwards) a context may
    /// be split across cubes (`fixed_splits` of them, or planned when 0).
    /// With `slots` (`[B]`) each sequence's new K/V rows (the K and V thirds
    /// of `qkv`) are first written there, in place (the KV write folded into
    /// attention); without, the storage must already hold them.
    #[fusion(dtype = qkv, shape = { let [b, e3] = qkv.dims::<2>(); Shape::new([b, e3 / 3]) })]
    pub fn PagedDecodeAttention::paged_decode_attention(
        qkv: Tensor<2>,
        #[in_place] k_cache: Tensor<3>,
        #[in_place] v_cache: Tensor<3>,
        // Read at its strides (a narrow table's rows are pitched): no copy.
        #[in_place] tables: Tensor<2, Int>,
        lens: Tensor<1, Int>,
        #[optional(flag = write_new, stand_in = lens)] slots: Option<Tensor<1, Int>>,
        #[in_place] #[optional(flag = can_split, stand_in = lens)] arrivals: Option<Tensor<1, Int>>,
        fixed_splits: usize,
        block_size: usize,
        max_context: usize,
    ) -> Tensor<2>
}

/// Launches [`paged_decode_attention_kernel`]: one query per sequence (the Q
/// third of contiguous `qkv` `[B, 3E]`) over its paged context (`tables`
/// `[B, W]`, `lens` `[B]`). With `arrivals` (at least `B * H` zeroed 32-bit
/// counters) contexts may be split across cubes (`fixed_splits`: the
/// `--attention-splits` knob, 0 = planned); the split also needs
/// device-scope fences from the runtime. With `slots` (`[B]`), each
/// sequence's new K/V rows (the K and V thirds of `qkv`) are written there
/// first, in place. Returns `[B, E]`.
#[allow(clippy::too_many_arguments)]
pub fn launch(
    qkv: CubeTensor,
    k_cache: CubeTensor,
    v_cache: CubeTensor,
    tables: CubeTensor,
    lens: CubeTensor,
    slots: Option<CubeTensor>,
    arrivals: Option<CubeTensor>,
    fixed_splits: usize,
    block_size: usize,
    max_context: usize,
) -> CubeTensor {
    let [b, e3] = qkv.shape().dims::<2>();
    let [h, _, d] = k_cache.shape().dims::<3>();
    let out = empty_like(&qkv, [b, e3 / 3]);
    let (f, i) = (qkv.dtype, tables.dtype);
    // Splitting hands partials between cubes, which needs device-scope
    // fences (`sync_storage`) the runtime promises.
    let (arrivals, can_split) = or_stand_in(arrivals, &lens);
    let counters_fit = arrivals.dtype.size() == 4
        && arrivals.is_contiguous()
        && arrivals.shape().num_elements() >= b * h
        && qkv.client.features().device_memory_scope;
    let plan = plan::attention(fixed_splits, b * h, can_split && counters_fit);
    let partials = empty_device_contiguous_dtype(
        qkv.client.clone(),
        qkv.device.clone(),
        Shape::new([if plan.splits > 1 {
            b * h * plan.splits * (d + 2)
        } else {
            1
        }]),
        DType::F32,
    );
    let cache_strides = k_cache.meta.strides();
    assert!(
        cache_strides[2] == 1 && v_cache.meta.strides() == cache_strides,
        "paged attention: the K/V caches must be row-major [H, S, D] storage"
    );
    let vs = vector_size(&qkv, &[d, e3, cache_strides[0], cache_strides[1]]);
    let (lanes_per_pos, vectors_per_lane) = attention_lanes(d / vs);
    let (slots, write_new) = or_stand_in(slots, &lens);
    paged_decode_attention_kernel::launch(
        &qkv.client,
        CubeCount::Static(h as u32, b as u32, plan.splits as u32),
        CubeDim::new_2d(32, plan.warps as u32),
        vs,
        qkv.clone().into_tensor_arg(),
        k_cache.into_tensor_arg(),
        v_cache.into_tensor_arg(),
        tables.into_tensor_arg(),
        lens.into_tensor_arg(),
        slots.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        partials.into_tensor_arg(),
        arrivals.into_tensor_arg(),
        1.0 / (d as f32).sqrt(),
        block_size,
        d,
        max_context,
        plan.warps,
        lanes_per_pos,
        vectors_per_lane,
        vs,
        vectors_per_lane * vs,
        plan.splits,
        write_new,
        [dtype_to_storage_type(f), dtype_to_storage_type(i)],
    );
    out
}
