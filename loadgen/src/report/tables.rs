//! The text report's tables: per-target figures (inside a run block, when a
//! run has several targets), the sweep's rows and SLO answer, the summary
//! across measured runs, and `loadgen compare`'s table of series.

use std::io::{self, Write};

use crate::measure::dist::Spread;
use crate::measure::stats::{RunStats, Summary};
use crate::measure::sweep::{rps, SweepResult};
use crate::measure::targets::TargetStats;
use crate::report::fmt::{line, one, two};
use crate::report::model::Series;

/// Per-target lines: requests, OK/failed, tokens/s, TTFT p50/p99, errors.
pub fn per_target(w: &mut impl Write, targets: &[TargetStats]) -> io::Result<()> {
    let width = targets
        .iter()
        .map(|t| t.target.len())
        .max()
        .unwrap_or(6)
        .max(6);
    writeln!(
        w,
        "  {:<width$} {:>8} {:>9} {:>10} {:>17}  errors",
        "target", "requests", "ok/fail", "tok/s", "TTFT p50/p99 ms"
    )?;
    for t in targets {
        let errors: Vec<String> = t.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let ttft = match (t.ttft_p50_ms, t.ttft_p99_ms) {
            (Some(a), Some(b)) => format!("{a:.1}/{b:.1}"),
            _ => "n/a".to_string(),
        };
        writeln!(
            w,
            "  {:<width$} {:>8} {:>9} {:>10.1} {:>17}  {}",
            t.target,
            t.requests,
            format!("{}/{}", t.ok, t.failed),
            t.throughput_completion_tps,
            ttft,
            if errors.is_empty() {
                "none".to_string()
            } else {
                errors.join(", ")
            }
        )?;
    }
    Ok(())
}

/// The sweep's table: one row per rate, then the SLO search's answer.
pub fn sweep_table(w: &mut impl Write, sweep: &SweepResult) -> io::Result<()> {
    writeln!(w, "=== sweep: {} run(s) ===", sweep.rows.len())?;
    writeln!(
        w,
        "{:<11} {:>9} {:>9} {:>9} {:>9} {:>10} {:>16} {:>17} {:>17} {:>10}  note",
        "kind",
        "rate",
        "achieved",
        "ok req/s",
        "ok/fail",
        "tok/s",
        "goodput (share)",
        "TTFT p50/p99 ms",
        "TPOT p50/p99 ms",
        "e2e p99"
    )?;
    for row in &sweep.rows {
        let s = &row.stats;
        let m = &s.metrics;
        let good = s.goodput.map_or("-".to_string(), |g| {
            format!("{:.2} ({:.0}%)", g.rps, g.share * 100.0)
        });
        let note = match (&s.stopped_early, row.meets_slo) {
            (Some(_), _) => "client-bound: stopped early".to_string(),
            (None, Some(true)) => "meets SLO".to_string(),
            (None, Some(false)) => "misses SLO".to_string(),
            (None, None) => String::new(),
        };
        writeln!(
            w,
            "{:<11} {:>9} {:>9} {:>9.2} {:>9} {:>10.1} {:>16} {:>17} {:>17} {:>10}  {note}",
            row.kind,
            row.rate_rps.map_or("-".to_string(), |r| format!("{r:.2}")),
            // A burst's submission rate says nothing; show it for rated rows.
            row.rate_rps
                .and(s.achieved_rate_rps)
                .map_or("-".to_string(), |r| format!("{r:.2}")),
            rps(s),
            format!("{}/{}", s.ok, s.failed),
            s.throughput_completion_tps,
            good,
            two(&m.ttft_ms),
            two(&m.tpot_ms),
            one(m.latency_ms.p99),
        )?;
    }
    if let Some(slo) = &sweep.slo {
        let answer = sweep.answer();
        line(
            w,
            "Highest rate meeting the SLO",
            format!("{answer} ({slo}, >= {:.0}% good)", sweep.min_share * 100.0),
        )?;
    }
    writeln!(w)
}

