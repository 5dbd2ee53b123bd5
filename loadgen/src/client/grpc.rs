//! The `ember` backend: one `Generate` call over Ember's gRPC API. Submit it,
//! read its stream, timestamp every event on the client's monotonic clock,
//! and keep the server's timeline (`Started`, each `Token.server_time_ns`,
//! `Finished.timing`) next to it.
//!
//! A [`GrpcConn`] is one HTTP/2 connection (a tonic `Channel` built by one
//! `Endpoint::connect`); it carries many streams. `--api-key` goes into every
//! call's metadata as `authorization: Bearer KEY`; `https://` targets use TLS
//! (`client::tls`).
//!
//! Nothing here fails a benchmark: a gRPC error, a client deadline or a
//! stream that ends early becomes a record with `ok: false` and the status
//! code's name.

use std::time::{Duration, Instant};

use ember_common::pb::generate_response::Event;
use ember_common::pb::inference_client::InferenceClient;
use ember_common::pb::{
    FinishReason, GenerateRequest, GenerateResponse, GetServerInfoRequest, SamplingParams,
    ServerTiming,
};
use tokio::sync::oneshot;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

use crate::client::tls;
use crate::config::ConnConfig;
use crate::error::Error;
use crate::record::{ns_since, Begin, RequestRecord, ServerRecord, Slot, TokenSource};
use crate::workload::turns::flatten;
use crate::workload::{PreparedRequest, Prompt};

/// How long opening one connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 connection window: thousands of streams share one connection.
const CONNECTION_WINDOW: u32 = 16 << 20;

/// The server's bounds on a request's length (`GetServerInfo`), for
/// `--max-new-tokens none`: gRPC has no "unset", so loadgen asks for the
/// server's limit, fitted to what the context leaves after the prompt (what
/// Ember's chat endpoint does for a request without a limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// `knobs.max_new_tokens_limit` (0: not reported).
    pub max_new_tokens: u32,
    /// `n_positions`: the model's context (0: not reported).
    pub context: u32,
}

impl ServerLimits {
    /// The limit to send for a prompt of `prompt_tokens` (when known).
    pub fn fit(&self, prompt_tokens: Option<u32>) -> u32 {
        match prompt_tokens {
            Some(p) if self.context > 0 => self.max_new_tokens.min(self.context.saturating_sub(p)),
            _ => self.max_new_tokens,
        }
    }
}

/// One HTTP/2 connection to an Ember server.
#[derive(Debug, Clone)]
pub struct GrpcConn {
    /// The client over this connection; cloned per request (cheap).
    client: InferenceClient<Channel>,
    /// `authorization: Bearer KEY`, if `--api-key`.
    auth: Option<MetadataValue<tonic::metadata::Ascii>>,
    /// The server's bounds, read at connect (`--max-new-tokens none`).
    limits: ServerLimits,
}

impl GrpcConn {
    /// Opens one connection to `target` now (so connection setup is not in
    /// the first requests' latency and a wrong address fails fast).
    pub async fn connect(target: &str, conn: &ConnConfig) -> Result<GrpcConn, Error> {
        let bad = |reason: String| Error::BadTarget {
            flag: "--target",
            target: target.to_string(),
            reason,
        };
        let mut endpoint = Endpoint::from_shared(target.to_string())
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .initial_connection_window_size(CONNECTION_WINDOW);
        if target.starts_with("https://") {
            let (config, verifier) = tls::grpc_config(conn.tls_ca.as_deref())?;
            endpoint = endpoint
                .tls_config_with_verifier(config, verifier)
                .map_err(|e| Error::Connect {
                    target: target.to_string(),
                    reason: format!("TLS: {}", chain(&e)),
                })?;
        }
        let channel = endpoint.connect().await.map_err(|e| Error::Connect {
            target: target.to_string(),
            reason: chain(&e),
        })?;
        let auth = match &conn.api_key {
            Some(key) => Some(
                format!("Bearer {key}")
                    .parse()
                    .map_err(|_| Error::invalid("--api-key", "is not valid in a header"))?,
            ),
            None => None,
        };
        let mut me = GrpcConn {
            client: InferenceClient::new(channel),
            auth,
            limits: ServerLimits {
                max_new_tokens: 0,
                context: 0,
            },
        };
        if let Ok(info) = me.info().await {
            me.limits = ServerLimits {
                max_new_tokens: info.knobs.map_or(0, |k| k.max_new_tokens_limit),
                context: info.n_positions,
            };
        }
        Ok(me)
    }

