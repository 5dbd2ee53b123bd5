//! Causal multi-head self-attention (GPT-2's `attn`) over the paged KV cache.
//!
//! `c_attn` projects to Q, K and V at once (`[E, 3E]`, GPT-2's Conv1D layout,
//! which is Burn's `[in, out]`); the new K/V rows are written to the cache, then
//! attention runs over either the fresh K/V (prefill) or the gathered context
//! (decode). Masking is additive (see [`AttentionMeta::mask_bias`]).

use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::activation::softmax;

use super::init::linear;
use super::kv_cache::{AttentionMeta, LayerKv};

/// Configuration of [`Attention`].
#[derive(Config, Debug)]
pub struct AttentionConfig {
    pub n_embd: usize,
    pub n_head: usize,
}

impl AttentionConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> Attention<B> {
        let e = self.n_embd;
        Attention {
            c_attn: linear(e, 3 * e, device),
            c_proj: linear(e, e, device),
            n_head: self.n_head,
        }
    }
}

/// GPT-2 self-attention.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// Fused Q/K/V projection, `[E, 3E]`.
    pub c_attn: Linear<B>,
    /// Output projection, `[E, E]`.
    pub c_proj: Linear<B>,
    pub n_head: usize,
}

impl<B: Backend> Attention<B> {
    /// - `x`: `[B, Q, E]` normalized hidden states of the new tokens
    /// - `cache`: this layer's K/V storage, moved in and returned
    /// - returns `[B, Q, E]` and the updated cache
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: LayerKv<B>,
        meta: &AttentionMeta<B>,
    ) -> (Tensor<B, 3>, LayerKv<B>) {
        let [b, q_len, e] = x.dims();
        let h = self.n_head;
        let d = e / h;

        let qkv = self.c_attn.forward(x); // [B, Q, 3E]
        let q = qkv.clone().slice([0..b, 0..q_len, 0..e]);
        let k = qkv.clone().slice([0..b, 0..q_len, e..2 * e]);
        let v = qkv.slice([0..b, 0..q_len, 2 * e..3 * e]);

        // Write the real new tokens' K/V into their slots.
        let k_rows = k.clone().reshape([b * q_len, e]);
        let v_rows = v.clone().reshape([b * q_len, e]);
        let (k_rows, v_rows) = match &meta.write_rows {
            Some(rows) => (
                k_rows.select(0, rows.clone()),
                v_rows.select(0, rows.clone()),
            ),
            None => (k_rows, v_rows),
        };
        let cache = cache.write(meta.write_slots.clone(), k_rows, v_rows);

        // The context to attend over: `[B, T, E]`.
        let t = meta.context_len;
        let (k_ctx, v_ctx) = match &meta.context_slots {
            Some(slots) => (
                cache.k.clone().select(0, slots.clone()).reshape([b, t, e]),
                cache.v.clone().select(0, slots.clone()).reshape([b, t, e]),
            ),
            None => (k, v),
        };

        let heads = |x: Tensor<B, 3>, len: usize| x.reshape([b, len, h, d]).swap_dims(1, 2);
        let q = heads(q, q_len); // [B, H, Q, D]
        let k_ctx = heads(k_ctx, t); // [B, H, T, D]
        let v_ctx = heads(v_ctx, t); // [B, H, T, D]

        let scores = q.matmul(k_ctx.swap_dims(2, 3)) * (1.0 / (d as f64).sqrt()); // [B, H, Q, T]
        let scores = scores + meta.mask_bias.clone();
        let probs = softmax(scores, 3);
        let out = probs.matmul(v_ctx); // [B, H, Q, D]
        let out = out.swap_dims(1, 2).reshape([b, q_len, e]);
        (self.c_proj.forward(out), cache)
    }
}
