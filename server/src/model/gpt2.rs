//! The GPT-2 model: embeddings, blocks, final LayerNorm, tied LM head.
//!
//! The forward pass works on a padded batch of new tokens `[B, Q]` (prefill:
//! Q = longest prompt; decode: Q = 1) and computes logits only for one row per
//! sequence (`last_rows`), so the `[*, vocab]` projection costs `B` rows, not
//! `B*Q`. The LM head is `wte` transposed (GPT-2 ties them).

use burn::nn::Embedding;
use burn::prelude::*;

use super::block::{Block, BlockConfig};
use super::config::Gpt2Config;
use super::init::normal_init;
use super::kv_cache::{AttentionMeta, KvCache};
use super::layer_norm::{LayerNorm, LayerNormConfig};

impl Gpt2Config {
    /// Builds a GPT-2 with GPT-2's random initialization (normal, std 0.02),
    /// drawn from the backend's RNG.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Gpt2<B> {
        let block = BlockConfig::new(self.n_embd, self.n_head, self.layer_norm_epsilon);
        Gpt2 {
            wte: Embedding {
                weight: normal_init().init([self.vocab_size, self.n_embd], device),
            },
            wpe: Embedding {
                weight: normal_init().init([self.n_positions, self.n_embd], device),
            },
            blocks: (0..self.n_layer).map(|_| block.init(device)).collect(),
            ln_f: LayerNormConfig::new(self.n_embd)
                .with_epsilon(self.layer_norm_epsilon)
                .init(device),
        }
    }
}

/// GPT-2 (decoder-only transformer, pre-LN, tied LM head).
#[derive(Module, Debug)]
pub struct Gpt2<B: Backend> {
    /// Token embedding `[vocab, E]`, also the LM head (transposed).
    pub wte: Embedding<B>,
    /// Position embedding `[n_positions, E]`.
    pub wpe: Embedding<B>,
    pub blocks: Vec<Block<B>>,
    pub ln_f: LayerNorm<B>,
}

impl<B: Backend> Gpt2<B> {
    /// - `tokens`, `positions`: `[B, Q]` (padding rows hold any valid id/position)
    /// - `last_rows`: `[B]` index into the flattened `[B*Q]` rows of the row
    ///   whose logits each sequence needs
    /// - `cache`: written at `meta.write_slots` in every layer
    /// - returns logits `[B, vocab]`
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
        last_rows: Tensor<B, 1, Int>,
        meta: &AttentionMeta<B>,
        cache: &mut KvCache<B>,
    ) -> Tensor<B, 2> {
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
        // LM head tied to `wte`. Computed as (wte · lastᵀ)ᵀ so the big
        // [vocab, E] weight is used in its stored layout: multiplying by
        // `wteᵀ` instead makes the NdArray backend copy the whole transposed
        // weight (154 MB for gpt2) on every step. Only the small [vocab, B]
        // result is transposed.
        self.wte.weight.val().matmul(last.transpose()).transpose() // [B, vocab]
    }
}
