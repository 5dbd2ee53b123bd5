//! One cuBLASLt GEMM, `out = x w^T (+ bias) (then GELU) (+ residual)`,
//! queued as a task on CubeCL's device thread (see the module docs of
//! [`super`]): the calling thread allocates the output and goes on; the task
//! resolves the buffers on the device thread, in order with the kernel
//! launches queued before it, and enqueues `cublasLtMatmul` on their stream.

use std::ffi::c_void;

use burn::backend::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use cubecl::server::{BufferBinding, ServerStorage};
use cubecl_common::device::DeviceId;
use cubecl_common::device_handle::DeviceHandle;
use cubecl_environment::stream::StreamId;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

use super::plans::{self, WORKSPACE_BYTES};
use super::state;
use crate::ops::choice::{GemmEpilogue, GemmKey};
use crate::ops::cuda::launch::{empty_like, projection_kernel, Projection};

/// CubeCL's CUDA server, the service the tasks run on.
type CudaServer = <cubecl_cuda::CudaRuntime as cubecl::__private::Runtime>::Server;

/// The buffers one GEMM reads and writes, as the device thread resolves them.
struct Bindings {
    x: BufferBinding,
    w: BufferBinding,
    bias: Option<BufferBinding>,
    residual: Option<BufferBinding>,
    out: BufferBinding,
    workspace: BufferBinding,
}

projection_kernel! {
    /// On cuBLASLt (its epilogues: bias, bias + tanh-GELU; the residual as
    /// `C` with `beta = 1`, added before the epilogue, so not with `gelu`:
    /// `crate::ops::cuda::lt_linear` splits that pair), enqueued on CubeCL's
    /// stream.
    pub fn LtLinear::lt_linear()
}

/// `p` on cuBLASLt, f16 (`x` `[m, k]` times the out-major `w` `[n, k]`
/// transposed, plus `bias` `[n]`, through tanh-GELU when `gelu`, plus
/// `residual` `[m, n]`). Returns `[m, n]` (written when the queued task
/// runs).
pub fn launch(p: Projection) -> CubeTensor {
    let [m, k] = p.x.shape().dims::<2>();
    let [n, _] = p.w.shape().dims::<2>();
    let out = empty_like(&p.x, [m, n]);
    let device = p.x.client.service_id().device;
    let client = p.x.client.clone();
    let workspace = state::workspace(device, || client.empty(WORKSPACE_BYTES));
    let key = GemmKey {
        m,
        n,
        k,
        epilogue: GemmEpilogue::of(p.bias.is_some(), p.gelu),
        residual: p.residual.is_some(),
    };
    let bindings = Bindings {
        x: p.x.handle.clone().binding(),
        w: p.w.handle.clone().binding(),
        bias: p.bias.map(|b| b.handle.clone().binding()),
        residual: p.residual.map(|r| r.handle.clone().binding()),
        out: out.handle.clone().binding(),
        workspace: workspace.binding(),
    };
    DeviceHandle::<CudaServer>::new(device).submit(move |server| {
        if let Err(message) = run(server, device, key, bindings) {
            state::record_error(message);
        }
    });
    out
}

/// The task: resolves the buffers on the stream of the submitting thread and
/// enqueues the matmul there.
fn run(server: &mut CudaServer, device: DeviceId, key: GemmKey, b: Bindings) -> Result<(), String> {
    let stream_id = StreamId::current();
    let mut resolve = |binding: BufferBinding| {
        server
            .get_resource(binding, stream_id)
            .map_err(|e| format!("resolving a GEMM buffer: {e:?}"))
    };
    let x = resolve(b.x)?;
    let w = resolve(b.w)?;
    let bias = b.bias.map(&mut resolve).transpose()?;
    let residual = b.residual.map(&mut resolve).transpose()?;
    let out = resolve(b.out)?;
    let workspace = resolve(b.workspace)?;
    let stream = out.resource().stream as sys::cudaStream_t;
    let pointers = Pointers {
        x: x.resource().ptr,
        w: w.resource().ptr,
        bias: bias.as_ref().map(|b| b.resource().ptr),
        residual: residual.as_ref().map(|r| r.resource().ptr),
        out: out.resource().ptr,
        workspace: workspace.resource().ptr,
    };
    state::with_device(device, |lt_device| {
        let handle = lt_device.handle()?;
        let plan = lt_device
            .plans
            .get_or_make(key, |key| plans::make(handle, key))?;
        matmul(handle, plan, &pointers, stream)
    })
    .unwrap_or_else(|| Err("no cuBLASLt state for this device".into()))
}

/// Device pointers of one call.
struct Pointers {
    x: u64,
    w: u64,
    bias: Option<u64>,
    residual: Option<u64>,
    out: u64,
    workspace: u64,
}

/// Enqueues `D = W^T X (+ C)` with the plan's epilogue on `stream`.
fn matmul(
    handle: sys::cublasLtHandle_t,
    plan: &plans::Plan,
    p: &Pointers,
    stream: sys::cudaStream_t,
) -> Result<(), String> {
    if let Some(bias) = p.bias {
        plans::set_bias(plan, bias)?;
    }
    let alpha = 1.0f32;
    let beta = if p.residual.is_some() { 1.0f32 } else { 0.0 };
    let c = p.residual.unwrap_or(p.out);
    // Safety: every pointer is a live device buffer of the plan's shape,
    // resolved on `stream` just above; the plan's objects are live.
    unsafe {
        lt::matmul(
            handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            p.w as *const c_void,
            plan.a,
            p.x as *const c_void,
            plan.b,
            c as *const c_void,
            plan.d,
            p.out as *mut c_void,
            plan.d,
            &plan.algo,
            p.workspace as *mut c_void,
            WORKSPACE_BYTES,
            stream,
        )
    }
    .map_err(|e| format!("cublasLtMatmul: {e:?}"))
}
