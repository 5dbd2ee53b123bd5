//! What the reports render, independent of how it was measured: the setup
//! of a session ([`Header`]) and one series of runs ([`Series`]: a plain
//! benchmark is one series, `loadgen compare` several).

use crate::measure::slo::Slo;
use crate::measure::stats::{Measured, RunStats, Summary};
use crate::measure::sweep::SweepResult;

/// What every block's header says about the setup.
#[derive(Debug, Clone)]
pub struct Header {
    /// Model name(s) (distinct values of all targets, comma-separated).
    pub model: String,
    /// Device(s), where the API reports one.
    pub device: String,
    /// The API and transport in words, e.g. "ember (gRPC, HTTP/2)".
    pub backend: String,
    /// What each request asks for, in words: streamed or not, the limit
    /// sent (or none), the workload kind (shared prefixes, sessions).
    pub request_shape: String,
    /// The unique prompts' nonce of this invocation.
    pub nonce: String,
    /// Number of targets.
    pub targets: usize,
    /// Connections per target (HTTP/2, gRPC).
    pub channels: usize,
    /// Each target is an HTTP/1.1 pool (one stream per connection).
    pub http1: bool,
    /// `--balance`, in words.
    pub balance: String,
    /// The schedule in words, e.g. "0 ms / absolute (burst)".
    pub schedule: String,
    /// Whether the latency from the intended start is meaningful (absolute).
    pub absolute: bool,
    /// `--max-concurrency`.
    pub max_concurrency: Option<usize>,
    /// `--slo`.
    pub slo: Option<Slo>,
}

/// One series: the runs of one session against one set of targets.
#[derive(Debug, Clone)]
pub struct Series {
    /// Its name (`loadgen compare --series name=...`; "run" otherwise).
    pub name: String,
    /// The target URLs.
    pub urls: Vec<String>,
    /// The setup.
    pub header: Header,
    /// Warmup runs (not in the summary).
    pub warmups: Vec<RunStats>,
    /// Measured runs (a sweep's runs, one per row).
    pub measured: Vec<Measured>,
    /// Across the measured runs.
    pub summary: Summary,
    /// The sweep, if it was one.
    pub sweep: Option<SweepResult>,
}
