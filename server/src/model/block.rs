//! One pre-LN transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.

use burn::prelude::*;

use super::attention::{Attention, AttentionConfig};
use super::kv_cache::{AttentionMeta, LayerKv};
use super::layer_norm::{LayerNorm, LayerNormConfig};
use super::mlp::{Mlp, MlpConfig};

/// Configuration of [`Block`].
#[derive(Config, Debug)]
pub struct BlockConfig {
    pub n_embd: usize,
    pub n_head: usize,
    pub layer_norm_epsilon: f64,
}

impl BlockConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> Block<B> {
        let ln = LayerNormConfig::new(self.n_embd).with_epsilon(self.layer_norm_epsilon);
        Block {
            ln_1: ln.init(device),
            attn: AttentionConfig::new(self.n_embd, self.n_head).init(device),
            ln_2: ln.init(device),
            mlp: MlpConfig::new(self.n_embd).init(device),
        }
    }
}

/// A GPT-2 transformer block.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    pub ln_1: LayerNorm<B>,
    pub attn: Attention<B>,
    pub ln_2: LayerNorm<B>,
    pub mlp: Mlp<B>,
}

impl<B: Backend> Block<B> {
    /// `x`: `[B, Q, E]` -> `[B, Q, E]`; the layer's cache is moved in and returned.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: LayerKv<B>,
        meta: &AttentionMeta<B>,
    ) -> (Tensor<B, 3>, LayerKv<B>) {
        let (a, cache) = self.attn.forward(self.ln_1.forward(x.clone()), cache, meta);
        let x = x + a;
        let x = x.clone() + self.mlp.forward(self.ln_2.forward(x));
        (x, cache)
    }
}
