//! [`GenerationParams`]: everything a request asks of generation, in one
//! type the engine owns, checked by one function
//! ([`GenerationParams::validate`]) that names the field at fault.
//!
//! Both front doors build it by a thin mapping (the server's
//! `service/proto_params.rs` reads the gRPC message, which the HTTP door
//! fills from OpenAI's and vLLM's fields); the scheduler and the service
//! carry it to the engine without looking inside. Every option is one of a
//! few **kinds**, a field group here, and each kind is applied in one place:
//!
//! | kind | group | options | applied by |
//! |---|---|---|---|
//! | the choice | [`SamplingParams`] | `temperature`, `top_k`, `top_p`, `min_p`, `seed` | the sampler (`sampling::sampler`) |
//! | logits transforms | [`LogitTransforms`] | `logit_bias`, `repetition_penalty`, `frequency_penalty`, `presence_penalty` | the sampling kernel from a device slot of counts and bias (`sampling::penalty_state`: CUDA, decode steps); `sampling::transforms` otherwise (the CPU, prefill, every slot taken), before the choice |
//! | token filter | [`GenerationParams::constraint`] | `response_format` (a grammar, compiled by the service) | the sampler, as the row's allowed set |
//! | stop rules | [`StopRules`] | `max_new_tokens`, `min_tokens`, `ignore_eos`, `stop_token_ids`, `stop` strings | `engine::sequence` (`judge`; `min_tokens` as bans before the choice); stop strings by the service, on the text |
//! | outputs | [`Outputs`] | `logprobs`, `prompt_logprobs` | the step (`sampling::logprobs`) |
//!
//! Each kind's group lives in its own file with its `check` (`sampling.rs`,
//! `transforms.rs`, `stop.rs`, `outputs.rs`); [`GenerationParams::validate`]
//! runs them all, so the service and the engine call one function.
//!
//! **Adding an option** (the recipe in docs/architecture.md; five production
//! files): a field in its kind's file with its clause in that file's
//! `check`; the proto field; its line in the server's
//! `service/proto_params.rs`; the HTTP field in `http/params.rs`; its effect
//! where its kind is applied (for a sampling option, the sampler). Then a
//! test against a reference computed outside Ember. `min_p` went in this
//! way.

mod bounds;
pub mod named_options;
mod outputs;
mod sampling;
mod stop;
#[cfg(test)]
mod tests;
mod transforms;

use std::sync::{Arc, Mutex};

use crate::limits::LimitViolation;
pub use bounds::ParamLimits;
pub use outputs::Outputs;
pub use sampling::SamplingParams;
pub use stop::StopRules;
pub use transforms::{LogitTransforms, Penalties};

/// Everything a request asks of generation (see the module docs).
#[derive(Debug, Clone)]
pub struct GenerationParams {
    /// How the next token is chosen.
    pub sampling: SamplingParams,
    /// Changes to the logits before the choice.
    pub transforms: LogitTransforms,
    /// When the sequence ends.
    pub stop: StopRules,
    /// Structured output: which tokens may come next (`None`: any).
    pub constraint: Option<SharedConstraint>,
    /// What is reported besides the tokens.
    pub outputs: Outputs,
}

impl GenerationParams {
    /// The one check of a request's parameters: every value in its range,
    /// each token id inside the vocabulary, each list within its bound (the
    /// bounds are [`crate::limits`]'s constants). The first violation found
    /// is returned, naming its field as a client spells it
    /// (`sampling.top_p`, `stop[3]`, `sampling.logit_bias[50256]`). The
    /// service runs it before anything is queued, the engine when it admits
    /// a sequence; what depends on the prompt is
    /// [`crate::limits::RequestLimits::check`]'s.
    pub fn validate(&self, limits: &ParamLimits) -> Result<(), LimitViolation> {
        let scoring = self.outputs.prompt_logprobs.is_some();
        self.stop.check(limits, scoring)?;
        self.sampling.check()?;
        self.transforms.check(limits.vocab_size)?;
        self.outputs.check()
    }

    /// Greedy decoding of up to `max_new_tokens` tokens, stopping at EOS,
    /// with no other option.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self {
            sampling: SamplingParams::greedy(),
            transforms: LogitTransforms::default(),
            stop: StopRules::new(max_new_tokens),
            constraint: None,
            outputs: Outputs::default(),
        }
    }
}

/// A constraint on the tokens a sequence may emit (structured output: a JSON
/// schema, a grammar). Before each of the sequence's steps the engine asks it
/// which tokens are allowed; after the step, it tells it the token sampled.
/// An error from either ends the sequence with
/// [`crate::FinishReason::ConstraintFailed`], never as a normal stop.
pub trait TokenConstraint: Send + std::fmt::Debug {
    /// The tokens allowed next, as a bitset over the vocabulary (bit `t % 32`
    /// of word `t / 32` for token `t`), or `None` when every token is.
    fn allowed(&mut self) -> Result<Option<Vec<u32>>, String>;
    /// The sequence sampled `token` (EOS and stop tokens included).
    fn accept(&mut self, token: u32) -> Result<(), String>;
}

/// A constraint shared between a request and its engine sequence (a
/// preempted request keeps its state when it resumes).
pub type SharedConstraint = Arc<Mutex<dyn TokenConstraint>>;
