//! A decode step, synchronous or overlapped with the next one.
//!
//! [`Engine::decode`] runs a step and judges its tokens before it returns:
//! the host plans, the GPU runs, the host waits, reads the ids back and
//! applies the stop rules, while the GPU idles.
//!
//! [`Engine::decode_async`] is the overlapped step loop (SGLang's overlap
//! scheduler, vLLM's async scheduling): it queues step N+1 *before* it
//! waits for step N, so the host's share of a step (planning, writing the
//! inputs, judging tokens, the scheduler's streaming) runs while the GPU
//! computes. What makes that possible:
//!
//! - **The next step needs no token value.** A row whose previous token is
//!   still on the device is fed [`Feed::Previous`]: the step reads it from
//!   the last queued step's choice, which the runner keeps on the device
//!   (`crate::step::runner::launch`). Everything else a row's plan needs is
//!   known: its position (`cached` counts queued steps), its draw's key (the
//!   position sampled, `tokens.len() + in_flight`), `min_tokens` (each
//!   queued step is one more token), its device penalty counts (the graph
//!   adds each choice).
//! - **Lengths are planned exactly.** A sequence whose queued steps reach
//!   its `max_new_tokens` is not planned again
//!   ([`Sequences::decoding_ids`](super::sequences::Sequences::decoding_ids)).
//! - **A stop found one step late costs one wasted row, never a token.** A
//!   row whose step-N token is EOS, a stop token id, or a constraint failure
//!   was already queued in N+1: judging N releases it (its K/V positions of
//!   N+1 rolled back, [`Sequences::release`](super::sequences::Sequences::release)),
//!   and N+1's token for it is dropped when N+1 is judged, because the
//!   sequence is gone or is another admission (`Sequence::serial`). Stop
//!   strings are matched by the service as before: a cancel arrives a step
//!   later, and nothing past the stop reaches a client.
//! - **A grammar's allowed set follows the tokens.** A step with a
//!   constrained row still in flight is queued in two halves
//!   ([`Engine::decode_async_split`]): its forward pass and the queued
//!   step's grammar work (the constraints take their tokens and compute the
//!   next allowed sets on the pool, `super::grammar_pass`), then the queued
//!   step is judged and the choice queued (one graph launch where the
//!   bucket has a choice graph, `crate::step::choice_graph`). The host's
//!   mask work hides behind the forward pass (and, with many grammar rows,
//!   behind its queueing too).
//! - **Some rows need every token on the host first**
//!   (`Sequence::needs_host_counts`: penalties kept as host edits, when the
//!   device has no slot for them) and logprobs are read with the ids: a
//!   step with such a row still in flight, or asking for logprobs, waits for
//!   the queued step first and then runs synchronously.
//!
//! Releasing or preempting a sequence with a queued step is safe at any
//! time: its queued K/V writes land in blocks that, on the same stream,
//! every later step that could reuse them follows. A preempted sequence's
//! queued token is dropped and recomputed on resume; the scheduler judges
//! queued steps before it preempts ([`Engine::flush`]) so the client keeps
//! every token it was going to see.

use std::collections::HashSet;

use super::grammar_pass::GrammarPass;
use super::pending::PendingStep;
use super::sequences::Sequences;
use super::Engine;
use crate::error::EngineError;
use crate::ops::PendingIds;
use crate::step::buffers::Feed;
use crate::step::DecodeRow;
use crate::types::{SeqId, StepOutput};

impl Engine {
    /// One batched decode step for exactly these decoding sequences (each at
    /// its own position, at most `max_batch`): takes a block for each that
    /// starts one ([`Engine::blocks_to_grow`]; all or nothing:
    /// [`EngineError::OutOfBlocks`] leaves the engine unchanged), feeds each
    /// one's last sampled token, samples the next, and judges it. A step
    /// still queued by [`Engine::decode_async`] is judged first (its output
    /// comes first; sequences it ends leave `ids`).
    pub fn decode(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        let mut out = self.flush()?;
        let ids: Vec<SeqId> = ids
            .iter()
            .copied()
            .filter(|id| !out.finished.iter().any(|f| f.id == *id))
            .collect();
        if ids.is_empty() {
            return Ok(out);
        }
        self.check_decode(&ids)?;
        // Before anything is drawn or computed: on OutOfBlocks nothing changed.
        self.seqs.grow(&ids)?;
        let started = std::time::Instant::now();
        self.place_penalties(&ids);
        let table = self.sampling_table(&ids);
        // The host's share of options (`RUST_LOG=ember_engine::engine=trace`).
        tracing::trace!(
            rows = ids.len(),
            changes_logits = table.any_changes_logits(),
            table_us = started.elapsed().as_micros() as u64,
            "decode step sampling table built"
        );
        let rows = decode_rows(&self.seqs, &ids);
        let (tokens, mut lps) = self.runner.decode(&rows, &table)?;
        for (i, (&id, token)) in ids.iter().zip(tokens).enumerate() {
            let Some(seq) = self.seqs.get_mut(id) else {
                continue;
            };
            seq.cached += 1;
            let lp = lps.get_mut(i).and_then(Option::take);
            self.judge_and_record(id, token, lp, &mut out);
        }
        Ok(out)
    }

