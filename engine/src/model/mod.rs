//! GPT-2 as Burn modules, its configuration, and weight loading. Device-free:
//! every operation goes through [`crate::ops::Ops`], which picks the CPU or
//! the CUDA implementation.
//!
//! Layout:
//! - [`config`]: [`Gpt2Config`] (presets, HF `config.json`).
//! - [`gpt2`], [`block`], [`attention`], [`mlp`]: the modules; pre-LN blocks,
//!   causal attention with fused `c_attn`, tanh-GELU MLP, LM head tied to `wte`.
//! - [`linear`], [`layer_norm`]: the parameter holders of projections
//!   (`[in, out]`, or out-major where [`crate::ops::Ops::out_major_weights`]
//!   says) and of LayerNorm.
//! - [`kv_cache`]: the paged K/V storage (a plain struct, not a Module) and
//!   the per-step [`AttentionMeta`] telling attention where to write and what
//!   to read.
//! - [`weights`], [`load`], [`checkpoint`], [`host_transpose`]: building the
//!   model from named tensors — an HF safetensors file (memory-mapped, the
//!   projections transposed on the host) or GPT-2's seeded random init
//!   ([`load_model`]).
//! - [`error`]: the [`ModelError`] type.

pub mod attention;
pub mod block;
pub mod checkpoint;
pub mod config;
pub mod error;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod gpt2;
pub mod host_transpose;
pub mod kv_cache;
pub mod layer_norm;
pub mod linear;
pub mod load;
pub mod mlp;
pub mod weights;

pub use config::Gpt2Config;
pub use error::ModelError;
pub use gpt2::Gpt2;
pub use kv_cache::{AttentionMeta, KvCache, LayerKv};
pub use load::{load_model, random_model, ModelSource, Preset};
