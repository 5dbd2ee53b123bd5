//! The HTTP front door: an OpenAI-compatible API on the same scheduler as
//! gRPC (`--http-listen`).
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`,
//! `GET /v1/models`, vLLM's `POST /tokenize`, `POST /detokenize` and
//! `GET /tokenizer_info` (these ask for the API key when keys are set),
//! `GET /health` (200 only when SERVING) and `GET /version` (always open).
//! Anything else is a 404 in OpenAI's error shape. docs/http-api.md is the
//! wire contract, Ember's timeline extension included.
//!
//! Layout (requests flow top to bottom, and so do the imports; [`App`], the
//! routes' shared state, and the header names live in `app.rs`, below all):
//! - [`serve`]: the accept loop (plain or TLS, HTTP/1.1 and HTTP/2) and its
//!   graceful stop.
//! - `handlers`: the routes: headers (deadline, request id), the body, the
//!   translation, then [`Frontend::generate`], the request path the gRPC
//!   door uses too.
//! - [`completions`], [`chat`] (with its template), [`params`] (what both
//!   share), [`fields`] (typed field access): OpenAI's JSON into the
//!   service's `GenerateRequest`, wrong types refused by field name.
//! - [`tokenize`]: the tokenizer routes (the service's `tokens`).
//! - [`respond`]: the event stream (every prompt's, every choice's) into SSE
//!   chunks or one JSON body, with `prompt_view` (what a choice's prompt adds:
//!   `echo`, prompt logprobs), using [`shapes`], the JSON builders.
//! - [`error`]: OpenAI's error shape, statuses derived from the service's
//!   gRPC codes, field names renamed to the request's own.

mod app;
pub mod chat;
pub mod completions;
pub mod error;
pub mod fields;
mod handlers;
pub mod params;
mod prompt_view;
pub mod respond;
pub mod serve;
pub mod shapes;
pub mod tokenize;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::metrics::{self, FrontDoor};
use crate::service::auth::ApiKeys;
use crate::service::Frontend;
pub use app::{App, DEADLINE_HEADER, REQUEST_ID_HEADER};
use error::HttpError;

/// The HTTP API's router.
pub fn router(frontend: Frontend, model_name: String, keys: ApiKeys) -> Router {
    let app = Arc::new(App {
        frontend,
        model_name,
        keys,
        started: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let api = Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/models", get(handlers::models))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            require_key,
        ));
    Router::new()
        .merge(api)
        .route("/health", get(handlers::health))
        .route("/version", get(handlers::version))
        .fallback(no_route)
        .with_state(app)
}

/// Lets a request through only with a configured API key (when any is).
async fn require_key(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match app.keys.check(auth) {
        Ok(()) => next.run(req).await,
        Err(e) => {
            metrics::rejected("unauthenticated", FrontDoor::Http);
            tracing::debug!(path = %req.uri().path(), reason = %e, "HTTP request refused: API key");
            drain_small_body(req.into_body()).await;
            HttpError::unauthorized(e).into_response()
        }
    }
}

async fn no_route(method: Method, uri: Uri, body: Body) -> Response {
    drain_small_body(body).await;
    HttpError::no_route(method.as_str(), uri.path()).into_response()
}

/// Most of a refused request's body read and dropped.
const DRAIN_MAX_BYTES: usize = 64 << 10;
/// How long a refused request's body may take to arrive.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Reads (and drops) the body of a request refused before its handler read
/// it, up to [`DRAIN_MAX_BYTES`] and [`DRAIN_TIMEOUT`]. Answering first
/// would make hyper reset an HTTP/2 stream the client is still sending on,
/// which curl reports as a stream error instead of the refusal; a larger or
/// slower body is not waited for.
async fn drain_small_body(body: Body) {
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, axum::body::to_bytes(body, DRAIN_MAX_BYTES)).await;
}
