//! The mock's HTTP door: the OpenAI-compatible API as Ember serves it
//! (`POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`,
//! `GET /health`, `GET /version`, and `GET /metrics`: the mock's running and
//! waiting requests under vLLM's Prometheus names), HTTP/1.1 and HTTP/2 (h2c, or ALPN with
//! TLS) on one listener, served by hyper.
//!
//! A streamed request follows the shared [`timeline`](super::timeline): each
//! token chunk is its own body frame, rendered (and stamped) when hyper takes
//! it for the socket at its due time, so a client sees the same timing as on
//! the gRPC door. Errors are OpenAI error bodies:
//! 400 with `param` naming the field, 401 without the API key (on `/v1/*`;
//! health and version stay open), 429 for the `fail_every` rejections, 404
//! for unknown paths.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::mock::chunks::{self, Chunker, Kind};
use crate::mock::config::TlsIdentity;
use crate::mock::prefix::words;
use crate::mock::timeline::{drive, ns, Shared, Stamps, Step};

/// Response body: a whole JSON document or an SSE stream.
type Body = BoxBody<Bytes, Infallible>;

/// Most concurrent HTTP/2 streams per connection.
const MAX_STREAMS: u32 = 20_000;

/// A rustls server config for `tls` offering h2 and http/1.1.
fn server_tls(tls: &TlsIdentity) -> std::io::Result<TlsAcceptor> {
    let certs = CertificateDer::pem_slice_iter(tls.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| std::io::Error::other(format!("mock TLS certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(tls.key_pem.as_bytes())
        .map_err(|e| std::io::Error::other(format!("mock TLS key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(std::io::Error::other)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves the HTTP door on `listener` until `stop` fires (connections still
/// open then end with the runtime or when their clients close them).
pub(crate) fn spawn(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) -> std::io::Result<JoinHandle<()>> {
    let tls = shared.cfg.tls.as_ref().map(server_tls).transpose()?;
    Ok(tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = &mut stop => return,
                a = listener.accept() => a,
            };
            let (tcp, _) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "mock HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            // Each token is its own small write: no Nagle delay.
            let _ = tcp.set_nodelay(true);
            tokio::spawn(connection(tcp, tls.clone(), shared.clone()));
        }
    }))
}

/// Serves one connection (after the TLS handshake, if any).
async fn connection(tcp: tokio::net::TcpStream, tls: Option<TlsAcceptor>, shared: Arc<Shared>) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(MAX_STREAMS);
    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
    let served = match tls {
        Some(acceptor) => match acceptor.accept(tcp).await {
            Ok(stream) => {
                builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await
            }
            Err(e) => {
                tracing::debug!(error = %e, "mock TLS handshake failed");
                return;
            }
        },
        None => builder.serve_connection(TokioIo::new(tcp), service).await,
    };
    if let Err(e) = served {
        tracing::debug!(error = %e, "mock HTTP connection ended");
    }
}

fn full(status: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error(status: StatusCode, message: &str, kind: &str, param: Option<&str>) -> Response<Body> {
    let code = status
        .canonical_reason()
        .map(|r| r.to_lowercase().replace(' ', "_"));
    full(
        status,
        &chunks::error(message, kind, param, code.as_deref()),
    )
}

/// Routes one request.
async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let received = Instant::now();
    let serving = shared.serving.load(Ordering::Acquire);
    Ok(match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") if serving => full(StatusCode::OK, &json!({"status": "ok"})),
        (&Method::GET, "/health") => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "mock: not serving yet",
            "service_unavailable",
            None,
        ),
        (&Method::GET, "/version") => full(StatusCode::OK, &json!({"version": "mock"})),
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(Full::new(Bytes::from(shared.metrics())).boxed());
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        (&Method::GET, "/v1/models") if !authorized(&shared, &req) => unauthorized(),
        (&Method::GET, "/v1/models") => full(
            StatusCode::OK,
            &json!({"object": "list", "data": [
                {"id": "mock", "object": "model", "created": 0, "owned_by": "ember"}]}),
        ),
        (&Method::POST, "/v1/completions") => {
            generate(shared, req, received, Kind::Completions).await
        }
        (&Method::POST, "/v1/chat/completions") => {
            generate(shared, req, received, Kind::Chat).await
        }
        (_, path) => error(
            StatusCode::NOT_FOUND,
            &format!("mock: no route {path}"),
            "invalid_request_error",
            None,
        ),
    })
}

