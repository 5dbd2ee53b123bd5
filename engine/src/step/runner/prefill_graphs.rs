//! Small prefill steps replayed as captured graphs (`crate::step::graphs`),
//! one per bucketed prefill shape up to [`PREFILL_GRAPH_MAX_TOKENS`] tokens
//! (captured by the warmup, `crate::engine::warmup`, with CUDA graphs on).
//!
//! An eager prefill step issues the same few hundred launches as an eager
//! decode step; for a short prompt the host's issuing is most of the step
//! (GPT-2 124M on an H200, 1 x 256: 1.96 ms eager where a torch.compile'd
//! step in one graph takes 0.61 ms). A shape's inputs live in its
//! [`PrefillBuffers`], written in place before each replay, and the graph
//! ends the way a decode graph does: the argmax of every row, or the
//! sampling kernel over the rows' columns. A step that also scores prompt
//! positions (prompt logprobs: more logit rows than the shape's) runs
//! eager, as does every step on a shape past the bound, where the GPU time
//! dwarfs the launches.

use std::time::Instant;

use burn::prelude::*;

use super::{keep_capture, sample_step, Sampled, StepRunner};
use crate::error::EngineError;
use crate::sampling::SamplingTable;
use crate::step::graphs::{Ending, GraphOutput, StepGraph};
use crate::step::inputs::{PrefillHost, PrefillSeq, PrefillShape};
use crate::step::prefill_buffers::PrefillBuffers;
use crate::step::shapes::PREFILL_GRAPH_MAX_TOKENS;

impl StepRunner {
    /// Captures the prefill step of each of `shapes` with at most
    /// [`PREFILL_GRAPH_MAX_TOKENS`] tokens, like
    /// [`StepRunner::capture_decode_graphs`] (a failed CUDA capture is logged
    /// and that shape runs eager). Returns the hardware graphs.
    pub fn capture_prefill_graphs(&mut self, shapes: &[PrefillShape]) -> usize {
        let mut hardware = 0;
        let (geometry, vocab) = (self.tables(), self.config.vocab_size);
        for &shape in shapes
            .iter()
            .filter(|s| s.tokens <= PREFILL_GRAPH_MAX_TOKENS)
        {
            let key = (shape.tokens, shape.rows);
            let (device, sampling) = (&self.device, self.sampling);
            self.prefill_buffers
                .entry(key)
                .or_insert_with(|| PrefillBuffers::new((shape, geometry), vocab, device, sampling));
            let what = format!(
                "prefill step of {} tokens, {} rows",
                shape.tokens, shape.rows
            );
            hardware += usize::from(self.capture_prefill_shape(key, &what));
        }
        hardware
    }

    /// Captures the prefill step of shape `key` over its buffers as they
    /// stand (greedy sampling columns written first) and keeps the graph
    /// where [`keep_capture`] says (`what` names it in the log). Whether a
    /// hardware graph came of it; `false` where the shape has no buffers.
    pub(super) fn capture_prefill_shape(&mut self, key: (usize, usize), what: &str) -> bool {
        let started = Instant::now();
        let Some(buffers) = self.prefill_buffers.get_mut(&key) else {
            return false;
        };
        buffers.sampling.write(&SamplingTable::default());
        let graph = StepGraph::capture(
            &self.model,
            &self.ops,
            &mut self.cache,
            (buffers.inputs(), buffers.sampling.columns()),
            &self.device,
            false,
        );
        let hardware = graph.is_hardware();
        if keep_capture(&graph, self.shape.bucketed, what, started) {
            self.prefill_graphs.insert(key, graph);
        }
        hardware
    }

