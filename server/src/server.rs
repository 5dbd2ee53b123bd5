//! Wiring and lifecycle: start the scheduler on the chosen device, serve gRPC
//! (Inference, grpc.health.v1, reflection), and shut down in order.
//!
//! Lifecycle:
//! 1. The listener is already bound (so `:0` is known before loading); health
//!    reports NOT_SERVING while the scheduler thread loads and warms up.
//! 2. Ready: [`ModelInfo`] is published to handlers, health turns SERVING.
//! 3. `shutdown` resolves (SIGTERM/SIGINT in the binary): draining starts: health
//!    NOT_SERVING, new `Generate` calls get UNAVAILABLE; running and queued
//!    requests get `--shutdown-timeout` to finish, then the rest are cancelled
//!    (they end with FINISH_REASON_CANCELLED). Then tonic stops and the
//!    scheduler thread is joined.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use ember_common::pb::inference_server::InferenceServer;
use ember_common::tokenizer::Gpt2Tokenizer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use ember_engine::model::ModelSource;

use crate::cli::ServerConfig;
use crate::scheduler::{self, SchedulerConfig, SchedulerHandle, SchedulerStats, Spawned};
use crate::service::in_flight::InFlightTracker;
use crate::service::{InferenceService, ServiceState};

/// Runs the server on `listener` until `shutdown` resolves and draining ends.
/// An error means the server could not start (model, device, tokenizer).
pub async fn run(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let model = &config.engine.model;
    let tokenizer = load_tokenizer(model)?;
    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::NotServing).await;
    if let Some(addr) = config.metrics_addr {
        crate::metrics::install(addr, &served_model_name(model))
            .context("starting the metrics listener")?;
    }

    let mut engine = config.engine.clone();
    engine.eos_token_id = tokenizer.eos_token_id();
    let sched_config = SchedulerConfig {
        engine,
        knobs: config.knobs.clone(),
        warmup: config.warmup,
    };
    let (handle, ready, join) = spawn_on_device(&config, sched_config)?;
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

    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ember_common::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let serve = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(InferenceServer::new(InferenceService::new(
            handle.clone(),
            Arc::clone(&state),
        )))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    let serve_task = tokio::spawn(serve);

    tokio::pin!(shutdown);
    let startup: anyhow::Result<bool> = tokio::select! {
        r = ready => match r {
            Ok(Ok(info)) => {
                tracing::info!(model = %info.name, device = %info.device, kv_blocks = info.limits.kv_blocks_total,
                    seconds = info.load_seconds, "model loaded and warmed up; SERVING");
                if matches!(config.engine.model, ModelSource::Preset { .. }) {
                    tracing::warn!("random weights: generated text is meaningless (use --model-dir for real GPT-2 weights)");
                }
                let _ = state.model.set(info);
                set_health(&health, ServingStatus::Serving).await;
                Ok(true)
            }
            Ok(Err(msg)) => Err(anyhow::anyhow!("model startup failed: {msg}")),
            Err(_) => Err(anyhow::anyhow!("the scheduler thread died during startup")),
        },
        _ = &mut shutdown => Ok(false),
    };
    let started = match startup {
        Ok(started) => started,
        Err(err) => {
            let _ = stop_tx.send(());
            let _ = serve_task.await;
            return Err(err);
        }
    };
    if started {
        shutdown.await;
    }

    tracing::info!(timeout = ?config.shutdown_timeout, "shutdown requested: draining");
    state.draining.store(true, Ordering::Release);
    set_health(&health, ServingStatus::NotServing).await;
    drain(&state.in_flight, &handle, config.shutdown_timeout).await;
    let _ = stop_tx.send(());
    match serve_task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "gRPC server error"),
        Err(e) => tracing::error!(error = %e, "gRPC server task failed"),
    }
    drop(handle);
    // The scheduler exits once every handle is gone (the service's went with
    // the server).
    let _ = tokio::task::spawn_blocking(move || join.join()).await;
    tracing::info!("stopped");
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

/// Opens the device `--device` names and starts the scheduler on it.
/// Decode graphs pay off only where launches cost (CUDA, bucketed shapes).
fn spawn_on_device(
    config: &ServerConfig,
    mut scheduler: SchedulerConfig,
) -> anyhow::Result<Spawned> {
    let device = ember_engine::device::open(config.device, &config.device_options)?;
    tracing::info!(device = %device.name, "engine device");
    scheduler.engine.decode_graphs &= device.bucketed;
    Ok(scheduler::spawn(device, scheduler)?)
}
