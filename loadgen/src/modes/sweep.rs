//! Sweeps: one run per request rate, one report row each, and a search for
//! the highest rate that meets the SLOs.
//!
//! `--sweep-rates 2,4,8` runs exactly those rates. `--sweep auto` first runs a
//! concurrency-1 baseline and an unlimited-concurrency burst (saturation), takes
//! their throughputs in requests/s, then runs `--sweep-steps` rates evenly
//! between them and one at the saturation throughput itself. With `--slo`, a
//! rate *meets the SLOs* when at least `--slo-min-share` of its requests are
//! good and it was not cut short; the search then bisects
//! `--sweep-search-steps` more rates between the highest rate that met them
//! and the lowest that did not (`measure::sweep` has the arithmetic). Every rated run stops early
//! when the submit lag p99 passes `--max-submit-lag-ms` (default 50 ms here):
//! the client is then the bottleneck, and the row says so.

use std::io::Write;
use std::time::Duration;

use crate::config::SweepMode;
use crate::error::Error;
use crate::measure::stats::Measured;
use crate::measure::sweep::{
    auto_rates, bracket, meets, rps, SweepResult, SweepRow, SWEEP_DEFAULT_MAX_LAG_MS,
};
use crate::modes::session::{Bench, RunOpts};

/// The sweep state: the rows so far and the runs for the HTML report.
struct Sweeper<'b, 'a> {
    /// The session every run goes through.
    bench: &'b mut Bench<'a>,
    /// One row per run so far.
    rows: Vec<SweepRow>,
    /// The runs, labelled by rate, for the HTML report.
    runs: Vec<Measured>,
    /// Runs planned (the report's `Run: k/of`).
    of: usize,
}

impl Sweeper<'_, '_> {
    /// One run at `rate` (a burst when `None`); returns its OK requests/s.
    async fn step(
        &mut self,
        kind: &'static str,
        rate: Option<f64>,
        concurrency: Option<usize>,
    ) -> Result<f64, Error> {
        let args = self.bench.args;
        let k = self.rows.len();
        let lag_ms = args
            .sweep
            .max_submit_lag_ms
            .unwrap_or(SWEEP_DEFAULT_MAX_LAG_MS);
        let at = rate.map_or(String::new(), |r| format!(" at {r:.2} req/s"));
        writeln!(
            std::io::stdout().lock(),
            "=== sweep run {}: {kind}{at} ===",
            k + 1
        )?;
        let m = self
            .bench
            .measure(RunOpts {
                label: format!("s{k}"),
                run: k,
                of: self.of.max(k + 1),
                warmup: false,
                rate,
                burst: rate.is_none(),
                max_concurrency: concurrency,
                max_submit_lag: rate.map(|_| Duration::from_secs_f64(lag_ms / 1e3)),
            })
            .await?;
        let throughput = rps(&m.stats);
        self.rows.push(SweepRow {
            kind,
            rate_rps: rate,
            meets_slo: meets(&m.stats, args.sweep.slo_min_share),
            stats: m.stats.clone(),
        });
        let label = match rate {
            Some(r) => format!("{r:.2} req/s"),
            None => kind.to_string(),
        };
        self.runs.push(Measured { label, ..m });
        Ok(throughput)
    }
}

/// Runs the sweep the flags ask for.
pub async fn run(bench: &mut Bench<'_>) -> Result<(Vec<Measured>, SweepResult), Error> {
    let args = bench.args;
    let search = if args.slo.is_some() {
        args.sweep.search_steps
    } else {
        0
    };
    let mut s = Sweeper {
        bench,
        rows: Vec::new(),
        runs: Vec::new(),
        of: 0,
    };
    let rates = match args.sweep.mode {
        Some(SweepMode::Auto) => {
            s.of = 3 + args.sweep.steps + search;
            let lo = s.step("baseline", None, Some(1)).await?;
            let hi = s.step("saturation", None, args.max_concurrency).await?;
            tracing::info!(
                baseline_rps = lo,
                saturation_rps = hi,
                "sweep auto: rate range"
            );
            auto_rates(lo, hi, args.sweep.steps)
        }
        None => {
            s.of = args.sweep.rates.len() + search;
            args.sweep.rates.clone()
        }
    };
    for r in rates {
        s.step("rate", Some(r), args.max_concurrency).await?;
    }
    let (mut best, mut limit_found) = (None, false);
    if let Some(slo) = args.slo {
        for _ in 0..search {
            let (pass, fail) = bracket(&s.rows);
            let next = match (pass, fail) {
                (Some(p), Some(f)) if f > p => (p + f) / 2.0,
                (None, Some(f)) => f / 2.0,
                _ => break,
            };
            s.step("search", Some(next), args.max_concurrency).await?;
        }
        let (pass, fail) = bracket(&s.rows);
        (best, limit_found) = (pass, fail.is_some());
        tracing::info!(?best, %slo, "sweep: highest rate meeting the SLO");
    }
    let result = SweepResult {
        rows: s.rows,
        slo: args.slo,
        min_share: args.sweep.slo_min_share,
        max_rate_meeting_slo: best,
        slo_limit_found: limit_found,
    };
    Ok((s.runs, result))
}
