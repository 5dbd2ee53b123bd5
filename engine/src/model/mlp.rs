//! GPT-2's feed-forward: `c_proj(gelu_tanh(c_fc(x)))`, 4x wide, with the GELU
//! and the residual add in the projections' epilogues.

use burn::prelude::*;

use super::linear::Linear;
use crate::ops::{Epilogue, Ops};

/// GPT-2 MLP.
#[derive(Module, Debug)]
pub struct Mlp {
    /// `[E, 4E]`.
    pub c_fc: Linear,
    /// `[4E, E]`.
    pub c_proj: Linear,
}

impl Mlp {
    /// `residual + mlp(x)`: `[N, E]` -> `[N, E]`.
    pub fn forward(&self, ops: &Ops, x: Tensor<2>, residual: Tensor<2>) -> Tensor<2> {
        let hidden = self.c_fc.forward(ops, x, Epilogue::gelu());
        self.c_proj.forward(ops, hidden, Epilogue::add(residual))
    }
}
