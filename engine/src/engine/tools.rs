//! The engine's methods for benchmarks and checks, not for serving: the
//! prompt logits of the transformers check, the projection timing, graph
//! capture and replay timing outside the warmup.

use burn::prelude::*;

use super::Engine;
use crate::error::EngineError;
use crate::ops::TunedShape;
use crate::step::shapes::prefill_shapes;
use crate::step::{PrefillSeq, StepRunner};
use crate::types::{SeqId, SequenceRequest};

impl Engine {
    /// Logits `[B, vocab]` at the last position of each prompt, computed
    /// through the paged cache (blocks taken and given back): the check
    /// against transformers' numbers.
    pub fn prompt_logits(&mut self, prompts: &[Vec<u32>]) -> Result<Tensor<2>, EngineError> {
        self.prompt_logits_on(prompts, false)
    }

    /// [`Engine::prompt_logits`] replayed from the step's captured prefill
    /// graph (`Engine::capture_prefill_graphs` first): the check that a
    /// replay computes what an eager step does. An error where the shape
    /// has no graph.
    pub fn prompt_logits_replayed(
        &mut self,
        prompts: &[Vec<u32>],
    ) -> Result<Tensor<2>, EngineError> {
        self.prompt_logits_on(prompts, true)
    }

    fn prompt_logits_on(
        &mut self,
        prompts: &[Vec<u32>],
        replayed: bool,
    ) -> Result<Tensor<2>, EngineError> {
        let logits = self.on_reserved(prompts, |runner, rows| match replayed {
            false => Some(runner.logits(rows)),
            true => runner.logits_replayed(rows),
        })?;
        logits.ok_or_else(|| EngineError::InvalidConfig("no captured prefill step".into()))
    }

    /// Milliseconds per replay of `prompts`' captured prefill step, `n`
    /// replays back to back after 3 untimed ones (the step's GPU time
    /// without the host's work); `None` where the shape has no hardware
    /// graph.
    pub fn time_prefill_graph_replays(
        &mut self,
        prompts: &[Vec<u32>],
        n: usize,
    ) -> Result<Option<f64>, EngineError> {
        self.on_reserved(prompts, |runner, rows| runner.time_prefill_replays(rows, n))
    }

    /// Runs `f` over `prompts` as fresh prefill rows on blocks reserved for
    /// them (validated first, given back after).
    pub(super) fn on_reserved<T>(
        &mut self,
        prompts: &[Vec<u32>],
        f: impl FnOnce(&mut StepRunner, &[PrefillSeq<'_>]) -> T,
    ) -> Result<T, EngineError> {
        for (i, p) in prompts.iter().enumerate() {
            self.validate(&SequenceRequest::greedy(i as SeqId, p.clone(), 1))?;
        }
        let bs = self.block_size();
        let counts: Vec<usize> = prompts.iter().map(|p| p.len().div_ceil(bs)).collect();
        let tables = self.seqs.reserve_tables(&counts)?;
        let rows: Vec<PrefillSeq<'_>> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| PrefillSeq {
                tokens: p,
                start: 0,
                table: t,
            })
            .collect();
        let out = f(&mut self.runner, &rows);
        self.seqs.release_tables(&tables);
        Ok(out)
    }

    /// Times the projection kernels against each other at the decode
    /// buckets of `batch_sizes` and at the engine's prefill token buckets,
    /// and records the fastest for each shape (CUDA; the warmup does this
    /// for every decode bucket). Returns the timings.
    pub fn tune_projections(&mut self, batch_sizes: &[usize]) -> Vec<TunedShape> {
        let buckets = self.decode_buckets(batch_sizes);
        let tokens: Vec<usize> = self.prefill_shapes().iter().map(|s| s.tokens).collect();
        self.runner.tune_projections(&buckets, &tokens)
    }

    /// Every prefill shape the engine's prefill bounds allow (bucketed
    /// devices; none elsewhere).
    fn prefill_shapes(&self) -> Vec<crate::step::PrefillShape> {
        let shape = self.runner.shape();
        match shape.bucketed {
            true => prefill_shapes(&shape, shape.prefill.max_rows, shape.prefill.max_tokens),
            false => Vec::new(),
        }
    }

    /// The distinct decode buckets of `batch_sizes`, ascending.
    fn decode_buckets(&self, batch_sizes: &[usize]) -> Vec<usize> {
        let mut buckets: Vec<usize> = batch_sizes
            .iter()
            .map(|&n| self.runner.decode_bucket(n))
            .collect();
        buckets.sort_unstable();
        buckets.dedup();
        buckets
    }

    /// Milliseconds per back-to-back replay of the captured decode graph of
    /// `batch` rows (its bucket), over `n` replays: the step's GPU time
    /// without the host's per-step work (benchmarks). `None` without a
    /// hardware graph.
    pub fn time_graph_replays(&mut self, batch: usize, n: usize) -> Option<f64> {
        self.runner.time_graph_replays(batch, n)
    }

    /// Captures the decode step of the bucket of each of `batch_sizes` as a
    /// CUDA graph (`crate::step::graphs`; on the CPU the "graph" re-runs the
    /// step). Returns the hardware graphs captured.
    pub fn capture_decode_graphs(&mut self, batch_sizes: &[usize]) -> usize {
        let buckets = self.decode_buckets(batch_sizes);
        self.runner.capture_decode_graphs(&buckets)
    }

    /// Captures the prefill step of every shape the engine's prefill bounds
    /// allow, up to `crate::step::PREFILL_GRAPH_MAX_TOKENS` tokens, as the
    /// warmup does (bucketed devices only: elsewhere shapes are exact and
    /// nothing is captured). Returns the hardware graphs captured.
    pub fn capture_prefill_graphs(&mut self) -> usize {
        let shapes = self.prefill_shapes();
        self.runner.capture_prefill_graphs(&shapes)
    }
}
