//! What an attention op needs to know about a step: its shape and where each
//! row's keys and values are ([`AttentionContext`]).
//!
//! Shapes use `B` = rows in the batch, `Q` = query rows per sequence
//! (padded), `T` = key positions per sequence (padded), `H` heads.

use burn::prelude::*;

/// The step's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Rows (sequences) in the batch, `B`.
    pub batch: usize,
    /// Query rows per sequence, `Q` (1 in decode).
    pub q_len: usize,
    /// Attention heads, `H`.
    pub n_head: usize,
}

/// Where a step's queries find their keys and values. The step's own new
/// K/V rows are always in the cache already (written first, in every layer).
// One per step, passed by reference to every layer: the variants' sizes
// (tensor handles) cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum AttentionContext {
    /// Decode: one query per sequence over its context, read in place from
    /// the paged cache through the block tables. No gather, no mask.
    Paged(PagedContext),
    /// Prefill without a cached prefix: each row attends over its own new
    /// tokens (`T = Q`), through `mask` `[B, 1, Q, Q]` (true = hidden: future
    /// or padding keys).
    Fresh { mask: Tensor<4, Bool> },
    /// Prefill over cached context (a prefix-cache hit, earlier chunks): each
    /// row's `len` (= `T`) context positions are gathered from the cache at
    /// `slots` (`[B*T]`, padding entries at any valid slot) and `mask`
    /// (`[B, 1, Q, T]`) hides future and padding keys.
    Gathered {
        slots: Tensor<1, Int>,
        len: usize,
        mask: Tensor<4, Bool>,
    },
}

/// Where each sequence's context lives in the paged cache, for decode steps
/// whose attention walks the block tables itself (the CPU kernel in
/// [`super::cpu::paged_attention`], the CUDA kernel in `super::cuda`).
#[derive(Debug, Clone)]
pub struct PagedContext {
    /// `[B, W]` block ids of each sequence (padded with the padding block).
    pub tables: Tensor<2, Int>,
    /// `[B]` visible context positions per sequence (its cached tokens plus the new one).
    pub lens: Tensor<1, Int>,
    pub block_size: usize,
    /// Longest context a sequence can have (the model's `n_positions`).
    pub max_context: usize,
    /// At least `[B * H]` 32-bit counters, zero between steps, that let the
    /// CUDA kernel split one context across several cubes (it leaves them at
    /// zero). `None`: no splitting (and the CPU path never reads them).
    pub arrivals: Option<Tensor<1, Int>>,
}
