//! `--report DIR`: a self-contained HTML page (inline CSS, the SVG charts
//! inlined, no scripts, nothing fetched) plus each chart as its own `.svg`
//! file. The page holds the setup, a table of the runs (or the sweep's rows
//! and the SLO search's answer), the TTFT/TPOT/ITL CDFs, the per-request
//! timeline and, for sweeps, throughput/goodput and latency against the rate.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::bench::Measured;
use crate::charts::{self, ChartError};
use crate::cli::Args;
use crate::error::Error;
use crate::report::Header;
use crate::stats::{DistSummary, RunStats};
use crate::sweep::SweepResult;

/// Everything the page shows.
#[derive(Debug)]
pub struct Page<'a> {
    /// Model, device, schedule.
    pub header: &'a Header,
    /// The flags.
    pub config: &'a Args,
    /// The measured runs (a sweep's runs, one per row).
    pub runs: &'a [Measured],
    /// The sweep, if it was one.
    pub sweep: Option<&'a SweepResult>,
}

/// Escapes text for HTML.
pub fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The charts as (file name, title, svg).
fn charts(page: &Page<'_>) -> Result<Vec<(&'static str, String)>, ChartError> {
    let runs = page.runs;
    let mut out = vec![
        (
            "ttft_cdf.svg",
            charts::cdf(
                "ttft_cdf",
                "TTFT (client) CDF",
                &charts::series_of(runs, |r| r.client_ttft_ns.into_iter().collect()),
            )?,
        ),
        (
            "tpot_cdf.svg",
            charts::cdf(
                "tpot_cdf",
                "TPOT (client) CDF",
                &charts::series_of(runs, |r| r.client_tpot_ns.into_iter().collect()),
            )?,
        ),
        (
            "itl_cdf.svg",
            charts::cdf(
                "itl_cdf",
                "ITL (client) CDF",
                &charts::series_of(runs, |r| r.itl_ns().collect()),
            )?,
        ),
    ];
    // The timeline of the sweep's best rate, else of the last run.
    let pick = page
        .sweep
        .and_then(|s| s.max_rate_meeting_slo)
        .and_then(|best| {
            runs.iter()
                .zip(&page.sweep?.rows)
                .find(|(_, row)| row.rate_rps == Some(best))
        })
        .map(|(m, _)| m)
        .or(runs.last());
    if let Some(m) = pick {
        out.push(("timeline.svg", charts::timeline(&m.records)?));
    }
    if let Some(sweep) = page.sweep {
        if !sweep.rated().is_empty() {
            out.push(("sweep_throughput.svg", charts::sweep_throughput(sweep)?));
            out.push(("sweep_latency.svg", charts::sweep_latency(sweep)?));
        }
    }
    Ok(out)
}

/// Writes `DIR/index.html` and the SVG files; returns the page's path.
pub fn write(dir: &Path, page: &Page<'_>) -> Result<PathBuf, Error> {
    let file_err = |path: PathBuf| move |source| Error::File { path, source };
    std::fs::create_dir_all(dir).map_err(file_err(dir.to_path_buf()))?;
    let charts = charts(page).map_err(|e| Error::Internal(e.to_string()))?;
    for (name, svg) in &charts {
        let path = dir.join(name);
        std::fs::write(&path, svg).map_err(file_err(path.clone()))?;
    }
    let index = dir.join("index.html");
    std::fs::write(&index, render(page, &charts)).map_err(file_err(index.clone()))?;
    Ok(index)
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1600px}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}\
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{border:1px solid #ddd;flex:0 1 auto}\
.chart svg{max-width:100%;height:auto;display:block}\
.ok{color:#197a2e}.bad{color:#b3261e}.note{color:#555;font-size:13px}";

/// The page's HTML.
pub fn render(page: &Page<'_>, charts: &[(&'static str, String)]) -> String {
    let h = page.header;
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>loadgen report</title>\
         <style>{STYLE}</style></head><body>\n<h1>loadgen report</h1>\n<p>Model <b>{}</b> on <b>{}</b>; {} target(s) x {} channel(s); \
         {} requests per run; schedule {}{}.</p>\n",
        esc(&h.model),
        esc(&h.device),
        h.targets,
        h.channels,
        page.runs.first().map_or(0, |m| m.stats.requests),
        esc(&h.schedule),
        h.slo.map_or(String::new(), |s| format!("; SLO {}", esc(&s.to_string())))
    );
    if let Some(sweep) = page.sweep {
        sweep_section(&mut out, sweep);
    }
    runs_table(&mut out, page.runs, page.sweep.is_some());
    out.push_str("<h2>Charts</h2>\n<p class=\"note\">CDFs: one line per run. Timeline: the server's durations are laid back from the client's first token (the two clocks are never mixed); grey is time the server did not see (client + network, both directions).</p>\n<div class=\"charts\">\n");
    for (name, svg) in charts {
        let _ = writeln!(out, "<div class=\"chart\" id=\"{name}\">{svg}</div>");
    }
    out.push_str("</div>\n<h2>Configuration</h2>\n<pre>");
    out.push_str(&esc(
        &serde_json::to_string_pretty(page.config).unwrap_or_default()
    ));
    out.push_str("</pre>\n</body></html>\n");
    out
}

