//! GPT-2 as Burn modules, its configuration, and weight loading.
//!
//! Layout:
//! - [`config`]: [`Gpt2Config`] (presets, HF `config.json`).
//! - [`gpt2`], [`block`], [`attention`], [`mlp`]: the modules; pre-LN blocks,
//!   causal attention with fused `c_attn`, tanh-GELU MLP, LM head tied to `wte`.
//! - [`paged_attention`]: decode attention read in place from the paged cache
//!   on the CPU; `cuda_kernels` (CUDA builds): the same as a CubeCL kernel,
//!   and the in-place KV write. Burn's ops over the gathered context stay the
//!   reference both are compared against.
//! - [`linear`]: projections, `[in, out]` on the CPU and out-major on CUDA
//!   (for the decode GEMV kernel).
//! - [`layer_norm`]: LayerNorm with f32 statistics (f16-safe for GPT-2).
//! - [`kv_cache`]: the paged K/V storage (a plain struct) and the per-step
//!   [`AttentionMeta`] telling attention where to write and what to read.
//! - [`weights`], [`load`]: building the model from named tensors — an HF
//!   safetensors file or GPT-2's seeded random init ([`load_model`]).
//! - [`error`]: the [`ModelError`] type.

pub mod attention;
pub mod block;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda_kernels;
pub mod error;
#[cfg(test)]
pub(crate) mod fixtures;
mod flex_slices;
pub mod gpt2;
pub mod kv_cache;
pub mod layer_norm;
pub mod linear;
pub mod load;
pub mod mlp;
pub mod paged_attention;
pub mod weights;

pub use config::Gpt2Config;
pub use error::ModelError;
pub use gpt2::Gpt2;
pub use kv_cache::{AttentionMeta, KvCache, LayerKv, PagedContext};
pub use load::{load_model, random_model, ModelSource, Preset};
