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

/// What a prefill or decode step produced.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// Emitted tokens, in batch order.
    pub tokens: Vec<SampledToken>,
    /// Sequences that finished in this step, in batch order.
    pub finished: Vec<FinishedSeq>,
}