fn pct3(d: &DistSummary) -> String {
    match (d.p50, d.p95, d.p99) {
        (Some(a), Some(b), Some(c)) => format!("{a:.1} / {b:.1} / {c:.1}"),
        _ => "n/a".into(),
    }
}

fn run_cells(s: &RunStats) -> String {
    let m = &s.metrics;
    let good = s.goodput.map_or("-".into(), |g| {
        format!("{:.2} ({:.0}%)", g.rps, g.share * 100.0)
    });
    format!(
        "<td>{}/{}</td><td>{}</td><td>{:.2}</td><td>{:.1}</td><td>{good}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
        s.ok,
        s.failed,
        // A burst's submission rate says nothing: shown only for rated runs.
        s.requested_rate_rps
            .and(s.achieved_rate_rps)
            .map_or("-".into(), |r| format!("{r:.2}")),
        if s.wall_s > 0.0 { s.ok as f64 / s.wall_s } else { 0.0 },
        s.throughput_completion_tps,
        pct3(&m.ttft_ms),
        pct3(&m.tpot_ms),
        pct3(&m.itl_ms),
        pct3(&m.latency_ms),
    )
}

const RUN_HEAD: &str = "<th>ok/failed</th><th>achieved req/s</th><th>ok req/s</th><th>tokens/s</th><th>goodput req/s (share)</th>\
<th>TTFT p50/p95/p99 ms</th><th>TPOT p50/p95/p99 ms</th><th>ITL p50/p95/p99 ms</th><th>latency p50/p95/p99 ms</th>";

fn runs_table(out: &mut String, runs: &[Measured], sweep: bool) {
    if sweep {
        return;
    }
    let _ = write!(
        out,
        "<h2>Runs</h2>\n<table><tr><th>run</th>{RUN_HEAD}<th>note</th></tr>\n"
    );
    for m in runs {
        let note = m.stats.stopped_early.as_deref().map_or(String::new(), esc);
        let _ = writeln!(
            out,
            "<tr><td>{}</td>{}<td>{note}</td></tr>",
            esc(&m.label),
            run_cells(&m.stats)
        );
    }
    out.push_str("</table>\n");
}

fn sweep_section(out: &mut String, sweep: &SweepResult) {
    out.push_str("<h2>Sweep</h2>\n");
    if let Some(slo) = &sweep.slo {
        let class = if sweep.max_rate_meeting_slo.is_some() {
            "ok"
        } else {
            "bad"
        };
        let answer = format!("<span class=\"{class}\">{}</span>", esc(&sweep.answer()));
        let _ = writeln!(
            out,
            "<p>Highest rate meeting the SLO ({}, at least {:.0}% of requests good): <b>{answer}</b></p>",
            esc(&slo.to_string()),
            sweep.min_share * 100.0
        );
    }
    let _ = writeln!(
        out,
        "<table><tr><th>kind</th><th>rate req/s</th>{RUN_HEAD}<th>note</th></tr>"
    );
    for row in &sweep.rows {
        let note = match (&row.stats.stopped_early, row.meets_slo) {
            (Some(r), _) => format!("<span class=\"bad\">{}</span>", esc(r)),
            (None, Some(true)) => "<span class=\"ok\">meets SLO</span>".into(),
            (None, Some(false)) => "<span class=\"bad\">misses SLO</span>".into(),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td>{}<td>{note}</td></tr>",
            row.kind,
            row.rate_rps.map_or("-".into(), |r| format!("{r:.2}")),
            run_cells(&row.stats)
        );
    }
    out.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(
            esc("<a href=\"x\">&</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
        );
    }
}
