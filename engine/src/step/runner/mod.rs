//! [`StepRunner`]: the device half of the engine. It owns the model, the KV
//! storage, the persistent decode buffers and the captured decode graphs,
//! and runs one step at a time: build the step's inputs, run the forward
//! pass (or replay the bucket's graph), sample, and read the chosen ids back.
//!
//! It knows nothing about sequences: a step arrives as rows (tokens,
//! positions, block tables) and sampling choices, and leaves as ids (and
//! logprobs where asked). The host half (which sequence holds which blocks,
//! the stop rules) is `crate::engine`'s.
//!
//! Step shapes (CUDA buckets, exact on the CPU) are [`super::shapes`]'s.
//! Padding rows and tokens read and write only the padding block (one past
//! the pool's last).
//!
//! Children: [`decode_graphs`] (each decode bucket's captured step and
//! choice half), [`launch`] (a decode step queued without waiting for its
//! ids, for the overlapped step loop), [`prefill_graphs`] (small prefill steps
//! as captured graphs), [`prefill_probe`] (the bench's probe of them),
//! [`scoring`] (prompt logprobs), [`warm`] (the
//! vocabulary kernels warmed at warmup).

mod decode_graphs;
mod launch;
mod prefill_graphs;
mod prefill_probe;
mod scoring;
mod warm;

pub use scoring::ScoreRequest;
use scoring::{score, score_positions};

use std::collections::BTreeMap;
use std::time::Instant;

use burn::prelude::*;

use super::buffers::{DecodeBuffers, DecodeRow};
use super::choice_graph::ChoiceGraph;
use super::forward::forward;
use super::graphs::{Ending, StepGraph};
use super::inputs::{
    decode_inputs, prefill_inputs, PrefillHost, PrefillSeq, PrefillShape, StepInputs,
};
use super::prefill_buffers::PrefillBuffers;
use super::shapes::{self, RunnerShape};
use crate::error::EngineError;
use crate::model::kv_cache::kv_dtype;
use crate::model::{Gpt2, Gpt2Config, KvCache};
use crate::ops::{InputBuffer, Ops, TableGeometry};
use crate::sampling::{
    logprobs, sample, DeviceSampling, PenaltyState, SamplingParamsRows, SamplingTable, SlotContents,
};
use crate::types::TokenLogprobs;

/// What a sampled step returns: one id per real row, and each row's logprobs
/// where it asked.
pub type Sampled = (Vec<u32>, Vec<Option<TokenLogprobs>>);

/// The device half of the engine (see the module docs).
pub struct StepRunner {
    /// Captured decode steps per bucket (declared first: dropped before the
    /// buffers and the cache they replay against).
    graphs: BTreeMap<usize, StepGraph>,
    /// Captured prefill steps per `(tokens, rows)` shape ([`prefill_graphs`]).
    prefill_graphs: BTreeMap<(usize, usize), StepGraph>,
    /// Captured choice halves per decode bucket, for steps queued in two
    /// ([`launch`]; CUDA only).
    choice_graphs: BTreeMap<usize, ChoiceGraph>,
    model: Gpt2,
    config: Gpt2Config,
    ops: Ops,
    /// K/V storage of all layers, `(num_blocks + 1) * block_size` slots each.
    cache: KvCache,
    /// Persistent decode inputs, one set per decode bucket, made on first use.
    decode_buffers: BTreeMap<usize, DecodeBuffers>,
    /// Persistent prefill inputs of the captured prefill shapes.
    prefill_buffers: BTreeMap<(usize, usize), PrefillBuffers>,
    /// `[max_batch, 1]` the last queued decode step's choice ([`launch`]),
    /// where a row fed [`super::buffers::Feed::Previous`] finds its token.
    last_chosen: InputBuffer<2, Int>,
    /// Decoding sequences' penalties on the device, where the sampling
    /// kernel runs (`crate::sampling::penalty_state`).
    penalties: Option<PenaltyState>,
    /// Where sampled rows are sampled, decided once (kernel tuning, device).
    sampling: DeviceSampling,
    shape: RunnerShape,
    device: Device,
}

