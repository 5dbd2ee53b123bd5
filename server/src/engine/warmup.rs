//! Startup warmup: run every step shape the server will use before it reports
//! SERVING.
//!
//! On CUDA (bucketed shapes) the first run of a shape compiles its kernels
//! (NVRTC) and autotunes its matmuls, which takes from milliseconds to seconds;
//! doing it here keeps that out of the first requests' latency, and with the
//! caches persisted on disk a restart finds them ready. The shapes are every
//! decode bucket (decode shapes do not depend on the context: attention walks
//! the block tables), greedy and sampling, and every prefill bucket
//! (rows x length) the prefill knobs allow. Warmup steps run padding rows
//! only: they take no blocks and leave no sequence behind. With decode graphs
//! on, each decode bucket's step is then captured ([`super::graphs`]).
//!
//! On the CPU (unbucketed) there is nothing to compile or tune; one small
//! prefill and one decode step touch the weights and start the thread pool.

use std::time::Instant;

use super::batch::{prefill_inputs, PrefillShape};
use super::graphs::DecodeGraph;
use super::runner::{prepare_decode, DecodeGeometry, Engine};
use super::sampler::{sample, RowChoice, SamplingParamsRows};
use super::EngineError;

/// What a warmup did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupReport {
    /// Distinct decode shapes run (bucket x sampling path).
    pub decode_shapes: usize,
    /// Distinct prefill shapes run.
    pub prefill_shapes: usize,
    /// Decode buckets captured as hardware CUDA graphs.
    pub graphs: usize,
    pub seconds: f64,
}

/// A sampling row that takes the top-k/top-p threshold path.
const FILTERING_ROW: RowChoice = RowChoice::Sample {
    temperature: 0.8,
    top_k: 40,
    top_p: 0.95,
    uniform: 0.5,
};

impl Engine {
    /// Runs the step shapes the server will use (see the module docs) with
    /// prefill batches of at most `prefill_max_batch` prompts and
    /// `prefill_max_tokens` tokens.
    pub fn warmup(
        &mut self,
        prefill_max_batch: usize,
        prefill_max_tokens: usize,
    ) -> Result<WarmupReport, EngineError> {
        let started = Instant::now();
        let (decode, prefill) = if self.bucketed {
            (
                self.decode_shapes(),
                self.prefill_shapes(prefill_max_batch, prefill_max_tokens),
            )
        } else {
            (
                vec![1],
                vec![PrefillShape {
                    rows: 1,
                    len: 16.min(self.config.n_positions),
                }],
            )
        };
        for &shape in &prefill {
            self.warm_prefill(shape)?;
        }
        for &bucket in &decode {
            self.warm_decode(bucket, &[])?;
            if self.bucketed {
                self.warm_decode(bucket, &[FILTERING_ROW])?;
            }
        }
        let graphs = if self.decode_graphs {
            self.capture_decode_graphs(&decode)
        } else {
            0
        };
        let report = WarmupReport {
            decode_shapes: decode.len() * if self.bucketed { 2 } else { 1 },
            prefill_shapes: prefill.len(),
            graphs,
            seconds: started.elapsed().as_secs_f64(),
        };
        tracing::info!(
            decode_shapes = report.decode_shapes,
            prefill_shapes = report.prefill_shapes,
            graphs = report.graphs,
            seconds = report.seconds,
            "engine warmed up"
        );
        Ok(report)
    }

    /// Every decode bucket.
    fn decode_shapes(&self) -> Vec<usize> {
        powers_of_two_up_to(self.max_batch)
    }

    /// Captures the decode step of the bucket of each of `batch_sizes` (see
    /// [`super::graphs`]).
    /// On CUDA a capture that yields no hardware graph is logged and dropped
    /// (those steps run eager); on the CPU the fallback graph, which re-runs
    /// the step, is kept. Returns the hardware graphs captured.
    pub fn capture_decode_graphs(&mut self, batch_sizes: &[usize]) -> usize {
        let geometry = DecodeGeometry::of(self);
        let mut buckets: Vec<usize> = batch_sizes.iter().map(|&n| self.decode_bucket(n)).collect();
        buckets.sort_unstable();
        buckets.dedup();
        let mut hardware = 0;
        for bucket in buckets {
            let started = Instant::now();
            let inputs = prepare_decode(&mut self.decode_buffers, &geometry, bucket, &[], &[]);
            let graph = DecodeGraph::capture(&self.model, &mut self.cache, inputs, &self.device);
            let is_hardware = graph.is_hardware();
            tracing::debug!(
                bucket,
                is_hardware,
                seconds = started.elapsed().as_secs_f64(),
                "captured a decode step"
            );
            if is_hardware {
                hardware += 1;
            } else if cfg!(feature = "cuda") && self.bucketed {
                tracing::warn!(
                    bucket,
                    "CUDA graph capture of a decode step failed; that bucket runs eager"
                );
                continue;
            }
            self.graphs.insert(bucket, graph);
        }
        hardware
    }

    /// Every prefill bucket reachable under the prefill knobs: rows up to the
    /// bucket of `max_batch`, lengths up to the context window, and no more
    /// real tokens than `max_tokens` (a bucket of `rows` holds more than
    /// `rows / 2` prompts, each of more than `len / 2` tokens, or one prompt).
    fn prefill_shapes(&self, max_batch: usize, max_tokens: usize) -> Vec<PrefillShape> {
        let mut shapes = Vec::new();
        let rows = powers_of_two_up_to(max_batch.max(1).next_power_of_two());
        let longest = self.config.n_positions;
        for &r in &rows {
            let mut len = self.prefill_shape(1, 1).len;
            loop {
                let shape = self.prefill_shape(r, len);
                let fewest_tokens = (r / 2 + 1) * (shape.len / 2 + 1);
                if r == 1 || fewest_tokens <= max_tokens {
                    shapes.push(shape);
                }
                if shape.len >= longest {
                    break;
                }
                len = shape.len + 1;
            }
        }
        shapes.dedup();
        shapes
    }

    fn warm_prefill(&mut self, shape: PrefillShape) -> Result<(), EngineError> {
        let pad_slot = self.blocks.padding_block() as usize * self.block_size;
        let inputs = prefill_inputs(&[], shape, self.block_size, pad_slot, &self.device);
        let logits = super::runner::forward(&self.model, &mut self.cache, inputs);
        let params = SamplingParamsRows::new(shape.rows, self.config.vocab_size, &self.device);
        sample(logits, &params, 1).map(drop)
    }

    fn warm_decode(&mut self, bucket: usize, choices: &[RowChoice]) -> Result<(), EngineError> {
        let geometry = DecodeGeometry::of(self);
        let inputs = prepare_decode(&mut self.decode_buffers, &geometry, bucket, &[], choices);
        let logits = super::runner::forward(&self.model, &mut self.cache, inputs);
        sample(logits, &self.decode_buffers[&bucket].sampling, 1).map(drop)
    }
}

/// 1, 2, 4, ... below `max`, then `max` (empty for 0).
pub(super) fn powers_of_two_up_to(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|&n| n < max)
        .collect();
    if max > 0 {
        v.push(max);
    }
    v
}
