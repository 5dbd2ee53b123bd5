//! The model's operations, each choosing its device in one place (candle's
//! `cpu_fwd` / `cuda_fwd` habit): a model file calls `ops.linear(..)` and
//! never asks where it runs.
//!
//! Every op takes and returns plain tensors. On a CUDA tensor (a build with
//! the `cuda` feature) it runs Ember's CubeCL kernels ([`cuda`]) with launch
//! shapes planned from the [`KernelTuning`] ([`plan`]); anywhere else it runs
//! the tensor-op path ([`reference`]), or a native CPU kernel ([`cpu`]):
//! decode attention, and the projections and LM head of steps with at most
//! [`CpuKernels::gemv_max_rows`] rows. The tensor-op paths are also the
//! references the CUDA kernels are checked against
//! (`ember-engine-bench --check-kernels`) and the CPU kernels are (unit
//! tests).
//!
//! - [`Ops::linear`], [`Ops::lm_head`]: projections with their epilogue (bias,
//!   tanh-GELU, residual add); weights out-major, `[out, in]`, on both
//!   devices ([`Ops::out_major_weights`]): the decode kernels stream each
//!   output feature's contiguous row, and Flex's matmul (larger steps)
//!   reads the transposed view as is. On CUDA each shape runs on Ember's
//!   decode kernels, cuBLASLt or CubeCL's matmul, as [`LinearChoices`]
//!   says: decode shapes are timed against each other at warmup
//!   ([`Ops::tune_linear`]), once per binary and GPU: the timings are kept
//!   in the kernel cache directory ([`tune_record`]).
//! - [`Ops::layer_norm`]: f32 statistics whatever the dtype.
//! - [`Ops::kv_write`]: new K/V rows into the paged storage, in place.
//! - [`Ops::attention`]: a step's attention over its [`AttentionContext`].
//! - [`InputBuffer`]: a device tensor rewritten in place from the host;
//!   [`PendingIds`]: a step's ids read back without waiting for them yet.
//! - [`row_params`]: one row's sampling parameters and their column layout,
//!   shared by the CPU sampler and the `sample_rows` kernel.
//! - [`vocab`]: the argmax and the logprobs' log-softmax over each row of
//!   the vocabulary (on CUDA kernels that are never autotuned).
//!
//! The CUDA side also holds the device's runtime setup ([`cuda::runtime`]):
//! all CUDA code of the crate lives under `ops/cuda/`.

pub mod attention;
pub mod choice;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod epilogue;
pub mod input_buffer;
pub mod pitched;
pub mod plan;
pub mod readback;
pub mod reference;
pub mod row_params;
pub mod tune_record;
pub mod vocab;

use burn::prelude::*;

pub use attention::{
    AttentionContext, PagedContext, SegmentContext, SegmentHost, SegmentPadding, SegmentRow,
    TableGeometry,
};
pub use choice::{LinearChoices, LinearKernel, LinearShape};
pub use epilogue::Epilogue;
pub use input_buffer::InputBuffer;
pub use readback::PendingIds;

pub use cpu::CpuKernels;

use crate::tuning::KernelTuning;

/// The ops and the kernel knobs they launch with. Cheap to clone (a captured
/// decode graph keeps a copy; the kernel choices are shared).
#[derive(Debug, Clone, Default)]
pub struct Ops {
    tuning: KernelTuning,
    cpu: CpuKernels,
    /// Projections may run on cuBLASLt (CUDA, the library loaded, not
    /// turned off with `--cublaslt false`).
    cublaslt: bool,
    /// The kernel of each projection shape (measured at warmup).
    choices: LinearChoices,
}

/// One projection shape timed at warmup: each candidate's microseconds per
/// call, and the winner.
#[derive(Debug, Clone, PartialEq)]
pub struct TunedShape {
    pub shape: LinearShape,
    pub timings: Vec<(LinearKernel, f64)>,
    pub chosen: LinearKernel,
    /// Whether the candidates were timed at this start (not: a single
    /// candidate, or the timings of an earlier start, [`tune_record`]).
    pub timed: bool,
}

impl Ops {
    /// The CUDA kernels' knobs, and the CPU kernels detected on this machine.
    pub fn new(tuning: KernelTuning) -> Self {
        Self {
            tuning,
            cpu: CpuKernels::detect(),
            cublaslt: false,
            choices: LinearChoices::default(),
        }
    }

    /// The CPU device's ops, with its kernels' settings.
    pub fn cpu(cpu: CpuKernels) -> Self {
        Self {
            tuning: KernelTuning::default(),
            cpu,
            cublaslt: false,
            choices: LinearChoices::default(),
        }
    }

    /// These ops with cuBLASLt projections on or off.
    pub fn with_cublaslt(mut self, on: bool) -> Self {
        self.cublaslt = on;
        self
    }

    pub fn tuning(&self) -> &KernelTuning {
        &self.tuning
    }

    pub fn cpu_kernels(&self) -> &CpuKernels {
        &self.cpu
    }

