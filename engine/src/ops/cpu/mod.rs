//! Native CPU kernels, where Burn's tensor ops on Flex leave time on the table.
//!
//! - [`paged_attention`]: decode and prefill attention read in place from
//!   the paged cache, instead of gathering each context and masking it.
//! - [`tiled_attention`]: the kernel both run: tiles of causal queries of one
//!   sequence, in parallel over (tile, head) on the rayon pool.
//! - [`flex_slices`]: the `f32` slices of dense Flex tensors those kernels
//!   work on, and their vector loops.

mod flex_slices;
pub mod paged_attention;
pub mod tiled_attention;
