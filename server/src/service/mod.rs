//! The service layer: one request path behind two front doors.
//!
//! Layout:
//! - [`frontend`]: [`Frontend::generate`], the one function both doors call:
//!   readiness/draining checks, validation ([`validate`]; the generation
//!   fields become the engine's `GenerationParams` in [`proto_params`], one
//!   line a field, and are checked once), tokenization,
//!   prompt checks, a pending-queue permit, the submit to the scheduler, and
//!   the request's stream task (one per sequence with `n` > 1, all feeding
//!   one stream); it returns the request's event stream.
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
//! - [`structured`]: structured output (`response_format`): a JSON schema
//!   compiled by llguidance into each sequence's token constraint.
//! - [`tokens`]: the tokenizer on its own (`/tokenize`, `/detokenize` and
//!   the gRPC `Tokenize` / `Detokenize`).
//! - [`in_flight`]: the count of accepted requests whose stream has not
//!   ended, which the shutdown drain waits on (signalled, not polled).
//!
//! Handlers never touch the engine: they hold a [`SchedulerHandle`] (inside
//! [`Frontend`]) and read the [`ModelInfo`] published once the model is
//! loaded.
//!
//! [`SchedulerHandle`]: crate::scheduler::SchedulerHandle
//! [`ModelInfo`]: crate::scheduler::ModelInfo

mod arrival;
pub mod auth;
pub mod doors;
mod ending;
pub mod error;
pub mod frontend;
pub mod grpc;
pub mod in_flight;
pub mod output;
pub mod proto_params;
mod state;
pub mod stop_strings;
pub mod stream;
pub mod structured;
mod submit;
pub mod tls;
pub mod tokens;
pub mod validate;

pub use arrival::{Arrival, EventStream};
pub use frontend::{Frontend, GenerateOptions};
pub use grpc::InferenceService;
pub use state::ServiceState;