    /// The dtype weight matrices are stored in when it is not the device's
    /// float type: bf16 on the CPU with `--cpu-weights bf16` (which only the
    /// CPU's ops carry), else `None`.
    pub fn matrix_dtype(&self) -> Option<burn::tensor::DType> {
        (self.cpu.weights == crate::cpu_tuning::CpuWeights::Bf16)
            .then_some(burn::tensor::DType::BF16)
    }

    /// Whether projections may run on cuBLASLt.
    pub fn cublaslt(&self) -> bool {
        self.cublaslt
    }

    pub fn choices(&self) -> &LinearChoices {
        &self.choices
    }

    /// The failure of a library call queued during the last step, if any
    /// (cuBLASLt runs asynchronously on the device thread; a failed call
    /// leaves its output unwritten).
    pub fn take_error(&self) -> Option<String> {
        #[cfg(feature = "cuda")]
        if self.cublaslt {
            return cuda::cublaslt::take_error();
        }
        None
    }

    /// Times every candidate kernel of each of `shapes` on `device` and
    /// records the fastest (CUDA; nothing anywhere else). Shapes with a
    /// single candidate are recorded without timing, and so are shapes an
    /// earlier start of this binary timed ([`tune_record`], in the kernel
    /// cache directory).
    pub fn tune_linear(&self, device: &Device, shapes: &[LinearShape]) -> Vec<TunedShape> {
        #[cfg(feature = "cuda")]
        if cuda::is_cube_device(device) {
            let dir = cuda::runtime::kernel_cache_dir();
            let mut record = tune_record::TuneRecord::open(dir.as_deref());
            let tuned = shapes
                .iter()
                .filter_map(|&s| self.tune_shape(device, s, &mut record))
                .collect();
            record.save();
            return tuned;
        }
        let _ = (device, shapes);
        Vec::new()
    }

    /// The kernels that can run `shape` here.
    pub fn linear_candidates(&self, shape: LinearShape) -> Vec<LinearKernel> {
        let planned = plan::linear(&self.tuning, shape.rows, shape.n, shape.k, shape.lm_head);
        let mut out = Vec::new();
        if planned != plan::LinearPlan::Matmul {
            out.push(LinearKernel::Ember(planned));
        }
        if self.cublaslt {
            out.push(LinearKernel::Lt);
        }
        if out.is_empty() {
            out.push(LinearKernel::Matmul);
        }
        out
    }

