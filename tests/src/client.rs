//! tonic client helpers: connect, run one `Generate` stream to its end with
//! client receive times, health checks and `GetServerInfo` polling (the
//! polling itself is `ember_testkit::health`'s, one copy for all crates).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use ember_common::pb::{
    generate_response::Event, inference_client::InferenceClient, Finished, GenerateRequest,
    GetServerInfoRequest, SamplingParams, ServerInfo, Started, Token,
};
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;

/// The Ember client type the tests use.
pub type Client = InferenceClient<Channel>;

/// One HTTP/2 connection to `addr` (plain text).
pub async fn channel(addr: SocketAddr) -> anyhow::Result<Channel> {
    Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connect to {addr}"))
}

/// An Ember client on a fresh connection to `addr`.
pub async fn connect(addr: SocketAddr) -> anyhow::Result<Client> {
    Ok(InferenceClient::new(channel(addr).await?))
}

/// A text-prompt request; `ignore_eos` makes the token count exact.
pub fn text_request(prompt: &str, max_new_tokens: u32, ignore_eos: bool) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_owned(),
        max_new_tokens,
        ignore_eos,
        ..Default::default()
    }
}

/// A pre-tokenized request that generates exactly `max_new_tokens` tokens.
pub fn ids_request(ids: Vec<u32>, max_new_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt_token_ids: ids,
        max_new_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

/// Sampling parameters with every field unset (greedy).
pub fn greedy() -> SamplingParams {
    SamplingParams::default()
}

/// Everything one `Generate` call produced, with client receive instants.
#[derive(Debug)]
pub struct StreamOutcome {
    /// When the call was started (before `generate().await`).
    pub call_start: Instant,
    pub started: Option<(Started, Instant)>,
    pub tokens: Vec<(Token, Instant)>,
    pub finished: Option<(Finished, Instant)>,
    /// `prompt_logprobs` messages (when the request asked for them).
    pub prompt_logprobs: Vec<ember_common::pb::PromptLogprobs>,
    /// The status that ended the call or the stream, if not a clean end.
    pub status: Option<tonic::Status>,
    /// When `status` arrived.
    pub status_at: Option<Instant>,
    /// Messages after `finished` or out of order (must stay empty).
    pub protocol_errors: Vec<String>,
}

impl StreamOutcome {
    /// An empty outcome of a call started at `call_start`.
    pub fn new(call_start: Instant) -> Self {
        StreamOutcome {
            call_start,
            started: None,
            tokens: Vec::new(),
            finished: None,
            prompt_logprobs: Vec::new(),
            status: None,
            status_at: None,
            protocol_errors: Vec::new(),
        }
    }

    /// `Ok` for a clean `finished`, else the status code.
    pub fn code(&self) -> tonic::Code {
        match (&self.status, &self.finished) {
            (Some(s), _) => s.code(),
            (None, Some(_)) => tonic::Code::Ok,
            (None, None) => tonic::Code::Unknown,
        }
    }

    /// The finish reason, if the stream finished.
    pub fn finish_reason(&self) -> Option<ember_common::pb::FinishReason> {
        self.finished.as_ref().map(|(f, _)| f.finish_reason())
    }

    /// One line for failure messages.
    pub fn summary(&self) -> String {
        format!(
            "started={} tokens={} finished={:?} status={:?} protocol_errors={:?}",
            self.started.is_some(),
            self.tokens.len(),
            self.finished
                .as_ref()
                .map(|(f, _)| (f.finish_reason(), f.completion_tokens)),
            self.status
                .as_ref()
                .map(|s| (s.code(), s.message().to_owned())),
            self.protocol_errors
        )
    }
}

/// Runs one `Generate` to its end (finished message, error status or end of
/// stream). `grpc_timeout` sets the `grpc-timeout` header only: the server
/// must enforce it, the client does not.
pub async fn generate(
    client: &mut Client,
    req: GenerateRequest,
    grpc_timeout: Option<Duration>,
) -> StreamOutcome {
    generate_observed(client, req, grpc_timeout, |_| {}).await
}

/// [`generate`], calling `observe` with the outcome so far after every
/// message (e.g. to signal "started" or "first token" to the test).
pub async fn generate_observed(
    client: &mut Client,
    req: GenerateRequest,
    grpc_timeout: Option<Duration>,
    mut observe: impl FnMut(&StreamOutcome),
) -> StreamOutcome {
    let mut out = StreamOutcome::new(Instant::now());
    let mut request = tonic::Request::new(req);
    if let Some(t) = grpc_timeout {
        request.set_timeout(t);
    }
    let mut stream = match client.generate(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            out.status = Some(s);
            out.status_at = Some(Instant::now());
            observe(&out);
            return out;
        }
    };
    while let Some(item) = stream.next().await {
        let now = Instant::now();
        match item {
            Ok(msg) => record(&mut out, msg.event, now),
            Err(s) => {
                out.status = Some(s);
                out.status_at = Some(now);
                observe(&out);
                break;
            }
        }
        observe(&out);
    }
    out
}

