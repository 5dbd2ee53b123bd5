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
//! on, each decode bucket's step is then captured (`crate::step::graphs`).
//!
//! On the CPU (unbucketed) there is nothing to compile or tune; one small
//! prefill and one decode step touch the weights and start the thread pool.

use std::time::Instant;

use crate::error::EngineError;
use crate::sampling::RowChoice;
use crate::step::{PrefillShape, StepRunner};

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

/// The knobs that bound the shapes a warmup runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most prompts in one prefill step.
    pub prefill_max_batch: usize,
    /// Most prompt tokens in one prefill step.
    pub prefill_max_tokens: usize,
    /// Capture each decode bucket's step as a graph afterwards.
    pub decode_graphs: bool,
}

/// Runs the step shapes the server will use (see the module docs) on
/// `runner`, then captures the decode graphs if asked.
pub fn run(runner: &mut StepRunner, limits: Limits) -> Result<WarmupReport, EngineError> {
    let started = Instant::now();
    let bucketed = runner.shape().bucketed;
    let (decode, prefill) = if bucketed {
        (
            powers_of_two_up_to(runner.shape().max_batch),
            prefill_shapes(runner, limits.prefill_max_batch, limits.prefill_max_tokens),
        )
    } else {
        let len = 16.min(runner.model_config().n_positions);
        (vec![1], vec![PrefillShape { rows: 1, len }])
    };
    for &shape in &prefill {
        runner.warm_prefill(shape)?;
    }
    for &bucket in &decode {
        runner.warm_decode(bucket, &[])?;
        if bucketed {
            runner.warm_decode(bucket, &[FILTERING_ROW])?;
        }
    }
    let graphs = if limits.decode_graphs {
        runner.capture_decode_graphs(&decode)
    } else {
        0
    };
    let report = WarmupReport {
        decode_shapes: decode.len() * if bucketed { 2 } else { 1 },
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

/// Every prefill bucket reachable under the prefill knobs: rows up to the
/// bucket of `max_batch`, lengths up to the context window, and no more
/// real tokens than `max_tokens` (a bucket of `rows` holds more than
/// `rows / 2` prompts, each of more than `len / 2` tokens, or one prompt).
fn prefill_shapes(runner: &StepRunner, max_batch: usize, max_tokens: usize) -> Vec<PrefillShape> {
    let mut shapes = Vec::new();
    let rows = powers_of_two_up_to(max_batch.max(1).next_power_of_two());
    let longest = runner.model_config().n_positions;
    for &r in &rows {
        let mut len = runner.prefill_shape(1, 1).len;
        loop {
            let shape = runner.prefill_shape(r, len);
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

/// 1, 2, 4, ... below `max`, then `max` (empty for 0).
pub fn powers_of_two_up_to(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|&n| n < max)
        .collect();
    if max > 0 {
        v.push(max);
    }
    v
}
