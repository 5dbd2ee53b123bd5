//! Causal multi-head self-attention (GPT-2's `attn`) over the paged KV cache.
//!
//! `c_attn` projects to Q, K and V at once (`[E, 3E]`, GPT-2's Conv1D layout,
//! which is Burn's `[in, out]`); the new K/V rows are written to the cache, then
//! attention runs over either the fresh K/V (prefill) or the gathered context
//! (decode) through Burn's fused attention op (Flex: a native kernel; CUDA: the
//! flash kernel, which a boolean mask and the default scale keep it on). On
//! CUDA, decode reads the paged cache in its own kernel and a prefill without
//! a cached prefix runs the causal tensor-core kernel over `qkv` as it is
//! (`cuda_kernels`).

use burn::prelude::*;

use super::linear::{Epilogue, Linear};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use super::kv_cache::{AttentionMeta, LayerKv, PagedContext};
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
    /// - `residual`: `[B, Q, E]`, added to the output (in `c_proj`'s epilogue)
    /// - `cache`: this layer's K/V storage, moved in and returned
    /// - returns `residual + attn(x)` `[B, Q, E]` and the updated cache
    pub fn forward(
        &self,
        x: Tensor<3>,
        residual: Tensor<3>,
        cache: LayerKv,
        meta: &AttentionMeta,
    ) -> (Tensor<3>, LayerKv) {
        let [b, q_len, e] = x.dims();
        let h = self.n_head;
        let d = e / h;

        let qkv = self.c_attn.forward(x).reshape([b * q_len, 3 * e]); // [B*Q, 3E]

        // Write every new token's K/V into its slot (padding into the padding block).
        let cache = cache.write_rows(meta.write_slots.clone(), qkv.clone());

        // Decode: attention straight from the paged cache.
        if let (1, Some(paged)) = (q_len, &meta.paged) {
            let out = paged_decode(qkv, &cache, paged, h).reshape([b, 1, e]);
            return (self.c_proj.forward_with(out, add(residual)), cache);
        }

        // Prefill without a cached prefix on CUDA: the tensor-core causal
        // kernel reads Q, K and V from `qkv` as they are.
        #[cfg(feature = "cuda")]
        if meta.context_slots.is_none()
            && super::cuda_kernels::prefill_attention_fits(&qkv, q_len, d)
        {
            let out = super::cuda_kernels::prefill_attention(qkv, q_len).reshape([b, q_len, e]);
            return (self.c_proj.forward_with(out, add(residual)), cache);
        }

        // Head-major `[H, B, len, D]` views of `[B*len, E]` rows.
        let heads = |x: Tensor<2>, len: usize| x.reshape([b, len, h, d]).permute([2, 0, 1, 3]);
        let n = b * q_len;
        let q = qkv.clone().slice([0..n, 0..e]);

        // The context to attend over: `[H, B, T, D]`.
        let t = meta.context_len;
        let (k_ctx, v_ctx) = match &meta.context_slots {
            Some(slots) => {
                let (k, v) = cache.gather(slots.clone()); // [H, B*T, D]
                (k.reshape([h, b, t, d]), v.reshape([h, b, t, d]))
            }
            None => (
                heads(qkv.clone().slice([0..n, e..2 * e]), q_len),
                heads(qkv.slice([0..n, 2 * e..3 * e]), q_len),
            ),
        };

        // Attention with heads outer and sequences inner; the `[B, 1, Q, T]`
        // mask is the same for every head.
        let q = heads(q, q_len); // [H, B, Q, D]
        let mask = meta
            .mask
            .clone()
            .map(|m| m.reshape([1, b, q_len, t]).expand([h, b, q_len, t]));
        let options = AttentionModuleOptions {
            scale: None, // 1/sqrt(D), GPT-2's
            softcap: None,
            is_causal: false, // the mask carries causality and padding
        };
        let out = attention(q, k_ctx, v_ctx, mask, None, options); // [H, B, Q, D]
        let out = out.permute([1, 2, 0, 3]).reshape([b, q_len, e]);
        (self.c_proj.forward_with(out, add(residual)), cache)
    }
}

/// The epilogue that adds `residual`.
fn add(residual: Tensor<3>) -> Epilogue<3> {
    Epilogue {
        gelu: false,
        residual: Some(residual),
    }
}

/// Paged decode attention of the Q third of `qkv` (`[B, 3E]`): the CubeCL
/// kernel on CUDA, the native kernel on the CPU. Returns `[B, E]`.
fn paged_decode(qkv: Tensor<2>, cache: &LayerKv, paged: &PagedContext, n_head: usize) -> Tensor<2> {
    #[cfg(feature = "cuda")]
    if super::cuda_kernels::on_cube(&qkv) {
        return super::cuda_kernels::paged_decode_attention(qkv, cache, paged);
    }
    let [b, e3] = qkv.dims();
    decode_attention(&qkv.slice([0..b, 0..e3 / 3]), cache, paged, n_head)
}
