//! [`SamplingParams`]: how the next token is chosen (the sampler's own
//! options), and their check.

use super::bounds::fail;
use crate::limits::{LimitField, LimitViolation};

/// How to pick each next token (vLLM's semantics, transformers' order:
/// temperature, then top-k, then top-p over what is left, then min-p; the
/// filters keep the intersection).
///
/// `temperature == 0` (or `top_k == 1`) is greedy: the argmax, the other
/// fields unread. `top_k` of 0 or -1 keeps every token; `top_p` of 1 and
/// `min_p` of 0 are off. `seed` seeds the sequence's draws, so the same
/// seed gives the same tokens; `None` is seed 0 (the service always sets
/// one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    /// Keep only tokens at least `min_p` times as likely as the most likely
    /// one (after temperature).
    pub min_p: f32,
    pub seed: Option<u64>,
}

impl SamplingParams {
    /// Argmax decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
        }
    }

    /// Whether this picks the argmax (no randomness).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// The tokens top-k keeps, when it is on (`top_k > 1`; 1 is greedy).
    pub fn top_k_limit(&self) -> Option<usize> {
        (self.top_k > 1).then_some(self.top_k as usize)
    }

    /// The seed of the sequence's draws.
    pub fn seed_or_default(&self) -> u64 {
        self.seed.unwrap_or(0)
    }

    /// Checks every field's range, naming the field.
    pub(super) fn check(&self) -> Result<(), LimitViolation> {
        let field = LimitField::Sampling;
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return fail(
                field("temperature"),
                format!("must be a finite number >= 0, got {}", self.temperature),
            );
        }
        if self.top_k < -1 {
            return fail(
                field("top_k"),
                format!("must be -1 or 0 (no limit) or more, got {}", self.top_k),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return fail(
                field("top_p"),
                format!("must be in (0, 1], got {}", self.top_p),
            );
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return fail(
                field("min_p"),
                format!("must be in [0, 1], got {}", self.min_p),
            );
        }
        Ok(())
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}
