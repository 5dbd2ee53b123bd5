//! The HTML report's text and tables, one section per series: the setup
//! line, the sweep's answer and rows (or the runs), and per-target figures
//! when a run had several targets. Every string that came from outside
//! (model names, URLs, labels) goes through [`esc`].

use std::fmt::Write as _;

use crate::measure::dist::DistSummary;
use crate::measure::stats::{Measured, RunStats};
use crate::measure::sweep::SweepResult;
use crate::measure::targets::TargetStats;
use crate::report::fmt::NOT_REPORTED;
use crate::report::model::Series;

/// Escapes text for HTML.
pub fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
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
    let overhead = if s.server_reported > 0 || s.ok == 0 {
        pct3(&m.overhead_ms)
    } else {
        NOT_REPORTED.to_string()
    };
    let cached = if (s.server_reported > 0 || s.ok == 0) && s.prompt_tokens > 0 {
        format!(
            "{:.1}%",
            100.0 * s.cached_prompt_tokens as f64 / s.prompt_tokens as f64
        )
    } else {
        NOT_REPORTED.to_string()
    };
    let cut = if s.cut > 0 {
        format!(" ({} cut)", s.cut)
    } else {
        String::new()
    };
    format!(
        "<td>{}/{}{cut}</td><td>{}</td><td>{:.2}</td><td>{:.1}</td><td>{good}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{overhead}</td><td>{cached}</td>",
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
<th>TTFT p50/p95/p99 ms</th><th>TPOT p50/p95/p99 ms</th><th>ITL p50/p95/p99 ms</th><th>latency p50/p95/p99 ms</th>\
<th>client - server TTFT p50/p95/p99 ms</th><th>prompt tokens from the prefix cache (server)</th>";

fn runs_table(out: &mut String, runs: &[Measured]) {
    let _ = writeln!(out, "<table><tr><th>run</th>{RUN_HEAD}<th>note</th></tr>");
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

fn per_target_table(out: &mut String, label: &str, targets: &[TargetStats]) {
    let _ = writeln!(
        out,
        "<p>Per target ({}):</p>\n<table><tr><th>target</th><th>requests</th><th>ok/failed</th><th>tokens/s</th><th>TTFT p50 ms</th><th>TTFT p99 ms</th><th>errors</th></tr>",
        esc(label)
    );
    let f = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1}"));
    for t in targets {
        let errors: Vec<String> = t.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}/{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&t.target),
            t.requests,
            t.ok,
            t.failed,
            t.throughput_completion_tps,
            f(t.ttft_p50_ms),
            f(t.ttft_p99_ms),
            esc(&if errors.is_empty() { "none".to_string() } else { errors.join(", ") })
        );
    }
    out.push_str("</table>\n");
}

/// One series' section: heading (compare), setup, sweep or runs, per-target
/// figures of each run with several targets.
pub fn series_section(out: &mut String, s: &Series, compare: bool) {
    let hd = &s.header;
    if compare {
        let _ = writeln!(out, "<h2>Series {}</h2>", esc(&s.name));
    } else {
        out.push_str("<h2>Setup</h2>\n");
    }
    let conns = if hd.http1 {
        "HTTP/1.1 pool".to_string()
    } else {
        format!("{} channel(s)", hd.channels)
    };
    let _ = writeln!(
        out,
        "<p>Model <b>{}</b> on <b>{}</b>; {}; requests: {} (prompt nonce {}); {} target(s) ({}) x {conns}, balance {}; {} requests per run; schedule {}{}.</p>",
        esc(&hd.model),
        esc(&hd.device),
        esc(&hd.backend),
        esc(&hd.request_shape),
        esc(&hd.nonce),
        hd.targets,
        esc(&s.urls.join(", ")),
        esc(&hd.balance),
        s.measured.first().map_or(0, |m| m.stats.requests),
        esc(&hd.schedule),
        hd.slo.map_or(String::new(), |slo| format!("; SLO {}", esc(&slo.to_string())))
    );
    let h = if compare { "h3" } else { "h2" };
    match &s.sweep {
        Some(sweep) => {
            let _ = writeln!(out, "<{h}>Sweep</{h}>");
            sweep_section(out, sweep);
        }
        None => {
            let _ = writeln!(out, "<{h}>Runs</{h}>");
            runs_table(out, &s.measured);
        }
    }
    for m in s.measured.iter().filter(|m| m.stats.per_target.len() > 1) {
        per_target_table(out, &m.label, &m.stats.per_target);
    }
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
