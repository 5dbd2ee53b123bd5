//! [`TokenStats`]: the tokens a sequence has, as its penalties need them
//! (each token's count in the output, and whether the prompt has it), and
//! the per-step [`TokenEdit`]s its logit bias and penalties make of them.
//!
//! Kept on the host, per sequence, only for a request with a penalty: the
//! device gets one step's edits as a short list (the tokens the sequence has
//! and the biased ones), not a vocabulary-wide table per sequence.

use std::collections::HashMap;

use crate::params::Penalties;
use crate::sampling::TokenEdit;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Stat {
    /// Times the output has the token.
    output: u32,
    /// Whether the prompt has it.
    in_prompt: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct TokenStats {
    by_token: HashMap<u32, Stat>,
    /// Whether prompt tokens are recorded (the repetition penalty needs them).
    track_prompt: bool,
}

impl TokenStats {
    /// The stats of a sequence with `prompt` and `output` so far, for
    /// `penalties` (nothing is kept when no penalty is on).
    pub fn new(prompt: &[u32], output: &[u32], penalties: Penalties) -> Self {
        let mut s = Self {
            by_token: HashMap::new(),
            track_prompt: penalties.repetition != 1.0,
        };
        if !penalties.any() {
            return s;
        }
        if s.track_prompt {
            for &t in prompt {
                s.by_token.entry(t).or_default().in_prompt = true;
            }
        }
        for &t in output {
            s.record_output(t);
        }
        s
    }

    /// The sequence emitted `token`.
    pub fn record_output(&mut self, token: u32) {
        self.by_token.entry(token).or_default().output += 1;
    }

    /// Every token it has: `(token, output count, whether the prompt has
    /// it)` (the prompt only where the repetition penalty is on).
    pub fn entries(&self) -> Vec<(u32, u32, bool)> {
        self.by_token
            .iter()
            .map(|(&t, s)| (t, s.output, s.in_prompt))
            .collect()
    }

    /// One step's edits: `penalties` on the tokens the sequence has, `bias`
    /// added (at most one entry per token).
    pub fn edits(&self, penalties: Penalties, bias: &[(u32, f32)]) -> Vec<TokenEdit> {
        let mut edits: HashMap<u32, TokenEdit> = HashMap::with_capacity(self.by_token.len());
        if penalties.any() {
            for (&token, s) in &self.by_token {
                let seen = s.in_prompt || s.output > 0;
                let repetition = if seen { penalties.repetition } else { 1.0 };
                let subtract = penalties.frequency * s.output as f32
                    + if s.output > 0 {
                        penalties.presence
                    } else {
                        0.0
                    };
                if repetition != 1.0 || subtract != 0.0 {
                    edits.insert(
                        token,
                        TokenEdit {
                            token,
                            add: 0.0,
                            repetition,
                            subtract,
                        },
                    );
                }
            }
        }
        for &(token, add) in bias {
            edits
                .entry(token)
                .or_insert(TokenEdit {
                    token,
                    add: 0.0,
                    repetition: 1.0,
                    subtract: 0.0,
                })
                .add += add;
        }
        let mut out: Vec<TokenEdit> = edits.into_values().collect();
        out.sort_unstable_by_key(|e| e.token);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(repetition: f32, frequency: f32, presence: f32) -> Penalties {
        Penalties {
            repetition,
            frequency,
            presence,
        }
    }

    #[test]
    fn repetition_covers_prompt_and_output_and_frequency_presence_the_output() {
        let mut s = TokenStats::new(&[5, 6], &[6, 7, 7], p(1.5, 0.5, 0.25));
        s.record_output(7);
        let edits = s.edits(p(1.5, 0.5, 0.25), &[(9, -2.0), (5, 1.0)]);
        let e = |token, add, repetition, subtract| TokenEdit {
            token,
            add,
            repetition,
            subtract,
        };
        assert_eq!(
            edits,
            [
                e(5, 1.0, 1.5, 0.0),        // prompt only, and biased
                e(6, 0.0, 1.5, 0.5 + 0.25), // prompt and once in the output
                e(7, 0.0, 1.5, 1.5 + 0.25), // three times in the output
                e(9, -2.0, 1.0, 0.0),       // biased only
            ]
        );
    }

    #[test]
    fn without_penalties_nothing_is_kept_and_only_the_bias_edits() {
        let s = TokenStats::new(&[1, 2, 3], &[4], Penalties::OFF);
        assert!(s.by_token.is_empty());
        assert_eq!(s.edits(Penalties::OFF, &[]), []);
        // Frequency alone does not record the prompt.
        let s = TokenStats::new(&[1, 2], &[2], p(1.0, 1.0, 0.0));
        assert_eq!(s.by_token.len(), 1);
    }
}
