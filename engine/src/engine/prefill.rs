//! Planning one prefill step: which prompt tokens of which sequences it
//! computes, and in what row order.
//!
//! A step's rows are `(sequence, next chunk of its prompt)`. Each chunk is
//! cut to what is left of its prompt; rows whose chunk completes their
//! prompt and that generate go first, because theirs are the logits that get
//! sampled (the first token). The device step concatenates the rows' tokens into one
//! flat sequence; a row that starts after cached positions (a prefix-cache
//! hit, earlier chunks) attends over its whole context read in place from
//! the paged cache, like a fresh one; its new K/V go to its own fresh blocks
//! (`crate::step`).

use std::collections::HashSet;

use super::sequences::Sequences;
use crate::error::EngineError;
use crate::step::PrefillSeq;
use crate::types::{PrefillChunk, SeqId};

/// One row of a planned prefill step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PrefillRow {
    pub id: SeqId,
    /// Prompt tokens this step computes for the sequence.
    pub tokens: usize,
    /// Whether they complete its prompt.
    pub completes: bool,
    /// Whether it is sampled: it completes its prompt and generates (a
    /// prompt-scoring request with `max_new_tokens` 0 does not).
    pub samples: bool,
}

/// The rows of a prefill step over `chunks`, sampled rows first, then the
/// other completing ones (in chunk order within each group). Every chunk must name a distinct prefilling
/// sequence and be non-empty; otherwise nothing is planned.
pub(super) fn plan(
    chunks: &[PrefillChunk],
    seqs: &Sequences,
) -> Result<Vec<PrefillRow>, EngineError> {
    let mut seen = HashSet::with_capacity(chunks.len());
    let mut rows = Vec::with_capacity(chunks.len());
    for c in chunks {
        let seq = seqs.prefilling(c.id)?;
        if c.tokens == 0 || !seen.insert(c.id) {
            return Err(EngineError::InvalidRequest(format!(
                "prefill chunk of sequence {} is empty or repeated",
                c.id
            )));
        }
        let left = seq.prompt_remaining();
        let tokens = c.tokens.min(left);
        rows.push(PrefillRow {
            id: c.id,
            tokens,
            completes: tokens == left,
            samples: tokens == left && seq.samples(),
        });
    }
    rows.sort_by_key(|r| (!r.samples, !r.completes));
    Ok(rows)
}

/// What the device step needs of each planned row: its tokens, where they
/// start and its block table.
pub(super) fn views<'a>(rows: &[PrefillRow], seqs: &'a Sequences) -> Vec<PrefillSeq<'a>> {
    rows.iter()
        .filter_map(|r| {
            let s = seqs.get(r.id)?;
            Some(PrefillSeq {
                tokens: &s.tokens[s.cached..s.cached + r.tokens],
                start: s.cached,
                table: &s.table,
            })
        })
        .collect()
}
