//! [`Engine`]: the model, the paged KV cache and the active sequences.
//!
//! Each step (prefill or decode) is one batched forward pass, one sampling
//! pass and one device->host read of the chosen ids. Stop rules live here:
//! a sampled EOS (unless `ignore_eos`) finishes a sequence without emitting it;
//! the token that reaches `max_new_tokens` is emitted and finishes it. A
//! finished sequence's blocks are freed inside the step.
//!
//! Admission reserves a sequence's whole budget of blocks,
//! `ceil((prompt + max_new_tokens) / block_size)`, so a running sequence never
//! runs out of cache and never needs preemption; refusing admission is the
//! scheduler's back-pressure signal ([`EngineError::OutOfBlocks`]).

use std::collections::{HashMap, HashSet};

use burn::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::batch::{decode_inputs, prefill_inputs, DecodeSeq, PrefillSeq, StepInputs};
use super::blocks::BlockAllocator;
use super::sampler::{sample, RowChoice};
use super::types::*;
use crate::model::{Gpt2, Gpt2Config, KvCache};

/// Per-sequence state between steps.
#[derive(Debug)]
struct Sequence {
    /// Blocks reserved for the sequence's whole budget, in position order.
    table: Vec<u32>,
    /// Tokens whose K/V are in the cache (= position of `last_token`).
    cached: usize,
    /// The last sampled token, fed at the next decode step.
    last_token: u32,
    /// Tokens emitted so far.
    generated: usize,
    max_new_tokens: usize,
    ignore_eos: bool,
    sampling: SamplingParams,
    /// The sequence's own RNG, seeded from `sampling.seed`, one draw per step.
    rng: StdRng,
}

impl Sequence {
    fn choice(&mut self) -> RowChoice {
        let p = self.sampling;
        if p.is_greedy() {
            RowChoice::Greedy
        } else {
            RowChoice::Sample {
                temperature: p.temperature,
                top_k: p.top_k,
                top_p: p.top_p,
                uniform: self.rng.random::<f32>(),
            }
        }
    }
}

/// Runs many GPT-2 sequences at once over a paged KV cache.
pub struct Engine<B: Backend> {
    model: Gpt2<B>,
    config: Gpt2Config,
    /// K/V storage of all layers, `num_blocks * block_size` slots each.
    cache: KvCache<B>,
    /// Which blocks are free.
    blocks: BlockAllocator,
    block_size: usize,
    /// Active sequences (prefilled, not finished or released).
    seqs: HashMap<SeqId, Sequence>,
    /// Token that ends a sequence (unless `ignore_eos`).
    eos_token_id: u32,
    device: B::Device,
}

impl<B: Backend> Engine<B> {
    /// Allocates the KV cache (`num_blocks * block_size` slots per layer, K and V).
    pub fn new(
        model: Gpt2<B>,
        config: Gpt2Config,
        engine_config: EngineConfig,
        eos_token_id: u32,
        device: B::Device,
    ) -> Result<Self, EngineError> {
        config
            .validate()
            .map_err(|e| EngineError::InvalidConfig(e.to_string()))?;
        let EngineConfig {
            block_size,
            num_blocks,
        } = engine_config;
        if block_size == 0 || num_blocks == 0 {
            return Err(EngineError::InvalidConfig(format!(
                "block_size ({block_size}) and num_blocks ({num_blocks}) must be > 0"
            )));
        }
        // Slot ids travel as the backend's int type (i32 on CUDA).
        let num_slots = block_size
            .checked_mul(num_blocks)
            .filter(|&n| n <= i32::MAX as usize)
            .ok_or_else(|| {
                EngineError::InvalidConfig("block_size * num_blocks exceeds i32".into())
            })?;
        tracing::info!(
            block_size,
            num_blocks,
            kv_bytes = num_blocks * Self::kv_bytes_per_block(&config, block_size, 4),
            "allocating paged KV cache (bytes shown at f32)"
        );
        let cache = KvCache::new(config.n_layer, config.n_embd, num_slots, &device);
        Ok(Self {
            model,
            config,
            cache,
            blocks: BlockAllocator::new(num_blocks),
            block_size,
            seqs: HashMap::new(),
            eos_token_id,
            device,
        })
    }

