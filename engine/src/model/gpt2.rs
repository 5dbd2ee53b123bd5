//! The GPT-2 model: embeddings, blocks, final LayerNorm, tied LM head.
//!
//! The forward pass works on one flat sequence of a step's `N` new tokens
//! (`[N, E]` activations): a decode step's one token per sequence, or a
//! prefill step's prompt tokens of every row concatenated. Where each token's
//! keys and values are is the step's [`AttentionMeta`]'s business. Logits are
//! computed only for one token per row (`last_rows`), so the `[*, vocab]`
//! projection costs `R` rows, not `N`. The LM head is `wte` transposed
//! (GPT-2 ties them).

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
    /// - `tokens`, `positions`: `[N]` (padding tokens hold any valid id/position)
    /// - `last_rows`: `[R]` index into the `N` tokens of the one whose logits
    ///   each row needs
    /// - `cache`: written at `meta.write_slots` in every layer
    /// - returns logits `[R, vocab]`
    pub fn forward(
        &self,
        ops: &Ops,
        tokens: Tensor<1, Int>,
        positions: Tensor<1, Int>,
        last_rows: Tensor<1, Int>,
        meta: &AttentionMeta,
        cache: &mut KvCache,
    ) -> Tensor<2> {
        let [n] = tokens.dims();
        let embed = |table: &Embedding, ids: Tensor<1, Int>| {
            let x = table.forward(ids.reshape([1, n])); // [1, N, E]
            let e = x.dims()[2];
            x.reshape([n, e])
        };
        let pos = embed(&self.wpe, positions);
        // `wte` may be stored narrower than the activations (bf16 on the CPU
        // with `--cpu-weights bf16`); the cast is free when it is not.
        let mut x = embed(&self.wte, tokens).cast(pos.dtype()) + pos; // [N, E]

        // Move each layer's storage through its block so writes are in place.
        let layers = std::mem::take(&mut cache.layers);
        let mut updated = Vec::with_capacity(layers.len());
        for (block, layer) in self.blocks.iter().zip(layers) {
            let (y, layer) = block.forward(ops, x, layer, meta);
            x = y;
            updated.push(layer);
        }
        cache.layers = updated;

        let last = x.select(0, last_rows); // [R, E]
        let last = self.ln_f.forward(ops, last);
        // LM head tied to `wte` (`[vocab, E]`), used in its stored layout.
        ops.lm_head(last, &self.wte.weight.val()) // [R, vocab]
    }
}
