//! GPT-2 hyper-parameters: presets and HF `config.json` parsing.
//!
//! The field names follow Hugging Face's `GPT2Config` so a `config.json` from
//! any GPT-2 size (gpt2, gpt2-medium, ...) maps one to one; unknown fields in
//! the JSON are ignored.

use std::path::Path;

use burn::config::Config;
use serde::Deserialize;

use super::error::ModelError;

/// Shape of a GPT-2 model.
#[derive(Config, Debug)]
pub struct Gpt2Config {
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block; `n_embd` must be divisible by it.
    pub n_head: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Longest sequence (prompt + generated) the position table covers.
    pub n_positions: usize,
    /// Vocabulary size (rows of the token embedding and of the tied LM head).
    pub vocab_size: usize,
    /// LayerNorm epsilon.
    #[config(default = 1e-5)]
    pub layer_norm_epsilon: f64,
    /// The token that ends a sequence (unless its request ignores EOS):
    /// `config.json`'s `eos_token_id`, GPT-2's `<|endoftext|>` (50256) when
    /// absent and for the presets.
    #[config(default = 50256)]
    pub eos_token_id: u32,
}

/// The subset of HF's `config.json` we read (serde ignores the rest).
#[derive(Deserialize)]
struct HfGpt2Json {
    n_layer: usize,
    n_head: usize,
    n_embd: usize,
    n_positions: usize,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "default_eos")]
    eos_token_id: u32,
}

fn default_eps() -> f64 {
    1e-5
}

fn default_eos() -> u32 {
    50256
}

impl Gpt2Config {
    /// GPT-2 small (124M parameters).
    pub fn gpt2() -> Self {
        Self::new(12, 12, 768, 1024, 50257)
    }

    /// A tiny GPT-2 for tests: 2 layers, 4 heads, 128 wide, GPT-2's vocabulary.
    pub fn tiny() -> Self {
        Self::new(2, 4, 128, 1024, 50257)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head.max(1)
    }

    /// Reads the GPT-2 fields of a Hugging Face `config.json`.
    pub fn from_hf_json(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let json: HfGpt2Json = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let config = Self::new(
            json.n_layer,
            json.n_head,
            json.n_embd,
            json.n_positions,
            json.vocab_size,
        )
        .with_layer_norm_epsilon(json.layer_norm_epsilon)
        .with_eos_token_id(json.eos_token_id);
        config.validate()?;
        Ok(config)
    }

    /// Checks the invariants the model relies on.
    pub fn validate(&self) -> Result<(), ModelError> {
        let nonzero = [
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
            ("n_positions", self.n_positions),
            ("vocab_size", self.vocab_size),
        ];
        if let Some((name, _)) = nonzero.iter().find(|(_, v)| *v == 0) {
            return Err(ModelError::InvalidConfig(format!("{name} must be > 0")));
        }
        if self.eos_token_id as usize >= self.vocab_size {
            return Err(ModelError::InvalidConfig(format!(
                "eos_token_id {} is not below vocab_size {}",
                self.eos_token_id, self.vocab_size
            )));
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ModelError::InvalidConfig(format!(
                "n_embd {} is not divisible by n_head {}",
                self.n_embd, self.n_head
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hf_config_and_ignores_extra_fields() {
        let dir = std::env::temp_dir().join(format!("ember-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"{"n_layer":2,"n_head":4,"n_embd":64,"n_positions":128,"vocab_size":1000,
                "eos_token_id":999,"layer_norm_epsilon":1e-5,"model_type":"gpt2","activation_function":"gelu_new"}"#,
        )
        .unwrap();
        let c = Gpt2Config::from_hf_json(&path).unwrap();
        assert_eq!(
            (c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size),
            (2, 4, 64, 128, 1000)
        );
        assert_eq!(c.eos_token_id, 999);
        assert_eq!(
            Gpt2Config::gpt2().eos_token_id,
            50256,
            "the presets: GPT-2's"
        );
        assert_eq!(c.head_dim(), 16);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_indivisible_heads_and_an_eos_outside_the_vocabulary() {
        let c = Gpt2Config::new(1, 3, 64, 16, 10).with_eos_token_id(0);
        assert!(matches!(c.validate(), Err(ModelError::InvalidConfig(_))));
        let c = Gpt2Config::new(1, 4, 64, 16, 10).with_eos_token_id(10);
        assert!(
            matches!(c.validate(), Err(ModelError::InvalidConfig(m)) if m.contains("eos_token_id"))
        );
    }
}
