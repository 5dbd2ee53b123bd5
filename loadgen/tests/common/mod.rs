//! Test support: a mock Ember server (the same proto, served by tonic on
//! 127.0.0.1:0) with known timings, and a runner for the `loadgen` binary.
//!
//! The mock's timeline per request, on its own monotonic clock from `received`:
//! the handler sleeps `submit_delay` before returning the stream (the client's
//! call returns then), sends `Started`, then token i at exactly
//! `ttft + i * itl` (absolute sleeps, so jitter does not accumulate), then
//! `Finished` with a `ServerTiming` holding what it actually did.
#![allow(dead_code)] // each test binary uses a different part

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ember_common::pb::generate_response::Event;
use ember_common::pb::inference_server::{Inference, InferenceServer};
use ember_common::pb::{
    FinishReason, Finished, GenerateRequest, GenerateResponse, GetServerInfoRequest, ServerInfo,
    ServerTiming, Started, Token,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// What the mock does with each request.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Sleep in the handler before returning the stream.
    pub submit_delay: Duration,
    /// received -> first token.
    pub ttft: Duration,
    /// Between tokens.
    pub itl: Duration,
    /// Every k-th request received (1-based) fails with RESOURCE_EXHAUSTED.
    pub fail_every: Option<usize>,
    /// Health reports NOT_SERVING for this long after start.
    pub health_delay: Duration,
    /// Never report SERVING.
    pub never_serve: bool,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            submit_delay: Duration::ZERO,
            ttft: Duration::from_millis(5),
            itl: Duration::from_millis(2),
            fail_every: None,
            health_delay: Duration::ZERO,
            never_serve: false,
        }
    }
}

