//! The engine's vocabulary: requests, sampling parameters, step outputs.
//!
//! Plain data shared by every layer of the crate and by its callers (the
//! scheduler); nothing here touches a device.

/// Caller-chosen identifier of a sequence (unique among active sequences).
pub type SeqId = u64;

/// How to pick each next token.
///
/// `temperature == 0` is greedy (argmax; the other fields are ignored);
/// `top_k == 0` disables top-k; `top_p >= 1.0` disables top-p. `seed` seeds
/// the sequence's own RNG, so the same seed gives the same tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

impl SamplingParams {
    /// Argmax decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Whether this picks the argmax (no randomness).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

/// Penalties on tokens a sequence already has (vLLM's semantics, applied
/// before the choice, after `logit_bias`): `repetition` (> 0, 1 = off) over
/// the prompt's and the output's tokens: a positive logit is divided by it,
/// a negative one multiplied; `frequency` and `presence` (-2 to 2, 0 = off)
/// over the output's tokens: `logit -= frequency * count + presence *
/// (count > 0)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    pub repetition: f32,
    pub frequency: f32,
    pub presence: f32,
}

impl Penalties {
    /// No penalty.
    pub const OFF: Self = Self {
        repetition: 1.0,
        frequency: 0.0,
        presence: 0.0,
    };

    /// Whether any penalty is on.
    pub fn any(&self) -> bool {
        *self != Self::OFF
    }
}

impl Default for Penalties {
    fn default() -> Self {
        Self::OFF
    }
}

/// A constraint on the tokens a sequence may emit (structured output: a JSON
/// schema, a grammar). Before each of the sequence's steps the engine asks it
/// which tokens are allowed; after the step, it tells it the token sampled.
pub trait TokenConstraint: Send + std::fmt::Debug {
    /// The tokens allowed next, as a bitset over the vocabulary (bit `t % 32`
    /// of word `t / 32` for token `t`), or `None` when every token is. An
    /// error ends the sequence.
    fn allowed(&mut self) -> Result<Option<Vec<u32>>, String>;
    /// The sequence sampled `token` (EOS and stop tokens included).
    fn accept(&mut self, token: u32) -> Result<(), String>;
}

/// A constraint shared between a request and its engine sequence (a
/// preempted request keeps its state when it resumes).
pub type SharedConstraint = std::sync::Arc<std::sync::Mutex<dyn TokenConstraint>>;

/// A new sequence to prefill.
#[derive(Debug, Clone)]
pub struct SequenceRequest {
    pub id: SeqId,
    /// Prompt token ids (non-empty, each < vocab).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (>= 1).
    pub max_new_tokens: usize,
    /// Keep going past a sampled EOS (which is then emitted like any token).
    pub ignore_eos: bool,
    pub sampling: SamplingParams,
    /// Tokens that end the sequence like EOS (not emitted), even with
    /// `ignore_eos`. Each < vocab.
    pub stop_token_ids: Vec<u32>,
    /// `Some(n)`: report each emitted token's logprob and its `n` most likely
    /// alternatives ([`TokenLogprobs`]). `None`: nothing is computed.
    pub logprobs: Option<usize>,
    /// Penalties on repeated tokens (off by default).
    pub penalties: Penalties,
    /// Added to these tokens' logits before the choice (OpenAI's
    /// `logit_bias`: -100 to 100 each), at most one entry per token.
    pub logit_bias: Vec<(u32, f32)>,
    /// EOS and the stop token ids cannot be sampled before this many tokens
    /// were emitted (vLLM's `min_tokens`).
    pub min_tokens: usize,
    /// Structured output: which tokens may come next.
    pub constraint: Option<SharedConstraint>,
    /// `Some(n)`: the logprob of each prompt token given the ones before it
    /// (none for the first) and its `n` most likely alternatives (vLLM's
    /// `prompt_logprobs`), computed by the prefill (such a request does not
    /// take prompt tokens from the prefix cache). With it `max_new_tokens`
    /// may be 0: the prompt is scored, nothing is generated.
    pub prompt_logprobs: Option<usize>,
    /// Set on a request the engine preempted (`StepEngine::preempt`): what it
    /// had generated, to be recomputed after the prompt when it is admitted
    /// again. `None` for a new request.
    pub resume: Option<ResumeState>,
}

