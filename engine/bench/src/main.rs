//! `ember-engine-bench`: times the engine alone (no gRPC, no scheduler).
//!
//! For each decode batch size B it prefills B random prompts of `--context`
//! tokens, runs `--warmup` untimed decode steps, then times `--steps` decode
//! steps (each ends with the engine's one device->host read, so wall time is
//! device time). `--prefill N,L` also times one prefill of N prompts of L
//! tokens. Prints a table and writes the numbers as JSON.
//!
//! `--reference DIR` (a fixture made by `scripts/make_reference_fixtures.py`)
//! instead checks the engine on this device against transformers' numbers:
//! the max |logit difference| at each prompt's last position, and how many
//! greedy tokens match. This is the f16 check on a GPU.
//!
//! On the CPU the report also names the CPU model, its SIMD features and
//! the instruction set the kernels use, and gives the bytes of weights a
//! decode step reads; `--membw-mib N` first measures the machine's
//! streaming-read bandwidth ([`membw`]), so that the step can be set against
//! its weight-read floor (`bench/run_cpu.sh` does), and `--gemv-bw N` times
//! the projection kernels alone over the model's weight matrices
//! ([`gemv_bw`]).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use ember_engine::device::{self, default_kernel_cache_dir};
use ember_engine::model::{Gpt2Config, ModelSource, Preset};
use ember_engine::{
    CpuTuning, DeviceOptions, DeviceSpec, Engine, EngineConfig, EngineDevice, KernelTuning,
    KvBudget, PrefillBounds,
};
use serde_json::json;

// The reference check uses its comparisons on every
// build; the rest serves the CUDA kernel checks.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod check_data;
mod constrained_check;
mod controls_check;
mod gemv_bw;
#[cfg(feature = "cuda")]
mod graph_attention_check;
mod kernel_check;
#[cfg(feature = "cuda")]
mod kv_write_check;
mod machine;
mod membw;
mod penalty_check;
mod prefill_probe;
// The CUDA prefill checks' host reference (unit-tested on every build).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod prefill_reference;
mod reference;
mod sample_check;
mod timing;
#[cfg(feature = "cuda")]
mod vocab_check;

use timing::{bench_batch, bench_prefill, Prompts, TimingOptions};

/// mimalloc keeps freed pages for reuse: the engine allocates multi-MB
/// intermediates every step, which glibc would hand back to the OS each time.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Engine micro-benchmark: decode step latency and throughput per batch size.
#[derive(Debug, Parser)]
#[command(name = "ember-engine-bench", about)]
struct Args {
    /// cpu or cuda (cuda:N for another GPU).
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Run the server's startup warmup (every bucketed shape) first and report its time.
    #[arg(long)]
    server_warmup: bool,
    /// Built-in architecture with random weights (gpt2 or tiny).
    #[arg(long, default_value = "gpt2")]
    preset: Preset,
    /// An HF GPT-2 directory instead of a preset.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Decode batch sizes to time.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    batch_sizes: Vec<usize>,
    /// Prompt length of every sequence (the context decode starts from).
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// Timed decode steps per batch size.
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Untimed decode steps before timing.
    #[arg(long, default_value_t = 4)]
    warmup: usize,
    /// Also time a prefill of N prompts of L tokens: `N,L`.
    #[arg(long, value_delimiter = ',')]
    prefill: Option<Vec<usize>>,
    /// Largest prefill batch used to fill the decode batch.
    #[arg(long, default_value_t = 32)]
    prefill_chunk: usize,
    /// KV block size.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Check against a reference fixture dir (config.json, model.safetensors,
    /// reference.json) instead of benchmarking.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Also time each batch size with its decode step replayed as a CUDA graph
    /// (after the eager timing, same sequences), synchronously and in the
    /// overlapped loop (the server's default: each call queues a step, then
    /// reads the previous one's ids), and in `--reference` mode check that
    /// graph replays and the overlapped loop produce the eager steps' tokens.
    #[arg(long)]
    graphs: bool,
    /// With --graphs: skip the eager timing (two timed passes instead of
    /// three, so a long context fits the model's positions).
    #[arg(long)]
    no_eager: bool,
    /// CUDA: check the CubeCL paged-attention and KV-write kernels against the
    /// tensor-op reference on random data, then exit.
    #[arg(long)]
    check_kernels: bool,
    /// First measure the streaming-read bandwidth over a buffer of this many
    /// MiB (0: skip).
    #[arg(long, default_value_t = 0)]
    membw_mib: usize,
    /// CPU: first time the projection kernels alone, this many passes over
    /// the --preset's weight matrices at each batch size (0: skip).
    #[arg(long, default_value_t = 0)]
    gemv_bw: usize,
    /// Where to write the JSON report.
    #[arg(long, default_value = "engine_bench.json")]
    json: PathBuf,
    /// CUDA: where CubeCL keeps autotune results and compiled kernels
    /// (default: the server's, $XDG_CACHE_HOME/ember/kernels).
    #[arg(long)]
    kernel_cache_dir: Option<PathBuf>,
    /// The CUDA kernels' knobs (the server's flags).
    #[command(flatten)]
    tuning: KernelTuning,
    /// The CPU kernels' knobs (the server's flags).
    #[command(flatten)]
    cpu: CpuTuning,
}

fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let options = DeviceOptions {
        kernel_cache_dir: args
            .kernel_cache_dir
            .clone()
            .or_else(default_kernel_cache_dir),
        tuning: args.tuning.validate()?,
        cpu: args.cpu,
    };
    let device = device::open(args.device, &options)?;
    let report = match &args.reference {
        _ if args.check_kernels => kernel_check::run(&device)?,
        Some(dir) => {
            let controls = controls_check::check_controls(dir, device.clone(), args.graphs)?;
            let constrained =
                constrained_check::check_constrained(dir, device.clone(), args.graphs)?;
            let mut report = reference::check_reference(dir, device, args.graphs)?;
            report["controls"] = controls;
            report["constrained"] = constrained;
            report
        }
        None => run(&args, device)?,
    };
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    println!("wrote {}", args.json.display());
    Ok(())
}

fn run(args: &Args, device: EngineDevice) -> anyhow::Result<serde_json::Value> {
    let device_name = device.name.clone();
    let weight_bytes_each = match device.ops.matrix_dtype() {
        Some(_) => device.ops.cpu_kernels().weights.bytes(),
        None => device.float_bytes,
    };
    let cpu = machine::cpu_report(&device);
    println!("cpu: {}", machine::describe(&cpu));
    // Before the model exists, so the probe's buffer and the weights are
    // never resident at once.
    let memory = (args.membw_mib > 0).then(|| membw::measure(args.membw_mib));
    let on_cpu = ember_engine::ops::cpu::pool::is_cpu(&device.device);
    let kernels_alone = (args.gemv_bw > 0 && on_cpu).then(|| {
        let best = memory.as_ref().and_then(|m| m["best_gb_s"].as_f64());
        let config = args.preset.config();
        gemv_bw::measure(
            device.ops.cpu_kernels(),
            &config,
            &args.batch_sizes,
            args.gemv_bw,
            best,
        )
    });
    let (mut engine, config, max_new) = build_engine(args, device)?;
    let weight_bytes = machine::decode_weight_bytes(&config, weight_bytes_each);
    let warmup = if args.server_warmup {
        let report = engine.warmup()?;
        println!(
            "server warmup: {} decode + {} prefill shapes in {:.1} s",
            report.decode_shapes, report.prefill_shapes, report.seconds
        );
        json!({"decode_shapes": report.decode_shapes, "prefill_shapes": report.prefill_shapes, "seconds": report.seconds})
    } else {
        serde_json::Value::Null
    };
    let tuned = tune(&mut engine, &args.batch_sizes);
    let mut prompts = Prompts::new(config.vocab_size);

    println!(
        "device {device_name}, n_layer {} n_embd {}, context {}, {} timed steps",
        config.n_layer, config.n_embd, args.context, args.steps
    );
    println!(
        "{:>12} {:>10} {:>10} {:>10} {:>12}",
        "batch", "p50 ms", "p10 ms", "p90 ms", "tokens/s"
    );
    let options = TimingOptions {
        context: args.context,
        prefill_chunk: args.prefill_chunk,
        warmup: args.warmup,
        steps: args.steps,
        graphs: args.graphs,
        eager: !(args.graphs && args.no_eager),
    };
    let mut decode_rows = Vec::new();
    for &b in &args.batch_sizes {
        decode_rows.push(bench_batch(
            &mut engine,
            &options,
            &mut prompts,
            b,
            max_new,
        )?);
    }
    let prefill_row = match &args.prefill {
        Some(p) => bench_prefill(&mut engine, &options, &mut prompts, p[0], p[1])?,
        None => serde_json::Value::Null,
    };
    // With --graphs, the same prefill replayed from its captured graph (the
    // server's small prefill steps), checked against the eager step first.
    let prefill_graph_row = match (&args.prefill, args.graphs) {
        (Some(p), true) => {
            timing::bench_prefill_graph(&mut engine, &options, &mut prompts, p[0], p[1])?
        }
        _ => serde_json::Value::Null,
    };

    Ok(json!({
        "device": device_name,
        "cpu": cpu,
        "memory_read": memory,
        "projection_kernels_alone": kernels_alone,
        "weight_bytes_per_step": weight_bytes,
        "model": {"n_layer": config.n_layer, "n_head": config.n_head, "n_embd": config.n_embd, "vocab_size": config.vocab_size},
        "context": args.context,
        "steps": args.steps,
        "warmup": args.warmup,
        "block_size": args.block_size,
        "decode": decode_rows,
        "prefill": prefill_row,
        "prefill_graph": prefill_graph_row,
        "server_warmup": warmup,
        "projection_kernels": tuned,
    }))
}

