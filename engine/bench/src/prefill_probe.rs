//! Prints and returns [`Engine::probe_prefill_graph`]'s findings: where a
//! replayed prefill step parts from the eager one (issue 45).

use ember_engine::Engine;
use serde_json::json;

/// Probes `prompts`' captured prefill step; `null` where it has none.
pub fn probe(engine: &mut Engine, prompts: &[Vec<u32>]) -> serde_json::Value {
    let Ok(p) = engine.probe_prefill_graph(prompts) else {
        return serde_json::Value::Null;
    };
    let first = p.kv_diffs.iter().position(|&(k, v)| k > 0.0 || v > 0.0);
    println!(
        "  prefill probe: buffers not holding the step after a replay: {:?}; logits {:e} (a second replay after the eager step {:e}); first layer whose K/V differ: {first:?}; recaptured over the step: {:?}",
        p.buffers_differ, p.logits_diff, p.after_eager_diff, p.recaptured_diff
    );
    println!(
        "  prefill probe: per layer max |K|, |V| replayed - eager: {:?}",
        p.kv_diffs
    );
    json!({"buffers_differ": p.buffers_differ, "logits_diff": p.logits_diff, "after_eager_diff": p.after_eager_diff,
           "kv_diffs": p.kv_diffs, "first_layer_differing": first,
           "recaptured_diff": p.recaptured_diff})
}
