//! Per-sequence state between steps and the stop rules.
//!
//! A sequence is created at admission holding the blocks of its input (the
//! cached prefix's shared blocks first), is prefilled over one or more
//! steps (`cached` counts the input tokens in the cache so far), then decodes
//! until a stop rule ends it, the caller releases it, or the caller preempts
//! it ([`Sequence::into_resumable`]: the request comes back with the tokens
//! generated so far, and a sequence admitted from it prefills
//! prompt + those tokens, then continues as if it had never left). It keeps every token
//! it has seen, so the full blocks it computed can be keyed in the prefix
//! cache when it ends (see [`super::sequences`]). The stop rules:
//! a sampled EOS (unless `ignore_eos`) finishes the sequence without emitting
//! it; so does a sampled stop token id (whatever `ignore_eos` says; EOS is
//! checked first); the token that reaches `max_new_tokens` is emitted and
//! finishes it. Stop *strings* are matched where the text is produced, in the
//! service's stream task, which cancels the sequence when one matches.

use super::token_stats::TokenStats;
use crate::kv::BlockHash;
use crate::ops::row_params::RowPenalty;
use crate::params::{SharedConstraint, TokenConstraint};
use crate::sampling::{RowSampling, SlotContents};
use crate::types::{FinishReason, ResumeState, SequenceRequest};

/// One active sequence.
#[derive(Debug)]
pub(crate) struct Sequence {
    /// Blocks it holds, in position order: its input's and next token's from
    /// admission, one more each time a decode step crosses into a new block.
    pub table: Vec<u32>,
    /// Tokens whose K/V are in the cache: during prefill, the prompt tokens
    /// computed or found cached so far; after it, the position of `last_token`.
    pub cached: usize,
    /// The prompt, then every emitted token: the input at each position.
    pub tokens: Vec<u32>,
    /// Tokens to have in the cache before it decodes: the prompt, plus what
    /// it had generated before a preemption (recomputed on resume).
    pub input_len: usize,
    /// Content keys of the leading full blocks of `tokens` computed so far
    /// (empty with prefix caching off).
    pub hashes: Vec<BlockHash>,
    /// Leading blocks of `table` already offered to the prefix cache.
    pub keyed: usize,
    /// The last sampled token, fed at the next decode step.
    pub last_token: u32,
    /// Tokens emitted so far (those before a preemption included).
    pub generated: usize,
    /// The request as admitted: length, stop rules, sampling, logprobs (its
    /// `resume` is the one it was admitted with, replaced on preemption).
    request: SequenceRequest,
    /// The tokens it has, for its penalties (empty without one).
    stats: TokenStats,
    /// Its slot of the device penalty counts, once it decodes with its
    /// penalties there (`crate::sampling::penalty_state`); given back by
    /// `super::sequences::Sequences::release`.
    pub penalty_slot: Option<u32>,
    /// Why its output constraint cannot be honoured, once that happened: the
    /// sequence ends at its next judged token ([`FinishReason::ConstraintFailed`]).
    constraint_error: Option<String>,
    /// With `prompt_logprobs`: the next prompt token whose logprob is to be
    /// reported (from 1; the first token has none).
    pub next_scored: usize,
    /// Decode steps queued for it whose token the host has not judged yet
    /// (the overlapped step loop, [`super::overlap`]): each already counts
    /// in `cached`, none yet in `tokens` or `generated`.
    pub in_flight: usize,
    /// Its row in the last queued decode step, while `in_flight > 0`: the
    /// next step feeds it that row's choice, on the device.
    pub fed_row: usize,
    /// Which admission this is (unique in the engine's life): a queued
    /// step's row belongs to this sequence only if the serials match (a
    /// sequence released and admitted again under the same id is another).
    pub serial: u64,
    /// A token its constraint already took ([`Sequence::took_ahead`]),
    /// which [`Sequence::judge`] then does not give it again.
    accepted: Option<u32>,
    /// The constraint's allowed set after that token, computed with it (off
    /// the engine thread, `super::grammar_pass`); the next sampling row takes
    /// it. Cleared by any other token the constraint takes.
    allowed_next: Option<Result<Option<Vec<u32>>, String>>,
}

/// What a constraint made of a token given to it ahead of the judging
/// ([`take_ahead`]).
#[derive(Debug)]
pub enum Ahead {
    /// It refused the token (the sequence ends at its judging).
    Refused(String),
    /// It took it; what it allows next (as [`Sequence::sampling_row`] asks).
    Allowed(Result<Option<Vec<u32>>, String>),
}

