//! [`Engine`]: the model, the paged KV cache and the active sequences.
//!
//! Each step (prefill or decode) is one batched forward pass, one sampling
//! pass and one device->host read of the chosen ids (plus, only when some row
//! asked for logprobs, [`logprobs`] and its one read). A finished sequence's
//! blocks are freed inside the step (stop rules: [`super::sequence`]).
//! Admission and the prefill steps (prefix cache, chunks) are in
//! [`super::prefill`]; this file holds the engine's state and the decode step.
//!
//! Admission reserves a sequence's whole budget of blocks,
//! `ceil((prompt + max_new_tokens) / block_size)` (cached prefix blocks
//! included, shared), so a running sequence never runs out of cache and never
//! needs preemption; refusing admission is the scheduler's back-pressure
//! signal ([`EngineError::OutOfBlocks`]).
//!
//! Step shapes: with `bucketed` on (CUDA), decode batches are padded to
//! power-of-two buckets up to `max_batch` and prefill batches to power-of-two
//! rows and lengths, so the set of shapes is small and known in advance
//! (autotune runs once per shape). A decode step's inputs go through the
//! bucket's persistent [`DecodeBuffers`], and with `decode_graphs` on, each
//! bucket's step is captured once and replayed as a CUDA graph
//! ([`super::graphs`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use burn::prelude::*;

use super::batch::{decode_inputs, PrefillShape, StepInputs};
use super::blocks::BlockPool;
use super::buffers::{DecodeBuffers, DecodeRow};
use super::graphs::DecodeGraph;
use super::limits::RequestLimits;
use super::logprobs::{any_asked, logprobs};
use super::sampler::{sample, RowChoice};
use super::sequence::Sequence;
use super::types::*;
use crate::model::{Gpt2, Gpt2Config, KvCache};

/// Shortest padded prompt length when prefill shapes are bucketed.
const MIN_PREFILL_BUCKET: usize = 16;

/// Runs many GPT-2 sequences at once over a paged KV cache.
pub struct Engine {
    /// Captured decode steps per bucket (declared first: dropped before the
    /// buffers and the cache they replay against).
    pub(super) graphs: BTreeMap<usize, DecodeGraph>,
    /// Capture decode graphs after warmup (see [`EngineConfig::decode_graphs`]).
    pub(super) decode_graphs: bool,
    pub(super) model: Gpt2,
    pub(super) config: Gpt2Config,
    /// K/V storage of all layers, `(num_blocks + 1) * block_size` slots each
    /// (the extra block is the padding block).
    pub(super) cache: KvCache,
    /// Which blocks are free, held or cached (the prefix cache).
    pub(super) blocks: BlockPool,
    pub(super) block_size: usize,
    /// Largest decode batch (and decode bucket).
    pub(super) max_batch: usize,
    /// Whether step shapes are padded to buckets.
    pub(super) bucketed: bool,
    /// Decoding sequences (prefilled, not finished or released).
    pub(super) seqs: HashMap<SeqId, Sequence>,
    /// Admitted sequences whose prompt is not all in the cache yet.
    pub(super) prefilling: HashMap<SeqId, Sequence>,
    /// Persistent decode inputs, one set per decode bucket, made on first use.
    pub(super) decode_buffers: BTreeMap<usize, DecodeBuffers>,
    /// Token that ends a sequence (unless `ignore_eos`).
    pub(super) eos_token_id: u32,
    pub(super) device: Device,
}

