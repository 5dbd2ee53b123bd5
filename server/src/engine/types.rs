//! The engine's vocabulary: requests, sampling parameters, step outputs, errors.

/// Caller-chosen identifier of a sequence (unique among active sequences).
pub type SeqId = u64;

/// KV cache geometry and step shapes.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the cache (shared by all sequences).
    pub num_blocks: usize,
    /// Most sequences in one decode step (the largest decode bucket).
    pub max_batch: usize,
    /// Pad step shapes to power-of-two buckets. Needed on CUDA (a bounded set
    /// of shapes to autotune and capture); pure overhead on the CPU.
    pub bucketed: bool,
    /// Keep full blocks content-addressed and reuse them for requests that
    /// share a prefix (see `blocks` and `prefix_cache`).
    pub prefix_caching: bool,
    /// Capture each decode bucket's step after warmup and replay it as a CUDA
    /// graph. On the CPU the "graph" re-runs the step (no speed-up; tests use
    /// it to check the capture plumbing).
    pub decode_graphs: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            num_blocks: 1024,
            max_batch: 32,
            bucketed: false,
            prefix_caching: true,
            decode_graphs: false,
        }
    }
}

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
    pub token: u32,
    /// Set when the sequence asked for logprobs.
    pub logprobs: Option<TokenLogprobs>,
}

/// A sequence that finished during a step (its blocks are already free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishedSeq {
    pub id: SeqId,
    pub reason: FinishReason,
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

/// Why the engine refused a step. A refused step leaves the engine unchanged.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Not enough free KV blocks to admit the batch (keep it waiting).
    #[error("out of KV blocks: needed {needed}, free {free}")]
    OutOfBlocks { needed: usize, free: usize },
    /// A decode/release named a sequence the engine does not hold.
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    /// A prefill reused the id of an active sequence (or repeated one).
    #[error("duplicate sequence {0}")]
    DuplicateSequence(SeqId),
    /// The request can never run (empty prompt, too long, bad token id, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The engine configuration is unusable.
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
    /// Reading the sampled ids back from the device failed.
    #[error("device read failed: {0}")]
    Device(String),
}
