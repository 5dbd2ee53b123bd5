//! One step on the device: its inputs, the buffers they live in, the forward
//! pass, and the decode graphs that replay it.
//!
//! - [`shapes`]: the shape a runner is built for and each step's padded
//!   shape (CUDA buckets).
//! - [`inputs`]: a step's model inputs (prefill built on the host, decode
//!   derived on the device from the buffers).
//! - [`buffers`]: the persistent device buffers a decode step's inputs are
//!   written into, one set per decode bucket (in place on CUDA).
//! - [`forward`]: the model over a step's inputs (eager steps and graphs).
//! - [`graphs`]: decode steps captured once per bucket and replayed as CUDA
//!   graphs.
//! - [`runner`]: [`StepRunner`], which owns the model, the KV storage, the
//!   buffers and the graphs, and runs prefill and decode steps to sampled ids.

pub mod buffers;
pub mod forward;
pub mod graphs;
pub mod inputs;
pub mod runner;
pub mod shapes;

pub use buffers::DecodeRow;
pub use inputs::{PrefillSeq, PrefillShape, StepInputs};
pub use runner::{ScoreRequest, StepRunner};
pub use shapes::{RunnerShape, MIN_PREFILL_BUCKET};
