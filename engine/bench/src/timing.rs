//! Timing decode steps and prefills: the numbers `ember-engine-bench`
//! prints and writes. Every decode step ends with the engine's one
//! device->host read of the sampled ids, so wall time covers the device work.

use std::time::Instant;

use ember_engine::{Engine, SeqId, SequenceRequest};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// What a timing run takes from the command line.
#[derive(Debug, Clone, Copy)]
pub struct TimingOptions {
    /// Prompt length of every decode sequence.
    pub context: usize,
    /// Largest prefill batch used to fill a decode batch.
    pub prefill_chunk: usize,
    /// Untimed steps (and prefill rounds) first.
    pub warmup: usize,
    /// Timed decode steps per batch size.
    pub steps: usize,
    /// Also time the decode steps replayed as a captured graph
    /// (synchronous and overlapped).
    pub graphs: bool,
    /// Time eager steps (off only with graphs).
    pub eager: bool,
}

/// Random prompts over the vocabulary, from a fixed seed.
pub struct Prompts {
    rng: StdRng,
    vocab: u32,
}

impl Prompts {
    /// Prompts over a vocabulary of `vocab` tokens, from seed 0.
    pub fn new(vocab: usize) -> Self {
        Self {
            rng: StdRng::seed_from_u64(0),
            vocab: vocab as u32,
        }
    }

    pub fn take(&mut self, len: usize) -> Vec<u32> {
        (0..len)
            .map(|_| self.rng.random_range(0..self.vocab))
            .collect()
    }
}

