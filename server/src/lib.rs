//! Ember's inference server.
//!
//! Layout (arrows point one way: service -> scheduler -> engine -> model; the
//! engine and the model are the `ember-engine` crate, so Cargo enforces the
//! last two arrows):
//! - [`cli`]: flags, validated into a `ServerConfig` (bad values name the
//!   flag): the scheduler's knobs, the engine's config, the device options.
//! - [`server`]: wiring and lifecycle: gRPC services (Inference,
//!   health, reflection), readiness, draining shutdown.
//! - [`service`]: the one request path (validation, tokenization off the
//!   scheduler thread, the per-request response stream, error -> status), the
//!   gRPC door (`ember.v1.Inference`), API keys and TLS.
//! - [`http`]: the OpenAI-compatible HTTP door (`--http-listen`), translating
//!   into and out of that same request path.
//! - [`scheduler`]: the continuous-batching loop on its own thread; owns the
//!   engine (any `ember_engine::StepEngine`); fed by a command channel.
//! - [`metrics`]: Prometheus names (vLLM's) and recording helpers.
//! - [`logging`]: the stderr subscriber (`--log-format text|json`, colours only
//!   on a terminal, per-request span close lines, panics through tracing).
//! - [`autotune_watch`]: kernel autotunings counted before and while serving
//!   (a layer of that subscriber).

pub mod autotune_watch;
pub mod cli;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod scheduler;
pub mod server;
pub mod service;
