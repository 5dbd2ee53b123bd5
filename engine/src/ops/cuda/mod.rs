//! Everything CUDA in the crate (built with the `cuda` feature only).
//!
//! - [`extension`]: Ember's CubeCL kernels and the cuBLASLt GEMM as a Burn
//!   backend extension; [`kernels`]: one file per kernel (the `#[cube]` code
//!   and its launch); [`cublaslt`]: GEMMs on cuBLASLt, on CubeCL's stream;
//!   [`tune`]: timing the projection kernels against each other at warmup.
//! - This file: the kernels as functions of plain `Tensor`s, which
//!   [`crate::ops::Ops`] calls when a tensor lives on CUDA.
//! - [`inplace`]: host bytes into an existing device buffer (decode inputs
//!   rewritten before each graph replay).
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
pub mod runtime;
pub mod tune;

use burn::backend::{Dispatch, DispatchDevice, DispatchTensor};
use burn::prelude::*;

use extension::CudaOps;

use crate::ops::attention::{PagedContext, SegmentContext};
use crate::ops::epilogue::Epilogue;
use crate::ops::plan::LinearPlan;
use crate::tuning::KernelTuning;

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

/// Writes the K/V thirds of `qkv` (`[N, 3E]`) at `slots` (`[N]`) of the
/// layer's `[H, S, D]` storage, in place; returns the same storage.
pub fn kv_write(
    k_cache: Tensor<3>,
    v_cache: Tensor<3>,
    qkv: Tensor<2>,
    slots: Tensor<1, Int>,
) -> (Tensor<3>, Tensor<3>) {
    let (k, v) = Dispatch::kv_write(
        k_cache.into_dispatch(),
        v_cache.into_dispatch(),
        qkv.into_dispatch(),
        slots.into_dispatch(),
    );
    (Tensor::from_dispatch(k), Tensor::from_dispatch(v))
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
    // Unread stand-ins when absent: the context lengths.
    let stand_in = || paged.lens.clone().into_dispatch();
    let arrivals = Operand::new(paged.arrivals.clone().map(Tensor::into_dispatch), stand_in);
    let slots = Operand::new(write_slots.map(Tensor::into_dispatch), stand_in);
    Tensor::from_dispatch(Dispatch::paged_decode_attention(
        qkv.into_dispatch(),
        k_cache.clone().into_dispatch(),
        v_cache.clone().into_dispatch(),
        paged.tables.clone().into_dispatch(),
        paged.lens.clone().into_dispatch(),
        slots.tensor,
        slots.present,
        arrivals.tensor,
        arrivals.present,
        tuning.attention_splits,
        paged.block_size,
        paged.max_context,
    ))
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
    let (row_tiles, warps) = match plan {
        LinearPlan::Matmul => return matmul_linear(x, w, bias, Epilogue { gelu, residual }),
        LinearPlan::Gemv => {
            let ops = EpilogueOperands::new(w, bias, residual);
            return Tensor::from_dispatch(Dispatch::gemv_linear(
                x.into_dispatch(),
                w.clone().into_dispatch(),
                ops.bias.tensor,
                ops.residual.tensor,
                ops.bias.present,
                gelu,
                ops.residual.present,
            ));
        }
        LinearPlan::Mma { row_tiles, warps } => (row_tiles, warps),
    };
    let ops = EpilogueOperands::new(w, bias, residual);
    Tensor::from_dispatch(Dispatch::mma_linear(
        x.into_dispatch(),
        w.clone().into_dispatch(),
        ops.bias.tensor,
        ops.residual.tensor,
        ops.bias.present,
        gelu,
        ops.residual.present,
        row_tiles,
        warps,
    ))
}

/// An operand that may be absent, as the backend extension takes it: always
/// a tensor (`stand_in`, unread, when absent) and whether it is present.
/// The one form every optional argument crosses the boundary in (the
/// extension's `present` turns it back into an `Option`).
struct Operand {
    tensor: DispatchTensor,
    present: bool,
}

impl Operand {
    fn new(tensor: Option<DispatchTensor>, stand_in: impl FnOnce() -> DispatchTensor) -> Self {
        match tensor {
            Some(tensor) => Self {
                tensor,
                present: true,
            },
            None => Self {
                tensor: stand_in(),
                present: false,
            },
        }
    }
}

/// The optional bias and residual of a projection (the weight stands in for
/// an absent one).
struct EpilogueOperands {
    bias: Operand,
    residual: Operand,
}

impl EpilogueOperands {
    fn new(w: &Tensor<2>, bias: Option<&Tensor<1>>, residual: Option<Tensor<2>>) -> Self {
        let stand_in = || w.clone().into_dispatch();
        Self {
            bias: Operand::new(bias.map(|b| b.clone().into_dispatch()), stand_in),
            residual: Operand::new(residual.map(Tensor::into_dispatch), stand_in),
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
    let ops = EpilogueOperands::new(w, bias, residual);
    Tensor::from_dispatch(Dispatch::lt_linear(
        x.into_dispatch(),
        w.clone().into_dispatch(),
        ops.bias.tensor,
        ops.residual.tensor,
        ops.bias.present,
        gelu,
        ops.residual.present,
    ))
}

/// Causal prefill attention over a step's segments: the flat `qkv`
/// `[T, 3E]` (head_dim 64) against the layer's `[H, S, D]` storage, through
/// `seg`'s offsets, starts, block tables and tiles; returns `[T, E]`
/// (padding tokens 0).
pub fn prefill_attention(
    qkv: Tensor<2>,
    k_cache: &Tensor<3>,
    v_cache: &Tensor<3>,
    seg: &SegmentContext,
) -> Tensor<2> {
    Tensor::from_dispatch(Dispatch::prefill_attention(
        qkv.into_dispatch(),
        k_cache.clone().into_dispatch(),
        v_cache.clone().into_dispatch(),
        seg.tables.clone().into_dispatch(),
        seg.cu_seqlens.clone().into_dispatch(),
        seg.starts.clone().into_dispatch(),
        seg.tiles.clone().into_dispatch(),
        seg.block_size,
    ))
}

/// LayerNorm over the last dimension of `x` `[R, E]` (one kernel).
pub fn layer_norm_rows(x: Tensor<2>, gamma: Tensor<1>, beta: Tensor<1>, eps: f32) -> Tensor<2> {
    Tensor::from_dispatch(Dispatch::layer_norm_rows(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        eps,
    ))
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
