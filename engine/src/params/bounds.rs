//! What a request's parameters are checked against ([`ParamLimits`]), and
//! the one way a kind's `check` reports a violation ([`fail`]).

use crate::limits::{LimitField, LimitViolation};

/// What the parameters are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamLimits {
    /// Token ids must be below this (the model's embedding rows).
    pub vocab_size: usize,
    /// Most tokens one request may ask for (the server's
    /// `--max-new-tokens-limit`; `usize::MAX` for none).
    pub max_new_tokens: usize,
}

/// A violation of `field`'s limit, explained by `message`.
pub fn fail(field: LimitField, message: String) -> Result<(), LimitViolation> {
    Err(LimitViolation { field, message })
}
