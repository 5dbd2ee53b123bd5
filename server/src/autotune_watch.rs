//! Kernel autotuning and compilation, watched: what the server tunes and
//! compiles before and after health turns SERVING.
//!
//! CubeCL tunes an op the first time it meets one of its shape keys: it
//! benchmarks the candidate kernels, which takes from milliseconds to tens of
//! seconds, on the thread that asked (the scheduler's), with every request
//! waiting behind it. Ember's warmup runs every shape serving can meet
//! before SERVING (`ember_engine::Engine::warmup`), so a tuning after it is
//! a shape the warmup missed: a first deploy's requests then wait seconds.
//!
//! CubeCL announces each tuning with one `log` line, `Tuning <key>` at INFO
//! from `cubecl_runtime::tune::tuner` (the key names the op and its shape),
//! which reaches `tracing` through the log bridge. [`AutotuneWatch`] is a
//! `tracing` layer that counts those lines, whatever `RUST_LOG` lets the
//! log print: runs before SERVING (logged with the warmup's summary) and
//! runs while serving, which also go to `ember:autotune_while_serving_total`
//! on `/metrics` and are named in a WARN line by the scheduler thread after
//! the step that met them ([`report_new`]). The end-to-end tests and
//! `bench/run_first_deploy.sh` fail if that counter moves.
//!
//! Compilations the same way: a kernel (or a variant of one) met for the
//! first time is compiled by NVRTC on the thread that launches it, 0.1-1.5 s
//! each on an H200, with nothing tuned. The engine has CubeCL announce each
//! compilation with one `log` line (`[Compiling kernel] <name>` at INFO,
//! target `cubecl::compilation`: `ember_engine::ops::cuda::runtime`); the
//! watch counts those too (`ember:kernel_compiles_while_serving_total`, a
//! WARN line naming each kernel). The server's default log filter keeps
//! the lines themselves out of its output.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing_log::NormalizeEvent;
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// Where CubeCL's tuner logs from.
const TUNER_TARGET: &str = "cubecl_runtime::tune";
/// How its line starts.
const TUNING: &str = "Tuning ";
/// Where CubeCL's compilation logger logs from.
const COMPILER_TARGET: &str = "cubecl::compilation";
/// How its line starts.
const COMPILING: &str = "[Compiling kernel]";

/// One kind of event (tunings, compilations): how many came before and
/// after SERVING, and the names of those after, not yet reported.
#[derive(Debug, Default)]
struct Tally {
    before: AtomicU64,
    during: AtomicU64,
    new: Mutex<Vec<String>>,
}

impl Tally {
    /// Counts one event named `name`; while `serving`, also in `metric`
    /// and the names to report.
    fn record(&self, serving: bool, name: &str, metric: &'static str) {
        if !serving {
            self.before.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.during.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(metric).increment(1);
        self.new
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name.to_string());
    }

