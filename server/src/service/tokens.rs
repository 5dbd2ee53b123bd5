//! The tokenizer on its own, for both doors: `Tokenize` / `Detokenize` on
//! gRPC, `/tokenize` / `/detokenize` on HTTP (vLLM's routes).
//!
//! Tokenizing is exactly what a generate request's prompt goes through
//! (the same tokenizer, on tokio's blocking pool, as `Frontend::generate`
//! does), so a client can count a prompt's tokens before sending it. Neither
//! needs the model: the context length is reported once it is loaded.
//! Detokenizing refuses an id outside the vocabulary, naming it
//! (`token_ids[3]`, or the door's own field name).

use ember_common::pb;
use tonic::{Request, Response, Status};

use super::error::ServiceError;
use super::state::ServiceState;

/// A text's token ids and the context they must fit in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokenized {
    pub ids: Vec<u32>,
    /// The model's context length (`None` while it loads).
    pub max_model_len: Option<usize>,
}

/// `text`'s token ids, tokenized off the async runtime.
pub async fn tokenize(state: &ServiceState, text: String) -> Result<Tokenized, ServiceError> {
    let tokenizer = state.tokenizer.clone();
    let ids = tokio::task::spawn_blocking(move || tokenizer.encode(&text))
        .await
        .map_err(|e| ServiceError::Tokenizer(e.to_string()))?
        .map_err(|e| ServiceError::Tokenizer(e.to_string()))?;
    Ok(Tokenized {
        ids,
        max_model_len: state.max_model_len(),
    })
}

/// The text of `ids`; `field` names the list in errors (`field[i]`).
pub fn detokenize(state: &ServiceState, ids: &[u32], field: &str) -> Result<String, ServiceError> {
    let vocab = state.tokenizer.vocab_size();
    if let Some(i) = ids.iter().position(|&t| t as usize >= vocab) {
        return Err(ServiceError::invalid(
            format!("{field}[{i}]"),
            format!("{} is not a token id (the vocabulary has {vocab})", ids[i]),
        ));
    }
    Ok(state.tokenizer.decode(ids))
}

/// The gRPC `Tokenize` call.
pub async fn grpc_tokenize(
    state: &ServiceState,
    request: Request<pb::TokenizeRequest>,
) -> Result<Response<pb::TokenizeResponse>, Status> {
    let t = tokenize(state, request.into_inner().prompt).await?;
    Ok(Response::new(pb::TokenizeResponse {
        count: t.ids.len() as u32,
        token_ids: t.ids,
        max_model_len: t.max_model_len.map_or(0, |n| n as u32),
    }))
}

/// The gRPC `Detokenize` call.
pub fn grpc_detokenize(
    state: &ServiceState,
    request: Request<pb::DetokenizeRequest>,
) -> Result<Response<pb::DetokenizeResponse>, Status> {
    let prompt = detokenize(state, &request.into_inner().token_ids, "token_ids")?;
    Ok(Response::new(pb::DetokenizeResponse { prompt }))
}