    /// The overlapped decode step (module docs): queues a step over `ids`
    /// (as [`Engine::decode`] would run it), then judges the step queued by
    /// the previous call and returns its output; the new step's output
    /// comes from the next call (or [`Engine::flush`]). A step that must see
    /// every token first runs synchronously, after the queued one: the
    /// output then holds both. Sequences the previous step ended may be in
    /// `ids` (planned before their end was known): their row computes
    /// nothing anyone reads. Empty `ids` only judge the queued step.
    pub fn decode_async(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        if ids.is_empty() {
            return self.flush();
        }
        self.check_decode(ids)?;
        if self.must_wait(ids) {
            return self.decode(ids);
        }
        if self.masked_in_flight(ids) > 0 {
            return self.decode_async_split(ids);
        }
        let started = std::time::Instant::now();
        self.seqs.grow(ids)?;
        self.place_penalties(ids);
        let table = self.sampling_table(ids);
        let tabled = started.elapsed();
        let rows = decode_rows(&self.seqs, ids);
        let queued = self.runner.decode_launch(&rows, &table)?;
        let planned = self.planned(ids);
        let previous = self.pending.take();
        self.queue(planned, queued);
        let launched = started.elapsed();
        let out = match previous {
            Some(previous) => self.judge_step(previous),
            None => Ok(StepOutput::default()),
        };
        // The host's share of an overlapped step (`RUST_LOG=ember_engine::engine=trace`).
        tracing::trace!(
            rows = ids.len(),
            table_us = tabled.as_micros() as u64,
            launch_us = (launched - tabled).as_micros() as u64,
            judge_us = (started.elapsed() - launched).as_micros() as u64,
            "decode step queued"
        );
        out
    }

    /// Judges the queued decode step, if any (waiting for its ids), and
    /// returns its output.
    pub fn flush(&mut self) -> Result<StepOutput, EngineError> {
        match self.pending.take() {
            Some(step) => self.judge_step(step),
            None => Ok(StepOutput::default()),
        }
    }

    /// Whether a decode step is queued and not yet judged.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Checks a decode step's ids: at most `max_batch`, each decoding, none
    /// twice.
    fn check_decode(&self, ids: &[SeqId]) -> Result<(), EngineError> {
        let max_batch = self.runner.shape().max_batch;
        if ids.len() > max_batch {
            return Err(EngineError::InvalidRequest(format!(
                "decode batch of {} exceeds max_batch {max_batch}",
                ids.len()
            )));
        }
        let mut seen = HashSet::with_capacity(ids.len());
        for &id in ids {
            self.seqs.decoding(id)?;
            if !seen.insert(id) {
                return Err(EngineError::InvalidRequest(format!(
                    "sequence {id} listed twice in one decode step"
                )));
            }
        }
        Ok(())
    }

    /// Whether a step over `ids` must wait for the queued one (module docs):
    /// a row asks for logprobs, or a row still in flight has penalties that
    /// need its tokens on the host.
    fn must_wait(&self, ids: &[SeqId]) -> bool {
        ids.iter()
            .filter_map(|&id| self.seqs.get(id))
            .any(|s| s.wants_logprobs() || (s.in_flight > 0 && s.needs_host_counts()))
    }

    /// The rows of `ids` with a grammar and a step still queued: their
    /// allowed sets follow that step's tokens, so a step with any is queued
    /// in two halves ([`Engine::decode_async_split`]).
    fn masked_in_flight(&self, ids: &[SeqId]) -> usize {
        ids.iter()
            .filter_map(|&id| self.seqs.get(id))
            .filter(|s| s.in_flight > 0 && s.has_constraint())
            .count()
    }

    /// Each of `ids` still admitted, with its admission's serial: a queued
    /// step's rows as [`PendingStep::rows`] records them.
    fn planned(&self, ids: &[SeqId]) -> Vec<(SeqId, u64)> {
        ids.iter()
            .filter_map(|&id| self.seqs.get(id).map(|s| (id, s.serial)))
            .collect()
    }

