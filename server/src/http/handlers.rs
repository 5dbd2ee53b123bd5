//! The routes' handlers: translate in, call the one request path, translate
//! out.
//!
//! `POST /v1/completions` and `/v1/chat/completions`: t = 0 (`received`) is
//! taken when the handler is entered; the `x-request-timeout` header (seconds)
//! becomes the request's deadline, `x-request-id` its id; the body is read
//! (at most [`MAX_BODY_BYTES`]) and translated ([`super::completions`],
//! [`super::chat`]); the `model` it names must be the served one; then
//! [`Frontend::generate`](crate::service::Frontend::generate) validates,
//! tokenizes and enqueues, and the events become SSE or a JSON body
//! ([`super::respond`]). A refusal at any step is counted once, by the
//! service ([`Frontend::refuse`](crate::service::Frontend::refuse) for the
//! translation's own, `generate` for the rest).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::app::{App, DEADLINE_HEADER, REQUEST_ID_HEADER};
use super::error::HttpError;
use super::fields::{self, BODY};
use super::params::Translated;
use super::prompt_view::PromptOptions;
use super::respond::{self, ChunkWriter, Collector, Events, Translator};
use super::shapes::Api;
use crate::metrics::FrontDoor;
use crate::service::error::ServiceError;
use crate::service::{Arrival, GenerateOptions};
use futures::StreamExt;

/// Largest request body read (a prompt fills the context long before).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Longest deadline accepted in `x-request-timeout` (a day).
const MAX_TIMEOUT_S: f64 = 86_400.0;

pub async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate(app, Api::Completions, headers, body).await
}

pub async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate(app, Api::Chat, headers, body).await
}

async fn generate(app: Arc<App>, api: Api, headers: HeaderMap, body: Body) -> Response {
    let received = Instant::now();
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let echo_id = headers.get(REQUEST_ID_HEADER).cloned();
    let mut response = match respond_to(&app, api, &headers, body, received, created).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    if let Some(id) = echo_id {
        response.headers_mut().insert(REQUEST_ID_HEADER, id);
    }
    response
}

async fn respond_to(
    app: &App,
    api: Api,
    headers: &HeaderMap,
    body: Body,
    received: Instant,
    created: u64,
) -> Result<Response, HttpError> {
    let request_id = headers.get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok());
    let refuse = |err: ServiceError| {
        app.frontend.refuse(&err, FrontDoor::Http, request_id);
        HttpError::from_service(&err, None)
    };
    let deadline = deadline(headers).map_err(refuse)?.map(|d| received + d);
    let bytes = read_body(headers, body)
        .await
        .map_err(|(err, status)| HttpError {
            status,
            code: (status == StatusCode::PAYLOAD_TOO_LARGE).then_some("request_too_large"),
            ..refuse(err)
        })?;
    let obj = fields::parse_body(&bytes).map_err(refuse)?;
    let mut t: Translated = match api {
        Api::Completions => super::completions::translate(&obj),
        Api::Chat => super::chat::translate(&obj, &app.frontend.state().knobs),
    }
    .map_err(refuse)?;
    if let Some(asked) = &t.common.model {
        if *asked != app.model_name {
            return Err(refuse(ServiceError::ModelNotFound {
                asked: asked.clone(),
                served: app.model_name.clone(),
            }));
        }
    }
    if let Some(id) = headers.get(REQUEST_ID_HEADER) {
        t.request.request_id = id
            .to_str()
            .map_err(|_| {
                refuse(ServiceError::invalid(
                    REQUEST_ID_HEADER,
                    "must be visible ASCII",
                ))
            })?
            .to_string();
    }
    let arrival = Arrival {
        door: FrontDoor::Http,
        received,
        deadline,
    };
    let events = generate_all(app, &t, arrival).await?;
    let tokenizer = app.frontend.state().tokenizer.clone();
    let texts = t
        .prompts
        .iter()
        .map(|p| match p.ids.is_empty() {
            true => p.text.clone(),
            false => tokenizer.decode(&p.ids),
        })
        .collect();
    let prompts = PromptOptions {
        echo: t.echo,
        prompt_logprobs: t.common.prompt_logprobs.is_some(),
        n: t.request.n.max(1),
        texts,
    };
    let logprobs = t.request.logprobs.is_some();
    let translator = Translator::new(
        (api, created, &app.model_name),
        tokenizer,
        logprobs,
        prompts,
    );
    if t.common.stream {
        let writer = ChunkWriter::new(translator, t.common.include_usage);
        return Ok(respond::sse(events, writer));
    }
    let body = respond::collect(events, Collector::new(translator)).await?;
    Ok(Json(body).into_response())
}

