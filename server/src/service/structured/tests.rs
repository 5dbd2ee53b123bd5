//! Structured output driven the way the engine drives it, with a random
//! chooser instead of a model: at each step a seeded RNG picks one of the
//! allowed tokens (never the end of sequence while anything else is
//! allowed) until the end of sequence is the only choice. The detokenized
//! text must then parse as JSON, validate against its schema (the
//! `jsonschema` crate, an implementation independent of llguidance) and
//! carry no whitespace outside strings.

use std::sync::OnceLock;
use std::time::Instant;

use ember_common::tokenizer::Gpt2Tokenizer;
use ember_engine::SharedConstraint;
use serde_json::{json, Value};

use super::*;

const EOS: u32 = 50256;
/// GPT-2's tokens as its models emit them.
const TOKENS: ModelTokens = ModelTokens {
    eos: EOS,
    vocab_size: 50257,
};
/// Steps a drive may take before the test calls it a hang.
const MAX_STEPS: usize = 4000;

/// One tokenizer for every test, so the vocabulary's factory is built once.
fn tokenizer() -> &'static Gpt2Tokenizer {
    static TOKENIZER: OnceLock<Gpt2Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Gpt2Tokenizer::embedded().unwrap())
}

/// SplitMix64: a seeded chooser with no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

fn allowed_ids(c: &SharedConstraint) -> Vec<u32> {
    let bits = c.lock().unwrap().allowed().unwrap().expect("a mask");
    assert_eq!(bits.len(), 50257usize.div_ceil(32));
    let mut ids = Vec::new();
    for (w, word) in bits.iter().enumerate() {
        for b in 0..32 {
            if word >> b & 1 == 1 {
                ids.push((w * 32 + b) as u32);
            }
        }
    }
    ids
}

/// Drives `c` to its end; `prefer` may pick a token among the allowed ones
/// (after `budget` steps), else the choice is uniform. Returns the text.
fn drive(c: &SharedConstraint, seed: u64, prefer: &dyn Fn(usize, &[u32]) -> Option<u32>) -> String {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    for step in 0..MAX_STEPS {
        let allowed = allowed_ids(c);
        assert!(!allowed.is_empty(), "nothing allowed after {out:?}");
        if allowed == [EOS] {
            c.lock().unwrap().accept(EOS).unwrap();
            return tokenizer().decode(&out);
        }
        let choices: Vec<u32> = allowed.iter().copied().filter(|&t| t != EOS).collect();
        let token = prefer(step, &choices).unwrap_or_else(|| choices[rng.below(choices.len())]);
        c.lock().unwrap().accept(token).unwrap();
        out.push(token);
    }
    panic!(
        "no end after {MAX_STEPS} steps: {:?}",
        tokenizer().decode(&out)
    );
}

fn uniform(_: usize, _: &[u32]) -> Option<u32> {
    None
}

/// No space, tab or newline outside JSON strings.
fn assert_compact(text: &str) {
    let (mut in_string, mut escaped) = (false, false);
    for ch in text.chars() {
        if in_string {
            match (escaped, ch) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if ch == '"' {
            in_string = true;
        } else {
            assert!(!ch.is_whitespace(), "free whitespace in {text:?}");
        }
    }
}

fn check_schema(schema: Value, seeds: std::ops::Range<u64>) {
    let validator = jsonschema::validator_for(&schema).expect("the test's schema is valid");
    let format = ResponseFormat::JsonSchema {
        schema: schema.clone(),
    };
    for seed in seeds {
        let c = constraint(&format, tokenizer(), TOKENS).unwrap().unwrap();
        let text = drive(&c, seed, &uniform);
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text:?}"));
        assert!(
            validator.is_valid(&value),
            "seed {seed}: {text} does not validate against {schema}"
        );
        assert_compact(&text);
    }
}

#[test]
fn an_object_with_required_properties_always_validates() {
    check_schema(
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "member": {"type": "boolean"}
            },
            "required": ["name", "age", "member"],
            "additionalProperties": false
        }),
        0..6,
    );
}

#[test]
fn an_enum_is_one_of_its_values() {
    check_schema(
        json!({"type": "string", "enum": ["red", "green", "blue"]}),
        0..6,
    );
    check_schema(json!({"enum": [1, "two", null, {"three": 3}]}), 0..6);
}

#[test]
fn an_array_keeps_to_its_bounds() {
    check_schema(
        json!({
            "type": "array",
            "items": {"type": "integer", "minimum": -5, "maximum": 99},
            "minItems": 1,
            "maxItems": 3
        }),
        0..8,
    );
}

#[test]
fn nested_objects_and_references_validate() {
    check_schema(
        json!({
            "$defs": {
                "point": {
                    "type": "object",
                    "properties": {
                        "x": {"type": "integer", "minimum": 0, "maximum": 9},
                        "y": {"type": "integer", "minimum": 0, "maximum": 9}
                    },
                    "required": ["x", "y"],
                    "additionalProperties": false
                }
            },
            "type": "object",
            "properties": {
                "label": {"type": "string", "maxLength": 6},
                "path": {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2},
                "origin": {"$ref": "#/$defs/point"},
                "kind": {"enum": ["line", "loop"]}
            },
            "required": ["label", "path", "origin", "kind"],
            "additionalProperties": false
        }),
        0..5,
    );
}