    pub fn model_config(&self) -> &Gpt2Config {
        &self.config
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// KV bytes one block takes over all layers (K and V), for sizing by memory.
    pub fn kv_bytes_per_block(config: &Gpt2Config, block_size: usize, elem_bytes: usize) -> usize {
        2 * config.n_layer * block_size * config.n_embd * elem_bytes
    }

    /// Blocks reserved when a request is admitted:
    /// `ceil((prompt + max_new_tokens) / block_size)`. Reserving the whole
    /// budget at admission means a running sequence never needs preemption.
    pub fn blocks_required(&self, prompt_len: usize, max_new_tokens: usize) -> usize {
        (prompt_len + max_new_tokens).div_ceil(self.block_size)
    }

    pub fn kv_blocks_total(&self) -> usize {
        self.blocks.total()
    }

    pub fn kv_blocks_free(&self) -> usize {
        self.blocks.free()
    }

    pub fn kv_blocks_used(&self) -> usize {
        self.blocks.used()
    }

    /// Sequences prefilled and not yet finished or released.
    pub fn num_active(&self) -> usize {
        self.seqs.len()
    }

    /// Whether `id` is active.
    pub fn contains(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id)
    }

    /// Checks a request against the model's limits (not against free blocks).
    pub fn validate(&self, req: &SequenceRequest) -> Result<(), EngineError> {
        let c = &self.config;
        let invalid = |m: String| Err(EngineError::InvalidRequest(m));
        if req.prompt.is_empty() {
            return invalid(format!("sequence {}: empty prompt", req.id));
        }
        if req.max_new_tokens == 0 {
            return invalid(format!("sequence {}: max_new_tokens must be >= 1", req.id));
        }
        if req.prompt.len() + req.max_new_tokens > c.n_positions {
            return invalid(format!(
                "sequence {}: prompt ({}) + max_new_tokens ({}) exceeds the context window ({})",
                req.id,
                req.prompt.len(),
                req.max_new_tokens,
                c.n_positions
            ));
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= c.vocab_size) {
            return invalid(format!(
                "sequence {}: token id {t} >= vocab size {}",
                req.id, c.vocab_size
            ));
        }
        Ok(())
    }

    /// Batched prefill of new sequences (different lengths, one forward pass,
    /// logits only at each sequence's last position); samples each one's first
    /// token. All-or-nothing: any error leaves the engine unchanged.
    pub fn prefill(&mut self, reqs: Vec<SequenceRequest>) -> Result<StepOutput, EngineError> {
        if reqs.is_empty() {
            return Ok(StepOutput::default());
        }
        let mut ids = HashSet::with_capacity(reqs.len());
        let mut needed = 0;
        for req in &reqs {
            self.validate(req)?;
            if self.seqs.contains_key(&req.id) || !ids.insert(req.id) {
                return Err(EngineError::DuplicateSequence(req.id));
            }
            needed += self.blocks_required(req.prompt.len(), req.max_new_tokens);
        }
        let free = self.blocks.free();
        let Some(mut pool) = self.blocks.allocate(needed) else {
            return Err(EngineError::OutOfBlocks { needed, free });
        };
        let tables: Vec<Vec<u32>> = reqs
            .iter()
            .map(|r| {
                let n = self.blocks_required(r.prompt.len(), r.max_new_tokens);
                pool.split_off(pool.len() - n)
            })
            .collect();

        let seqs: Vec<PrefillSeq<'_>> = reqs
            .iter()
            .zip(&tables)
            .map(|(r, t)| PrefillSeq {
                prompt: &r.prompt,
                table: t,
            })
            .collect();
        let inputs = prefill_inputs::<B>(&seqs, self.block_size, &self.device);
        let logits = self.forward(inputs);

        let mut states: Vec<(SeqId, Sequence)> = reqs
            .into_iter()
            .zip(tables)
            .map(|(r, table)| {
                let seq = Sequence {
                    table,
                    cached: r.prompt.len(),
                    last_token: 0,
                    generated: 0,
                    max_new_tokens: r.max_new_tokens,
                    ignore_eos: r.ignore_eos,
                    sampling: r.sampling,
                    rng: StdRng::seed_from_u64(r.sampling.seed),
                };
                (r.id, seq)
            })
            .collect();
        let choices: Vec<RowChoice> = states.iter_mut().map(|(_, s)| s.choice()).collect();
        let tokens = match sample(logits, &choices) {
            Ok(t) => t,
            Err(e) => {
                for (_, s) in states {
                    self.blocks.release(s.table);
                }
                return Err(e);
            }
        };

        let mut out = StepOutput::default();
        for ((id, seq), token) in states.into_iter().zip(tokens) {
            self.seqs.insert(id, seq);
            self.accept(id, token, &mut out);
        }
        Ok(out)
    }

