//! Ember's load generator: streams generation requests at one or more
//! servers (Ember's gRPC API, or any OpenAI-compatible HTTP server) on a
//! relative or absolute schedule, and reports what the client saw next to
//! what the server says happened, per request.
//!
//! Every client time is taken on the client's monotonic clock
//! (`std::time::Instant`) and every server time on the server's; the two are
//! never subtracted from each other. Reconciliation compares durations:
//! network + client overhead = client TTFT - server TTFT, and client
//! inter-token gaps next to the server's `server_time_ns` gaps.
//!
//! Layout, by what each part does, top to bottom. A file imports only files
//! of its own part or of parts below it in this list (`tests/layout.rs`
//! checks the order, and that no file imports one that imports it back,
//! directly or around a circle):
//! - [`cli`]: the flags, their validation, and the settings they become;
//!   the only part that knows a flag.
//! - [`modes`]: what an invocation does: the plain benchmark and its sweeps,
//!   `compare`, `calibrate`, `mock`, `--spawn-server`; a benchmark session
//!   and its settings (`modes::setup`).
//! - [`report`]: the text report, `--json` / `--requests-out`, the HTML
//!   report and its charts.
//! - [`measure`]: one run's firing loop and live view, statistics,
//!   per-target figures, SLOs, what a sweep found.
//! - [`client`]: one module per backend ([`client::grpc`],
//!   [`client::openai`]), the connection pool and `--balance`, TLS.
//! - [`workload`]: the requests (prompts, datasets, lengths) and when they
//!   fire.
//! - [`config`], [`record`], [`error`]: the settings several parts share,
//!   the per-request record and the error type, which every part uses.
//!
//! Test support (the mock server, child processes, health polling, the
//! loadgen runner for tests) is the `ember-testkit` crate.

pub mod cli;
pub mod client;
pub mod config;
pub mod error;
pub mod measure;
pub mod modes;
pub mod record;
pub mod report;
pub mod workload;

pub use cli::Args;
pub use error::Error;
pub use modes::session::Outcome;
