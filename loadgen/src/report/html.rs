//! `--report DIR`: a self-contained HTML page (inline CSS, the SVG charts
//! inlined, no scripts, nothing fetched) plus each chart as its own `.svg`
//! file. The page holds, per series (one for a plain benchmark, one per
//! `--series` of `loadgen compare`): the setup, a table of the runs (or the
//! sweep's rows and the SLO search's answer) and, with several targets, the
//! per-target figures; then the TTFT/TPOT/ITL CDFs (a line per run, named by
//! series), a per-request timeline per series and, for sweeps,
//! throughput/goodput and latency against the rate. The tables are in
//! `report::html_tables`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::measure::gpu::GpuSample;
use crate::measure::scrape::MetricSample;
use crate::measure::stats::Measured;
use crate::report::charts::{self, ChartError};
use crate::report::html_tables::{esc, series_section};
use crate::report::model::Series;

/// Everything the page shows.
#[derive(Debug)]
pub struct Page<'a> {
    /// The series (one for a plain benchmark).
    pub series: &'a [Series],
    /// Every flag, as pretty JSON (the API key redacted).
    pub config_json: String,
    /// `loadgen compare`: labels carry the series' names.
    pub compare: bool,
}

impl Page<'_> {
    fn compare(&self) -> bool {
        self.compare
    }
}

/// One chart: file name and SVG.
type Chart = (String, String);

/// The run whose timeline is drawn: the sweep's best rate, else the last.
fn timeline_run(s: &Series) -> Option<&Measured> {
    let best = s.sweep.as_ref().and_then(|sw| {
        let rate = sw.max_rate_meeting_slo?;
        s.measured
            .iter()
            .zip(&sw.rows)
            .find(|(_, row)| row.rate_rps == Some(rate))
            .map(|(m, _)| m)
    });
    best.or(s.measured.last())
}

