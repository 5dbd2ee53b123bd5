//! Startup warmup: run every step shape the server will use before it reports
//! SERVING.
//!
//! On CUDA (bucketed shapes) the first run of a shape compiles its kernels
//! (NVRTC) and autotunes its matmuls, which takes from milliseconds to seconds;
//! doing it here keeps that out of the first requests' latency, and with the
//! caches persisted on disk a restart finds them ready. The shapes are every
//! decode bucket (decode shapes do not depend on the context: attention walks
//! the block tables), greedy and sampling, and every prefill shape the
//! prefill knobs allow: a prefill step is one flat sequence of its rows'
//! tokens, so its shape is its token bucket (and a row bucket, which the
//! token bucket fixes while the prefill row knob stays within the decode
//! batch: `crate::step::shapes`). Fresh prompts, chunks and prefix-cache
//! hits share these shapes. Warmup steps run padding only: they take no
//! blocks and leave no sequence behind. With CUDA graphs on, each decode
//! bucket's step and each prefill shape of at most
//! `crate::step::PREFILL_GRAPH_MAX_TOKENS` tokens is then captured
//! (`crate::step::graphs`): a short prompt's step is one graph replay, not a
//! few hundred launches.
//!
//! Before any of that, on CUDA, the projection kernels are timed against
//! each other at every decode bucket's and prefill token bucket's shapes and
//! the fastest is recorded for the steps (and graphs) that follow
//! (`crate::ops::Ops::tune_linear`); a restart on the same kernel cache
//! directory reads those timings back instead (`crate::ops::tune_record`).
//! After the steps, the kernels over the vocabulary that logprobs and
//! prompt logprobs run are compiled (`StepRunner::warm_vocab_kernels`: on
//! CUDA Ember's own, one plan for every shape, so nothing is tuned).
//! Each phase's seconds are in the report and its log line. Then, on a
//! bucketed device, the engine runs a few requests with every option
//! (`super::warm_requests`): what options compile is compiled before
//! SERVING too.
//!
//! On the CPU (unbucketed) there is nothing to compile or tune; one small
//! prefill and one decode step touch the weights and start the thread pool.

use std::time::Instant;

use crate::error::EngineError;
use crate::params::SamplingParams;
use crate::sampling::{RowSampling, SamplingTable};
pub use crate::step::shapes::powers_of_two_up_to;
use crate::step::shapes::prefill_shapes;
use crate::step::StepRunner;

/// What a warmup did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupReport {
    /// Distinct decode shapes run (bucket x sampling path).
    pub decode_shapes: usize,
    /// Distinct prefill shapes run.
    pub prefill_shapes: usize,
    /// Decode buckets captured as hardware CUDA graphs.
    pub graphs: usize,
    /// Prefill shapes captured as hardware CUDA graphs.
    pub prefill_graphs: usize,
    /// Projection shapes whose kernel was chosen by timing (CUDA).
    pub tuned_shapes: usize,
    /// Of those, the shapes timed at this start; the rest had one
    /// candidate or were timed by an earlier start of this binary on this
    /// GPU (`crate::ops::tune_record`): 0 on a restart.
    pub timed_shapes: usize,
    /// Seconds the projection timing took (part of `seconds`).
    pub tune_seconds: f64,
    /// Seconds of the prefill shapes, the decode shapes, the vocabulary
    /// kernels and the graph captures (with `tune_seconds`, `seconds`).
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub vocab_seconds: f64,
    pub capture_seconds: f64,
    /// Requests with every option run through the engine after the shapes
    /// (`super::warm_requests`, bucketed devices), and their seconds.
    pub requests: usize,
    pub requests_seconds: f64,
    pub seconds: f64,
}

/// A step of one sampling row that takes the top-k/top-p threshold path.
pub(crate) fn filtering_table() -> SamplingTable {
    let mut table = SamplingTable::with_capacity(1);
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        seed: None,
    };
    table.push(RowSampling::plain(params, 1, None));
    table
}

/// Runs the step shapes the server will use (see the module docs) on
/// `runner` (its prefill bounds and decode buckets), then captures the
/// decode and small prefill graphs if `cuda_graphs`.
pub fn run(runner: &mut StepRunner, cuda_graphs: bool) -> Result<WarmupReport, EngineError> {
    let started = Instant::now();
    let shape = runner.shape();
    let bucketed = shape.bucketed;
    let (decode, prefill) = if bucketed {
        (
            powers_of_two_up_to(shape.max_batch),
            prefill_shapes(&shape, shape.prefill.max_rows, shape.prefill.max_tokens),
        )
    } else {
        (vec![1], vec![runner.prefill_shape(1, 16)])
    };
    let tune_started = Instant::now();
    let tuned = if bucketed {
        let tokens: Vec<usize> = prefill.iter().map(|s| s.tokens).collect();
        runner.tune_projections(&decode, &tokens)
    } else {
        Vec::new()
    };
    let tune_seconds = tune_started.elapsed().as_secs_f64();
    for t in &tuned {
        tracing::debug!(shape = ?t.shape, chosen = ?t.chosen, timings_us = ?t.timings, timed = t.timed, "projection kernel");
    }
    let phase = Instant::now();
    for &shape in &prefill {
        runner.warm_prefill(shape)?;
    }
    let prefill_seconds = phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    for &bucket in &decode {
        runner.warm_decode(bucket, &SamplingTable::default())?;
        if bucketed {
            runner.warm_decode(bucket, &filtering_table())?;
        }
    }
    let decode_seconds = phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    if bucketed {
        runner.warm_vocab_kernels()?;
    }
    let vocab_seconds = phase.elapsed().as_secs_f64();
    let phase = Instant::now();
    let (graphs, prefill_graphs) = if cuda_graphs {
        let decode_graphs = runner.capture_decode_graphs(&decode);
        (decode_graphs, runner.capture_prefill_graphs(&prefill))
    } else {
        (0, 0)
    };
    let report = WarmupReport {
        decode_shapes: decode.len() * if bucketed { 2 } else { 1 },
        prefill_shapes: prefill.len(),
        graphs,
        prefill_graphs,
        tuned_shapes: tuned.len(),
        timed_shapes: tuned.iter().filter(|t| t.timed).count(),
        tune_seconds,
        prefill_seconds,
        decode_seconds,
        vocab_seconds,
        capture_seconds: phase.elapsed().as_secs_f64(),
        requests: 0,
        requests_seconds: 0.0,
        seconds: started.elapsed().as_secs_f64(),
    };
    tracing::info!(
        decode_shapes = report.decode_shapes,
        prefill_shapes = report.prefill_shapes,
        graphs = report.graphs,
        prefill_graphs = report.prefill_graphs,
        tuned_shapes = report.tuned_shapes,
        timed_shapes = report.timed_shapes,
        tune_seconds = report.tune_seconds,
        prefill_seconds = report.prefill_seconds,
        decode_seconds = report.decode_seconds,
        vocab_seconds = report.vocab_seconds,
        capture_seconds = report.capture_seconds,
        seconds = report.seconds,
        "engine warmed up"
    );
    Ok(report)
}