impl Engine {
    /// Allocates the KV cache (`(num_blocks + 1) * block_size` slots per layer, K and V).
    pub fn new(
        model: Gpt2,
        config: Gpt2Config,
        engine_config: EngineConfig,
        eos_token_id: u32,
        device: Device,
    ) -> Result<Self, EngineError> {
        config
            .validate()
            .map_err(|e| EngineError::InvalidConfig(e.to_string()))?;
        let EngineConfig {
            block_size,
            num_blocks,
            max_batch,
            bucketed,
            prefix_caching,
            decode_graphs,
        } = engine_config;
        if block_size == 0 || num_blocks == 0 || max_batch == 0 {
            return Err(EngineError::InvalidConfig(format!(
                "block_size ({block_size}), num_blocks ({num_blocks}) and max_batch ({max_batch}) must be > 0"
            )));
        }
        // Slot ids travel as 32-bit ints on the device.
        let num_slots = block_size
            .checked_mul(num_blocks + 1)
            .filter(|&n| n <= i32::MAX as usize)
            .ok_or_else(|| {
                EngineError::InvalidConfig("block_size * (num_blocks + 1) exceeds i32".into())
            })?;
        let head_dim = config.n_embd / config.n_head;
        let cache = KvCache::new(config.n_layer, config.n_head, head_dim, num_slots, &device);
        tracing::info!(
            block_size,
            num_blocks,
            max_batch,
            bucketed,
            prefix_caching,
            kv_bytes = num_slots * config.n_layer * config.n_embd * 2 * cache.elem_bytes(),
            "allocated the paged KV cache"
        );
        Ok(Self {
            graphs: BTreeMap::new(),
            decode_graphs,
            model,
            config,
            cache,
            blocks: BlockPool::new(num_blocks, prefix_caching),
            block_size,
            max_batch,
            bucketed,
            seqs: HashMap::new(),
            prefilling: HashMap::new(),
            decode_buffers: BTreeMap::new(),
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
        self.limits().blocks_required(prompt_len, max_new_tokens)
    }

    pub fn kv_blocks_total(&self) -> usize {
        self.blocks.total()
    }

    /// Blocks admission can count on: empty ones and cached ones no sequence
    /// holds (evicted when needed).
    pub fn kv_blocks_free(&self) -> usize {
        self.blocks.free()
    }

    /// Blocks held by at least one sequence.
    pub fn kv_blocks_used(&self) -> usize {
        self.blocks.used()
    }

    /// Blocks whose content the prefix cache can reuse (held or not).
    pub fn kv_blocks_cached(&self) -> usize {
        self.blocks.cached()
    }

    pub fn prefix_caching(&self) -> bool {
        self.blocks.prefix_caching()
    }

    /// Sequences admitted and not yet finished or released (prefilling or
    /// decoding).
    pub fn num_active(&self) -> usize {
        self.seqs.len() + self.prefilling.len()
    }

    /// Whether `id` is active.
    pub fn contains(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id) || self.prefilling.contains_key(&id)
    }

    /// What a request must fit into.
    pub fn limits(&self) -> RequestLimits {
        RequestLimits {
            vocab_size: self.config.vocab_size,
            context: self.config.n_positions,
            block_size: self.block_size,
            kv_blocks_total: self.blocks.total(),
        }
    }

    /// Checks a request against the model's limits (not against free blocks).
    pub fn validate(&self, req: &SequenceRequest) -> Result<(), EngineError> {
        let limits = self.limits();
        limits
            .check(&req.prompt, req.max_new_tokens)
            .and_then(|()| limits.check_controls(&req.stop_token_ids, req.logprobs))
            .map_err(|v| {
                let field = v.field.name("prompt");
                EngineError::InvalidRequest(format!("sequence {}: {field} {}", req.id, v.message))
            })
    }

    /// One batched decode step for exactly these active sequences (each at its
    /// own position, at most `max_batch`): feeds each one's last sampled token,
    /// samples the next.
    pub fn decode(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        if ids.is_empty() {
            return Ok(StepOutput::default());
        }
        let (logits, bucket) = self.decode_forward(ids)?;
        let top_n: Vec<Option<usize>> = ids
            .iter()
            .map(|id| self.seqs.get(id).and_then(Sequence::logprobs))
            .collect();
        let kept = any_asked(&top_n).then(|| logits.clone());
        let params = &self.decode_buffers[&bucket].sampling;
        let tokens = sample(logits, params, ids.len())?;
        let lps = kept.map(|l| logprobs(l, &tokens, &top_n)).transpose()?;
        let lps = lps
            .unwrap_or_default()
            .into_iter()
            .chain(std::iter::repeat(None));

        let mut out = StepOutput::default();
        for ((&id, token), lp) in ids.iter().zip(tokens).zip(lps) {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            seq.cached += 1;
            let verdict = seq.judge(token, self.eos_token_id);
            self.record(id, token, lp, verdict, &mut out);
        }
        Ok(out)
    }

    /// The forward half of [`Engine::decode`]: checks `ids`, writes the step's
    /// inputs (and each row's sampling choice, drawing one uniform per sampling
    /// row) into the bucket's buffers and runs the model. Returns the logits
    /// `[bucket, vocab]` and the bucket.
    pub(super) fn decode_forward(
        &mut self,
        ids: &[SeqId],
    ) -> Result<(Tensor<2>, usize), EngineError> {
        if ids.len() > self.max_batch {
            return Err(EngineError::InvalidRequest(format!(
                "decode batch of {} exceeds max_batch {}",
                ids.len(),
                self.max_batch
            )));
        }
        let mut seen = HashSet::with_capacity(ids.len());
        for &id in ids {
            if !self.seqs.contains_key(&id) {
                return Err(EngineError::UnknownSequence(id));
            }
            if !seen.insert(id) {
                return Err(EngineError::InvalidRequest(format!(
                    "sequence {id} listed twice in one decode step"
                )));
            }
        }
        let choices: Vec<RowChoice> = ids
            .iter()
            .filter_map(|id| self.seqs.get_mut(id).map(Sequence::choice))
            .collect();
        let bucket = self.decode_bucket(ids.len());
        let geometry = DecodeGeometry::of(self);
        let rows: Vec<DecodeRow<'_>> = ids
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .map(|s| DecodeRow {
                token: s.last_token,
                pos: s.cached,
                table: &s.table,
            })
            .collect();
        let inputs = prepare_decode(&mut self.decode_buffers, &geometry, bucket, &rows, &choices);
        let replayed = self
            .graphs
            .get_mut(&bucket)
            .and_then(|graph| graph.replay(&mut self.cache, inputs.clone()));
        let logits = match replayed {
            Some(logits) => logits,
            None => forward(&self.model, &mut self.cache, inputs),
        };
        Ok((logits, bucket))
    }

    /// Ends a sequence, prefilling or decoding (cancel, finish): offers its
    /// computed full blocks to the prefix cache and drops its hold on its
    /// blocks. Returns false if unknown.
    pub fn release(&mut self, id: SeqId) -> bool {
        match self
            .seqs
            .remove(&id)
            .or_else(|| self.prefilling.remove(&id))
        {
            Some(mut seq) => {
                self.key_full_blocks(&mut seq);
                self.blocks.release(&seq.table);
                true
            }
            None => false,
        }
    }

    /// The decode bucket of a batch of `n` rows.
    pub(super) fn decode_bucket(&self, n: usize) -> usize {
        if self.bucketed {
            n.max(1).next_power_of_two().min(self.max_batch)
        } else {
            n.max(1)
        }
    }

    /// The padded shape of a prefill batch of `n` prompts, the longest `longest`.
    pub(super) fn prefill_shape(&self, n: usize, longest: usize) -> PrefillShape {
        if self.bucketed {
            PrefillShape {
                rows: n.max(1).next_power_of_two(),
                len: longest
                    .max(MIN_PREFILL_BUCKET)
                    .next_power_of_two()
                    .min(self.config.n_positions)
                    .max(longest),
            }
        } else {
            PrefillShape {
                rows: n.max(1),
                len: longest.max(1),
            }
        }
    }

    /// Records a judged token (and its logprobs, if asked) in the step's
    /// output; frees a finished sequence.
    pub(super) fn record(
        &mut self,
        id: SeqId,
        token: u32,
        logprobs: Option<TokenLogprobs>,
        verdict: super::sequence::Verdict,
        out: &mut StepOutput,
    ) {
        if verdict.emit {
            out.tokens.push(SampledToken {
                id,
                token,
                logprobs,
            });
        }
        if let Some(reason) = verdict.finish {
            out.finished.push(FinishedSeq { id, reason });
            self.release(id);
        }
    }
}

/// What a decode step needs to know about the cache layout.
#[derive(Debug, Clone)]
pub(super) struct DecodeGeometry {
    pub block_size: usize,
    /// Block-table width: blocks of the longest allowed sequence.
    pub table_width: usize,
    pub padding_block: u32,
    pub vocab: usize,
    /// Attention heads of the model.
    pub heads: usize,
    /// Longest context (the model's `n_positions`).
    pub max_context: usize,
    pub device: Device,
}

impl DecodeGeometry {
    /// The geometry of `engine`'s cache.
    pub fn of(engine: &Engine) -> Self {
        Self {
            block_size: engine.block_size,
            table_width: engine.config.n_positions.div_ceil(engine.block_size),
            padding_block: engine.blocks.padding_block(),
            vocab: engine.config.vocab_size,
            heads: engine.config.n_head,
            max_context: engine.config.n_positions,
            device: engine.device.clone(),
        }
    }
}

/// Writes a decode step of `bucket` rows (the real `rows` first, padding
/// after) into the bucket's persistent buffers, made on first use, and
/// returns the step's inputs (views of those buffers).
pub(super) fn prepare_decode(
    buffers: &mut BTreeMap<usize, DecodeBuffers>,
    geometry: &DecodeGeometry,
    bucket: usize,
    rows: &[DecodeRow<'_>],
    choices: &[RowChoice],
) -> StepInputs {
    let buffers = buffers.entry(bucket).or_insert_with(|| {
        DecodeBuffers::new(
            bucket,
            geometry.table_width,
            geometry.vocab,
            geometry.heads,
            &geometry.device,
        )
    });
    buffers.write(rows, geometry.block_size, geometry.padding_block);
    buffers.write_sampling(choices);
    decode_inputs(buffers, geometry.block_size, geometry.max_context)
}

/// The model's forward pass over a step's inputs.
pub(super) fn forward(model: &Gpt2, cache: &mut KvCache, inputs: StepInputs) -> Tensor<2> {
    let StepInputs {
        tokens,
        positions,
        last_rows,
        meta,
    } = inputs;
    model.forward(tokens, positions, last_rows, &meta, cache)
}
