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

use crate::types::Penalties;

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
    /// The penalties.
    RepetitionPenalty,
    FrequencyPenalty,
    PresencePenalty,
    /// The logit bias: the map (`None`) or the entry of a token.
    LogitBias(Option<u32>),
    MinTokens,
    /// The prompt logprobs top-n count.
    PromptLogprobs,
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
            Self::RepetitionPenalty => "repetition_penalty".into(),
            Self::FrequencyPenalty => "frequency_penalty".into(),
            Self::PresencePenalty => "presence_penalty".into(),
            Self::LogitBias(None) => "logit_bias".into(),
            Self::LogitBias(Some(t)) => format!("logit_bias[{t}]"),
            Self::MinTokens => "min_tokens".into(),
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

/// A request's logit options and generation length, as
/// [`check_options`] checks them.
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    pub max_new_tokens: usize,
    pub penalties: Penalties,
    pub logit_bias: &'a [(u32, f32)],
    pub min_tokens: usize,
    pub prompt_logprobs: Option<usize>,
}

/// Checks the generation length (at least 1; 0 only to score the prompt
/// with `prompt_logprobs`), the penalties (repetition > 0, frequency and
/// presence within ±[`PENALTY_RANGE`]), the logit bias (at most
/// [`MAX_LOGIT_BIAS`] entries, one per token inside the vocabulary of
/// `vocab_size`, each within ±[`LOGIT_BIAS_RANGE`]), `min_tokens` (at most
/// `max_new_tokens`) and the prompt logprobs count.
pub fn check_options(o: &Options<'_>, vocab_size: usize) -> Result<(), LimitViolation> {
    let fail = |field, message: String| Err(LimitViolation { field, message });
    if o.max_new_tokens == 0 && o.prompt_logprobs.is_none() {
        return fail(
            LimitField::MaxNewTokens,
            "must be at least 1 (0 only with prompt_logprobs, to score the prompt)".into(),
        );
    }
    let p = o.penalties;
    if !(p.repetition.is_finite() && p.repetition > 0.0) {
        return fail(
            LimitField::RepetitionPenalty,
            format!(
                "must be a finite number > 0 (1 = off), got {}",
                p.repetition
            ),
        );
    }
    for (field, v) in [
        (LimitField::FrequencyPenalty, p.frequency),
        (LimitField::PresencePenalty, p.presence),
    ] {
        if !(v.is_finite() && v.abs() <= PENALTY_RANGE) {
            return fail(field, format!("must be in [-2, 2], got {v}"));
        }
    }
    if o.logit_bias.len() > MAX_LOGIT_BIAS {
        return fail(
            LimitField::LogitBias(None),
            format!(
                "{} entries given, at most {MAX_LOGIT_BIAS} allowed",
                o.logit_bias.len()
            ),
        );
    }
    let mut seen = std::collections::HashSet::with_capacity(o.logit_bias.len());
    for &(token, bias) in o.logit_bias {
        let field = LimitField::LogitBias(Some(token));
        if token as usize >= vocab_size {
            return fail(
                field,
                format!("token id {token} is outside the vocabulary (size {vocab_size})"),
            );
        }
        if !seen.insert(token) {
            return fail(field, "given twice".into());
        }
        if !(bias.is_finite() && bias.abs() <= LOGIT_BIAS_RANGE) {
            return fail(field, format!("must be in [-100, 100], got {bias}"));
        }
    }
    if o.min_tokens > o.max_new_tokens {
        return fail(
            LimitField::MinTokens,
            format!(
                "{} is above max_new_tokens ({})",
                o.min_tokens, o.max_new_tokens
            ),
        );
    }
    match o.prompt_logprobs {
        Some(n) if n > MAX_TOP_LOGPROBS => fail(
            LimitField::PromptLogprobs,
            format!("{n} alternatives asked, at most {MAX_TOP_LOGPROBS} allowed"),
        ),
        _ => Ok(()),
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
        // 0 new tokens is check_options' to judge (it is fine when scoring).
        assert_eq!(field(&[1], 0), None);
        assert_eq!(field(&[1, 100], 4), Some(LimitField::Prompt));
        assert_eq!(field(&[1; 30], 35), Some(LimitField::MaxNewTokens)); // 65 > context 64
        assert_eq!(field(&[1; 36], 1), None); // long prompts are prefilled in chunks
        assert_eq!(field(&[1; 20], 21), Some(LimitField::MaxNewTokens)); // 11 blocks > 10
        assert_eq!(field(&[1; 20], 20), None); // exactly 10 blocks
        let msg = LIMITS.check(&[1, 7, 200], 1).unwrap_err().message;
        assert!(msg.contains("200") && msg.contains("position 2"), "{msg}");
    }

    #[test]
    fn options_name_the_field_that_breaks_a_limit() {
        let ok = Options {
            max_new_tokens: 4,
            penalties: Penalties::OFF,
            logit_bias: &[(3, 100.0), (4, -100.0)],
            min_tokens: 4,
            prompt_logprobs: None,
        };
        let field = |o: Options<'_>| check_options(&o, 100).err().map(|v| v.field.name("prompt"));
        assert_eq!(field(ok), None);
        let p = |repetition, frequency, presence| Penalties {
            repetition,
            frequency,
            presence,
        };
        for (o, want) in [
            (
                Options {
                    max_new_tokens: 0,
                    min_tokens: 0,
                    ..ok
                },
                "max_new_tokens",
            ),
            (
                Options {
                    penalties: p(0.0, 0.0, 0.0),
                    ..ok
                },
                "repetition_penalty",
            ),
            (
                Options {
                    penalties: p(1.0, 2.5, 0.0),
                    ..ok
                },
                "frequency_penalty",
            ),
            (
                Options {
                    penalties: p(1.0, 0.0, f32::NAN),
                    ..ok
                },
                "presence_penalty",
            ),
            (
                Options {
                    logit_bias: &[(100, 1.0)],
                    ..ok
                },
                "logit_bias[100]",
            ),
            (
                Options {
                    logit_bias: &[(7, 1.0), (7, 2.0)],
                    ..ok
                },
                "logit_bias[7]",
            ),
            (
                Options {
                    logit_bias: &[(7, -100.5)],
                    ..ok
                },
                "logit_bias[7]",
            ),
            (
                Options {
                    min_tokens: 5,
                    ..ok
                },
                "min_tokens",
            ),
            (
                Options {
                    prompt_logprobs: Some(21),
                    ..ok
                },
                "prompt_logprobs",
            ),
        ] {
            assert_eq!(field(o).as_deref(), Some(want));
        }
        let scoring = Options {
            max_new_tokens: 0,
            min_tokens: 0,
            prompt_logprobs: Some(0),
            ..ok
        };
        assert_eq!(field(scoring), None);
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
