//! Generation options read from their OpenAI / vLLM names in a JSON object
//! (`repetition_penalty`, `frequency_penalty`, `presence_penalty`,
//! `logit_bias`, `min_tokens`, `stop_token_ids`): how the reference
//! fixtures name a case's options (`scripts/make_reference_fixtures.py
//! --controls`), read the same way by the engine's tests and by
//! `ember-engine-bench --reference`. The doors have their own typed
//! mappings (the server's `http/params.rs` and `service/proto_params.rs`).

use serde_json::Value;

use super::{GenerationParams, LogitTransforms, Penalties};

/// `params` with the options `o` names set (absent ones off); `logit_bias`
/// sorted by token. A `logit_bias` key that is not a token id is an error
/// naming it.
pub fn with_named_options(
    mut params: GenerationParams,
    o: &Value,
) -> Result<GenerationParams, String> {
    let f = |name: &str, default: f32| o[name].as_f64().map_or(default, |v| v as f32);
    let mut logit_bias = Vec::new();
    for (k, v) in o["logit_bias"].as_object().into_iter().flatten() {
        let token = k
            .parse::<u32>()
            .map_err(|e| format!("logit_bias key {k:?}: {e}"))?;
        logit_bias.push((token, v.as_f64().unwrap_or(0.0) as f32));
    }
    logit_bias.sort_by_key(|e| e.0);
    params.transforms = LogitTransforms {
        penalties: Penalties {
            repetition: f("repetition_penalty", 1.0),
            frequency: f("frequency_penalty", 0.0),
            presence: f("presence_penalty", 0.0),
        },
        logit_bias,
    };
    params.stop.min_tokens = o["min_tokens"].as_u64().unwrap_or(0) as usize;
    params.stop.stop_token_ids = o["stop_token_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .map(|x| x as u32)
        .collect();
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_options_land_in_their_groups_and_a_bad_key_is_named() {
        let o = serde_json::json!({
            "frequency_penalty": 0.5, "logit_bias": {"633": 4.0, "17": -1.0},
            "min_tokens": 6, "stop_token_ids": [633]
        });
        let p = with_named_options(GenerationParams::greedy(8), &o).unwrap();
        assert_eq!(p.transforms.penalties.frequency, 0.5);
        assert_eq!(p.transforms.penalties.repetition, 1.0);
        assert_eq!(p.transforms.logit_bias, [(17, -1.0), (633, 4.0)]);
        assert_eq!(
            (p.stop.min_tokens, p.stop.stop_token_ids.clone()),
            (6, vec![633])
        );
        let bad = serde_json::json!({"logit_bias": {"x": 1.0}});
        let err = with_named_options(GenerationParams::greedy(8), &bad).unwrap_err();
        assert!(err.contains("\"x\""), "{err}");
    }
}
