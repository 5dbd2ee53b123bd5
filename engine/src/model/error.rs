//! Errors from building or loading a GPT-2 model.
//!
//! Every message names what went wrong precisely enough to fix it without a
//! debugger: the file, the tensor key, and both shapes when they disagree.

use std::path::PathBuf;

/// Why a model could not be configured or loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `config.json` is not valid JSON or lacks a required field.
    #[error("invalid model config {path}: {message}")]
    Config { path: PathBuf, message: String },
    /// The safetensors file could not be parsed.
    #[error("invalid safetensors file {path}: {message}")]
    Safetensors { path: PathBuf, message: String },
    /// A tensor the model needs is not in the checkpoint.
    #[error("missing tensor `{name}` (expected shape {expected:?})")]
    MissingTensor { name: String, expected: Vec<usize> },
    /// A tensor exists but has the wrong shape.
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    /// A tensor is stored in a dtype we cannot convert (only f32/f16/bf16 are).
    #[error("tensor `{name}` has unsupported dtype {dtype}")]
    UnsupportedDtype { name: String, dtype: String },
    /// `lm_head.weight` is present but differs from `wte.weight` (untied head).
    #[error("`lm_head.weight` is not tied to `wte.weight`; untied LM heads are not supported")]
    UntiedLmHead,
    /// The configuration cannot describe a GPT-2 (e.g. n_embd not divisible by n_head).
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    /// The device failed while the weights were uploaded.
    #[error("uploading the weights failed: {0}")]
    Device(String),
    /// An unknown preset name.
    #[error("unknown preset `{0}` (expected `gpt2` or `tiny`)")]
    UnknownPreset(String),
}
