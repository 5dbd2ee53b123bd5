//! Wiring and lifecycle: start the scheduler on the chosen device, serve gRPC
//! (Inference, grpc.health.v1, reflection) and, with `--http-listen`, the
//! OpenAI-compatible HTTP API, both over one [`Frontend`]; shut down in order.
//!
//! Lifecycle:
//! 1. The gRPC listener is already bound (so `:0` is known before loading);
//!    the HTTP listener is bound first thing here and announced as the
//!    second stdout line, `http listening on <ip:port>`. Health reports
//!    NOT_SERVING (HTTP `/health`: 503) while the scheduler thread loads and
//!    warms up.
//! 2. Ready: [`ModelInfo`] is published to handlers, health turns SERVING.
//! 3. `shutdown` resolves (SIGTERM/SIGINT in the binary): draining starts:
//!    health NOT_SERVING, new requests get UNAVAILABLE on gRPC and 503 on
//!    HTTP (the same check, in [`Frontend`]); running and queued requests of
//!    both doors get `--shutdown-timeout` to finish, then the rest are
//!    cancelled (they end with FINISH_REASON_CANCELLED, `abort` on HTTP).
//!    Then both listeners stop (HTTP connections get a few seconds to flush),
//!    the scheduler thread is joined, and the device is waited for until
//!    nothing is left queued on it ([`quiesce`]), so the process exit never
//!    unloads CUDA under CubeCL's device thread.
//!
//! TLS (`--tls-cert`) wraps both listeners; API keys (`--api-key`) guard
//! `ember.v1.Inference` and the HTTP `/v1` routes, not health.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use ember_common::pb::inference_server::InferenceServer;
use ember_common::tokenizer::Gpt2Tokenizer;
use tokio::net::TcpListener;
use tokio::sync::oneshot::error::RecvError;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use ember_engine::model::ModelSource;
use ember_engine::EngineDevice;

use crate::cli::ServerConfig;
use crate::scheduler::{
    self, ModelInfo, SchedulerConfig, SchedulerHandle, SchedulerStats, Spawned,
};
use crate::service::in_flight::InFlightTracker;
use crate::service::{auth, Frontend, InferenceService, ServiceState};

/// Runs the server on `listener` until `shutdown` resolves and draining ends.
/// An error means the server could not start (model, device, tokenizer).
pub async fn run(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let http_listener = match config.doors.http_listen {
        Some(addr) => Some(bind_http(addr).await?),
        None => None,
    };
    let tokenizer = load_tokenizer(&config.engine.model)?;
    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::NotServing).await;
    let model_name = config
        .doors
        .served_model_name
        .clone()
        .unwrap_or_else(|| served_model_name(&config.engine.model));
    if let Some(addr) = config.metrics_addr {
        crate::metrics::install(addr, &model_name).context("starting the metrics listener")?;
    }

    let ((handle, ready, join), device) = start_scheduler(&config, config.warmup)?;
    let state = Arc::new(ServiceState {
        model: OnceLock::new(),
        draining: Default::default(),
        knobs: config.knobs.clone(),
        block_size: config.engine.block_size,
        prefix_caching: config.engine.prefix_caching,
        tokenizer,
        seed: config.seed,
        in_flight: InFlightTracker::default(),
    });

    let frontend = Frontend::new(handle.clone(), Arc::clone(&state));
    let doors = Doors::start(
        &config,
        listener,
        http_listener,
        frontend,
        health_service,
        &model_name,
    )?;

    tokio::pin!(shutdown);
    let started = tokio::select! {
        r = ready => on_ready(r, &config, &state, &health).await,
        _ = &mut shutdown => Ok(false),
    };
    match started {
        Ok(true) => shutdown.await,
        Ok(false) => {}
        Err(err) => {
            doors.stop().await;
            quiesce(device).await;
            return Err(err);
        }
    }

    tracing::info!(timeout = ?config.shutdown_timeout, "shutdown requested: draining");
    state.draining.store(true, Ordering::Release);
    set_health(&health, ServingStatus::NotServing).await;
    drain(&state.in_flight, &handle, config.shutdown_timeout).await;
    doors.stop().await;
    drop(handle);
    // The scheduler exits once every handle is gone (the service's went with
    // the server).
    let _ = tokio::task::spawn_blocking(move || join.join()).await;
    quiesce(device).await;
    tracing::info!("stopped");
    Ok(())
}

