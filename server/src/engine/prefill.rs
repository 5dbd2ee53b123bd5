//! Admission and prefill: the prefix cache and chunked prompts, one mechanism.
//!
//! A request enters in two moves:
//! 1. [`Engine::admit`] looks the prompt's full blocks up in the prefix cache
//!    (chained content keys, [`super::prefix_cache`]), takes the longest run of
//!    cached blocks as the head of its block table (shared, read-only) and
//!    fresh blocks for the rest of its budget. The last prompt token is never
//!    taken from the cache: its logits give the first sampled token, so the hit
//!    stops at the last full block before it. No compute happens here.
//! 2. [`Engine::prefill_step`] computes the next chunk of several admitted
//!    prompts in one forward pass. A row starting after cached positions (the
//!    hit, earlier chunks) attends over its whole context gathered from the
//!    paged cache ([`super::batch::prefill_inputs_over`]); its new K/V go to
//!    its own fresh blocks. A row whose chunk ends its prompt samples its first
//!    token and becomes a decoding sequence; the others wait for their next
//!    chunk. A prompt's full blocks are keyed in the prefix cache as soon as
//!    they are computed, so requests arriving meanwhile already share them.
//!
//! When a sequence ends ([`Engine::release`]) the full blocks of its generated
//! tokens are keyed too (a follow-up request that repeats the conversation
//! reuses them), then its holds are dropped: unshared cached blocks are parked
//! in the LRU order, the rest become empty.
//!
//! [`Engine::prefill`] (admit every request, prefill whole prompts) is the
//! one-call form for callers without a scheduler.

use std::collections::HashSet;

use burn::prelude::*;

use super::batch::{prefill_inputs_over, PrefillSeq, StepInputs};
use super::logprobs::{any_asked, logprobs};
use super::prefix_cache::BlockHash;
use super::runner::{forward, Engine};
use super::sampler::{sample, RowChoice, SamplingParamsRows};
use super::sequence::Sequence;
use super::types::*;

/// A prompt's match against the prefix cache.
struct PrefixMatch {
    /// Keys of the prompt's full blocks.
    hashes: Vec<BlockHash>,
    /// Cached blocks of its longest reusable prefix.
    hits: Vec<u32>,
}

impl Engine {
    /// What admitting a request would take now (for the scheduler's plan;
    /// [`Engine::admit`] takes exactly this if nothing changes in between).
    pub fn admission_cost(&self, prompt: &[u32], max_new_tokens: usize) -> AdmissionCost {
        let m = self.match_prefix(prompt);
        let total = self.blocks_required(prompt.len(), max_new_tokens);
        AdmissionCost {
            blocks: self
                .blocks
                .cost(&m.hits, total.saturating_sub(m.hits.len())),
            cached_tokens: m.hits.len() * self.block_size,
        }
    }

    /// Admits a sequence: reserves its whole block budget, the cached prefix
    /// first, and returns how many prompt tokens were found cached. Nothing is
    /// computed until [`Engine::prefill_step`]. On any error the engine is
    /// unchanged ([`EngineError::OutOfBlocks`]: keep the request waiting).
    pub fn admit(&mut self, req: &SequenceRequest) -> Result<usize, EngineError> {
        self.validate(req)?;
        if self.contains(req.id) {
            return Err(EngineError::DuplicateSequence(req.id));
        }
        let PrefixMatch { hashes, hits } = self.match_prefix(&req.prompt);
        let total = self.blocks_required(req.prompt.len(), req.max_new_tokens);
        let table = self.blocks.acquire(&hits, total - hits.len())?;
        let cached = hits.len() * self.block_size;
        let seq = Sequence::new(req, table, cached, hits.len(), hashes);
        self.prefilling.insert(req.id, seq);
        Ok(cached)
    }

    /// Prompt tokens still to compute for an admitted sequence; None once it
    /// decodes (or if unknown).
    pub fn prompt_remaining(&self, id: SeqId) -> Option<usize> {
        self.prefilling.get(&id).map(Sequence::prompt_remaining)
    }

