//! [`Engine`]: runs many GPT-2 sequences at once over a paged KV cache.
//!
//! It is two halves with one owner each:
//! - [`Sequences`] (host): every admitted sequence, its block table, its
//!   tokens and stop rules, and the block pool with the prefix cache;
//! - [`StepRunner`] (device): the model, the K/V storage, the decode
//!   buffers and graphs; it turns a step's rows into sampled ids.
//!
//! Each step (prefill or decode) is one batched forward pass, one sampling
//! pass and one device->host read of the chosen ids (plus, only when some
//! row asked for logprobs, one more read). A finished sequence's blocks are
//! freed inside the step (stop rules: [`sequence`]).
//!
//! Admission takes the blocks of a sequence's input and next token (cached
//! prefix blocks included, shared); each decode step takes a block for each
//! sequence that crosses into a new one ([`Engine::blocks_to_grow`]), so a
//! sequence holds what it has computed, not its whole budget. Running out is
//! an ordinary [`EngineError::OutOfBlocks`]: admission waits, and the
//! scheduler frees blocks for a decode step by preempting. [`Engine::preempt`] is the seam for
//! preemption by recompute: it frees a sequence's blocks and hands back its
//! request with what resuming it needs (the engine keeps all KV
//! bookkeeping; the scheduler owns the policy: whom, when). Long prompts are prefilled in
//! chunks ([`prefill`]): a sequence decodes once its whole prompt is in the
//! cache.
//!
//! Layout: [`config`] (what an engine is built from), [`kv_sizing`] and
//! [`startup`] (the cache sized to the device, the runner built),
//! [`sequences`] and
//! [`sequence`] (host state), [`prefill`] (planning a prefill step),
//! [`decode`] (a decode step, synchronous or overlapped with the next;
//! [`pending`], the step it keeps queued),
//! [`warmup`] (every step shape before SERVING), [`impl_step_engine`] (the
//! [`crate::StepEngine`] trait the scheduler drives).

pub mod config;
mod decode;
mod grammar_pass;
mod impl_step_engine;
pub mod kv_sizing;
mod pending;
mod prefill;
pub mod prefill_probe;
mod prompt_scoring;
mod sequence;
mod sequences;
mod startup;
mod token_stats;
mod tools;
mod warm_requests;
pub mod warmup;

#[cfg(test)]
mod control_tests;
#[cfg(test)]
mod logit_controls_tests;
#[cfg(test)]
mod overlap_tests;
#[cfg(test)]
mod preempt_tests;
#[cfg(test)]
mod prefill_tests;
#[cfg(test)]
mod tests;

use std::collections::HashSet;

use rayon::prelude::*;

use crate::device::EngineDevice;
use crate::error::EngineError;
use crate::limits::RequestLimits;
use crate::model::Gpt2Config;
use crate::sampling::{RowSampling, SamplingTable};
use crate::step::StepRunner;
use crate::types::*;
use config::EngineConfig;
use sequence::{Sequence, Verdict};
use sequences::Sequences;
use warmup::WarmupReport;

/// Runs many GPT-2 sequences at once over a paged KV cache (see the module
/// docs).
pub struct Engine {
    /// The device half: model, K/V storage, buffers, graphs.
    runner: StepRunner,
    /// The host half: every admitted sequence and the block pool.
    seqs: Sequences,
    /// Token that ends a sequence (unless `ignore_eos`): the model's.
    eos_token_id: u32,
    /// Capture decode and small prefill graphs at warmup: [`EngineConfig::cuda_graphs`] where
    /// shapes are bucketed.
    cuda_graphs: bool,
    /// The decode step queued and not yet judged (the overlapped step loop,
    /// [`decode`]).
    pending: Option<pending::PendingStep>,
}

impl Engine {
    /// Loads the model `config` names onto `device`, sizes and allocates the
    /// KV cache ([`startup`]).
    pub fn new(config: &EngineConfig, device: &EngineDevice) -> Result<Self, EngineError> {
        let (runner, num_blocks) = startup::runner(config, device)?;
        let bucketed = runner.shape().bucketed;
        Ok(Self {
            eos_token_id: runner.model_config().eos_token_id,
            runner,
            seqs: Sequences::new(num_blocks, config.block_size, config.prefix_caching),
            // Graphs pay off only where launches cost: bucketed shapes (CUDA).
            cuda_graphs: config.cuda_graphs && bucketed,
            pending: None,
        })
    }

    pub fn model_config(&self) -> &Gpt2Config {
        self.runner.model_config()
    }

