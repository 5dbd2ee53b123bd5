//! Command-line flags (clap derive) and their validation.
//!
//! Every flag has `--long` and a `LOADGEN_*` environment variable; the doc
//! comments are the `--help` text. [`Args::validate`] rejects values the
//! benchmark cannot run with, naming the flag, before anything connects.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use serde::Serialize;

use crate::error::Error;

/// Default prompt: a plain English sentence (about 10 GPT-2 tokens).
pub const DEFAULT_PROMPT: &str = "The quick brown fox jumps over the lazy dog, and then it";

/// When request i is submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SubmitSchedule {
    /// Request i fires at t0 + offset(i), however slow earlier submissions are
    /// (open loop; latency from the intended start is coordinated-omission aware).
    Absolute,
    /// Wait until submission i returned the response stream, then sleep the
    /// interval, then submit i+1 (closed loop on the submit call).
    Relative,
}

/// How the offsets between requests are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Every gap is --submit-interval-ms (0 = burst).
    Fixed,
    /// Exponential gaps with mean 1/--request-rate, seeded by --seed
    /// (absolute schedule).
    Poisson,
}

/// Ember's load generator: streams Generate calls at one or more servers and
/// reports what the client saw next to what the server says happened.
///
/// One command runs the README's main job: `loadgen --spawn-server` starts
/// `ember-server` on a free port, waits for health SERVING, fires 16 requests
/// x 32 new tokens as a burst (one measured run, no warmup), prints the report
/// and stops the server. For numbers to compare, add e.g. `--warmup-runs 1
/// --repeat-runs 3`.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "loadgen", version)]
pub struct Args {
    /// Server to load, `host:port` or `http://host:port`; repeatable (or
    /// comma-separated), requests round-robin across targets. Not with
    /// --spawn-server.
    #[arg(
        long = "target",
        env = "LOADGEN_TARGET",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub targets: Vec<String>,

    /// Requests per run (warmup and measured runs alike).
    #[arg(
        long,
        env = "LOADGEN_NUM_REQUESTS",
        default_value_t = 16,
        value_name = "N"
    )]
    pub num_requests: usize,

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

    /// Tokens to generate per request (max_new_tokens).
    #[arg(
        long,
        env = "LOADGEN_MAX_NEW_TOKENS",
        default_value_t = 32,
        value_name = "N"
    )]
    pub max_new_tokens: u32,

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

    /// HTTP/2 connections per target; requests round-robin over them.
    #[arg(long, env = "LOADGEN_CHANNELS", default_value_t = 1, value_name = "N")]
    pub channels: usize,

    /// Per-request deadline in seconds, from submit to the last message (sent
    /// as grpc-timeout and enforced by the client). Generous by default: a
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

    /// Arguments for the spawned ember-server (after `--`); loadgen adds
    /// `--listen 127.0.0.1:0`.
    #[arg(last = true, value_name = "SERVER_ARGS")]
    pub server_args: Vec<String>,
}