#[derive(Debug, Clone)]
struct Mock {
    cfg: MockConfig,
    received: Arc<AtomicUsize>,
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

#[tonic::async_trait]
impl Inference for Mock {
    type GenerateStream = ReceiverStream<Result<GenerateResponse, Status>>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let received = Instant::now();
        let n = self.received.fetch_add(1, Ordering::SeqCst) + 1;
        let req = request.into_inner();
        if let Some(k) = self.cfg.fail_every {
            if n.is_multiple_of(k) {
                return Err(Status::resource_exhausted("mock: pending queue is full"));
            }
        }
        let prompt_tokens = if req.prompt_token_ids.is_empty() {
            req.prompt.split_whitespace().count() as u32
        } else {
            req.prompt_token_ids.len() as u32
        };
        let tokenized = received.elapsed();
        if !self.cfg.submit_delay.is_zero() {
            // (A zero sleep would still wait for the next 1 ms timer tick.)
            tokio::time::sleep(self.cfg.submit_delay).await;
        }
        let enqueued = received.elapsed();
        let (tx, rx) = mpsc::channel(64);
        let cfg = self.cfg.clone();
        tokio::spawn(async move {
            let send = |e: Event| {
                let tx = tx.clone();
                async move {
                    tx.send(Ok(GenerateResponse { event: Some(e) }))
                        .await
                        .is_ok()
                }
            };
            let id = req.request_id.clone();
            if !send(Event::Started(Started {
                request_id: id.clone(),
                prompt_tokens,
                server_time_ns: ns(enqueued),
            }))
            .await
            {
                return;
            }
            let admitted = received.elapsed();
            let mut times = Vec::new();
            for i in 0..req.max_new_tokens {
                tokio::time::sleep_until(received + cfg.ttft + cfg.itl * i).await;
                let t = received.elapsed();
                times.push(t);
                let token = Token {
                    index: i,
                    token_id: 100 + i,
                    text: "x".into(),
                    server_time_ns: ns(t),
                };
                if !send(Event::Token(token)).await {
                    return;
                }
            }
            let first = times.first().copied().unwrap_or_default();
            let last = times.last().copied().unwrap_or_default();
            let finished = received.elapsed();
            let timing = ServerTiming {
                tokenize_ns: ns(tokenized),
                enqueue_ns: ns(enqueued - tokenized),
                queue_wait_ns: ns(admitted - enqueued),
                prefill_to_first_token_ns: ns(first.saturating_sub(admitted)),
                server_ttft_ns: ns(first),
                decode_ns: ns(last - first),
                total_ns: ns(finished),
                prefill_batch_size: 1,
                admitted_iteration: n as u64,
                tokenized_at_ns: ns(tokenized),
                enqueued_at_ns: ns(enqueued),
                admitted_at_ns: ns(admitted),
                first_token_at_ns: ns(first),
                finished_at_ns: ns(finished),
            };
            send(Event::Finished(Finished {
                request_id: id,
                finish_reason: FinishReason::Length as i32,
                prompt_tokens,
                completion_tokens: req.max_new_tokens,
                timing: Some(timing),
            }))
            .await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_server_info(
        &self,
        _request: Request<GetServerInfoRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        Ok(Response::new(ServerInfo {
            model: "mock".into(),
            device: "test".into(),
            ..Default::default()
        }))
    }
}

/// A running mock server.
pub struct MockServer {
    pub addr: SocketAddr,
    pub url: String,
    /// Requests received so far.
    pub received: Arc<AtomicUsize>,
    shutdown: Option<oneshot::Sender<()>>,
    join: JoinHandle<()>,
}

/// Serves the mock on `addr` (use port 0) until the returned server is stopped.
pub async fn start_on(addr: &str, cfg: MockConfig) -> MockServer {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let received = Arc::new(AtomicUsize::new(0));
    let mock = Mock {
        cfg: cfg.clone(),
        received: received.clone(),
    };
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(
            ember_common::SERVICE_NAME,
            tonic_health::ServingStatus::NotServing,
        )
        .await;
    if !cfg.never_serve {
        let delay = cfg.health_delay;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            reporter
                .set_service_status(
                    ember_common::SERVICE_NAME,
                    tonic_health::ServingStatus::Serving,
                )
                .await;
        });
    }
    let (tx, rx) = oneshot::channel::<()>();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let join = tokio::spawn(async move {
        tonic::transport::Server::builder()
            // Let 500 streams share one connection (the default is 200).
            .max_concurrent_streams(Some(4096))
            .add_service(health)
            .add_service(InferenceServer::new(mock))
            // serve_with_incoming ignores the builder's tcp_nodelay: set it on
            // the incoming stream, or Nagle + delayed ACKs hold tokens ~40 ms.
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await
            .expect("mock server");
    });
    MockServer {
        addr,
        url: format!("http://{addr}"),
        received,
        shutdown: Some(tx),
        join,
    }
}

/// Serves the mock on 127.0.0.1 on a free port.
pub async fn start(cfg: MockConfig) -> MockServer {
    start_on("127.0.0.1:0", cfg).await
}

impl MockServer {
    /// Stops serving and joins the server task.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = self.join.await;
    }
}

/// What one `loadgen` run produced.
#[derive(Debug)]
pub struct LoadgenRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The `--json` document.
    pub json: serde_json::Value,
    /// The `--requests-out` lines.
    pub requests: Vec<serde_json::Value>,
}

fn tmp(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let k = N.fetch_add(1, Ordering::SeqCst);
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("loadgen-{}-{k}-{name}", std::process::id()))
}

/// Runs the loadgen binary with `args` plus `--json` and `--requests-out`
/// (blocking the calling thread, so call it from `spawn_blocking`).
pub fn loadgen_blocking(args: &[String]) -> LoadgenRun {
    let json = tmp("summary.json");
    let requests = tmp("requests.jsonl");
    let out: Output = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .arg("--json")
        .arg(&json)
        .arg("--requests-out")
        .arg(&requests)
        .env("LOADGEN_LOG", "warn")
        .output()
        .expect("run loadgen");
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    let json_text = read(&json);
    let lines = read(&requests);
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&requests);
    LoadgenRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        json: serde_json::from_str(&json_text).unwrap_or(serde_json::Value::Null),
        requests: lines
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect(),
    }
}

/// Runs loadgen from an async test without blocking the mock's runtime.
pub async fn loadgen(args: &[&str]) -> LoadgenRun {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || loadgen_blocking(&args))
        .await
        .expect("loadgen thread")
}

/// A u64 field of a JSON object.
pub fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a u64 in {v}"))
}

/// A f64 field reached by a path of keys.
pub fn f(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for k in path {
        cur = &cur[*k];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number"))
}

/// Percentile (nearest rank) of a non-empty slice.
pub fn pct(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}