/// p-th percentile (0..=100) of sorted samples, nearest rank.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((p / 100.0) * (sorted.len().saturating_sub(1)) as f64).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// Prefills `b` sequences of `--context` tokens, then times their decode
/// steps eagerly (and replayed as a graph with `--graphs`); prints and
/// returns the batch's row.
pub fn bench_batch(
    engine: &mut Engine,
    options: &TimingOptions,
    prompts: &mut Prompts,
    b: usize,
    max_new: usize,
) -> anyhow::Result<serde_json::Value> {
    let ids: Vec<SeqId> = (0..b as SeqId).collect();
    // Progress on stderr: first calls of a new shape include kernel
    // compilation (and autotuning on CUDA), which can dominate.
    let t = Instant::now();
    for chunk in ids.chunks(options.prefill_chunk.max(1)) {
        let reqs = chunk
            .iter()
            .map(|&id| SequenceRequest::greedy(id, prompts.take(options.context), max_new))
            .collect();
        engine.prefill(reqs)?;
    }
    eprintln!(
        "batch {b}: prefill {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let t = Instant::now();
    for _ in 0..options.warmup {
        engine.decode(&ids)?;
    }
    eprintln!(
        "batch {b}: {} warmup steps {:.0} ms",
        options.warmup,
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut row = json!({"batch": b});
    if options.eager {
        let eager = time_steps(engine, &ids, options.steps)?;
        row["eager"] = eager.json(b);
        print_row(&format!("{b}"), &eager, b);
    }
    if options.graphs {
        let t = Instant::now();
        let hardware = engine.capture_decode_graphs(&[b]);
        eprintln!(
            "batch {b}: captured ({hardware} hardware graph) in {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        let graph = time_steps(engine, &ids, options.steps)?;
        print_row(&format!("{b} graph"), &graph, b);
        row["graph"] = graph.json(b);
        // The overlapped loop (the server's default): each call queues a
        // step and judges the previous one.
        let overlap = time_overlapped_steps(engine, &ids, options.steps)?;
        print_row(&format!("{b} overlap"), &overlap, b);
        row["overlap"] = overlap.json(b);
        row["hardware_graph"] = json!(hardware > 0);
        // The GPU time alone: replays back to back, one sync (the peer's
        // `mean_ms_loop`); the step above adds the host's per-step work.
        if let Some(ms) = engine.time_graph_replays(b, options.steps.max(10)) {
            println!(
                "{:>12} {ms:>10.3}   (GPU only: replays back to back)",
                format!("{b} replay")
            );
            row["graph_replay_ms"] = json!(ms);
        }
    }
    ids.iter().for_each(|&id| {
        engine.release(id);
    });
    Ok(row)
}

/// Times prefills of `n` fresh prompts of `len` tokens (after `--warmup`
/// untimed rounds, at least one); prints and returns the median.
pub fn bench_prefill(
    engine: &mut Engine,
    options: &TimingOptions,
    prompts: &mut Prompts,
    n: usize,
    len: usize,
) -> anyhow::Result<serde_json::Value> {
    let mut ms = Vec::new();
    for round in 0..options.warmup.max(1) + 3 {
        // One new token: each sequence finishes (and frees its blocks) in the prefill.
        let reqs = (0..n as SeqId)
            .map(|id| SequenceRequest::greedy(id, prompts.take(len), 1))
            .collect();
        let t = Instant::now();
        engine.prefill(reqs)?;
        if round >= options.warmup.max(1) {
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    ms.sort_by(f64::total_cmp);
    let p50 = percentile(&ms, 50.0);
    let tokens_per_s = (n * len) as f64 / (p50 / 1e3);
    println!("prefill {n} x {len}: {p50:.2} ms ({tokens_per_s:.0} prompt tokens/s)");
    Ok(json!({"sequences": n, "prompt_len": len, "p50_ms": p50, "tokens_per_s": tokens_per_s}))
}

/// [`bench_prefill`] with the engine's prefill graphs captured as the
/// warmup captures them (up to `ember_engine::step::PREFILL_GRAPH_MAX_TOKENS`
/// tokens; a larger step is timed eager, as the server runs it): the
/// graph's GPU time, the step's timing, then the prefill probe (the replayed
/// logits against the eager step's, printed; last, because it recaptures
/// the shape).
pub fn bench_prefill_graph(
    engine: &mut Engine,
    options: &TimingOptions,
    prompts: &mut Prompts,
    n: usize,
    len: usize,
) -> anyhow::Result<serde_json::Value> {
    let hardware = engine.capture_prefill_graphs();
    let check: Vec<Vec<u32>> = (0..n).map(|_| prompts.take(len)).collect();
    let gpu_ms = engine.time_prefill_graph_replays(&check, 20)?;
    if let Some(ms) = gpu_ms {
        println!("prefill {n} x {len} graph replays back to back: {ms:.3} ms (GPU time)");
    }
    let mut row = bench_prefill(engine, options, prompts, n, len)?;
    let probe = crate::prefill_probe::probe(engine, &check);
    let diff = probe.get("logits_diff").cloned();
    match &diff {
        Some(d) => println!(
            "prefill {n} x {len} graph ({hardware} hardware prefill graphs): max |replayed - eager logits| = {d}"
        ),
        None => println!("prefill {n} x {len}: no captured graph for its shape (eager)"),
    }
    row["gpu_ms"] = json!(gpu_ms);
    row["graph_vs_eager_max_logit_diff"] = json!(diff);
    row["graph_probe"] = probe;
    row["hardware_prefill_graphs"] = json!(hardware);
    Ok(row)
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

/// Times `steps` overlapped decode calls over `ids` (each queues a step and
/// waits for the one before: in a steady loop a call costs the longer of
/// the GPU's step and the host's), after one untimed call that fills the
/// pipeline; the last step is judged untimed.
fn time_overlapped_steps(
    engine: &mut Engine,
    ids: &[SeqId],
    steps: usize,
) -> anyhow::Result<StepTimes> {
    engine.decode_async(ids)?;
    let mut ms = Vec::with_capacity(steps);
    for _ in 1..steps {
        let t = Instant::now();
        engine.decode_async(ids)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    engine.flush()?;
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
