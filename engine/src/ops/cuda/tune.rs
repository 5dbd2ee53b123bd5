//! Timing the projection kernels against each other on this GPU, so the
//! choice between Ember's decode kernels and cuBLASLt for each decode shape
//! is a measurement made at warmup, not a constant tuned on one GPU.
//!
//! Decode steps replay as CUDA graphs, where only GPU time counts, so each
//! candidate is timed the same way: [`CALLS`] calls captured in one graph,
//! replayed [`REPLAYS`] times after a warm replay, between two device syncs.
//! The data is random, the weight out-major like the model's.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::{capture, Distribution};

use crate::ops::choice::LinearShape;
use crate::ops::epilogue::Epilogue;

/// Calls per captured graph.
const CALLS: usize = 16;
/// Timed replays of the graph.
const REPLAYS: usize = 4;

/// Microseconds per call of `run` (one candidate kernel: `x` `[rows, k]`
/// times the out-major `w` `[n, k]` plus the bias, with the epilogue) on
/// `shape` (with a bias, except for the LM head), or `None` when the capture
/// yields no hardware graph or the device fails.
pub fn time_linear<F>(device: &Device, shape: LinearShape, run: F) -> Option<f64>
where
    F: Fn(Tensor<2>, &Tensor<2>, Option<&Tensor<1>>, Epilogue<2>) -> Tensor<2> + 'static,
{
    let x = Tensor::<2>::random(
        [shape.rows, shape.k],
        Distribution::Normal(0.0, 1.0),
        device,
    );
    let w = Tensor::<2>::random([shape.n, shape.k], Distribution::Normal(0.0, 0.02), device);
    let bias = (!shape.lm_head).then(|| Tensor::<1>::zeros([shape.n], device));
    let call = move || {
        let mut y = None;
        for _ in 0..CALLS {
            y = Some(run(x.clone(), &w, bias.as_ref(), Epilogue::none()));
        }
        y
    };
    // Compile (and tune) outside the capture.
    call()?.into_data();
    let mut graph = capture(device, call);
    if !graph.is_hardware() {
        return None;
    }
    // Safety: the graph's buffers are owned by its closure (inputs) or were
    // recorded by the capture (outputs); everything runs on this thread's stream.
    unsafe { graph.replay() };
    device.sync().ok()?;
    let started = Instant::now();
    for _ in 0..REPLAYS {
        // Safety: as above.
        unsafe { graph.replay() };
    }
    device.sync().ok()?;
    Some(started.elapsed().as_secs_f64() * 1e6 / (REPLAYS * CALLS) as f64)
}
