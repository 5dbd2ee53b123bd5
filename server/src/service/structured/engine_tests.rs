//! Structured output through the real engine (the tiny preset, random
//! weights, on the CPU): several sequences in one batch, greedy and sampled,
//! each with its own constraint from [`constraint`], all end with EOS and
//! their text parses and validates against the schema. With random weights
//! the model has no idea of JSON: everything valid about the output comes
//! from the mask.

use std::collections::HashMap;

use ember_common::tokenizer::Gpt2Tokenizer;
use ember_engine::model::{ModelSource, Preset};
use ember_engine::{
    Engine, EngineConfig, EngineDevice, FinishReason, KvBudget, SamplingParams, SequenceRequest,
};
use serde_json::{json, Value};

use super::*;

const EOS: u32 = 50256;
/// GPT-2's tokens as its models emit them.
const TOKENS: ModelTokens = ModelTokens {
    eos: EOS,
    vocab_size: 50257,
};

fn engine() -> Engine {
    let config = EngineConfig {
        block_size: 16,
        kv: KvBudget::Blocks(256),
        max_batch: 16,
        bucketed: Some(false),
        ..EngineConfig::new(ModelSource::Preset {
            preset: Preset::Tiny,
            seed: 11,
        })
    };
    Engine::new(&config, &EngineDevice::cpu().expect("cpu")).expect("engine")
}

/// Runs `reqs` to their end; each sequence's tokens and finish reason.
fn run(engine: &mut Engine, reqs: Vec<SequenceRequest>) -> HashMap<u64, (Vec<u32>, FinishReason)> {
    let mut active: Vec<u64> = reqs.iter().map(|r| r.id).collect();
    let mut tokens: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut done = HashMap::new();
    let mut out = engine.prefill(reqs).expect("prefill");
    loop {
        for t in &out.tokens {
            tokens.entry(t.id).or_default().push(t.token);
        }
        for f in &out.finished {
            active.retain(|id| *id != f.id);
            done.insert(f.id, (tokens.remove(&f.id).unwrap_or_default(), f.reason));
        }
        if active.is_empty() {
            return done;
        }
        out = engine.decode(&active).expect("decode");
    }
}

#[test]
fn every_sequence_of_a_batch_ends_in_valid_json_with_random_weights() {
    let tokenizer = Gpt2Tokenizer::embedded().unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 10},
            "rank": {"type": "integer", "minimum": 1, "maximum": 50},
            "tags": {"type": "array", "items": {"enum": ["big", "old", "wet"]}, "maxItems": 3}
        },
        "required": ["city", "rank", "tags"],
        "additionalProperties": false
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    let formats = [
        ResponseFormat::JsonSchema { schema },
        ResponseFormat::JsonObject,
    ];
    let prompt = tokenizer.encode("The answer, as JSON:").unwrap();
    let mut engine = engine();
    let mut reqs = Vec::new();
    let mut kinds = HashMap::new();
    for (f, format) in formats.iter().enumerate() {
        for s in 0..3u64 {
            let id = (f as u64) * 10 + s;
            let sampling = if s == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 1.0,
                    seed: Some(s),
                    min_p: 0.0,
                }
            };
            reqs.push({
                let mut r = SequenceRequest::greedy(id, prompt.clone(), 400);
                r.params.stop.ignore_eos = false;
                r.params.sampling = sampling;
                r.params.constraint = constraint(format, &tokenizer, TOKENS).unwrap();
                r
            });
            kinds.insert(id, f);
        }
    }
    for (id, (tokens, reason)) in run(&mut engine, reqs) {
        let text = tokenizer.decode(&tokens);
        if kinds[&id] == 1 && reason == FinishReason::Length {
            // Free-form JSON need not close within the limit: that is the
            // documented `length` case (json_object is unbounded).
            continue;
        }
        assert_eq!(reason, FinishReason::Eos, "sequence {id}: {text:?}");
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("sequence {id}: not JSON ({e}): {text:?}"));
        if kinds[&id] == 0 {
            assert!(validator.is_valid(&value), "sequence {id}: {text}");
        } else {
            assert!(value.is_object(), "sequence {id}: {text}");
        }
    }
    assert_eq!(engine.kv_blocks_used(), 0);
}