/// What the mock reads from a generation request.
#[derive(Debug)]
struct Params {
    /// `model` (echoed in the chunks).
    model: String,
    /// Whitespace words of the prompt text, or the number of token ids.
    prompt_tokens: u32,
    /// The prompt's tokens (ids, or hashed words), for the prefix cache.
    tokens: Vec<u64>,
    /// `max_tokens` (or `max_completion_tokens`); OpenAI's default is 16.
    max_tokens: u32,
    /// `stream`.
    stream: bool,
    /// `stream_options.include_usage`.
    include_usage: bool,
}

/// Reads the request's fields; `Err((param, message))` for a bad one.
fn params(v: &Value, kind: Kind) -> Result<Params, (&'static str, String)> {
    let tokens: Vec<u64> = match kind {
        Kind::Completions => match &v["prompt"] {
            Value::Array(ids) if ids.iter().all(Value::is_u64) && !ids.is_empty() => {
                ids.iter().filter_map(Value::as_u64).collect()
            }
            p => words(
                p.as_str()
                    .ok_or(("prompt", "prompt: must be a string or token ids".into()))?,
            )
            .collect(),
        },
        Kind::Chat => v["messages"]
            .as_array()
            .filter(|m| !m.is_empty())
            .ok_or(("messages", "messages: must be a non-empty array".into()))?
            .iter()
            .flat_map(|m| words(m["content"].as_str().unwrap_or("")))
            .collect(),
    };
    let prompt_tokens = tokens.len() as u32;
    let max = v
        .get("max_tokens")
        .or_else(|| v.get("max_completion_tokens"));
    let max_tokens = match max {
        None | Some(Value::Null) => 16,
        Some(m) => match m.as_u64().and_then(|m| u32::try_from(m).ok()) {
            Some(m) if m >= 1 => m,
            _ => return Err(("max_tokens", format!("max_tokens: must be >= 1 (got {m})"))),
        },
    };
    Ok(Params {
        model: v["model"].as_str().unwrap_or("mock").to_string(),
        prompt_tokens,
        tokens,
        max_tokens,
        stream: v["stream"].as_bool().unwrap_or(false),
        include_usage: v["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false),
    })
}

/// 401 with OpenAI's error body.
fn unauthorized() -> Response<Body> {
    let m = "mock: missing or wrong API key (authorization: Bearer KEY)";
    error(StatusCode::UNAUTHORIZED, m, "authentication_error", None)
}

/// Whether the request carries the configured API key (if one is set).
fn authorized(shared: &Shared, req: &Request<Incoming>) -> bool {
    let Some(key) = &shared.cfg.api_key else {
        return true;
    };
    let sent = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    sent == Some(format!("Bearer {key}").as_str())
}

/// A completion or chat request: validate, then stream (or answer whole).
async fn generate(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    received: Instant,
    kind: Kind,
) -> Response<Body> {
    if !authorized(&shared, &req) {
        return unauthorized();
    }
    let n = shared.arrive();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &e.to_string(),
                "invalid_request_error",
                None,
            )
        }
    };
    let p = match serde_json::from_slice::<Value>(&body)
        .map_err(|e| (None, format!("the body is not JSON: {e}")))
        .and_then(|v| params(&v, kind).map_err(|(f, m)| (Some(f), m)))
    {
        Ok(p) => p,
        Err((param, m)) => {
            return error(StatusCode::BAD_REQUEST, &m, "invalid_request_error", param)
        }
    };
    if shared.rejects(n) {
        let m = "mock: pending queue is full";
        return error(StatusCode::TOO_MANY_REQUESTS, m, "rate_limit_error", None);
    }
    let tokenized = received.elapsed();
    if !shared.cfg.submit_delay.is_zero() {
        tokio::time::sleep(shared.cfg.submit_delay).await;
    }
    let mut stamps = Stamps::new(received, (tokenized, received.elapsed()));
    stamps.cached = shared.prefix.lookup(&p.tokens);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let chunker = Chunker {
        kind,
        id: match kind {
            Kind::Completions => format!("cmpl-mock-{n}"),
            Kind::Chat => format!("chatcmpl-mock-{n}"),
        },
        created,
        model: p.model.clone(),
        ember: shared.cfg.ember_fields,
    };
    let call = Call {
        shared,
        chunker,
        p,
        stamps,
        n,
    };
    if call.p.stream {
        call.stream()
    } else {
        call.whole().await
    }
}

/// One accepted generation request.
struct Call {
    /// The mock's state.
    shared: Arc<Shared>,
    /// Builds the chunks.
    chunker: Chunker,
    /// What the request asked for.
    p: Params,
    /// The handler's marks.
    stamps: Stamps,
    /// Arrival number (the `admitted_iteration` reported).
    n: usize,
}