    pub fn block_size(&self) -> usize {
        self.runner.shape().block_size
    }

    /// Blocks reserved when a request is admitted:
    /// `ceil((prompt + max_new_tokens) / block_size)`.
    pub fn blocks_required(&self, prompt_len: usize, max_new_tokens: usize) -> usize {
        self.limits().blocks_required(prompt_len, max_new_tokens)
    }

    pub fn kv_blocks_total(&self) -> usize {
        self.seqs.blocks().total()
    }

    /// Blocks admission can count on: empty ones and cached ones no sequence
    /// holds (evicted when needed).
    pub fn kv_blocks_free(&self) -> usize {
        self.seqs.blocks().free()
    }

    /// Blocks held by at least one sequence.
    pub fn kv_blocks_used(&self) -> usize {
        self.seqs.blocks().used()
    }

    /// Blocks whose content the prefix cache can reuse (held or not).
    pub fn kv_blocks_cached(&self) -> usize {
        self.seqs.blocks().cached()
    }

    pub fn prefix_caching(&self) -> bool {
        self.seqs.blocks().prefix_caching()
    }

    /// Sequences admitted and not yet finished or released.
    pub fn num_active(&self) -> usize {
        self.seqs.len()
    }

    /// Whether `id` is active (prefilling or decoding).
    pub fn contains(&self, id: SeqId) -> bool {
        self.seqs.contains(id)
    }

    /// Decode buckets with a captured graph.
    pub fn captured_graphs(&self) -> usize {
        self.runner.captured_buckets()
    }

    /// Prefill shapes with a captured step (the small ones).
    pub fn captured_prefill_graphs(&self) -> usize {
        self.runner.captured_prefill_shapes()
    }

    /// What a request must fit into.
    pub fn limits(&self) -> RequestLimits {
        let config = self.runner.model_config();
        RequestLimits {
            vocab_size: config.vocab_size,
            context: config.n_positions,
            block_size: self.block_size(),
            kv_blocks_total: self.kv_blocks_total(),
        }
    }

    /// Checks a request against the model's limits (not against free
    /// blocks): its parameters ([`crate::GenerationParams::validate`]) and
    /// its prompt with its budget ([`RequestLimits::check`]).
    pub fn validate(&self, req: &SequenceRequest) -> Result<(), EngineError> {
        let limits = self.limits();
        let params = crate::params::ParamLimits {
            vocab_size: limits.vocab_size,
            max_new_tokens: usize::MAX,
        };
        req.params
            .validate(&params)
            .and_then(|()| limits.check(&req.prompt, req.params.stop.max_new_tokens))
            .map_err(|v| {
                let field = v.field.name("prompt");
                EngineError::InvalidRequest(format!("sequence {}: {field} {}", req.id, v.message))
            })
    }

    /// What admitting `req` would take now (for the scheduler's plan;
    /// [`Engine::admit`] takes exactly this if nothing changes in between).
    pub fn admission_cost(&self, req: &SequenceRequest) -> AdmissionCost {
        self.seqs.admission_cost(req, self.blocks_to_admit(req))
    }

    /// Admits a sequence: takes the blocks of its input and next token (the
    /// cached prefix first; decode steps take more as it grows) and returns
    /// how many input tokens were found cached. Nothing is computed until
    /// [`Engine::prefill_step`]. On any error the engine is unchanged
    /// ([`EngineError::OutOfBlocks`]: keep the request waiting).
    pub fn admit(&mut self, req: &SequenceRequest) -> Result<usize, EngineError> {
        self.validate(req)?;
        let blocks = self.blocks_to_admit(req);
        self.seqs.admit(req, blocks)
    }

    /// Blocks admitting `req` takes (cached ones included).
    fn blocks_to_admit(&self, req: &SequenceRequest) -> usize {
        self.limits().blocks_to_admit(
            req.input_len(),
            req.prompt.len(),
            req.params.stop.max_new_tokens,
        )
    }

    /// Fresh blocks a decode step over `ids` takes: one for each sequence
    /// whose next position starts a block. The scheduler frees that many
    /// (by preempting) before it runs the step.
    pub fn blocks_to_grow(&self, ids: &[SeqId]) -> usize {
        self.seqs.blocks_to_grow(ids)
    }

    /// Prompt tokens still to compute for an admitted sequence; None once it
    /// decodes (or if unknown).
    pub fn prompt_remaining(&self, id: SeqId) -> Option<usize> {
        self.seqs
            .get(id)
            .filter(|s| !s.is_decoding())
            .map(Sequence::prompt_remaining)
    }

