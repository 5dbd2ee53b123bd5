//! A request's `response_format` made into the engine's constraints, one per
//! choice (each sequence needs its own matcher; the grammar is compiled once
//! per schema, [`super::structured`]). Compiling a new schema takes
//! milliseconds of CPU, so it runs on tokio's blocking pool, before anything
//! is queued: a schema llguidance refuses is INVALID_ARGUMENT naming
//! `response_format.json_schema.schema`, and no choice starts.

use ember_engine::SharedConstraint;

use super::error::ServiceError;
use super::options::GenerationOptions;
use super::state::ServiceState;
use super::structured::{self, ResponseFormat};

/// The constraint of each of `options.n` sequences (all `None` for free
/// text); `eos` is the model's end-of-sequence token.
pub async fn constraints(
    options: &GenerationOptions,
    state: &ServiceState,
    eos: u32,
) -> Result<Vec<Option<SharedConstraint>>, ServiceError> {
    let n = options.n.max(1) as usize;
    if options.response_format == ResponseFormat::Text {
        return Ok(vec![None; n]);
    }
    let (format, tokenizer) = (options.response_format.clone(), state.tokenizer.clone());
    tokio::task::spawn_blocking(move || {
        (0..n)
            .map(|_| structured::constraint(&format, &tokenizer, eos))
            .collect()
    })
    .await
    .map_err(|e| ServiceError::Tokenizer(format!("the grammar compiler failed: {e}")))?
}