/// What the stop rules made of one sampled token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Whether the token is emitted to the client.
    pub emit: bool,
    /// Set when the sequence ends with this token.
    pub finish: Option<FinishReason>,
}

impl Sequence {
    /// A newly admitted sequence holding `table`, whose first `cached` input
    /// tokens (`keyed` blocks, found in the prefix cache) need no compute.
    /// `hashes` are the keys of the input's full blocks. A resumed request
    /// (`req.resume`) continues where it was preempted: its generated tokens
    /// follow the prompt as input and count as emitted.
    pub fn new(
        req: &SequenceRequest,
        table: Vec<u32>,
        cached: usize,
        keyed: usize,
        hashes: Vec<BlockHash>,
        serial: u64,
    ) -> Self {
        let mut tokens = req.prompt.clone();
        let (generated, scored) = match &req.resume {
            Some(r) => {
                tokens.extend_from_slice(&r.generated);
                (r.generated.len(), r.prompt_scored)
            }
            None => (0, 0),
        };
        let penalties = req.params.transforms.penalties;
        let stats = TokenStats::new(&req.prompt, &tokens[req.prompt.len()..], penalties);
        Self {
            table,
            cached,
            input_len: tokens.len(),
            last_token: if generated > 0 {
                tokens[tokens.len() - 1]
            } else {
                0
            },
            tokens,
            hashes,
            keyed,
            generated,
            stats,
            penalty_slot: None,
            request: req.clone(),
            constraint_error: None,
            next_scored: scored + 1,
            in_flight: 0,
            fed_row: 0,
            serial,
            accepted: None,
            allowed_next: None,
        }
    }

    /// What resuming this sequence by recompute needs: its request with the
    /// tokens it emitted so far.
    pub fn into_resumable(self) -> SequenceRequest {
        let prompt_len = self.request.prompt.len();
        let mut req = self.request;
        req.resume = Some(ResumeState {
            generated: self.tokens[prompt_len..].to_vec(),
            prompt_scored: self.next_scored - 1,
        });
        req
    }

    /// Top-n of the prompt logprobs it asked for (`None`: not asked).
    pub fn prompt_logprobs(&self) -> Option<usize> {
        self.request.params.outputs.prompt_logprobs
    }

    /// The prompt's length.
    pub fn prompt_len(&self) -> usize {
        self.request.prompt.len()
    }

    /// Whether its prompt, once computed, is followed by a sampled token
    /// (not for a request that only scores its prompt: `max_new_tokens` 0).
    pub fn samples(&self) -> bool {
        self.request.params.stop.max_new_tokens > 0
    }

    /// Input tokens still to compute (0 once the prompt, and on resume the
    /// tokens generated before the preemption, are in the cache).
    pub fn prompt_remaining(&self) -> usize {
        self.input_len.saturating_sub(self.cached)
    }

    /// Whether the sequence decodes: its prompt is in the cache and it has
    /// sampled its first token (its last prefill chunk did that).
    pub fn is_decoding(&self) -> bool {
        self.prompt_remaining() == 0
    }

    /// How this sequence picks its next token: its sampling row for the
    /// step (its draw keyed by its seed and the position it samples at,
    /// which is the same whatever the batch and after a preemption), with the
    /// logit edits of its options: bias and penalties, the stop tokens
    /// banned before `min_tokens` (EOS too unless it ignores EOS), its
    /// constraint's allowed set. A constraint that fails, or allows no token
    /// of the model's `vocab_size`, is recorded: [`Sequence::judge`] then
    /// ends the sequence with [`FinishReason::ConstraintFailed`] whatever
    /// the step samples.
    pub fn sampling_row(&mut self, eos_token_id: u32, vocab_size: usize) -> RowSampling {
        let params = &self.request.params;
        let t = &params.transforms;
        // Penalties and bias applied from a device slot are not host edits.
        let penalty = self.penalty_slot.map(|slot| RowPenalty {
            slot,
            repetition: t.penalties.repetition,
            frequency: t.penalties.frequency,
            presence: t.penalties.presence,
            bias: !t.logit_bias.is_empty(),
        });
        let edits = match penalty.is_none() && t.any() {
            true => self.stats.edits(t.penalties, &t.logit_bias),
            false => Vec::new(),
        };
        let stop = &params.stop;
        let mut banned = Vec::new();
        // Tokens of queued steps count: each is one more token (a sequence
        // they end is never sampled again).
        if self.generated + self.in_flight < stop.min_tokens {
            banned.extend_from_slice(&stop.stop_token_ids);
            if !stop.ignore_eos {
                banned.push(eos_token_id);
            }
        }
        let allowed = match self.allowed_next.take().or_else(|| {
            params
                .constraint
                .as_ref()
                .map(|c| allowed_tokens(c, vocab_size))
        }) {
            Some(Err(err)) => {
                tracing::warn!(%err, "the output constraint cannot be honoured; the sequence ends");
                self.constraint_error = Some(err);
                None
            }
            Some(Ok(allowed)) => allowed,
            None => None,
        };
        RowSampling {
            params: params.sampling,
            pos: (self.tokens.len() + self.in_flight) as u32,
            logprobs: params.outputs.logprobs,
            edits,
            banned,
            allowed,
            penalty,
        }
    }

