//! The continuous-batching scheduler.
//!
//! A dedicated OS thread ([`worker`]) owns the engine and the KV cache; nothing
//! else touches them. Handlers talk to it through a cloneable
//! [`SchedulerHandle`] over a command channel (the text-embeddings-inference
//! queue design): no locks around the engine, no shared mutable state beyond
//! the read-only [`SchedulerStats`] snapshot.
//!
//! The pending queue is bounded by a semaphore of `--max-pending` permits: a
//! handler takes a permit *before* it submits (failing at once with
//! RESOURCE_EXHAUSTED when none is left) and the permit travels inside the
//! request until admission. The command channel itself is unbounded because
//! every `Submit` on it holds a permit, and the other commands (cancel,
//! cancel-all) are at most one per request: its length is bounded by
//! `--max-pending` plus the number of live requests.
//!
//! Layout: [`worker`] (the loop and the state it owns), [`admitting`] and
//! [`admission`] (who leaves the wait queue, [`queue`]), [`preemption`]
//! (preempting, for a decode step or for the front of the queue),
//! [`policy`] (the scheduling policy: queue order and aging, preemption
//! victims, which `priority` a request may ask for; [`policy::build`] makes
//! it from [`SchedulingPolicy`]), [`chunking`] (the prefill token budget),
//! [`rotation`] (decode turns), [`guarded`] (engine calls that may panic),
//! [`request`] (what travels to and from the service), [`knobs`], [`stats`].
//! Admission and preemption are free functions over the state the worker
//! hands them.
//!
//! Startup: [`spawn`] starts the thread, which loads the model, builds the
//! engine, runs the warmup and then reports [`ModelInfo`] on a oneshot channel
//! before it serves its first command.

pub mod admission;
mod admitting;
pub mod chunking;
mod guarded;
pub mod knobs;
pub mod policy;
mod preemption;
pub mod queue;
pub mod request;
pub mod rotation;
pub mod stats;
mod worker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

pub use knobs::{SchedulerKnobs, SchedulingPolicy};
pub use request::{Admission, CancelReason, Command, Event, FinishKind, QueuedRequest};
pub use stats::SchedulerStats;

use ember_engine::model::{Gpt2Config, ModelSource};
use ember_engine::{Engine, EngineConfig, EngineDevice, RequestLimits, SeqId};

/// What the service needs to know about the loaded model and engine.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Human-readable model name (directory or preset).
    pub name: String,
    /// Device the engine runs on, e.g. `cpu (Flex f32)`.
    pub device: String,
    pub config: Gpt2Config,
    /// What a request must fit into (checked before queueing).
    pub limits: RequestLimits,
    /// Whether the prefix cache is on.
    pub prefix_caching: bool,
    /// Seconds spent loading the model and warming up.
    pub load_seconds: f64,
}

/// Everything the scheduler thread needs to start.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// What the engine is built from (model, KV cache, graphs).
    pub engine: EngineConfig,
    pub knobs: SchedulerKnobs,
    /// Run the engine's warmup (every step shape) before reporting ready.
    pub warmup: bool,
}

/// The queue is full: no pending-queue permit is left.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the pending queue is full ({0} requests)")]
pub struct QueueFull(pub usize);

/// The scheduler thread is gone (it stopped or crashed).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the scheduler is not running")]
pub struct SchedulerGone;

/// Cloneable handle for handlers: submit, cancel, read stats.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    commands: mpsc::UnboundedSender<Command>,
    /// `--max-pending` permits; one per queued request.
    pending_slots: Arc<Semaphore>,
    max_pending: usize,
    stats: Arc<SchedulerStats>,
    next_id: Arc<AtomicU64>,
}

impl SchedulerHandle {
    /// A place in the pending queue, or [`QueueFull`] at once.
    pub fn reserve(&self) -> Result<OwnedSemaphorePermit, QueueFull> {
        Arc::clone(&self.pending_slots)
            .try_acquire_owned()
            .map_err(|_| QueueFull(self.max_pending))
    }

    /// A fresh sequence id.
    pub fn next_id(&self) -> SeqId {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn submit(&self, req: QueuedRequest) -> Result<(), SchedulerGone> {
        self.commands
            .send(Command::Submit(Box::new(req)))
            .map_err(|_| SchedulerGone)
    }

    /// Best effort: if the scheduler is gone there is nothing left to cancel.
    pub fn cancel(&self, id: SeqId, reason: CancelReason) {
        let _ = self.commands.send(Command::Cancel { id, reason });
    }

    pub fn cancel_all(&self) {
        let _ = self.commands.send(Command::CancelAll);
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }
}

/// Yields the model info once loaded and warmed up, or why it could not be.
pub type ReadyReceiver = oneshot::Receiver<Result<ModelInfo, String>>;

/// A started scheduler: its handle, its readiness, its thread.
pub type Spawned = (SchedulerHandle, ReadyReceiver, std::thread::JoinHandle<()>);

/// Starts the scheduler thread on `device`. The returned receiver yields the
/// model info once the model is loaded and warmed up, or the reason it could
/// not be.
pub fn spawn(device: EngineDevice, config: SchedulerConfig) -> std::io::Result<Spawned> {
    let device_name = device.name.clone();
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = oneshot::channel();
    let stats = Arc::new(SchedulerStats::default());
    let handle = SchedulerHandle {
        commands: tx,
        pending_slots: Arc::new(Semaphore::new(config.knobs.max_pending)),
        max_pending: config.knobs.max_pending,
        stats: Arc::clone(&stats),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let join = std::thread::Builder::new()
        .name("ember-scheduler".into())
        .spawn(move || {
            let started = Instant::now();
            let engine = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                build_engine(&device, &config)
            })) {
                Ok(Ok(engine)) => engine,
                Ok(Err(msg)) => {
                    let _ = ready_tx.send(Err(msg));
                    return;
                }
                Err(_) => {
                    let _ = ready_tx.send(Err(format!(
                        "the {device_name} backend panicked while loading the model (see the log above)"
                    )));
                    return;
                }
            };
            let info = ModelInfo {
                name: model_name(&config.engine.model),
                device: device_name,
                config: engine.model_config().clone(),
                limits: engine.limits(),
                prefix_caching: engine.prefix_caching(),
                load_seconds: started.elapsed().as_secs_f64(),
            };
            let worker = worker::Worker::new(engine, config.knobs.clone(), rx, stats);
            if ready_tx.send(Ok(info)).is_err() {
                return; // the server gave up waiting
            }
            worker.run();
        })?;
    Ok((handle, ready_rx, join))
}

fn model_name(source: &ModelSource) -> String {
    match source {
        ModelSource::Dir(dir) => dir.display().to_string(),
        ModelSource::Preset { preset, seed } => format!("{preset} (random weights, seed {seed})"),
    }
}

fn build_engine(device: &EngineDevice, config: &SchedulerConfig) -> Result<Engine, String> {
    let mut engine = Engine::new(&config.engine, device).map_err(|e| e.to_string())?;
    if config.warmup {
        engine.warmup().map_err(|e| format!("warmup failed: {e}"))?;
    }
    Ok(engine)
}

#[cfg(test)]
mod fake_engine;
#[cfg(test)]
mod overlap_tests;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod preemption_tests;
#[cfg(test)]
mod tests;
