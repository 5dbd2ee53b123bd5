//! [`SamplingTable`]: how every row of one step picks its token, as columns.
//!
//! The engine fills one row per sequence of the step (its request's options,
//! plus the position it samples at, which keys its draw); the runner
//! writes the columns into device buffers ([`super::SamplingParamsRows`]) and
//! the sampler reads them. A step is a table, not a list of per-row enums, so
//! that a new option is one more column and every place that needs it reads
//! it from the same row index.
//!
//! **The in-graph argmax.** A replayed decode graph computes each row's
//! argmax of the *raw* logits. A row may take it only if it is greedy and no
//! option of its changes its logits before the choice (penalties, a logit
//! bias, a banned token, a grammar mask): [`SamplingTable::takes_graph_argmax`]
//! is the one place that decides it, and [`SamplingTable::changes_logits`]
//! the one list of logit-changing options. Rows that cannot take it are
//! chosen from the logits after the graph, so no option is ever skipped.
//!
//! **Adding an option** (docs/architecture.md has the recipe,
//! `crate::params` the kinds): a sampling option is a field of
//! [`SamplingParams`], which this table carries whole (one column), read by
//! the sampler; an option that changes logits adds its clause to
//! [`SamplingTable::changes_logits`].

use crate::ops::row_params::RowPenalty;
use crate::params::SamplingParams;

/// One token's logit edit in one row, applied before the choice in vLLM's
/// order: `logit += add`; then the repetition factor (a positive logit is
/// divided by it, a negative one multiplied; 1 = none); then `logit -=
/// subtract` (frequency and presence penalties).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenEdit {
    pub token: u32,
    pub add: f32,
    pub repetition: f32,
    pub subtract: f32,
}

/// One row's sampling for one step.
#[derive(Debug, Clone, PartialEq)]
pub struct RowSampling {
    /// What the row's request asked for.
    pub params: SamplingParams,
    /// The position of the token being sampled (the sequence's length so
    /// far): with the request's seed, the key of the row's draw, so a seeded
    /// request samples the same tokens whatever its batch and after a
    /// preemption.
    pub pos: u32,
    /// Top-n of the logprobs to report for the chosen token; `None`: none.
    pub logprobs: Option<usize>,
    /// Logit bias and penalties, one entry per token they touch (at most
    /// one per token).
    pub edits: Vec<TokenEdit>,
    /// Tokens that may not be chosen this step (`min_tokens` not reached).
    pub banned: Vec<u32>,
    /// The only tokens that may be chosen (a constraint's bitset: bit
    /// `t % 32` of word `t / 32`), or `None`.
    pub allowed: Option<Vec<u32>>,
    /// Penalties the sampling kernel applies from the row's slot of the
    /// device counts (`super::penalty_state`); such a row's `edits` hold
    /// none of them.
    pub penalty: Option<RowPenalty>,
}

impl RowSampling {
    /// A greedy row without logprobs or edits (warmup, padding, tests).
    pub fn greedy() -> Self {
        Self::plain(SamplingParams::greedy(), 0, None)
    }

    /// A row with these parameters, sampling at `pos`, without logit edits.
    pub fn plain(params: SamplingParams, pos: u32, logprobs: Option<usize>) -> Self {
        Self {
            params,
            pos,
            logprobs,
            edits: Vec::new(),
            banned: Vec::new(),
            allowed: None,
            penalty: None,
        }
    }
}

/// A step's sampling, one entry per real row in each column (see the module
/// docs). Padding rows are not in the table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingTable {
    /// What each row's request asked of the choice (temperature, top-k,
    /// top-p, min-p, seed).
    pub sampling: Vec<SamplingParams>,
    /// The position each row samples at (its draw's key with its seed).
    pub pos: Vec<u32>,
    /// Top-n logprobs asked per row.
    pub logprobs: Vec<Option<usize>>,
    /// Logit bias and penalty edits per row (empty for most).
    pub edits: Vec<Vec<TokenEdit>>,
    /// Banned tokens per row (`min_tokens`).
    pub banned: Vec<Vec<u32>>,
    /// Allowed-token bitsets per row (structured output).
    pub allowed: Vec<Option<Vec<u32>>>,
    /// Penalties applied from device counts per row.
    pub penalty: Vec<Option<RowPenalty>>,
}

