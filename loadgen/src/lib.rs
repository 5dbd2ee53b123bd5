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
//! - [`cli`]: the flags (clap derive, `LOADGEN_*` env) and their validation.
//! - [`error`]: the library's error type.
//! - [`spawn`]: `--spawn-server`: the child `ember-server`, its health, its stop.
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

pub mod cli;
pub mod error;
pub mod output;
pub mod pool;
pub mod record;
pub mod report;
pub mod request;
pub mod runner;
pub mod schedule;
pub mod spawn;
pub mod stats;
pub mod workload;

use std::io::Write;
use std::sync::Arc;

pub use cli::Args;
pub use error::Error;

use output::{JsonReport, RequestsOut};
use pool::Pool;
use report::Header;
use runner::{run_once, RunSpec};
use schedule::Plan;
use stats::{RunStats, Summary};
use workload::Workload;

/// What the benchmark found, for the binary's exit code.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Requests sent, warmups included.
    pub requests: usize,
    /// Requests that failed, warmups included.
    pub failed: usize,
}

/// Runs the whole benchmark the flags describe: optionally spawns the server,
/// then the warmup and measured runs, printing the report to stdout and writing
/// the JSON outputs. Failed requests are reported, not returned as errors.
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

/// The runs against the given targets.
async fn benchmark(
    args: &Args,
    targets: &[String],
    mut requests_out: Option<RequestsOut>,
) -> Result<Outcome, Error> {
    let workload = Workload::from_args(args)?;
    let pool = Arc::new(Pool::connect(targets, args.channels).await?);
    let (model, device) = describe(&pool).await;
    let plan = Plan::from_args(args);
    let header = Header {
        model,
        device,
        targets: targets.len(),
        channels: args.channels,
        schedule: plan.describe(args),
        absolute: matches!(plan, Plan::Absolute(_)),
        max_concurrency: args.max_concurrency,
    };
    let requested_rate = args.requested_rate_rps();
    let mut outcome = Outcome {
        requests: 0,
        failed: 0,
    };
    let mut warmups = Vec::with_capacity(args.warmup_runs);
    let mut runs = Vec::with_capacity(args.repeat_runs);
    let total = args.warmup_runs + args.repeat_runs;
    for i in 0..total {
        let warmup = i < args.warmup_runs;
        let run = if warmup { i } else { i - args.warmup_runs };
        let label = format!("{}{run}", if warmup { "w" } else { "r" });
        let spec = RunSpec {
            run,
            warmup,
            plan: plan.clone(),
            requests: workload.build(&label, args.num_requests)?,
            max_concurrency: args.max_concurrency,
            timeout: args.request_timeout(),
        };
        tracing::info!(run = %label, requests = args.num_requests, "run starting");
        let result = run_once(pool.clone(), spec).await?;
        if let Some(out) = requests_out.as_mut() {
            out.write(&result.records)?;
        }
        let stats = RunStats::from_run(&result, requested_rate);
        outcome.requests += stats.requests;
        outcome.failed += stats.failed;
        let mut stdout = std::io::stdout().lock();
        if warmup {
            report::warmup(&mut stdout, &stats, args.warmup_runs)?;
            warmups.push(stats);
        } else {
            report::run(&mut stdout, &header, &stats, args.repeat_runs)?;
            runs.push(stats);
        }
        stdout.flush()?;
    }
    let summary = Summary::of(&runs);
    let mut stdout = std::io::stdout().lock();
    report::summary(&mut stdout, &summary)?;
    stdout.flush()?;
    if let Some(path) = &args.json {
        output::write_json(
            path,
            &JsonReport {
                model: &header.model,
                device: &header.device,
                targets,
                config: args,
                warmups: &warmups,
                runs: &runs,
                summary: &summary,
            },
        )?;
    }
    Ok(outcome)
}

/// Model and device from `GetServerInfo` of each target (distinct values,
/// comma-separated); "unknown" where a target does not answer it.
async fn describe(pool: &Pool) -> (String, String) {
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
