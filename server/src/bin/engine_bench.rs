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

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use ember_server::cli::{default_kernel_cache_dir, DeviceSpec};
use ember_server::device::{self, EngineDevice};
use ember_server::engine::{Engine, EngineConfig, SamplingParams, SeqId, SequenceRequest};
use ember_server::model::{load_model, Gpt2Config, ModelSource, Preset};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

#[path = "engine_bench/kernel_check.rs"]
mod kernel_check;

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
    /// (after the eager timing, same sequences), and in `--reference` mode
    /// check that graph replays produce the eager steps' tokens.
    #[arg(long)]
    graphs: bool,
    /// CUDA: check the CubeCL paged-attention and KV-write kernels against the
    /// tensor-op reference on random data, then exit.
    #[arg(long)]
    check_kernels: bool,
    /// Where to write the JSON report.
    #[arg(long, default_value = "engine_bench.json")]
    json: PathBuf,
}

fn main() -> anyhow::Result<()> {
    ember_server::logging::init(ember_server::logging::LogFormat::Text, "warn");
    let args = Args::parse();
    let device = device::open(args.device, default_kernel_cache_dir().as_deref())?;
    let report = match &args.reference {
        _ if args.check_kernels => kernel_check::run(&device)?,
        Some(dir) => check_reference(dir, device, args.graphs)?,
        None => run(&args, device)?,
    };
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    println!("wrote {}", args.json.display());
    Ok(())
}

/// p-th percentile (0..=100) of sorted samples, nearest rank.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((p / 100.0) * (sorted.len().saturating_sub(1)) as f64).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

fn run(args: &Args, device: EngineDevice) -> anyhow::Result<serde_json::Value> {
    let device_name = device.name.clone();
    let (mut engine, config, max_new) = build_engine(args, device)?;
    let warmup = if args.server_warmup {
        let report = engine.warmup(args.prefill_chunk, 8192)?;
        println!(
            "server warmup: {} decode + {} prefill shapes in {:.1} s",
            report.decode_shapes, report.prefill_shapes, report.seconds
        );
        json!({"decode_shapes": report.decode_shapes, "prefill_shapes": report.prefill_shapes, "seconds": report.seconds})
    } else {
        serde_json::Value::Null
    };
    let mut prompts = Prompts {
        rng: StdRng::seed_from_u64(0),
        vocab: config.vocab_size as u32,
    };

    println!(
        "device {device_name}, n_layer {} n_embd {}, context {}, {} timed steps",
        config.n_layer, config.n_embd, args.context, args.steps
    );
    println!(
        "{:>12} {:>10} {:>10} {:>10} {:>12}",
        "batch", "p50 ms", "p10 ms", "p90 ms", "tokens/s"
    );
    let mut decode_rows = Vec::new();
    for &b in &args.batch_sizes {
        decode_rows.push(bench_batch(&mut engine, args, &mut prompts, b, max_new)?);
    }
    let prefill_row = match &args.prefill {
        Some(p) => bench_prefill(&mut engine, args, &mut prompts, p[0], p[1])?,
        None => serde_json::Value::Null,
    };

    Ok(json!({
        "device": device_name,
        "model": {"n_layer": config.n_layer, "n_head": config.n_head, "n_embd": config.n_embd, "vocab_size": config.vocab_size},
        "context": args.context,
        "steps": args.steps,
        "warmup": args.warmup,
        "block_size": args.block_size,
        "decode": decode_rows,
        "prefill": prefill_row,
        "server_warmup": warmup,
    }))
}

/// Random prompts over the vocabulary, from a fixed seed.
struct Prompts {
    rng: StdRng,
    vocab: u32,
}

impl Prompts {
    fn take(&mut self, len: usize) -> Vec<u32> {
        (0..len)
            .map(|_| self.rng.random_range(0..self.vocab))
            .collect()
    }
}

/// A request for one greedy sequence of `prompt` that may run `max_new` tokens.
fn request(id: SeqId, prompt: Vec<u32>, max_new: usize) -> SequenceRequest {
    SequenceRequest {
        id,
        prompt,
        max_new_tokens: max_new,
        ignore_eos: true,
        sampling: SamplingParams::greedy(),
        stop_token_ids: Vec::new(),
        logprobs: None,
    }
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
    let (model, config) = load_model(&source, &device.device)?;
    if args
        .prefill
        .as_ref()
        .is_some_and(|p| p.len() != 2 || p[0] == 0 || p[1] == 0)
    {
        bail!("--prefill takes N,L (two positive numbers)");
    }
    let timed_passes = if args.graphs { 2 } else { 1 };
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
        num_blocks: (max_b * per_seq).max(prefill_blocks).max(1),
        max_batch: max_b,
        bucketed: device.bucketed,
        // Timed prefills repeat prompts: measure compute, not cache hits.
        prefix_caching: false,
        decode_graphs: false,
    };
    let engine = Engine::new(
        model,
        config.clone(),
        engine_config,
        u32::MAX,
        device.device,
    )?;
    Ok((engine, config, max_new))
}

