//! A projection's parameters: `y = x W + b` over the last dimension.
//!
//! GPT-2 stores its projections `[in, out]` (Conv1D). Where
//! [`Ops::out_major_weights`] says so (CUDA and the CPU, today) the weight is
//! stored out-major, `[out, in]` (PyTorch's `nn.Linear` layout), so that
//! decode steps, whose few rows make a matmul a matrix-vector product, can
//! stream contiguous weight rows. The layout is chosen once, at load
//! ([`super::weights`]); [`Ops::linear`] reads either.

use burn::module::Param;
use burn::prelude::*;

use crate::ops::{Epilogue, Ops};

/// `y = x W + b` over the last dimension.
#[derive(Module, Debug)]
pub struct Linear {
    /// `[d_in, d_out]`, or `[d_out, d_in]` when `out_major`.
    pub weight: Param<Tensor<2>>,
    /// `[d_out]`.
    pub bias: Option<Param<Tensor<1>>>,
    pub out_major: bool,
}

impl Linear {
    /// `[..., d_in]` -> `[..., d_out]`, then `epilogue` (GELU, residual).
    pub fn forward<const D: usize>(
        &self,
        ops: &Ops,
        x: Tensor<D>,
        epilogue: Epilogue<D>,
    ) -> Tensor<D> {
        let bias = self.bias.as_ref().map(Param::val);
        ops.linear(
            x,
            &self.weight.val(),
            bias.as_ref(),
            self.out_major,
            epilogue,
        )
    }
}
