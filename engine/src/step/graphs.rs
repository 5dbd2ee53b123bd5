//! Steps replayed as captured CUDA graphs: one per decode bucket, and one
//! per small prefill shape.
//!
//! An eager step launches hundreds of kernels and the host spends
//! milliseconds issuing them; a CUDA graph records the launches once and
//! replays them with one driver call. What makes that possible here:
//!
//! - every input of a step lives in persistent device buffers, one set per
//!   shape ([`super::buffers`] for a decode bucket, [`super::prefill_buffers`]
//!   for a prefill shape), rewritten in place before each replay;
//! - attention reads block tables, context lengths and (prefill) segment
//!   offsets and tiles from those buffers, so a step's kernels and shapes do
//!   not depend on the context or on how the prompts split the bucket;
//! - the KV write is a kernel that writes the cache buffers in place, so the
//!   graph writes the memory the engine (and every other graph) reads.
//!
//! The graph is captured by [`burn::tensor::capture`] around a closure that
//! runs the step. The closure takes the step's inputs and the KV cache from a
//! [`StepSlot`] shared with the engine rather than owning copies: on a backend
//! without graphs (the CPU) `replay` re-runs the closure, and it must then see
//! this step's inputs and move the engine's cache through the model like an
//! eager step does. On CUDA the slot only carries the same buffers every time.
//!
//! Each bucket has three graphs of the same step, differing in how it ends
//! ([`Ending`]): `plain`, the argmax of the raw logits (an all-greedy step
//! without options: the seeds' and most benchmarks' steps, where a
//! per-row sampling kernel would only add GPU time); `sampled`, the
//! sampling kernel over every row's parameters (and its penalty counts);
//! and `forward`, the logits alone, for a step whose choice must wait for
//! host work the forward can run beside (a grammar's allowed sets, in the
//! overlapped loop). The step's sampling columns pick one per replay. A
//! prefill step needs no `forward` graph (its grammar rows wait for the
//! logits anyway): asked for the logits alone, it replays `plain`.
//!
//! A capture that did not produce a hardware graph is reported by
//! [`StepGraph::is_hardware`]; the engine then logs it once and runs eager
//! steps (never a wrong result).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use burn::prelude::*;
use burn::tensor::{capture, Graph};

use super::forward::forward;
use super::inputs::StepInputs;
use crate::model::{Gpt2, KvCache};
use crate::ops::vocab::argmax_rows;
use crate::ops::Ops;
use crate::sampling::{choose_in_graph, Route, SampleColumns, StepPlan};

type Captured = Graph<Option<GraphOutput>, StepClosure>;

/// What one step hands the captured closure, and what it hands back.
#[derive(Default)]
struct StepSlot {
    inputs: Option<StepInputs>,
    columns: Option<SampleColumns>,
    cache: Option<KvCache>,
}

/// A step's device results: the logits `[B, vocab]` and each row's
/// token as the device chose it (captured with the step, so a step whose
/// rows change no logits launches nothing after the replay: the argmax in
/// the `plain` graph; in the `sampled` one, on CUDA, the sampling kernel,
/// greedy and sampled rows alike, elsewhere the argmax; none in `forward`).
pub type GraphOutput = (Tensor<2>, Option<Tensor<2, Int>>);

/// How a captured step ends (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The argmax of the raw logits.
    Argmax,
    /// The sampling kernel over the bucket's parameter columns.
    Sampled,
    /// Nothing: the logits are the output.
    Logits,
}

impl Ending {
    /// The ending a replayed step takes under `plan` (with
    /// `logits_only`, a step whose choice waits for host work: the logits).
    pub fn of(plan: StepPlan, logits_only: bool) -> Self {
        match (logits_only, plan.route) {
            (true, _) => Ending::Logits,
            (false, Route::Argmax) => Ending::Argmax,
            (false, _) => Ending::Sampled,
        }
    }
}

type StepClosure = Box<dyn FnMut() -> Option<GraphOutput> + Send>;

/// One step shape's captured step (a decode bucket or a prefill shape).
pub struct StepGraph {
    /// Shared with the closure. Only the engine's thread ever locks it (the
    /// `Arc<Mutex>` is what lets an engine be built on one thread and moved
    /// to its scheduler thread).
    slot: Arc<Mutex<StepSlot>>,
    /// The step with the argmax (module docs).
    plain: Captured,
    /// The step with the sampling kernel.
    sampled: Captured,
    /// The step up to the logits (decode steps only).
    forward: Option<Captured>,
    device: Device,
}

impl StepGraph {
    /// Captures the step `inputs` describe (the bucket's buffers, holding
    /// padding rows: the warmup and capture runs write only the padding
    /// block), with a `forward` graph when `with_forward`.
    pub fn capture(
        model: &Gpt2,
        ops: &Ops,
        cache: &mut KvCache,
        (inputs, columns): (StepInputs, SampleColumns),
        device: &Device,
        with_forward: bool,
    ) -> Self {
        let slot = Arc::new(Mutex::new(StepSlot::default()));
        let mut one = |ending: Ending| {
            {
                let mut filled = lock(&slot);
                filled.inputs = Some(inputs.clone());
                filled.columns = Some(columns.clone());
                filled.cache = Some(std::mem::take(cache));
            }
            let graph = capture(device, step_closure(model, ops, &slot, ending));
            if let Some(back) = lock(&slot).cache.take() {
                *cache = back;
            }
            graph
        };
        let plain = one(Ending::Argmax);
        let sampled = one(Ending::Sampled);
        let forward = with_forward.then(|| one(Ending::Logits));
        Self {
            slot,
            plain,
            sampled,
            forward,
            device: device.clone(),
        }
    }

