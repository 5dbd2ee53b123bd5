//! The engine's vocabulary: requests, step outputs.
//!
//! Plain data shared by every layer of the crate and by its callers (the
//! scheduler); nothing here touches a device. What a request asks of
//! generation is [`GenerationParams`] (`crate::params`).

use crate::params::GenerationParams;

/// Caller-chosen identifier of a sequence (unique among active sequences).
pub type SeqId = u64;

/// A new sequence to prefill.
#[derive(Debug, Clone)]
pub struct SequenceRequest {
    pub id: SeqId,
    /// Prompt token ids (non-empty, each < vocab).
    pub prompt: Vec<u32>,
    /// What the request asks of generation (checked by
    /// [`GenerationParams::validate`] at admission).
    pub params: GenerationParams,
    /// Set on a request the engine preempted (`StepEngine::preempt`): what it
    /// had generated, to be recomputed after the prompt when it is admitted
    /// again. `None` for a new request.
    pub resume: Option<ResumeState>,
}

/// Where a preempted sequence stood: the tokens it had emitted (they count
/// toward `max_new_tokens` and are prefilled after the prompt on resume, not
/// emitted again). A sampled sequence's draws are keyed by (seed, position),
/// so it continues exactly as it would have without the preemption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeState {
    /// Tokens emitted before the preemption, in order.
    pub generated: Vec<u32>,
    /// With `prompt_logprobs`: the prompt tokens whose logprobs were already
    /// reported (from the second on), not reported again.
    pub prompt_scored: usize,
}

impl SequenceRequest {
    /// A greedy request for `max_new_tokens` tokens after `prompt`, stopping
    /// at nothing but its length.
    pub fn greedy(id: SeqId, prompt: Vec<u32>, max_new_tokens: usize) -> Self {
        let mut params = GenerationParams::greedy(max_new_tokens);
        params.stop.ignore_eos = true;
        Self {
            id,
            prompt,
            params,
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
    /// Its output constraint (structured output) could not be honoured: it
    /// allowed no token the model can emit, failed, or refused the token
    /// sampled. Nothing more is emitted; the client gets an error, never a
    /// normal stop.
    ConstraintFailed,
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

impl StepOutput {
    /// Appends a later step's output (an overlapped decode call can retire
    /// two steps: events stay in step order).
    pub fn extend(&mut self, later: StepOutput) {
        self.tokens.extend(later.tokens);
        self.finished.extend(later.finished);
        self.prompt_logprobs.extend(later.prompt_logprobs);
    }
}
