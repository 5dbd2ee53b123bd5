//! Paged key/value storage and the per-step attention metadata.
//!
//! The cache is a plain struct (not a Module): per layer one K and one V tensor
//! shaped `[n_head, num_slots, head_dim]` (head-major), allocated once, where
//! `num_slots = (num_blocks + 1) * block_size`. Head-major means a gather of a
//! batch's context slots yields `[H, B*T, D]`, whose `[T, D]` tiles attention
//! reads as they are: attention runs with heads as its outer ("batch") dimension
//! and sequences as its inner one, and the context is copied once, not gathered
//! and then transposed. Which slots belong to which sequence is the engine's
//! business (block tables); the model only sees slot indices:
//!
//! - new K/V rows are written with `select_assign(0, .., Assign)` at
//!   `write_slots`, in place because the layer's tensors are moved in and out
//!   uniquely owned (Flex's `scatter_nd` would copy the whole cache);
//! - a decode step reads each sequence's context with one `select` of its slots
//!   into a padded `[B, T, n_embd]` tensor (a gather of the live context, not a
//!   copy of the cache), and a boolean mask hides the padding.

use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;

/// K and V storage of one layer, each `[n_head, num_slots, head_dim]`.
#[derive(Debug)]
pub struct LayerKv {
    pub k: Tensor<3>,
    pub v: Tensor<3>,
}

impl LayerKv {
    /// Writes `k`/`v` (`[H, N, D]`) at `slots` (`[N]`), in place when the
    /// storage is uniquely owned.
    pub fn write(self, slots: Tensor<1, Int>, k: Tensor<3>, v: Tensor<3>) -> Self {
        Self {
            k: self
                .k
                .select_assign(1, slots.clone(), k, IndexingUpdateOp::Assign),
            v: self.v.select_assign(1, slots, v, IndexingUpdateOp::Assign),
        }
    }

    /// Writes the K and V thirds of the fused projection `qkv` (`[N, 3E]`,
    /// `E = H * D`) at `slots` (`[N]`), in place. On CUDA one kernel reads
    /// `qkv` as it is and writes the storage whoever else holds it (a captured
    /// decode graph does); on the CPU, `select_assign` on the uniquely owned
    /// storage.
    pub fn write_rows(self, slots: Tensor<1, Int>, qkv: Tensor<2>) -> Self {
        #[cfg(feature = "cuda")]
        if super::cuda_kernels::on_cube(&qkv) {
            let (k, v) = super::cuda_kernels::kv_write(self.k, self.v, qkv, slots);
            return Self { k, v };
        }
        let [h, _, d] = self.k.dims();
        let [n, _] = qkv.dims();
        let e = h * d;
        let heads = |x: Tensor<2>| x.reshape([n, h, d]).swap_dims(0, 1); // [H, N, D]
        let k = heads(qkv.clone().slice([0..n, e..2 * e]));
        let v = heads(qkv.slice([0..n, 2 * e..3 * e]));
        self.write(slots, k, v)
    }

    /// The K and V of `slots` (`[N]`): `[H, N, D]` each.
    pub fn gather(&self, slots: Tensor<1, Int>) -> (Tensor<3>, Tensor<3>) {
        (
            self.k.clone().select(1, slots.clone()),
            self.v.clone().select(1, slots),
        )
    }
}

/// The paged KV cache of a whole model.
#[derive(Debug, Default)]
pub struct KvCache {
    /// One entry per transformer block. Taken out for the duration of a forward
    /// pass so each layer's tensors are uniquely owned while written.
    pub layers: Vec<LayerKv>,
    /// Total token slots (`num_blocks * block_size`).
    pub num_slots: usize,
}

impl KvCache {
    /// Bytes of one stored element (the device's float dtype).
    pub fn elem_bytes(&self) -> usize {
        self.layers
            .first()
            .map_or(4, |layer| layer.k.dtype().size())
    }

    /// Allocates zeroed storage for `num_slots` tokens in each of `n_layer`
    /// layers of `n_head` heads of `head_dim`.
    pub fn new(
        n_layer: usize,
        n_head: usize,
        head_dim: usize,
        num_slots: usize,
        device: &Device,
    ) -> Self {
        let layers = (0..n_layer)
            .map(|_| LayerKv {
                k: Tensor::zeros([n_head, num_slots, head_dim], device),
                v: Tensor::zeros([n_head, num_slots, head_dim], device),
            })
            .collect();
        Self { layers, num_slots }
    }
}

/// Where a forward pass reads and writes K/V, shared by all layers of one step.
///
/// Shapes use `B` = rows in the batch, `Q` = query rows per sequence (padded),
/// `T` = key positions per sequence (padded).
#[derive(Debug, Clone)]
pub struct AttentionMeta {
    /// `[B*Q]`: cache slot of each new token, row-major over `[B, Q]`.
    /// Padding tokens point at the padding block, which nothing real reads.
    pub write_slots: Tensor<1, Int>,
    /// `[B*T]`: slots to gather as each sequence's context (padding entries
    /// point at any valid slot and are masked). `None` means the context is
    /// exactly the new tokens (prefill without cached prefix): attention uses
    /// the fresh K/V and `T == Q`.
    pub context_slots: Option<Tensor<1, Int>>,
    /// Padded context length `T`.
    pub context_len: usize,
    /// `[B, 1, Q, T]`: true where a key is hidden from a query (future or
    /// padding). A row with every key hidden (a padding row) attends to nothing.
    /// `None` for paged decode steps, which need no mask.
    pub mask: Option<Tensor<4, Bool>>,
    /// Set for decode steps that read the paged cache in place (one query per
    /// sequence; `context_slots` is then `None`).
    pub paged: Option<PagedContext>,
}

/// Where each sequence's context lives in the paged cache, for decode steps
/// whose attention walks the block tables itself ([`super::paged_attention`]
/// on the CPU, `cuda_kernels` on CUDA).
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
