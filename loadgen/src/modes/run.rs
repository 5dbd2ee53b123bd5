//! `loadgen [FLAGS]`, the plain benchmark: optionally spawn the server, then
//! one series of runs (warmups, then the measured runs or the sweep) against
//! the targets, printing each run's block and the summary (or the sweep's
//! table), then the `--json` and `--report` outputs. [`benchmark`] is the
//! series itself, which `loadgen compare` runs once per `--series`.

use std::io::Write;
use std::time::Duration;

use crate::error::Error;
use crate::measure::stats::{Measured, RunStats, Summary};
use crate::modes::session::{Bench, Outcome, RunOpts};
use crate::modes::setup::{BenchConfig, Outputs, Servers};
use crate::modes::{spawn, sweep};
use crate::report::json::{self, JsonReport, RequestsOut, SeriesJson};
use crate::report::model::Series;
use crate::report::{html, tables};

/// Runs the whole benchmark `config` describes against `servers`. Failed
/// requests are reported, not returned as errors.
pub async fn run(config: BenchConfig, servers: Servers) -> Result<Outcome, Error> {
    // Fail on a bad output path before starting anything.
    let requests_out = config
        .outputs
        .requests_out
        .as_deref()
        .map(RequestsOut::create)
        .transpose()?;
    let (server, urls) = match servers {
        Servers::Spawn(spawn_config) => {
            let s = spawn::start(&spawn_config).await?;
            let urls = vec![s.target.clone()];
            (Some(s), urls)
        }
        Servers::Given(urls) => (None, urls),
    };
    let result = benchmark(&config, &urls, requests_out, None).await;
    if let Some(server) = server {
        if let Err(e) = server.shutdown().await {
            tracing::warn!(error = %e, "stopping the spawned server failed");
        }
    }
    let (series, outcome, _) = result?;
    outputs(
        &config.outputs,
        std::slice::from_ref(&series),
        &config.flags,
        false,
    )?;
    Ok(outcome)
}

/// Writes `--json` (a plain benchmark's one series flattened, or compare's
/// list of series) and `--report`; `config` is every flag, as written out.
pub fn outputs(
    to: &Outputs,
    series: &[Series],
    config: &serde_json::Value,
    compare: bool,
) -> Result<(), Error> {
    if let Some(path) = &to.json {
        match series {
            [one] if !compare => json::write_json(
                path,
                &JsonReport {
                    series: SeriesJson::of(one, false),
                    config,
                },
            )?,
            many => json::write_json(
                path,
                &json::CompareJson {
                    series: many.iter().map(|s| SeriesJson::of(s, true)).collect(),
                    config,
                },
            )?,
        }
    }
    if let Some(dir) = &to.report {
        let page = html::Page {
            series,
            config_json: serde_json::to_string_pretty(config)?,
            compare,
        };
        let index = html::write(dir, &page)?;
        tracing::info!(report = %index.display(), "HTML report written");
    }
    Ok(())
}

/// One series against `urls`: warmups, then the measured runs (or the sweep),
/// each run's block printed, then the summary (or the sweep's table). Gives
/// the `--requests-out` file back for the next series.
pub async fn benchmark(
    args: &BenchConfig,
    urls: &[String],
    requests_out: Option<RequestsOut>,
    name: Option<String>,
) -> Result<(Series, Outcome, Option<RequestsOut>), Error> {
    let mut bench = Bench::connect(args, urls, requests_out, name.clone()).await?;
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
    match &sweep {
        Some(sweep) => tables::sweep_table(&mut stdout, sweep)?,
        None => tables::summary(&mut stdout, &summary)?,
    }
    stdout.flush()?;
    drop(stdout);
    let series = Series {
        name: name.unwrap_or_else(|| "run".to_string()),
        urls: bench.urls(),
        header: bench.header.clone(),
        warmups,
        measured,
        summary,
        sweep,
    };
    let outcome = bench.outcome;
    Ok((series, outcome, bench.into_requests_out()))
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
        .map(|ms| Duration::from_secs_f64(ms / 1e3));
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
