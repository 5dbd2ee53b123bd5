//! LayerNorm's parameters; the op ([`crate::ops::Ops::layer_norm`]) computes
//! the statistics in f32 whatever the model's dtype (GPT-2's residual stream
//! overflows f16 when squared).

use burn::module::Param;
use burn::prelude::*;

use crate::ops::Ops;

/// `y = (x - mean) / sqrt(var + eps) * gamma + beta` over the last dimension
/// (biased variance, as PyTorch).
#[derive(Module, Debug)]
pub struct LayerNorm {
    /// Scale `[d_model]` (HF: `weight`).
    pub gamma: Param<Tensor<1>>,
    /// Shift `[d_model]` (HF: `bias`).
    pub beta: Param<Tensor<1>>,
    pub epsilon: f64,
}

impl LayerNorm {
    /// `[..., d_model]` -> `[..., d_model]`, same dtype as the input.
    pub fn forward<const D: usize>(&self, ops: &Ops, x: Tensor<D>) -> Tensor<D> {
        ops.layer_norm(x, &self.gamma.val(), &self.beta.val(), self.epsilon)
    }
}
