//! Ember's CubeCL kernels, one file each: the `#[cube]` kernel, the
//! function that plans and launches it on `CubeTensor`s, and the kernel's
//! one declaration (`crate::ops::cuda::extension::cuda_kernel!`), which
//! makes it a Burn backend extension and a function of plain `Tensor`s of
//! the same name.
//!
//! - [`cache_write`]: each new token's K and V rows from the fused `qkv`
//!   projection into its cache slot, in place.
//! - [`attention`]: decode attention over the paged cache (block tables and
//!   lengths read from device buffers; optionally split across cubes, the
//!   chunks combined by [`split_combine`]; optionally doing the step's KV
//!   write itself); its passes over the positions in [`decode_passes`].
//! - [`gemv`]: the decode GEMV with the bias / GELU / residual epilogue.
//! - [`mma`]: the tensor-core (`wmma`) projection for 16 to 256 rows.
//! - [`layer_norm`]: one cube a row (few rows) or one warp a row.
//! - [`logit_edits`]: a step's `logit_bias` and host penalty edits, applied
//!   while the logits are copied to f32 for the sampling kernel.
//! - [`prefill_attention`]: causal tensor-core attention over a prefill
//!   step's segments: queries straight from `qkv`, keys and values from the
//!   paged cache through the block tables.
//! - `reduce`: the cube-wide reductions and the f32 key order the kernels
//!   share.
//! - [`sample_rows`]: one token per row (greedy, temperature, top-k, top-p,
//!   min-p, allowed bitmask, penalties from the counts table), the device
//!   twin of `sampling::row_sampler`; [`penalty_counts`] adds each chosen
//!   token to its row's counts.
//! - [`settle`]: a weight matrix made contiguous once, at load (CUDA
//!   pitches 2-D rows that are not a multiple of its alignment).
//! - [`vocab_rows`]: per row of the vocabulary, the argmax and the
//!   logprobs' log-softmax values (one token's, the top `n`), never tuned.
//! - [`write_rows`]: a few rows of a table a decode graph reads, written in
//!   place from a fresh upload.

pub mod attention;
pub mod cache_write;
pub mod decode_passes;
pub mod gemv;
pub mod layer_norm;
pub mod logit_edits;
pub mod mma;
pub mod penalty_counts;
pub mod prefill_attention;
mod prefill_chunk;
mod prefill_stage;
mod reduce;
pub mod sample_rows;
pub mod settle;
pub mod split_combine;
pub mod vocab_rows;
pub mod write_rows;
