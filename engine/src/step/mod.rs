//! One step on the device: its inputs, the buffers they live in, the forward
//! pass, and the graphs that replay it.
//!
//! - [`shapes`]: the shape a runner is built for and each step's padded
//!   shape (CUDA buckets).
//! - [`inputs`]: a step's model inputs (prefill built on the host, decode
//!   derived on the device from the buffers).
//! - [`buffers`]: the persistent device buffers a decode step's inputs are
//!   written into, one set per decode bucket (in place on CUDA).
//! - [`prefill_buffers`]: the same for one small prefill shape.
//! - [`forward`]: the model over a step's inputs (eager steps and graphs).
//! - [`graphs`]: steps captured once per decode bucket and small prefill
//!   shape, replayed as CUDA graphs.
//! - [`choice_graph`]: a decode bucket's choice half (sampling kernel, ids
//!   kept for the next step) as a graph of its own, for steps queued in two.
//! - [`runner`]: [`StepRunner`], which owns the model, the KV storage, the
//!   buffers and the graphs, and runs prefill and decode steps to sampled ids.

pub mod buffers;
pub mod choice_graph;
pub mod forward;
pub mod graphs;
pub mod inputs;
pub mod prefill_buffers;
pub mod runner;
pub mod shapes;

pub use buffers::DecodeRow;
pub use inputs::{PrefillSeq, PrefillShape, StepInputs};
pub use runner::{ScoreRequest, StepRunner};
pub use shapes::{RunnerShape, MIN_PREFILL_BUCKET, PREFILL_GRAPH_MAX_TOKENS};
