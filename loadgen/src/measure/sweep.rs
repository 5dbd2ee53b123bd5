//! What a sweep found: one row per run ([`SweepRow`]), the SLO search's
//! answer ([`SweepResult`], the JSON `sweep`), and the rate arithmetic the
//! sweep driver (`modes::sweep`) uses: the rates between baseline and
//! saturation ([`auto_rates`]) and the bracket the search bisects
//! ([`bracket`]).

use serde::Serialize;

use crate::config::SweepMode;
use crate::measure::slo::Slo;
use crate::measure::stats::RunStats;

/// Submit lag limit of sweep runs when --max-submit-lag-ms is not given.
pub const SWEEP_DEFAULT_MAX_LAG_MS: f64 = 50.0;

/// What the sweep flags ask for (built by `cli`).
#[derive(Debug, Clone, Default)]
pub struct SweepConfig {
    /// `--sweep auto`.
    pub mode: Option<SweepMode>,
    /// `--sweep-rates`.
    pub rates: Vec<f64>,
    /// `--sweep-steps`.
    pub steps: usize,
    /// `--sweep-search-steps`.
    pub search_steps: usize,
    /// `--slo-min-share`.
    pub slo_min_share: f64,
    /// `--max-submit-lag-ms`.
    pub max_submit_lag_ms: Option<f64>,
}

impl SweepConfig {
    /// Whether a sweep was asked for.
    pub fn active(&self) -> bool {
        self.mode.is_some() || !self.rates.is_empty()
    }
}

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
pub fn rps(stats: &RunStats) -> f64 {
    if stats.wall_s > 0.0 {
        stats.ok as f64 / stats.wall_s
    } else {
        0.0
    }
}

/// The highest rate that met the SLOs, and the lowest above it that did not.
pub fn bracket(rows: &[SweepRow]) -> (Option<f64>, Option<f64>) {
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
            stats: crate::measure::stats::tests::empty_stats(),
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
