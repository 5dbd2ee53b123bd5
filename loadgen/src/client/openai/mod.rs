//! The `openai` backend: one streamed request to an OpenAI-compatible server
//! (`POST /v1/completions` or `/v1/chat/completions`, `stream: true`), read as
//! Server-Sent Events.
//!
//! Client times mean what they mean on gRPC: submit start is just before the
//! request is written, submit end is when the response head arrived, each
//! token event is stamped when the bytes that completed it arrived, finish is
//! `[DONE]`. TTFT, ITL and TPOT come from those stamps; the token count from
//! `usage` (the request asks for it with `stream_options.include_usage`), or
//! the chunk count when the server sends none. Ember's extension, when
//! present, gives the server's timeline; without it the record has none and
//! the report says "not reported by this server".
//!
//! Failures become records: an HTTP error status is `HTTP_<code>` with the
//! OpenAI error body's message, an `error` event in the stream is
//! `STREAM_ERROR`, a transport failure `UNAVAILABLE`, the client's
//! `--timeout` `DEADLINE_EXCEEDED`.
//!
//! A non-streaming request (`--stream false`, `stream: false`) is one JSON
//! body: submit end is its head, the finish (and the first token) its last
//! byte ([`whole`]).
//!
//! Layout: [`conn`] (connections and the HTTP/1.1 pool), [`sse`] (event
//! framing), [`wire`] (JSON both ways), [`stream`] (a streamed response into
//! a record), [`whole`] (a non-streaming one).

pub mod conn;
pub mod sse;
pub mod stream;
pub mod whole;
pub mod wire;

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Method, Request, StatusCode};
use tokio::sync::oneshot;

use crate::client::openai::conn::{Connections, Dialer, Used};
use crate::client::openai::stream::{End, Reader};
use crate::config::{ConnConfig, Endpoint, HttpVersion};
use crate::error::Error;
use crate::record::{ns_since, Begin, RequestRecord, Slot, TokenSource};
use crate::workload::PreparedRequest;

/// Error bodies are read up to this size.
const ERROR_BODY_LIMIT: usize = 64 << 10;

/// One target's connections (an HTTP/1.1 pool or one HTTP/2 connection) and
/// what every request to it carries.
#[derive(Debug)]
pub struct HttpConn {
    /// Address, TLS, paths.
    dialer: Dialer,
    /// The connections.
    conns: Connections,
    /// `/v1/completions` or `/v1/chat/completions`.
    endpoint: Endpoint,
    /// The request path of `endpoint`.
    path: String,
    /// The `model` of every request.
    pub model: String,
    /// `authorization: Bearer KEY`, if `--api-key`.
    auth: Option<HeaderValue>,
    /// `--extra-inputs`, added to every body.
    extra: Vec<(String, serde_json::Value)>,
}

