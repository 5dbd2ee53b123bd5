//! Per-row token choice, ending in ONE device->host read of the `[B]` chosen
//! ids.
//!
//! - A batch whose every row takes the argmax of the raw logits
//!   ([`SamplingTable::takes_graph_argmax`]) takes the fast path: the argmax
//!   a replayed decode graph already computed (or `argmax`).
//! - Otherwise the rows that change their logits get them changed first
//!   ([`super::transforms`]), then one op chooses every row's token
//!   ([`sample_rows`]): greedy rows the argmax (lowest index on ties),
//!   sampled rows an exact draw from the tempered softmax over what top-k,
//!   top-p and min-p keep (their intersection, in transformers' order), the
//!   draw keyed by the request's seed and the position sampled
//!   ([`super::philox`]), so it does not depend on the batch. On CUDA it is
//!   the kernel `ops::cuda::kernels::sample_rows`, one launch; on the CPU
//!   [`super::row_sampler`] over the logits, the kernel's spec.
//! - A step's rows arrive as a [`SamplingTable`]; [`SamplingParamsRows`]
//!   holds their parameter columns (`crate::ops::row_params`' layout) as
//!   device buffers, which a decode bucket rewrites only when they change.

use burn::prelude::*;
use burn::tensor::DType;

use super::device_sampler::DeviceSampling;
use super::mask_rows::MaskRows;
use super::plan::{Route, StepOptions, StepPlan};
use super::row_sampler;
use super::table::SamplingTable;
use super::transforms;
use crate::error::EngineError;
use crate::ops::row_params::{self, RowParams, FLOAT_COLS, INT_COLS};
use crate::ops::vocab::argmax_rows;
use crate::ops::InputBuffer;
use crate::params::SamplingParams;

/// The kernel's view of a request's sampling parameters.
pub fn row_params(p: &SamplingParams) -> RowParams {
    RowParams {
        temperature: p.temperature,
        // 0 and -1 are off (so is anything below 1); 1 is greedy.
        top_k: p.top_k.max(0) as u32,
        top_p: p.top_p,
        min_p: p.min_p,
        seed: p.seed_or_default(),
    }
}

/// Handles to a [`SamplingParamsRows`]' device columns, for a step that
/// chooses its tokens on the device ([`choose_on_device`]).
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct SampleColumns {
    floats: Tensor<2>,
    ints: Tensor<2, Int>,
    positions: Tensor<1, Int>,
    /// The penalty counts table (`super::penalty_state`), where it exists.
    counts: Option<Tensor<2, Int>>,
    /// The rows' allowed-token masks (`super::mask_rows`), where the kernel
    /// runs.
    allowed: Option<Tensor<2, Int>>,
    kernel: bool,
}

/// Every row's token `[B, 1]` from `logits` `[B, vocab]` on the device: the
/// sampling kernel where it runs (CUDA, its keys fitting in shared memory),
/// reading `columns`, so every row's own sampling is honoured; elsewhere the
/// argmax of the raw logits, which serves greedy rows only (the CPU samples
/// its sampled rows on the host, after the step).
pub fn choose_on_device(logits: Tensor<2>, columns: &SampleColumns) -> Tensor<2, Int> {
    choose(logits, columns, false)
}

/// [`choose_on_device`] inside a decode graph: each penalized row's choice
/// is also added to its device counts (`super::penalty_state`), so a step
/// that takes the graph's choices needs no launch after it.
pub fn choose_in_graph(logits: Tensor<2>, columns: &SampleColumns) -> Tensor<2, Int> {
    choose(logits, columns, true)
}

fn choose(logits: Tensor<2>, columns: &SampleColumns, count: bool) -> Tensor<2, Int> {
    #[cfg(feature = "cuda")]
    if columns.kernel {
        let ids = crate::ops::cuda::sample_rows(
            logits,
            columns.floats.clone(),
            columns.ints.clone(),
            columns.positions.clone(),
            columns.allowed.clone(),
            columns.counts.clone(),
            None,
        );
        if let (true, Some(counts)) = (count, &columns.counts) {
            super::penalty_state::record_choices(counts, &ids, columns.ints.clone(), false);
        }
        return ids;
    }
    #[cfg(not(feature = "cuda"))]
    let _ = (columns, count);
    argmax_rows(logits)
}

