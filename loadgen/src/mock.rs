//! A mock Ember server (the same proto, served by tonic on 127.0.0.1:0) with
//! known timings: `loadgen calibrate` measures loadgen against it, and the
//! tests use it as a stand-in server.
//!
//! The mock's timeline per request, on its own monotonic clock from `received`:
//! the handler sleeps `submit_delay` before returning the stream (the client's
//! call returns then), sends `Started`, then token i at exactly
//! `ttft + i * itl` (absolute sleeps, so jitter does not accumulate), then
//! `Finished` with a `ServerTiming` holding what it actually did.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ember_common::pb::generate_response::Event;
use ember_common::pb::inference_server::{Inference, InferenceServer};
use ember_common::pb::{
    FinishReason, Finished, GenerateRequest, GenerateResponse, GetServerInfoRequest, ServerInfo,
    ServerTiming, Started, Token,
};
use tokio::sync::{mpsc, oneshot, Semaphore};
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
    /// At most this many requests generate at once; the others wait in a
    /// queue (reported as `queue_wait_ns`), so latency grows with load.
    pub slots: Option<usize>,
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
            slots: None,
        }
    }
}

/// The service: answers `Generate` on the configured timeline.
#[derive(Debug, Clone)]
struct Mock {
    cfg: MockConfig,
    received: Arc<AtomicUsize>,
    /// `slots` permits, if limited.
    slots: Option<Arc<Semaphore>>,
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// When (since it was received) a mock request passed each stage.
struct Marks {
    tokenized: Duration,
    enqueued: Duration,
    admitted: Duration,
    first: Duration,
    last: Duration,
    finished: Duration,
}

impl Marks {
    /// The breakdown the real server would report for these moments.
    fn timing(&self, iteration: u64) -> ServerTiming {
        ServerTiming {
            tokenize_ns: ns(self.tokenized),
            enqueue_ns: ns(self.enqueued - self.tokenized),
            queue_wait_ns: ns(self.admitted - self.enqueued),
            prefill_to_first_token_ns: ns(self.first.saturating_sub(self.admitted)),
            server_ttft_ns: ns(self.first),
            decode_ns: ns(self.last - self.first),
            total_ns: ns(self.finished),
            prefill_batch_size: 1,
            admitted_iteration: iteration,
            tokenized_at_ns: ns(self.tokenized),
            enqueued_at_ns: ns(self.enqueued),
            admitted_at_ns: ns(self.admitted),
            first_token_at_ns: ns(self.first),
            finished_at_ns: ns(self.finished),
            cached_prompt_tokens: 0,
            prefill_chunks: 1,
        }
    }
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
        let slots = self.slots.clone();
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
            // Held until the last token is sent; the semaphore never closes.
            let _slot = match &slots {
                Some(s) => s.clone().acquire_owned().await.ok(),
                None => None,
            };
            let admitted = received.elapsed();
            // Without slots the timeline runs from `received`, exactly as configured.
            let base = if slots.is_some() {
                received + admitted
            } else {
                received
            };
            let mut times = Vec::new();
            for i in 0..req.max_new_tokens {
                tokio::time::sleep_until(base + cfg.ttft + cfg.itl * i).await;
                let t = received.elapsed();
                times.push(t);
                let token = Token {
                    index: i,
                    token_id: 100 + i,
                    text: "x".into(),
                    server_time_ns: ns(t),
                    ..Default::default()
                };
                if !send(Event::Token(token)).await {
                    return;
                }
            }
            let marks = Marks {
                tokenized,
                enqueued,
                admitted,
                first: times.first().copied().unwrap_or_default(),
                last: times.last().copied().unwrap_or_default(),
                finished: received.elapsed(),
            };
            let timing = marks.timing(n as u64);
            send(Event::Finished(Finished {
                request_id: id,
                finish_reason: FinishReason::Length as i32,
                prompt_tokens,
                completion_tokens: req.max_new_tokens,
                timing: Some(timing),
                ..Default::default()
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
#[derive(Debug)]
pub struct MockServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// `http://addr`.
    pub url: String,
    /// Requests received so far.
    pub received: Arc<AtomicUsize>,
    shutdown: Option<oneshot::Sender<()>>,
    join: JoinHandle<()>,
}

/// Serves the mock on `addr` (use port 0) until the returned server is stopped.
pub async fn start_on(addr: &str, cfg: MockConfig) -> std::io::Result<MockServer> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let received = Arc::new(AtomicUsize::new(0));
    let mock = Mock {
        cfg: cfg.clone(),
        received: received.clone(),
        slots: cfg.slots.map(|n| Arc::new(Semaphore::new(n))),
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
        let served = tonic::transport::Server::builder()
            // Let 500 streams share one connection (the default is 200).
            .max_concurrent_streams(Some(4096))
            .add_service(health)
            .add_service(InferenceServer::new(mock))
            // serve_with_incoming ignores the builder's tcp_nodelay: set it on
            // the incoming stream, or Nagle + delayed ACKs hold tokens ~40 ms.
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "mock server failed");
        }
    });
    Ok(MockServer {
        addr,
        url: format!("http://{addr}"),
        received,
        shutdown: Some(tx),
        join,
    })
}

/// Serves the mock on 127.0.0.1 on a free port.
pub async fn start(cfg: MockConfig) -> std::io::Result<MockServer> {
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

/// `loadgen mock`: serve the mock on its own, e.g. to try loadgen's flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "loadgen mock")]
pub struct MockArgs {
    /// Address to listen on (loopback; port 0 picks one). The first stdout
    /// line is `listening on <ip:port>`.
    #[arg(long, env = "LOADGEN_MOCK_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Time to first token after admission, ms.
    #[arg(long, env = "LOADGEN_MOCK_TTFT_MS", default_value_t = 50.0)]
    pub ttft_ms: f64,
    /// Inter-token latency, ms.
    #[arg(long, env = "LOADGEN_MOCK_ITL_MS", default_value_t = 10.0)]
    pub itl_ms: f64,
    /// Requests generating at once; more wait in a queue (unset: no limit).
    #[arg(long, env = "LOADGEN_MOCK_SLOTS")]
    pub slots: Option<usize>,
}

/// Serves the mock until ctrl-c or SIGTERM.
pub async fn serve(args: MockArgs) -> Result<(), crate::Error> {
    for (flag, v) in [("--ttft-ms", args.ttft_ms), ("--itl-ms", args.itl_ms)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(crate::Error::invalid(
                flag,
                format!("must be >= 0 (got {v})"),
            ));
        }
    }
    if args.slots == Some(0) {
        return Err(crate::Error::invalid("--slots", "must be >= 1"));
    }
    let cfg = MockConfig {
        ttft: Duration::from_secs_f64(args.ttft_ms / 1e3),
        itl: Duration::from_secs_f64(args.itl_ms / 1e3),
        slots: args.slots,
        ..MockConfig::default()
    };
    let server = start_on(&args.listen, cfg).await.map_err(|e| {
        crate::Error::Internal(format!("cannot serve the mock on {}: {e}", args.listen))
    })?;
    println!("listening on {}", server.addr);
    stop_signal().await;
    server.stop().await;
    Ok(())
}

/// ctrl-c, or SIGTERM on Unix.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