fn spread(s: &Option<Spread>, unit: &str, decimals: usize) -> String {
    match s {
        Some(s) => format!(
            "mean {:.d$} {unit} (min {:.d$} .. max {:.d$}, stdev {:.d$})",
            s.mean,
            s.min,
            s.max,
            s.stdev,
            d = decimals
        ),
        None => "n/a".to_string(),
    }
}

/// The summary across measured runs.
pub fn summary(w: &mut impl Write, s: &Summary) -> io::Result<()> {
    writeln!(w, "=== summary over {} measured run(s) ===", s.runs)?;
    line(w, "TTFT p99", spread(&s.ttft_p99_ms, "ms", 3))?;
    line(w, "TPOT p99", spread(&s.tpot_p99_ms, "ms", 3))?;
    line(w, "ITL (client) p99", spread(&s.itl_p99_ms, "ms", 3))?;
    line(
        w,
        "Network+client overhead p99",
        spread(&s.overhead_p99_ms, "ms", 3),
    )?;
    line(w, "Latency p99", spread(&s.latency_p99_ms, "ms", 3))?;
    line(
        w,
        "Throughput (completion)",
        spread(&s.throughput_completion_tps, "tokens/s", 2),
    )?;
    line(
        w,
        "Throughput (total)",
        spread(&s.throughput_total_tps, "tokens/s", 2),
    )?;
    line(w, "Failed requests", s.failed)
}

/// One row of the compare table.
fn compare_row(w: &mut impl Write, series: &str, run: &str, s: &RunStats) -> io::Result<()> {
    let m = &s.metrics;
    let good = s.goodput.map_or("-".to_string(), |g| {
        format!("{:.2} ({:.0}%)", g.rps, g.share * 100.0)
    });
    writeln!(
        w,
        "{:<16} {:<12} {:>9} {:>9.2} {:>10.1} {:>16} {:>17} {:>17} {:>9} {:>10}",
        series,
        run,
        format!("{}/{}", s.ok, s.failed),
        rps(s),
        s.throughput_completion_tps,
        good,
        two(&m.ttft_ms),
        two(&m.tpot_ms),
        one(m.itl_ms.p99),
        one(m.latency_ms.p99),
    )
}

/// `loadgen compare`: one row per measured run of each series (a sweep's
/// rows by kind and rate), side by side.
pub fn compare_table(w: &mut impl Write, series: &[Series]) -> io::Result<()> {
    writeln!(w, "=== compare: {} series ===", series.len())?;
    writeln!(
        w,
        "{:<16} {:<12} {:>9} {:>9} {:>10} {:>16} {:>17} {:>17} {:>9} {:>10}",
        "series",
        "run",
        "ok/fail",
        "ok req/s",
        "tok/s",
        "goodput (share)",
        "TTFT p50/p99 ms",
        "TPOT p50/p99 ms",
        "ITL p99",
        "e2e p99"
    )?;
    for s in series {
        match &s.sweep {
            Some(sweep) => {
                for row in &sweep.rows {
                    let run = match row.rate_rps {
                        Some(r) => format!("{r:.2} req/s"),
                        None => row.kind.to_string(),
                    };
                    compare_row(w, &s.name, &run, &row.stats)?;
                }
            }
            None => {
                for m in &s.measured {
                    compare_row(w, &s.name, &m.label, &m.stats)?;
                }
            }
        }
    }
    for s in series {
        line(
            w,
            &format!("{} backend", s.name),
            format!("{} at {}", s.header.backend, s.urls.join(", ")),
        )?;
        if let Some(sweep) = &s.sweep {
            if sweep.slo.is_some() {
                line(
                    w,
                    &format!("{} highest rate meeting the SLO", s.name),
                    sweep.answer(),
                )?;
            }
        }
    }
    writeln!(w)
}
