//! The mock's gRPC door: `ember.v1.Inference` (and grpc.health.v1) served by
//! tonic, on the shared [`timeline`](super::timeline).
//!
//! Per request: the handler sleeps the submit delay before returning the
//! stream (the client's call returns then); the stream sends `Started`, then
//! each token when it is due (stamped as tonic takes it), then `Finished`
//! with a `ServerTiming` holding what the mock actually did. With an API key configured, an interceptor rejects
//! calls without `authorization: Bearer KEY` (UNAUTHENTICATED); health stays
//! open, as on a real server behind a load balancer's probes.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use ember_common::pb::generate_response::Event;
use ember_common::pb::inference_server::{Inference, InferenceServer};
use ember_common::pb::{
    FinishReason, Finished, GenerateRequest, GenerateResponse, GetServerInfoRequest,
    SchedulerKnobs, ServerInfo, Started, Token,
};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, ServerTlsConfig};
use tonic::{Request, Response, Status};
use tonic_health::pb::health_server::{Health, HealthServer};

use crate::mock::prefix::words;
use crate::mock::timeline::{drive, ns, Shared, Stamps, Step};

/// Most concurrent streams one client connection may open: enough for
/// `loadgen calibrate --streams 10000` on one connection.
const MAX_STREAMS: u32 = 20_000;

/// The `max_new_tokens_limit` the mock reports in `GetServerInfo`.
pub const MOCK_MAX_NEW_TOKENS_LIMIT: u32 = 256;

/// The service: answers `Generate` on the shared timeline.
#[derive(Debug, Clone)]
struct Mock {
    /// The mock's state, shared with the HTTP door.
    shared: Arc<Shared>,
}

/// A request's response stream: renders each step of the timeline when
/// tonic polls it to send it, so each token is stamped as it goes out.
struct Events {
    /// The timeline's steps.
    rx: mpsc::Receiver<Step>,
    /// The request's marks.
    stamps: Stamps,
    /// Echoed in `Started` and `Finished`.
    request_id: String,
    /// Whitespace words or token ids.
    prompt_tokens: u32,
    /// `Started` went out.
    started: bool,
    /// Tokens sent.
    sent: u32,
    /// Arrival number (the `admitted_iteration` reported).
    n: usize,
}

impl Events {
    fn event(e: Event) -> Poll<Option<Result<GenerateResponse, Status>>> {
        Poll::Ready(Some(Ok(GenerateResponse { event: Some(e) })))
    }
}

impl tokio_stream::Stream for Events {
    type Item = Result<GenerateResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let me = &mut *self;
        if !me.started {
            me.started = true;
            return Events::event(Event::Started(Started {
                request_id: me.request_id.clone(),
                prompt_tokens: me.prompt_tokens,
                server_time_ns: ns(me.stamps.handler.1),
            }));
        }
        loop {
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
                    return Events::event(Event::Token(Token {
                        index: i,
                        token_id: 100 + i,
                        text: "x".into(),
                        server_time_ns: ns(t),
                        ..Default::default()
                    }));
                }
                Step::Done => {
                    return Events::event(Event::Finished(Finished {
                        request_id: me.request_id.clone(),
                        finish_reason: FinishReason::Length as i32,
                        prompt_tokens: me.prompt_tokens,
                        completion_tokens: me.sent,
                        timing: Some(me.stamps.marks().timing(me.n as u64)),
                        ..Default::default()
                    }));
                }
                Step::Failed(k) => {
                    let m = format!("mock: engine failure after {k} tokens");
                    return Poll::Ready(Some(Err(Status::internal(m))));
                }
            }
        }
    }
}