/// Per-row sampling parameters as device tensors in `row_params`' layout
/// (`[B, FLOAT_COLS]` f32, `[B, INT_COLS]` i32) plus each row's position
/// (`[B]`), written from a step's [`SamplingTable`]. Decode keeps one per
/// bucket and rewrites the columns only when a row's parameters changed;
/// prefill builds a fresh one.
#[derive(Debug)]
pub struct SamplingParamsRows {
    floats: InputBuffer<2, Float>,
    ints: InputBuffer<2, Int>,
    positions: InputBuffer<1, Int>,
    /// The columns as last written (a write that changes nothing is skipped).
    written: (Vec<f32>, Vec<i32>),
    /// Every row greedy: what an all-greedy step needs in the columns (a
    /// replayed graph's kernel reads them), made once.
    greedy: (Vec<f32>, Vec<i32>),
    /// The positions as last written.
    written_positions: Vec<i32>,
    /// How the last write's step chooses its tokens ([`StepPlan`]).
    plan: StepPlan,
    /// The last write's logit transforms, uploaded with it (before the
    /// forward: [`transforms`]); `None` when no row changes its logits.
    transforms: Option<transforms::Prepared>,
    /// The vocabulary's bitmask positions, made on the first step with an
    /// allowed set.
    token_bits: Option<transforms::TokenBits>,
    /// Whether the sampling kernel chooses the tokens ([`DeviceSampling`]).
    kernel: bool,
    /// The penalty counts table the kernel reads for rows with a slot
    /// ([`SamplingParamsRows::with_counts`]).
    counts: Option<Tensor<2, Int>>,
    /// The rows' masks, read by the kernel (where it runs; elsewhere the
    /// host transforms apply bans and allowed sets).
    masks: Option<MaskRows>,
    rows: usize,
    vocab: usize,
    device: Device,
}

impl SamplingParamsRows {
    /// Buffers for `rows` rows over a vocabulary of `vocab` tokens, all
    /// greedy, sampled where `sampling` says.
    pub fn new(rows: usize, vocab: usize, device: &Device, sampling: DeviceSampling) -> Self {
        let greedy = row_params::columns(&[], &[], rows);
        let kernel = sampling.kernel;
        Self {
            floats: InputBuffer::zeros_dtype([rows, FLOAT_COLS], device, DType::F32),
            ints: InputBuffer::zeros([rows, INT_COLS], device),
            positions: InputBuffer::zeros([rows], device),
            written: greedy.clone(),
            greedy,
            written_positions: vec![0; rows],
            plan: StepPlan::ARGMAX,
            transforms: None,
            token_bits: None,
            kernel,
            counts: None,
            masks: None,
            rows,
            vocab,
            device: device.clone(),
        }
    }

    /// These buffers as a decode bucket keeps them, where the kernel runs:
    /// with the penalty counts table `counts` (made once by the runner,
    /// `super::PenaltyState`), read for every row with a slot, and the
    /// rows' masks, made now (a graph captured over the buffers must see
    /// both; a prefill's buffers make their masks when a row needs one).
    pub fn resident(mut self, counts: Option<Tensor<2, Int>>) -> Self {
        if self.kernel {
            self.counts = counts;
            self.masks = Some(MaskRows::new(self.rows, self.vocab, &self.device));
        }
        self
    }

    /// How the last write's step chooses its tokens (the one place a step's
    /// route is decided: [`super::plan`]).
    pub fn plan(&self) -> StepPlan {
        self.plan
    }

    /// Handles to the device columns (valid until the next write off CUDA,
    /// where a write replaces the tensors).
    pub fn columns(&self) -> SampleColumns {
        SampleColumns {
            floats: self.floats.tensor(),
            ints: self.ints.tensor(),
            positions: self.positions.tensor(),
            counts: self.counts.clone(),
            allowed: self.masks.as_ref().map(MaskRows::tensor),
            kernel: self.kernel,
        }
    }