    async fn info(&self) -> Result<ember_common::pb::ServerInfo, String> {
        let reply = self
            .client
            .clone()
            .get_server_info(self.request(GetServerInfoRequest {}))
            .await
            .map_err(|s| format!("GetServerInfo: {:?}: {}", s.code(), s.message()))?;
        Ok(reply.into_inner())
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(auth) = &self.auth {
            r.metadata_mut().insert("authorization", auth.clone());
        }
        r
    }

    /// `GetServerInfo`: the model and device, or why not.
    pub async fn describe(&self) -> Result<(String, String), String> {
        let info = self.info().await?;
        Ok((info.model, info.device))
    }

    /// The server's bounds read at connect.
    pub fn limits(&self) -> ServerLimits {
        self.limits
    }

    /// Runs one request to its end. `submitted` receives the instant the call
    /// returned (the relative schedule waits for it).
    pub async fn execute(
        &self,
        target: &str,
        channel: usize,
        prepared: PreparedRequest,
        slot: Slot,
        timeout: Duration,
        submitted: Option<oneshot::Sender<Instant>>,
    ) -> RequestRecord {
        let begin = Begin {
            slot,
            request_id: prepared.request_id.clone(),
            target,
            channel,
            prompt_tokens: prepared.prompt_tokens,
            tokens_from: TokenSource::Server,
            streamed: true,
            keep_reply: prepared.keep_reply,
        };
        let mut request = self.request(message(prepared, self.limits));
        request.set_timeout(timeout);
        let mut client = self.client.clone();
        let submit_start = Instant::now();
        let deadline = tokio::time::Instant::from_std(submit_start + timeout);
        let call = tokio::time::timeout_at(deadline, client.generate(request)).await;
        let submit_end = Instant::now();
        if let Some(tx) = submitted {
            // The scheduler may have stopped waiting; nothing to do then.
            let _ = tx.send(submit_end);
        }
        let mut record = RequestRecord::begin(begin, submit_start, submit_end);
        let mut server = ServerRecord::default();
        let outcome = match call {
            Err(_) => Err((
                Status::deadline_exceeded("client --timeout passed before the call returned"),
                Instant::now(),
            )),
            Ok(Err(status)) => Err((status, submit_end)),
            Ok(Ok(response)) => {
                let stream = response.into_inner();
                read_stream(stream, deadline, slot.t0, &mut record, &mut server).await
            }
        };
        match outcome {
            Ok(at) => record.succeed(ns_since(slot.t0, at), Some(server)),
            Err((status, at)) => record.fail(
                status_name(status.code()).to_string(),
                status.message().to_string(),
                ns_since(slot.t0, at),
            ),
        }
    }
}

