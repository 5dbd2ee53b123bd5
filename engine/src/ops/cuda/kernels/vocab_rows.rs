//! Reductions over each row of the vocabulary, planned by rule (never
//! autotuned): the argmax of a row ([`vocab_argmax`]), and the log-softmax
//! values logprobs and prompt logprobs report ([`vocab_logprobs`]: one
//! token's log-probability and the `n` most likely alternatives).
//!
//! Why Ember's own: Burn's reductions and its `topk` are autotuned per shape
//! on first use (CubeCL's keys round the row count up to a power of 8, and
//! `topk` has one key per `n`); on an H200 a key took 1-33 s to tune, on the
//! scheduler thread when a request met it first (issue 46). These kernels
//! have one plan whatever the shape, so nothing is left to tune: one cube a
//! row (or, for the argmax of few rows, a row's parts on several cubes and a
//! join, [`argmax_parts`]), [`VOCAB_WARPS`] warps walking the row with
//! strided loads, and the cube-wide reductions of [`super::reduce`] in a
//! fixed order, so the result is deterministic and a tie goes to the lowest
//! index (as the sampling kernel's greedy rows and
//! `crate::sampling::row_sampler` decide).
//!
//! Values are compared as order-preserving u32 keys of their f32 value
//! ([`key_of`]); a NaN logit is absent (key 0, below every number's key).
//!
//! The top-n needs no sort and no selection state: round `j` is a cube
//! argmax over the elements strictly after round `j - 1`'s pick in the
//! order (value descending, index ascending), so each round re-reads the
//! row (from L2) and `n` stays small (`max_logprobs`, 20 by default). `n`
//! is a run-time argument and the row count the launch's, so each kernel is
//! compiled once per dtype and no new shape ever compiles anything.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn::prelude::Shape;
use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::reduce::{cube_reduce, key_of, value_of, OP_MAX, OP_MIN, OP_SUM};
use crate::ops::cuda::extension::cuda_kernel;

/// Warps of each row's cube.
pub const VOCAB_WARPS: usize = 8;

/// The cube's best element of the row at `base`, over its indices `start ..
/// end`, among those after `(after_key, after_index)` in the order (module
/// doc), or among all with `all`, into `pick`: its key (0 when none is left)
/// and index (`0xFFFF_FFFF` then), the same in every unit (`red` holds one
/// entry a warp).
#[cube]
#[allow(clippy::too_many_arguments)]
fn best_after<F: Float>(
    logits: &Tensor<F>,
    base: usize,
    start: usize,
    end: usize,
    after_key: u32,
    after_index: u32,
    all: bool,
    pick: &mut Array<u32>,
    red: &mut Shared<[u32]>,
    #[comptime] warps: usize,
) {
    let threads = comptime!(warps * 32);
    let mut i = start + (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let mut best_key = 0u32;
    let mut best_index = 0xFFFF_FFFFu32; // none yet
    while i < end {
        let x = f32::cast_from(logits[base + i]);
        let mut key = 0u32;
        if !x.is_nan() {
            key = key_of(x);
        }
        let index = i as u32;
        let later = all || key < after_key || (key == after_key && index > after_index);
        // A unit's indices increase, so `>` keeps its lowest of a tie.
        if later && key > best_key {
            best_key = key;
            best_index = index;
        }
        i += threads;
    }
    let key = cube_reduce(best_key, red, OP_MAX, warps);
    let holder = select(best_key == key, best_index, 0xFFFF_FFFFu32);
    pick[0] = key;
    pick[1] = cube_reduce(holder, red, OP_MIN, warps);
}

/// `ids[b] = argmax(logits[b, :])` (the lowest index of a tie; 0 for a row
/// of NaNs). One cube a row.
#[cube(launch, create_dummy_kernel)]
pub fn vocab_argmax_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    ids: &mut Tensor<I>,
    #[comptime] warps: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let row = CUBE_POS_X as usize;
    let mut red = Shared::<[u32]>::new_slice(warps);
    let base = row * logits.stride(0);
    let mut best = Array::<u32>::new(2usize);
    let vocab = logits.shape(1);
    best_after(
        logits, base, 0usize, vocab, 0u32, 0u32, true, &mut best, &mut red, warps,
    );
    let at = row * ids.stride(0);
    if UNIT_POS_X == 0 && UNIT_POS_Y == 0 {
        ids[at] = I::cast_from(select(best[0] == 0u32, 0u32, best[1]));
    }
}

