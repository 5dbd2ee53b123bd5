//! [`StopRules`]: when a sequence ends, and their check.

use super::bounds::{fail, ParamLimits};
use crate::limits::{
    LimitField, LimitViolation, MAX_STOP_STRINGS, MAX_STOP_STRING_BYTES, MAX_STOP_TOKEN_IDS,
};

/// When a sequence ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StopRules {
    /// Tokens to generate at most (>= 1; 0 only to score the prompt with
    /// `prompt_logprobs`).
    pub max_new_tokens: usize,
    /// EOS and the stop token ids cannot be sampled before this many tokens
    /// were emitted (vLLM's `min_tokens`).
    pub min_tokens: usize,
    /// Keep going past a sampled EOS (which is then emitted like any token).
    pub ignore_eos: bool,
    /// Tokens that end the sequence like EOS (not emitted), even with
    /// `ignore_eos`.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end the output where they appear in its text (matched
    /// by the service on the detokenized text; the engine never reads them).
    pub stop_strings: Vec<String>,
}

impl StopRules {
    /// Up to `max_new_tokens` tokens, stopping at EOS only.
    pub fn new(max_new_tokens: usize) -> Self {
        Self {
            max_new_tokens,
            ..Self::default()
        }
    }

    /// Checks the budget (at least 1, or 0 when `scoring` the prompt; within
    /// the limit), `min_tokens`, the stop strings and the stop token ids.
    pub(super) fn check(&self, limits: &ParamLimits, scoring: bool) -> Result<(), LimitViolation> {
        let max = self.max_new_tokens;
        if max == 0 && !scoring {
            return fail(
                LimitField::MaxNewTokens,
                "must be at least 1 (0 only with prompt_logprobs, to score the prompt)".into(),
            );
        }
        if max > limits.max_new_tokens {
            return fail(
                LimitField::MaxNewTokens,
                format!(
                    "{max} is above the server's limit of {} (--max-new-tokens-limit)",
                    limits.max_new_tokens
                ),
            );
        }
        if self.min_tokens > max {
            return fail(
                LimitField::Sampling("min_tokens"),
                format!("{} is above max_new_tokens ({max})", self.min_tokens),
            );
        }
        self.check_stops(limits.vocab_size)
    }

    fn check_stops(&self, vocab_size: usize) -> Result<(), LimitViolation> {
        let strings = &self.stop_strings;
        if strings.len() > MAX_STOP_STRINGS {
            return fail(
                LimitField::Stop(None),
                format!(
                    "{} stop strings given, at most {MAX_STOP_STRINGS} allowed",
                    strings.len()
                ),
            );
        }
        if let Some((i, bad)) = strings
            .iter()
            .enumerate()
            .find(|(_, x)| x.is_empty() || x.len() > MAX_STOP_STRING_BYTES)
        {
            return fail(
                LimitField::Stop(Some(i)),
                format!(
                    "is {} bytes long; a stop string must be 1 to {MAX_STOP_STRING_BYTES} bytes",
                    bad.len()
                ),
            );
        }
        let ids = &self.stop_token_ids;
        if ids.len() > MAX_STOP_TOKEN_IDS {
            return fail(
                LimitField::StopTokenIds(None),
                format!(
                    "{} ids given, at most {MAX_STOP_TOKEN_IDS} allowed",
                    ids.len()
                ),
            );
        }
        match ids.iter().position(|&id| id as usize >= vocab_size) {
            Some(i) => fail(
                LimitField::StopTokenIds(Some(i)),
                format!(
                    "token id {} is outside the vocabulary (size {vocab_size})",
                    ids[i]
                ),
            ),
            None => Ok(()),
        }
    }
}