/// The CDFs of every run of every series.
fn cdfs(page: &Page<'_>) -> Result<Vec<Chart>, ChartError> {
    type Metric = fn(&crate::record::RequestRecord) -> Vec<u64>;
    let metrics: [(&'static str, &str, Metric); 3] = [
        ("ttft_cdf", "TTFT (client) CDF", |r| {
            r.client_ttft_ns.into_iter().collect()
        }),
        ("tpot_cdf", "TPOT (client) CDF", |r| {
            r.client_tpot_ns.into_iter().collect()
        }),
        ("itl_cdf", "ITL (client) CDF", |r| r.itl_ns().collect()),
    ];
    let mut out = Vec::new();
    for (name, title, f) in metrics {
        let series: Vec<charts::Series> = page
            .series
            .iter()
            .flat_map(|s| {
                let prefix = page.compare().then_some(s.name.as_str());
                charts::series_of(&s.measured, prefix, f)
            })
            .collect();
        out.push((format!("{name}.svg"), charts::cdf(name, title, &series)?));
    }
    Ok(out)
}

/// The sweep charts: a single sweep's own, or one line per series.
fn sweep_charts(page: &Page<'_>) -> Result<Vec<Chart>, ChartError> {
    let sweeps: Vec<(&str, &crate::measure::sweep::SweepResult)> = page
        .series
        .iter()
        .filter_map(|s| Some((s.name.as_str(), s.sweep.as_ref()?)))
        .filter(|(_, sw)| !sw.rated().is_empty())
        .collect();
    let mut out = Vec::new();
    match sweeps.as_slice() {
        [] => {}
        [(_, sweep)] if !page.compare() => {
            out.push((
                "sweep_throughput.svg".into(),
                charts::sweep_throughput(sweep)?,
            ));
            out.push(("sweep_latency.svg".into(), charts::sweep_latency(sweep)?));
        }
        many => {
            let ok_rps = |s: &crate::measure::stats::RunStats| {
                (s.wall_s > 0.0).then(|| s.ok as f64 / s.wall_s)
            };
            let svg = charts::compare_sweeps(
                "sweep_throughput",
                "Throughput (ok req/s) vs rate",
                "req/s",
                many,
                &ok_rps,
            )?;
            out.push(("sweep_throughput.svg".into(), svg));
            let ttft = |s: &crate::measure::stats::RunStats| s.metrics.ttft_ms.p99;
            let svg =
                charts::compare_sweeps("sweep_latency", "TTFT p99 vs rate", "ms", many, &ttft)?;
            out.push(("sweep_latency.svg".into(), svg));
        }
    }
    Ok(out)
}

/// The server's metrics and the GPUs over time, for the run whose timeline
/// is drawn (`--scrape-metrics`, `--gpu-telemetry`); `tag` names a compare
/// series' files.
fn server_charts(m: &Measured, tag: &str) -> Result<Vec<Chart>, ChartError> {
    let Some(series) = &m.stats.server_metrics else {
        return Ok(Vec::new());
    };
    let line = |label: &str, f: &dyn Fn(&MetricSample) -> Option<f64>| {
        let pts: Vec<(f64, f64)> = series
            .samples
            .iter()
            .filter_map(|s| Some((s.t_s, f(s)?)))
            .collect();
        (!pts.is_empty()).then(|| (label.to_string(), pts))
    };
    let mut out = Vec::new();
    let state: Vec<_> = [
        line("running", &|s| s.running),
        line("waiting", &|s| s.waiting),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !state.is_empty() {
        let svg = charts::over_time(
            "server_state",
            "Requests running and waiting (server)",
            "requests",
            &state,
        )?;
        out.push((format!("server_state{tag}.svg"), svg));
    }
    let gpus: Vec<u32> = series
        .samples
        .first()
        .map_or(Vec::new(), |s| s.gpus.iter().map(|g| g.gpu).collect());
    let gpu_line = |k: u32, what: &str, f: fn(&GpuSample) -> Option<f64>| {
        line(&format!("GPU {k} {what}"), &move |s: &MetricSample| {
            s.gpus.iter().find(|g| g.gpu == k).and_then(f)
        })
    };
    let mut usage: Vec<_> = vec![line("KV cache usage %", &|s| {
        s.kv_cache_usage.map(|u| u * 100.0)
    })];
    usage.extend(
        gpus.iter()
            .map(|&k| gpu_line(k, "utilization %", |g| g.util_pct.map(f64::from))),
    );
    let usage: Vec<_> = usage.into_iter().flatten().collect();
    if !usage.is_empty() {
        let svg = charts::over_time(
            "usage",
            "KV cache usage (server) and GPU utilization",
            "%",
            &usage,
        )?;
        out.push((format!("usage{tag}.svg"), svg));
    }
    let mut power: Vec<_> = gpus
        .iter()
        .map(|&k| gpu_line(k, "power W", |g| g.power_w))
        .collect();
    power.extend(
        gpus.iter()
            .map(|&k| gpu_line(k, "memory GiB", |g| g.memory_used_mib.map(|m| m / 1024.0))),
    );
    power.extend(gpus.iter().map(|&k| {
        gpu_line(k, "SM clock GHz", |g| {
            g.sm_clock_mhz.map(|c| f64::from(c) / 1e3)
        })
    }));
    let power: Vec<_> = power.into_iter().flatten().collect();
    if !power.is_empty() {
        let svg = charts::over_time(
            "gpu",
            "GPU power, memory and SM clock",
            "W / GiB / GHz",
            &power,
        )?;
        out.push((format!("gpu{tag}.svg"), svg));
    }
    Ok(out)
}

/// The charts as (file name, svg).
fn charts(page: &Page<'_>) -> Result<Vec<Chart>, ChartError> {
    let mut out = cdfs(page)?;
    for (i, s) in page.series.iter().enumerate() {
        let Some(m) = timeline_run(s) else { continue };
        let (file, title) = if page.compare() {
            (
                format!("timeline_{i}.svg"),
                format!(
                    "Per-request timeline: {} {} (client clock)",
                    s.name, m.label
                ),
            )
        } else {
            (
                "timeline.svg".to_string(),
                "Per-request timeline (client clock)".to_string(),
            )
        };
        out.push((file, charts::timeline(&title, &m.records)?));
        let tag = if page.compare() {
            format!("_{i}")
        } else {
            String::new()
        };
        out.extend(server_charts(m, &tag)?);
    }
    out.extend(sweep_charts(page)?);
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
h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}\
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{border:1px solid #ddd;flex:0 1 auto}\
.chart svg{max-width:100%;height:auto;display:block}\
.ok{color:#197a2e}.bad{color:#b3261e}.note{color:#555;font-size:13px}";

/// The page's HTML.
pub fn render(page: &Page<'_>, charts: &[Chart]) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let title = if page.compare() {
        format!("loadgen compare: {} series", page.series.len())
    } else {
        "loadgen report".to_string()
    };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n",
        t = esc(&title)
    );
    for s in page.series {
        series_section(&mut out, s, page.compare());
    }
    out.push_str("<h2>Charts</h2>\n<p class=\"note\">CDFs: one line per run. Timeline: the server's durations are laid back from the client's first token (the two clocks are never mixed); grey is time the server did not see (client + network, both directions); a server that reports no timeline shows no bars.</p>\n<div class=\"charts\">\n");
    for (name, svg) in charts {
        let _ = writeln!(out, "<div class=\"chart\" id=\"{}\">{svg}</div>", esc(name));
    }
    out.push_str("</div>\n<h2>Configuration</h2>\n<pre>");
    out.push_str(&esc(&page.config_json));
    out.push_str("</pre>\n</body></html>\n");
    out
}
