//! Structured output: OpenAI's `response_format` (`json_object`,
//! `json_schema`) as a per-sequence token constraint, compiled with
//! llguidance (what vLLM, SGLang and llama.cpp use).
//!
//! A request's format is read once ([`parse_response_format`]); each of its
//! sequences then gets its own constraint ([`constraint`]): a fresh matcher
//! of the grammar, compiled once per distinct schema and vocabulary
//! (`grammars`). The engine asks the constraint for the allowed tokens
//! before each of the sequence's steps and tells it the token sampled.
//!
//! The JSON is compact: no free whitespace, `,` and `:` as separators (as
//! vLLM emits it), so a schema whose values are bounded always finishes,
//! and once the value is closed the end-of-sequence token is the only one
//! allowed. `json_object` is the schema `{"type": "object"}`.
//!
//! Compiling a new schema and building the vocabulary's factory take
//! milliseconds to tens of milliseconds on a CPU core: call [`constraint`]
//! off the async runtime (`spawn_blocking`); [`prepare`] builds the factory
//! ahead of the first request.
//!
//! Layout: `format` (the OpenAI shapes), `wire` (the proto's form), `vocab` (the GPT-2 vocabulary for
//! llguidance, as far as the model emits it), `grammars` (the caches), `matcher` (one sequence's state,
//! the engine's `TokenConstraint`).

mod format;
mod grammars;
mod matcher;
mod vocab;
mod wire;

#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};

use ember_common::tokenizer::Gpt2Tokenizer;
use ember_engine::SharedConstraint;
use llguidance::api::TopLevelGrammar;
use llguidance::JsonCompileOptions;
use serde_json::{json, Value};

use crate::service::error::ServiceError;
pub use format::{parse_response_format, ResponseFormat, SCHEMA_FIELD};
pub use matcher::GrammarMatcher;
pub use vocab::ModelTokens;

/// A fresh constraint for one sequence (`None` for [`ResponseFormat::Text`]).
/// A schema that does not compile is [`ServiceError::InvalidArgument`]
/// naming [`SCHEMA_FIELD`].
pub fn constraint(
    format: &ResponseFormat,
    tokenizer: &Gpt2Tokenizer,
    model: ModelTokens,
) -> Result<Option<SharedConstraint>, ServiceError> {
    let Some(grammar) = grammar(format) else {
        return Ok(None);
    };
    let fresh = grammars::matcher(tokenizer, model, &grammar).map_err(|e| {
        let field = match format {
            ResponseFormat::JsonSchema { .. } => SCHEMA_FIELD,
            _ => "response_format",
        };
        ServiceError::invalid(field, format!("cannot be compiled: {e}"))
    })?;
    let matcher = GrammarMatcher::new(fresh, model.eos, model.vocab_size);
    Ok(Some(Arc::new(Mutex::new(matcher))))
}

/// The constraints of a request's `n` sequences (all `None` for free text),
/// compiled on tokio's blocking pool (a new schema takes milliseconds of
/// CPU), before anything is queued: a schema llguidance refuses is
/// INVALID_ARGUMENT naming [`SCHEMA_FIELD`] and no sequence starts.
pub async fn constraints(
    format: &ResponseFormat,
    n: usize,
    tokenizer: &Gpt2Tokenizer,
    model: ModelTokens,
) -> Result<Vec<Option<SharedConstraint>>, ServiceError> {
    if *format == ResponseFormat::Text {
        return Ok(vec![None; n]);
    }
    let (format, tokenizer) = (format.clone(), tokenizer.clone());
    tokio::task::spawn_blocking(move || {
        (0..n)
            .map(|_| constraint(&format, &tokenizer, model))
            .collect()
    })
    .await
    .map_err(|e| ServiceError::Tokenizer(format!("the grammar compiler failed: {e}")))?
}

/// Builds the token environment for `tokenizer` and `model` now, so the
/// first structured request does not pay for it (tens of milliseconds).
pub fn prepare(tokenizer: &Gpt2Tokenizer, model: ModelTokens) -> Result<(), ServiceError> {
    grammars::prepare(tokenizer, model).map_err(ServiceError::Tokenizer)
}

/// The llguidance grammar of a format: its JSON Schema with compact
/// separators and no free whitespace (overriding any `x-guidance` options
/// the client put in the schema).
fn grammar(format: &ResponseFormat) -> Option<TopLevelGrammar> {
    let mut schema = match format {
        ResponseFormat::Text => return None,
        ResponseFormat::JsonObject => json!({"type": "object"}),
        ResponseFormat::JsonSchema { schema } => schema.clone(),
    };
    if let Value::Object(obj) = &mut schema {
        obj.remove("x-guidance");
        let options = JsonCompileOptions {
            item_separator: ",".into(),
            key_separator: ":".into(),
            whitespace_flexible: false,
            ..JsonCompileOptions::default()
        };
        if let Ok(value) = serde_json::to_value(&options) {
            obj.insert("x-guidance".into(), value);
        }
    }
    Some(TopLevelGrammar::from_json_schema(schema))
}
