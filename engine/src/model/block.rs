//! One pre-LN transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.

use burn::prelude::*;

use super::attention::Attention;
use super::kv_cache::{AttentionMeta, LayerKv};
use super::layer_norm::LayerNorm;
use super::mlp::Mlp;
use crate::ops::Ops;

/// A GPT-2 transformer block.
#[derive(Module, Debug)]
pub struct Block {
    pub ln_1: LayerNorm,
    pub attn: Attention,
    pub ln_2: LayerNorm,
    pub mlp: Mlp,
}

impl Block {
    /// `x`: `[N, E]` -> `[N, E]`; the layer's cache is moved in and returned.
    pub fn forward(
        &self,
        ops: &Ops,
        x: Tensor<2>,
        cache: LayerKv,
        meta: &AttentionMeta,
    ) -> (Tensor<2>, LayerKv) {
        let normed = self.ln_1.forward(ops, x.clone());
        let (x, cache) = self.attn.forward(ops, normed, x, cache, meta);
        let x = self.mlp.forward(ops, self.ln_2.forward(ops, x.clone()), x);
        (x, cache)
    }
}
