//! Causal multi-head self-attention (GPT-2's `attn`) over the paged KV cache.
//!
//! `c_attn` projects to Q, K and V at once (`[E, 3E]`, GPT-2's Conv1D layout);
//! the new K/V rows are written to the cache first, then the queries attend
//! over the step's context ([`crate::ops::Ops::attention`]: the paged cache in
//! place for decode; for prefill the fresh K/V, or context gathered from the
//! cache when part of the prompt was already there), and `c_proj` adds the
//! residual in its epilogue.

use burn::prelude::*;

use super::kv_cache::{AttentionMeta, LayerKv};
use super::linear::Linear;
use crate::ops::{AttentionShape, Epilogue, Ops};

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
        ops: &Ops,
        x: Tensor<3>,
        residual: Tensor<3>,
        cache: LayerKv,
        meta: &AttentionMeta,
    ) -> (Tensor<3>, LayerKv) {
        let [b, q_len, e] = x.dims();
        let qkv = self
            .c_attn
            .forward(ops, x, Epilogue::none())
            .reshape([b * q_len, 3 * e]); // [B*Q, 3E]
                                          // Every new token's K/V into its slot (padding into the padding block).
        let cache = cache.write_rows(ops, meta.write_slots.clone(), qkv.clone());
        let shape = AttentionShape {
            batch: b,
            q_len,
            n_head: self.n_head,
        };
        let out = ops
            .attention(qkv, &cache.k, &cache.v, shape, &meta.context)
            .reshape([b, q_len, e]);
        let y = self.c_proj.forward(ops, out, Epilogue::add(residual));
        (y, cache)
    }
}
