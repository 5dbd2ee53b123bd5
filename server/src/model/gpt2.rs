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
        tokens: Tensor<2, Int>,
        positions: Tensor<2, Int>,
        last_rows: Tensor<1, Int>,
        meta: &AttentionMeta,
        cache: &mut KvCache,
    ) -> Tensor<2> {
        let [b, q] = tokens.dims();
        let mut x = self.wte.forward(tokens) + self.wpe.forward(positions); // [B, Q, E]
        let e = x.dims()[2];

        // Move each layer's storage through its block so writes are in place.
        let layers = std::mem::take(&mut cache.layers);
        let mut updated = Vec::with_capacity(layers.len());
        for (block, layer) in self.blocks.iter().zip(layers) {
            let (y, layer) = block.forward(x, layer, meta);
            x = y;
            updated.push(layer);
        }
        cache.layers = updated;

        let last = x.reshape([b * q, e]).select(0, last_rows); // [B, E]
        let last = self.ln_f.forward(last);
        // LM head tied to `wte` ([vocab, E]), used in its stored layout: a
        // transposed view, which Flex's gemm and CubeCL's matmul read as is,
        // or on CUDA for decode-sized batches the GEMV kernel, which reads
        // `[vocab, E]` rows directly.
        let wte = self.wte.weight.val();
        #[cfg(feature = "cuda")]
        if b <= super::cuda_kernels::lm_head_gemv_max_rows() && super::cuda_kernels::on_cube(&last)
        {
            return super::cuda_kernels::decode_linear(
                last,
                &wte,
                None,
                super::cuda_kernels::GemvEpilogue::default(),
            );
        }
        last.matmul(wte.transpose()) // [B, vocab]
    }
}
