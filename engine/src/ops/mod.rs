//! The model's operations, each choosing its device in one place (candle's
//! `cpu_fwd` / `cuda_fwd` habit): a model file calls `ops.linear(..)` and
//! never asks where it runs.
//!
//! Every op takes and returns plain tensors. On a CUDA tensor (a build with
//! the `cuda` feature) it runs Ember's CubeCL kernels ([`cuda`]) with launch
//! shapes planned from the [`KernelTuning`] ([`plan`]); anywhere else it runs
//! the tensor-op path ([`reference`]), or the native CPU kernel of
//! attention ([`cpu`]). The tensor-op paths are also the references the CUDA
//! kernels are checked against (`ember-engine-bench --check-kernels`) and the
//! CPU kernel is (unit tests).
//!
//! - [`Ops::linear`], [`Ops::lm_head`]: projections with their epilogue (bias,
//!   tanh-GELU, residual add); weights `[in, out]` on the CPU, out-major
//!   `[out, in]` on CUDA ([`Ops::out_major_weights`]).
//! - [`Ops::layer_norm`]: f32 statistics whatever the dtype.
//! - [`Ops::kv_write`]: new K/V rows into the paged storage, in place.
//! - [`Ops::attention`]: a step's attention over its [`AttentionContext`].
//! - [`InputBuffer`]: a device tensor rewritten in place from the host.
//!
//! The CUDA side also holds the device's runtime setup ([`cuda::runtime`]):
//! all CUDA code of the crate lives under `ops/cuda/`.

pub mod attention;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod input_buffer;
pub mod plan;
pub mod reference;

use burn::prelude::*;

pub use attention::{
    AttentionContext, PagedContext, SegmentContext, SegmentPadding, SegmentRow, TableGeometry,
};
pub use input_buffer::InputBuffer;

use crate::tuning::KernelTuning;

/// What a projection does to its result after the bias: tanh-GELU, then a
/// residual add. On CUDA the decode kernels do it in their epilogue.
#[derive(Debug, Clone)]
pub struct Epilogue<const D: usize> {
    pub gelu: bool,
    /// Same shape as the output.
    pub residual: Option<Tensor<D>>,
}

impl<const D: usize> Epilogue<D> {
    /// Nothing after the bias.
    pub fn none() -> Self {
        Self {
            gelu: false,
            residual: None,
        }
    }

    /// tanh-GELU after the bias.
    pub fn gelu() -> Self {
        Self {
            gelu: true,
            residual: None,
        }
    }

    /// `residual` added after the bias.
    pub fn add(residual: Tensor<D>) -> Self {
        Self {
            gelu: false,
            residual: Some(residual),
        }
    }
}

/// The ops and the kernel knobs they launch with. Cheap to clone (a captured
/// decode graph keeps a copy).
#[derive(Debug, Clone, Default)]
pub struct Ops {
    tuning: KernelTuning,
}

impl Ops {
    pub fn new(tuning: KernelTuning) -> Self {
        Self { tuning }
    }

    pub fn tuning(&self) -> &KernelTuning {
        &self.tuning
    }

    /// Whether projections on `device` store their weights out-major
    /// (`[out, in]`): on CUDA, where the decode kernels stream weight rows.
    pub fn out_major_weights(device: &Device) -> bool {
        #[cfg(feature = "cuda")]
        if cuda::is_cube_device(device) {
            return true;
        }
        let _ = device;
        false
    }

    /// `x W + b`, then `epilogue`, over the last dimension of `x`
    /// (`[..., d_in]` -> `[..., d_out]`); `w` is `[d_in, d_out]`, or
    /// `[d_out, d_in]` when `out_major`.
    pub fn linear<const D: usize>(
        &self,
        x: Tensor<D>,
        w: &Tensor<2>,
        bias: Option<&Tensor<1>>,
        out_major: bool,
        epilogue: Epilogue<D>,
    ) -> Tensor<D> {
        #[cfg(feature = "cuda")]
        if out_major && cuda::on_cube(&x) {
            return self.cuda_linear(x, w, bias, epilogue, false);
        }
        reference::linear(x, w, bias, out_major, epilogue)
    }

    /// The LM head tied to the token embedding `wte` (`[vocab, E]`, used as
    /// stored): `x` `[B, E]` -> logits `[B, vocab]`.
    pub fn lm_head(&self, x: Tensor<2>, wte: &Tensor<2>) -> Tensor<2> {
        #[cfg(feature = "cuda")]
        if cuda::on_cube(&x) {
            return self.cuda_linear(x, wte, None, Epilogue::none(), true);
        }
        // A transposed view, which Flex's gemm and CubeCL's matmul read as is.
        x.matmul(wte.clone().transpose())
    }

