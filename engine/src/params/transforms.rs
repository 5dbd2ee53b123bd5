//! [`LogitTransforms`]: changes to the logits before the choice
//! (`logit_bias`, the penalties), and their check.

use std::collections::HashSet;

use super::bounds::fail;
use crate::limits::{LimitField, LimitViolation, LOGIT_BIAS_RANGE, MAX_LOGIT_BIAS, PENALTY_RANGE};

/// Changes to the logits before the choice, in vLLM's order: `logit_bias`,
/// then the penalties.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitTransforms {
    /// Added to these tokens' logits (OpenAI's `logit_bias`: -100 to 100
    /// each), sorted by token, at most one entry per token.
    pub logit_bias: Vec<(u32, f32)>,
    pub penalties: Penalties,
}

impl LogitTransforms {
    /// Whether any transform is on.
    pub fn any(&self) -> bool {
        !self.logit_bias.is_empty() || self.penalties.any()
    }

    /// Checks the penalties' ranges and each bias entry (inside a
    /// vocabulary of `vocab_size`, once per token, within range).
    pub(super) fn check(&self, vocab_size: usize) -> Result<(), LimitViolation> {
        let p = self.penalties;
        if !(p.repetition.is_finite() && p.repetition > 0.0) {
            return fail(
                LimitField::Sampling("repetition_penalty"),
                format!(
                    "must be a finite number > 0 (1 = off), got {}",
                    p.repetition
                ),
            );
        }
        for (name, v) in [
            ("frequency_penalty", p.frequency),
            ("presence_penalty", p.presence),
        ] {
            if !(v.is_finite() && v.abs() <= PENALTY_RANGE) {
                return fail(
                    LimitField::Sampling(name),
                    format!("must be in [-2, 2], got {v}"),
                );
            }
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return fail(
                LimitField::LogitBias(None),
                format!(
                    "{} entries given, at most {MAX_LOGIT_BIAS} allowed",
                    self.logit_bias.len()
                ),
            );
        }
        let mut seen = HashSet::with_capacity(self.logit_bias.len());
        for &(token, bias) in &self.logit_bias {
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
        Ok(())
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