    /// One batched decode step for exactly these active sequences (each at its
    /// own position): feeds each one's last sampled token, samples the next.
    pub fn decode(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        if ids.is_empty() {
            return Ok(StepOutput::default());
        }
        let (logits, choices) = self.decode_forward(ids)?;
        let tokens = sample(logits, &choices)?;

        let mut out = StepOutput::default();
        for (&id, token) in ids.iter().zip(tokens) {
            if let Some(s) = self.seqs.get_mut(&id) {
                s.cached += 1;
            }
            self.accept(id, token, &mut out);
        }
        Ok(out)
    }

    /// The forward half of [`Engine::decode`]: checks `ids`, writes each
    /// sequence's last token's K/V and returns the logits `[B, vocab]` with each
    /// row's sampling choice (drawing one uniform per sampling row).
    fn decode_forward(
        &mut self,
        ids: &[SeqId],
    ) -> Result<(Tensor<B, 2>, Vec<RowChoice>), EngineError> {
        let mut seen = HashSet::with_capacity(ids.len());
        let mut batch = Vec::with_capacity(ids.len());
        for &id in ids {
            let s = self.seqs.get(&id).ok_or(EngineError::UnknownSequence(id))?;
            if !seen.insert(id) {
                return Err(EngineError::InvalidRequest(format!(
                    "sequence {id} listed twice in one decode step"
                )));
            }
            batch.push(DecodeSeq {
                token: s.last_token,
                pos: s.cached,
                table: &s.table,
            });
        }
        let inputs = decode_inputs::<B>(&batch, self.block_size, &self.device);
        let choices = ids
            .iter()
            .filter_map(|id| self.seqs.get_mut(id).map(Sequence::choice))
            .collect();
        Ok((self.forward(inputs), choices))
    }

    /// Frees a sequence's blocks (cancel). Returns false if unknown.
    pub fn release(&mut self, id: SeqId) -> bool {
        match self.seqs.remove(&id) {
            Some(seq) => {
                self.blocks.release(seq.table);
                true
            }
            None => false,
        }
    }

    /// Runs forward passes over the batch shapes the server will use (prefill
    /// batches up to `prefill_max_batch`, decode batches up to `max_batch`),
    /// leaving no state behind (all blocks it took are free after).
    pub fn warmup(
        &mut self,
        max_batch: usize,
        prefill_max_batch: usize,
    ) -> Result<(), EngineError> {
        let prompt_len = 8.min(self.config.n_positions.saturating_sub(2)).max(1);
        let max_new = 2;
        let per_seq = self.blocks_required(prompt_len, max_new);
        let fits = |engine: &Self, n: usize| n.min(engine.blocks.free() / per_seq.max(1));
        let mut next_id = SeqId::MAX;
        let mut fresh_ids = |engine: &Self, n: usize| {
            let mut v = Vec::with_capacity(n);
            while v.len() < n {
                if !engine.seqs.contains_key(&next_id) {
                    v.push(next_id);
                }
                next_id -= 1;
            }
            v
        };
        let request = |id| SequenceRequest {
            id,
            prompt: vec![0; prompt_len],
            max_new_tokens: max_new,
            ignore_eos: true,
            sampling: SamplingParams::greedy(),
        };
        for n in batch_sizes(prefill_max_batch) {
            let n = fits(self, n);
            let ids = fresh_ids(self, n);
            let result = self.prefill(ids.iter().map(|&id| request(id)).collect());
            ids.iter().for_each(|&id| {
                self.release(id);
            });
            result?;
        }
        for n in batch_sizes(max_batch) {
            let n = fits(self, n);
            let ids = fresh_ids(self, n);
            let mut result = Ok(StepOutput::default());
            for chunk in ids.chunks(prefill_max_batch.max(1)) {
                result = self.prefill(chunk.iter().map(|&id| request(id)).collect());
                if result.is_err() {
                    break;
                }
            }
            if result.is_ok() {
                result = self.decode(&ids);
            }
            ids.iter().for_each(|&id| {
                self.release(id);
            });
            result?;
        }
        tracing::info!(max_batch, prefill_max_batch, "engine warmed up");
        Ok(())
    }