impl Args {
    /// Checks every value before anything connects. The error names the flag.
    pub fn validate(&self) -> Result<(), Error> {
        if self.num_requests == 0 {
            return Err(Error::invalid("--num-requests", "must be >= 1 (got 0)"));
        }
        if self.repeat_runs == 0 {
            return Err(Error::invalid("--repeat-runs", "must be >= 1 (got 0)"));
        }
        if self.channels == 0 {
            return Err(Error::invalid("--channels", "must be >= 1 (got 0)"));
        }
        if self.max_new_tokens == 0 {
            return Err(Error::invalid("--max-new-tokens", "must be >= 1 (got 0)"));
        }
        if self.prompt_repeats == 0 {
            return Err(Error::invalid("--prompt-repeats", "must be >= 1 (got 0)"));
        }
        if self.prompt.is_empty() {
            return Err(Error::invalid("--prompt", "must not be empty"));
        }
        if self.max_concurrency == Some(0) {
            return Err(Error::invalid(
                "--max-concurrency",
                "must be >= 1 (got 0; leave it unset for no limit)",
            ));
        }
        if !(self.submit_interval_ms.is_finite() && self.submit_interval_ms >= 0.0) {
            return Err(Error::invalid(
                "--submit-interval-ms",
                format!(
                    "must be a finite number >= 0 (got {})",
                    self.submit_interval_ms
                ),
            ));
        }
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            return Err(Error::invalid(
                "--timeout",
                format!("must be > 0 seconds (got {})", self.timeout),
            ));
        }
        if !(self.server_start_timeout.is_finite() && self.server_start_timeout > 0.0) {
            return Err(Error::invalid(
                "--server-start-timeout",
                format!("must be > 0 seconds (got {})", self.server_start_timeout),
            ));
        }
        self.validate_arrival()?;
        self.validate_sampling()?;
        self.validate_targets()
    }

    fn validate_arrival(&self) -> Result<(), Error> {
        match (self.arrival, self.request_rate) {
            (Arrival::Poisson, None) => Err(Error::invalid(
                "--request-rate",
                "is required with --arrival poisson",
            )),
            (Arrival::Poisson, Some(r)) if !(r.is_finite() && r > 0.0) => Err(Error::invalid(
                "--request-rate",
                format!("must be > 0 requests/s with --arrival poisson (got {r})"),
            )),
            (Arrival::Poisson, Some(_)) if self.submit_schedule == SubmitSchedule::Relative => {
                Err(Error::invalid(
                    "--submit-schedule",
                    "--arrival poisson needs the absolute schedule (got relative)",
                ))
            }
            (Arrival::Poisson, Some(_)) if self.submit_interval_ms != 0.0 => Err(Error::invalid(
                "--submit-interval-ms",
                "cannot be combined with --arrival poisson (the rate sets the gaps)",
            )),
            (Arrival::Fixed, Some(_)) => Err(Error::invalid(
                "--request-rate",
                "only applies to --arrival poisson (use --submit-interval-ms for fixed gaps)",
            )),
            _ => Ok(()),
        }
    }

    fn validate_sampling(&self) -> Result<(), Error> {
        if let Some(t) = self.temperature {
            if !(t.is_finite() && t >= 0.0) {
                return Err(Error::invalid(
                    "--temperature",
                    format!("must be a finite number >= 0 (got {t})"),
                ));
            }
        }
        if let Some(k) = self.top_k {
            if k < 0 {
                return Err(Error::invalid("--top-k", format!("must be >= 0 (got {k})")));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(Error::invalid(
                    "--top-p",
                    format!("must be in (0, 1] (got {p})"),
                ));
            }
        }
        Ok(())
    }

    fn validate_targets(&self) -> Result<(), Error> {
        if self.spawn_server && !self.targets.is_empty() {
            return Err(Error::invalid(
                "--target",
                "cannot be combined with --spawn-server (the spawned server is the target)",
            ));
        }
        if !self.spawn_server && self.targets.is_empty() {
            return Err(Error::invalid(
                "--target",
                "at least one is required (or pass --spawn-server)",
            ));
        }
        if !self.spawn_server && !self.server_args.is_empty() {
            return Err(Error::invalid(
                "--spawn-server",
                format!(
                    "arguments after `--` ({}) are for the spawned server; pass --spawn-server",
                    self.server_args.join(" ")
                ),
            ));
        }
        if self.targets.iter().any(|t| t.trim().is_empty()) {
            return Err(Error::invalid("--target", "must not be empty"));
        }
        Ok(())
    }

    /// The per-request deadline.
    pub fn request_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.timeout)
    }

    /// The requested arrival rate in requests/s, where one is defined: Poisson's
    /// R, or 1000 / interval for a fixed absolute schedule. `None` for a burst
    /// and for the relative schedule (its rate depends on the submit time).
    pub fn requested_rate_rps(&self) -> Option<f64> {
        match (self.arrival, self.submit_schedule) {
            (Arrival::Poisson, _) => self.request_rate,
            (Arrival::Fixed, SubmitSchedule::Absolute) if self.submit_interval_ms > 0.0 => {
                Some(1000.0 / self.submit_interval_ms)
            }
            _ => None,
        }
    }
}

