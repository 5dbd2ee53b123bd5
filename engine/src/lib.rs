//! Ember's inference engine: GPT-2 on Burn over a paged KV cache, batched
//! prefill and decode, per-sequence sampling, and the kernels that run them.
//! No async runtime, no RPC, no flag parsing (the optional `clap` feature
//! only derives `clap::Args` for [`KernelTuning`]): the server drives it
//! from its scheduler thread through [`StepEngine`].
//!
//! Layout, lowest layer first (a folder imports only the layers above it in
//! this list; `docs/architecture.md` has the table):
//! - [`types`], [`params`], [`error`], [`limits`], [`tuning`],
//!   [`cpu_tuning`], [`panics`]: the vocabulary (requests, outputs, errors),
//!   what a request asks of generation ([`GenerationParams`], validated in
//!   one place), the request limits, the CUDA and CPU kernel knobs, caught
//!   panics.
//! - [`ops`]: every operation the model runs, each choosing CPU or CUDA in
//!   one place; all CUDA code lives in `ops/cuda/` (kernels, in-place
//!   writes, runtime setup).
//! - [`model`]: GPT-2 as Burn modules (device-free) and weight loading.
//! - [`kv`]: the block pool and the prefix cache (host bookkeeping).
//! - [`sampling`]: per-row sampling and logprobs on the device.
//! - [`step`]: one step on the device: inputs, persistent buffers, the
//!   forward pass, decode graphs, and [`step::StepRunner`].
//! - [`engine`]: [`Engine`] (sequences + runner), built from [`EngineConfig`],
//!   and the warmup.
//! - [`device`]: opening the device (`--device`), with the [`KernelTuning`].
//! - [`step_engine`]: the [`StepEngine`] trait the scheduler drives.

pub mod cpu_tuning;
pub mod device;
pub mod engine;
pub mod error;
pub mod kv;
pub mod limits;
pub mod model;
pub mod ops;
pub mod panics;
pub mod params;
pub mod sampling;
pub mod step;
pub mod step_engine;
pub mod tuning;
pub mod types;

pub use cpu_tuning::{CpuTuning, CpuWeights};
pub use device::{DeviceMemory, DeviceOptions, DeviceSpec, EngineDevice};
pub use engine::config::{EngineConfig, KvBudget, PrefillBounds};
pub use engine::warmup::WarmupReport;
pub use engine::Engine;
pub use error::EngineError;
pub use limits::RequestLimits;
pub use params::{
    GenerationParams, LogitTransforms, Outputs, ParamLimits, Penalties, SamplingParams,
    SharedConstraint, StopRules, TokenConstraint,
};
pub use step_engine::StepEngine;
pub use tuning::KernelTuning;
pub use types::{
    AdmissionCost, FinishReason, FinishedSeq, PrefillChunk, PromptLogprobs, ResumeState,
    SampledToken, SeqId, SequenceRequest, StepOutput, TokenLogprobs,
};
