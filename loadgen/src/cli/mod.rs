//! Command-line flags (clap derive), their validation, and the settings
//! they become: the top layer, the only one that knows a flag.
//!
//! Every flag has `--long` and a `LOADGEN_*` environment variable; the doc
//! comments are the `--help` text. [`Args`] holds the workload and run flags
//! and flattens the groups: [`conn::ConnArgs`] (which servers, which API),
//! and [`options`]' data, sweep and view groups. [`Args::validate`] rejects
//! values the benchmark cannot run with, naming the flag, before anything
//! connects (`validate.rs`), then builds the settings the modes run with
//! (`build.rs`). The other commands have their own flags: [`compare`],
//! [`calibrate`], [`mock`].

mod build;
pub mod calibrate;
mod check_shape;
pub mod compare;
pub mod conn;
pub mod mock;
pub mod options;
pub mod shape;
mod validate;

use std::path::PathBuf;

use clap::Parser;
use serde::Serialize;

use crate::cli::conn::ConnArgs;
use crate::cli::options::{DataArgs, SweepArgs, ViewArgs};
use crate::cli::shape::{ObserveArgs, ShapeArgs, TokenLimit};
use crate::config::{Arrival, SubmitSchedule};

/// Requests per run when --num-requests is not given (and no --duration).
pub const DEFAULT_NUM_REQUESTS: usize = 16;

/// Default prompt: a plain English sentence (about 10 GPT-2 tokens).
pub const DEFAULT_PROMPT: &str = "The quick brown fox jumps over the lazy dog, and then it";

/// Ember's load generator: streams generation requests at one or more servers
/// (Ember's gRPC API, or any OpenAI-compatible HTTP server with --backend
/// openai) and reports what the client saw next to what the server says
/// happened.
///
/// One command runs the README's main job: `loadgen --spawn-server` starts
/// `ember-server` on a free port, waits for health SERVING, fires 16 requests
/// x 32 new tokens as a burst (one measured run, no warmup), prints the report
/// and stops the server. For numbers to compare, add e.g. `--warmup-runs 1
/// --repeat-runs 3`.
///
/// More modes, each with its own --help: `loadgen compare` runs the same
/// workload against several targets in turn and reports them side by side,
/// `loadgen calibrate` measures loadgen's own error against its built-in mock
/// server, and `loadgen mock` serves that mock on its own.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "loadgen", version)]
pub struct Args {
    /// Which servers, which API, how requests spread over them.
    #[command(flatten)]
    #[serde(flatten)]
    pub conn: ConnArgs,

    /// Requests per run (warmup and measured runs alike); default 16. With
    /// --turns: sessions per run. With --duration: a cap (default none).
    #[arg(long, env = "LOADGEN_NUM_REQUESTS", value_name = "N")]
    pub num_requests: Option<usize>,

    /// Prompt text of every request.
    #[arg(long, env = "LOADGEN_PROMPT", default_value = DEFAULT_PROMPT, value_name = "TEXT")]
    pub prompt: String,