    /// Milliseconds per replay of the captured prefill step over `rows`
    /// (written into its shape's buffers once), `n` replays back to back
    /// after 3 untimed ones: the step's GPU time without the host's work.
    /// `None` without a hardware graph for the shape.
    pub fn time_prefill_replays(&mut self, rows: &[PrefillSeq<'_>], n: usize) -> Option<f64> {
        let shape = self.step_shape(rows);
        let key = self.write_prefill_step(rows, shape, &SamplingTable::default())?;
        self.prefill_graphs.get_mut(&key)?.time_replays(n)
    }

    /// Prefill shapes with a captured graph.
    pub fn captured_prefill_shapes(&self) -> usize {
        self.prefill_graphs.len()
    }

    /// The logits `[rows.len(), vocab]` at each row's last token, from the
    /// step's graph (the check against [`StepRunner::logits`]); `None`
    /// where its shape has none.
    pub fn logits_replayed(&mut self, rows: &[PrefillSeq<'_>]) -> Option<Tensor<2>> {
        let shape = self.step_shape(rows);
        let (logits, _) = self.replay_prefill_step(rows, shape, &SamplingTable::default(), true)?;
        Some(logits.narrow(0, 0, rows.len()))
    }

    /// The prefill step over `rows`, sampled by `table` (see
    /// [`StepRunner::prefill`]), replayed from its shape's graph; `None`
    /// where the shape has none (the caller runs it eager).
    pub(super) fn replay_prefill(
        &mut self,
        rows: &[PrefillSeq<'_>],
        table: &SamplingTable,
    ) -> Option<Result<Sampled, EngineError>> {
        // The serving path asks every prefill step: nothing to look up until
        // a shape is captured.
        if self.prefill_graphs.is_empty() {
            return None;
        }
        let shape = self.step_shape(rows);
        let (logits, chosen) = self.replay_prefill_step(rows, shape, table, table.is_empty())?;
        if table.is_empty() {
            return Some(Ok((Vec::new(), Vec::new())));
        }
        let params = &self
            .prefill_buffers
            .get(&(shape.tokens, shape.rows))?
            .sampling;
        Some(sample_step(logits, chosen, params, table))
    }

    /// The padded shape of a prefill step over `rows`.
    pub(super) fn step_shape(&self, rows: &[PrefillSeq<'_>]) -> PrefillShape {
        let tokens = rows.iter().map(|r| r.tokens.len()).sum();
        self.prefill_shape(rows.len(), tokens)
    }

    /// Writes the step over `rows` (of `shape`) and `table` into its
    /// shape's buffers and replays its graph (to the logits alone with
    /// `logits_only`), waiting for the device; `None` where the shape has no
    /// graph.
    fn replay_prefill_step(
        &mut self,
        rows: &[PrefillSeq<'_>],
        shape: PrefillShape,
        table: &SamplingTable,
        logits_only: bool,
    ) -> Option<GraphOutput> {
        let started = std::time::Instant::now();
        let key = self.write_prefill_step(rows, shape, table)?;
        let written = started.elapsed();
        let graph = self.prefill_graphs.get_mut(&key)?;
        let buffers = self.prefill_buffers.get(&key)?;
        let ending = Ending::of(buffers.sampling.plan(), logits_only);
        let inputs = buffers.inputs();
        let columns = buffers.sampling.columns();
        let out = graph.replay(&mut self.cache, inputs, columns, ending, true);
        // Where a prefill step's host time goes (`RUST_LOG=ember_engine::step=trace`).
        tracing::trace!(
            tokens = shape.tokens,
            rows = shape.rows,
            write_us = written.as_micros() as u64,
            replay_and_wait_us = (started.elapsed() - written).as_micros() as u64,
            "prefill step inputs written and replayed"
        );
        out
    }

    /// Writes the step over `rows` (of `shape`) and `table` into the
    /// buffers of its shape, if that shape has a captured graph; returns
    /// the shape's key (`None`, nothing written, where it has none).
    fn write_prefill_step(
        &mut self,
        rows: &[PrefillSeq<'_>],
        shape: PrefillShape,
        table: &SamplingTable,
    ) -> Option<(usize, usize)> {
        let key = (shape.tokens, shape.rows);
        if !self.prefill_graphs.contains_key(&key) {
            return None;
        }
        let geometry = self.tables();
        let buffers = self.prefill_buffers.get_mut(&key)?;
        buffers.write(PrefillHost::new(rows, shape, geometry));
        buffers.sampling.write(table);
        Some(key)
    }
}