    /// Writes `table`'s rows (rows past them are greedy padding), and uploads
    /// the logit transforms of rows that change their logits. Columns and
    /// positions are uploaded only when they changed; an all-greedy step (the
    /// common one, on the decode hot path) builds nothing: it compares the
    /// columns with the greedy ones and writes them only after a sampled
    /// step, and writes no positions (greedy rows read none).
    pub fn write(&mut self, table: &SamplingTable) {
        debug_assert!(table.len() <= self.rows);
        let argmax_only = table.all_take_graph_argmax();
        let any_mask =
            (0..table.len()).any(|i| table.allowed[i].is_some() || !table.banned[i].is_empty());
        if self.kernel && self.masks.is_none() && any_mask {
            self.masks = Some(MaskRows::new(self.rows, self.vocab, &self.device));
        }
        // Where the kernel masks (bans, allowed sets), only edits are left
        // to the host transforms.
        let edits_only = self.masks.is_some();
        let host_work = match edits_only {
            true => table.edits.iter().any(|e| !e.is_empty()),
            false => table.any_changes_logits(),
        };
        self.transforms = host_work.then(|| {
            let (v, device) = (self.vocab, &self.device);
            let bits = self
                .token_bits
                .get_or_insert_with(|| transforms::TokenBits::new(v, device));
            transforms::Prepared::new(table, self.rows, v, bits, device, edits_only)
        });
        let mut options = StepOptions {
            device_penalties: table.any_device_penalty(),
            masked: false,
            host_edits: self.transforms.is_some(),
        };
        self.plan = StepPlan::new(self.kernel, argmax_only, options);
        if argmax_only {
            if self.written != self.greedy {
                self.write_columns(self.greedy.clone());
            }
            return;
        }
        let params: Vec<RowParams> = table.sampling.iter().map(row_params).collect();
        let masked = match self.masks.as_mut() {
            Some(masks) => masks.write(table),
            None => Vec::new(),
        };
        options.masked = masked.iter().any(|&m| m);
        self.plan.options = options;
        let mut columns = row_params::columns(&params, &masked, self.rows);
        for (i, penalty) in table.penalty.iter().enumerate() {
            if let Some(p) = penalty {
                // A slot is only given where the kernel reads the counts.
                debug_assert!(self.counts.is_some(), "a penalty slot without counts");
                p.write_into(&mut columns, i);
            }
        }
        if columns != self.written {
            self.write_columns(columns);
        }
        // Only sampled rows read their position (greedy rows with options
        // do not).
        if (0..table.len()).all(|i| table.is_greedy(i)) {
            return;
        }
        let mut positions = vec![0i32; self.rows];
        for (p, &pos) in positions.iter_mut().zip(&table.pos) {
            *p = pos as i32;
        }
        if positions != self.written_positions {
            self.positions.write(positions.clone());
            self.written_positions = positions;
        }
    }

    /// Uploads `columns` and remembers them as written.
    fn write_columns(&mut self, columns: (Vec<f32>, Vec<i32>)) {
        self.floats.write(columns.0.clone());
        self.ints.write(columns.1.clone());
        self.written = columns;
    }
}

/// A step's chosen ids: still on the device (the `[B, 1]` ids, not read
/// yet), or already on the host (the CPU's row sampler read the logits).
/// One is made and moved once a step (a tensor handle is large; boxing it
/// would only add an allocation).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Chosen {
    Device(Tensor<2, Int>),
    Host(Vec<u32>),
}

/// Picks one token per row of `logits` (`[B, vocab]`, B = the parameters'
/// rows, last written from `table`) and reads back the table's rows' ids:
/// the step's one device->host read ([`choose_step`], then [`read_chosen`]).
pub fn sample(
    logits: Tensor<2>,
    chosen: Option<Tensor<2, Int>>,
    params: &SamplingParamsRows,
    table: &SamplingTable,
) -> Result<Vec<u32>, EngineError> {
    let real = table.len().min(params.rows);
    read_chosen(choose_step(logits, chosen, params, table)?, real)
}

