//! `loadgen calibrate`'s flags: loadgen measured against its built-in mock
//! server (`modes::calibrate` runs it). Validation builds the calibration's
//! settings and the benchmark settings of its run, aimed at the mock.

use clap::Parser;
use serde::Serialize;

use crate::cli::Args;
use crate::config::{Backend, HttpVersion};
use crate::error::Error;
use crate::modes::calibrate::{self as runner, CalibrateConfig, Calibration};
use crate::modes::limits;
use crate::modes::mock_host::Placement;
use crate::modes::setup::BenchConfig;

/// Measure loadgen's own error against the built-in mock server (known TTFT
/// and inter-token latency), on 127.0.0.1, through either backend.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "loadgen calibrate")]
pub struct CalibrateArgs {
    /// Concurrent streams (requests per run).
    #[arg(
        long,
        env = "LOADGEN_CAL_STREAMS",
        default_value_t = 1000,
        value_name = "N"
    )]
    pub streams: usize,
    /// The mock's time to first token, ms.
    #[arg(
        long,
        env = "LOADGEN_CAL_TTFT_MS",
        default_value_t = 500.0,
        value_name = "MS"
    )]
    pub ttft_ms: f64,
    /// The mock's inter-token latency, ms.
    #[arg(
        long,
        env = "LOADGEN_CAL_ITL_MS",
        default_value_t = 50.0,
        value_name = "MS"
    )]
    pub itl_ms: f64,
    /// Tokens per request.
    #[arg(
        long,
        env = "LOADGEN_CAL_TOKENS",
        default_value_t = 16,
        value_name = "N"
    )]
    pub tokens: u32,
    /// Gap between stream openings, ms (0 = one burst). The default opens
    /// 1,000 streams over 0.5 s, all of them open at once with the defaults.
    #[arg(
        long,
        env = "LOADGEN_CAL_INTERVAL_MS",
        default_value_t = 0.5,
        value_name = "MS"
    )]
    pub interval_ms: f64,
    /// ember: the mock's gRPC door; openai: its OpenAI HTTP door (SSE).
    #[arg(long, env = "LOADGEN_CAL_BACKEND", value_enum, default_value_t = Backend::Ember)]
    pub backend: Backend,
    /// --backend openai: HTTP/1.1 (a connection per stream) or HTTP/2.
    #[arg(long, env = "LOADGEN_CAL_HTTP", value_enum, default_value_t = HttpVersion::Http1)]
    pub http: HttpVersion,
    /// HTTP/2 connections (gRPC, or --http 2); streams spread over them.
    #[arg(
        long,
        env = "LOADGEN_CAL_CHANNELS",
        default_value_t = 1,
        value_name = "N"
    )]
    pub channels: usize,
    /// The error p99 to meet, ms (reported as PASS or FAIL).
    #[arg(
        long,
        env = "LOADGEN_CAL_TARGET_P99_MS",
        default_value_t = 1.0,
        value_name = "MS"
    )]
    pub target_p99_ms: f64,
    /// Serve the mock on loadgen's own runtime instead of its own thread (one
    /// OS thread fewer competing for the cores, but the mock's work then
    /// shares loadgen's worker threads).
    #[arg(long, env = "LOADGEN_CAL_SHARED_RUNTIME")]
    pub shared_runtime: bool,
    /// Run the mock as a child process (`loadgen mock`), as a real server
    /// would be; also halves the open files each process needs (10,000
    /// HTTP/1.1 streams need 10,000 sockets on each side).
    #[arg(long, env = "LOADGEN_CAL_MOCK_PROCESS")]
    pub mock_process: bool,
    /// Write the calibration result as JSON to this file.
    #[arg(long, env = "LOADGEN_CAL_JSON", value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,

    /// More loadgen flags for the calibration run, after `--`: the request
    /// shapes and workload kinds, e.g. `-- --stream false` (with --backend
    /// openai), `-- --turns 3 --endpoint chat`, `-- --duration 10s
    /// --max-concurrency 1000`, `-- --shared-prefix-len 64`. The TTFT error
    /// of a non-streaming request is its latency - the mock's total.
    #[arg(last = true, value_name = "LOADGEN_FLAGS")]
    pub loadgen_flags: Vec<String>,
}

impl CalibrateArgs {
    /// Checks the flags; the calibration's settings and its run's.
    pub fn validate(&self) -> Result<(CalibrateConfig, BenchConfig), Error> {
        let placement = self.placement()?;
        let config = CalibrateConfig {
            streams: self.streams,
            ttft_ms: self.ttft_ms,
            itl_ms: self.itl_ms,
            tokens: self.tokens,
            interval_ms: self.interval_ms,
            backend: self.backend,
            target_p99_ms: self.target_p99_ms,
            placement,
            json: self.json.clone(),
            flags: serde_json::to_value(self)?,
        };
        Ok((config, self.bench()?))
    }

    /// Runs the calibration.
    pub async fn run(self) -> Result<Calibration, Error> {
        let (config, bench) = self.validate()?;
        runner::run(config, bench).await
    }

    fn placement(&self) -> Result<Placement, Error> {
        for (flag, v) in [
            ("--ttft-ms", self.ttft_ms),
            ("--itl-ms", self.itl_ms),
            ("--interval-ms", self.interval_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::invalid(
                    flag,
                    format!("must be a finite number >= 0 (got {v})"),
                ));
            }
        }
        let placement = match (self.shared_runtime, self.mock_process) {
            (true, true) => {
                return Err(Error::invalid(
                    "--mock-process",
                    "cannot be combined with --shared-runtime",
                ))
            }
            (true, false) => Placement::Shared,
            (false, true) => Placement::Process,
            (false, false) => Placement::Thread,
        };
        // HTTP/1.1 holds a socket per stream on each side.
        let http1 = self.backend == Backend::Openai && self.http == HttpVersion::Http1;
        let per_stream = match (http1, placement) {
            (false, _) => 0,
            (true, Placement::Process) => 1,
            (true, _) => 2,
        };
        let needed = (self.streams * per_stream) as u64 + 256;
        let limit = limits::open_files();
        if per_stream > 0 && limit.is_some_and(|l| needed > l) {
            return Err(Error::invalid(
                "--streams",
                format!(
                    "{} HTTP/1.1 streams need about {needed} open files in this process, over its limit of {}{}",
                    self.streams,
                    limit.unwrap_or(0),
                    if per_stream == 2 { "; add --mock-process (the mock's sockets then live in its own process) or use --http 2" } else { "; use --http 2" }
                ),
            ));
        }
        Ok(placement)
    }

    /// loadgen's settings for the calibration run (its target is the mock,
    /// given when it listens).
    fn bench(&self) -> Result<BenchConfig, Error> {
        let mut argv: Vec<String> = vec!["loadgen".into()];
        let mut push = |a: &str, b: String| {
            argv.push(a.into());
            argv.push(b);
        };
        match self.backend {
            Backend::Ember => {}
            Backend::Openai => {
                push("--backend", "openai".into());
                push("--model", "mock".into());
                let http = if self.http == HttpVersion::Http2 {
                    "2"
                } else {
                    "1"
                };
                push("--http", http.into());
            }
        }
        push("--num-requests", self.streams.to_string());
        push("--max-new-tokens", self.tokens.to_string());
        push("--submit-interval-ms", self.interval_ms.to_string());
        push("--channels", self.channels.to_string());
        push("--progress", "off".into());
        argv.extend(self.loadgen_flags.iter().cloned());
        Args::try_parse_from(argv)
            .map_err(|e| Error::invalid("calibrate", e.to_string()))?
            .bench_config()
    }
}
