//! The one check of a request against the model's and the cache's limits.
//!
//! The service runs it before queueing (so a client gets INVALID_ARGUMENT
//! naming the field) and the engine runs it again at prefill (so no caller can
//! get an impossible sequence into the batch). Both use [`RequestLimits`].

/// What a request must fit into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Prompt + generated tokens must fit the position table.
    pub context: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the whole cache (a request reserves its whole budget).
    pub kv_blocks_total: usize,
}

/// Which part of a request broke a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitField {
    /// The prompt itself (its ids or length).
    Prompt,
    /// `max_new_tokens` (the generation budget does not fit).
    MaxNewTokens,
}

/// A broken limit: which field and why (the message names no field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LimitViolation {
    pub field: LimitField,
    pub message: String,
}

impl RequestLimits {
    /// Blocks a request reserves at admission: its whole budget.
    pub fn blocks_required(&self, prompt_len: usize, max_new_tokens: usize) -> usize {
        (prompt_len + max_new_tokens).div_ceil(self.block_size)
    }

    /// Checks a prompt and its generation budget.
    pub fn check(&self, prompt: &[u32], max_new_tokens: usize) -> Result<(), LimitViolation> {
        let fail = |field, message: String| Err(LimitViolation { field, message });
        if prompt.is_empty() {
            return fail(LimitField::Prompt, "has no tokens".into());
        }
        if max_new_tokens == 0 {
            return fail(LimitField::MaxNewTokens, "must be at least 1".into());
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
        assert_eq!(field(&[1], 0), Some(LimitField::MaxNewTokens));
        assert_eq!(field(&[1, 100], 4), Some(LimitField::Prompt));
        assert_eq!(field(&[1; 30], 35), Some(LimitField::MaxNewTokens)); // 65 > context 64
        assert_eq!(field(&[1; 36], 1), None); // long prompts are prefilled in chunks
        assert_eq!(field(&[1; 20], 21), Some(LimitField::MaxNewTokens)); // 11 blocks > 10
        assert_eq!(field(&[1; 20], 20), None); // exactly 10 blocks
        let msg = LIMITS.check(&[1, 7, 200], 1).unwrap_err().message;
        assert!(msg.contains("200") && msg.contains("position 2"), "{msg}");
    }
}