/// Where a preempted sequence stood: the tokens it had emitted (they count
/// toward `max_new_tokens` and are prefilled after the prompt on resume, not
/// emitted again) and how far its sampling RNG had gone, so a sampled
/// sequence continues the same stream of draws.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeState {
    /// Tokens emitted before the preemption, in order.
    pub generated: Vec<u32>,
    /// Uniforms the sequence had drawn from its seeded RNG (one per sampled
    /// step): a resumed sequence skips that many.
    pub rng_draws: u64,
    /// With `prompt_logprobs`: the prompt tokens whose logprobs were already
    /// reported (from the second on), not reported again.
    pub prompt_scored: usize,
}

impl SequenceRequest {
    /// A greedy request for `max_new_tokens` tokens after `prompt`, stopping
    /// at nothing but its length.
    pub fn greedy(id: SeqId, prompt: Vec<u32>, max_new_tokens: usize) -> Self {
        Self {
            id,
            prompt,
            max_new_tokens,
            ignore_eos: true,
            sampling: SamplingParams::greedy(),
            stop_token_ids: Vec::new(),
            logprobs: None,
            penalties: Penalties::OFF,
            logit_bias: Vec::new(),
            min_tokens: 0,
            constraint: None,
            prompt_logprobs: None,
            resume: None,
        }
    }

    /// Tokens emitted before a preemption (0 for a new request).
    pub fn resumed_tokens(&self) -> usize {
        self.resume.as_ref().map_or(0, |r| r.generated.len())
    }

    /// The tokens to have in the cache before the sequence decodes: the
    /// prompt, then what it generated before a preemption.
    pub fn input_len(&self) -> usize {
        self.prompt.len() + self.resumed_tokens()
    }
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// It sampled the EOS token (not emitted).
    Eos,
    /// It emitted `max_new_tokens` tokens.
    Length,
    /// It sampled this one of its stop token ids (not emitted).
    StopToken(u32),
}

/// Log-probabilities at one sampled position, under the model's unmodified
/// distribution (log_softmax of the logits, temperature 1, before top-k/top-p).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// Logprob of the sampled token.
    pub logprob: f32,
    /// The most likely tokens and their logprobs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One token emitted by one sequence in a step.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub id: SeqId,
    /// Its index among the sequence's emitted tokens (0 for the first).
    pub index: usize,
    pub token: u32,
    /// Set when the sequence asked for logprobs.
    pub logprobs: Option<TokenLogprobs>,
}

/// A sequence that finished during a step (its blocks are already free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishedSeq {
    pub id: SeqId,
    pub reason: FinishReason,
    /// Tokens it emitted in all (a stop or EOS token is not emitted).
    pub generated: usize,
}

/// One row of a prefill step: compute the next `tokens` prompt tokens of an
/// admitted sequence (fewer if less of its prompt is left).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillChunk {
    pub id: SeqId,
    pub tokens: usize,
}

/// What admitting a request would take, given the cache's current content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionCost {
    /// Free blocks it takes: fresh ones plus cached ones no sequence holds.
    pub blocks: usize,
    /// Leading prompt tokens found in the prefix cache (a multiple of the
    /// block size, at most prompt length - 1: the last token is always
    /// computed, for its logits).
    pub cached_tokens: usize,
}

/// Logprobs of consecutive prompt tokens of one sequence (its
/// `prompt_logprobs`), as one prefill step computed them.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprobs {
    pub id: SeqId,
    /// Prompt index of the first token scored (1 or more: the first prompt
    /// token has no logprob).
    pub first: usize,
    /// One per token from `first` on: its logprob given the tokens before it
    /// and the most likely alternatives at its position.
    pub logprobs: Vec<TokenLogprobs>,
}

/// What a prefill or decode step produced.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// Emitted tokens, in batch order.
    pub tokens: Vec<SampledToken>,
    /// Sequences that finished in this step, in batch order.
    pub finished: Vec<FinishedSeq>,
    /// Prompt logprobs computed in this step (prefill steps of sequences
    /// that asked), in batch order.
    pub prompt_logprobs: Vec<PromptLogprobs>,
}
