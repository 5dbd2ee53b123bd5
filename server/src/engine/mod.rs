//! The engine: runs many GPT-2 sequences at once over a paged KV cache.
//!
//! Layout:
//! - [`types`]: requests, sampling parameters, step outputs, [`EngineError`].
//! - [`blocks`]: the block pool (reference-counted blocks, all-or-nothing
//!   reservation of block tables, LRU eviction of cached blocks, the padding
//!   block).
//! - [`prefix_cache`]: full blocks addressed by a chained hash of their
//!   prefix, and the LRU order of the ones no sequence holds.
//! - [`limits`]: the one check of a request against the model and cache
//!   limits (the service runs it before queueing, the engine at prefill).
//! - [`sequence`]: per-sequence state and the stop rules.
//! - [`buffers`]: the persistent device buffers a decode step's inputs are
//!   written into, one set per decode bucket; [`inplace`] writes them in place.
//! - [`batch`]: a step's model inputs (prefill built on the host, decode
//!   derived on the device from the buffers).
//! - [`sampler`]: per-row sampling on device (greedy fast path; temperature,
//!   top-k, top-p with per-sequence seeded RNGs); one device->host read.
//! - [`logprobs`]: log-probabilities of the sampled tokens and their top-n
//!   alternatives, on the device from the logits sampling read; run after
//!   sampling, only for steps where some row asked.
//! - [`runner`]: [`Engine`], which owns the model, the cache and the sequences
//!   and implements decode / release.
//! - [`prefill`]: admission (prefix-cache lookup, block reservation) and the
//!   prefill step over chunks of prompts with cached context.
//! - [`warmup`]: runs every step shape before the server reports SERVING.

pub mod batch;
pub mod blocks;
pub mod buffers;
mod graphs;
mod inplace;
pub mod limits;
pub mod logprobs;
mod prefill;
pub mod prefix_cache;
pub mod runner;
pub mod sampler;
mod sequence;
pub mod types;
pub mod warmup;

#[cfg(test)]
mod control_tests;
#[cfg(test)]
mod prefill_tests;
#[cfg(test)]
mod tests;

pub use runner::Engine;
pub use types::{
    AdmissionCost, EngineConfig, EngineError, FinishReason, FinishedSeq, PrefillChunk,
    SampledToken, SamplingParams, SeqId, SequenceRequest, StepOutput, TokenLogprobs,
};
pub use warmup::WarmupReport;