/// `host:port` becomes `http://host:port`; a URL with a scheme is kept.
pub fn normalize_target(target: &str) -> String {
    let t = target.trim();
    if t.contains("://") {
        t.to_string()
    } else {
        format!("http://{t}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec!["loadgen", "--target", "127.0.0.1:1"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)
    }

    fn flag_of(extra: &[&str]) -> &'static str {
        match parse(extra).map(|a| a.validate()) {
            Ok(Err(Error::InvalidArgument { flag, .. })) => flag,
            other => panic!("{extra:?}: expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let args = parse(&[]).expect("parses");
        args.validate().expect("defaults validate");
        assert_eq!(args.num_requests, 16);
        assert_eq!(args.max_new_tokens, 32);
        assert_eq!((args.warmup_runs, args.repeat_runs), (0, 1));
        assert_eq!(args.submit_schedule, SubmitSchedule::Absolute);
        assert_eq!(args.requested_rate_rps(), None);
    }

    #[test]
    fn rejects_bad_values_naming_the_flag() {
        assert_eq!(
            flag_of(&["--submit-interval-ms", "-5"]),
            "--submit-interval-ms"
        );
        assert_eq!(
            flag_of(&["--submit-interval-ms", "NaN"]),
            "--submit-interval-ms"
        );
        assert_eq!(flag_of(&["--num-requests", "0"]), "--num-requests");
        assert_eq!(flag_of(&["--repeat-runs", "0"]), "--repeat-runs");
        assert_eq!(flag_of(&["--channels", "0"]), "--channels");
        assert_eq!(flag_of(&["--max-concurrency", "0"]), "--max-concurrency");
        assert_eq!(flag_of(&["--max-new-tokens", "0"]), "--max-new-tokens");
        assert_eq!(flag_of(&["--prompt-repeats", "0"]), "--prompt-repeats");
        assert_eq!(flag_of(&["--timeout", "0"]), "--timeout");
        assert_eq!(flag_of(&["--arrival", "poisson"]), "--request-rate");
        assert_eq!(
            flag_of(&["--arrival", "poisson", "--request-rate", "0"]),
            "--request-rate"
        );
        assert_eq!(
            flag_of(&["--arrival", "poisson", "--request-rate", "-2"]),
            "--request-rate"
        );
        assert_eq!(flag_of(&["--request-rate", "5"]), "--request-rate");
        assert_eq!(
            flag_of(&[
                "--arrival",
                "poisson",
                "--request-rate",
                "5",
                "--submit-schedule",
                "relative"
            ]),
            "--submit-schedule"
        );
        assert_eq!(flag_of(&["--temperature", "-1"]), "--temperature");
        assert_eq!(flag_of(&["--top-p", "0"]), "--top-p");
        assert_eq!(flag_of(&["--top-k", "-1"]), "--top-k");
        assert_eq!(flag_of(&["--spawn-server"]), "--target");
        assert_eq!(flag_of(&["--", "--preset", "tiny"]), "--spawn-server");
    }

    #[test]
    fn needs_a_target_or_spawn_server() {
        let args = Args::try_parse_from(["loadgen"]).expect("parses");
        assert!(matches!(
            args.validate(),
            Err(Error::InvalidArgument {
                flag: "--target",
                ..
            })
        ));
        let args = Args::try_parse_from(["loadgen", "--spawn-server", "--", "--preset", "tiny"])
            .expect("parses");
        args.validate().expect("valid");
        assert_eq!(args.server_args, vec!["--preset", "tiny"]);
    }

    #[test]
    fn poisson_and_fixed_rates() {
        let args = parse(&["--arrival", "poisson", "--request-rate", "7.5"]).expect("parses");
        args.validate().expect("valid");
        assert_eq!(args.requested_rate_rps(), Some(7.5));
        let args = parse(&["--submit-interval-ms", "250"]).expect("parses");
        assert_eq!(args.requested_rate_rps(), Some(4.0));
        let args = parse(&[
            "--submit-interval-ms",
            "250",
            "--submit-schedule",
            "relative",
        ])
        .expect("parses");
        assert_eq!(args.requested_rate_rps(), None);
    }

    #[test]
    fn targets_are_normalized_and_repeatable() {
        let args = parse(&["--target", "http://b:2,c:3"]).expect("parses");
        let t: Vec<String> = args.targets.iter().map(|t| normalize_target(t)).collect();
        assert_eq!(t, vec!["http://127.0.0.1:1", "http://b:2", "http://c:3"]);
    }
}
