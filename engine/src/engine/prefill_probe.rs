//! The bench's probe of a captured prefill step against the eager one
//! (issue 45), over real prompts: the runner's reads
//! (`crate::step::StepRunner::kv_at`, `prefill_buffers_differ`,
//! `recapture_prefill_over`) put together on reserved blocks.

use burn::prelude::*;
use burn::tensor::DType;

use super::Engine;
use crate::error::EngineError;
use crate::step::{PrefillSeq, StepRunner};

/// What the probe saw (see [`Engine::probe_prefill_graph`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillProbe {
    /// Buffers not holding the step after its replay (empty: all do).
    pub buffers_differ: Vec<&'static str>,
    /// Per layer, max |replayed - eager| of the K and of the V it wrote.
    pub kv_diffs: Vec<(f32, f32)>,
    /// Max |replayed - eager| of the rows' logits.
    pub logits_diff: f32,
    /// The same for a second replay on the same blocks after the eager step
    /// (which left the step's own K/V in them).
    pub after_eager_diff: f32,
    /// The same after the shape was captured again over this very step
    /// (`None`: no hardware graph came of it).
    pub recaptured_diff: Option<f32>,
}

impl Engine {
    /// Replays `prompts`' prefill step from its captured graph
    /// (`Engine::capture_prefill_graphs` first), runs it eager on the same
    /// blocks, and compares buffers, every layer's K/V and the logits; then
    /// captures the shape over this step and compares again. An error where
    /// the shape has no graph.
    pub fn probe_prefill_graph(
        &mut self,
        prompts: &[Vec<u32>],
    ) -> Result<PrefillProbe, EngineError> {
        let probe = self.on_reserved(prompts, probe_rows)?;
        probe.ok_or_else(|| EngineError::InvalidConfig("no captured prefill step".into()))
    }
}

/// The probe over `rows` (blocks reserved).
fn probe_rows(runner: &mut StepRunner, rows: &[PrefillSeq<'_>]) -> Option<PrefillProbe> {
    let replayed = floats(runner.logits_replayed(rows)?);
    let buffers_differ = runner.prefill_buffers_differ(rows)?;
    let kv_replayed = runner.kv_at(rows);
    let eager = floats(runner.logits(rows));
    let kv_eager = runner.kv_at(rows);
    let again = floats(runner.logits_replayed(rows)?);
    let kv_diffs = kv_replayed
        .into_iter()
        .zip(kv_eager)
        .map(|((kr, vr), (ke, ve))| (max_diff(&kr, &ke), max_diff(&vr, &ve)))
        .collect();
    let recaptured_diff = match runner.recapture_prefill_over(rows) {
        true => Some(max_diff(&floats(runner.logits_replayed(rows)?), &eager)),
        false => None,
    };
    Some(PrefillProbe {
        buffers_differ,
        kv_diffs,
        logits_diff: max_diff(&replayed, &eager),
        after_eager_diff: max_diff(&again, &eager),
        recaptured_diff,
    })
}

fn floats(t: Tensor<2>) -> Vec<f32> {
    t.cast(DType::F32).into_data().iter::<f32>().collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
