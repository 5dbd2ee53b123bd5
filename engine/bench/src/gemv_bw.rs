//! `--gemv-bw N`: the CPU projection kernels alone, at the read bandwidth
//! they reach. One pass runs every weight matrix a GPT-2 decode step reads
//! (each block's `c_attn`, `c_proj`, `c_fc`, `mlp.c_proj`, then the LM head;
//! separate buffers, so nothing is served from cache) through the kernel
//! the engine runs for the `--cpu-weights` format, on the rayon pool as the
//! engine's pass is ([`ember_engine::ops::cpu::pool::on_pool`]). The p50 of
//! `N` passes per batch size, the bytes over it, and (with `--membw-mib`)
//! that rate as a share of the probe's best: the kernels' own distance from
//! the weight-read floor, without attention, LayerNorm or sampling.

use std::time::Instant;

use ember_engine::model::Gpt2Config;
use ember_engine::ops::cpu::gemv::{self, RowEpilogue};
use ember_engine::ops::cpu::pool::on_pool;
use ember_engine::ops::CpuKernels;
use ember_engine::CpuWeights;
use half::bf16;
use serde_json::json;

/// The weight matrices of one decode step, `(n, k)` each, out-major.
fn shapes(config: &Gpt2Config) -> Vec<(usize, usize)> {
    let e = config.n_embd;
    let mut out = Vec::new();
    for _ in 0..config.n_layer {
        out.extend([(3 * e, e), (e, e), (4 * e, e), (e, 4 * e)]);
    }
    out.push((config.vocab_size, e));
    out
}

/// Values in about [-0.5, 0.5) from a counter (no RNG: 124M of them).
fn filler(i: usize) -> f32 {
    ((i.wrapping_mul(2_654_435_761) >> 7) % 1024) as f32 / 1024.0 - 0.5
}

/// The matrices in one format, and one pass of `m` rows through them.
enum Weights {
    F32(Vec<Vec<f32>>),
    Bf16(Vec<Vec<bf16>>),
}

impl Weights {
    fn new(format: CpuWeights, shapes: &[(usize, usize)]) -> Self {
        let sizes = shapes.iter().map(|&(n, k)| n * k);
        match format {
            CpuWeights::F32 => Self::F32(sizes.map(|len| (0..len).map(filler).collect()).collect()),
            CpuWeights::Bf16 => Self::Bf16(
                sizes
                    .map(|len| (0..len).map(|i| bf16::from_f32(filler(i))).collect())
                    .collect(),
            ),
        }
    }

    /// Every matrix against `x` (`[m, k]` prefixes of it); returns a checksum.
    fn pass(&self, kernels: &CpuKernels, shapes: &[(usize, usize)], x: &[f32], m: usize) -> f32 {
        let none = RowEpilogue::default();
        let mut sum = 0.0;
        for (i, &(n, k)) in shapes.iter().enumerate() {
            let y = match self {
                Self::F32(w) => gemv::project(kernels.isa, x, m, k, &w[i], n, &none),
                Self::Bf16(w) => gemv::bf16_weights::project(kernels.isa, x, m, k, &w[i], n, &none),
            };
            sum += y[0];
        }
        sum
    }
}

/// Times `reps` passes at each of `batches`; prints a line per batch and
/// returns them as JSON (`best_gb_s`: the `--membw-mib` probe's, if run).
pub fn measure(
    kernels: &CpuKernels,
    config: &Gpt2Config,
    batches: &[usize],
    reps: usize,
    best_gb_s: Option<f64>,
) -> serde_json::Value {
    let shapes = shapes(config);
    let weights = Weights::new(kernels.weights, &shapes);
    let bytes: usize = shapes.iter().map(|&(n, k)| n * k).sum::<usize>() * kernels.weights.bytes();
    let max_k = shapes.iter().map(|s| s.1).max().unwrap_or(0);
    let mut rows = Vec::new();
    for &m in batches {
        let x: Vec<f32> = (0..m * max_k).map(|i| filler(i + 7)).collect();
        let mut ms: Vec<f64> = (0..reps.max(1) + 1)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(on_pool(|| weights.pass(kernels, &shapes, &x, m)));
                t.elapsed().as_secs_f64() * 1e3
            })
            .skip(1) // the first pass faults the output buffers in
            .collect();
        ms.sort_by(f64::total_cmp);
        let p50 = ms[(ms.len() - 1) / 2];
        let gb_s = bytes as f64 / p50 / 1e6;
        let share = best_gb_s.map(|best| gb_s / best);
        println!(
            "projection kernels alone ({} weights, {}), batch {m}: {p50:.2} ms per pass of {} matrices ({:.1} MB): {gb_s:.1} GB/s{}",
            kernels.weights,
            kernels.isa,
            shapes.len(),
            bytes as f64 / 1e6,
            share.map_or(String::new(), |s| format!(" = {:.0}% of the probe's best", 100.0 * s))
        );
        rows.push(json!({"batch": m, "p50_ms": p50, "gb_s": gb_s, "share_of_best_read": share}));
    }
    json!({"weights": kernels.weights.to_string(), "isa": kernels.isa.to_string(),
           "bytes_per_pass": bytes, "reps": reps, "batches": rows})
}
