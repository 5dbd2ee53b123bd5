//! Ember's load generator: streams `Generate` calls at one or more servers on a
//! relative or absolute schedule, and reports what the client saw next to what
//! the server says happened, per request.
//!
//! Every client time is taken on the client's monotonic clock
//! (`std::time::Instant`) and every server time on the server's; the two are
//! never subtracted from each other. Reconciliation compares durations:
//! network + client overhead = client TTFT - server TTFT, and client
//! inter-token gaps next to the server's `server_time_ns` gaps.
//!
//! Layout (one job per module; [`run`] ties them together):
//! - [`cli`]: the flags (clap derive, `LOADGEN_*` env) and their validation;
//!   [`options`]: the flattened groups (data, sweep, view).
//! - [`error`]: the library's error type.
//! - [`dataset`], [`lengths`]: `--dataset` files and length distributions.
//! - [`slo`]: `--slo` and goodput.
//! - [`bench`]: one session (connections, workload) and one run of it.
//! - [`sweep`]: `--sweep-rates` / `--sweep auto` and the SLO search.
//! - [`progress`]: the live view on stderr.
//! - [`html`], [`charts`]: `--report DIR` (HTML page with inlined SVG charts).
//! - [`mock`]: a mock Ember server with known timings; [`calibrate`]: the
//!   `loadgen calibrate` mode that measures loadgen against it.
//! - [`spawn`]: `--spawn-server`: the child `ember-server`, its health, its stop;
//!   [`child`] (the `listening on` line, signals) and [`health`] (health and
//!   info polling) are shared with the `ember-tests` helpers, and
//!   [`harness`] (running the `loadgen` binary in a test) with every test.
//! - [`pool`]: `--channels` HTTP/2 connections per target, round-robin, and
//!   the count of in-flight streams per connection.
//! - [`workload`]: the requests of each run (prompts, `--pretok`, sampling).
//! - [`schedule`]: when each request fires (fixed or Poisson offsets, or the
//!   relative interval) and the precise wait for a target.
//! - [`runner`]: one run: the firing loop on its own thread, a task per request.
//! - [`request`]: one call: submit, read the stream, timestamp every event.
//! - [`record`]: the per-request record (`--requests-out` line).
//! - [`stats`]: HdrHistogram distributions, per-run statistics, the spread
//!   across runs.
//! - [`report`]: the text report on stdout.
//! - [`output`]: the `--json` summary and the `--requests-out` file.

pub mod bench;
pub mod calibrate;
pub mod charts;
pub mod child;
pub mod cli;
pub mod dataset;
pub mod error;
pub mod harness;
pub mod health;
pub mod html;
pub mod lengths;
pub mod mock;
pub mod options;
pub mod output;
pub mod pool;
pub mod progress;
pub mod record;
pub mod report;
pub mod request;
pub mod runner;
pub mod schedule;
pub mod slo;
pub mod spawn;
pub mod stats;
pub mod sweep;
mod validate;
pub mod workload;

use std::io::Write;

pub use cli::Args;
pub use error::Error;

use bench::{Bench, Measured, RunOpts};
use output::{JsonReport, RequestsOut};
use pool::Pool;
use stats::{RunStats, Summary};

/// What the benchmark found, for the binary's exit code.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    /// Requests sent, warmups included.
    pub requests: usize,
    /// Requests that failed, warmups included.
    pub failed: usize,
}

/// Runs the whole benchmark the flags describe: optionally spawns the server,
/// then the warmup and measured runs (or the sweep), printing the report to
/// stdout and writing the JSON and HTML outputs. Failed requests are reported,
/// not returned as errors.
pub async fn run(args: Args) -> Result<Outcome, Error> {
    args.validate()?;
    // Fail on a bad output path before starting anything.
    let requests_out = args
        .requests_out
        .as_deref()
        .map(RequestsOut::create)
        .transpose()?;
    let server = if args.spawn_server {
        Some(spawn::start(&args).await?)
    } else {
        None
    };
    let targets: Vec<String> = match &server {
        Some(s) => vec![s.target.clone()],
        None => args
            .targets
            .iter()
            .map(|t| cli::normalize_target(t))
            .collect(),
    };
    let result = benchmark(&args, &targets, requests_out).await;
    if let Some(server) = server {
        if let Err(e) = server.shutdown().await {
            tracing::warn!(error = %e, "stopping the spawned server failed");
        }
    }
    result
}

