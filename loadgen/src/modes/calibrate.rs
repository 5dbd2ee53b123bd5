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
//! It prints loadgen's usual report block, then the errors' p50/p99/max,
//! whether the p99s are under `--target-p99-ms`, and what the client did to
//! get there: its submit lag, the rate it opened streams at, and its own CPU
//! time (with the mock on a thread of this process, the mock's CPU is in it;
//! `--mock-process` keeps it out).

use std::io::Write;
use std::time::Duration;

use ember_testkit::mock::MockConfig;
use serde::Serialize;

use crate::config::Backend;
use crate::error::Error;
use crate::measure::dist::{Dist, DistSummary};
use crate::measure::stats::RunStats;
use crate::modes::mock_host::{MockHost, Placement};
use crate::modes::session::{Bench, RunOpts};
use crate::modes::setup::BenchConfig;
use crate::record::RequestRecord;

/// What to calibrate (built by `cli::calibrate` from its flags).
#[derive(Debug, Clone)]
pub struct CalibrateConfig {
    /// Concurrent streams (requests per run).
    pub streams: usize,
    /// The mock's TTFT, ms.
    pub ttft_ms: f64,
    /// The mock's inter-token latency, ms.
    pub itl_ms: f64,
    /// Tokens per request.
    pub tokens: u32,
    /// Gap between stream openings, ms.
    pub interval_ms: f64,
    /// The door calibrated.
    pub backend: Backend,
    /// The error p99 to meet, ms.
    pub target_p99_ms: f64,
    /// Where the mock runs.
    pub placement: Placement,
    /// `--json`.
    pub json: Option<std::path::PathBuf>,
    /// Every flag, for the JSON document.
    pub flags: serde_json::Value,
}

/// What calibration found (the `--json` document).
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// The flags.
    pub config: serde_json::Value,
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
    /// The measured run as the client saw it.
    pub run: ClientSide,
}

/// The measured run from the client's side: how punctually it opened the
/// streams and what that cost it.
#[derive(Debug, Clone, Serialize)]
pub struct ClientSide {
    /// t0 -> last stream ended, seconds.
    pub wall_s: f64,
    /// Submit start - due time, every request, ms.
    pub submit_lag_ms: DistSummary,
    /// The opening rate asked for (1000 / --interval-ms; null for a burst).
    pub requested_rate_rps: Option<f64>,
    /// The opening rate achieved.
    pub achieved_rate_rps: Option<f64>,
    /// This process's CPU time over the run, seconds.
    pub client_cpu_s: Option<f64>,
    /// That over the wall time: cores kept busy.
    pub client_cpu_cores: Option<f64>,
}

impl ClientSide {
    /// The client's side of a run's statistics.
    pub fn of(s: &RunStats) -> ClientSide {
        ClientSide {
            wall_s: s.wall_s,
            submit_lag_ms: s.metrics.submit_lag_ms,
            requested_rate_rps: s.requested_rate_rps,
            achieved_rate_rps: s.achieved_rate_rps,
            client_cpu_s: s.client_cpu_s,
            client_cpu_cores: s.client_cpu_cores,
        }
    }
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

/// Runs the calibration and prints it.
pub async fn run(cal: CalibrateConfig, bench: BenchConfig) -> Result<Calibration, Error> {
    let cfg = MockConfig {
        ttft: Duration::from_secs_f64(cal.ttft_ms / 1e3),
        itl: Duration::from_secs_f64(cal.itl_ms / 1e3),
        ..MockConfig::default()
    };
    let server = MockHost::start(cal.placement, cfg, cal.backend).await?;
    let measured = measure(&bench, server.url()).await;
    server.stop().await;
    let (peak, connections, transport, run, records) = measured?;
    let (ttft_error_ms, itl_error_ms) = analyse(&records);
    let under = |d: &DistSummary| d.p99.is_some_and(|p| p < cal.target_p99_ms);
    let c = Calibration {
        pass: under(&ttft_error_ms) && under(&itl_error_ms),
        transport,
        peak_streams: peak,
        connections,
        ok: records.iter().filter(|r| r.ok).count(),
        config: cal.flags.clone(),
        ttft_error_ms,
        itl_error_ms,
        run,
    };
    print(&cal, &c)?;
    if let Some(path) = &cal.json {
        let text = serde_json::to_string_pretty(&c)?;
        std::fs::write(path, text).map_err(|source| Error::File {
            path: path.clone(),
            source,
        })?;
    }
    Ok(c)
}

/// A warmup run (the same streams), then the measured run: the peak
/// streams, connections, transport, the client's side and the measured
/// records.
async fn measure(
    args: &BenchConfig,
    url: &str,
) -> Result<(usize, usize, String, ClientSide, Vec<RequestRecord>), Error> {
    let mut bench = Bench::connect(args, &[url.to_string()], None, None).await?;
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
        ClientSide::of(s),
        m.records,
    ))
}

/// The calibration's lines on stdout.
fn print(cfg: &CalibrateConfig, c: &Calibration) -> std::io::Result<()> {
    let mut w = std::io::stdout().lock();
    let f = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.3}"));
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
    let r = &c.run;
    let rate = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.0}"));
    writeln!(
        w,
        "{:<38}submit lag p50 {} / p99 {} ms; opened at {} req/s (asked {}); CPU {} s = {} cores over {:.3} s",
        "Client:",
        f(r.submit_lag_ms.p50),
        f(r.submit_lag_ms.p99),
        rate(r.achieved_rate_rps),
        rate(r.requested_rate_rps),
        f(r.client_cpu_s),
        r.client_cpu_cores.map_or("n/a".to_string(), |v| format!("{v:.2}")),
        r.wall_s
    )?;
    writeln!(
        w,
        "{:<38}{} (target: both p99 < {} ms)",
        "Result:",
        if c.pass { "PASS" } else { "FAIL" },
        cfg.target_p99_ms
    )
}