/// Files one stream message into `out`, noting order violations.
pub fn record(out: &mut StreamOutcome, event: Option<Event>, now: Instant) {
    if out.finished.is_some() {
        out.protocol_errors
            .push(format!("message after finished: {event:?}"));
        return;
    }
    match event {
        Some(Event::Started(s)) => {
            if out.started.is_some() || !out.tokens.is_empty() {
                out.protocol_errors
                    .push("started twice or after a token".into());
            }
            out.started = Some((s, now));
        }
        Some(Event::Token(t)) => {
            if out.started.is_none() {
                out.protocol_errors.push("token before started".into());
            }
            if t.index as usize != out.tokens.len() {
                out.protocol_errors.push(format!(
                    "token index {} at position {}",
                    t.index,
                    out.tokens.len()
                ));
            }
            out.tokens.push((t, now));
        }
        Some(Event::Finished(f)) => out.finished = Some((f, now)),
        Some(Event::PromptLogprobs(p)) => {
            if out.started.is_none() || !out.tokens.is_empty() {
                out.protocol_errors
                    .push("prompt logprobs before started or after a token".into());
            }
            out.prompt_logprobs.push(p);
        }
        None => out.protocol_errors.push("message without event".into()),
    }
}

/// The health status of `service` ("" = the whole server).
pub async fn health(addr: SocketAddr, service: &str) -> anyhow::Result<ServingStatus> {
    let endpoint =
        ember_testkit::health::endpoint(&format!("http://{addr}")).map_err(|e| anyhow!(e))?;
    ember_testkit::health::check(&endpoint, service)
        .await
        .map_err(|e| anyhow!("health check {service:?}: {e}"))
}

/// Health of both "" and `ember.v1.Inference`, which must agree.
pub async fn health_both(addr: SocketAddr) -> anyhow::Result<ServingStatus> {
    let all = health(addr, "").await?;
    let svc = health(addr, ember_common::SERVICE_NAME).await?;
    if all != svc {
        bail!(
            "health disagrees: \"\" is {all:?}, {} is {svc:?}",
            ember_common::SERVICE_NAME
        );
    }
    Ok(all)
}

/// Polls until health is SERVING for both names, up to `timeout`.
pub async fn wait_serving(addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let names = ["", ember_common::SERVICE_NAME];
    ember_testkit::health::wait_serving(&format!("http://{addr}"), &names, deadline, || None)
        .await
        .map_err(|e| anyhow!("not SERVING within {timeout:?}: {e}"))
}

/// `GetServerInfo` on a fresh connection.
pub async fn server_info(addr: SocketAddr) -> anyhow::Result<ServerInfo> {
    let mut c = connect(addr).await?;
    Ok(c.get_server_info(GetServerInfoRequest {})
        .await?
        .into_inner())
}

/// Polls `GetServerInfo` every 10 ms until `pred` holds (the server publishes
/// its gauges once per scheduler iteration, so they lag the streams a little),
/// up to `timeout`; fails with the last info seen.
pub async fn wait_info(
    addr: SocketAddr,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&ServerInfo) -> bool,
) -> anyhow::Result<ServerInfo> {
    let deadline = tokio::time::Instant::now() + timeout;
    ember_testkit::health::wait_info(
        channel(addr).await?,
        Duration::from_millis(10),
        deadline,
        pred,
    )
    .await
    .map_err(|e| anyhow!("{what}: not seen within {timeout:?}; {e}"))
}

/// Polls `GetServerInfo` (KV blocks are released asynchronously to the end of
/// a stream) until 0 KV blocks used, 0 active sequences and an empty queue,
/// up to `timeout`; returns that info or fails with the last one seen.
pub async fn wait_idle(addr: SocketAddr, timeout: Duration) -> anyhow::Result<ServerInfo> {
    let deadline = tokio::time::Instant::now() + timeout;
    let every = Duration::from_millis(20);
    ember_testkit::health::wait_info(
        channel(addr).await?,
        every,
        deadline,
        ember_testkit::health::is_idle,
    )
    .await
    .map_err(|e| anyhow!("server not idle within {timeout:?}: {e}"))
}

/// The end state every fault test asserts: 0 KV blocks used, 0 active, empty
/// queue (within 5 s), health SERVING, and a fresh request still completes.
pub async fn assert_idle_and_serving(addr: SocketAddr) -> anyhow::Result<ServerInfo> {
    let info = wait_idle(addr, Duration::from_secs(5)).await?;
    let h = health_both(addr).await?;
    if h != ServingStatus::Serving {
        bail!("health is {h:?} after the test, expected SERVING");
    }
    let mut c = connect(addr).await?;
    // Token ids every model has (a fixture's vocabulary may be small).
    let probe = generate(&mut c, ids_request(vec![1, 2, 3], 3), None).await;
    if probe.code() != tonic::Code::Ok || probe.tokens.len() != 3 {
        bail!(
            "a fresh request after the test did not complete: {}",
            probe.summary()
        );
    }
    wait_idle(addr, Duration::from_secs(5)).await?;
    Ok(info)
}

/// The server's decode step time, measured: the median gap between the
/// server sample times of an 8-token request. Tests size their work with it
/// so they last long enough on a fast release build yet stay short on a slow
/// debug build.
pub async fn step_time(addr: SocketAddr) -> anyhow::Result<Duration> {
    let mut c = connect(addr).await?;
    let out = generate(&mut c, text_request("How fast are you?", 8, true), None).await;
    if out.code() != tonic::Code::Ok || out.tokens.len() != 8 {
        bail!("calibration request failed: {}", out.summary());
    }
    let mut gaps: Vec<u64> = out
        .tokens
        .windows(2)
        .map(|w| w[1].0.server_time_ns.saturating_sub(w[0].0.server_time_ns))
        .collect();
    gaps.sort_unstable();
    Ok(Duration::from_nanos(gaps[gaps.len() / 2]))
}
