//! Test-only access to the transformers reference fixture
//! (`engine/tests/fixtures/tiny-gpt2`, made by `scripts/make_reference_fixtures.py`).

use std::path::PathBuf;

use serde::Deserialize;

/// The fixture model directory.
pub fn tiny_gpt2_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gpt2")
}

/// One prompt and what transformers computed for it.
#[derive(Debug, Deserialize)]
pub struct Case {
    pub prompt: Vec<u32>,
    /// Logits at the prompt's last position.
    pub last_logits: Vec<f32>,
    /// Greedy continuation (no EOS stopping).
    pub greedy: Vec<u32>,
    /// Logits that chose the last token of `greedy`.
    pub final_logits: Vec<f32>,
}

/// `reference.json`.
#[derive(Debug, Deserialize)]
pub struct Reference {
    pub new_tokens: usize,
    pub cases: Vec<Case>,
}

pub fn reference() -> Reference {
    let text = std::fs::read_to_string(tiny_gpt2_dir().join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Largest absolute elementwise difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// One controlled continuation of `controls.json`.
#[derive(Debug, Deserialize)]
pub struct ControlCase {
    pub name: String,
    pub prompt: Vec<u32>,
    /// The request's options under their OpenAI / vLLM names.
    pub options: serde_json::Value,
    /// The greedy tokens emitted (a stop token or EOS is not).
    pub tokens: Vec<u32>,
}

/// One prompt's logprobs in `controls.json`: per position from the second,
/// the prompt token's logprob and the top alternatives `(id, logprob)`.
#[derive(Debug, Deserialize)]
pub struct PromptLogprobCase {
    pub prompt: Vec<u32>,
    pub top: usize,
    pub logprobs: Vec<PromptTokenLogprob>,
}

#[derive(Debug, Deserialize)]
pub struct PromptTokenLogprob {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// `controls.json`.
#[derive(Debug, Deserialize)]
pub struct Controls {
    pub new_tokens: usize,
    pub cases: Vec<ControlCase>,
    pub prompt_logprobs: Vec<PromptLogprobCase>,
}

pub fn controls() -> Controls {
    let text = std::fs::read_to_string(tiny_gpt2_dir().join("controls.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// One case of `filters.json`: the tokens transformers' warpers keep for
/// reference case `case`'s last-position logits under `options`.
#[derive(Debug, Deserialize)]
pub struct FilterCase {
    pub case: usize,
    /// `temperature`, and `top_k`, `top_p`, `min_p` where set.
    pub options: serde_json::Value,
    /// Kept token ids, ascending.
    pub kept: Vec<u32>,
}

/// `filters.json`.
#[derive(Debug, Deserialize)]
pub struct Filters {
    pub filters: Vec<FilterCase>,
}

pub fn filters() -> Filters {
    let text = std::fs::read_to_string(tiny_gpt2_dir().join("filters.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}