impl StepRunner {
    /// Allocates the K/V storage for `shape` (`(num_blocks + 1) * block_size`
    /// slots per layer, K and V).
    pub fn new(
        model: Gpt2,
        config: Gpt2Config,
        ops: Ops,
        shape: RunnerShape,
        device: Device,
    ) -> Result<Self, EngineError> {
        let RunnerShape {
            block_size,
            num_blocks,
            max_batch,
            ..
        } = shape;
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
        let cache = KvCache::new(
            config.n_layer,
            config.n_head,
            head_dim,
            num_slots,
            &device,
            kv_dtype(&ops),
        );
        tracing::info!(
            block_size,
            num_blocks,
            max_batch,
            bucketed = shape.bucketed,
            kv_bytes = num_slots * config.n_layer * config.n_embd * 2 * cache.elem_bytes(),
            "allocated the paged KV cache"
        );
        let sampling = DeviceSampling::of(ops.tuning(), &device, config.vocab_size);
        let penalties = PenaltyState::for_device(max_batch, config.vocab_size, &device, sampling);
        Ok(Self {
            last_chosen: InputBuffer::resident_zeros([max_batch, 1], &device),
            graphs: BTreeMap::new(),
            prefill_graphs: BTreeMap::new(),
            choice_graphs: BTreeMap::new(),
            prefill_buffers: BTreeMap::new(),
            penalties,
            sampling,
            model,
            config,
            ops,
            cache,
            decode_buffers: BTreeMap::new(),
            shape,
            device,
        })
    }

    pub fn model_config(&self) -> &Gpt2Config {
        &self.config
    }

    pub fn shape(&self) -> RunnerShape {
        self.shape
    }

    /// The block tables' geometry: `n_positions` worth of blocks, padded
    /// with the padding block (one past the pool's last).
    fn tables(&self) -> TableGeometry {
        let block_size = self.shape.block_size;
        TableGeometry {
            block_size,
            width: self.config.n_positions.div_ceil(block_size),
            padding_block: self.shape.num_blocks as u32,
        }
    }

    /// Takes a device penalty slot for a sequence whose `row` (its tokens,
    /// `(token, output count, in the prompt)`, and its logit bias, asked for
    /// only when a slot is free) is written into the slot
    /// (`crate::sampling::penalty_state::slot_row`); `None` where there are
    /// no device penalties or every slot is taken.
    pub fn acquire_penalty_slot(&mut self, row: impl FnOnce() -> SlotContents) -> Option<u32> {
        let state = self.penalties.as_mut().filter(|p| p.free_slots() > 0)?;
        let SlotContents { tokens, bias } = row();
        state.acquire(tokens, &bias)
    }

    /// Gives a slot from [`StepRunner::acquire_penalty_slot`] back.
    pub fn release_penalty_slot(&mut self, slot: u32) {
        if let Some(p) = self.penalties.as_mut() {
            p.release(slot);
        }
    }

    /// The decode bucket of a batch of `n` rows.
    pub fn decode_bucket(&self, n: usize) -> usize {
        shapes::decode_bucket(&self.shape, n)
    }

    /// The padded shape of a prefill step of `rows` rows and `tokens` tokens.
    pub fn prefill_shape(&self, rows: usize, tokens: usize) -> PrefillShape {
        shapes::prefill_shape(&self.shape, rows, tokens)
    }

