//! GPT-2's feed-forward: `c_proj(gelu_tanh(c_fc(x)))`, 4x wide.
//!
//! GPT-2 uses the tanh approximation of GELU (`gelu_new` in transformers).

use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::activation::gelu_approximate;

use super::init::linear;

/// Configuration of [`Mlp`].
#[derive(Config, Debug)]
pub struct MlpConfig {
    pub n_embd: usize,
}

impl MlpConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> Mlp<B> {
        let e = self.n_embd;
        Mlp {
            c_fc: linear(e, 4 * e, device),
            c_proj: linear(4 * e, e, device),
        }
    }
}

/// GPT-2 MLP.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[E, 4E]`.
    pub c_fc: Linear<B>,
    /// `[4E, E]`.
    pub c_proj: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    /// `[B, Q, E]` -> `[B, Q, E]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.c_proj.forward(gelu_approximate(self.c_fc.forward(x)))
    }
}