    /// Repeat the prompt text this many times (space-separated) to make longer
    /// prompts.
    #[arg(
        long,
        env = "LOADGEN_PROMPT_REPEATS",
        default_value_t = 1,
        value_name = "N"
    )]
    pub prompt_repeats: usize,

    /// Make every prompt distinct by prefixing its run and index, e.g.
    /// "[r0.3] " (warmups "[w0.3] "); defeats any prefix reuse.
    #[arg(long, env = "LOADGEN_UNIQUE_PROMPTS")]
    pub unique_prompts: bool,

    /// Tokens to generate per request (max_new_tokens), or `none`: no limit
    /// sent, the server decides (OpenAI completions: 16, chat: up to the
    /// context; gRPC, which needs one: the server's --max-new-tokens-limit
    /// fitted to the context, read from GetServerInfo).
    #[arg(
        long,
        env = "LOADGEN_MAX_NEW_TOKENS",
        default_value = "32",
        value_name = "N|none"
    )]
    pub max_new_tokens: TokenLimit,

    /// Generate exactly --max-new-tokens tokens, ignoring the end-of-text token
    /// (default: stop at EOS).
    #[arg(long, env = "LOADGEN_NO_STOP_ON_EOS")]
    pub no_stop_on_eos: bool,

    /// Tokenize prompts client-side with the GPT-2 tokenizer and send
    /// prompt_token_ids (skips server tokenization), before the clock starts.
    #[arg(long, env = "LOADGEN_PRETOK")]
    pub pretok: bool,

    /// Sampling temperature (>= 0; unset or 0 = greedy).
    #[arg(
        long,
        env = "LOADGEN_TEMPERATURE",
        value_name = "T",
        allow_negative_numbers = true
    )]
    pub temperature: Option<f32>,

    /// Top-k sampling (>= 0; unset or 0 = no limit).
    #[arg(
        long,
        env = "LOADGEN_TOP_K",
        value_name = "K",
        allow_negative_numbers = true
    )]
    pub top_k: Option<i32>,

    /// Nucleus sampling, in (0, 1] (unset = 1).
    #[arg(
        long,
        env = "LOADGEN_TOP_P",
        value_name = "P",
        allow_negative_numbers = true
    )]
    pub top_p: Option<f32>,

    /// min-p sampling, in [0, 1] (unset or 0 = off): keeps tokens whose
    /// probability is at least min_p times the top token's (vLLM's field).
    #[arg(
        long,
        env = "LOADGEN_MIN_P",
        value_name = "P",
        allow_negative_numbers = true
    )]
    pub min_p: Option<f32>,

    /// Milliseconds between submissions (0 = burst: all at t0).
    #[arg(
        long,
        env = "LOADGEN_SUBMIT_INTERVAL_MS",
        default_value_t = 0.0,
        value_name = "MS",
        allow_negative_numbers = true
    )]
    pub submit_interval_ms: f64,

    /// absolute: request i fires at t0 + i*interval regardless of earlier
    /// submissions; relative: sleep the interval after each submission returned.
    #[arg(long, env = "LOADGEN_SUBMIT_SCHEDULE", value_enum, default_value_t = SubmitSchedule::Absolute)]
    pub submit_schedule: SubmitSchedule,

    /// fixed: gaps of --submit-interval-ms; poisson: exponential gaps at
    /// --request-rate (absolute schedule, seeded by --seed).
    #[arg(long, env = "LOADGEN_ARRIVAL", value_enum, default_value_t = Arrival::Fixed)]
    pub arrival: Arrival,

    /// Mean requests per second for --arrival poisson (> 0).
    #[arg(
        long,
        env = "LOADGEN_REQUEST_RATE",
        value_name = "R",
        allow_negative_numbers = true
    )]
    pub request_rate: Option<f64>,

    /// Shape of the gamma arrivals (> 0): 1 is Poisson, smaller is burstier.
    #[arg(
        long,
        env = "LOADGEN_BURSTINESS",
        default_value_t = 1.0,
        value_name = "B",
        allow_negative_numbers = true
    )]
    pub burstiness: f64,

    /// --arrival trace: multiply every timestamp by this (0.5 replays twice
    /// as fast).
    #[arg(
        long,
        env = "LOADGEN_TRACE_TIME_SCALE",
        default_value_t = 1.0,
        value_name = "X",
        allow_negative_numbers = true
    )]
    pub trace_time_scale: f64,

    /// At most this many requests in flight; a request waits for a free slot
    /// (the wait shows as submit lag). Unset = no limit.
    #[arg(long, env = "LOADGEN_MAX_CONCURRENCY", value_name = "N")]
    pub max_concurrency: Option<usize>,

    /// Unmeasured runs before the measured ones (a one-line header each; they
    /// pay one-off costs such as kernel compilation).
    #[arg(
        long,
        env = "LOADGEN_WARMUP_RUNS",
        default_value_t = 0,
        value_name = "N"
    )]
    pub warmup_runs: usize,

    /// Measured runs; each prints its report, then a summary across runs
    /// (mean and spread of the p99s and throughput).
    #[arg(
        long,
        env = "LOADGEN_REPEAT_RUNS",
        default_value_t = 1,
        value_name = "M"
    )]
    pub repeat_runs: usize,

    /// Fire the first run's first request (warmup or measured) at this
    /// wall-clock time, Unix seconds with a fraction (e.g. `$(date +%s.%N)`
    /// plus a few seconds), once connected: several loadgen processes, one
    /// per server, then start together. A time already past starts at once,
    /// with a warning; each run's `t0_unix_s` in --json says when it began.
    #[arg(
        long,
        env = "LOADGEN_START_AT",
        value_name = "UNIX_S",
        allow_negative_numbers = true
    )]
    pub start_at: Option<f64>,

    /// Per-request deadline in seconds, from submit to the last message
    /// (enforced by the client; gRPC also sends it as grpc-timeout). Generous by default: a
    /// 124M model on a small CPU can take seconds per decode step.
    #[arg(
        long,
        env = "LOADGEN_TIMEOUT",
        default_value_t = 300.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    pub timeout: f64,

    /// Seed of the Poisson arrivals and of each request's sampling seed
    /// (seed + index).
    #[arg(long, env = "LOADGEN_SEED", default_value_t = 0)]
    pub seed: u64,

    /// Write the summary (config, every measured run, summary across runs) as
    /// JSON to this file.
    #[arg(long, env = "LOADGEN_JSON", value_name = "PATH")]
    pub json: Option<PathBuf>,

    /// Write one JSON line per request (warmups included) with every client
    /// timestamp and the server's timeline.
    #[arg(long, env = "LOADGEN_REQUESTS_OUT", value_name = "PATH")]
    pub requests_out: Option<PathBuf>,

    /// Exit 0 even if some requests failed (they are still reported).
    #[arg(long, env = "LOADGEN_ALLOW_ERRORS")]
    pub allow_errors: bool,

    /// Start ember-server as a child on 127.0.0.1 (free port), wait for health
    /// SERVING, run the benchmark against it, then stop it with SIGTERM. Server
    /// arguments go after `--`, e.g. `loadgen --spawn-server -- --preset tiny`.
    #[arg(long, env = "LOADGEN_SPAWN_SERVER")]
    pub spawn_server: bool,

    /// The ember-server binary for --spawn-server (default: `ember-server`
    /// next to the loadgen executable).
    #[arg(long, env = "LOADGEN_SERVER_BIN", value_name = "PATH")]
    pub server_bin: Option<PathBuf>,

    /// Write the spawned server's stderr to this file instead of forwarding it
    /// to ours with a "[ember-server]" prefix.
    #[arg(long, env = "LOADGEN_SERVER_LOG", value_name = "PATH")]
    pub server_log: Option<PathBuf>,

    /// Seconds to wait for the spawned server to report SERVING (it loads and
    /// warms up the model first: ~100 s for gpt2 on a busy 2-core CPU).
    #[arg(
        long,
        env = "LOADGEN_SERVER_START_TIMEOUT",
        default_value_t = 300.0,
        value_name = "SECS",
        allow_negative_numbers = true
    )]
    pub server_start_timeout: f64,

    /// Data source flags.
    #[command(flatten)]
    #[serde(flatten)]
    pub data: DataArgs,

    /// Sweep flags.
    #[command(flatten)]
    #[serde(flatten)]
    pub sweep: SweepArgs,

    /// SLO, live view and report flags.
    #[command(flatten)]
    #[serde(flatten)]
    pub view: ViewArgs,

    /// Request shape, workload kind and run length flags.
    #[command(flatten)]
    #[serde(flatten)]
    pub shape: ShapeArgs,

    /// Server metrics and GPU telemetry flags.
    #[command(flatten)]
    #[serde(flatten)]
    pub observe: ObserveArgs,

    /// Arguments for the spawned ember-server (after `--`); loadgen adds
    /// `--listen 127.0.0.1:0`.
    #[arg(last = true, value_name = "SERVER_ARGS")]
    pub server_args: Vec<String>,
}