    /// LayerNorm over the last dimension with f32 statistics.
    pub fn layer_norm<const D: usize>(
        &self,
        x: Tensor<D>,
        gamma: &Tensor<1>,
        beta: &Tensor<1>,
        eps: f64,
    ) -> Tensor<D> {
        #[cfg(feature = "cuda")]
        if cuda::on_cube(&x) {
            let dims = x.dims();
            let e = dims[D - 1];
            let rows = dims.iter().product::<usize>() / e.max(1);
            let y = cuda::layer_norm_rows(
                x.reshape([rows, e]),
                gamma.clone(),
                beta.clone(),
                eps as f32,
            );
            return y.reshape(dims);
        }
        reference::layer_norm(x, gamma, beta, eps)
    }

    /// Writes the K and V thirds of `qkv` (`[N, 3E]`) at `slots` (`[N]`) of a
    /// layer's `[H, S, D]` storage, in place, and returns the storage. On
    /// CUDA one kernel writes the buffers whoever else holds them (a captured
    /// decode graph does); on the CPU `select_assign` on the uniquely owned
    /// storage.
    pub fn kv_write(
        &self,
        k: Tensor<3>,
        v: Tensor<3>,
        qkv: Tensor<2>,
        slots: Tensor<1, Int>,
    ) -> (Tensor<3>, Tensor<3>) {
        #[cfg(feature = "cuda")]
        if cuda::on_cube(&qkv) {
            return cuda::kv_write(k, v, qkv, slots);
        }
        reference::kv_write(k, v, qkv, slots)
    }

    /// Attention of a step's queries (the Q third of `qkv`, `[N, 3E]`: one row
    /// per decode sequence, or a prefill step's flat tokens) over their
    /// context (see [`AttentionContext`]), the layer's K/V storage already
    /// holding the step's new rows. Returns `[N, E]`.
    pub fn attention(
        &self,
        qkv: Tensor<2>,
        k: &Tensor<3>,
        v: &Tensor<3>,
        n_head: usize,
        context: &AttentionContext,
    ) -> Tensor<2> {
        match context {
            AttentionContext::Paged(paged) => {
                #[cfg(feature = "cuda")]
                if cuda::on_cube(&qkv) {
                    return cuda::paged_decode_attention(&self.tuning, qkv, k, v, paged, n_head);
                }
                cpu::paged_attention::decode_attention(&qkv, k, v, paged, n_head)
            }
            AttentionContext::Segments(seg) => {
                #[cfg(feature = "cuda")]
                if cuda::on_cube(&qkv) {
                    return self.cuda_segment_attention(qkv, k, v, n_head, seg);
                }
                cpu::paged_attention::segment_attention(&qkv, k, v, seg, n_head)
            }
        }
    }

    /// The CUDA projection kernels where the plan takes them, else the
    /// matmul on the transposed view.
    #[cfg(feature = "cuda")]
    fn cuda_linear<const D: usize>(
        &self,
        x: Tensor<D>,
        w: &Tensor<2>,
        bias: Option<&Tensor<1>>,
        epilogue: Epilogue<D>,
        lm_head: bool,
    ) -> Tensor<D> {
        let dims = x.dims();
        let rows: usize = dims[..D - 1].iter().product();
        let [d_out, d_in] = w.dims();
        let plan = plan::linear(&self.tuning, rows, d_out, d_in, lm_head);
        if plan == plan::LinearPlan::Matmul {
            return reference::linear(x, w, bias, true, epilogue);
        }
        let residual = epilogue.residual.map(|r| r.reshape([rows, d_out]));
        let y = cuda::decode_linear(
            x.reshape([rows, d_in]),
            w,
            bias,
            epilogue.gelu,
            residual,
            plan,
        );
        let mut out = dims;
        out[D - 1] = d_out;
        y.reshape(out)
    }

    /// Prefill attention on CUDA: the causal tensor-core kernel where it
    /// applies (head_dim 64, not turned off with `--prefill-attention
    /// false`), else the tensor-op reference.
    #[cfg(feature = "cuda")]
    fn cuda_segment_attention(
        &self,
        qkv: Tensor<2>,
        k: &Tensor<3>,
        v: &Tensor<3>,
        n_head: usize,
        seg: &SegmentContext,
    ) -> Tensor<2> {
        let [_, e3] = qkv.dims();
        if self.tuning.prefill_attention && e3 / 3 / n_head == 64 {
            return cuda::prefill_attention(qkv, k, v, seg);
        }
        reference::segment_attention(qkv, k, v, n_head, seg)
    }
}
