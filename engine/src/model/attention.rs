//! Causal multi-head self-attention (GPT-2's `attn`) over the paged KV cache.
//!
//! `c_attn` projects to Q, K and V at once (`[E, 3E]`, GPT-2's Conv1D layout);
//! the new K/V rows are written to the cache first, then the queries attend
//! over the step's context, read in place from the paged cache
//! ([`crate::ops::Ops::write_and_attend`]: one query per sequence in decode,
//! causal segments of the flat tokens in prefill; one kernel does both in a
//! CUDA decode step), and `c_proj` adds the residual in its epilogue.

use burn::prelude::*;

use super::kv_cache::{AttentionMeta, LayerKv};
use super::linear::Linear;
use crate::ops::{Epilogue, Ops};

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
    /// - `x`: `[N, E]` normalized hidden states of the step's new tokens
    /// - `residual`: `[N, E]`, added to the output (in `c_proj`'s epilogue)
    /// - `cache`: this layer's K/V storage, moved in and returned
    /// - returns `residual + attn(x)` `[N, E]` and the updated cache
    pub fn forward(
        &self,
        ops: &Ops,
        x: Tensor<2>,
        residual: Tensor<2>,
        cache: LayerKv,
        meta: &AttentionMeta,
    ) -> (Tensor<2>, LayerKv) {
        let qkv = self.c_attn.forward(ops, x, Epilogue::none()); // [N, 3E]
                                                                 // Every new token's K/V into its slot (padding into the padding
                                                                 // block), then attention over the cache.
        let (out, (k, v)) = ops.write_and_attend(
            qkv,
            (cache.k, cache.v),
            meta.write_slots.clone(),
            self.n_head,
            &meta.context,
        );
        let y = self.c_proj.forward(ops, out, Epilogue::add(residual));
        (y, LayerKv { k, v })
    }
}
