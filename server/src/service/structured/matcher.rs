//! One sequence's constraint: an llguidance [`Matcher`] behind the engine's
//! [`TokenConstraint`].
//!
//! `allowed` is the matcher's token mask as the engine's bitset (bit `t % 32`
//! of word `t / 32`); once the grammar is complete (a closed JSON value and
//! no free whitespace after it) the mask is the end-of-sequence token alone,
//! so the engine ends the sequence there. `accept` advances the matcher; the
//! end-of-sequence token the engine reports after a complete grammar is taken
//! as the end it is.

use ember_engine::TokenConstraint;
use llguidance::Matcher;

/// A sequence's grammar state.
pub struct GrammarMatcher {
    matcher: Matcher,
    eos: u32,
    /// Words of the bitset `allowed` returns: ceil(vocabulary / 32).
    words: usize,
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("eos", &self.eos)
            .field("stopped", &self.matcher.is_stopped())
            .field("error", &self.matcher.get_error())
            .finish()
    }
}

impl GrammarMatcher {
    /// `matcher`, fresh, over a vocabulary of `vocab_size` tokens.
    pub fn new(matcher: Matcher, eos: u32, vocab_size: usize) -> Self {
        Self {
            matcher,
            eos,
            words: vocab_size.div_ceil(32),
        }
    }

    /// Whether the grammar is complete (only the end of sequence may come).
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }
}

impl TokenConstraint for GrammarMatcher {
    fn allowed(&mut self) -> Result<Option<Vec<u32>>, String> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| format!("structured output: {e}"))?;
        let mut bits = mask.as_slice().to_vec();
        bits.resize(self.words, 0);
        Ok(Some(bits))
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        if token == self.eos && self.is_complete() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("structured output: token {token}: {e}"))
    }
}
