//! Native CPU kernels, where Burn's tensor ops on Flex leave time on the table.
//!
//! - [`paged_attention`]: decode attention read in place from the paged cache
//!   (rayon over sequence x head pairs), instead of gathering the context.
//! - [`flex_slices`]: the `f32` slices of dense Flex tensors those kernels
//!   work on, and their vector loops.

mod flex_slices;
pub mod paged_attention;