    /// Sequences still prefilling, in admission order, with the prompt
    /// tokens each has left.
    pub fn to_prefill(&self) -> Vec<(SeqId, usize)> {
        self.seqs.to_prefill().collect()
    }

    /// Decoding sequences, in admission order.
    pub fn decoding(&self) -> Vec<SeqId> {
        self.seqs.decoding_ids().collect()
    }

    /// One batched prefill step: for each chunk, computes the next tokens of
    /// its sequence's prompt over everything before them. Sequences whose
    /// prompt this completes sample their first token (and may finish at
    /// once). On an error no sequence advances.
    pub fn prefill_step(&mut self, chunks: &[PrefillChunk]) -> Result<StepOutput, EngineError> {
        if chunks.is_empty() {
            return Ok(StepOutput::default());
        }
        let started = std::time::Instant::now();
        let rows = prefill::plan(chunks, &self.seqs)?;
        let sampled = rows.iter().filter(|r| r.samples).count();
        let sampled_ids: Vec<SeqId> = rows[..sampled].iter().map(|r| r.id).collect();
        let table = self.sampling_table(&sampled_ids);
        let (score_requests, scored) = prompt_scoring::plan(&rows, &self.seqs);
        let views = prefill::views(&rows, &self.seqs);
        let planned = started.elapsed();
        let ((tokens, mut lps), scores) = self.runner.prefill(&views, &table, &score_requests)?;
        let ran = started.elapsed();

        let mut out = StepOutput {
            prompt_logprobs: prompt_scoring::collect(&scored, scores, &mut self.seqs),
            ..StepOutput::default()
        };
        for (i, row) in rows.iter().enumerate() {
            let Some(seq) = self.seqs.get_mut(row.id) else {
                continue;
            };
            seq.cached += row.tokens;
            self.seqs.key_full_blocks(row.id);
            if let (true, Some(&token)) = (row.samples, tokens.get(i)) {
                let lp = lps.get_mut(i).and_then(Option::take);
                self.judge_and_record(row.id, token, lp, &mut out);
            } else if row.completes {
                // Its prompt scored, nothing to generate (max_new_tokens 0).
                self.seqs.release(row.id);
                out.finished.push(FinishedSeq {
                    id: row.id,
                    reason: FinishReason::Length,
                    generated: 0,
                });
            }
        }
        // The host's share of a prefill step (`RUST_LOG=ember_engine::engine=trace`).
        tracing::trace!(
            rows = rows.len(),
            plan_us = planned.as_micros() as u64,
            run_us = (ran - planned).as_micros() as u64,
            judge_us = (started.elapsed() - ran).as_micros() as u64,
            "prefill step"
        );
        Ok(out)
    }

    /// Batched prefill of new sequences, whole prompts in one step (different
    /// lengths, cached prefixes reused); samples each one's first token.
    /// All-or-nothing: any error leaves the engine unchanged.
    pub fn prefill(&mut self, reqs: Vec<SequenceRequest>) -> Result<StepOutput, EngineError> {
        let mut ids = HashSet::with_capacity(reqs.len());
        for req in &reqs {
            self.validate(req)?;
            if self.contains(req.id) || !ids.insert(req.id) {
                return Err(EngineError::DuplicateSequence(req.id));
            }
        }
        // Sharing between the new requests is not counted: an upper bound.
        let needed: usize = reqs.iter().map(|r| self.admission_cost(r).blocks).sum();
        let free = self.kv_blocks_free();
        if needed > free {
            return Err(EngineError::OutOfBlocks { needed, free });
        }
        let mut chunks = Vec::with_capacity(reqs.len());
        for req in &reqs {
            if let Err(e) = self.admit(req) {
                self.abandon(&chunks);
                return Err(e);
            }
            chunks.push(PrefillChunk {
                id: req.id,
                tokens: req.prompt.len(),
            });
        }
        self.prefill_step(&chunks)
            .inspect_err(|_| self.abandon(&chunks))
    }

    /// Takes a sequence out, prefilling or decoding, to free its blocks, and
    /// returns its request with what resuming it by recompute needs (the
    /// tokens it emitted, its RNG): admitting that request again prefills
    /// the prompt and those tokens (mostly prefix-cache hits while its
    /// blocks are not evicted) and continues the sequence as if it had never
    /// left. `None` if unknown.
    pub fn preempt(&mut self, id: SeqId) -> Option<SequenceRequest> {
        self.seqs.preempt(id)
    }

