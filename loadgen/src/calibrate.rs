//! `loadgen calibrate`: loadgen measured against a server whose timings are
//! known. The built-in [`mock`](crate::mock) server runs in this process on its
//! own thread and runtime; loadgen fires `--streams` requests at it on its
//! usual path (firing thread, main runtime) and compares, per request, what it
//! measured with what the mock did:
//!
//! - TTFT error = client TTFT - the mock's server TTFT (everything loadgen
//!   adds: HTTP/2, loopback, both sides' scheduling);
//! - ITL error = |client gap - server gap| for every pair of tokens.
//!
//! It prints loadgen's usual report block, then the errors' p50/p99/max and
//! whether the p99s are under `--target-p99-ms`.

use std::time::Duration;

use clap::Parser;
use serde::Serialize;

use crate::bench::{Bench, RunOpts};
use crate::cli::Args;
use crate::error::Error;
use crate::mock::{self, MockConfig};
use crate::record::RequestRecord;
use crate::stats::{Dist, DistSummary};

/// Measure loadgen's own error against the built-in mock server (known TTFT
/// and inter-token latency), in this process, on 127.0.0.1.
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
    /// HTTP/2 connections (streams round-robin over them).
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
    /// Write the calibration result as JSON to this file.
    #[arg(long, env = "LOADGEN_CAL_JSON", value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,
}

/// What calibration found (the `--json` document).
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// The settings.
    pub config: CalibrateArgs,
    /// Peak concurrent streams on one connection.
    pub peak_streams: usize,
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

/// Runs the calibration and prints it.
pub async fn run(cal: CalibrateArgs) -> Result<Calibration, Error> {
    for (flag, v) in [
        ("--ttft-ms", cal.ttft_ms),
        ("--itl-ms", cal.itl_ms),
        ("--interval-ms", cal.interval_ms),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(Error::invalid(
                flag,
                format!("must be a finite number >= 0 (got {v})"),
            ));
        }
    }
    let cfg = MockConfig {
        ttft: Duration::from_secs_f64(cal.ttft_ms / 1e3),
        itl: Duration::from_secs_f64(cal.itl_ms / 1e3),
        ..MockConfig::default()
    };
    let server = if cal.shared_runtime {
        MockHost::Shared(
            mock::start(cfg)
                .await
                .map_err(|e| Error::Internal(format!("cannot start the mock server: {e}")))?,
        )
    } else {
        MockHost::Thread(MockThread::start(cfg)?)
    };
    let argv = [
        "loadgen".to_string(),
        "--target".into(),
        server.url().to_string(),
        "--num-requests".into(),
        cal.streams.to_string(),
        "--max-new-tokens".into(),
        cal.tokens.to_string(),
        "--submit-interval-ms".into(),
        cal.interval_ms.to_string(),
        "--channels".into(),
        cal.channels.to_string(),
        "--progress".into(),
        "off".into(),
    ];
    let args =
        Args::try_parse_from(argv).map_err(|e| Error::invalid("calibrate", e.to_string()))?;
    args.validate()?;
    let result = measure(&args).await;
    server.stop().await;
    let (peak, records) = result?;
    let (ttft_error_ms, itl_error_ms) = analyse(&records);
    let under = |d: &DistSummary| d.p99.is_some_and(|p| p < cal.target_p99_ms);
    let c = Calibration {
        pass: under(&ttft_error_ms) && under(&itl_error_ms),
        peak_streams: peak,
        ok: records.iter().filter(|r| r.ok).count(),
        config: cal,
        ttft_error_ms,
        itl_error_ms,
    };
    print(&c);
    if let Some(path) = &c.config.json {
        let text = serde_json::to_string_pretty(&c)?;
        std::fs::write(path, text).map_err(|source| Error::File {
            path: path.clone(),
            source,
        })?;
    }
    Ok(c)
}

/// A warmup run (the same streams), then the measured run.
async fn measure(args: &Args) -> Result<(usize, Vec<RequestRecord>), Error> {
    let mut bench = Bench::connect(
        args,
        &[crate::cli::normalize_target(&args.targets[0])],
        None,
    )
    .await?;
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
    Ok((m.stats.max_streams_per_connection, m.records))
}

fn print(c: &Calibration) {
    let row = |name: &str, d: &DistSummary| {
        let f = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.3}"));
        println!(
            "{name:<38}p50 {} / p99 {} / max {} ms ({} values)",
            f(d.p50),
            f(d.p99),
            f(d.max),
            d.count
        );
    };
    let cfg = &c.config;
    println!("=== calibration ===");
    println!(
        "{:<38}{} streams (peak {} on one connection), TTFT {} ms, ITL {} ms, {} tokens, opened {} ms apart; {} ok",
        "Setup:", cfg.streams, c.peak_streams, cfg.ttft_ms, cfg.itl_ms, cfg.tokens, cfg.interval_ms, c.ok
    );
    row("TTFT error (client - server TTFT):", &c.ttft_error_ms);
    row("ITL error (|client gap - server gap|):", &c.itl_error_ms);
    println!(
        "{:<38}{} (target: both p99 < {} ms)",
        "Result:",
        if c.pass { "PASS" } else { "FAIL" },
        cfg.target_p99_ms
    );
}

/// Where the mock runs.
enum MockHost {
    /// On loadgen's runtime.
    Shared(mock::MockServer),
    /// On its own thread.
    Thread(MockThread),
}

impl MockHost {
    fn url(&self) -> &str {
        match self {
            MockHost::Shared(s) => &s.url,
            MockHost::Thread(t) => &t.url,
        }
    }

    async fn stop(self) {
        match self {
            MockHost::Shared(s) => s.stop().await,
            // Joins a thread that is only waiting for its stop signal.
            MockHost::Thread(t) => t.stop(),
        }
    }
}

/// The mock on its own thread and runtime, so serving it does not take turns
/// from loadgen's runtime.
struct MockThread {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MockThread {
    fn start(cfg: MockConfig) -> Result<MockThread, Error> {
        let (url_tx, url_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("loadgen-mock".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = url_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    match mock::start(cfg).await {
                        Ok(server) => {
                            let _ = url_tx.send(Ok(server.url.clone()));
                            let _ = stop_rx.await;
                            server.stop().await;
                        }
                        Err(e) => {
                            let _ = url_tx.send(Err(e.to_string()));
                        }
                    }
                });
            })
            .map_err(|e| Error::Internal(format!("cannot start the mock thread: {e}")))?;
        let url = url_rx
            .recv()
            .map_err(|_| Error::Internal("the mock thread ended".into()))?
            .map_err(|e| Error::Internal(format!("cannot start the mock server: {e}")))?;
        Ok(MockThread {
            url,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