impl SamplingTable {
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            sampling: Vec::with_capacity(rows),
            pos: Vec::with_capacity(rows),
            logprobs: Vec::with_capacity(rows),
            edits: Vec::with_capacity(rows),
            banned: Vec::with_capacity(rows),
            allowed: Vec::with_capacity(rows),
            penalty: Vec::with_capacity(rows),
        }
    }

    /// A table of `rows` greedy rows (warmup, tests).
    pub fn greedy(rows: usize) -> Self {
        let mut t = Self::with_capacity(rows);
        for _ in 0..rows {
            t.push(RowSampling::greedy());
        }
        t
    }

    /// Appends a row.
    pub fn push(&mut self, row: RowSampling) {
        self.sampling.push(row.params);
        self.pos.push(row.pos);
        self.logprobs.push(row.logprobs);
        self.edits.push(row.edits);
        self.banned.push(row.banned);
        self.allowed.push(row.allowed);
        self.penalty.push(row.penalty);
    }

    /// Rows in the table.
    pub fn len(&self) -> usize {
        self.sampling.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether row `i` picks the argmax (no randomness).
    pub fn is_greedy(&self, i: usize) -> bool {
        self.sampling[i].is_greedy()
    }

    /// Whether some option of row `i` changes its logits before the choice:
    /// a logit bias or a penalty (`edits`), banned tokens (`min_tokens`), an
    /// allowed set (structured output). The one list of them.
    pub fn changes_logits(&self, i: usize) -> bool {
        !self.edits[i].is_empty() || !self.banned[i].is_empty() || self.allowed[i].is_some()
    }

    /// Whether any row's logits change before the choice.
    pub fn any_changes_logits(&self) -> bool {
        (0..self.len()).any(|i| self.changes_logits(i))
    }

    /// Whether row `i`'s token may be the argmax a replayed decode graph
    /// computed from the raw logits: greedy, nothing changes its logits
    /// before the choice, and no device-side penalty (which the sampling
    /// kernel applies). The one place this is decided (module docs).
    pub fn takes_graph_argmax(&self, i: usize) -> bool {
        self.is_greedy(i) && !self.changes_logits(i) && self.penalty[i].is_none()
    }

    /// Whether any row's penalties come from the device counts.
    pub fn any_device_penalty(&self) -> bool {
        self.penalty.iter().any(Option::is_some)
    }

    /// Whether every row takes the graph's argmax: the step launches nothing
    /// after the graph but the read of the ids.
    pub fn all_take_graph_argmax(&self) -> bool {
        (0..self.len()).all(|i| self.takes_graph_argmax(i))
    }

    /// Whether any row asked for logprobs (the runner keeps the logits for
    /// them only then).
    pub fn any_logprobs(&self) -> bool {
        self.logprobs.iter().any(Option::is_some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(temperature: f32, top_k: i32) -> RowSampling {
        let params = SamplingParams {
            temperature,
            top_k,
            seed: Some(1),
            ..SamplingParams::greedy()
        };
        RowSampling::plain(params, 7, None)
    }

    #[test]
    fn columns_line_up_and_greedy_rows_take_the_graph_argmax() {
        let mut t = SamplingTable::with_capacity(3);
        t.push(RowSampling::greedy());
        t.push(sampled(0.7, 0));
        t.push(RowSampling {
            logprobs: Some(3),
            ..sampled(0.7, 1)
        });
        assert_eq!(t.len(), 3);
        assert_eq!(t.pos, [0, 7, 7]);
        // top_k == 1 is greedy whatever the temperature.
        assert_eq!(
            (0..3).map(|i| t.takes_graph_argmax(i)).collect::<Vec<_>>(),
            [true, false, true]
        );
        assert!(!t.all_take_graph_argmax());
        assert!(t.any_logprobs());
        assert!(SamplingTable::greedy(4).all_take_graph_argmax());
    }

    #[test]
    fn a_greedy_row_whose_logits_change_cannot_take_the_graph_argmax() {
        let edited = RowSampling {
            edits: vec![TokenEdit {
                token: 3,
                add: 1.0,
                repetition: 1.0,
                subtract: 0.0,
            }],
            ..RowSampling::greedy()
        };
        let banned = RowSampling {
            banned: vec![7],
            ..RowSampling::greedy()
        };
        let allowed = RowSampling {
            allowed: Some(vec![1]),
            ..RowSampling::greedy()
        };
        let penalized = RowSampling {
            penalty: Some(RowPenalty {
                slot: 0,
                repetition: 1.0,
                frequency: 0.5,
                presence: 0.0,
                bias: false,
            }),
            ..RowSampling::greedy()
        };
        let mut t = SamplingTable::with_capacity(5);
        for row in [RowSampling::greedy(), edited, banned, allowed, penalized] {
            t.push(row);
        }
        let takes: Vec<bool> = (0..5).map(|i| t.takes_graph_argmax(i)).collect();
        assert_eq!(takes, [true, false, false, false, false]);
        assert!(!t.changes_logits(4), "device penalties need no host edits");
        assert!(t.any_device_penalty());
        assert!(t.any_changes_logits() && !t.all_take_graph_argmax());
    }
}