    /// The names recorded while serving since the last call.
    fn take_new(&self) -> Vec<String> {
        if self.during.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        std::mem::take(&mut *self.new.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// What the watch has seen (one per process: [`state`]; tests make their own).
#[derive(Debug, Default)]
pub struct WatchState {
    serving: AtomicBool,
    tuned: Tally,
    compiled: Tally,
}

impl WatchState {
    /// Tunings counted before [`WatchState::mark_serving`].
    pub fn before_serving(&self) -> u64 {
        self.tuned.before.load(Ordering::Relaxed)
    }

    /// Tunings counted after it.
    pub fn while_serving(&self) -> u64 {
        self.tuned.during.load(Ordering::Relaxed)
    }

    /// Kernels compiled before [`WatchState::mark_serving`].
    pub fn compiled_before_serving(&self) -> u64 {
        self.compiled.before.load(Ordering::Relaxed)
    }

    /// Kernels compiled after it.
    pub fn compiled_while_serving(&self) -> u64 {
        self.compiled.during.load(Ordering::Relaxed)
    }

    /// From now on every tuning and compilation counts as one while serving.
    pub fn mark_serving(&self) {
        self.serving.store(true, Ordering::Relaxed);
    }

    /// The keys tuned while serving since the last call.
    pub fn take_new(&self) -> Vec<String> {
        self.tuned.take_new()
    }

    /// The kernels compiled while serving since the last call.
    pub fn take_new_compiled(&self) -> Vec<String> {
        self.compiled.take_new()
    }

    fn record(&self, key: &str) {
        let serving = self.serving.load(Ordering::Relaxed);
        self.tuned
            .record(serving, key, crate::metrics::AUTOTUNE_WHILE_SERVING);
    }

    fn record_compiled(&self, kernel: &str) {
        let serving = self.serving.load(Ordering::Relaxed);
        self.compiled
            .record(serving, kernel, crate::metrics::COMPILES_WHILE_SERVING);
    }
}

/// The process's watch state.
pub fn state() -> &'static Arc<WatchState> {
    static STATE: OnceLock<Arc<WatchState>> = OnceLock::new();
    STATE.get_or_init(Arc::default)
}

/// Logs (WARN) each kernel tuned while serving since the last call; the
/// scheduler thread calls it after each step (an atomic load when none).
pub fn report_new() {
    for key in state().take_new() {
        tracing::warn!(
            key,
            "a kernel was autotuned while serving (a shape the warmup did not run): requests waited for it"
        );
    }
    for kernel in state().take_new_compiled() {
        tracing::warn!(
            kernel,
            "a kernel was compiled while serving (one the warmup did not run): requests waited for it"
        );
    }
}

/// The `tracing` layer that feeds a [`WatchState`] (module docs).
#[derive(Debug, Clone)]
pub struct AutotuneWatch {
    state: Arc<WatchState>,
}

impl AutotuneWatch {
    /// A watch feeding `state` ([`state`] in the server).
    pub fn new(state: Arc<WatchState>) -> Self {
        Self { state }
    }
}

impl<S: tracing::Subscriber> Layer<S> for AutotuneWatch {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        // Log-bridged events carry their own target in their fields.
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let (tuner, compiler) = (
            meta.target().starts_with(TUNER_TARGET),
            meta.target().starts_with(COMPILER_TARGET),
        );
        if !tuner && !compiler {
            return;
        }
        let mut message = Message(None);
        event.record(&mut message);
        let Some(line) = message.0.as_deref() else {
            return;
        };
        match (line.strip_prefix(TUNING), line.strip_prefix(COMPILING)) {
            (Some(key), _) if tuner => self.state.record(key.trim()),
            (_, Some(kernel)) if compiler => self.state.record_compiled(kernel.trim()),
            _ => {}
        }
    }
}

/// An event's `message` field.
struct Message(Option<String>);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn tunings_are_counted_before_and_while_serving_with_their_keys() {
        let state = Arc::new(WatchState::default());
        let subscriber = tracing_subscriber::registry().with(AutotuneWatch::new(state.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "cubecl_runtime::tune::tuner", "Tuning MatmulKey - m: 16");
            tracing::info!(target: "ember_engine::engine::warmup", "Tuning is not ours");
            tracing::info!(target: "cubecl_runtime::tune::tuner", "Fastest result x");
            assert_eq!((state.before_serving(), state.while_serving()), (1, 0));
            assert!(state.take_new().is_empty());
            state.mark_serving();
            tracing::info!(target: "cubecl_runtime::tune::tuner", "Tuning ReduceKey - axis: 1");
        });
        assert_eq!((state.before_serving(), state.while_serving()), (1, 1));
        assert_eq!(state.take_new(), ["ReduceKey - axis: 1"]);
        assert!(state.take_new().is_empty(), "reported once");
    }

    #[test]
    fn compilations_are_counted_before_and_while_serving_with_their_names() {
        let state = Arc::new(WatchState::default());
        let subscriber = tracing_subscriber::registry().with(AutotuneWatch::new(state.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "cubecl::compilation", "[Compiling kernel] gemv_kernel");
            tracing::info!(target: "cubecl::profiling", "[Compiling kernel] not a compile");
            state.mark_serving();
            tracing::info!(target: "cubecl::compilation", "[Compiling kernel] sample_rows_kernel");
            tracing::info!(target: "cubecl_runtime::tune::tuner", "[Compiling kernel] no");
        });
        assert_eq!(
            (
                state.compiled_before_serving(),
                state.compiled_while_serving()
            ),
            (1, 1)
        );
        assert_eq!((state.before_serving(), state.while_serving()), (0, 0));
        assert_eq!(state.take_new_compiled(), ["sample_rows_kernel"]);
        assert!(state.take_new_compiled().is_empty(), "reported once");
    }

    #[test]
    fn a_log_crate_line_is_seen_through_the_bridge() {
        let state = Arc::new(WatchState::default());
        let subscriber = tracing_subscriber::registry().with(AutotuneWatch::new(state.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let record = log::Record::builder()
                .args(format_args!("Tuning FusedReduceAutotuneKey - rows: 64"))
                .level(log::Level::Info)
                .target("cubecl_runtime::tune::tuner")
                .build();
            tracing_log::format_trace(&record).unwrap();
        });
        assert_eq!(state.before_serving(), 1);
    }
}
