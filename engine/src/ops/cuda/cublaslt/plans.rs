//! One cuBLASLt plan per GEMM shape: the matmul descriptor (transpose, f32
//! compute, the epilogue), the matrix layouts and the algorithm the
//! heuristic picks for them with our workspace.
//!
//! Layouts are column-major views of our row-major tensors: `X [m, k]` is
//! `[k, m]`, the out-major weight `W [n, k]` is `[k, n]` used transposed, and
//! `D [m, n]` is `[n, m]`: `D = op_T(W) X (+ beta C)`, f16 in and out, f32
//! accumulation. `C` (the residual, when there is one) has `D`'s layout.

use std::ffi::c_void;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

use crate::ops::choice::{GemmEpilogue, GemmKey};

/// Bytes of the one cuBLASLt workspace per device (NVIDIA's advice on Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// The raw cuBLASLt objects of one shape.
#[derive(Debug)]
pub struct Plan {
    pub desc: sys::cublasLtMatmulDesc_t,
    pub a: sys::cublasLtMatrixLayout_t,
    pub b: sys::cublasLtMatrixLayout_t,
    pub d: sys::cublasLtMatrixLayout_t,
    pub algo: sys::cublasLtMatmulAlgo_t,
}

// Safety: plain handles to objects cuBLASLt owns; they are only used under
// the device state's lock.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // Safety: each handle was created once, here, and is destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// Makes the plan of `key` on `handle` (see the module docs).
pub fn make(handle: sys::cublasLtHandle_t, key: &GemmKey) -> Result<Plan, String> {
    use sys::cudaDataType::CUDA_R_16F;
    let fail =
        |what: &str, e: cudarc::cublaslt::result::CublasError| format!("cuBLASLt {what}: {e:?}");
    let desc = lt::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType::CUDA_R_32F,
    )
    .map_err(|e| fail("matmul descriptor", e))?;
    let (m, n, k) = (key.m as u64, key.n as u64, key.k as u64);
    let layouts = (
        lt::create_matrix_layout(CUDA_R_16F, k, n, k as i64),
        lt::create_matrix_layout(CUDA_R_16F, k, m, k as i64),
        lt::create_matrix_layout(CUDA_R_16F, n, m, n as i64),
    );
    let (a, b, d) = match layouts {
        (Ok(a), Ok(b), Ok(d)) => (a, b, d),
        (a, b, d) => {
            // Safety: whatever was created is destroyed once.
            unsafe {
                for l in [a, b, d].into_iter().flatten() {
                    let _ = lt::destroy_matrix_layout(l);
                }
                let _ = lt::destroy_matmul_desc(desc);
            }
            return Err("cuBLASLt matrix layouts could not be made".into());
        }
    };
    // From here on a failure drops the plan, which destroys every handle.
    let mut plan = Plan {
        desc,
        a,
        b,
        d,
        // Filled by the heuristic below.
        algo: unsafe { std::mem::zeroed() },
    };
    set_attribute(
        desc,
        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
        &1i32,
    )
    .map_err(|e| fail("transpose", e))?;
    let epilogue = match key.epilogue {
        GemmEpilogue::None => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
        GemmEpilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        GemmEpilogue::GeluBias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        GemmEpilogue::Gelu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
    };
    set_attribute(
        desc,
        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
        &epilogue,
    )
    .map_err(|e| fail("epilogue", e))?;
    if matches!(key.epilogue, GemmEpilogue::Bias | GemmEpilogue::GeluBias) {
        let f16 = sys::cudaDataType::CUDA_R_16F;
        set_attribute(
            desc,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
            &f16,
        )
        .map_err(|e| fail("bias type", e))?;
    }
    plan.algo = heuristic(handle, &plan).map_err(|e| fail("algorithm heuristic", e))?;
    Ok(plan)
}

/// Points the plan's bias epilogue at `bias` (a device pointer) for the next call.
pub fn set_bias(plan: &Plan, bias: u64) -> Result<(), String> {
    let ptr = bias as *const c_void;
    set_attribute(
        plan.desc,
        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
        &ptr,
    )
    .map_err(|e| format!("cuBLASLt bias pointer: {e:?}"))
}

/// Sets a matmul descriptor attribute to `value`.
fn set_attribute<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attribute: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), lt::CublasError> {
    // Safety: `value` is a live `T` of exactly the size given.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attribute,
            value as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
}

/// The heuristic's first algorithm for the plan with our workspace.
fn heuristic(
    handle: sys::cublasLtHandle_t,
    plan: &Plan,
) -> Result<sys::cublasLtMatmulAlgo_t, lt::CublasError> {
    let pref = lt::create_matmul_pref()?;
    let workspace = WORKSPACE_BYTES as u64;
    // Safety: the preference, descriptor and layouts are live; the preference
    // is destroyed once, whatever the outcome.
    unsafe {
        let found = lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &workspace as *const u64 as *const c_void,
            8,
        )
        .and_then(|()| {
            lt::get_matmul_algo_heuristic(handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref)
        });
        let _ = lt::destroy_matmul_pref(pref);
        found.map(|h| h.algo)
    }
}