/// The runs (or the sweep) against the given targets, then the outputs.
async fn benchmark(
    args: &Args,
    targets: &[String],
    requests_out: Option<RequestsOut>,
) -> Result<Outcome, Error> {
    let mut bench = Bench::connect(args, targets, requests_out).await?;
    let warmups = warmups(&mut bench).await?;
    let (measured, sweep) = if args.sweep.active() {
        let (measured, sweep) = sweep::run(&mut bench).await?;
        (measured, Some(sweep))
    } else {
        (repeats(&mut bench).await?, None)
    };
    let runs: Vec<RunStats> = measured.iter().map(|m| m.stats.clone()).collect();
    let summary = Summary::of(&runs);
    let mut stdout = std::io::stdout().lock();
    if let Some(sweep) = &sweep {
        report::sweep_table(&mut stdout, sweep)?;
    } else {
        report::summary(&mut stdout, &summary)?;
    }
    stdout.flush()?;
    drop(stdout);
    if let Some(path) = &args.json {
        output::write_json(
            path,
            &JsonReport {
                model: &bench.header.model,
                device: &bench.header.device,
                targets,
                config: args,
                warmups: &warmups,
                runs: &runs,
                summary: &summary,
                sweep: sweep.as_ref(),
            },
        )?;
    }
    if let Some(dir) = &args.view.report {
        let page = html::Page {
            header: &bench.header,
            config: args,
            runs: &measured,
            sweep: sweep.as_ref(),
        };
        let index = html::write(dir, &page)?;
        tracing::info!(report = %index.display(), "HTML report written");
    }
    Ok(bench.outcome)
}

/// The warmup runs (the flags' own plan; a burst for sweeps).
async fn warmups(bench: &mut Bench<'_>) -> Result<Vec<RunStats>, Error> {
    let args = bench.args;
    let mut out = Vec::with_capacity(args.warmup_runs);
    for run in 0..args.warmup_runs {
        let m = bench
            .measure(RunOpts {
                label: format!("w{run}"),
                run,
                of: args.warmup_runs,
                warmup: true,
                rate: None,
                burst: args.sweep.active(),
                max_concurrency: args.max_concurrency,
                max_submit_lag: None,
            })
            .await?;
        out.push(m.stats);
    }
    Ok(out)
}

/// The measured runs of a plain (non-sweep) benchmark.
async fn repeats(bench: &mut Bench<'_>) -> Result<Vec<Measured>, Error> {
    let args = bench.args;
    let lag = args
        .sweep
        .max_submit_lag_ms
        .map(|ms| std::time::Duration::from_secs_f64(ms / 1e3));
    let mut out = Vec::with_capacity(args.repeat_runs);
    for run in 0..args.repeat_runs {
        out.push(
            bench
                .measure(RunOpts {
                    label: format!("r{run}"),
                    run,
                    of: args.repeat_runs,
                    warmup: false,
                    rate: None,
                    burst: false,
                    max_concurrency: args.max_concurrency,
                    max_submit_lag: lag,
                })
                .await?,
        );
    }
    Ok(out)
}

/// Model and device from `GetServerInfo` of each target (distinct values,
/// comma-separated); "unknown" where a target does not answer it.
pub(crate) async fn describe(pool: &Pool) -> (String, String) {
    let mut models: Vec<String> = Vec::new();
    let mut devices: Vec<String> = Vec::new();
    for (target, reply) in pool.server_infos().await {
        let (model, device) = match reply {
            Ok(info) => (info.model, info.device),
            Err(status) => {
                tracing::warn!(%target, code = ?status.code(), message = status.message(), "GetServerInfo failed");
                ("unknown".to_string(), "unknown".to_string())
            }
        };
        if !models.contains(&model) {
            models.push(model);
        }
        if !devices.contains(&device) {
            devices.push(device);
        }
    }
    (models.join(", "), devices.join(", "))
}
