//! Prompt logprobs (`prompt_logprobs`): which positions of a prefill step
//! are scored, and the results handed back per sequence.
//!
//! The logprob of prompt token `t` (from `t = 1`) comes from the logits at
//! position `t - 1`. A prefill chunk computes positions `start .. start +
//! len`, so it scores tokens `start + 1 ..= start + len` that are prompt
//! tokens not reported yet (a resumed request's earlier ones were). The
//! device step computes the logits of those positions besides the rows' last
//! ones (`crate::step::StepRunner::prefill`); only the rows that ask pay for
//! them. A request that asks takes nothing from the prefix cache, so every
//! position is computed.

use super::prefill::PrefillRow;
use super::sequences::Sequences;
use crate::step::ScoreRequest;
use crate::types::{PromptLogprobs, SeqId, TokenLogprobs};

/// One scored row of a step: the sequence and its first scored token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Scored {
    pub id: SeqId,
    pub first: usize,
}

/// The scoring requests of a step's `rows` (row indices as in `rows`), and
/// which sequence and prompt token each starts at.
pub(super) fn plan(rows: &[PrefillRow], seqs: &Sequences) -> (Vec<ScoreRequest>, Vec<Scored>) {
    let mut requests = Vec::new();
    let mut scored = Vec::new();
    for (row, r) in rows.iter().enumerate() {
        let Some(seq) = seqs.get(r.id) else {
            continue;
        };
        let Some(top) = seq.prompt_logprobs() else {
            continue;
        };
        let start = seq.cached;
        let first = seq.next_scored.max(start + 1);
        let end = (start + r.tokens + 1).min(seq.prompt_len());
        if first >= end {
            continue;
        }
        requests.push(ScoreRequest {
            row,
            from: first - 1 - start,
            targets: seq.tokens[first..end].to_vec(),
            top,
        });
        scored.push(Scored { id: r.id, first });
    }
    (requests, scored)
}

/// The step's results per sequence; each sequence's `next_scored` moves past
/// what it reported.
pub(super) fn collect(
    scored: &[Scored],
    results: Vec<Vec<TokenLogprobs>>,
    seqs: &mut Sequences,
) -> Vec<PromptLogprobs> {
    scored
        .iter()
        .zip(results)
        .map(|(s, logprobs)| {
            if let Some(seq) = seqs.get_mut(s.id) {
                seq.next_scored = s.first + logprobs.len();
            }
            PromptLogprobs {
                id: s.id,
                first: s.first,
                logprobs,
            }
        })
        .collect()
}
