//! Prompt logprobs in a prefill step: which flat positions a step scores,
//! and each request's logprobs from the logits at them.

use burn::prelude::*;

use crate::error::EngineError;
use crate::sampling::logprobs_from;
use crate::step::inputs::PrefillSeq;
use crate::types::TokenLogprobs;

/// Logprobs of tokens at positions of one prefill row (prompt logprobs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreRequest {
    /// The row, an index into the step's rows.
    pub row: usize,
    /// The first position scored, an offset into the row's tokens.
    pub from: usize,
    /// The token each position from `from` predicts: its logprob is the
    /// one reported.
    pub targets: Vec<u32>,
    /// Alternatives reported per position.
    pub top: usize,
}

/// The flat token indices (into the step's concatenated rows) of every
/// position `scores` asks for, in order.
pub(super) fn score_positions(rows: &[PrefillSeq<'_>], scores: &[ScoreRequest]) -> Vec<i32> {
    let mut base = Vec::with_capacity(rows.len());
    let mut n = 0;
    for r in rows {
        base.push(n);
        n += r.tokens.len();
    }
    scores
        .iter()
        .flat_map(|s| {
            let b = base[s.row] + s.from;
            (b..b + s.targets.len()).map(|i| i as i32)
        })
        .collect()
}

/// Each request's logprobs from `logits` (`[rows + positions, V]`: the
/// step's `rows` sampled rows, then the scored positions in order; read in
/// place, nothing is sliced or copied).
pub(super) fn score(
    logits: Tensor<2>,
    rows: usize,
    scores: &[ScoreRequest],
) -> Result<Vec<Vec<TokenLogprobs>>, EngineError> {
    let targets: Vec<u32> = scores
        .iter()
        .flat_map(|s| s.targets.iter().copied())
        .collect();
    let top: Vec<Option<usize>> = scores
        .iter()
        .flat_map(|s| std::iter::repeat_n(Some(s.top), s.targets.len()))
        .collect();
    let mut all = logprobs_from(logits, rows, &targets, &top)?.into_iter();
    Ok(scores
        .iter()
        .map(|s| all.by_ref().take(s.targets.len()).flatten().collect())
        .collect())
}