    /// Logits `[B, vocab]` at the last position of each prompt, computed through
    /// the same prefill path as [`Engine::prefill`] with temporary blocks that are
    /// freed again (for scoring and for tests against reference logits).
    pub fn prompt_logits(&mut self, prompts: &[Vec<u32>]) -> Result<Tensor<B, 2>, EngineError> {
        let mut tables = Vec::with_capacity(prompts.len());
        for (i, p) in prompts.iter().enumerate() {
            self.validate(&SequenceRequest {
                id: i as SeqId,
                prompt: p.clone(),
                max_new_tokens: 1,
                ignore_eos: true,
                sampling: SamplingParams::greedy(),
            })?;
        }
        let needed: usize = prompts
            .iter()
            .map(|p| p.len().div_ceil(self.block_size))
            .sum();
        let free = self.blocks.free();
        let Some(mut pool) = self.blocks.allocate(needed) else {
            return Err(EngineError::OutOfBlocks { needed, free });
        };
        for p in prompts {
            tables.push(pool.split_off(pool.len() - p.len().div_ceil(self.block_size)));
        }
        let seqs: Vec<PrefillSeq<'_>> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| PrefillSeq {
                prompt: p,
                table: t,
            })
            .collect();
        let inputs = prefill_inputs::<B>(&seqs, self.block_size, &self.device);
        let logits = self.forward(inputs);
        for t in tables {
            self.blocks.release(t);
        }
        Ok(logits)
    }

    fn forward(&mut self, inputs: StepInputs<B>) -> Tensor<B, 2> {
        let StepInputs {
            tokens,
            positions,
            last_rows,
            meta,
        } = inputs;
        self.model
            .forward(tokens, positions, last_rows, &meta, &mut self.cache)
    }

    /// Applies the stop rules to a sampled token and records the events.
    fn accept(&mut self, id: SeqId, token: u32, out: &mut StepOutput) {
        let eos = self.eos_token_id;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let reason = if token == eos && !seq.ignore_eos {
            Some(FinishReason::Eos)
        } else {
            out.tokens.push(SampledToken { id, token });
            seq.last_token = token;
            seq.generated += 1;
            (seq.generated >= seq.max_new_tokens).then_some(FinishReason::Length)
        };
        if let Some(reason) = reason {
            out.finished.push(FinishedSeq { id, reason });
            self.release(id);
        }
    }
}