#[test]
fn json_object_gives_any_json_object() {
    // Free-form JSON never has to end on its own: after 40 steps the chooser
    // prefers the tokens that close things, as a model would eventually.
    let closers: Vec<u32> = ["\"", "}", "]", "0"]
        .iter()
        .map(|s| tokenizer().encode(s).unwrap()[0])
        .collect();
    let prefer = |step: usize, allowed: &[u32]| {
        (step >= 40)
            .then(|| closers.iter().copied().find(|t| allowed.contains(t)))
            .flatten()
    };
    for seed in 0..4 {
        let c = constraint(&ResponseFormat::JsonObject, tokenizer(), TOKENS)
            .unwrap()
            .unwrap();
        let text = drive(&c, seed, &prefer);
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text:?}"));
        assert!(value.is_object(), "{text}");
        assert_compact(&text);
    }
}

#[test]
fn text_has_no_constraint_and_a_bad_schema_names_its_field() {
    assert!(constraint(&ResponseFormat::Text, tokenizer(), TOKENS)
        .unwrap()
        .is_none());
    for bad in [
        json!({"type": "no-such-type"}),
        json!({"type": "array", "minItems": 3, "maxItems": 1}),
        json!({"$ref": "#/$defs/missing"}),
    ] {
        let format = ResponseFormat::JsonSchema {
            schema: bad.clone(),
        };
        match constraint(&format, tokenizer(), TOKENS) {
            Err(ServiceError::InvalidArgument { field, message }) => {
                assert_eq!(field, SCHEMA_FIELD, "{bad}");
                assert!(message.starts_with("cannot be compiled"), "{message}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn a_schema_compiles_once_and_each_sequence_has_its_own_state() {
    let schema = json!({"type": "object", "properties": {"cached": {"type": "boolean"}},
                        "required": ["cached"], "additionalProperties": false});
    let format = ResponseFormat::JsonSchema { schema };
    // A tokenizer of its own: a vocabulary no other test compiles into.
    let own = Gpt2Tokenizer::embedded().unwrap();
    let first = constraint(&format, &own, TOKENS).unwrap().unwrap();
    let second = constraint(&format, &own, TOKENS).unwrap().unwrap();
    assert_eq!(grammars::cached_grammars(&own, TOKENS), 1);
    // Advancing one sequence leaves the other at the start.
    let fresh = allowed_ids(&second);
    let valid = [r#"{"cached":true}"#, r#"{"cached":false}"#];
    let text = drive(&first, 7, &uniform);
    assert!(valid.contains(&text.as_str()), "{text}");
    assert_eq!(allowed_ids(&second), fresh);
    let text = drive(&second, 8, &uniform);
    assert!(valid.contains(&text.as_str()), "{text}");
    // After the end, the end of sequence is all there is.
    assert_eq!(allowed_ids(&first), vec![EOS]);
}

/// How long one mask takes over GPT-2's vocabulary, inside a string (the
/// widest masks: most of the vocabulary allowed) and between values (few
/// tokens allowed). Run with
/// `cargo test --release -p ember-server mask_time -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn mask_time() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 300},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 40},
            "score": {"type": "integer", "minimum": 0, "maximum": 1000}
        },
        "required": ["name", "tags", "score"],
        "additionalProperties": false
    });
    let format = ResponseFormat::JsonSchema { schema };
    let start = Instant::now();
    let _ = prepare(tokenizer(), TOKENS);
    println!("vocabulary factory (first use): {:?}", start.elapsed());
    let start = Instant::now();
    let c = constraint(&format, tokenizer(), TOKENS).unwrap().unwrap();
    println!("schema compile: {:?}", start.elapsed());
    let (mut wide, mut narrow) = (Vec::new(), Vec::new());
    for seed in 0..5 {
        let c = if seed == 0 {
            c.clone()
        } else {
            constraint(&format, tokenizer(), TOKENS).unwrap().unwrap()
        };
        let mut rng = Rng(seed);
        for _ in 0..MAX_STEPS {
            let t = Instant::now();
            let allowed = allowed_ids(&c);
            let took = t.elapsed();
            if allowed.len() > 10_000 {
                &mut wide
            } else {
                &mut narrow
            }
            .push(took);
            if allowed == [EOS] {
                break;
            }
            let choices: Vec<u32> = allowed.into_iter().filter(|&t| t != EOS).collect();
            let token = choices[rng.below(choices.len())];
            c.lock().unwrap().accept(token).unwrap();
        }
    }
    for (name, times) in [
        ("> 10k tokens allowed", &mut wide),
        ("<= 10k allowed", &mut narrow),
    ] {
        times.sort();
        if times.is_empty() {
            continue;
        }
        println!(
            "{name}: {} masks, p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
            times.len(),
            times[times.len() / 2],
            times[times.len() * 9 / 10],
            times[times.len() * 99 / 100],
            times[times.len() - 1]
        );
    }
}
