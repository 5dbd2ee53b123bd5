//! Paged key/value storage and the per-step attention metadata.
//!
//! The cache is a plain struct (not a Module): per layer one K and one V tensor
//! shaped `[n_head, num_slots, head_dim]` (head-major), allocated once, where
//! `num_slots = (num_blocks + 1) * block_size`. Which slots belong to which
//! sequence is the engine's business (block tables, `crate::kv`); the model
//! only sees slot indices and the step's [`AttentionContext`]:
//!
//! - new K/V rows are written at `write_slots` (`Ops::write_and_attend`): in place,
//!   because each layer's tensors are moved through the forward pass uniquely
//!   owned (the CPU's `select_assign`), or by a kernel that writes the buffers
//!   whoever holds them (CUDA);
//! - attention reads each query's context in place through its sequence's
//!   block table (no gather, no mask): a decode step's one query per
//!   sequence up to its length, a prefill step's segments causally
//!   ([`AttentionContext`]). Head-major storage keeps each head's rows of a
//!   block contiguous (`block_size x D`), which both kernels read as they are.

use burn::prelude::*;

use crate::ops::{AttentionContext, Ops};

/// The dtype K/V are stored in with `ops`: the weight matrices' where they
/// are narrower than the device's float type (bf16 on the CPU with
/// `--cpu-weights bf16`), else `None` (the float type). The one place it
/// is decided: the cache's sizing and its allocation both ask here.
pub fn kv_dtype(ops: &Ops) -> Option<burn::tensor::DType> {
    ops.matrix_dtype()
}

/// K and V storage of one layer, each `[n_head, num_slots, head_dim]`.
#[derive(Debug)]
pub struct LayerKv {
    pub k: Tensor<3>,
    pub v: Tensor<3>,
}

/// The paged KV cache of a whole model.
#[derive(Debug, Default)]
pub struct KvCache {
    /// One entry per transformer block. Taken out for the duration of a forward
    /// pass so each layer's tensors are uniquely owned while written.
    pub layers: Vec<LayerKv>,
    /// Total token slots (`(num_blocks + 1) * block_size`).
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
    /// layers of `n_head` heads of `head_dim`, in `dtype` ([`kv_dtype`];
    /// with bf16 the CPU kernels round each new row once as they write it
    /// and widen it as they read it).
    pub fn new(
        n_layer: usize,
        n_head: usize,
        head_dim: usize,
        num_slots: usize,
        device: &Device,
        dtype: Option<burn::tensor::DType>,
    ) -> Self {
        let shape = [n_head, num_slots, head_dim];
        let zeros = || match dtype {
            Some(dtype) => Tensor::zeros(shape, (device, dtype)),
            None => Tensor::zeros(shape, device),
        };
        let layers = (0..n_layer)
            .map(|_| LayerKv {
                k: zeros(),
                v: zeros(),
            })
            .collect();
        Self { layers, num_slots }
    }
}

/// Where a forward pass writes and reads K/V, shared by all layers of one
/// step (`N` new tokens).
#[derive(Debug, Clone)]
pub struct AttentionMeta {
    /// `[N]`: cache slot of each new token.
    /// Padding tokens point at the padding block, which nothing real reads.
    pub write_slots: Tensor<1, Int>,
    /// Where each row's queries find their keys and values.
    pub context: AttentionContext,
}
