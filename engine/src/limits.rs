//! A request's prompt against the model's and the cache's limits
//! ([`RequestLimits::check`]: ids inside the vocabulary, prompt + budget
//! within the context and the KV cache), the fixed bounds of the generation
//! parameters (which `crate::params` checks), and how a violation names the
//! field at fault ([`LimitField`]).
//!
//! The service runs the checks before queueing (so a client gets
//! INVALID_ARGUMENT naming the field) and the engine runs them again when it
//! admits a sequence (so no caller can get an impossible one into the batch).

/// Most stop strings one request may give.
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes (the shortest is 1).
pub const MAX_STOP_STRING_BYTES: usize = 256;
/// Most stop token ids one request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 64;
/// Most alternatives a request may ask for per token (`logprobs` top-n).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most `logit_bias` entries one request may give.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// The range of one `logit_bias` value (OpenAI's).
pub const LOGIT_BIAS_RANGE: f32 = 100.0;
/// The range of the frequency and presence penalties (OpenAI's and vLLM's).
pub const PENALTY_RANGE: f32 = 2.0;

/// What a request must fit into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Prompt + generated tokens must fit the position table.
    pub context: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the whole cache (no request may need more).
    pub kv_blocks_total: usize,
}

/// Which part of a request broke a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitField {
    /// The prompt itself (its ids or length).
    Prompt,
    /// `max_new_tokens` (the generation budget does not fit).
    MaxNewTokens,
    /// The stop strings: the list (`None`) or the entry at an index.
    Stop(Option<usize>),
    /// The stop token ids: the list (`None`) or the entry at an index.
    StopTokenIds(Option<usize>),
    /// The logprobs top-n count.
    Logprobs,
    /// A field of the request's `sampling` message, by its name
    /// (`temperature`, `min_p`, `frequency_penalty`, `min_tokens`...).
    Sampling(&'static str),
    /// The logit bias: the map (`None`) or the entry of a token.
    LogitBias(Option<u32>),
    /// The prompt logprobs top-n count.
    PromptLogprobs,
}

impl LimitField {
    /// The request field's name as the gRPC request spells it (`stop[3]`,
    /// `sampling.top_p`; the HTTP door renames them to OpenAI's). The prompt
    /// is `prompt_field`: the caller knows whether it came as text or ids.
    pub fn name(&self, prompt_field: &str) -> String {
        let indexed = |list: &str, i: &Option<usize>| match i {
            Some(i) => format!("{list}[{i}]"),
            None => list.to_string(),
        };
        match self {
            Self::Prompt => prompt_field.to_string(),
            Self::MaxNewTokens => "max_new_tokens".into(),
            Self::Stop(i) => indexed("stop", i),
            Self::StopTokenIds(i) => indexed("stop_token_ids", i),
            Self::Logprobs => "logprobs".into(),
            Self::Sampling(name) => format!("sampling.{name}"),
            Self::LogitBias(None) => "sampling.logit_bias".into(),
            Self::LogitBias(Some(t)) => format!("sampling.logit_bias[{t}]"),
            Self::PromptLogprobs => "prompt_logprobs".into(),
        }
    }
}

/// A broken limit: which field and why (the message names no field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LimitViolation {
    pub field: LimitField,
    pub message: String,
}

impl RequestLimits {
    /// Blocks a request can come to hold: its whole budget, prompt +
    /// max_new_tokens (a running sequence takes them as it grows).
    pub fn blocks_required(&self, prompt_len: usize, max_new_tokens: usize) -> usize {
        (prompt_len + max_new_tokens).div_ceil(self.block_size)
    }

    /// Blocks admitting a request takes: room for its input (`input_len`
    /// tokens: the prompt, and on resume what it had generated) and the
    /// next token, within its whole budget. Decode steps take more as the
    /// sequence crosses block boundaries.
    pub fn blocks_to_admit(
        &self,
        input_len: usize,
        prompt_len: usize,
        max_new_tokens: usize,
    ) -> usize {
        (input_len + 1)
            .div_ceil(self.block_size)
            .min(self.blocks_required(prompt_len, max_new_tokens))
    }

    /// Checks a prompt and its generation budget.
    pub fn check(&self, prompt: &[u32], max_new_tokens: usize) -> Result<(), LimitViolation> {
        let fail = |field, message: String| Err(LimitViolation { field, message });
        if prompt.is_empty() {
            return fail(LimitField::Prompt, "has no tokens".into());
        }
        if let Some((pos, bad)) = prompt
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= self.vocab_size)
        {
            return fail(
                LimitField::Prompt,
                format!(
                    "token id {bad} at position {pos} is outside the vocabulary (size {})",
                    self.vocab_size
                ),
            );
        }
        if prompt.len() + max_new_tokens > self.context {
            return fail(
                LimitField::MaxNewTokens,
                format!(
                    "prompt ({} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of {} tokens",
                    prompt.len(),
                    self.context
                ),
            );
        }
        let blocks = self.blocks_required(prompt.len(), max_new_tokens);
        if blocks > self.kv_blocks_total {
            return fail(
                LimitField::MaxNewTokens,
                format!(
                    "prompt + max_new_tokens needs {blocks} KV blocks but the server has {} in all",
                    self.kv_blocks_total
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: RequestLimits = RequestLimits {
        vocab_size: 100,
        context: 64,
        block_size: 4,
        kv_blocks_total: 10,
    };

    fn field(prompt: &[u32], max_new: usize) -> Option<LimitField> {
        LIMITS.check(prompt, max_new).err().map(|v| v.field)
    }

    #[test]
    fn each_limit_names_its_field() {
        assert_eq!(field(&[1, 2, 3], 4), None);
        assert_eq!(field(&[], 4), Some(LimitField::Prompt));
        // 0 new tokens is GenerationParams::validate's to judge (fine when scoring).
        assert_eq!(field(&[1], 0), None);
        assert_eq!(field(&[1, 100], 4), Some(LimitField::Prompt));
        assert_eq!(field(&[1; 30], 35), Some(LimitField::MaxNewTokens)); // 65 > context 64
        assert_eq!(field(&[1; 36], 1), None); // long prompts are prefilled in chunks
        assert_eq!(field(&[1; 20], 21), Some(LimitField::MaxNewTokens)); // 11 blocks > 10
        assert_eq!(field(&[1; 20], 20), None); // exactly 10 blocks
        let msg = LIMITS.check(&[1, 7, 200], 1).unwrap_err().message;
        assert!(msg.contains("200") && msg.contains("position 2"), "{msg}");
    }
}