#[tonic::async_trait]
impl Inference for Mock {
    type GenerateStream = Events;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let received = Instant::now();
        let n = self.shared.arrive();
        let req = request.into_inner();
        if self.shared.rejects(n) {
            return Err(Status::resource_exhausted("mock: pending queue is full"));
        }
        let prompt_tokens = if req.prompt_token_ids.is_empty() {
            req.prompt.split_whitespace().count() as u32
        } else {
            req.prompt_token_ids.len() as u32
        };
        let tokenized = received.elapsed();
        if !self.shared.cfg.submit_delay.is_zero() {
            // (A zero sleep would still wait for the next 1 ms timer tick.)
            tokio::time::sleep(self.shared.cfg.submit_delay).await;
        }
        let mut stamps = Stamps::new(received, (tokenized, received.elapsed()));
        let tokens: Vec<u64> = if req.prompt_token_ids.is_empty() {
            words(&req.prompt).collect()
        } else {
            req.prompt_token_ids.iter().map(|&t| u64::from(t)).collect()
        };
        stamps.cached = self.shared.prefix.lookup(&tokens);
        let (tx, rx) = mpsc::channel(64);
        let (tokens, fails) = self.shared.tokens_for(req.max_new_tokens);
        let shared = self.shared.clone();
        tokio::spawn(async move { drive(&shared, received, tokens, fails, tx).await });
        Ok(Response::new(Events {
            rx,
            stamps,
            request_id: req.request_id,
            prompt_tokens,
            started: false,
            sent: 0,
            n,
        }))
    }

    async fn get_server_info(
        &self,
        _request: Request<GetServerInfoRequest>,
    ) -> Result<Response<ServerInfo>, Status> {
        Ok(Response::new(ServerInfo {
            model: "mock".into(),
            device: "test".into(),
            // GPT-2's context and a limit like the server's default, so a
            // client fitting its limit to them has something to read.
            n_positions: 1024,
            knobs: Some(SchedulerKnobs {
                max_new_tokens_limit: MOCK_MAX_NEW_TOKENS_LIMIT,
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    /// The mock has no tokenizer.
    async fn tokenize(
        &self,
        _request: Request<ember_common::pb::TokenizeRequest>,
    ) -> Result<Response<ember_common::pb::TokenizeResponse>, Status> {
        Err(Status::unimplemented("mock: no tokenizer"))
    }

    /// The mock has no tokenizer.
    async fn detokenize(
        &self,
        _request: Request<ember_common::pb::DetokenizeRequest>,
    ) -> Result<Response<ember_common::pb::DetokenizeResponse>, Status> {
        Err(Status::unimplemented("mock: no tokenizer"))
    }
}

/// Rejects a call without the configured `authorization: Bearer KEY`.
fn check_key(expected: &Option<String>, req: Request<()>) -> Result<Request<()>, Status> {
    let Some(key) = expected else {
        return Ok(req);
    };
    let sent = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if sent == Some(format!("Bearer {key}").as_str()) {
        Ok(req)
    } else {
        Err(Status::unauthenticated(
            "mock: missing or wrong API key (authorization: Bearer KEY)",
        ))
    }
}

/// Health: NOT_SERVING until the configured delay has passed (never, with
/// `never_serve`); the HTTP door's `/health` follows the same flag.
async fn health(shared: &Arc<Shared>) -> HealthServer<impl Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(
            ember_common::SERVICE_NAME,
            tonic_health::ServingStatus::NotServing,
        )
        .await;
    if !shared.cfg.never_serve {
        let (delay, shared) = (shared.cfg.health_delay, shared.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            reporter
                .set_service_status(
                    ember_common::SERVICE_NAME,
                    tonic_health::ServingStatus::Serving,
                )
                .await;
            shared.serving.store(true, Ordering::Release);
        });
    }
    service
}

/// Serves the gRPC door on `listener` until `stop` fires.
pub(crate) async fn spawn(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: oneshot::Receiver<()>,
) -> std::io::Result<JoinHandle<()>> {
    let health = health(&shared).await;
    let key = shared.cfg.api_key.clone();
    let inference = InferenceServer::with_interceptor(
        Mock {
            shared: shared.clone(),
        },
        move |r| check_key(&key, r),
    );
    let mut builder = tonic::transport::Server::builder()
        // Let thousands of streams share one connection (the default is 200).
        .max_concurrent_streams(Some(MAX_STREAMS));
    if let Some(tls) = &shared.cfg.tls {
        let identity = Identity::from_pem(&tls.cert_pem, &tls.key_pem);
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(identity))
            .map_err(std::io::Error::other)?;
    }
    // serve_with_incoming ignores the builder's tcp_nodelay: set it on the
    // incoming stream, or Nagle + delayed ACKs hold tokens ~40 ms.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let router = builder.add_service(health).add_service(inference);
    Ok(tokio::spawn(async move {
        let served = router
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stop.await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "mock gRPC server failed");
        }
    }))
}
