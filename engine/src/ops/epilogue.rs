//! [`Epilogue`]: what a projection does to its result after the bias, as
//! every projection path takes it (the CUDA kernels, cuBLASLt, the CPU
//! kernels through [`crate::ops::Ops`], the tensor-op reference). A file of
//! its own, below all of them, so none imports it back from `ops/mod.rs`.

use burn::prelude::*;

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