    /// Ends a sequence, prefilling or decoding (cancel, finish): offers its
    /// computed full blocks to the prefix cache and drops its hold on its
    /// blocks. Returns the tokens it emitted, or `None` if unknown.
    pub fn release(&mut self, id: SeqId) -> Option<usize> {
        self.seqs.release(id).map(|seq| seq.generated)
    }

    /// Runs every step shape the server will use (see [`warmup`]): decode
    /// buckets up to the decode bound, prefill steps within the config's
    /// [`PrefillBounds`](config::PrefillBounds); then captures the decode
    /// graphs where the config asked for them and shapes are bucketed, and
    /// (bucketed) runs a few requests with every option ([`warm_requests`]).
    pub fn warmup(&mut self) -> Result<WarmupReport, EngineError> {
        let mut report = warmup::run(&mut self.runner, self.cuda_graphs)?;
        if self.runner.shape().bucketed {
            let started = std::time::Instant::now();
            report.requests = self.warm_requests()?;
            report.requests_seconds = started.elapsed().as_secs_f64();
            report.seconds += report.requests_seconds;
            tracing::info!(
                requests = report.requests,
                seconds = report.requests_seconds,
                "warm requests run (every option's kernels compiled)"
            );
        }
        Ok(report)
    }

    /// Gives the runner back the device penalty slots of sequences that
    /// ended, then gives one to each of `ids` that wants its penalties on
    /// the device and has none yet (while slots last: the rest keep host
    /// edits), its counts written from its stats.
    fn place_penalties(&mut self, ids: &[SeqId]) {
        for slot in self.seqs.take_freed_penalty_slots() {
            self.runner.release_penalty_slot(slot);
        }
        for &id in ids {
            let Some(seq) = self.seqs.get_mut(id) else {
                continue;
            };
            if seq.penalty_slot.is_none() && seq.wants_device_slot() {
                seq.penalty_slot = self.runner.acquire_penalty_slot(|| seq.slot_row());
            }
        }
    }

    /// The sampling table of a step over `ids` (each keyed by its seed and
    /// position). Rows with a constraint ask it for their allowed tokens
    /// (the grammar's mask, the costly part of a structured row): with more
    /// than one such row they are built in parallel.
    fn sampling_table(&mut self, ids: &[SeqId]) -> SamplingTable {
        let vocab = self.runner.model_config().vocab_size;
        let eos = self.eos_token_id;
        let mut table = SamplingTable::with_capacity(ids.len());
        let constrained = ids
            .iter()
            .filter(|&&id| self.seqs.get(id).is_some_and(Sequence::has_constraint))
            .count();
        let parallel = (constrained > 1).then(|| self.seqs.many_mut(ids)).flatten();
        match parallel {
            Some(mut seqs) => {
                let rows: Vec<RowSampling> = seqs
                    .par_iter_mut()
                    .map(|seq| seq.sampling_row(eos, vocab))
                    .collect();
                rows.into_iter().for_each(|row| table.push(row));
            }
            _ => {
                for &id in ids {
                    // A sequence that ended after its step was planned
                    // (the overlapped loop) samples a greedy row nobody reads.
                    table.push(match self.seqs.get_mut(id) {
                        Some(seq) => seq.sampling_row(eos, vocab),
                        None => RowSampling::greedy(),
                    });
                }
            }
        }
        table
    }

    /// Applies the stop rules to a sampled token of `id` and records it (and
    /// its logprobs) in the step's output; frees a finished sequence.
    fn judge_and_record(
        &mut self,
        id: SeqId,
        token: u32,
        logprobs: Option<TokenLogprobs>,
        out: &mut StepOutput,
    ) {
        let Some(seq) = self.seqs.get_mut(id) else {
            return;
        };
        let Verdict { emit, finish } = seq.judge(token, self.eos_token_id);
        let generated = seq.generated;
        if emit {
            out.tokens.push(SampledToken {
                id,
                index: generated.saturating_sub(1),
                token,
                logprobs,
            });
        }
        if let Some(reason) = finish {
            self.seqs.release(id);
            out.finished.push(FinishedSeq {
                id,
                reason,
                generated,
            });
        }
    }

    /// Releases sequences admitted by a failed [`Engine::prefill`].
    fn abandon(&mut self, chunks: &[PrefillChunk]) {
        for c in chunks {
            self.release(c.id);
        }
    }
}
