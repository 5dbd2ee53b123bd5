//! Ember's inference server.
//!
//! Layout (arrows point one way: service -> scheduler -> engine -> model):
//! - [`cli`]: flags, validated into a `ServerConfig` (bad values name the flag).
//! - [`device`]: opening and configuring the engine's device (Flex f32 on the
//!   CPU, CUDA f16), and CubeCL's kernel cache.
//! - [`server`]: wiring and lifecycle: gRPC services (Inference,
//!   health, reflection), readiness, draining shutdown.
//! - [`service`]: the one request path (validation, tokenization off the
//!   scheduler thread, the per-request response stream, error -> status), the
//!   gRPC door (`ember.v1.Inference`), API keys and TLS.
//! - [`http`]: the OpenAI-compatible HTTP door (`--http-listen`), translating
//!   into and out of that same request path.
//! - [`scheduler`]: the continuous-batching loop on its own thread; owns the
//!   engine; fed by a command channel.
//! - [`engine`]: runs many sequences at once over a paged KV cache: batched
//!   prefill, batched decode, per-sequence sampling.
//! - [`model`]: GPT-2 as Burn modules, its config, and weight loading (HF
//!   safetensors or seeded random init).
//! - [`metrics`]: Prometheus names (vLLM's) and recording helpers.
//! - [`logging`]: the stderr subscriber (`--log-format text|json`, colours only
//!   on a terminal, per-request span close lines, panics through tracing).

pub mod cli;
pub mod device;
pub mod engine;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod scheduler;
pub mod server;
pub mod service;