impl HttpConn {
    /// Opens the connection(s) to `url` and finds the model (`--model`, else
    /// the first of GET /v1/models).
    pub async fn connect(url: &str, conn: &ConnConfig) -> Result<HttpConn, Error> {
        let dialer = Dialer::new(url, conn)?;
        let connect_err = |reason: String| Error::Connect {
            target: url.to_string(),
            reason,
        };
        let conns = Connections::connect(&dialer).await.map_err(connect_err)?;
        let auth = match &conn.api_key {
            Some(key) => Some(
                HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| Error::invalid("--api-key", "is not valid in a header"))?,
            ),
            None => None,
        };
        let path = dialer.path(match conn.endpoint {
            Endpoint::Completions => "/completions",
            Endpoint::Chat => "/chat/completions",
        });
        let mut me = HttpConn {
            dialer,
            conns,
            endpoint: conn.endpoint,
            path,
            model: String::new(),
            auth,
            extra: conn.extra_inputs.clone(),
        };
        me.model = match &conn.model {
            Some(m) => m.clone(),
            None => me.first_model().await.map_err(connect_err)?,
        };
        Ok(me)
    }

    /// A request with the headers every call carries.
    fn request(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<Request<Full<hyper::body::Bytes>>, String> {
        let mut b = Request::builder()
            .method(method)
            .uri(self.dialer.uri(path))
            .header(
                USER_AGENT,
                concat!("ember-loadgen/", env!("CARGO_PKG_VERSION")),
            )
            .header(CONTENT_TYPE, "application/json");
        if self.dialer.version == HttpVersion::Http1 {
            b = b.header(HOST, &self.dialer.authority);
        }
        if let Some(auth) = &self.auth {
            b = b.header(AUTHORIZATION, auth.clone());
        }
        b.body(Full::new(body.into())).map_err(|e| e.to_string())
    }

    /// GET /v1/models: the first model's id.
    async fn first_model(&self) -> Result<String, String> {
        let path = self.dialer.path("/models");
        let req = self.request(Method::GET, &path, Vec::new())?;
        let (resp, used) = self.conns.send(&self.dialer, req).await?;
        let status = resp.status();
        let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
            .await
            .map_err(|_| format!("GET {path}: no body within 10 s"))?
            .map_err(|e| format!("GET {path}: {e}"))?
            .to_bytes();
        self.conns.release(used);
        if status != StatusCode::OK {
            return Err(format!(
                "GET {path}: HTTP {status}: {} (pass --model NAME)",
                wire::error_message(&body)
            ));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| format!("GET {path}: {e}"))?;
        v["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("GET {path}: no model listed (pass --model NAME)"))
    }

    /// Connections opened so far.
    pub fn connections(&self) -> usize {
        self.conns.opened()
    }

    /// Runs one request to its end. `submitted` receives the instant the
    /// response head arrived (the relative schedule waits for it).
    pub async fn execute(
        &self,
        channel: usize,
        prepared: PreparedRequest,
        slot: Slot,
        timeout: Duration,
        submitted: Option<oneshot::Sender<Instant>>,
    ) -> RequestRecord {
        let begin = Begin {
            slot,
            request_id: prepared.request_id.clone(),
            target: &self.dialer.url,
            channel,
            prompt_tokens: prepared.prompt_tokens,
            tokens_from: TokenSource::Chunks,
            streamed: prepared.stream,
            keep_reply: prepared.keep_reply,
        };
        let body = wire::body(&prepared, self.endpoint, &self.model, &self.extra);
        let accept = if prepared.stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let req = self.request(Method::POST, &self.path, body).map(|mut r| {
            let h = r.headers_mut();
            h.insert(ACCEPT, HeaderValue::from_static(accept));
            if let Ok(id) = HeaderValue::from_str(&prepared.request_id) {
                h.insert("x-request-id", id);
            }
            r
        });
        let submit_start = Instant::now();
        let deadline = tokio::time::Instant::from_std(submit_start + timeout);
        let sent = match req {
            Ok(req) => tokio::time::timeout_at(deadline, self.conns.send(&self.dialer, req))
                .await
                .unwrap_or_else(|_| Err("client --timeout passed before the response".into())),
            Err(e) => Err(e),
        };
        let submit_end = Instant::now();
        if let Some(tx) = submitted {
            // The scheduler may have stopped waiting; nothing to do then.
            let _ = tx.send(submit_end);
        }
        let mut record = RequestRecord::begin(begin, submit_start, submit_end);
        let (resp, used) = match sent {
            Ok(r) => r,
            Err(m) => {
                let status = if Instant::now() >= deadline.into_std() {
                    "DEADLINE_EXCEEDED"
                } else {
                    "UNAVAILABLE"
                };
                return record.fail(status.into(), m, ns_since(slot.t0, submit_end));
            }
        };
        if resp.status() != StatusCode::OK {
            return self
                .failed_status(record, resp, used, deadline, slot.t0)
                .await;
        }
        if !record.streamed {
            return self.whole(record, resp, used, deadline, slot.t0).await;
        }
        let (end, reader) = Reader::default()
            .read(resp.into_body(), deadline, slot.t0, &mut record)
            .await;
        match end {
            End::Ok(at) => {
                self.conns.release(used);
                let server = reader.apply(&mut record);
                record.succeed(ns_since(slot.t0, at), server)
            }
            End::Failed(status, m, at) => {
                reader.apply(&mut record);
                record.fail(status, m, ns_since(slot.t0, at))
            }
        }
    }

    /// A non-streaming 200: the body to its end, then what it says.
    async fn whole(
        &self,
        mut record: RequestRecord,
        resp: hyper::Response<hyper::body::Incoming>,
        used: Used,
        deadline: tokio::time::Instant,
        t0: Instant,
    ) -> RequestRecord {
        let body = tokio::time::timeout_at(deadline, resp.into_body().collect()).await;
        let at = ns_since(t0, Instant::now());
        let bytes = match body {
            Err(_) => {
                let m = "client --timeout passed during the body".to_string();
                return record.fail("DEADLINE_EXCEEDED".into(), m, at);
            }
            Ok(Err(e)) => {
                let m = format!("the body broke: {e}");
                return record.fail("UNAVAILABLE".into(), m, at);
            }
            Ok(Ok(b)) => b.to_bytes(),
        };
        self.conns.release(used);
        match whole::read(&bytes, &mut record) {
            Ok((server, text)) => {
                if let Some(reply) = record.reply.as_mut() {
                    *reply = text;
                }
                record.succeed(at, server)
            }
            Err(m) => record.fail("BAD_RESPONSE".into(), m, at),
        }
    }

    /// An error status: read the error body (bounded) into the record.
    async fn failed_status(
        &self,
        record: RequestRecord,
        resp: hyper::Response<hyper::body::Incoming>,
        used: Used,
        deadline: tokio::time::Instant,
        t0: Instant,
    ) -> RequestRecord {
        let status = resp.status();
        let limited = http_body_util::Limited::new(resp.into_body(), ERROR_BODY_LIMIT);
        let body = match tokio::time::timeout_at(deadline, limited.collect()).await {
            Ok(Ok(b)) => {
                self.conns.release(used);
                b.to_bytes()
            }
            _ => Default::default(),
        };
        let message = wire::error_message(&body);
        record.fail(
            format!("HTTP_{}", status.as_u16()),
            message,
            ns_since(t0, Instant::now()),
        )
    }
}