/// The argmax of few rows, split: cube `(p, b)` takes part `p` of row `b`
/// (`P = parts.shape(1) / 2` parts of `ceil(V / P)` indices) and writes its
/// best key and index to `parts[b, 2p ..= 2p + 1]`; [`argmax_join_kernel`]
/// then picks each row's best part. One cube a row left a 1-row step one SM
/// scanning 50,257 logits: 27 us, 7% of GPT-2's batch-1 decode step (ncu,
/// H200, 2026-11-29 call 40).
#[cube(launch, create_dummy_kernel)]
pub fn argmax_parts_kernel<F: Float>(
    logits: &Tensor<F>,
    parts: &mut Tensor<u32>,
    #[comptime] warps: usize,
    #[define(F)] _dtype: ElemType,
) {
    let p = CUBE_POS_X as usize;
    let row = CUBE_POS_Y as usize;
    let mut red = Shared::<[u32]>::new_slice(warps);
    let vocab = logits.shape(1);
    let span = vocab.div_ceil(parts.shape(1) / 2);
    let start = p * span;
    let end = select(start + span < vocab, start + span, vocab);
    let mut best = Array::<u32>::new(2usize);
    best_after(
        logits,
        row * logits.stride(0),
        start,
        end,
        0u32,
        0u32,
        true,
        &mut best,
        &mut red,
        warps,
    );
    if UNIT_POS_X == 0 && UNIT_POS_Y == 0 {
        let at = row * parts.stride(0) + 2 * p;
        parts[at] = best[0];
        parts[at + 1] = best[1];
    }
}

/// `ids[b]` from row `b`'s parts (one warp a row, at most 32 parts): the
/// best key, the lowest index holding it (0 for a row of NaNs), as
/// [`vocab_argmax_kernel`] decides.
#[cube(launch, create_dummy_kernel)]
pub fn argmax_join_kernel<I: Int>(
    parts: &Tensor<u32>,
    ids: &mut Tensor<I>,
    #[define(I)] _dtype: ElemType,
) {
    let row = CUBE_POS_X as usize;
    let lane = UNIT_POS_X as usize;
    let mut key = 0u32;
    let mut index = 0xFFFF_FFFFu32;
    if lane < parts.shape(1) / 2 {
        let at = row * parts.stride(0) + 2 * lane;
        key = parts[at];
        index = parts[at + 1];
    }
    let best = plane_max(key);
    let first = plane_min(select(key == best, index, 0xFFFF_FFFFu32));
    let at = row * ids.stride(0);
    if lane == 0 {
        ids[at] = I::cast_from(select(best == 0u32, 0u32, first));
    }
}

/// For output row `r`, over the logits row `rows[r]`: `out[r, 0] =
/// log_softmax[chosen[r]]`, then the `n` largest log-softmax values
/// (`out[r, 1..=n]`, descending, ties by index) and their ids as f32
/// (`out[r, n+1..=2n]`). Log-softmax in f32: `x - (max + ln(sum(exp(x -
/// max))))`. One cube an output row.
#[cube(launch, create_dummy_kernel)]
pub fn vocab_logprobs_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    rows: &Tensor<I>,
    chosen: &Tensor<I>,
    out: &mut Tensor<f32>,
    n: u32,
    #[comptime] warps: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let r = CUBE_POS_X as usize;
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let threads = comptime!(warps * 32);
    let vocab = logits.shape(1);
    let base = u32::cast_from(rows[r * rows.stride(0)]) as usize * logits.stride(0);
    let mut red_f = Shared::<[f32]>::new_slice(warps);
    let mut red_u = Shared::<[u32]>::new_slice(warps);

    let mut m = f32::new(-3.0e38);
    let mut i = tid;
    while i < vocab {
        let x = f32::cast_from(logits[base + i]);
        m = select(x > m, x, m);
        i += threads;
    }
    let max = cube_reduce(m, &mut red_f, OP_MAX, warps);
    let mut sum = f32::new(0.0);
    i = tid;
    while i < vocab {
        sum += (f32::cast_from(logits[base + i]) - max).exp();
        i += threads;
    }
    let lse = max + cube_reduce(sum, &mut red_f, OP_SUM, warps).ln();

    let at = r * out.stride(0);
    if tid == 0 {
        let token = u32::cast_from(chosen[r * chosen.stride(0)]) as usize;
        out[at] = f32::cast_from(logits[base + token]) - lse;
    }
    let n = n as usize;
    let mut after_key = 0u32;
    let mut after_index = 0u32;
    let mut best = Array::<u32>::new(2usize);
    for j in 0..n {
        let all = j == 0;
        best_after(
            logits,
            base,
            0usize,
            vocab,
            after_key,
            after_index,
            all,
            &mut best,
            &mut red_u,
            warps,
        );
        if tid == 0 {
            out[at + 1 + j] = value_of(best[0]) - lse;
            out[at + 1 + n + j] = f32::cast_from(best[1]);
        }
        after_key = best[0];
        after_index = best[1];
    }
}

