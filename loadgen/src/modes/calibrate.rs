//! `loadgen calibrate`: loadgen measured against a server whose timings are
//! known. The mock server (`ember_testkit::mock`: both doors, gRPC and the
//! OpenAI HTTP API, on one timeline) runs on its own thread and runtime (or
//! on loadgen's runtime, or as a child process: `modes::mock_host`); loadgen
//! fires `--streams` requests at it through the chosen backend on its usual
//! path (firing thread, main runtime) and compares, per request, what it
//! measured with what the mock did:
//!
//! - TTFT error = client TTFT - the mock's server TTFT (everything loadgen
//!   adds: HTTP/2 or HTTP/1.1 + SSE, loopback, both sides' scheduling);
//! - ITL error = |client gap - server gap| for every pair of tokens.
//!
//! It prints loadgen's usual report block, then the errors' p50/p99/max and
//! whether the p99s are under `--target-p99-ms`.

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use ember_testkit::mock::MockConfig;
use serde::Serialize;

use crate::cli::conn::{Backend, HttpVersion};
use crate::cli::Args;
use crate::error::Error;
use crate::measure::dist::{Dist, DistSummary};
use crate::modes::limits;
use crate::modes::mock_host::{MockHost, Placement};
use crate::modes::session::{Bench, RunOpts};
use crate::record::RequestRecord;

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
}

/// What calibration found (the `--json` document).
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// The settings.
    pub config: CalibrateArgs,
    /// The transport measured, in words.
    pub transport: String,
    /// Peak concurrent streams on one connection (HTTP/1.1: on the pool).
    pub peak_streams: usize,
    /// Connections open at the end (HTTP/1.1: one per stream in flight).
    pub connections: usize,
    /// Requests that finished OK (of `streams`).
    pub ok: usize,
    /// client TTFT - server TTFT, ms.
    pub ttft_error_ms: DistSummary,
    /// |client gap - server gap| per token pair, ms.
    pub itl_error_ms: DistSummary,
    /// Both p99s under the target.
    pub pass: bool,
}

/// The errors of a run's records.
pub fn analyse(records: &[RequestRecord]) -> (DistSummary, DistSummary) {
    let (mut ttft, mut itl) = (Dist::default(), Dist::default());
    for r in records.iter().filter(|r| r.ok) {
        if let Some(o) = r.overhead_ns {
            ttft.record_signed_ns(o);
        }
        if let Some(s) = &r.server {
            for (c, g) in r.itl_ns().zip(s.itl_ns()) {
                itl.record_ns(c.abs_diff(g));
            }
        }
    }
    (ttft.summary(), itl.summary())
}

impl CalibrateArgs {
    fn validate(&self) -> Result<Placement, Error> {
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

    /// loadgen's flags for the calibration run against `url`.
    fn args(&self, url: &str) -> Result<Args, Error> {
        let mut argv: Vec<String> = vec!["loadgen".into()];
        let mut push = |a: &str, b: String| {
            argv.push(a.into());
            argv.push(b);
        };
        match self.backend {
            Backend::Ember => push("--target", url.to_string()),
            Backend::Openai => {
                push("--backend", "openai".into());
                push("--base-url", url.to_string());
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
        let args =
            Args::try_parse_from(argv).map_err(|e| Error::invalid("calibrate", e.to_string()))?;
        args.validate()?;
        Ok(args)
    }
}

/// Runs the calibration and prints it.
pub async fn run(cal: CalibrateArgs) -> Result<Calibration, Error> {
    let placement = cal.validate()?;
    let cfg = MockConfig {
        ttft: Duration::from_secs_f64(cal.ttft_ms / 1e3),
        itl: Duration::from_secs_f64(cal.itl_ms / 1e3),
        ..MockConfig::default()
    };
    let server = MockHost::start(placement, cfg, cal.backend).await?;
    let measured = match cal.args(server.url()) {
        Ok(args) => measure(&args).await,
        Err(e) => Err(e),
    };
    server.stop().await;
    let (peak, connections, transport, records) = measured?;
    let (ttft_error_ms, itl_error_ms) = analyse(&records);
    let under = |d: &DistSummary| d.p99.is_some_and(|p| p < cal.target_p99_ms);
    let c = Calibration {
        pass: under(&ttft_error_ms) && under(&itl_error_ms),
        transport,
        peak_streams: peak,
        connections,
        ok: records.iter().filter(|r| r.ok).count(),
        config: cal,
        ttft_error_ms,
        itl_error_ms,
    };
    print(&c)?;
    if let Some(path) = &c.config.json {
        let text = serde_json::to_string_pretty(&c)?;
        std::fs::write(path, text).map_err(|source| Error::File {
            path: path.clone(),
            source,
        })?;
    }
    Ok(c)
}

/// A warmup run (the same streams), then the measured run: the peak
/// streams, connections, transport and the measured records.
async fn measure(args: &Args) -> Result<(usize, usize, String, Vec<RequestRecord>), Error> {
    let mut bench = Bench::connect(args, &args.conn.urls(), None, None).await?;
    let opts = |label: &str, warmup: bool| RunOpts {
        label: label.to_string(),
        run: 0,
        of: 1,
        warmup,
        rate: None,
        burst: false,
        max_concurrency: None,
        max_submit_lag: None,
    };
    bench.measure(opts("w0", true)).await?;
    let m = bench.measure(opts("r0", false)).await?;
    let s = &m.stats;
    Ok((
        s.max_streams_per_connection,
        s.connections,
        bench.header.backend.clone(),
        m.records,
    ))
}

/// The calibration's lines on stdout.
fn print(c: &Calibration) -> std::io::Result<()> {
    let mut w = std::io::stdout().lock();
    let f = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.3}"));
    let cfg = &c.config;
    writeln!(w, "=== calibration ===")?;
    writeln!(
        w,
        "{:<38}{} streams over {} (peak {} in flight on one connection or pool, {} connection(s)), TTFT {} ms, ITL {} ms, {} tokens, opened {} ms apart; {} ok",
        "Setup:", cfg.streams, c.transport, c.peak_streams, c.connections, cfg.ttft_ms, cfg.itl_ms, cfg.tokens, cfg.interval_ms, c.ok
    )?;
    for (name, d) in [
        ("TTFT error (client - server TTFT):", &c.ttft_error_ms),
        ("ITL error (|client gap - server gap|):", &c.itl_error_ms),
    ] {
        writeln!(
            w,
            "{name:<38}p50 {} / p99 {} / max {} ms ({} values)",
            f(d.p50),
            f(d.p99),
            f(d.max),
            d.count
        )?;
    }
    writeln!(
        w,
        "{:<38}{} (target: both p99 < {} ms)",
        "Result:",
        if c.pass { "PASS" } else { "FAIL" },
        cfg.target_p99_ms
    )
}
