//! [`Outputs`]: what is reported besides the tokens, and its check.

use super::bounds::fail;
use crate::limits::{LimitField, LimitViolation, MAX_TOP_LOGPROBS};

/// What is reported besides the tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outputs {
    /// `Some(n)`: each emitted token's logprob and its `n` most likely
    /// alternatives. `None`: nothing is computed.
    pub logprobs: Option<usize>,
    /// `Some(n)`: the logprob of each prompt token given the ones before it
    /// (none for the first) and its `n` most likely alternatives (vLLM's
    /// `prompt_logprobs`), computed by the prefill (such a request does not
    /// take prompt tokens from the prefix cache).
    pub prompt_logprobs: Option<usize>,
}

impl Outputs {
    /// Checks the top-n counts.
    pub(super) fn check(&self) -> Result<(), LimitViolation> {
        for (field, n) in [
            (LimitField::Logprobs, self.logprobs),
            (LimitField::PromptLogprobs, self.prompt_logprobs),
        ] {
            if let Some(n) = n.filter(|&n| n > MAX_TOP_LOGPROBS) {
                return fail(
                    field,
                    format!("{n} alternatives asked, at most {MAX_TOP_LOGPROBS} allowed"),
                );
            }
        }
        Ok(())
    }
}
