//! Everything CUDA in the crate (built with the `cuda` feature only).
//!
//! - [`kernels`]: one file per kernel: the `#[cube]` code, its launch, and
//!   its one declaration (`extension::cuda_kernel!`), from which come its
//!   Burn backend extension (CubeCL and fusion) and its function of plain
//!   `Tensor`s; [`cublaslt`]: GEMMs on cuBLASLt, on CubeCL's stream,
//!   declared the same way; [`extension`]: that macro and its helpers;
//!   [`tune`]: timing the projection kernels against each other at warmup.
//! - This file: what [`crate::ops::Ops`] calls when a tensor lives on CUDA:
//!   the kernels' tensor functions, taking the engine's contexts
//!   ([`PagedContext`], [`SegmentContext`]) and projection plans apart
//!   where they need to.
//! - [`inplace`]: host bytes into an existing device buffer (decode inputs
//!   rewritten before each graph replay); [`readback`]: a step's ids copied
//!   back behind it, waited for later.
//! - [`runtime`]: opening a CUDA device and pointing CubeCL's kernel and
//!   autotune caches at `--kernel-cache-dir`.
//! - [`launch`]: helpers the launches share.
//!
//! `qkv` is read as it is by the kernels that take it, so no slice, permute
//! or copy of Q, K or V is launched. The tensor-op paths in
//! [`crate::ops::reference`] are what each kernel is checked against
//! (`ember-engine-bench --check-kernels`).

pub mod cublaslt;
pub mod extension;
pub mod inplace;
pub mod kernels;
pub mod launch;
pub mod readback;
pub mod runtime;
pub mod tune;

use burn::backend::DispatchDevice;
use burn::prelude::*;

use crate::ops::attention::{PagedContext, SegmentContext};
use crate::ops::epilogue::Epilogue;
use crate::ops::plan::LinearPlan;
use crate::tuning::KernelTuning;

pub use kernels::cache_write::kv_write;
pub use kernels::layer_norm::layer_norm_rows;
pub use kernels::logit_edits::logit_edits;
pub use kernels::penalty_counts::count_chosen;
pub use kernels::sample_rows::{fits_device as sample_rows_fit, sample_rows};
pub use kernels::settle::settled;
pub use kernels::vocab_rows::{vocab_argmax, vocab_logprobs};
pub use kernels::write_rows::write_rows;

/// Whether `device` is a CubeCL (CUDA) device.
pub fn is_cube_device(device: &Device) -> bool {
    matches!(device.as_dispatch(), DispatchDevice::Cube(_))
}

/// Whether `tensor` lives on a CubeCL (CUDA) device, where these kernels run.
pub fn on_cube<const D: usize>(tensor: &Tensor<D>) -> bool {
    tensor
        .clone()
        .try_into_primitive::<burn::backend::Cube>()
        .is_ok()
}

/// Decode attention over the paged cache: `qkv` `[B, 3E]` against the
/// layer's `[H, S, D]` storage, through `paged`'s block tables and lengths
/// (splitting contexts per `tuning.attention_splits` where `paged` carries
/// counters); returns `[B, E]`. With `write_slots` (`[B]`) the same launch
/// first writes each sequence's new K/V rows there, in place (the KV write
/// folded into attention); without, the storage must already hold them.
pub fn paged_decode_attention(
    tuning: &KernelTuning,
    qkv: Tensor<2>,
    k_cache: &Tensor<3>,
    v_cache: &Tensor<3>,
    paged: &PagedContext,
    n_head: usize,
    write_slots: Option<Tensor<1, Int>>,
) -> Tensor<2> {
    debug_assert_eq!(k_cache.dims()[0], n_head);
    kernels::attention::paged_decode_attention(
        qkv,
        k_cache.clone(),
        v_cache.clone(),
        paged.tables.clone(),
        paged.lens.clone(),
        write_slots,
        paged.arrivals.clone(),
        tuning.attention_splits,
        paged.block_size,
        paged.max_context,
    )
}

