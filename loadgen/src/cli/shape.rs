//! The flags that make loadgen send what real clients send (issue 33), one
//! group flattened into [`Args`](crate::cli::Args): non-streaming requests
//! and requests without a limit, shared-prefix and multi-turn workloads,
//! timed runs, the unique prompts' nonce; and [`TokenLimit`], the value of
//! `--max-new-tokens` (a count or `none`). Each value is checked in
//! `cli/validate.rs`, naming the flag.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::{ArgAction, Args as ClapArgs};
use serde::{Serialize, Serializer};

use crate::measure::slo::parse_duration;

/// `--max-new-tokens`: a count, or `none` (no limit sent: the server
/// decides, as OpenAI clients leave it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenLimit(pub Option<u32>);

impl FromStr for TokenLimit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.eq_ignore_ascii_case("none") {
            return Ok(TokenLimit(None));
        }
        text.trim()
            .parse::<u32>()
            .map(|n| TokenLimit(Some(n)))
            .map_err(|_| format!("`{text}` is not a token count or `none`"))
    }
}

impl fmt::Display for TokenLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "none"),
        }
    }
}

impl Serialize for TokenLimit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(n) => s.serialize_u32(n),
            None => s.serialize_str("none"),
        }
    }
}

/// A run length with its unit: `90s`, `500ms`, `2m` (a bare number is
/// refused: seconds or milliseconds would be a guess).
pub fn parse_run_length(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if let Some(minutes) = t.strip_suffix('m').filter(|n| !n.ends_with('m')) {
        return parse_duration(&format!("{minutes}s")).map(|d| d * 60);
    }
    if t.ends_with('s') {
        parse_duration(t)
    } else {
        Err(format!("`{text}` needs a unit (e.g. 60s, 500ms, 2m)"))
    }
}

/// What the requests look like and how long a run lasts.
#[derive(Debug, Clone, ClapArgs, Serialize)]
pub struct ShapeArgs {
    /// true: streamed responses (SSE / the gRPC stream), TTFT at the first
    /// token; false (--backend openai only): one JSON body, so latency =
    /// TTFT = the end of the body and TPOT comes from the server's timing
    /// extension when it sends one. Ember's gRPC API is streaming only.
    #[arg(long, env = "LOADGEN_STREAM", default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub stream: bool,

    /// The unique prompts' nonce (`[NONCE.r0.3] `), printed in the report.
    /// Default: a new one per invocation, so a second invocation against
    /// the same server does not hit the first one's prefix cache; pass the
    /// printed value to send the very same prompts again.
    #[arg(long, env = "LOADGEN_NONCE", value_name = "TEXT")]
    pub nonce: Option<String>,

    /// Shared-prefix workload: every prompt starts with one of
    /// --num-prefixes prefixes of this many random token ids (request i
    /// takes prefix i % K), then a unique suffix (the usual prompt, made
    /// unique with the nonce). The prefixes stay the same across the runs
    /// of one invocation.
    #[arg(long, env = "LOADGEN_SHARED_PREFIX_LEN", value_name = "L")]
    pub shared_prefix_len: Option<u32>,

    /// How many distinct shared prefixes (with --shared-prefix-len).
    #[arg(
        long,
        env = "LOADGEN_NUM_PREFIXES",
        default_value_t = 1,
        value_name = "K"
    )]
    pub num_prefixes: usize,

    /// Multi-turn sessions: each of the --num-requests sessions sends this
    /// many turns, each carrying the whole history (every earlier message
    /// and reply) plus a new message; a session stays on one target.
    #[arg(long, env = "LOADGEN_TURNS", default_value_t = 1, value_name = "T")]
    pub turns: usize,

    /// Milliseconds a session waits after a reply before its next turn.
    #[arg(
        long,
        env = "LOADGEN_THINK_TIME_MS",
        default_value_t = 0.0,
        value_name = "MS",
        allow_negative_numbers = true
    )]
    pub think_time_ms: f64,

    /// A timed run: fire on the schedule (a rate, or a closed loop with
    /// --max-concurrency) until this much time has passed, e.g. 60s, 2m;
    /// --num-requests then only caps the count. Requests still in flight get
    /// --duration-grace to finish; those still running then are cut
    /// (cancelled, counted apart as `cut`, not as failures).
    #[arg(long, env = "LOADGEN_DURATION", value_name = "DURATION", value_parser = parse_run_length)]
    #[serde(serialize_with = "ser_secs")]
    pub duration: Option<Duration>,

    /// With --duration: how long requests in flight at the end may still
    /// run before they are cut.
    #[arg(long, env = "LOADGEN_DURATION_GRACE", default_value = "30s", value_name = "DURATION", value_parser = parse_run_length)]
    #[serde(serialize_with = "ser_secs_always")]
    pub duration_grace: Duration,
}

fn ser_secs<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

fn ser_secs_always<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The server's view during a run.
#[derive(Debug, Clone, ClapArgs, Serialize)]
pub struct ObserveArgs {
    /// Sample this Prometheus endpoint (e.g. http://host:9090/metrics)
    /// through each run: vLLM's names (running, waiting, KV cache usage,
    /// preemptions, prefix cache hits and queries), which Ember exports too;
    /// the samples go into --json and --report as time series.
    #[arg(long, env = "LOADGEN_SCRAPE_METRICS", value_name = "URL")]
    pub scrape_metrics: Option<String>,

    /// Milliseconds between --scrape-metrics (and --gpu-telemetry) samples.
    #[arg(
        long,
        env = "LOADGEN_SCRAPE_INTERVAL_MS",
        default_value_t = 500.0,
        value_name = "MS",
        allow_negative_numbers = true
    )]
    pub scrape_interval_ms: f64,

    /// Sample the local GPUs through NVML (utilization, memory, power, SM
    /// clock) through each run, for a server on this machine. NVML is loaded
    /// at run time: without it the report says so and the run goes on.
    #[arg(long, env = "LOADGEN_GPU_TELEMETRY")]
    pub gpu_telemetry: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_lengths_parse() {
        assert_eq!("none".parse::<TokenLimit>(), Ok(TokenLimit(None)));
        assert_eq!("12".parse::<TokenLimit>(), Ok(TokenLimit(Some(12))));
        assert!("x".parse::<TokenLimit>().is_err());
        assert_eq!(TokenLimit(None).to_string(), "none");
        assert_eq!(parse_run_length("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_run_length("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_run_length("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_run_length("60").is_err(), "a unit is required");
        assert!(parse_run_length("0s").is_err());
    }
}