/// Picks one token per row of `logits` without reading it back (see
/// [`sample`]). `chosen`, the ids the step already chose on the device with
/// these parameters' columns (a replayed decode graph,
/// [`choose_on_device`]), is used when it serves every row: no row changes
/// its logits, and either the kernel chose them (each row's sampling
/// honoured) or every row is greedy. Otherwise the rows whose logits change
/// ([`SamplingTable::changes_logits`]) get them changed
/// ([`super::transforms`]) and every row is chosen again ([`sample_rows`]):
/// on the device where the kernel runs, else on the host (the CPU).
pub fn choose_step(
    logits: Tensor<2>,
    chosen: Option<Tensor<2, Int>>,
    params: &SamplingParamsRows,
    table: &SamplingTable,
) -> Result<Chosen, EngineError> {
    let [b, _] = logits.dims();
    debug_assert_eq!(b, params.rows);
    let real = table.len().min(b);
    match params.plan.route {
        // The graph's choice where it made one (penalized rows counted there).
        Route::Argmax => Ok(Chosen::Device(
            chosen.unwrap_or_else(|| argmax_rows(logits)),
        )),
        Route::Kernel => match chosen {
            Some(ids) => Ok(Chosen::Device(ids)),
            None => sample_rows(logits, params, real),
        },
        Route::EditsThenKernel => {
            // Chosen again below: a replayed kernel's choice is not the step's.
            if let Some(ids) = &chosen {
                record_penalized(params, ids, true);
            }
            sample_rows(edited(logits, params), params, real)
        }
        Route::Host => sample_rows(edited(logits, params), params, real),
    }
}

/// `logits` with the last write's host edits applied (as they are without).
fn edited(logits: Tensor<2>, params: &SamplingParamsRows) -> Tensor<2> {
    match &params.transforms {
        Some(prepared) => transforms::apply(logits, prepared),
        None => logits,
    }
}

/// The first `real` ids of a step's choice, read back if still on the device.
pub fn read_chosen(chosen: Chosen, real: usize) -> Result<Vec<u32>, EngineError> {
    match chosen {
        Chosen::Device(ids) => read_ids(ids, real),
        Chosen::Host(mut ids) => {
            ids.truncate(real);
            Ok(ids)
        }
    }
}

/// Adds the step's final choice `ids` of rows with a penalty slot to their
/// device counts (`super::penalty_state`), queued before the ids are read;
/// with `undo`, takes a graph's choice back.
fn record_penalized(params: &SamplingParamsRows, ids: &Tensor<2, Int>, undo: bool) {
    if let (true, Some(counts)) = (params.plan.options.device_penalties, &params.counts) {
        super::penalty_state::record_choices(counts, ids, params.ints.tensor(), undo);
    }
}

/// Reads the `[B, 1]` ids back as they are (no reshape or slice queued
/// before the read: a greedy step's ids come straight from the graph's
/// output) and keeps the first `real` (the padding rows are dropped here).
fn read_ids(ids: Tensor<2, Int>, real: usize) -> Result<Vec<u32>, EngineError> {
    let data = ids
        .try_into_data()
        .map_err(|e| EngineError::Device(format!("{e:?}")))?;
    Ok(data
        .iter::<i64>()
        .take(real)
        .map(|x| x.clamp(0, u32::MAX as i64) as u32)
        .collect())
}

/// Every row's token (module docs) from `logits` `[B, vocab]` with the
/// parameters `params` holds (the first `real` rows' on the host). On CUDA
/// one launch of the kernel, its ids left on the device; elsewhere the host
/// row sampler.
fn sample_rows(
    logits: Tensor<2>,
    params: &SamplingParamsRows,
    real: usize,
) -> Result<Chosen, EngineError> {
    if params.kernel {
        let ids = choose_on_device(logits, &params.columns());
        record_penalized(params, &ids, false);
        return Ok(Chosen::Device(ids));
    }
    let [_, v] = logits.dims();
    let host = logits
        .cast(DType::F32)
        .try_into_data()
        .map_err(|e| EngineError::Device(format!("{e:?}")))?
        .try_into_vec::<f32>()
        .map_err(|e| EngineError::Device(format!("{e:?}")))?;
    let (floats, ints) = &params.written;
    let positions = &params.written_positions;
    let traces = row_sampler::trace_rows_host(
        &host[..real * v],
        v,
        &floats[..real * FLOAT_COLS],
        &ints[..real * INT_COLS],
        &positions[..real],
        None,
    );
    Ok(Chosen::Host(traces.into_iter().map(|t| t.token).collect()))
}

#[cfg(test)]
pub(super) mod tests;