/// The SSE body: renders each step of the timeline when hyper polls it to
/// write it, so each token is stamped as it goes to the socket.
struct SseBody {
    /// The timeline's steps.
    rx: mpsc::Receiver<Step>,
    /// Builds the chunks.
    chunker: Chunker,
    /// The request's marks.
    stamps: Stamps,
    /// Chunks ready to go (the role chunk; the tail after the last token).
    queued: VecDeque<Bytes>,
    /// `usage` after the finish chunk, with the prompt's token count.
    usage: Option<u32>,
    /// Arrival number (the `admitted_iteration` reported).
    n: usize,
    /// Tokens rendered so far.
    sent: u32,
}

impl hyper::body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let me = &mut *self;
        loop {
            if let Some(b) = me.queued.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            let step = match me.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(step)) => step,
            };
            match step {
                Step::Admitted(d) => me.stamps.admitted = d,
                Step::Token(i) => {
                    let t = me.stamps.token();
                    me.sent += 1;
                    return Poll::Ready(Some(Ok(Frame::data(me.chunker.token(i, ns(t))))));
                }
                Step::Done => {
                    let timing = me.stamps.marks().timing(me.n as u64);
                    me.queued.push_back(me.chunker.finish("length", &timing));
                    if let Some(prompt) = me.usage {
                        me.queued.push_back(me.chunker.usage(prompt, me.sent));
                    }
                    me.queued.push_back(chunks::done());
                }
                Step::Failed(k) => {
                    let m = format!("mock: engine failure after {k} tokens");
                    let e = chunks::error(&m, "server_error", None, None);
                    me.queued.push_back(chunks::event(&e));
                    me.queued.push_back(chunks::done());
                }
            }
        }
    }
}

impl Call {
    /// The SSE response; a task drives the timeline, the body renders it.
    fn stream(self) -> Response<Body> {
        let (tx, rx) = mpsc::channel(64);
        let (tokens, fails) = self.shared.tokens_for(self.p.max_tokens);
        let (shared, received) = (self.shared.clone(), self.stamps.received);
        tokio::spawn(async move { drive(&shared, received, tokens, fails, tx).await });
        let mut queued = VecDeque::new();
        if self.chunker.kind == Kind::Chat {
            queued.push_back(self.chunker.role());
        }
        let body = SseBody {
            rx,
            chunker: self.chunker,
            stamps: self.stamps,
            queued,
            usage: (self.p.include_usage && self.shared.cfg.usage).then_some(self.p.prompt_tokens),
            n: self.n,
            sent: 0,
        };
        let mut r = Response::new(BodyExt::boxed(body));
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    }

    /// A non-streaming request: the whole response once every token is due.
    async fn whole(mut self) -> Response<Body> {
        let (tokens, fails) = self.shared.tokens_for(self.p.max_tokens);
        let (tx, mut rx) = mpsc::channel(64);
        let (shared, received) = (self.shared.clone(), self.stamps.received);
        tokio::spawn(async move { drive(&shared, received, tokens, fails, tx).await });
        while let Some(step) = rx.recv().await {
            match step {
                Step::Admitted(d) => self.stamps.admitted = d,
                Step::Token(_) => {
                    self.stamps.token();
                }
                Step::Done => {
                    let timing = self.stamps.marks().timing(self.n as u64);
                    let v = self.chunker.whole(tokens, self.p.prompt_tokens, &timing);
                    return full(StatusCode::OK, &v);
                }
                Step::Failed(_) => break,
            }
        }
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("mock: engine failure after {tokens} tokens"),
            "server_error",
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_name_the_bad_field() {
        let ok = params(
            &json!({"model": "m", "prompt": "a b c", "max_tokens": 4, "stream": true,
                    "stream_options": {"include_usage": true}}),
            Kind::Completions,
        )
        .expect("valid");
        assert_eq!(
            (ok.prompt_tokens, ok.max_tokens, ok.stream, ok.include_usage),
            (3, 4, true, true)
        );
        let ids = params(&json!({"prompt": [1, 2]}), Kind::Completions).expect("ids");
        assert_eq!((ids.prompt_tokens, ids.max_tokens), (2, 16));
        let chat = params(
            &json!({"messages": [{"role": "user", "content": "hi there"}], "max_completion_tokens": 2}),
            Kind::Chat,
        )
        .expect("chat");
        assert_eq!((chat.prompt_tokens, chat.max_tokens), (2, 2));
        let bad = |v: Value, kind| params(&v, kind).expect_err("invalid").0;
        assert_eq!(
            bad(json!({"prompt": "a", "max_tokens": 0}), Kind::Completions),
            "max_tokens"
        );
        assert_eq!(bad(json!({"prompt": 3}), Kind::Completions), "prompt");
        assert_eq!(bad(json!({"messages": []}), Kind::Chat), "messages");
    }
}
