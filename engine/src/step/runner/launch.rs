//! A decode step queued without waiting for its ids: the device half of the
//! overlapped step loop (`crate::engine::overlap`).
//!
//! [`StepRunner::decode_launch`] writes the step's inputs, replays the
//! bucket's graph (or runs the step eager), chooses every row's token (the
//! graph's choice, or host edits then the sampling kernel), keeps that choice
//! on the device in `last_chosen` (where the next step's rows fed
//! [`Feed::Previous`](crate::step::buffers::Feed) read it, so the next step
//! can be queued before the host knows a token), and starts reading the ids
//! back. On CUDA all of it is queued on the engine thread's stream and the
//! call returns while the GPU still runs the step; on the CPU every op has
//! run when it returns, and the same code path is exercised.
//!
//! A step whose choice needs host work the forward can run beside (a
//! grammar's allowed sets, which follow the previous step's tokens) is
//! queued in two halves: [`StepRunner::decode_forward_queued`] (the inputs
//! and the bucket's `forward` graph, up to the logits), then, once the host
//! has its sampling table, [`StepRunner::decode_choose`] (the columns and
//! masks written, then the bucket's choice graph: the sampling kernel and
//! the same keep in one launch, `crate::step::choice_graph`; then the
//! read-back).
//!
//! Logprobs are not computed here: a step with a row that asks for them runs
//! synchronously ([`StepRunner::decode`]).

use burn::prelude::*;

use super::StepRunner;
use crate::error::EngineError;
use crate::ops::PendingIds;
use crate::sampling::{choose_step, Chosen, SamplingTable};
use crate::step::buffers::DecodeRow;

/// A decode step's forward pass, queued ([`StepRunner::decode_forward_queued`]),
/// waiting for its choice ([`StepRunner::decode_choose`]).
pub struct ForwardHalf {
    /// `[bucket, vocab]`.
    logits: Tensor<2>,
    bucket: usize,
    /// Whether the bucket's `forward` graph computed `logits` (its output
    /// buffer, which the choice graph reads).
    replayed: bool,
}

impl StepRunner {
    /// Queues a decode step over `rows` (at most `max_batch`), row `i`
    /// sampled by row `i` of `table`, and starts reading its ids back
    /// (module docs). The step's choice is kept on the device for the next
    /// decode step, whatever the host does with it.
    pub fn decode_launch(
        &mut self,
        rows: &[DecodeRow<'_>],
        table: &SamplingTable,
    ) -> Result<PendingIds, EngineError> {
        debug_assert!(!table.any_logprobs(), "logprobs run synchronously");
        let run = self.run_decode(rows, Some(table), false);
        let buffers = &self.decode_buffers[&run.bucket];
        let chosen = choose_step(run.logits, run.chosen, &buffers.sampling, table)?;
        self.keep_and_read(chosen, run.bucket, rows.len())
    }

    /// The first half of a step queued in two (module docs): writes the
    /// inputs of a decode step over `rows` and queues its forward pass (the
    /// bucket's `forward` graph), for [`StepRunner::decode_choose`].
    pub fn decode_forward_queued(&mut self, rows: &[DecodeRow<'_>]) -> ForwardHalf {
        let run = self.run_decode(rows, None, false);
        ForwardHalf {
            logits: run.logits,
            bucket: run.bucket,
            replayed: run.replayed,
        }
    }

    /// The second half: writes `table` (the step's `real` rows; a row whose
    /// sequence ended meanwhile may be any greedy row) into the bucket's
    /// sampling buffers, chooses every row's token from the forward's
    /// logits with the sampling kernel (the bucket's choice graph where it
    /// serves: [`ForwardHalf::replayed`], and no row needs host edits or
    /// takes the plain argmax), keeps the choice and starts reading it back.
    pub fn decode_choose(
        &mut self,
        half: ForwardHalf,
        real: usize,
        table: &SamplingTable,
    ) -> Result<PendingIds, EngineError> {
        debug_assert!(!table.any_logprobs(), "logprobs run synchronously");
        let ForwardHalf {
            logits,
            bucket,
            replayed,
        } = half;
        let buffers = self
            .decode_buffers
            .get_mut(&bucket)
            .ok_or_else(|| EngineError::Device(format!("no decode buffers for bucket {bucket}")))?;
        let started = std::time::Instant::now();
        buffers.write_sampling(table);
        let written = started.elapsed();
        let graph = self
            .choice_graphs
            .get_mut(&bucket)
            .filter(|_| replayed && buffers.sampling.plan().kernel_alone());
        let pending = match graph {
            Some(graph) => {
                let ids = graph.replay();
                let pending = PendingIds::start(ids, real).map_err(EngineError::Device);
                self.check_library_calls()?;
                pending?
            }
            None => {
                let chosen = choose_step(logits, None, &buffers.sampling, table)?;
                self.keep_and_read(chosen, bucket, real)?
            }
        };
        // Where the choice half's host time goes (`RUST_LOG=ember_engine::step=trace`).
        tracing::trace!(
            rows = real,
            graph = replayed && self.choice_graphs.contains_key(&bucket),
            columns_and_masks_written_us = written.as_micros() as u64,
            chosen_and_read_us = (started.elapsed() - written).as_micros() as u64,
            "decode choice queued"
        );
        Ok(pending)
    }

    /// Keeps a step's choice on the device for the next step (`last_chosen`)
    /// and starts reading its first `real` ids back.
    fn keep_and_read(
        &mut self,
        chosen: Chosen,
        bucket: usize,
        real: usize,
    ) -> Result<PendingIds, EngineError> {
        let pending = match chosen {
            Chosen::Device(ids) => {
                let leading = self.decode_buffers[&bucket].last_rows.clone();
                self.last_chosen.write_leading_rows(ids.clone(), leading);
                PendingIds::start(ids, real).map_err(EngineError::Device)?
            }
            Chosen::Host(mut ids) => {
                let mut kept = vec![0i32; self.shape.max_batch];
                for (k, &id) in kept.iter_mut().zip(&ids) {
                    *k = id as i32;
                }
                self.last_chosen.write(kept);
                ids.truncate(real);
                PendingIds::Ready(ids)
            }
        };
        self.check_library_calls()?;
        Ok(pending)
    }
}