    /// Whether it has an output constraint (structured output).
    pub fn has_constraint(&self) -> bool {
        self.request.params.constraint.is_some()
    }

    /// Whether its next sampling row needs the counts of every token it has
    /// chosen on the host: penalties not (yet) on the device (host edits
    /// from its counts, or a device slot still to be written from them). A
    /// queued step must then be judged before its next step is planned.
    pub fn needs_host_counts(&self) -> bool {
        self.request.params.transforms.penalties.any() && self.penalty_slot.is_none()
    }

    /// Whether it asks for the logprobs of its sampled tokens.
    pub fn wants_logprobs(&self) -> bool {
        self.request.params.outputs.logprobs.is_some()
    }

    /// Whether the steps queued for it already reach its `max_new_tokens`:
    /// it must not be planned again (the last one ends it).
    pub fn budget_queued(&self) -> bool {
        self.in_flight > 0
            && self.generated + self.in_flight >= self.request.params.stop.max_new_tokens
    }

    /// Whether its penalties and logit bias may live on the device (a slot
    /// of `crate::sampling::penalty_state`): it has either.
    pub fn wants_device_slot(&self) -> bool {
        let t = &self.request.params.transforms;
        t.penalties.any() || !t.logit_bias.is_empty()
    }

    /// What its device slot holds: the tokens it has (`(token, output count,
    /// whether the prompt has it)`) and its logit bias.
    pub fn slot_row(&self) -> SlotContents {
        SlotContents {
            tokens: self.stats.entries(),
            bias: self.request.params.transforms.logit_bias.clone(),
        }
    }

    /// Its constraint, if a token is to be given to it ahead of
    /// [`Sequence::judge`] (it has one that has not failed): the engine gives
    /// many rows theirs in parallel, off its thread ([`take_ahead`]), the
    /// grammar's share of a step.
    pub fn grammar_job(&self) -> Option<SharedConstraint> {
        self.request
            .params
            .constraint
            .clone()
            .filter(|_| self.constraint_error.is_none())
    }

    /// Records what its constraint made of `token` ([`take_ahead`] on
    /// [`Sequence::grammar_job`]'s constraint): [`Sequence::judge`] then does
    /// not give it the token again, and its next sampling row takes the
    /// allowed set computed with it.
    pub fn took_ahead(&mut self, token: u32, ahead: Ahead) {
        self.accepted = Some(token);
        match ahead {
            Ahead::Refused(err) => {
                tracing::warn!(%err, token, "the output constraint refused the sampled token; the sequence ends");
                self.constraint_error = Some(err);
                self.allowed_next = None;
            }
            Ahead::Allowed(allowed) => self.allowed_next = Some(allowed),
        }
    }

    /// Gives `token` to its constraint (if any); a refusal is recorded and
    /// ends the sequence at [`Sequence::judge`].
    fn accept(&mut self, token: u32) {
        self.allowed_next = None;
        let Some(c) = &self.request.params.constraint else {
            return;
        };
        let mut c = c.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(err) = c.accept(token) {
            tracing::warn!(%err, token, "the output constraint refused the sampled token; the sequence ends");
            self.constraint_error = Some(err);
        }
    }

    /// Applies the stop rules to `token` and records it as the next input
    /// (and in the sequence's penalties and constraint).
    pub fn judge(&mut self, token: u32, eos_token_id: u32) -> Verdict {
        let failed = Verdict {
            emit: false,
            finish: Some(FinishReason::ConstraintFailed),
        };
        if self.constraint_error.is_some() {
            return failed;
        }
        if self.accepted.take() != Some(token) {
            self.accept(token);
            if self.constraint_error.is_some() {
                return failed;
            }
        }
        let stop = &self.request.params.stop;
        let finish = if token == eos_token_id && !stop.ignore_eos {
            Some(FinishReason::Eos)
        } else if stop.stop_token_ids.contains(&token) {
            Some(FinishReason::StopToken(token))
        } else {
            None
        };
        if finish.is_some() {
            return Verdict {
                emit: false,
                finish,
            };
        }
        self.last_token = token;
        self.tokens.push(token);
        self.generated += 1;
        if self.request.params.transforms.penalties.any() {
            self.stats.record_output(token);
        }
        let max = self.request.params.stop.max_new_tokens;
        Verdict {
            emit: true,
            finish: (self.generated >= max).then_some(FinishReason::Length),
        }
    }
}