    /// Whether replays are one hardware dispatch (not closure re-runs).
    pub fn is_hardware(&self) -> bool {
        let forward = self.forward.as_ref().is_none_or(Captured::is_hardware);
        self.plain.is_hardware() && self.sampled.is_hardware() && forward
    }

    /// The logits buffer the `forward` graph writes on every replay (what a
    /// captured choice half reads, `super::choice_graph`); `None` without a
    /// hardware `forward` graph.
    pub fn forward_logits(&self) -> Option<Tensor<2>> {
        let forward = self.forward.as_ref().filter(|f| f.is_hardware())?;
        forward.output().as_ref().map(|(logits, _)| logits.clone())
    }

    /// Runs the step with `inputs` and sampling `columns` (the bucket's
    /// buffers, already written for this step) through the graph of
    /// `ending`. Returns logits `[bucket, vocab]` and the device's choice
    /// (none for [`Ending::Logits`]), or `None` if the slot lost the cache (a
    /// bug; the caller goes eager). With `wait` they are complete on the device on
    /// return; without, the replay is only queued, and whatever reads its
    /// outputs must be queued behind it on the same stream (the overlapped
    /// step loop's read-back is).
    pub fn replay(
        &mut self,
        cache: &mut KvCache,
        inputs: StepInputs,
        columns: SampleColumns,
        ending: Ending,
        wait: bool,
    ) -> Option<GraphOutput> {
        {
            let mut slot = lock(&self.slot);
            slot.inputs = Some(inputs);
            slot.columns = Some(columns);
            slot.cache = Some(std::mem::take(cache));
        }
        // Safety: every buffer the graph touches is alive: the weights are
        // owned by the closure, the cache and input buffers by the engine for
        // as long as this graph (the engine drops its graphs first), and all
        // work runs on the engine thread's one stream.
        let graph = match (ending, self.forward.as_mut()) {
            (Ending::Logits, Some(forward)) => forward,
            (Ending::Argmax | Ending::Logits, _) => &mut self.plain,
            (Ending::Sampled, _) => &mut self.sampled,
        };
        let mut logits = unsafe { graph.replay() }.clone();
        if ending == Ending::Logits {
            logits = logits.map(|(logits, _)| (logits, None));
        }
        self.take_cache(cache);
        if wait {
            // A plain read of the output is not known to wait for the
            // replay (the spike's timing trap), so the synchronous step syncs.
            self.device.sync().ok()?;
        }
        logits
    }

    /// Replays the `plain` hardware graph `n` times back to back (the
    /// bucket's buffers as the last step left them) and waits for the
    /// device: a greedy step's GPU time without the host's per-step work,
    /// what the torch CUDA-graph peer reports. `false` for a closure graph
    /// (nothing run) or a failed sync.
    pub fn replay_back_to_back(&mut self, n: usize) -> bool {
        if !self.is_hardware() {
            return false;
        }
        for _ in 0..n {
            // Safety: as in `replay`; a hardware replay runs no closure, so
            // the cache stays with the engine, alive, while the device
            // rewrites the same slots with the same values.
            let _ = unsafe { self.plain.replay() };
        }
        self.device.sync().is_ok()
    }

    /// Milliseconds per replay of the `plain` graph, `n` replays back to
    /// back after 3 untimed ones ([`StepGraph::replay_back_to_back`]);
    /// `None` for a closure graph or a failed sync.
    pub fn time_replays(&mut self, n: usize) -> Option<f64> {
        if !self.replay_back_to_back(3) {
            return None;
        }
        let started = std::time::Instant::now();
        self.replay_back_to_back(n.max(1))
            .then(|| started.elapsed().as_secs_f64() * 1e3 / n.max(1) as f64)
    }

    /// Moves the cache back from the slot into `cache`.
    fn take_cache(&mut self, cache: &mut KvCache) {
        if let Some(back) = lock(&self.slot).cache.take() {
            *cache = back;
        }
    }
}

/// The step a graph records: the forward over the slot's inputs and cache,
/// then the tokens as `ending` says.
fn step_closure(
    model: &Gpt2,
    ops: &Ops,
    slot: &Arc<Mutex<StepSlot>>,
    ending: Ending,
) -> StepClosure {
    let shared = Arc::clone(slot);
    let (model, ops) = (model.clone(), ops.clone());
    Box::new(move || {
        let mut slot = lock(&shared);
        let inputs = slot.inputs.clone()?;
        let columns = slot.columns.clone()?;
        let mut cache = slot.cache.take()?;
        let logits = forward(&model, &ops, &mut cache, inputs);
        slot.cache = Some(cache);
        let chosen = match ending {
            Ending::Sampled => Some(choose_in_graph(logits.clone(), &columns)),
            Ending::Argmax => Some(argmax_rows(logits.clone())),
            Ending::Logits => None,
        };
        Some((logits, chosen))
    })
}

/// The slot, whatever a panicking holder left in it (it holds no invariant
/// beyond its two options).
fn lock(slot: &Mutex<StepSlot>) -> MutexGuard<'_, StepSlot> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}