cuda_kernel! {
    /// The argmax of each row of `logits` `[B, V]` into `ids` `[B, 1]` (an
    /// int tensor the caller allocates), in place; returns `ids`.
    #[fusion(dtype = ids, shape = ids)]
    #[launch(launch_argmax(ids, logits))]
    pub fn VocabArgmax::vocab_argmax(
        #[in_place] ids: Tensor<2, Int>,
        logits: Tensor<2>,
    ) -> Tensor<2, Int>
}

cuda_kernel! {
    /// Logprobs of the rows `rows` `[R]` of `logits` `[B, V]`: each one's
    /// token `chosen` `[R]` and top `n` (see [`vocab_logprobs_kernel`]),
    /// into `out` `[R, 1 + 2n]` (f32, allocated by the caller), in place;
    /// returns `out`.
    #[fusion(dtype = out, shape = out)]
    #[launch(launch_logprobs(out, logits, rows, chosen, n))]
    pub fn VocabLogprobs::vocab_logprobs(
        #[in_place] out: Tensor<2>,
        logits: Tensor<2>,
        rows: Tensor<1, Int>,
        chosen: Tensor<1, Int>,
        n: usize,
    ) -> Tensor<2>
}

/// Cubes the split argmax aims at (about two per SM of an H100 or H200).
const ARGMAX_CUBES: usize = 256;

/// Parts a row's argmax is split into at `rows` rows (at most 32, one a
/// lane of the join; 1: not split).
pub fn argmax_parts(rows: usize) -> usize {
    (ARGMAX_CUBES / rows.max(1)).clamp(1, 32)
}

/// Launches the argmax of each row of `logits`: split into parts
/// ([`argmax_parts_kernel`], [`argmax_join_kernel`]) while the rows are
/// few, one cube a row ([`vocab_argmax_kernel`]) otherwise.
pub fn launch_argmax(ids: CubeTensor, logits: CubeTensor) -> CubeTensor {
    let [b, _] = logits.shape().dims::<2>();
    assert!(
        logits.meta.strides()[1] == 1 && ids.shape().dims::<2>() == [b, 1],
        "vocab_argmax: contiguous rows [B, V] and ids [B, 1]"
    );
    if b == 0 {
        return ids;
    }
    let (f, i) = (logits.dtype, ids.dtype);
    let client = logits.client.clone();
    let parts = argmax_parts(b);
    if parts > 1 {
        let scratch = empty_device_contiguous_dtype(
            client.clone(),
            logits.device.clone(),
            Shape::new([b, 2 * parts]),
            DType::U32,
        );
        argmax_parts_kernel::launch(
            &client,
            CubeCount::Static(parts as u32, b as u32, 1),
            CubeDim::new_2d(32, VOCAB_WARPS as u32),
            logits.into_tensor_arg(),
            scratch.clone().into_tensor_arg(),
            VOCAB_WARPS,
            dtype_to_storage_type(f),
        );
        argmax_join_kernel::launch(
            &client,
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_1d(32),
            scratch.into_tensor_arg(),
            ids.clone().into_tensor_arg(),
            dtype_to_storage_type(i),
        );
        return ids;
    }
    vocab_argmax_kernel::launch(
        &client,
        CubeCount::Static(b as u32, 1, 1),
        CubeDim::new_2d(32, VOCAB_WARPS as u32),
        logits.into_tensor_arg(),
        ids.clone().into_tensor_arg(),
        VOCAB_WARPS,
        [dtype_to_storage_type(f), dtype_to_storage_type(i)],
    );
    ids
}

/// Launches [`vocab_logprobs_kernel`], one cube an entry of `rows`.
pub fn launch_logprobs(
    out: CubeTensor,
    logits: CubeTensor,
    rows: CubeTensor,
    chosen: CubeTensor,
    n: usize,
) -> CubeTensor {
    let [r] = rows.shape().dims::<1>();
    assert!(
        logits.meta.strides()[1] == 1
            && chosen.shape().dims::<1>() == [r]
            && rows.dtype == chosen.dtype
            && out.dtype == burn::tensor::DType::F32
            && out.shape().dims::<2>() == [r, 1 + 2 * n]
            && out.meta.strides()[1] == 1,
        "vocab_logprobs: contiguous logits [B, V], rows and chosen [R], f32 out [R, 1 + 2n]"
    );
    if r == 0 {
        return out;
    }
    let (f, i) = (logits.dtype, rows.dtype);
    let client = logits.client.clone();
    vocab_logprobs_kernel::launch(
        &client,
        CubeCount::Static(r as u32, 1, 1),
        CubeDim::new_2d(32, VOCAB_WARPS as u32),
        logits.into_tensor_arg(),
        rows.into_tensor_arg(),
        chosen.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        n as u32,
        VOCAB_WARPS,
        [dtype_to_storage_type(f), dtype_to_storage_type(i)],
    );
    out
}
