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
//! masks written, the sampling kernel, the same keep and read-back).
//!
//! Logprobs are not computed here: a step with a row that asks for them runs
//! synchronously ([`StepRunner::decode`]).

use burn::prelude::*;

use super::StepRunner;
use crate::error::EngineError;
use crate::ops::PendingIds;
use crate::sampling::{choose_step, Chosen, SamplingTable};
use crate::step::buffers::DecodeRow;

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
        let (logits, chosen, bucket) = self.run_decode(rows, Some(table), false);
        let buffers = &self.decode_buffers[&bucket];
        let chosen = choose_step(logits, chosen, &buffers.sampling, table)?;
        self.keep_and_read(chosen, bucket, rows.len())
    }

    /// The first half of a step queued in two (module docs): writes the
    /// inputs of a decode step over `rows` and queues its forward pass (the
    /// bucket's `forward` graph); returns the logits `[bucket, vocab]` and
    /// the bucket, for [`StepRunner::decode_choose`].
    pub fn decode_forward_queued(&mut self, rows: &[DecodeRow<'_>]) -> (Tensor<2>, usize) {
        let (logits, _, bucket) = self.run_decode(rows, None, false);
        (logits, bucket)
    }

    /// The second half: writes `table` (the step's `real` rows; a row whose
    /// sequence ended meanwhile may be any greedy row) into `bucket`'s
    /// sampling buffers, chooses every row's token from `logits` with the
    /// sampling kernel, keeps the choice and starts reading it back.
    pub fn decode_choose(
        &mut self,
        logits: Tensor<2>,
        bucket: usize,
        real: usize,
        table: &SamplingTable,
    ) -> Result<PendingIds, EngineError> {
        debug_assert!(!table.any_logprobs(), "logprobs run synchronously");
        let buffers = self
            .decode_buffers
            .get_mut(&bucket)
            .ok_or_else(|| EngineError::Device(format!("no decode buffers for bucket {bucket}")))?;
        let started = std::time::Instant::now();
        buffers.write_sampling(table);
        let written = started.elapsed();
        let chosen = choose_step(logits, None, &buffers.sampling, table)?;
        let launched = started.elapsed();
        let pending = self.keep_and_read(chosen, bucket, real);
        // Where the choice half's host time goes (`RUST_LOG=ember_engine::step=trace`).
        tracing::trace!(
            rows = real,
            columns_and_masks_written_us = written.as_micros() as u64,
            kernel_queued_us = (launched - written).as_micros() as u64,
            kept_and_read_us = (started.elapsed() - launched).as_micros() as u64,
            "decode choice queued"
        );
        pending
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
