//! GPT-2's parameter initialization: weights and embeddings normal with std
//! 0.02, biases 0 (LayerNorm's 1/0 comes from `LayerNormConfig`).

use burn::module::Initializer;
use burn::nn::Linear;
use burn::prelude::*;

/// Standard deviation of GPT-2's weight initialization.
pub const INIT_STD: f64 = 0.02;

/// The initializer of every GPT-2 weight matrix and embedding.
pub fn normal_init() -> Initializer {
    Initializer::Normal {
        mean: 0.0,
        std: INIT_STD,
    }
}

/// A `[d_in, d_out]` linear layer (GPT-2's Conv1D layout) with GPT-2's init.
pub fn linear<B: Backend>(d_in: usize, d_out: usize, device: &B::Device) -> Linear<B> {
    Linear {
        weight: normal_init().init([d_in, d_out], device),
        bias: Some(Initializer::Zeros.init([d_out], device)),
    }
}
