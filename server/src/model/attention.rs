//! Causal multi-head self-attention (GPT-2's `attn`) over the paged KV cache.
//!
//! `c_attn` projects to Q, K and V at once (`[E, 3E]`, GPT-2's Conv1D layout,
//! which is Burn's `[in, out]`); the new K/V rows are written to the cache, then
//! attention runs over either the fresh K/V (prefill) or the gathered context
//! (decode) through Burn's fused attention op (Flex: a native kernel; CUDA: the
//! flash kernel, which a boolean mask and the default scale keep it on).

use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use super::kv_cache::{AttentionMeta, LayerKv};

/// GPT-2 self-attention.
#[derive(Module, Debug)]
pub struct Attention {
    /// Fused Q/K/V projection, `[E, 3E]`.
    pub c_attn: Linear,
    /// Output projection, `[E, E]`.
    pub c_proj: Linear,
    pub n_head: usize,
}

impl Attention {
    /// - `x`: `[B, Q, E]` normalized hidden states of the new tokens
    /// - `cache`: this layer's K/V storage, moved in and returned
    /// - returns `[B, Q, E]` and the updated cache
    pub fn forward(
        &self,
        x: Tensor<3>,
        cache: LayerKv,
        meta: &AttentionMeta,
    ) -> (Tensor<3>, LayerKv) {
        let [b, q_len, e] = x.dims();
        let h = self.n_head;
        let d = e / h;

        let qkv = self.c_attn.forward(x); // [B, Q, 3E]
        let q = qkv.clone().slice([0..b, 0..q_len, 0..e]);
        let k = qkv.clone().slice([0..b, 0..q_len, e..2 * e]);
        let v = qkv.slice([0..b, 0..q_len, 2 * e..3 * e]);

        // Write every new token's K/V into its slot (padding into the padding block).
        let k_rows = k.clone().reshape([b * q_len, e]);
        let v_rows = v.clone().reshape([b * q_len, e]);
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

        let heads = |x: Tensor<3>, len: usize| x.reshape([b, len, h, d]).swap_dims(1, 2);
        let q = heads(q, q_len); // [B, H, Q, D]
        let k_ctx = heads(k_ctx, t); // [B, H, T, D]
        let v_ctx = heads(v_ctx, t); // [B, H, T, D]

        let mask = meta.mask.clone().expand([b, h, q_len, t]);
        let options = AttentionModuleOptions {
            scale: None, // 1/sqrt(D), GPT-2's
            softcap: None,
            is_causal: false, // the mask carries causality and padding
        };
        let out = attention(q, k_ctx, v_ctx, Some(mask), None, options); // [B, H, Q, D]
        let out = out.swap_dims(1, 2).reshape([b, q_len, e]);
        (self.c_proj.forward(out), cache)
    }
}