/// Times the projection kernels at the decode buckets (CUDA), prints the
/// choices and returns them as JSON.
fn tune(engine: &mut Engine, batch_sizes: &[usize]) -> serde_json::Value {
    let tuned = engine.tune_projections(batch_sizes);
    if !tuned.is_empty() {
        println!("projection kernels (rows, n x k: candidates in us per call -> chosen):");
    }
    let rows: Vec<serde_json::Value> = tuned
        .iter()
        .map(|t| {
            let timings: Vec<String> = t
                .timings
                .iter()
                .map(|(k, us)| format!("{k:?} {us:.1}"))
                .collect();
            let s = t.shape;
            println!(
                "  {:>4} rows, {} x {}{}: {} -> {:?}",
                s.rows,
                s.n,
                s.k,
                if s.lm_head { " (LM head)" } else { "" },
                timings.join(", "),
                t.chosen
            );
            json!({"rows": s.rows, "n": s.n, "k": s.k, "lm_head": s.lm_head,
                   "timings_us": t.timings.iter().map(|(k, us)| json!({"kernel": format!("{k:?}"), "us": us})).collect::<Vec<_>>(),
                   "chosen": format!("{:?}", t.chosen)})
        })
        .collect();
    json!(rows)
}

/// Loads the model and sizes an engine for every batch and the prefill
/// `args` ask for; returns it, the model config and the new tokens each
/// decode sequence may take.
fn build_engine(args: &Args, device: EngineDevice) -> anyhow::Result<(Engine, Gpt2Config, usize)> {
    let source = match &args.model_dir {
        Some(dir) => ModelSource::Dir(dir.clone()),
        None => ModelSource::Preset {
            preset: args.preset,
            seed: 0,
        },
    };
    let config = source.config()?;
    if args
        .prefill
        .as_ref()
        .is_some_and(|p| p.len() != 2 || p[0] == 0 || p[1] == 0)
    {
        bail!("--prefill takes N,L (two positive numbers)");
    }
    // Eager steps (unless --no-eager); with graphs, synchronous and
    // overlapped graph steps too.
    let eager = !(args.graphs && args.no_eager);
    let timed_passes = usize::from(eager) + if args.graphs { 2 } else { 0 };
    let max_new = args.warmup + timed_passes * args.steps + 1;
    if args.context + max_new > config.n_positions {
        bail!(
            "context {} + {} steps exceeds n_positions {}",
            args.context,
            max_new,
            config.n_positions
        );
    }
    let max_b = args.batch_sizes.iter().copied().max().unwrap_or(1);
    let per_seq = (args.context + max_new).div_ceil(args.block_size);
    let prefill_blocks = args
        .prefill
        .as_ref()
        .map_or(0, |p| p[0] * (p[1] + 1).div_ceil(args.block_size));
    let engine_config = EngineConfig {
        block_size: args.block_size,
        kv: KvBudget::Blocks((max_b * per_seq).max(prefill_blocks).max(1)),
        max_batch: max_b,
        prefill: PrefillBounds {
            max_rows: args.prefill_chunk,
            max_tokens: 8192,
        },
        // Timed prefills repeat prompts: measure compute, not cache hits.
        // (Sequences of a fixed length: their requests ignore EOS.)
        prefix_caching: false,
        ..EngineConfig::new(source)
    };
    let engine = Engine::new(&engine_config, &device)?;
    Ok((engine, config, max_new))
}