/// Waits, at most [`QUIESCE_TIMEOUT`], until `device` has run everything
/// queued on it, the engine's teardown included (its buffers and graphs are
/// freed through CubeCL's device thread after the scheduler thread ends).
/// The process exit that follows unloads the CUDA driver: work the device
/// thread was still running then met `CUDA_ERROR_DEINITIALIZED` and
/// panicked (`cubecl-cuda .../server.rs` `unwrap`, thread `DSD-0-0`, logged
/// after `stopped` at every shutdown). Waited for on a thread of its own,
/// so that a device that never answers cannot hold the exit (logged).
async fn quiesce(device: EngineDevice) {
    let started = std::time::Instant::now();
    let (done, synced) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("device-quiesce".into())
        .spawn(move || {
            let _ = done.send(device.device.sync());
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot wait for the device at shutdown");
        return;
    }
    match tokio::time::timeout(QUIESCE_TIMEOUT, synced).await {
        Ok(Ok(Ok(()))) => tracing::debug!(
            seconds = started.elapsed().as_secs_f64(),
            "device idle: nothing left queued on it"
        ),
        Ok(Ok(Err(e))) => tracing::warn!(error = ?e, "the device failed its last sync at shutdown"),
        Ok(Err(_)) => tracing::warn!("the device's last sync at shutdown panicked"),
        Err(_) => {
            tracing::warn!(timeout = ?QUIESCE_TIMEOUT, "the device did not go idle at shutdown; exiting anyway")
        }
    }
}

/// How long [`quiesce`] waits for the device.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);

/// The scheduler's readiness report: publishes the model to the handlers and
/// turns health SERVING (`Ok(true)`), or why startup failed.
async fn on_ready(
    report: Result<Result<ModelInfo, String>, RecvError>,
    config: &ServerConfig,
    state: &ServiceState,
    health: &HealthReporter,
) -> anyhow::Result<bool> {
    match report {
        Ok(Ok(info)) => {
            // From here a kernel autotuning is one the warmup missed.
            let watch = crate::autotune_watch::state();
            watch.mark_serving();
            tracing::info!(model = %info.name, device = %info.device, kv_blocks = info.limits.kv_blocks_total,
                seconds = info.load_seconds, kernel_autotunings = watch.before_serving(),
                kernels_compiled = watch.compiled_before_serving(),
                "model loaded and warmed up; SERVING");
            let eos = info.config.eos_token_id;
            if eos != state.tokenizer.eos_token_id() {
                tracing::warn!(model_eos = eos, tokenizer_eos = state.tokenizer.eos_token_id(),
                    "the model's eos_token_id (config.json) is not the tokenizer's; sequences end at the model's");
            }
            if matches!(config.engine.model, ModelSource::Preset { .. }) {
                tracing::warn!("random weights: generated text is meaningless (use --model-dir for real GPT-2 weights)");
            }
            // llguidance's token trie for structured output, built now so the
            // first such request does not pay for it.
            let tokenizer = state.tokenizer.clone();
            let tokens = crate::service::structured::ModelTokens {
                eos,
                vocab_size: info.limits.vocab_size,
            };
            tokio::task::spawn_blocking(move || {
                if let Err(e) = crate::service::structured::prepare(&tokenizer, tokens) {
                    tracing::warn!(error = %e, "structured output's vocabulary could not be built");
                }
            });
            let _ = state.model.set(info);
            set_health(health, ServingStatus::Serving).await;
            Ok(true)
        }
        Ok(Err(msg)) => Err(anyhow::anyhow!("model startup failed: {msg}")),
        Err(_) => Err(anyhow::anyhow!("the scheduler thread died during startup")),
    }
}

/// The running front doors: gRPC (Inference behind the API key interceptor,
/// health, reflection) and, with `--http-listen`, HTTP; both over TLS with
/// `--tls-cert`. One stop signal ends both.
struct Doors {
    /// Set to true once: both listeners stop accepting and wind down.
    stop: watch::Sender<bool>,
    /// tonic's server task (ends when its connections have).
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The HTTP listener's task, with `--http-listen`.
    http: Option<JoinHandle<()>>,
}

impl Doors {
    fn start<H: Health>(
        config: &ServerConfig,
        listener: TcpListener,
        http_listener: Option<TcpListener>,
        frontend: Frontend,
        health_service: HealthServer<H>,
        model_name: &str,
    ) -> anyhow::Result<Doors> {
        let (stop, stop_rx) = watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|stop| *stop).await;
            }
        };
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(ember_common::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .context("building the reflection service")?;
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &config.doors.tls {
            builder = builder
                .tls_config(tls.grpc())
                .context("--tls-cert/--tls-key: gRPC TLS setup")?;
        }
        let keys = &config.doors.api_keys;
        let inference = InferenceServer::with_interceptor(
            InferenceService::new(frontend.clone()),
            auth::grpc_interceptor(keys.clone()),
        );
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let grpc = tokio::spawn(
            builder
                .add_service(health_service)
                .add_service(reflection)
                .add_service(inference)
                .serve_with_incoming_shutdown(incoming, stopped()),
        );
        let http = http_listener.map(|listener| {
            let router = crate::http::router(frontend, model_name.to_string(), keys.clone());
            let tls = config.doors.tls.as_ref().map(|t| t.http_acceptor());
            tokio::spawn(crate::http::serve::serve(listener, tls, router, stopped()))
        });
        Ok(Doors { stop, grpc, http })
    }

    /// Stops both listeners and waits for them (HTTP connections get
    /// `http::serve::CLOSE_TIMEOUT` to flush).
    async fn stop(self) {
        let _ = self.stop.send(true);
        match self.grpc.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "gRPC server error"),
            Err(e) => tracing::error!(error = %e, "gRPC server task failed"),
        }
        if let Some(http) = self.http {
            if let Err(e) = http.await {
                tracing::error!(error = %e, "HTTP server task failed");
            }
        }
    }
}

