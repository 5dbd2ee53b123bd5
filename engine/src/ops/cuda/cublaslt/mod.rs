//! Projections on cuBLASLt, enqueued on CubeCL's own CUDA stream.
//!
//! CubeCL's matmuls stop at `mma.sync`; cuBLASLt uses Hopper's `wgmma` and
//! its epilogues (bias, bias + tanh-GELU, and the residual as `C` with
//! `beta = 1`), so a projection is one library kernel. The route (measured
//! first in `shared/spikes/cublaslt`):
//!
//! - **Loading**: cudarc's `cublaslt` bindings load `libcublasLt` at run time,
//!   like NVRTC: nothing CUDA is needed to build. [`available`] says whether
//!   the library is there; without it the ops stay on CubeCL's kernels.
//! - **Ordering**: the GEMM runs as a task on CubeCL's device thread
//!   ([`gemm::launch`]), queued behind every kernel launch before it and
//!   ahead of every one after it, exactly like a launch: the task resolves
//!   the buffers to device pointers (our cubecl-cuda diff makes a resolved
//!   buffer carry the stream it was resolved on) and calls `cublasLtMatmul`
//!   on that stream. The calling thread does not wait for it.
//! - **Graphs**: inside a CUDA graph capture the call is captured with the
//!   kernels around it; the diff records a resolved buffer's memory page as a
//!   launch does, so it outlives the graph. The workspace is allocated once,
//!   before any capture, and kept for the process ([`state`]).
//! - **Plans**: descriptors and the heuristic's algorithm are made once per
//!   shape ([`plans`], cached by `crate::ops::choice::PlanCache`), at warmup.
//! - **Failures**: a task cannot return an error to its caller, so a failed
//!   call is recorded and reported by [`take_error`] after the step (the
//!   step's logits are then not trusted).

pub mod gemm;
mod plans;
mod state;

pub use state::take_error;

/// Whether `libcublasLt` can be loaded here, or why not.
pub fn available() -> Result<(), String> {
    // Safety: only tries to open the library by its usual names.
    if unsafe { cudarc::cublaslt::sys::is_culib_present() } {
        Ok(())
    } else {
        Err("libcublasLt was not found (install the CUDA toolkit's libcublas, e.g. libcublas-13-0, or put it on LD_LIBRARY_PATH)".into())
    }
}
