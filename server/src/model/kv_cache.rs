//! Paged key/value storage and the per-step attention metadata.
//!
//! The cache is a plain struct (not a Module): per layer one K and one V tensor
//! shaped `[num_slots, n_embd]`, allocated once, where `num_slots = num_blocks *
//! block_size`. A slot holds one token's keys (or values) for all heads, so a
//! head's view is a reshape, never a copy. Which slots belong to which sequence
//! is the engine's business (block tables); the model only sees slot indices:
//!
//! - new K/V rows are written with `scatter_nd(.., Assign)` at `write_slots`,
//!   in place because the layer's tensors are moved in and out uniquely owned;
//! - a decode step reads each sequence's context with one `select` of its slots
//!   into a padded `[B, T, n_embd]` view (a gather of the live context, not a
//!   copy of the cache), and an additive mask hides the padding.

use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;

/// K and V storage of one layer, each `[num_slots, n_embd]`.
#[derive(Debug)]
pub struct LayerKv<B: Backend> {
    pub k: Tensor<B, 2>,
    pub v: Tensor<B, 2>,
}

impl<B: Backend> LayerKv<B> {
    /// Writes `k`/`v` rows (`[N, n_embd]`) at `slots` (`[N, 1]`), in place when
    /// the storage is uniquely owned.
    pub fn write(self, slots: Tensor<B, 2, Int>, k: Tensor<B, 2>, v: Tensor<B, 2>) -> Self {
        Self {
            k: self
                .k
                .scatter_nd(slots.clone(), k, IndexingUpdateOp::Assign),
            v: self.v.scatter_nd(slots, v, IndexingUpdateOp::Assign),
        }
    }
}

/// The paged KV cache of a whole model.
#[derive(Debug)]
pub struct KvCache<B: Backend> {
    /// One entry per transformer block. Taken out for the duration of a forward
    /// pass so each layer's tensors are uniquely owned while written.
    pub layers: Vec<LayerKv<B>>,
    /// Total token slots (`num_blocks * block_size`).
    pub num_slots: usize,
}

impl<B: Backend> KvCache<B> {
    /// Allocates zeroed storage for `num_slots` tokens in each of `n_layer` layers.
    pub fn new(n_layer: usize, n_embd: usize, num_slots: usize, device: &B::Device) -> Self {
        let layers = (0..n_layer)
            .map(|_| LayerKv {
                k: Tensor::zeros([num_slots, n_embd], device),
                v: Tensor::zeros([num_slots, n_embd], device),
            })
            .collect();
        Self { layers, num_slots }
    }
}

/// Where a forward pass reads and writes K/V, shared by all layers of one step.
///
/// Shapes use `B` = sequences in the batch, `Q` = query rows per sequence
/// (padded), `T` = key positions per sequence (padded), `N` = real new tokens.
#[derive(Debug, Clone)]
pub struct AttentionMeta<B: Backend> {
    /// `[N]`: which rows of the flattened `[B*Q]` new tokens are real (padding
    /// rows are not written). `None` when every row is real (decode).
    pub write_rows: Option<Tensor<B, 1, Int>>,
    /// `[N, 1]`: cache slot of each real new token.
    pub write_slots: Tensor<B, 2, Int>,
    /// `[B*T]`: slots to gather as each sequence's context (padding entries
    /// point at any valid slot and are masked). `None` means the context is
    /// exactly the new tokens (prefill without cached prefix): attention uses
    /// the fresh K/V and `T == Q`.
    pub context_slots: Option<Tensor<B, 1, Int>>,
    /// Padded context length `T`.
    pub context_len: usize,
    /// `[B, 1, Q, T]`: added to attention scores; 0 where visible, a large
    /// negative number where masked (future or padding).
    pub mask_bias: Tensor<B, 4>,
}

/// Score added at masked positions: far below any real score, yet finite in
/// f16, so a row never becomes NaN.
pub const MASK_BIAS: f32 = -1.0e4;
