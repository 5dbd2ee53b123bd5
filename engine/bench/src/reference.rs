//! `--reference DIR`: the engine on this device against transformers'
//! numbers (a fixture made by `scripts/make_reference_fixtures.py`): the
//! prefill logits, the greedy continuations, and with `--graphs` the same
//! continuations with every decode step replayed from a captured graph.

use std::time::Instant;

use anyhow::Context;
use burn::prelude::*;
use ember_engine::model::ModelSource;
use ember_engine::{Engine, EngineConfig, EngineDevice, KvBudget, SeqId, SequenceRequest};
use serde_json::json;

/// Runs a reference fixture's prompts through the engine on `device`.
pub fn check_reference(
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
    let engine_config = EngineConfig {
        kv: KvBudget::Blocks(64),
        max_batch: 8,
        // Greedy continuations of fixed length (their requests ignore EOS).
        prefix_caching: false,
        ..EngineConfig::new(ModelSource::Dir(dir.to_path_buf()))
    };
    let mut engine = Engine::new(&engine_config, &device)?;
    let config = engine.model_config().clone();

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
    // decode step replayed from captured graphs, which must give the same
    // tokens; then the prefill step replayed from its graph against eager.
    let n = reference["new_tokens"].as_u64().unwrap_or(16) as usize;
    let t = Instant::now();
    let got = greedy_tokens(&mut engine, &prompts, n, false)?;
    eprintln!(
        "reference generation: {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut graph_check = serde_json::Value::Null;
    if graphs {
        let hardware = engine.capture_decode_graphs(&[1, 2, 4, 8]);
        let replayed = greedy_tokens(&mut engine, &prompts, n, false)?;
        let same = replayed == got;
        println!(
            "  graph replays ({hardware} hardware graphs): tokens identical to eager steps: {same}"
        );
        let overlapped = greedy_tokens(&mut engine, &prompts, n, true)? == got;
        println!(
            "  overlapped loop (graph replays): tokens identical to eager steps: {overlapped}"
        );
        // Prefill steps are captured only where shapes are bucketed (CUDA).
        let (prefill, probe) = match engine.capture_prefill_graphs() {
            0 => (json!(null), json!(null)),
            _ => (
                prefill_replay_check(&mut engine, &prompts)?,
                crate::prefill_probe::probe(&mut engine, &prompts),
            ),
        };
        graph_check = json!({"hardware_graphs": hardware, "tokens_identical": same,
                             "prefill_replay": prefill, "prefill_probe": probe,
                             "overlapped_identical": overlapped});
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

/// `n` greedy tokens for each prompt, all decoded in one batch
/// (`overlapped`: each step queued before the previous one is judged).
fn greedy_tokens(
    engine: &mut Engine,
    prompts: &[Vec<u32>],
    n: usize,
    overlapped: bool,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let reqs = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| SequenceRequest::greedy(i as SeqId, p.clone(), n))
        .collect();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut out = engine.prefill(reqs)?;
    loop {
        for t in &out.tokens {
            got[t.id as usize].push(t.token);
        }
        let active = engine.decoding();
        if active.is_empty() && !engine.has_pending() {
            return Ok(got);
        }
        out = match overlapped {
            true => engine.decode_async(&active)?,
            false => engine.decode(&active)?,
        };
    }
}

/// The prompts' last-token logits from their prefill step replayed from its
/// captured graph, against the eager step's: the largest difference; then
/// the same prompts in reverse order (the same shape, other contents in
/// every buffer), row for row against the first replay (near 0 when the
/// replay reads its rewritten inputs) and unreversed (0 exactly when it
/// does not: a graph replaying its capture-time inputs).
fn prefill_replay_check(
    engine: &mut Engine,
    prompts: &[Vec<u32>],
) -> anyhow::Result<serde_json::Value> {
    use crate::check_data::{floats, max_diff};
    let replayed = engine.prompt_logits_replayed(prompts)?;
    let eager = engine.prompt_logits(prompts)?;
    // Again, after the eager step wrote its K/V into the same blocks: equal
    // to the eager logits where the replay reads the cache the eager step
    // left (its own KV write not replayed), to the first replay otherwise.
    let second = engine.prompt_logits_replayed(prompts)?;
    let n = prompts.len();
    let row = |t: &Tensor<2>, i: usize| floats(t.clone().narrow(0, i, 1));
    let per_row = |a: &Tensor<2>, b: &Tensor<2>| -> Vec<f32> {
        (0..n).map(|i| max_diff(row(a, i), row(b, i))).collect()
    };
    let first_vs_eager = per_row(&replayed, &eager);
    let second_vs_eager = per_row(&second, &eager);
    let second_vs_first = per_row(&second, &replayed);
    let vs_eager = first_vs_eager.iter().copied().fold(0.0f32, f32::max);
    let reversed: Vec<Vec<u32>> = prompts.iter().rev().cloned().collect();
    let again = engine.prompt_logits_replayed(&reversed)?;
    let back = Tensor::cat(
        (0..n)
            .rev()
            .map(|i| again.clone().narrow(0, i, 1))
            .collect(),
        0,
    );
    let vs_reversed = max_diff(floats(replayed.clone()), floats(back));
    let vs_unreversed = max_diff(floats(replayed), floats(again));
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    println!(
        "  prefill graph replay: max |replayed - eager logits| = {vs_eager:e}; reversed prompts, row for row: {vs_reversed:e}, unreversed: {vs_unreversed:e}"
    );
    println!(
        "  per row (prompts of {lens:?} tokens): first replay - eager {first_vs_eager:?}; a second replay after the eager step - eager {second_vs_eager:?}, - first replay {second_vs_first:?}"
    );
    Ok(
        json!({"vs_eager": vs_eager, "vs_reversed": vs_reversed, "vs_unreversed": vs_unreversed,
              "per_row_first_vs_eager": first_vs_eager, "per_row_second_vs_eager": second_vs_eager,
              "per_row_second_vs_first": second_vs_first}),
    )
}
