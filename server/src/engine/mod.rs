//! The engine: runs many GPT-2 sequences at once over a paged KV cache.
//!
//! Layout:
//! - [`types`]: requests, sampling parameters, step outputs, [`EngineError`].
//! - [`blocks`]: the block allocator (free list, per-sequence block tables).
//! - [`batch`]: host-side construction of a step's index tensors (slots,
//!   positions, masks) from block tables.
//! - [`sampler`]: per-row sampling on device (greedy fast path; temperature,
//!   top-k, top-p with per-sequence seeded RNGs); one device->host read.
//! - [`runner`]: [`Engine`], which owns the model, the cache and the sequences
//!   and implements prefill / decode / release with the stop rules.

pub mod batch;
pub mod blocks;
pub mod runner;
pub mod sampler;
pub mod types;

pub use runner::Engine;
pub use types::{
    EngineConfig, EngineError, FinishReason, FinishedSeq, SampledToken, SamplingParams, SeqId,
    SequenceRequest, StepOutput,
};
