//! Sweeps: one run per request rate, one report row each, and a search for
//! the highest rate that meets the SLOs.
//!
//! `--sweep-rates 2,4,8` runs exactly those rates. `--sweep auto` first runs a
//! concurrency-1 baseline and an unlimited-concurrency burst (saturation), takes
//! their throughputs in requests/s, then runs `--sweep-steps` rates evenly
//! between them and one at the saturation throughput itself. With `--slo`, a rate *meets the SLOs* when at least
//! `--slo-min-share` of its requests are good and it was not cut short; the
//! search then bisects `--sweep-search-steps` more rates between the highest
//! rate that met them and the lowest that did not. Every rated run stops early
//! when the submit lag p99 passes `--max-submit-lag-ms` (default 50 ms here):
//! the client is then the bottleneck, and the row says so.

use std::time::Duration;

use serde::Serialize;

use crate::bench::{Bench, Measured, RunOpts};
use crate::error::Error;
use crate::options::{SweepMode, SWEEP_DEFAULT_MAX_LAG_MS};
use crate::slo::Slo;
use crate::stats::RunStats;

/// One run of the sweep.
#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    /// "baseline", "saturation", "rate" or "search".
    pub kind: &'static str,
    /// The requested rate (null for baseline and saturation, which are bursts).
    pub rate_rps: Option<f64>,
    /// With --slo: whether this run met them.
    pub meets_slo: Option<bool>,
    /// The run's statistics.
    pub stats: RunStats,
}

/// The sweep's outcome (the JSON `sweep`).
#[derive(Debug, Clone, Serialize)]
pub struct SweepResult {
    /// In the order run.
    pub rows: Vec<SweepRow>,
    /// The objectives, if given.
    pub slo: Option<Slo>,
    /// Share of good requests a rate needs to meet them.
    pub min_share: f64,
    /// The highest rate that met them (null without --slo or if none did).
    pub max_rate_meeting_slo: Option<f64>,
    /// Whether a higher rate was tried and missed them; if not, the answer
    /// is only the highest rate tried, and the limit may lie above it.
    pub slo_limit_found: bool,
}

impl SweepResult {
    /// Rows with a rate, sorted by it (for the charts).
    pub fn rated(&self) -> Vec<&SweepRow> {
        let mut rows: Vec<&SweepRow> = self.rows.iter().filter(|r| r.rate_rps.is_some()).collect();
        rows.sort_by(|a, b| {
            a.rate_rps
                .partial_cmp(&b.rate_rps)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        rows
    }
}

impl SweepResult {
    /// The SLO search's answer in words.
    pub fn answer(&self) -> String {
        match (self.max_rate_meeting_slo, self.slo_limit_found) {
            (None, _) => "none of the rates tried".to_string(),
            (Some(r), true) => format!("{r:.2} req/s"),
            (Some(r), false) => {
                format!("{r:.2} req/s (the highest rate tried; none missed the SLO)")
            }
        }
    }
}

/// Whether a run meets the SLOs: enough good requests, and not cut short.
pub fn meets(stats: &RunStats, min_share: f64) -> Option<bool> {
    stats
        .goodput
        .map(|g| g.share >= min_share && stats.stopped_early.is_none())
}

/// `steps` rates evenly between `lo` and `hi` (both excluded), then `hi`;
/// `[lo]` if hi <= lo.
pub fn auto_rates(lo: f64, hi: f64, steps: usize) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return vec![lo];
    }
    (1..=steps + 1)
        .map(|k| lo + (hi - lo) * k as f64 / (steps + 1) as f64)
        .collect()
}

/// Successful requests per second of a run.
fn rps(stats: &RunStats) -> f64 {
    if stats.wall_s > 0.0 {
        stats.ok as f64 / stats.wall_s
    } else {
        0.0
    }
}

/// The sweep state: the rows so far and the runs for the HTML report.
struct Sweeper<'b, 'a> {
    bench: &'b mut Bench<'a>,
    rows: Vec<SweepRow>,
    runs: Vec<Measured>,
    of: usize,
}

impl Sweeper<'_, '_> {
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
        if let Some(r) = rate {
            println!("=== sweep run {}: {kind} at {r:.2} req/s ===", k + 1);
        } else {
            println!("=== sweep run {}: {kind} ===", k + 1);
        }
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
    let search = if args.view.slo.is_some() {
        args.sweep.sweep_search_steps
    } else {
        0
    };
    let mut s = Sweeper {
        bench,
        rows: Vec::new(),
        runs: Vec::new(),
        of: 0,
    };
    let rates = match args.sweep.sweep {
        Some(SweepMode::Auto) => {
            s.of = 3 + args.sweep.sweep_steps + search;
            let lo = s.step("baseline", None, Some(1)).await?;
            let hi = s.step("saturation", None, args.max_concurrency).await?;
            tracing::info!(
                baseline_rps = lo,
                saturation_rps = hi,
                "sweep auto: rate range"
            );
            auto_rates(lo, hi, args.sweep.sweep_steps)
        }
        None => {
            s.of = args.sweep.sweep_rates.len() + search;
            args.sweep.sweep_rates.clone()
        }
    };
    for r in rates {
        s.step("rate", Some(r), args.max_concurrency).await?;
    }
    let (mut best, mut limit_found) = (None, false);
    if let Some(slo) = args.view.slo {
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
        slo: args.view.slo,
        min_share: args.sweep.slo_min_share,
        max_rate_meeting_slo: best,
        slo_limit_found: limit_found,
    };
    Ok((s.runs, result))
}

/// The highest rate that met the SLOs, and the lowest above it that did not.
fn bracket(rows: &[SweepRow]) -> (Option<f64>, Option<f64>) {
    let judged: Vec<(f64, bool)> = rows
        .iter()
        .filter_map(|r| Some((r.rate_rps?, r.meets_slo?)))
        .collect();
    let mut pass: Option<f64> = None;
    for &(rate, met) in &judged {
        if met && pass.is_none_or(|p| rate > p) {
            pass = Some(rate);
        }
    }
    let mut fail: Option<f64> = None;
    for &(rate, met) in &judged {
        let above = pass.is_none_or(|p| rate > p);
        if !met && above && fail.is_none_or(|f| rate < f) {
            fail = Some(rate);
        }
    }
    (pass, fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_rates_lie_between() {
        assert_eq!(auto_rates(1.0, 5.0, 3), vec![2.0, 3.0, 4.0, 5.0]);
        assert_eq!(auto_rates(4.0, 3.0, 3), vec![4.0]);
    }

    #[test]
    fn bracket_finds_the_edge() {
        let row = |rate: f64, ok: bool| SweepRow {
            kind: "rate",
            rate_rps: Some(rate),
            meets_slo: Some(ok),
            stats: crate::stats::tests::empty_stats(),
        };
        let rows = vec![
            row(2.0, true),
            row(4.0, true),
            row(8.0, false),
            row(16.0, false),
            row(1.0, false),
        ];
        assert_eq!(bracket(&rows), (Some(4.0), Some(8.0)));
        assert_eq!(bracket(&[row(3.0, false)]), (None, Some(3.0)));
        assert_eq!(bracket(&[row(3.0, true)]), (Some(3.0), None));
    }
}
