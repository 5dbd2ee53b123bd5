//! Native CPU kernels, where Burn's tensor ops on Flex leave time on the table.
//!
//! - [`gemv`]: decode-sized projections and the LM head, streaming each
//!   out-major weight matrix once per step with vector loads, rows split
//!   across the rayon pool, bias/GELU/residual in the epilogue.
//! - [`paged_attention`]: decode and prefill attention read in place from
//!   the paged cache, instead of gathering each context and masking it.
//! - [`tiled_attention`]: the kernel both run: tiles of causal queries of one
//!   sequence, in parallel over (tile, head) on the rayon pool.
//! - [`kv_write`]: each new token's K and V rows copied into its cache
//!   slot, in place.
//! - [`isa`]: which instruction set the kernels run on ([`CpuIsa`]), detected
//!   once when the device is opened.
//! - [`pool`]: a whole CPU forward pass moved onto the rayon pool once, so
//!   that each kernel's parallel loop forks from inside it.
//! - [`flex_slices`]: the `f32` slices of dense Flex tensors those kernels
//!   work on, and their vector loops.
//!
//! [`CpuKernels`] is what `crate::ops::Ops` carries for them.

mod flex_slices;
pub mod gemv;
pub mod isa;
pub mod kv_write;
pub mod paged_attention;
pub mod pool;
pub mod tiled_attention;

pub use isa::CpuIsa;

use crate::cpu_tuning::{CpuTuning, CpuWeights};

/// Most rows (sequences in a decode step) a projection sends to [`gemv`]
/// rather than to Flex's matmul. Measured on the 2-core AMD EPYC (Zen 4,
/// AVX-512) dev machine: see docs/performance.md.
pub const GEMV_MAX_ROWS: usize = 64;

/// The CPU kernels' settings, fixed when the device is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuKernels {
    /// The instruction set the kernels run on.
    pub isa: CpuIsa,
    /// Most rows an f32 projection (or the LM head) sends to [`gemv`]; bf16
    /// weights go there at any row count (Flex's matmul does not mix them
    /// with f32 activations).
    pub gemv_max_rows: usize,
    /// The weight format (`--cpu-weights`).
    pub weights: CpuWeights,
}

impl CpuKernels {
    /// This CPU's instruction set, the default row cap and weight format.
    pub fn detect() -> Self {
        Self::new(CpuTuning::default())
    }

    /// The instruction set `tuning` asks for (the detected one by default)
    /// with its other knobs.
    pub fn new(tuning: CpuTuning) -> Self {
        Self {
            isa: tuning.cpu_isa.resolve(),
            gemv_max_rows: GEMV_MAX_ROWS,
            weights: tuning.cpu_weights,
        }
    }
}

impl Default for CpuKernels {
    fn default() -> Self {
        Self::detect()
    }
}