    /// [`Engine::decode_async`] for a step whose grammar rows wait for the
    /// queued step's tokens (vLLM's bitmask filled beside the forward). Two
    /// orders, by where the time goes:
    ///
    /// - few grammar rows (the GPU is the bottleneck): this step's forward
    ///   pass is queued first, behind the queued step still running, then
    ///   the queued step's ids are waited for and its grammar work starts on
    ///   the pool ([`GrammarPass`]) while its other rows are judged;
    /// - many (at least half as many as the pool has threads: the masks are
    ///   the bottleneck): the ids first (the queued step's choice, queued
    ///   last, is short), its grammar work started, and this step's forward
    ///   queued while the pool computes the masks.
    ///
    /// Then the queued step is judged, the sampling table built (a row whose
    /// sequence that judging ended samples as a greedy row nobody reads) and
    /// the choice queued.
    fn decode_async_split(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        self.seqs.grow(ids)?;
        self.place_penalties(ids);
        let planned = self.planned(ids);
        let masked = self.masked_in_flight(ids);
        let masks_first = masked * 2 >= rayon::current_num_threads();
        let started = std::time::Instant::now();
        let mut half = None;
        if !masks_first {
            half = Some(
                self.runner
                    .decode_forward_queued(&decode_rows(&self.seqs, ids)),
            );
        }
        let (previous, tokens) = match self.pending.take() {
            Some(step) => (step.rows, step.ids.wait().map_err(EngineError::Device)?),
            None => (Vec::new(), Vec::new()),
        };
        let grammar = self.start_grammar(&previous, &tokens);
        let half = match half {
            Some(half) => half,
            None => self
                .runner
                .decode_forward_queued(&decode_rows(&self.seqs, ids)),
        };
        let queued_at = started.elapsed();
        let out = self.judge_tokens(&previous, tokens, grammar);
        let judged_at = started.elapsed();
        let table = self.sampling_table(ids);
        let planned_at = started.elapsed();
        let queued = self.runner.decode_choose(half, ids.len(), &table)?;
        // Where the host's time goes beside the forward
        // (`RUST_LOG=ember_engine::engine=trace`).
        tracing::trace!(
            rows = ids.len(),
            masked,
            masks_first,
            forward_and_wait_us = queued_at.as_micros() as u64,
            judged_us = (judged_at - queued_at).as_micros() as u64,
            table_us = (planned_at - judged_at).as_micros() as u64,
            choice_queued_us = (started.elapsed() - planned_at).as_micros() as u64,
            "decode step queued in halves"
        );
        self.queue(planned, queued);
        Ok(out)
    }

    /// Starts the grammar work of a queued step's rows (`rows`, whose ids
    /// are `tokens`) that have a constraint: each still the admission it
    /// was planned for, with the step in flight ([`GrammarPass`]).
    fn start_grammar(&self, rows: &[(SeqId, u64)], tokens: &[u32]) -> Option<GrammarPass> {
        let jobs: Vec<_> = rows
            .iter()
            .zip(tokens)
            .filter_map(|(&(id, serial), &token)| {
                let seq = self.seqs.get(id)?;
                let live = seq.serial == serial && seq.in_flight > 0;
                live.then(|| seq.grammar_job())
                    .flatten()
                    .map(|c| (id, c, token))
            })
            .collect();
        GrammarPass::start(jobs, self.runner.model_config().vocab_size)
    }

    /// Records a queued step: each planned row whose sequence is still that
    /// admission is in flight (its position taken, its next row fed this
    /// step's choice).
    fn queue(&mut self, planned: Vec<(SeqId, u64)>, ids: PendingIds) {
        for (row, &(id, serial)) in planned.iter().enumerate() {
            if let Some(seq) = self.seqs.get_mut(id).filter(|s| s.serial == serial) {
                seq.cached += 1;
                seq.in_flight += 1;
                seq.fed_row = row;
            }
        }
        self.pending = Some(PendingStep { rows: planned, ids });
    }

    /// Waits for a queued step's ids and judges each row that still
    /// belongs to the sequence it was planned for.
    fn judge_step(&mut self, step: PendingStep) -> Result<StepOutput, EngineError> {
        let tokens = step.ids.wait().map_err(EngineError::Device)?;
        let grammar = self.start_grammar(&step.rows, &tokens);
        Ok(self.judge_tokens(&step.rows, tokens, grammar))
    }

    /// Judges a queued step's `tokens` (its `rows`), the grammar's share
    /// first (`grammar`'s results recorded on their sequences).
    fn judge_tokens(
        &mut self,
        rows: &[(SeqId, u64)],
        tokens: Vec<u32>,
        grammar: Option<GrammarPass>,
    ) -> StepOutput {
        for (id, token, ahead) in grammar.map(GrammarPass::finish).unwrap_or_default() {
            if let Some(seq) = self.seqs.get_mut(id) {
                seq.took_ahead(token, ahead);
            }
        }
        let mut out = StepOutput::default();
        for (&(id, serial), token) in rows.iter().zip(tokens) {
            match self.seqs.get_mut(id) {
                Some(seq) if seq.serial == serial && seq.in_flight > 0 => seq.in_flight -= 1,
                _ => continue,
            }
            self.judge_and_record(id, token, None, &mut out);
        }
        out
    }
}

/// Each of `ids`' decode row: its last token (or, with a step still queued
/// for it, that step's choice on the device), at its position, with its
/// block table.
pub(super) fn decode_rows<'a>(seqs: &'a Sequences, ids: &[SeqId]) -> Vec<DecodeRow<'a>> {
    ids.iter()
        .filter_map(|&id| seqs.get(id))
        .map(|s| DecodeRow {
            token: match s.in_flight {
                0 => Feed::Token(s.last_token),
                _ => Feed::Previous(s.fed_row),
            },
            pos: s.cached,
            table: &s.table,
        })
        .collect()
}