/// `x` `[B, K]` times `w` `[N, K]` (out-major) transposed, plus `bias`, then
/// tanh-GELU when `gelu`, then `residual` `[B, N]`, on the kernel `plan`
/// names: Ember's GEMV or tensor-core kernel, or CubeCL's matmul. Returns
/// `[B, N]`.
pub fn decode_linear(
    x: Tensor<2>,
    w: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    gelu: bool,
    residual: Option<Tensor<2>>,
    plan: LinearPlan,
) -> Tensor<2> {
    match plan {
        LinearPlan::Matmul => matmul_linear(x, w, bias, Epilogue { gelu, residual }),
        LinearPlan::Gemv => kernels::gemv::gemv_linear(x, w.clone(), bias.cloned(), residual, gelu),
        LinearPlan::Mma { row_tiles, warps } => {
            let (w, bias) = (w.clone(), bias.cloned());
            kernels::mma::mma_linear(x, w, bias, residual, gelu, row_tiles, warps)
        }
    }
}

/// `x` `[B, K]` times `w` `[N, K]` (out-major) transposed, plus `bias`, then
/// tanh-GELU when `gelu`, then `residual` `[B, N]`, on cuBLASLt. Returns
/// `[B, N]`.
///
/// cuBLASLt adds `C` (the residual, `beta = 1`) before its epilogue, so GELU
/// and a residual together would give `gelu(xw + b + r)`: that pair (which
/// GPT-2 never uses) adds the residual afterwards as a tensor op.
pub fn lt_linear(
    x: Tensor<2>,
    w: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    gelu: bool,
    residual: Option<Tensor<2>>,
) -> Tensor<2> {
    let residual = match (gelu, residual) {
        (true, Some(r)) => return lt_linear(x, w, bias, true, None) + r,
        (_, r) => r,
    };
    cublaslt::gemm::lt_linear(x, w.clone(), bias.cloned(), residual, gelu)
}

/// Causal prefill attention over a step's segments: the flat `qkv`
/// `[T, 3E]` (head_dim up to 64) against the layer's `[H, S, D]` storage, through
/// `seg`'s offsets, starts, block tables and tiles; returns `[T, E]`
/// (padding tokens 0).
pub fn prefill_attention(
    qkv: Tensor<2>,
    k_cache: &Tensor<3>,
    v_cache: &Tensor<3>,
    seg: &SegmentContext,
) -> Tensor<2> {
    kernels::prefill_attention::prefill_attention(
        qkv,
        k_cache.clone(),
        v_cache.clone(),
        seg.tables.clone(),
        seg.cu_seqlens.clone(),
        seg.starts.clone(),
        seg.tiles.clone(),
        seg.block_size,
    )
}

/// CubeCL's matmul fallback (no cuBLASLt) of a CUDA projection. A flat
/// prefill step of many tokens goes in as `[rows / 256, 256, k]` batches:
/// CubeCL 0.11.3's matmul fails to launch some 2-D shapes of 4,096+ rows
/// ("Tile shape must be non-zero and <= 256", H200, 2026-11-24) and hangs
/// the step, while the batched shape (the padded prefill's) runs. Token
/// buckets are powers of two, so large row counts divide by 256.
pub fn matmul_linear<const D: usize>(
    x: Tensor<D>,
    w: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    epilogue: Epilogue<D>,
) -> Tensor<D> {
    const TILE_ROWS: usize = 256;
    let dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    if rows <= TILE_ROWS || !rows.is_multiple_of(TILE_ROWS) {
        return crate::ops::reference::linear(x, w, bias, true, epilogue);
    }
    let (k, n) = (dims[D - 1], w.dims()[0]);
    let batched = |t: Tensor<D>, width: usize| t.reshape([rows / TILE_ROWS, TILE_ROWS, width]);
    let epilogue3 = Epilogue {
        gelu: epilogue.gelu,
        residual: epilogue.residual.map(|r| batched(r, n)),
    };
    let y = crate::ops::reference::linear(batched(x, k), w, bias, true, epilogue3);
    let mut out = dims;
    out[D - 1] = n;
    y.reshape(out)
}