    /// One batched prefill step: for each chunk, computes the next tokens of
    /// its sequence's prompt over everything before them. Sequences whose
    /// prompt this completes sample their first token (and may finish at
    /// once). On an error no sequence advances.
    pub fn prefill_step(&mut self, chunks: &[PrefillChunk]) -> Result<StepOutput, EngineError> {
        if chunks.is_empty() {
            return Ok(StepOutput::default());
        }
        let mut seen = HashSet::with_capacity(chunks.len());
        let mut rows: Vec<(SeqId, usize, bool)> = Vec::with_capacity(chunks.len());
        for c in chunks {
            let Some(seq) = self.prefilling.get(&c.id) else {
                return Err(EngineError::UnknownSequence(c.id));
            };
            if c.tokens == 0 || !seen.insert(c.id) {
                return Err(EngineError::InvalidRequest(format!(
                    "prefill chunk of sequence {} is empty or repeated",
                    c.id
                )));
            }
            let n = c.tokens.min(seq.prompt_remaining());
            rows.push((c.id, n, n == seq.prompt_remaining()));
        }
        // Rows that complete their prompt first: theirs are the sampled logits.
        rows.sort_by_key(|&(_, _, completes)| !completes);
        let sampled = rows.iter().filter(|r| r.2).count();
        let choices: Vec<RowChoice> = rows[..sampled]
            .iter()
            .filter_map(|(id, ..)| self.prefilling.get_mut(id).map(Sequence::choice))
            .collect();
        let top_n: Vec<Option<usize>> = rows[..sampled]
            .iter()
            .map(|(id, ..)| self.prefilling.get(id).and_then(Sequence::logprobs))
            .collect();

        let views: Vec<PrefillSeq<'_>> = rows
            .iter()
            .filter_map(|&(id, n, _)| {
                let s = self.prefilling.get(&id)?;
                Some(PrefillSeq {
                    tokens: &s.tokens[s.cached..s.cached + n],
                    start: s.cached,
                    table: &s.table,
                })
            })
            .collect();
        let (inputs, padded) = self.prefill_batch(&views);
        let logits = forward(&self.model, &mut self.cache, inputs);
        let (tokens, mut lps) = if sampled > 0 {
            let mut params = SamplingParamsRows::new(padded, self.config.vocab_size, &self.device);
            params.write(&choices);
            let kept = any_asked(&top_n).then(|| logits.clone());
            let tokens = sample(logits, &params, sampled)?;
            let lps = kept.map(|l| logprobs(l, &tokens, &top_n)).transpose()?;
            (tokens, lps.unwrap_or_default())
        } else {
            (Vec::new(), Vec::new())
        };

        let mut out = StepOutput::default();
        for (i, &(id, n, completes)) in rows.iter().enumerate() {
            let Some(mut seq) = self.prefilling.remove(&id) else {
                continue;
            };
            seq.cached += n;
            self.key_full_blocks(&mut seq);
            match (completes, tokens.get(i)) {
                (true, Some(&token)) => {
                    let verdict = seq.judge(token, self.eos_token_id);
                    let lp = lps.get_mut(i).and_then(Option::take);
                    self.seqs.insert(id, seq);
                    self.record(id, token, lp, verdict, &mut out);
                }
                _ => {
                    self.prefilling.insert(id, seq);
                }
            }
        }
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
        let needed: usize = reqs
            .iter()
            .map(|r| self.admission_cost(&r.prompt, r.max_new_tokens).blocks)
            .sum();
        let free = self.blocks.free();
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

    /// Logits `[B, vocab]` at the last position of each prompt, computed through
    /// the same prefill path as [`Engine::prefill`] with temporary blocks that are
    /// freed again, never cached (for scoring and for tests against reference
    /// logits).
    pub fn prompt_logits(&mut self, prompts: &[Vec<u32>]) -> Result<Tensor<2>, EngineError> {
        for (i, p) in prompts.iter().enumerate() {
            self.validate(&SequenceRequest {
                id: i as SeqId,
                prompt: p.clone(),
                max_new_tokens: 1,
                ignore_eos: true,
                sampling: SamplingParams::greedy(),
                stop_token_ids: Vec::new(),
                logprobs: None,
            })?;
        }
        let counts: Vec<usize> = prompts
            .iter()
            .map(|p| p.len().div_ceil(self.block_size))
            .collect();
        let tables = self.blocks.reserve_tables(&counts)?;
        let rows: Vec<PrefillSeq<'_>> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| PrefillSeq {
                tokens: p,
                start: 0,
                table: t,
            })
            .collect();
        let (inputs, _) = self.prefill_batch(&rows);
        let logits = forward(&self.model, &mut self.cache, inputs);
        for t in &tables {
            self.blocks.release(t);
        }
        Ok(logits.narrow(0, 0, prompts.len()))
    }

    /// Offers the full blocks `seq` computed since the last call to the prefix
    /// cache, in chain order (content already cached elsewhere stays private).
    pub(super) fn key_full_blocks(&mut self, seq: &mut Sequence) {
        let bs = self.block_size;
        let full = seq.cached / bs;
        if full <= seq.keyed || !self.blocks.prefix_caching() {
            return;
        }
        if seq.hashes.len() < full {
            let from = seq.hashes.len() * bs;
            let more = self.blocks.extend_hashes(
                seq.hashes.last().copied(),
                &seq.tokens[from..full * bs],
                bs,
            );
            seq.hashes.extend(more);
        }
        for i in seq.keyed..full {
            self.blocks.register(seq.table[i], seq.hashes[i]);
        }
        seq.keyed = full;
    }

    /// The prompt's full-block keys and its longest cached prefix, stopping
    /// before the block of the last token (which must be computed).
    fn match_prefix(&self, prompt: &[u32]) -> PrefixMatch {
        let hashes = self.blocks.block_hashes(prompt, self.block_size);
        let reusable = prompt.len().saturating_sub(1) / self.block_size;
        let hits = self.blocks.lookup(&hashes[..reusable.min(hashes.len())]);
        PrefixMatch { hashes, hits }
    }

    /// Releases sequences admitted by a failed [`Engine::prefill`].
    fn abandon(&mut self, chunks: &[PrefillChunk]) {
        for c in chunks {
            self.release(c.id);
        }
    }

    /// The prefill step's inputs over `rows` (blocks already reserved),
    /// padded to the step's shape, and the padded row count (the first
    /// `rows.len()` rows are real; the logits are `[padded, vocab]`).
    fn prefill_batch(&self, rows: &[PrefillSeq<'_>]) -> (StepInputs, usize) {
        let longest = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(1);
        let shape = self.prefill_shape(rows.len(), longest);
        let context = rows
            .iter()
            .any(|r| r.start > 0)
            .then(|| self.prefill_context(rows));
        let pad_slot = self.blocks.padding_block() as usize * self.block_size;
        let inputs = prefill_inputs_over(
            rows,
            shape,
            context,
            self.block_size,
            pad_slot,
            &self.device,
        );
        (inputs, shape.rows)
    }

    /// Context length `T` of a prefill step with cached positions: the longest
    /// row's end, rounded up to a power-of-two number of blocks when shapes are
    /// bucketed (at most the block-table width).
    fn prefill_context(&self, rows: &[PrefillSeq<'_>]) -> usize {
        let end = rows
            .iter()
            .map(|r| r.start + r.tokens.len())
            .max()
            .unwrap_or(1);
        if !self.bucketed {
            return end;
        }
        let width = self.config.n_positions.div_ceil(self.block_size);
        let blocks = end.div_ceil(self.block_size).next_power_of_two().min(width);
        (blocks * self.block_size).max(end)
    }
}