    /// One decode step over `rows` (at most `max_batch`), row `i` sampled by
    /// row `i` of `table`.
    pub fn decode(
        &mut self,
        rows: &[DecodeRow<'_>],
        table: &SamplingTable,
    ) -> Result<Sampled, EngineError> {
        let DecodeRun {
            logits,
            chosen,
            bucket,
            ..
        } = self.run_decode(rows, Some(table), true);
        let started = Instant::now();
        let params = &self.decode_buffers[&bucket].sampling;
        let sampled = sample_step(logits, chosen, params, table)?;
        // (`options` is only evaluated when the trace is on.)
        tracing::trace!(
            bucket,
            options = ?params.plan().options,
            sample_us = started.elapsed().as_micros() as u64,
            "decode step sampled and read back"
        );
        self.check_library_calls()?;
        Ok(sampled)
    }

    /// The forward half of [`StepRunner::decode`]: writes the step's inputs
    /// (and sampling table) into the bucket's buffers and runs the model,
    /// replaying the bucket's graph if it has one. Returns the logits
    /// `[bucket, vocab]` and the bucket.
    pub fn decode_forward(
        &mut self,
        rows: &[DecodeRow<'_>],
        table: &SamplingTable,
    ) -> (Tensor<2>, usize) {
        let run = self.run_decode(rows, Some(table), true);
        (run.logits, run.bucket)
    }

    /// [`StepRunner::decode_forward`], with each row's token as the replayed
    /// graph chose it; `wait`: the device has finished the replay on return
    /// (else it is only queued). With no `table` the step ends at the
    /// logits (its sampling columns are written later,
    /// [`StepRunner::decode_choose`]).
    fn run_decode(
        &mut self,
        rows: &[DecodeRow<'_>],
        table: Option<&SamplingTable>,
        wait: bool,
    ) -> DecodeRun {
        let started = Instant::now();
        let bucket = self.decode_bucket(rows.len());
        let inputs = self.prepare_decode(bucket, rows, table);
        let sampling = &self.decode_buffers[&bucket].sampling;
        let columns = sampling.columns();
        let ending = Ending::of(sampling.plan(), table.is_none());
        let prepared = started.elapsed();
        let replayed = self
            .graphs
            .get_mut(&bucket)
            .and_then(|graph| graph.replay(&mut self.cache, inputs.clone(), columns, ending, wait));
        // Where a step's host time goes (`RUST_LOG=ember_engine::step=trace`).
        tracing::trace!(
            bucket,
            prepare_us = prepared.as_micros() as u64,
            replay_us = (started.elapsed() - prepared).as_micros() as u64,
            replayed = replayed.is_some(),
            "decode step inputs written and run"
        );
        match replayed {
            Some((logits, chosen)) => DecodeRun {
                logits,
                chosen,
                bucket,
                replayed: true,
            },
            None => DecodeRun {
                logits: forward(&self.model, &self.ops, &mut self.cache, inputs),
                chosen: None,
                bucket,
                replayed: false,
            },
        }
    }

    /// One prefill step over `rows` (blocks already reserved); the first
    /// `table.len()` rows complete their prompt and are sampled by `table`.
    /// `scores` asks for the logprobs of tokens at positions of rows (prompt
    /// logprobs): their logits are computed besides the rows' last ones, and
    /// each request gets one [`TokenLogprobs`] per target.
    pub fn prefill(
        &mut self,
        rows: &[PrefillSeq<'_>],
        table: &SamplingTable,
        scores: &[ScoreRequest],
    ) -> Result<(Sampled, Vec<Vec<TokenLogprobs>>), EngineError> {
        if scores.is_empty() {
            if let Some(sampled) = self.replay_prefill(rows, table) {
                let sampled = sampled?;
                self.check_library_calls()?;
                return Ok((sampled, Vec::new()));
            }
        }
        let (mut host, padded) = self.prefill_batch(rows);
        let extra = score_positions(rows, scores);
        if !extra.is_empty() {
            // The scored positions' rows follow the rows' last tokens (built
            // here on the host: one upload, no device concatenation), padded
            // to a power of two on bucketed devices: a bounded set of
            // LM-head shapes.
            let n = if self.shape.bucketed {
                extra.len().max(16).next_power_of_two()
            } else {
                extra.len()
            };
            host.last_rows.extend(&extra);
            host.last_rows.resize(padded + n, 0);
        }
        let inputs = host.upload(&self.device);
        let logits = forward(&self.model, &self.ops, &mut self.cache, inputs);
        let scored = (!extra.is_empty()).then(|| logits.clone());
        let sampled = if table.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let logits = logits.narrow(0, 0, padded);
            let vocab = self.config.vocab_size;
            let mut params = SamplingParamsRows::new(padded, vocab, &self.device, self.sampling);
            params.write(table);
            sample_step(logits, None, &params, table)?
        };
        let scores = match scored {
            Some(l) => score(l, padded, scores)?,
            None => Vec::new(),
        };
        self.check_library_calls()?;
        Ok((sampled, scores))
    }

    /// Fails the step if a library call it queued (cuBLASLt) failed: its
    /// output was never written, so the sampled ids are not to be trusted.
    fn check_library_calls(&self) -> Result<(), EngineError> {
        match self.ops.take_error() {
            Some(message) => Err(EngineError::Device(message)),
            None => Ok(()),
        }
    }

    /// The logits `[rows.len(), vocab]` at each row's last token (a prefill
    /// step without sampling; tests and the reference check).
    pub fn logits(&mut self, rows: &[PrefillSeq<'_>]) -> Tensor<2> {
        let (host, _) = self.prefill_batch(rows);
        let inputs = host.upload(&self.device);
        forward(&self.model, &self.ops, &mut self.cache, inputs).narrow(0, 0, rows.len())
    }

    /// Runs a prefill step of `shape` made of padding only (warmup).
    pub fn warm_prefill(&mut self, shape: PrefillShape) -> Result<(), EngineError> {
        let inputs = prefill_inputs(&[], shape, self.tables(), &self.device);
        let logits = forward(&self.model, &self.ops, &mut self.cache, inputs);
        let vocab = self.config.vocab_size;
        let params = SamplingParamsRows::new(shape.rows, vocab, &self.device, self.sampling);
        sample(logits, None, &params, &SamplingTable::greedy(1)).map(drop)
    }

    /// Runs a decode step of `bucket` padding rows, sampled by `table`
    /// (warmup: the greedy and the sampling path).
    pub fn warm_decode(&mut self, bucket: usize, table: &SamplingTable) -> Result<(), EngineError> {
        let inputs = self.prepare_decode(bucket, &[], Some(table));
        let logits = forward(&self.model, &self.ops, &mut self.cache, inputs);
        sample(logits, None, &self.decode_buffers[&bucket].sampling, table).map(drop)
    }

    /// Writes a decode step of `bucket` rows (the real `rows` first, padding
    /// after) into the bucket's persistent buffers, made on first use (and
    /// its sampling `table`, if it is known yet), and returns the step's
    /// inputs (views of those buffers).
    fn prepare_decode(
        &mut self,
        bucket: usize,
        rows: &[DecodeRow<'_>],
        table: Option<&SamplingTable>,
    ) -> StepInputs {
        let block_size = self.shape.block_size;
        let max_context = self.config.n_positions;
        let table_width = self.tables().width;
        let (vocab, heads) = (self.config.vocab_size, self.config.n_head);
        let (device, sampling) = (&self.device, self.sampling);
        let counts = self.penalties.as_ref().map(PenaltyState::counts);
        let buffers = self.decode_buffers.entry(bucket).or_insert_with(|| {
            DecodeBuffers::new(
                (bucket, table_width, vocab, heads),
                device,
                sampling,
                counts,
            )
        });
        buffers.write(rows, block_size, self.shape.num_blocks as u32);
        if let Some(table) = table {
            buffers.write_sampling(table);
        }
        decode_inputs(buffers, block_size, max_context, self.last_chosen.tensor())
    }

    /// The prefill step's inputs over `rows` on the host, padded to the
    /// step's shape, and the padded row count (the first `rows.len()` rows
    /// are real; the logits are `[padded, vocab]`).
    fn prefill_batch(&self, rows: &[PrefillSeq<'_>]) -> (PrefillHost, usize) {
        let tokens = rows.iter().map(|r| r.tokens.len()).sum();
        let shape = self.prefill_shape(rows.len(), tokens);
        (PrefillHost::new(rows, shape, self.tables()), shape.rows)
    }
}

/// A decode step's forward as [`StepRunner::run_decode`] ran it.
struct DecodeRun {
    /// `[bucket, vocab]`.
    logits: Tensor<2>,
    /// Each row's token as a replayed graph chose it (none eager or for
    /// [`Ending::Logits`]).
    chosen: Option<Tensor<2, Int>>,
    bucket: usize,
    /// Whether the bucket's graph ran it (its logits are then the graph's
    /// output buffer).
    replayed: bool,
}

/// Whether a runner keeps `graph`, just captured (from `started`) for the
/// step `what` names: a hardware graph always; on CUDA a capture that gave
/// none is logged and dropped (that shape runs eager, never a wrong
/// result); elsewhere (the CPU) the fallback graph, which re-runs the step.
pub(super) fn keep_capture(
    graph: &StepGraph,
    bucketed: bool,
    what: &str,
    started: Instant,
) -> bool {
    let is_hardware = graph.is_hardware();
    tracing::debug!(
        what,
        is_hardware,
        seconds = started.elapsed().as_secs_f64(),
        "captured a step"
    );
    if !is_hardware && cfg!(feature = "cuda") && bucketed {
        tracing::warn!(what, "CUDA graph capture failed; that shape runs eager");
        return false;
    }
    true
}

/// Samples the `table.len()` real rows of `logits` with `params` (written
/// from `table`; `chosen`: the tokens the step chose on the device, where
/// it did), then the logprobs of the rows that asked (only when one did).
fn sample_step(
    logits: Tensor<2>,
    chosen: Option<Tensor<2, Int>>,
    params: &SamplingParamsRows,
    table: &SamplingTable,
) -> Result<Sampled, EngineError> {
    let kept = table.any_logprobs().then(|| logits.clone());
    let tokens = sample(logits, chosen, params, table)?;
    let lps = kept
        .map(|l| logprobs(l, &tokens, &table.logprobs))
        .transpose()?
        .unwrap_or_default();
    Ok((tokens, lps))
}