/// The error and its causes, one line (tonic's transport errors hide the
/// useful part in `source()`).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// The `GenerateRequest` of a prepared request; without a limit, the
/// server's, fitted to the context.
fn message(p: PreparedRequest, limits: ServerLimits) -> GenerateRequest {
    let max_new_tokens = p
        .max_new_tokens
        .unwrap_or_else(|| limits.fit(p.prompt_tokens));
    let (prompt, prompt_token_ids) = match p.prompt {
        Prompt::Text(t) => (t, Vec::new()),
        Prompt::Ids(ids) => (String::new(), ids),
        Prompt::Turns(messages) => (flatten(&messages), Vec::new()),
    };
    GenerateRequest {
        request_id: p.request_id,
        prompt,
        prompt_token_ids,
        max_new_tokens,
        ignore_eos: p.ignore_eos,
        sampling: p.sampling.map(|s| SamplingParams {
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            seed: s.seed,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Reads `started`, the tokens and `finished`, then the trailers (which carry
/// the final status). Returns when `finished` arrived, or the failure and when.
async fn read_stream(
    mut stream: Streaming<GenerateResponse>,
    deadline: tokio::time::Instant,
    t0: Instant,
    record: &mut RequestRecord,
    server: &mut ServerRecord,
) -> Result<Instant, (Status, Instant)> {
    let mut finished_at = None;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.message()).await;
        let now = Instant::now();
        let message = match next {
            Err(_) => {
                let status = Status::deadline_exceeded("client --timeout passed during the stream");
                return Err((status, now));
            }
            Ok(Err(status)) => return Err((status, now)),
            Ok(Ok(None)) => {
                return finished_at.ok_or_else(|| {
                    let status = Status::unknown("stream ended without a Finished message");
                    (status, now)
                });
            }
            Ok(Ok(Some(message))) => message,
        };
        match message.event {
            Some(Event::Started(started)) => {
                record.prompt_tokens = Some(started.prompt_tokens);
                server.started_server_time_ns = started.server_time_ns;
            }
            // Only asked by other clients; loadgen scores no prompts.
            Some(Event::PromptLogprobs(_)) => {}
            Some(Event::Token(token)) => {
                record.token_recv_ns.push(ns_since(t0, now));
                if let Some(reply) = record.reply.as_mut() {
                    reply.push_str(&token.text);
                }
                server.token_server_time_ns.push(token.server_time_ns);
            }
            Some(Event::Finished(finished)) => {
                finished_at = Some(now);
                if let Some(reply) = record.reply.as_mut() {
                    reply.push_str(&finished.trailing_text);
                }
                record.prompt_tokens = Some(finished.prompt_tokens);
                record.completion_tokens = finished.completion_tokens;
                record.finish_reason = finish_reason_name(finished.finish_reason).map(String::from);
                if let Some(timing) = &finished.timing {
                    set_timing(server, timing);
                }
                if finished.completion_tokens as usize != record.token_recv_ns.len() {
                    tracing::warn!(
                        request_id = %finished.request_id,
                        reported = finished.completion_tokens,
                        received = record.token_recv_ns.len(),
                        "completion_tokens differs from the tokens received"
                    );
                }
            }
            // An event added to the proto after this build: not ours to judge.
            None => {}
        }
    }
}

/// Fills the durations from `Finished.timing`.
fn set_timing(s: &mut ServerRecord, t: &ServerTiming) {
    s.tokenize_ns = t.tokenize_ns;
    s.enqueue_ns = t.enqueue_ns;
    s.queue_wait_ns = t.queue_wait_ns;
    s.prefill_to_first_token_ns = t.prefill_to_first_token_ns;
    s.server_ttft_ns = t.server_ttft_ns;
    s.decode_ns = t.decode_ns;
    s.total_ns = t.total_ns;
    s.prefill_batch_size = t.prefill_batch_size;
    s.admitted_iteration = t.admitted_iteration;
    s.cached_prompt_tokens = t.cached_prompt_tokens;
    s.prefill_chunks = t.prefill_chunks;
}

/// The canonical upper-case name of a gRPC status code ("RESOURCE_EXHAUSTED").
pub fn status_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// "EOS", "LENGTH", "CANCELLED", "STOP"; `None` for an unspecified or
/// unknown value.
pub fn finish_reason_name(value: i32) -> Option<&'static str> {
    match FinishReason::try_from(value).ok()? {
        FinishReason::Eos => Some("EOS"),
        FinishReason::Length => Some("LENGTH"),
        FinishReason::Cancelled => Some("CANCELLED"),
        FinishReason::Stop => Some("STOP"),
        FinishReason::Unspecified => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Sampling;

    #[test]
    fn names() {
        assert_eq!(status_name(Code::ResourceExhausted), "RESOURCE_EXHAUSTED");
        assert_eq!(
            finish_reason_name(FinishReason::Length as i32),
            Some("LENGTH")
        );
        assert_eq!(finish_reason_name(99), None);
    }

    #[test]
    fn prepared_requests_become_generate_requests() {
        let p = PreparedRequest {
            request_id: "r".into(),
            prompt: Prompt::Ids(vec![1, 2]),
            max_new_tokens: Some(3),
            stream: true,
            keep_reply: false,
            ignore_eos: true,
            sampling: Some(Sampling {
                temperature: Some(0.5),
                top_k: None,
                top_p: None,
                min_p: None,
                seed: Some(9),
            }),
            prompt_tokens: Some(2),
        };
        let limits = ServerLimits {
            max_new_tokens: 256,
            context: 1024,
        };
        let m = message(p.clone(), limits);
        assert_eq!((m.prompt.as_str(), m.prompt_token_ids), ("", vec![1, 2]));
        assert_eq!((m.max_new_tokens, m.ignore_eos), (3, true));
        assert_eq!(m.sampling.and_then(|s| s.seed), Some(9));
        let none = PreparedRequest {
            max_new_tokens: None,
            prompt_tokens: Some(900),
            ..p
        };
        assert_eq!(message(none.clone(), limits).max_new_tokens, 124, "fitted");
        let short = PreparedRequest {
            prompt_tokens: Some(5),
            ..none.clone()
        };
        assert_eq!(message(short, limits).max_new_tokens, 256, "the limit");
        let unknown = PreparedRequest {
            prompt_tokens: None,
            ..none
        };
        assert_eq!(message(unknown, limits).max_new_tokens, 256);
    }
}
