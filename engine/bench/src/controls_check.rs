//! `--reference DIR`, second half: the logit controls of `controls.json`
//! (penalties, `logit_bias`, `min_tokens`; transformers' greedy tokens under
//! vLLM's semantics, `scripts/make_reference_fixtures.py --controls`) on
//! this device, all cases in one batch, twice (the second pass reuses the
//! device penalty slots the first gave back, and runs the overlapped step
//! loop, `Engine::decode_async`: each step queued before the previous one's
//! tokens are judged), with every decode step replayed from captured graphs
//! when asked. On CUDA the penalties come
//! from the device counts (`ember_engine::sampling::penalty_state`) unless
//! `--device-penalties false` (`EMBER_DEVICE_PENALTIES=0`), which keeps them
//! as host edits.

use anyhow::Context;
use ember_engine::model::ModelSource;
use ember_engine::params::named_options::with_named_options;
use ember_engine::{Engine, EngineConfig, EngineDevice, KvBudget, SeqId, SequenceRequest};
use serde_json::{json, Value};

/// Runs `dir/controls.json`'s cases (if the fixture has them) on `device`.
pub fn check_controls(
    dir: &std::path::Path,
    device: EngineDevice,
    graphs: bool,
) -> anyhow::Result<Value> {
    let path = dir.join("controls.json");
    if !path.exists() {
        return Ok(Value::Null);
    }
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let cases = fixture["cases"]
        .as_array()
        .context("controls.json: no cases")?;
    let n = fixture["new_tokens"].as_u64().unwrap_or(16) as usize;
    let config = EngineConfig {
        kv: KvBudget::Blocks(128),
        max_batch: 16,
        prefix_caching: false,
        ..EngineConfig::new(ModelSource::Dir(dir.to_path_buf()))
    };
    let mut engine = Engine::new(&config, &device)?;
    let hardware = if graphs {
        engine.capture_decode_graphs(&[1, 2, 4, 8, 16])
    } else {
        0
    };
    let mut passes = Vec::new();
    for pass in 0..2u64 {
        let base = pass * 1000;
        let reqs: Vec<SequenceRequest> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| request(base + i as SeqId, c, n))
            .collect::<anyhow::Result<_>>()?;
        let overlapped = pass == 1;
        let got = generate(&mut engine, reqs, base, cases.len(), overlapped)?;
        let failed: Vec<String> = cases
            .iter()
            .zip(&got)
            .filter(|(c, g)| ids(&c["tokens"]) != **g)
            .map(|(c, g)| {
                format!(
                    "{} (prompt {}): got {g:?}",
                    c["name"],
                    ids(&c["prompt"]).len()
                )
            })
            .collect();
        println!(
            "  controls pass {pass}{}: {} of {} cases match transformers token for token{}",
            if overlapped { " (overlapped loop)" } else { "" },
            cases.len() - failed.len(),
            cases.len(),
            if graphs {
                format!(" ({hardware} hardware graphs)")
            } else {
                String::new()
            }
        );
        for f in &failed {
            println!("    differs: {f}");
        }
        passes.push(json!({"cases": cases.len(), "overlapped": overlapped, "failed": failed}));
    }
    Ok(json!({"hardware_graphs": hardware, "passes": passes}))
}

/// The request `case` describes (its options under OpenAI / vLLM names).
fn request(id: SeqId, case: &Value, n: usize) -> anyhow::Result<SequenceRequest> {
    let mut r = SequenceRequest::greedy(id, ids(&case["prompt"]), n);
    r.params = with_named_options(r.params, &case["options"]).map_err(anyhow::Error::msg)?;
    r.params.stop.ignore_eos = false;
    Ok(r)
}

/// Every request's emitted tokens, decoded in one batch until all finish
/// (`overlapped`: each step queued before the previous one is judged);
/// request ids are `base..base + count`.
pub fn generate(
    engine: &mut Engine,
    reqs: Vec<SequenceRequest>,
    base: SeqId,
    count: usize,
    overlapped: bool,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let mut got = vec![Vec::new(); count];
    let mut out = engine.prefill(reqs)?;
    loop {
        for t in &out.tokens {
            got[(t.id - base) as usize].push(t.token);
        }
        let ids = engine.decoding();
        if ids.is_empty() && !engine.has_pending() {
            return Ok(got);
        }
        out = match overlapped {
            true => engine.decode_async(&ids)?,
            false => engine.decode(&ids)?,
        };
    }
}

/// The ids in JSON array `v` (non-integers skipped).
fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .map(|x| x as u32)
        .collect()
}
