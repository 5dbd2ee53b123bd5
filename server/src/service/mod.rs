//! The service layer: one request path behind two front doors.
//!
//! Layout:
//! - [`frontend`]: [`Frontend::generate`], the one function both doors call:
//!   readiness/draining checks, validation ([`validate`]), tokenization,
//!   prompt checks, a pending-queue permit, the submit to the scheduler, and
//!   the request's stream task; it returns the request's event stream.
//! - [`stream`]: that task: scheduler events in, `Started` / `Token` /
//!   `Finished` out, with the text ([`output`]: the detokenizer, then the
//!   stop strings of [`stop_strings`]), logprobs, deadline, cancellation on
//!   disconnect, metrics and the request's log line (labels in `ending`).
//! - [`grpc`]: the gRPC door (`ember.v1.Inference`): translates the call in
//!   and the stream's errors out. The HTTP door is `crate::http`.
//! - [`error`]: the one error -> status mapping (both doors derive theirs
//!   from it).
//! - [`auth`], [`tls`]: API keys and TLS, shared by both doors; [`doors`]:
//!   their flags (and `--http-listen`), flattened into `cli::Args`.
//!
//! Handlers never touch the engine: they hold a [`SchedulerHandle`] (inside
//! [`Frontend`]) and read the [`ModelInfo`] published once the model is
//! loaded.
//!
//! [`SchedulerHandle`]: crate::scheduler::SchedulerHandle

pub mod auth;
pub mod doors;
mod ending;
pub mod error;
pub mod frontend;
pub mod grpc;
pub mod output;
pub mod stop_strings;
pub mod stream;
pub mod tls;
pub mod validate;

use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

use ember_common::tokenizer::Gpt2Tokenizer;

use crate::cli::SchedulerKnobs;
use crate::scheduler::ModelInfo;

pub use frontend::{Arrival, EventStream, Frontend, GenerateOptions};
pub use grpc::InferenceService;

/// State shared by every handler of both doors.
#[derive(Debug)]
pub struct ServiceState {
    /// Set once when the scheduler reports the model loaded and warmed up.
    pub model: OnceLock<ModelInfo>,
    /// Set on SIGTERM/SIGINT: new requests get UNAVAILABLE (HTTP 503).
    pub draining: AtomicBool,
    pub knobs: SchedulerKnobs,
    pub tokenizer: Gpt2Tokenizer,
    /// Seed mixed into the seed of requests that set none.
    pub seed: u64,
}