/// The tokens `constraint` allows next, below `vocab_size` (the model's
/// embedding rows: a token past them can never be sampled); an error when it
/// fails or allows none of them.
fn allowed_tokens(
    constraint: &SharedConstraint,
    vocab_size: usize,
) -> Result<Option<Vec<u32>>, String> {
    let mut c = constraint
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    allowed_of(&mut *c, vocab_size)
}

/// [`allowed_tokens`] of a constraint already locked.
fn allowed_of(c: &mut dyn TokenConstraint, vocab_size: usize) -> Result<Option<Vec<u32>>, String> {
    let Some(mut bits) = c.allowed()? else {
        return Ok(None);
    };
    bits.resize(vocab_size.div_ceil(32), 0);
    if let Some(last) = bits.last_mut().filter(|_| !vocab_size.is_multiple_of(32)) {
        *last &= (1u32 << (vocab_size % 32)) - 1;
    }
    if bits.iter().all(|&w| w == 0) {
        return Err(format!(
            "it allows no token the model can emit (its vocabulary has {vocab_size})"
        ));
    }
    Ok(Some(bits))
}

/// Gives `token` to `constraint` and, if it takes it, computes what it
/// allows next over `vocab_size` tokens: one row's grammar work, run on
/// any thread (`super::grammar_pass`), recorded by [`Sequence::took_ahead`].
pub fn take_ahead(constraint: &SharedConstraint, token: u32, vocab_size: usize) -> Ahead {
    let mut c = constraint
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match c.accept(token) {
        Err(err) => Ahead::Refused(err),
        Ok(()) => Ahead::Allowed(allowed_of(&mut *c, vocab_size)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(max_new_tokens: usize, ignore_eos: bool) -> Sequence {
        seq_stopping_at(max_new_tokens, ignore_eos, &[])
    }

    fn seq_stopping_at(max_new_tokens: usize, ignore_eos: bool, stops: &[u32]) -> Sequence {
        let mut req = SequenceRequest::greedy(1, vec![1, 2, 3], max_new_tokens);
        req.params.stop.ignore_eos = ignore_eos;
        req.params.stop.stop_token_ids = stops.to_vec();
        let mut s = Sequence::new(&req, vec![0], 0, 0, Vec::new(), 0);
        s.cached = 3;
        s
    }

    #[test]
    fn a_stop_token_finishes_without_emitting_even_with_ignore_eos() {
        let mut s = seq_stopping_at(8, true, &[7, 11]);
        assert_eq!(s.judge(5, 9).finish, None);
        let v = s.judge(11, 9);
        assert_eq!(
            (v.emit, v.finish),
            (false, Some(FinishReason::StopToken(11)))
        );
        assert_eq!((s.last_token, s.generated), (5, 1));
        // EOS is judged first when it is also a stop token.
        let mut s = seq_stopping_at(8, false, &[9]);
        assert_eq!(s.judge(9, 9).finish, Some(FinishReason::Eos));
        // A stop token on the last budgeted step still wins over LENGTH.
        let mut s = seq_stopping_at(1, true, &[4]);
        assert_eq!(s.judge(4, 9).finish, Some(FinishReason::StopToken(4)));
    }

    #[test]
    fn eos_finishes_without_emitting_unless_ignored() {
        let mut s = seq(4, false);
        let v = s.judge(9, 9);
        assert_eq!((v.emit, v.finish), (false, Some(FinishReason::Eos)));
        assert_eq!(s.generated, 0);
        let mut s = seq(4, true);
        assert_eq!(
            s.judge(9, 9),
            Verdict {
                emit: true,
                finish: None
            }
        );
        assert_eq!((s.last_token, s.generated, s.cached), (9, 1, 3));
    }

    #[test]
    fn the_last_budgeted_token_is_emitted_and_finishes() {
        let mut s = seq(2, false);
        assert_eq!(s.judge(5, 9).finish, None);
        assert_eq!(
            s.judge(6, 9),
            Verdict {
                emit: true,
                finish: Some(FinishReason::Length)
            }
        );
    }
}