/// Binds `--http-listen` and announces it: the second stdout line (after
/// `main`'s `listening on`), `http listening on <ip:port>`, which tests and
/// `loadgen --spawn-server` read when given port 0.
async fn bind_http(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("--http-listen {addr}: cannot bind"))?;
    let bound = listener.local_addr()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "http listening on {bound}")?;
    out.flush()?;
    drop(out);
    tracing::info!(addr = %bound, "HTTP (OpenAI-compatible) listening");
    Ok(listener)
}

/// `--prepare-cache`: loads the model and runs the whole warmup on the
/// device (filling the kernel cache), prints what it did, and returns.
pub async fn prepare_cache(config: ServerConfig) -> anyhow::Result<()> {
    let ((handle, ready, join), device) = start_scheduler(&config, true)?;
    let info = match ready.await {
        Ok(Ok(info)) => info,
        Ok(Err(msg)) => anyhow::bail!("model startup failed: {msg}"),
        Err(_) => anyhow::bail!("the scheduler thread died during startup"),
    };
    drop(handle);
    let _ = tokio::task::spawn_blocking(move || join.join()).await;
    quiesce(device).await;
    let dir = config
        .device_options
        .kernel_cache_dir
        .as_deref()
        .map_or_else(|| "<none>".to_string(), |d| d.display().to_string());
    println!(
        "prepared the kernel cache under {dir} for {} on {} in {:.1} s",
        info.name, info.device, info.load_seconds
    );
    Ok(())
}

/// Waits for queued and running requests to finish, up to `timeout`; then
/// cancels the rest and waits (briefly) for their streams to end. Each wait
/// ends on the in-flight count's own signal, not on a poll.
async fn drain(in_flight: &InFlightTracker, handle: &SchedulerHandle, timeout: Duration) {
    if tokio::time::timeout(timeout, in_flight.idle())
        .await
        .is_ok()
    {
        tracing::info!("drained: every request finished");
        return;
    }
    let stats = handle.stats();
    tracing::warn!(
        in_flight = in_flight.count(),
        queued = SchedulerStats::get(&stats.queue_depth),
        running = SchedulerStats::get(&stats.active_sequences),
        "shutdown timeout passed: cancelling the remaining requests"
    );
    handle.cancel_all();
    if tokio::time::timeout(Duration::from_secs(5), in_flight.idle())
        .await
        .is_err()
    {
        tracing::warn!(
            in_flight = in_flight.count(),
            "some request streams did not end within 5 s of the cancel"
        );
    }
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health
        .set_service_status(ember_common::SERVICE_NAME, status)
        .await;
}

/// The `model_name` label of every metric: the model directory's name (e.g.
/// `gpt2` for `--model-dir /models/gpt2`), else the preset's.
fn served_model_name(model: &ModelSource) -> String {
    match model {
        ModelSource::Dir(dir) => dir
            .file_name()
            .unwrap_or(dir.as_os_str())
            .to_string_lossy()
            .into_owned(),
        ModelSource::Preset { preset, .. } => preset.to_string(),
    }
}

fn load_tokenizer(model: &ModelSource) -> anyhow::Result<Gpt2Tokenizer> {
    if let ModelSource::Dir(dir) = model {
        if let Some(tok) = Gpt2Tokenizer::from_dir(dir)? {
            tracing::info!(dir = %dir.display(), "using the model directory's tokenizer");
            return Ok(tok);
        }
        tracing::info!("the model directory has no tokenizer; using the embedded GPT-2 vocabulary");
    }
    Ok(Gpt2Tokenizer::embedded()?)
}

/// The one startup path of serving and `--prepare-cache`: opens the device
/// `--device` names and starts the scheduler thread on it, which builds the
/// engine from `config.engine` (and runs its warmup when `warmup`). The
/// device comes back too, for [`quiesce`] at the end.
fn start_scheduler(config: &ServerConfig, warmup: bool) -> anyhow::Result<(Spawned, EngineDevice)> {
    let device = ember_engine::device::open(config.device, &config.device_options)?;
    tracing::info!(device = %device.name, "engine device");
    let scheduler = SchedulerConfig {
        engine: config.engine.clone(),
        knobs: config.knobs.clone(),
        warmup,
    };
    let kept = device.clone();
    Ok((scheduler::spawn(device, scheduler)?, kept))
}
