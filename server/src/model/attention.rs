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
use super::paged_attention::decode_attention;

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

        // Head-major `[H, B, len, D]` views of `[B, len, E]` rows.
        let heads = |x: Tensor<3>, len: usize| x.reshape([b, len, h, d]).permute([2, 0, 1, 3]);
        let k = heads(k, q_len); // [H, B, Q, D]
        let v = heads(v, q_len);

        // Write every new token's K/V into its slot (padding into the padding block).
        let rows = |x: Tensor<4>| x.reshape([h, b * q_len, d]);
        let cache = cache.write(meta.write_slots.clone(), rows(k.clone()), rows(v.clone()));

        // Decode on the CPU: attention straight from the paged cache.
        if let (1, Some(slots), Some(lens)) = (q_len, &meta.context_slots, &meta.context_lens) {
            if let Some(out) = decode_attention(&q.clone().reshape([b, e]), &cache, slots, lens, h)
            {
                return (self.c_proj.forward(out.reshape([b, 1, e])), cache);
            }
        }

        // The context to attend over: `[H, B, T, D]`.
        let t = meta.context_len;
        let (k_ctx, v_ctx) = match &meta.context_slots {
            Some(slots) => {
                let (k, v) = cache.gather(slots.clone()); // [H, B*T, D]
                (k.reshape([h, b, t, d]), v.reshape([h, b, t, d]))
            }
            None => (k, v),
        };

        // Attention with heads outer and sequences inner; the `[B, 1, Q, T]`
        // mask is the same for every head.
        let q = heads(q, q_len); // [H, B, Q, D]
        let mask = meta
            .mask
            .clone()
            .reshape([1, b, q_len, t])
            .expand([h, b, q_len, t]);
        let options = AttentionModuleOptions {
            scale: None, // 1/sqrt(D), GPT-2's
            softcap: None,
            is_causal: false, // the mask carries causality and padding
        };
        let out = attention(q, k_ctx, v_ctx, Some(mask), None, options); // [H, B, Q, D]
        let out = out.permute([1, 2, 0, 3]).reshape([b, q_len, e]);
        (self.c_proj.forward(out), cache)
    }
}
