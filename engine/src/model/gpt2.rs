//! The GPT-2 model: embeddings, blocks, final LayerNorm, tied LM head.
//!
//! The forward pass works on a padded batch of new tokens `[B, Q]` (prefill:
//! Q = longest prompt; decode: Q = 1) and computes logits only for one row per
//! sequence (`last_rows`), so the `[*, vocab]` projection costs `B` rows, not
//! `B*Q`. The LM head is `wte` transposed (GPT-2 ties them).

use burn::nn::Embedding;
use burn::prelude::*;

use super::block::Block;
use super::kv_cache::{AttentionMeta, KvCache};
use super::layer_norm::LayerNorm;
use crate::ops::Ops;

/// GPT-2 (decoder-only transformer, pre-LN, tied LM head).
#[derive(Module, Debug)]
pub struct Gpt2 {
    /// Token embedding `[vocab, E]`, also the LM head (transposed).
    pub wte: Embedding,
    /// Position embedding `[n_positions, E]`.
    pub wpe: Embedding,
    pub blocks: Vec<Block>,
    pub ln_f: LayerNorm,
}

impl Gpt2 {
    /// - `tokens`, `positions`: `[B, Q]` (padding rows hold any valid id/position)
    /// - `last_rows`: `[B]` index into the flattened `[B*Q]` rows of the row
    ///   whose logits each sequence needs
    /// - `cache`: written at `meta.write_slots` in every layer
    /// - returns logits `[B, vocab]`
    pub fn forward(
        &self,
        ops: &Ops,
        tokens: Tensor<2, Int>,
        positions: Tensor<2, Int>,
        last_rows: Tensor<1, Int>,
        meta: &AttentionMeta,
        cache: &mut KvCache,
    ) -> Tensor<2> {
        let [b, q] = tokens.dims();
        let pos = self.wpe.forward(positions);
        // `wte` may be stored narrower than the activations (bf16 on the CPU
        // with `--cpu-weights bf16`); the cast is free when it is not.
        let mut x = self.wte.forward(tokens).cast(pos.dtype()) + pos; // [B, Q, E]
        let e = x.dims()[2];

        // Move each layer's storage through its block so writes are in place.
        let layers = std::mem::take(&mut cache.layers);
        let mut updated = Vec::with_capacity(layers.len());
        for (block, layer) in self.blocks.iter().zip(layers) {
            let (y, layer) = block.forward(ops, x, layer, meta);
            x = y;
            updated.push(layer);
        }
        cache.layers = updated;

        let last = x.reshape([b * q, e]).select(0, last_rows); // [B, E]
        let last = self.ln_f.forward(ops, last);
        // LM head tied to `wte` (`[vocab, E]`), used in its stored layout.
        ops.lm_head(last, &self.wte.weight.val()) // [B, vocab]
    }
}
