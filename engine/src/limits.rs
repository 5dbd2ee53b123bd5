//! The one check of a request against the model's and the cache's limits.
//!
//! The service runs it before queueing (so a client gets INVALID_ARGUMENT
//! naming the field) and the engine runs it again at prefill (so no caller can
//! get an impossible sequence into the batch). Both use [`RequestLimits`].
//!
//! The optional generation controls have fixed limits here too: stop strings
//! (checked by the service only: they are matched on the text, which the
//! engine never sees), stop token ids and the logprobs top-n count (checked by
//! both).

/// Most stop strings one request may give.
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes (the shortest is 1).
pub const MAX_STOP_STRING_BYTES: usize = 256;
/// Most stop token ids one request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 64;
/// Most alternatives a request may ask for per token (`logprobs` top-n).
pub const MAX_TOP_LOGPROBS: usize = 20;

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
}

impl LimitField {
    /// The request field's name as a client sees it (`stop[3]`). The prompt
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

    /// Checks the stop token ids (count, each inside the vocabulary) and the
    /// logprobs top-n count (`None`: no logprobs asked).
    pub fn check_controls(
        &self,
        stop_token_ids: &[u32],
        top_logprobs: Option<usize>,
    ) -> Result<(), LimitViolation> {
        if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(LimitViolation {
                field: LimitField::StopTokenIds(None),
                message: format!(
                    "{} ids given, at most {MAX_STOP_TOKEN_IDS} allowed",
                    stop_token_ids.len()
                ),
            });
        }
        if let Some((i, bad)) = stop_token_ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= self.vocab_size)
        {
            return Err(LimitViolation {
                field: LimitField::StopTokenIds(Some(i)),
                message: format!(
                    "token id {bad} is outside the vocabulary (size {})",
                    self.vocab_size
                ),
            });
        }
        match top_logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => Err(LimitViolation {
                field: LimitField::Logprobs,
                message: format!("{n} alternatives asked, at most {MAX_TOP_LOGPROBS} allowed"),
            }),
            _ => Ok(()),
        }
    }
}

/// Checks the stop strings: at most [`MAX_STOP_STRINGS`], each 1 to
/// [`MAX_STOP_STRING_BYTES`] bytes. Needs no model, so the service runs it
/// before tokenizing.
pub fn check_stop_strings(stop: &[String]) -> Result<(), LimitViolation> {
    if stop.len() > MAX_STOP_STRINGS {
        return Err(LimitViolation {
            field: LimitField::Stop(None),
            message: format!(
                "{} stop strings given, at most {MAX_STOP_STRINGS} allowed",
                stop.len()
            ),
        });
    }
    match stop
        .iter()
        .enumerate()
        .find(|(_, s)| s.is_empty() || s.len() > MAX_STOP_STRING_BYTES)
    {
        Some((i, s)) => Err(LimitViolation {
            field: LimitField::Stop(Some(i)),
            message: format!(
                "is {} bytes long; a stop string must be 1 to {MAX_STOP_STRING_BYTES} bytes",
                s.len()
            ),
        }),
        None => Ok(()),
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

    fn control_field(ids: &[u32], top: Option<usize>) -> Option<String> {
        LIMITS
            .check_controls(ids, top)
            .err()
            .map(|v| v.field.name("prompt"))
    }

    #[test]
    fn controls_name_the_entry_that_breaks_a_limit() {
        assert_eq!(control_field(&[0, 99], Some(20)), None);
        assert_eq!(control_field(&[], None), None);
        assert_eq!(
            control_field(&[5, 100], None).as_deref(),
            Some("stop_token_ids[1]")
        );
        let many = vec![1; MAX_STOP_TOKEN_IDS + 1];
        assert_eq!(
            control_field(&many, None).as_deref(),
            Some("stop_token_ids")
        );
        assert_eq!(control_field(&[], Some(21)).as_deref(), Some("logprobs"));

        let strings = |v: &[&str]| {
            let v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
            check_stop_strings(&v).err().map(|e| e.field.name("prompt"))
        };
        assert_eq!(strings(&["a", "\n\n"]), None);
        assert_eq!(strings(&["a", "b", "", "c"]).as_deref(), Some("stop[2]"));
        let long = "x".repeat(MAX_STOP_STRING_BYTES + 1);
        assert_eq!(strings(&[&long]).as_deref(), Some("stop[0]"));
        assert_eq!(strings(&[&long[1..]]), None);
        assert_eq!(strings(&["s"; MAX_STOP_STRINGS]), None);
        assert_eq!(
            strings(&["s"; MAX_STOP_STRINGS + 1]).as_deref(),
            Some("stop")
        );
    }
}