/// One `generate` call per prompt (each numbering its choices on from the
/// previous one's), merged into one event stream. A prompt refused after
/// earlier ones were queued drops their streams, which cancels them.
async fn generate_all(app: &App, t: &Translated, arrival: Arrival) -> Result<Events, HttpError> {
    let n = t.request.n.max(1);
    let mut streams = Vec::with_capacity(t.prompts.len());
    for (i, p) in t.prompts.iter().enumerate() {
        let mut request = t.request.clone();
        request.prompt = p.text.clone();
        request.prompt_token_ids = p.ids.clone();
        let options = GenerateOptions {
            first_choice: i as u32 * n,
            ..t.options
        };
        let events = app
            .frontend
            .generate(request, options, arrival)
            .await
            .map_err(|e| HttpError::from_service(&e, Some(&t.names)))?;
        streams.push(events);
    }
    Ok(futures::stream::select_all(streams).boxed())
}

/// `x-request-timeout: SECONDS` (a positive decimal number), if sent.
fn deadline(headers: &HeaderMap) -> Result<Option<Duration>, ServiceError> {
    let Some(value) = headers.get(DEADLINE_HEADER) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("");
    match text.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s <= MAX_TIMEOUT_S => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err(ServiceError::invalid(
            DEADLINE_HEADER,
            format!(
                "must be a number of seconds above 0 and at most {MAX_TIMEOUT_S}, got {text:?}"
            ),
        )),
    }
}

/// The body, at most [`MAX_BODY_BYTES`]; else why not, and the status
/// (413 when too large).
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<u8>, (ServiceError, StatusCode)> {
    let too_large = || {
        let message = format!("larger than {MAX_BODY_BYTES} bytes");
        (
            ServiceError::invalid(BODY, message),
            StatusCode::PAYLOAD_TOO_LARGE,
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => Ok(bytes.to_vec()),
        Err(e) => {
            let message = format!("could not be read (at most {MAX_BODY_BYTES} bytes): {e}");
            Err((
                ServiceError::invalid(BODY, message),
                StatusCode::BAD_REQUEST,
            ))
        }
    }
}

/// `GET /v1/models`: the one served model.
pub async fn models(State(app): State<Arc<App>>) -> Response {
    let max_len = app.frontend.state().max_model_len();
    Json(json!({
        "object": "list",
        "data": [{
            "id": app.model_name,
            "object": "model",
            "created": app.started,
            "owned_by": "ember",
            "root": app.model_name,
            "parent": null,
            "max_model_len": max_len,
        }]
    }))
    .into_response()
}

/// `GET /health`: 200 only when SERVING (loaded, warmed up, not draining).
pub async fn health(State(app): State<Arc<App>>) -> Response {
    if app.frontend.is_serving() {
        (StatusCode::OK, Json(json!({ "status": "SERVING" }))).into_response()
    } else {
        let mut r = (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "NOT_SERVING" })),
        )
            .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        r
    }
}

/// `GET /version`: always 200.
pub async fn version() -> Response {
    Json(json!({ "version": env!("CARGO_PKG_VERSION") })).into_response()
}