/// 1, 2, 4, ... up to and including `max` (empty for 0).
fn batch_sizes(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|&n| n < max)
        .collect();
    if max > 0 {
        v.push(max);
    }
    v
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::model::fixtures::{max_abs_diff, reference, tiny_gpt2_dir};
    use crate::model::{load_model, ModelSource};

    type TestBackend = burn::backend::NdArray<f32>;

    /// The fixture's EOS (its greedy continuations never produce it).
    const EOS: u32 = 999;

    fn engine(block_size: usize, num_blocks: usize) -> Engine<TestBackend> {
        let dev = Default::default();
        let (model, config) =
            load_model::<TestBackend>(&ModelSource::Dir(tiny_gpt2_dir()), &dev).unwrap();
        Engine::new(
            model,
            config,
            EngineConfig {
                block_size,
                num_blocks,
            },
            EOS,
            dev,
        )
        .unwrap()
    }

    fn req(
        id: SeqId,
        prompt: &[u32],
        max_new_tokens: usize,
        sampling: SamplingParams,
    ) -> SequenceRequest {
        SequenceRequest {
            id,
            prompt: prompt.to_vec(),
            max_new_tokens,
            ignore_eos: true,
            sampling,
        }
    }

    fn rows(t: Tensor<TestBackend, 2>) -> Vec<Vec<f32>> {
        let [_, v] = t.dims();
        let flat: Vec<f32> = t.into_data().iter::<f32>().collect();
        flat.chunks(v).map(<[f32]>::to_vec).collect()
    }

    /// Collects a step's tokens per sequence and returns the ids still running.
    fn absorb(out: StepOutput, tokens: &mut HashMap<SeqId, Vec<u32>>, active: &mut Vec<SeqId>) {
        for t in out.tokens {
            tokens.entry(t.id).or_default().push(t.token);
        }
        for f in out.finished {
            active.retain(|&id| id != f.id);
        }
    }

    /// Prefills `reqs` together and decodes them together until all finish.
    fn generate(
        engine: &mut Engine<TestBackend>,
        reqs: Vec<SequenceRequest>,
    ) -> HashMap<SeqId, Vec<u32>> {
        let mut active: Vec<SeqId> = reqs.iter().map(|r| r.id).collect();
        let mut tokens = HashMap::new();
        absorb(engine.prefill(reqs).unwrap(), &mut tokens, &mut active);
        while !active.is_empty() {
            let ids = active.clone();
            absorb(engine.decode(&ids).unwrap(), &mut tokens, &mut active);
        }
        tokens
    }

    #[test]
    fn prefill_logits_match_transformers() {
        let reference = reference();
        let mut engine = engine(4, 64);
        let prompts: Vec<Vec<u32>> = reference.cases.iter().map(|c| c.prompt.clone()).collect();
        // All prompts in one padded batch, and each alone.
        let batched = rows(engine.prompt_logits(&prompts).unwrap());
        let mut worst = 0.0f32;
        for (case, got) in reference.cases.iter().zip(&batched) {
            worst = worst.max(max_abs_diff(got, &case.last_logits));
            let alone = rows(
                engine
                    .prompt_logits(std::slice::from_ref(&case.prompt))
                    .unwrap(),
            );
            worst = worst.max(max_abs_diff(&alone[0], &case.last_logits));
        }
        eprintln!("prefill logits: max |burn - transformers| = {worst:e}");
        assert!(worst < 1e-4, "max abs diff {worst}");
        assert_eq!(engine.kv_blocks_used(), 0);
    }

    #[test]
    fn greedy_continuations_and_decode_logits_match_transformers() {
        let reference = reference();
        let n = reference.new_tokens;
        let mut engine = engine(4, 128);
        let reqs: Vec<_> = reference
            .cases
            .iter()
            .enumerate()
            .map(|(i, c)| req(i as SeqId, &c.prompt, n, SamplingParams::greedy()))
            .collect();
        let ids: Vec<SeqId> = (0..reqs.len() as SeqId).collect();
        let mut tokens = HashMap::new();
        let mut active = ids.clone();
        absorb(engine.prefill(reqs).unwrap(), &mut tokens, &mut active);
        for _ in 0..n - 2 {
            absorb(engine.decode(&ids).unwrap(), &mut tokens, &mut active);
        }
        // The last step's logits, through the paged decode path.
        let (logits, _) = engine.decode_forward(&ids).unwrap();
        let logits = rows(logits);
        let worst = reference
            .cases
            .iter()
            .zip(&logits)
            .map(|(c, got)| max_abs_diff(got, &c.final_logits))
            .fold(0.0, f32::max);
        eprintln!("decode logits (step {n}): max |burn - transformers| = {worst:e}");
        assert!(worst < 1e-4, "max abs diff {worst}");
        absorb(engine.decode(&ids).unwrap(), &mut tokens, &mut active);
        assert!(active.is_empty());
        for (i, case) in reference.cases.iter().enumerate() {
            assert_eq!(tokens[&(i as SeqId)], case.greedy, "prompt {i}");
        }
        assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
    }

    #[test]
    fn mixed_batches_and_late_joiners_match_each_sequence_alone() {
        let reference = reference();
        let n = reference.new_tokens;
        let cases = &reference.cases;
        // Each alone.
        let mut engine = engine(4, 64);
        for (i, c) in cases.iter().enumerate() {
            let got = generate(
                &mut engine,
                vec![req(i as SeqId, &c.prompt, n, SamplingParams::greedy())],
            );
            assert_eq!(got[&(i as SeqId)], c.greedy, "alone {i}");
        }
        // Continuous batching: 0 and 2 start together, 1 joins after 3 steps,
        // 3 after 7, with different budgets so they finish at different steps.
        let budgets = [n, n - 5, n, n - 2];
        let mut tokens = HashMap::new();
        let mut active = vec![0, 2];
        let first = vec![
            req(0, &cases[0].prompt, budgets[0], SamplingParams::greedy()),
            req(2, &cases[2].prompt, budgets[2], SamplingParams::greedy()),
        ];
        absorb(engine.prefill(first).unwrap(), &mut tokens, &mut active);
        for step in 1.. {
            if step == 3 || step == 7 {
                let i = if step == 3 { 1 } else { 3 };
                active.push(i as SeqId);
                let r = req(
                    i as SeqId,
                    &cases[i].prompt,
                    budgets[i],
                    SamplingParams::greedy(),
                );
                absorb(engine.prefill(vec![r]).unwrap(), &mut tokens, &mut active);
            }
            if active.is_empty() {
                break;
            }
            let ids = active.clone();
            absorb(engine.decode(&ids).unwrap(), &mut tokens, &mut active);
        }
        for (i, c) in cases.iter().enumerate() {
            assert_eq!(tokens[&(i as SeqId)], c.greedy[..budgets[i]], "batched {i}");
        }
        assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
    }

    #[test]
    fn stop_rules_eos_and_length() {
        let reference = reference();
        let case = &reference.cases[1];
        let mut engine = engine(4, 32);
        // EOS = the first greedy token: finishes at prefill, not emitted.
        engine.eos_token_id = case.greedy[0];
        let mut r = req(1, &case.prompt, 8, SamplingParams::greedy());
        r.ignore_eos = false;
        let out = engine.prefill(vec![r.clone()]).unwrap();
        assert!(out.tokens.is_empty());
        assert_eq!(
            out.finished,
            [FinishedSeq {
                id: 1,
                reason: FinishReason::Eos
            }]
        );
        assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
        // ignore_eos: emitted like any token.
        r.ignore_eos = true;
        let out = engine.prefill(vec![r]).unwrap();
        assert_eq!(
            out.tokens,
            [SampledToken {
                id: 1,
                token: case.greedy[0]
            }]
        );
        assert!(out.finished.is_empty());
        assert!(engine.release(1));
        // max_new_tokens = 1: the token is emitted and the sequence finishes.
        let out = engine
            .prefill(vec![req(2, &case.prompt, 1, SamplingParams::greedy())])
            .unwrap();
        assert_eq!(
            out.tokens,
            [SampledToken {
                id: 2,
                token: case.greedy[0]
            }]
        );
        assert_eq!(
            out.finished,
            [FinishedSeq {
                id: 2,
                reason: FinishReason::Length
            }]
        );
        assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
    }

    #[test]
    fn release_frees_blocks_and_unknown_ids_are_errors() {
        let mut engine = engine(4, 32);
        engine
            .prefill(vec![req(1, &[1, 2, 3, 4, 5], 6, SamplingParams::greedy())])
            .unwrap();
        assert_eq!(engine.kv_blocks_used(), 3);
        engine.decode(&[1]).unwrap();
        assert!(matches!(
            engine.decode(&[1, 2]),
            Err(EngineError::UnknownSequence(2))
        ));
        assert!(matches!(
            engine.decode(&[1, 1]),
            Err(EngineError::InvalidRequest(_))
        ));
        assert!(engine.release(1));
        assert!(!engine.release(1));
        assert_eq!(
            (
                engine.kv_blocks_used(),
                engine.kv_blocks_free(),
                engine.num_active()
            ),
            (0, 32, 0)
        );
    }

    #[test]
    fn out_of_blocks_leaves_the_engine_unchanged() {
        let mut engine = engine(4, 5);
        engine
            .prefill(vec![req(1, &[1, 2, 3], 5, SamplingParams::greedy())])
            .unwrap(); // 2 blocks
        let before = (engine.kv_blocks_free(), engine.num_active());
        // 2 + 2 blocks needed, 3 free: neither is admitted.
        let err = engine
            .prefill(vec![
                req(2, &[4, 5, 6], 5, SamplingParams::greedy()),
                req(3, &[7], 7, SamplingParams::greedy()),
            ])
            .unwrap_err();
        assert!(
            matches!(err, EngineError::OutOfBlocks { needed: 4, free: 3 }),
            "{err}"
        );
        assert_eq!((engine.kv_blocks_free(), engine.num_active()), before);
        assert!(!engine.contains(2) && !engine.contains(3));
        // The running sequence is unaffected and one that fits is admitted.
        engine.decode(&[1]).unwrap();
        engine
            .prefill(vec![req(3, &[7], 7, SamplingParams::greedy())])
            .unwrap();
        assert_eq!(engine.kv_blocks_free(), 1);
    }

    #[test]
    fn invalid_requests_are_rejected() {
        let mut engine = engine(4, 64);
        let g = SamplingParams::greedy();
        let cases = [
            req(1, &[], 4, g),        // empty prompt
            req(1, &[1, 2], 0, g),    // no tokens to generate
            req(1, &[1000], 4, g),    // token id >= vocab
            req(1, &[1; 100], 29, g), // 129 > n_positions 128
        ];
        for r in cases {
            assert!(matches!(
                engine.prefill(vec![r]),
                Err(EngineError::InvalidRequest(_))
            ));
        }
        engine.prefill(vec![req(1, &[1; 100], 28, g)]).unwrap(); // exactly 128 fits
        assert!(matches!(
            engine.prefill(vec![req(1, &[1], 1, g)]),
            Err(EngineError::DuplicateSequence(1))
        ));
        assert!(matches!(
            engine.prefill(vec![req(5, &[1], 2, g), req(5, &[2], 2, g)]),
            Err(EngineError::DuplicateSequence(5))
        ));
        assert_eq!(engine.num_active(), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_seeds_differ() {
        let mut engine = engine(4, 64);
        let prompt = reference().cases[2].prompt.clone();
        let sample = |engine: &mut Engine<TestBackend>, seed, top_k, top_p| {
            let p = SamplingParams {
                temperature: 1.5,
                top_k,
                top_p,
                seed,
            };
            generate(engine, vec![req(7, &prompt, 12, p)])
                .remove(&7)
                .unwrap()
        };
        for (top_k, top_p) in [(0, 1.0), (50, 1.0), (0, 0.9), (40, 0.95)] {
            let a = sample(&mut engine, 1, top_k, top_p);
            let b = sample(&mut engine, 1, top_k, top_p);
            let c = sample(&mut engine, 2, top_k, top_p);
            assert_eq!(a, b, "same seed, top_k {top_k} top_p {top_p}");
            assert_ne!(a, c, "different seeds, top_k {top_k} top_p {top_p}");
        }
        // Sampling rows next to greedy rows: both unaffected by batching.
        let greedy = reference().cases[2].greedy[..12].to_vec();
        let p = SamplingParams {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            seed: 1,
        };
        let alone = sample(&mut engine, 1, 0, 1.0);
        let mixed = generate(
            &mut engine,
            vec![
                req(7, &prompt, 12, p),
                req(8, &prompt, 12, SamplingParams::greedy()),
            ],
        );
        assert_eq!((mixed[&7].clone(), mixed[&8].clone()), (alone, greedy));
        assert_eq!(engine.kv_blocks_used(), 0);
    }

    #[test]
    fn block_accounting() {
        let engine = engine(16, 10);
        assert_eq!(engine.blocks_required(1, 1), 1);
        assert_eq!(engine.blocks_required(10, 6), 1);
        assert_eq!(engine.blocks_required(10, 7), 2);
        assert_eq!(engine.blocks_required(100, 28), 8);
        assert_eq!(
            (
                engine.kv_blocks_total(),
                engine.kv_blocks_free(),
                engine.kv_blocks_used()
            ),
            (10, 10, 0)
        );
        let gpt2 = Gpt2Config::gpt2();
        // 2 (K, V) * 12 layers * 16 tokens * 768 * 2 bytes.
        assert_eq!(
            Engine::<TestBackend>::kv_bytes_per_block(&gpt2, 16, 2),
            589_824
        );
        assert_eq!(batch_sizes(0), Vec::<usize>::new());
        assert_eq!(batch_sizes(6), [1, 2, 4, 6]);
        assert_eq!(batch_sizes(8), [1, 2, 4, 8]);
    }

    #[test]
    fn warmup_leaves_no_state_behind() {
        let mut engine = engine(4, 16);
        engine
            .prefill(vec![req(1, &[3, 4], 3, SamplingParams::greedy())])
            .unwrap();
        engine.warmup(8, 4).unwrap(); // 8 decode rows need 24 blocks: capped, not an error
        assert_eq!((engine.num_active(), engine.kv_blocks_used()), (1, 2));
        engine.release(1);
        assert_eq!(engine.kv_blocks_used(), 0);
    }

    #[test]
    fn rejects_unusable_configs() {
        let dev = Default::default();
        let (model, config) =
            load_model::<TestBackend>(&ModelSource::Dir(tiny_gpt2_dir()), &dev).unwrap();
        let bad = EngineConfig {
            block_size: 0,
            num_blocks: 4,
        };
        assert!(matches!(
            Engine::new(model, config, bad, EOS, dev),
            Err(EngineError::InvalidConfig(_))
        ));
    }
}