/// Prefills `b` sequences of `--context` tokens, then times their decode
/// steps eagerly (and replayed as a graph with `--graphs`); prints and
/// returns the batch's row.
fn bench_batch(
    engine: &mut Engine,
    args: &Args,
    prompts: &mut Prompts,
    b: usize,
    max_new: usize,
) -> anyhow::Result<serde_json::Value> {
    let ids: Vec<SeqId> = (0..b as SeqId).collect();
    // Progress on stderr: first calls of a new shape include kernel
    // compilation (and autotuning on CUDA), which can dominate.
    let t = Instant::now();
    for chunk in ids.chunks(args.prefill_chunk.max(1)) {
        let reqs = chunk
            .iter()
            .map(|&id| request(id, prompts.take(args.context), max_new))
            .collect();
        engine.prefill(reqs)?;
    }
    eprintln!(
        "batch {b}: prefill {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let t = Instant::now();
    for _ in 0..args.warmup {
        engine.decode(&ids)?;
    }
    eprintln!(
        "batch {b}: {} warmup steps {:.0} ms",
        args.warmup,
        t.elapsed().as_secs_f64() * 1e3
    );
    let eager = time_steps(engine, &ids, args.steps)?;
    let mut row = json!({"batch": b, "eager": eager.json(b)});
    print_row(&format!("{b}"), &eager, b);
    if args.graphs {
        let t = Instant::now();
        let hardware = engine.capture_decode_graphs(&[b]);
        eprintln!(
            "batch {b}: captured ({hardware} hardware graph) in {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        let graph = time_steps(engine, &ids, args.steps)?;
        print_row(&format!("{b} graph"), &graph, b);
        row["graph"] = graph.json(b);
        row["hardware_graph"] = json!(hardware > 0);
    }
    ids.iter().for_each(|&id| {
        engine.release(id);
    });
    Ok(row)
}

/// Times prefills of `n` fresh prompts of `len` tokens (after `--warmup`
/// untimed rounds, at least one); prints and returns the median.
fn bench_prefill(
    engine: &mut Engine,
    args: &Args,
    prompts: &mut Prompts,
    n: usize,
    len: usize,
) -> anyhow::Result<serde_json::Value> {
    let mut ms = Vec::new();
    for round in 0..args.warmup.max(1) + 3 {
        // One new token: each sequence finishes (and frees its blocks) in the prefill.
        let reqs = (0..n as SeqId)
            .map(|id| request(id, prompts.take(len), 1))
            .collect();
        let t = Instant::now();
        engine.prefill(reqs)?;
        if round >= args.warmup.max(1) {
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    ms.sort_by(f64::total_cmp);
    let p50 = percentile(&ms, 50.0);
    let tokens_per_s = (n * len) as f64 / (p50 / 1e3);
    println!("prefill {n} x {len}: {p50:.2} ms ({tokens_per_s:.0} prompt tokens/s)");
    Ok(json!({"sequences": n, "prompt_len": len, "p50_ms": p50, "tokens_per_s": tokens_per_s}))
}

/// Percentiles of timed decode steps.
struct StepTimes {
    p50: f64,
    p10: f64,
    p90: f64,
}

impl StepTimes {
    fn json(&self, batch: usize) -> serde_json::Value {
        json!({"p50_ms": self.p50, "p10_ms": self.p10, "p90_ms": self.p90,
               "tokens_per_s": batch as f64 / (self.p50 / 1e3)})
    }
}

/// Times `steps` decode steps of `ids` (each ends with the engine's one
/// device->host read of the sampled ids, so wall time covers the device work).
fn time_steps(engine: &mut Engine, ids: &[SeqId], steps: usize) -> anyhow::Result<StepTimes> {
    let mut ms = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = Instant::now();
        engine.decode(ids)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(StepTimes {
        p50: percentile(&ms, 50.0),
        p10: percentile(&ms, 10.0),
        p90: percentile(&ms, 90.0),
    })
}

fn print_row(label: &str, t: &StepTimes, batch: usize) {
    let tps = batch as f64 / (t.p50 / 1e3);
    println!(
        "{label:>12} {:>10.3} {:>10.3} {:>10.3} {tps:>12.0}",
        t.p50, t.p10, t.p90
    );
}

/// Runs a reference fixture's prompts through the engine on `device`.
fn check_reference(
    dir: &std::path::Path,
    device: EngineDevice,
    graphs: bool,
) -> anyhow::Result<serde_json::Value> {
    let device_name = device.name.clone();
    let text = std::fs::read_to_string(dir.join("reference.json"))
        .with_context(|| format!("reading {}/reference.json", dir.display()))?;
    let reference: serde_json::Value = serde_json::from_str(&text)?;
    let cases = reference["cases"]
        .as_array()
        .context("reference.json: no cases")?;
    let (model, config) = load_model(&ModelSource::Dir(dir.to_path_buf()), &device.device)?;
    let engine_config = EngineConfig {
        block_size: 16,
        num_blocks: 64,
        max_batch: 8,
        bucketed: device.bucketed,
        prefix_caching: false,
        decode_graphs: false,
    };
    let mut engine = Engine::new(
        model,
        config.clone(),
        engine_config,
        u32::MAX,
        device.device,
    )?;

    // Prefill logits, all prompts in one batch (one read of the logits: a check, not a step).
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["prompt"])).collect();
    let t = Instant::now();
    let logits: Vec<f32> = engine
        .prompt_logits(&prompts)?
        .into_data()
        .iter::<f32>()
        .collect();
    eprintln!(
        "reference prefill: {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let (max_diff, max_ref) = logit_diff(cases, &logits, config.vocab_size);

    // Greedy continuations, all sequences batched; then again with every
    // decode step replayed from captured graphs, which must give the same tokens.
    let n = reference["new_tokens"].as_u64().unwrap_or(16) as usize;
    let t = Instant::now();
    let got = greedy_tokens(&mut engine, &prompts, n)?;
    eprintln!(
        "reference generation: {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut graph_check = serde_json::Value::Null;
    if graphs {
        let hardware = engine.capture_decode_graphs(&[1, 2, 4, 8]);
        let replayed = greedy_tokens(&mut engine, &prompts, n)?;
        let same = replayed == got;
        println!(
            "  graph replays ({hardware} hardware graphs): tokens identical to eager steps: {same}"
        );
        graph_check = json!({"hardware_graphs": hardware, "tokens_identical": same});
    }
    let matching: Vec<usize> = cases
        .iter()
        .zip(&got)
        .map(|(c, g)| {
            ids(&c["greedy"])
                .iter()
                .zip(g)
                .take_while(|(a, b)| a == b)
                .count()
        })
        .collect();
    println!("device {device_name}: reference {}", dir.display());
    println!(
        "  prefill logits: max |engine - transformers| = {max_diff:e} (max |logit| {max_ref:.3})"
    );
    println!("  greedy tokens matching before first divergence: {matching:?} of {n} each");
    println!("  blocks in use after: {}", engine.kv_blocks_used());
    Ok(json!({
        "device": device_name,
        "reference": dir.display().to_string(),
        "max_abs_logit_diff": max_diff,
        "max_abs_logit": max_ref,
        "greedy_tokens": n,
        "greedy_matching_prefix": matching,
        "graph_check": graph_check,
    }))
}

/// The ids in JSON array `v` (non-integers skipped).
fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_u64())
        .map(|x| x as u32)
        .collect()
}

/// Max |engine - reference| over each case's `last_logits` against its row
/// of `logits` (`[cases, vocab]`), and the largest reference logit.
fn logit_diff(cases: &[serde_json::Value], logits: &[f32], vocab: usize) -> (f32, f32) {
    let (mut max_diff, mut max_ref) = (0.0f32, 0.0f32);
    for (i, c) in cases.iter().enumerate() {
        let want = c["last_logits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_f64());
        for (a, b) in logits[i * vocab..(i + 1) * vocab].iter().zip(want) {
            max_diff = max_diff.max((a - b as f32).abs());
            max_ref = max_ref.max((b as f32).abs());
        }
    }
    (max_diff, max_ref)
}

/// `n` greedy tokens for each prompt, all decoded in one batch.
fn greedy_tokens(
    engine: &mut Engine,
    prompts: &[Vec<u32>],
    n: usize,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let reqs = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| SequenceRequest {
            id: i as SeqId,
            prompt: p.clone(),
            max_new_tokens: n,
            ignore_eos: true,
            sampling: SamplingParams::greedy(),
            stop_token_ids: Vec::new(),
            logprobs: None,
        })
        .collect();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut out = engine.prefill(reqs)?;
    loop {
        for t in &out.tokens {
            got[t.id as usize].push(t.token);
        }
        let active: Vec<SeqId> = (0..prompts.len() as SeqId)
            .filter(|&id| got[id as usize].len() < n)
            .collect();
        if active.is_empty() {
            return Ok(got);
        }
        out = engine.decode(&active)?;
    }
}