    /// Whether projections on `device` store their weights out-major
    /// (`[out, in]`): on CUDA, where the decode kernels stream weight rows,
    /// and on the CPU, where [`cpu::gemv`] does.
    pub fn out_major_weights(device: &Device) -> bool {
        #[cfg(feature = "cuda")]
        if cuda::is_cube_device(device) {
            return true;
        }
        let _ = device;
        true
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
        if out_major {
            if let Some(y) = self.cpu_linear(&x, w, bias, &epilogue) {
                return y;
            }
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
        if let Some(y) = self.cpu_linear(&x, wte, None, &Epilogue::none()) {
            return y;
        }
        // A transposed view, which Flex's gemm and CubeCL's matmul read as is.
        x.matmul(wte.clone().transpose())
    }

    /// The CPU projection kernel ([`cpu::gemv`]) where it takes the step: at
    /// most [`CpuKernels::gemv_max_rows`] rows of f32 Flex tensors, or any
    /// number with bf16 weights; `w` is out-major. `None` sends the call to
    /// the tensor-op path.
    fn cpu_linear<const D: usize>(
        &self,
        x: &Tensor<D>,
        w: &Tensor<2>,
        bias: Option<&Tensor<1>>,
        epilogue: &Epilogue<D>,
    ) -> Option<Tensor<D>> {
        let dims = x.dims();
        let rows: usize = dims[..D - 1].iter().product();
        let [d_out, d_in] = w.dims();
        let row_cap = match w.dtype() {
            burn::tensor::DType::BF16 => usize::MAX,
            _ => self.cpu.gemv_max_rows,
        };
        if rows == 0 || rows > row_cap || dims[D - 1] != d_in {
            return None;
        }
        let residual = epilogue
            .residual
            .as_ref()
            .map(|r| r.clone().reshape([rows, d_out]));
        let y = cpu::gemv::linear(
            self.cpu.isa,
            &x.clone().reshape([rows, d_in]),
            w,
            bias,
            epilogue.gelu,
            residual.as_ref(),
        )?;
        let mut out = dims;
        out[D - 1] = d_out;
        Some(y.reshape(out))
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
    /// decode graph does); on the CPU a copy into the uniquely owned
    /// storage (`cpu::kv_write`).
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
        cpu::kv_write::kv_write(k, v, qkv, slots)
    }

    /// The step's new K/V rows (the K and V thirds of `qkv` `[N, 3E]`)
    /// written at `slots` (`[N]`) of the layer's storage, in place, then
    /// [`Ops::attention`] over it: one launch in a CUDA decode step (the
    /// attention kernel does the write), [`Ops::kv_write`] and
    /// [`Ops::attention`] anywhere else. Returns `[N, E]` and the storage.
    pub fn write_and_attend(
        &self,
        qkv: Tensor<2>,
        (k, v): (Tensor<3>, Tensor<3>),
        slots: Tensor<1, Int>,
        n_head: usize,
        context: &AttentionContext,
    ) -> (Tensor<2>, (Tensor<3>, Tensor<3>)) {
        #[cfg(feature = "cuda")]
        if let (AttentionContext::Paged(paged), true) = (context, cuda::on_cube(&qkv)) {
            let out =
                cuda::paged_decode_attention(&self.tuning, qkv, &k, &v, paged, n_head, Some(slots));
            return (out, (k, v));
        }
        let (k, v) = self.kv_write(k, v, qkv.clone(), slots);
        let out = self.attention(qkv, &k, &v, n_head, context);
        (out, (k, v))
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
                    return cuda::paged_decode_attention(
                        &self.tuning,
                        qkv,
                        k,
                        v,
                        paged,
                        n_head,
                        None,
                    );
                }
                cpu::paged_attention::decode_attention(self.cpu.isa, &qkv, k, v, paged, n_head)
            }
            AttentionContext::Segments(seg) => {
                #[cfg(feature = "cuda")]
                if cuda::on_cube(&qkv) {
                    return self.cuda_segment_attention(qkv, k, v, n_head, seg);
                }
                cpu::paged_attention::segment_attention(self.cpu.isa, &qkv, k, v, seg, n_head)
            }
        }
    }

    /// A CUDA projection on the kernel [`LinearChoices`] picks for its shape.
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
        let shape = LinearShape {
            rows,
            n: d_out,
            k: d_in,
            lm_head,
        };
        let planned = plan::linear(&self.tuning, rows, d_out, d_in, lm_head);
        let kernel = self.choices.choose(shape, planned, self.cublaslt);
        if kernel == LinearKernel::Matmul {
            return cuda::matmul_linear(x, w, bias, epilogue);
        }
        let epilogue = Epilogue {
            gelu: epilogue.gelu,
            residual: epilogue.residual.map(|r| r.reshape([rows, d_out])),
        };
        let y = self.run_linear(kernel, x.reshape([rows, d_in]), w, bias, epilogue);
        let mut out = dims;
        out[D - 1] = d_out;
        y.reshape(out)
    }

    /// `x` `[rows, k]` times the out-major `w` `[n, k]` transposed with the
    /// epilogue, on `kernel` (CUDA tensors).
    #[cfg(feature = "cuda")]
    pub fn run_linear(
        &self,
        kernel: LinearKernel,
        x: Tensor<2>,
        w: &Tensor<2>,
        bias: Option<&Tensor<1>>,
        epilogue: Epilogue<2>,
    ) -> Tensor<2> {
        let Epilogue { gelu, residual } = epilogue;
        match kernel {
            LinearKernel::Matmul => cuda::matmul_linear(x, w, bias, Epilogue { gelu, residual }),
            LinearKernel::Lt => cuda::lt_linear(x, w, bias, gelu, residual),
            LinearKernel::Ember(plan) => cuda::decode_linear(x, w, bias, gelu, residual, plan),
        }
    }

    /// Times `shape`'s candidates and records the winner (see
    /// [`Ops::tune_linear`]); `None` when nothing could be timed.
    #[cfg(feature = "cuda")]
    fn tune_shape(
        &self,
        device: &Device,
        shape: LinearShape,
        record: &mut tune_record::TuneRecord,
    ) -> Option<TunedShape> {
        let candidates = self.linear_candidates(shape);
        let recorded = record.timings(shape, &candidates);
        let timed = candidates.len() > 1 && recorded.is_none();
        let timings: Vec<(LinearKernel, f64)> = if candidates.len() == 1 {
            vec![(candidates[0], 0.0)]
        } else if let Some(recorded) = recorded {
            recorded
        } else {
            let timings: Vec<(LinearKernel, f64)> = candidates
                .iter()
                .filter_map(|&k| {
                    let ops = self.clone();
                    let run = move |x, w: &Tensor<2>, bias: Option<&Tensor<1>>, epilogue| {
                        ops.run_linear(k, x, w, bias, epilogue)
                    };
                    cuda::tune::time_linear(device, shape, run).map(|us| (k, us))
                })
                .collect();
            record.record(shape, &candidates, &timings);
            timings
        };
        let chosen = timings
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|&(k, _)| k)?;
        self.choices.record(shape, chosen);
        Some(TunedShape {
            shape,
            timings,
            chosen,
            timed,
        })
    }

    /// Prefill attention on CUDA: the causal tensor-core kernel where it
    /// applies (head_dim up to 64, not turned off with `--prefill-attention
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
        if self.tuning.prefill_attention && e3 / 3 / n_head <= 64 {
            return cuda::prefill_attention(qkv, k, v, seg);
        }
        reference::segment_attention(qkv, k, v, n_head, seg)
    }
}
