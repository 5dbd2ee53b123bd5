//! The report's charts as SVG strings (plotters' SVG backend: no fonts or
//! system libraries needed): latency CDFs, the per-request timeline, and for
//! sweeps throughput/goodput and latency against the request rate (one line
//! per metric, or per series and metric when `loadgen compare` swept).

use plotters::prelude::*;

use crate::measure::metrics::Metrics;
use crate::measure::stats::{Measured, RunStats};
use crate::measure::sweep::SweepResult;
use crate::record::RequestRecord;

/// Chart size in pixels.
const SIZE: (u32, u32) = (700, 400);
/// Most points drawn per CDF series (evenly subsampled beyond).
const CDF_POINTS: usize = 2000;
/// Most requests drawn in the timeline.
pub const TIMELINE_REQUESTS: usize = 150;

/// A chart failed to draw.
#[derive(Debug, thiserror::Error)]
#[error("chart {name}: {reason}")]
pub struct ChartError {
    /// Which chart.
    pub name: &'static str,
    /// What plotters said.
    pub reason: String,
}

fn err(name: &'static str) -> impl Fn(String) -> ChartError {
    move |reason| ChartError { name, reason }
}

/// One series of a CDF chart: a label and its values in ms.
pub type Series = (String, Vec<f64>);

/// A CDF chart of each series (x: ms, y: fraction of values <= x).
pub fn cdf(name: &'static str, title: &str, series: &[Series]) -> Result<String, ChartError> {
    let e = err(name);
    let xmax = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0_f64, f64::max)
        .max(1e-3)
        * 1.05;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..xmax, 0.0..1.0)
            .map_err(|x| e(x.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("ms")
            .y_desc("fraction of values <= x")
            .draw()
            .map_err(|x| e(x.to_string()))?;
        for (i, (label, values)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(cdf_points(values), color.stroke_width(2)))
                .map_err(|x| e(x.to_string()))?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(x.to_string()))?;
        root.present().map_err(|x| e(x.to_string()))?;
    }
    Ok(svg)
}

/// Sorted values as (value, cumulative fraction), subsampled to [`CDF_POINTS`].
pub fn cdf_points(values: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let step = n.div_ceil(CDF_POINTS).max(1);
    let mut out: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (v[i], (i + 1) as f64 / n as f64))
        .collect();
    if let (Some(&last), Some(&(_, f))) = (v.last(), out.last()) {
        if f < 1.0 {
            out.push((last, 1.0));
        }
    }
    out
}

/// The phases of one request on the client's clock, in ms since t0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phases {
    /// Intended start (the schedule).
    pub intended: f64,
    /// Submit start.
    pub submit: f64,
    /// Server received it (client first token - server TTFT).
    pub received: f64,
    /// Admitted (client first token - prefill).
    pub admitted: f64,
    /// First token received.
    pub first_token: f64,
    /// End of the stream.
    pub finish: f64,
}

/// The phases of an OK request with a server timeline. The server's durations
/// are laid back from the client's first token (the two clocks are never
/// mixed): prefill ends there, queue wait before it; what is left of the
/// client's TTFT before that is client + network overhead (both directions).
pub fn phases(r: &RequestRecord) -> Option<Phases> {
    let s = r.server.as_ref()?;
    let ms = |ns: u64| ns as f64 / 1e6;
    let submit = ms(r.submit_start_ns);
    if !r.streamed {
        // One body at the end: the server's whole time is laid back from
        // it, and its first token falls inside (the client saw none apart).
        let finish = ms(r.finish_ns);
        let received = (finish - ms(s.total_ns)).max(submit);
        let first = (received + ms(s.server_ttft_ns)).min(finish);
        let admitted = (first - ms(s.prefill_to_first_token_ns)).max(received);
        return Some(Phases {
            intended: ms(r.intended_start_ns),
            submit,
            received,
            admitted,
            first_token: first,
            finish,
        });
    }
    let first = r.first_token_ns? as f64 / 1e6;
    let received = (first - ms(s.server_ttft_ns)).max(submit);
    let admitted = (first - ms(s.prefill_to_first_token_ns)).max(received);
    Some(Phases {
        intended: ms(r.intended_start_ns),
        submit,
        received,
        admitted,
        first_token: first,
        finish: ms(r.finish_ns),
    })
}

/// The per-request timeline: one bar per request (the first
/// [`TIMELINE_REQUESTS`]) split into submit lag, client + network overhead,
/// server queue (received to admitted), prefill and decode.
pub fn timeline(title: &str, records: &[RequestRecord]) -> Result<String, ChartError> {
    let e = err("timeline");
    let rows: Vec<(usize, Phases)> = records
        .iter()
        .take(TIMELINE_REQUESTS)
        .filter_map(|r| phases(r).map(|p| (r.index, p)))
        .collect();
    let xmax = rows.iter().map(|(_, p)| p.finish).fold(1e-3, f64::max) * 1.02;
    let ymax = rows.iter().map(|(i, _)| *i + 1).max().unwrap_or(1) as f64;
    let legend: [(&str, RGBColor); 5] = [
        ("submit lag", RGBColor(200, 200, 200)),
        ("client + network", RGBColor(120, 120, 120)),
        ("queue wait", RGBColor(240, 160, 40)),
        ("prefill", RGBColor(220, 60, 60)),
        ("decode", RGBColor(60, 110, 220)),
    ];
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (SIZE.0, SIZE.1 + 120)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)
            .map_err(|x| e(x.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("ms since t0")
            .y_desc("request index")
            .disable_y_mesh()
            .draw()
            .map_err(|x| e(x.to_string()))?;
        for (k, (label, color)) in legend.iter().enumerate() {
            let bars = rows.iter().filter_map(|(i, p)| {
                let (a, b) = match k {
                    0 => (p.intended, p.submit),
                    1 => (p.submit, p.received),
                    2 => (p.received, p.admitted),
                    3 => (p.admitted, p.first_token),
                    _ => (p.first_token, p.finish),
                };
                let y = *i as f64;
                (b > a).then(|| Rectangle::new([(a, y + 0.1), (b, y + 0.9)], color.filled()))
            });
            let c = *color;
            chart
                .draw_series(bars)
                .map_err(|x| e(x.to_string()))?
                .label(*label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(x.to_string()))?;
        root.present().map_err(|x| e(x.to_string()))?;
    }
    Ok(svg)
}

/// A line chart of several named series against the sweep's rates.
fn against_rate(
    name: &'static str,
    title: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<String, ChartError> {
    lines(name, title, ("requested rate (req/s)", y_desc), series)
}

/// A line chart of several named series against time (s since the run
/// started): the server's metrics and the GPUs.
pub fn over_time(
    name: &'static str,
    title: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<String, ChartError> {
    lines(name, title, ("s since the run started", y_desc), series)
}

/// A line chart of named series, with points.
fn lines(
    name: &'static str,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<String, ChartError> {
    let e = err(name);
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let xmax = pts.clone().map(|p| p.0).fold(1e-3, f64::max) * 1.05;
    let ymax = pts.map(|p| p.1).fold(1e-3, f64::max) * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)
            .map_err(|x| e(x.to_string()))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(|x| e(x.to_string()))?;
        for (i, (label, points)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|x| e(x.to_string()))?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|x| e(x.to_string()))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(x.to_string()))?;
        root.present().map_err(|x| e(x.to_string()))?;
    }
    Ok(svg)
}

/// Throughput (and goodput, with --slo) in req/s against the requested rate.
pub fn sweep_throughput(sweep: &SweepResult) -> Result<String, ChartError> {
    let rows = sweep.rated();
    let point = |f: &dyn Fn(&RunStats) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|r| Some((r.rate_rps?, f(&r.stats)?)))
            .collect()
    };
    let mut series = vec![
        ("requested".to_string(), point(&|s| s.requested_rate_rps)),
        (
            "throughput (ok req/s)".to_string(),
            point(&|s| (s.wall_s > 0.0).then(|| s.ok as f64 / s.wall_s)),
        ),
    ];
    if sweep.slo.is_some() {
        series.push((
            "goodput (good req/s)".to_string(),
            point(&|s| s.goodput.map(|g| g.rps)),
        ));
    }
    against_rate(
        "sweep_throughput",
        "Throughput and goodput vs rate",
        "req/s",
        &series,
    )
}

/// Latency percentiles against the requested rate.
pub fn sweep_latency(sweep: &SweepResult) -> Result<String, ChartError> {
    let rows = sweep.rated();
    let point = |f: &dyn Fn(&Metrics) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|r| Some((r.rate_rps?, f(&r.stats.metrics)?)))
            .collect()
    };
    let series = [
        ("TTFT p50".to_string(), point(&|m| m.ttft_ms.p50)),
        ("TTFT p99".to_string(), point(&|m| m.ttft_ms.p99)),
        ("TPOT p99".to_string(), point(&|m| m.tpot_ms.p99)),
        ("e2e latency p99".to_string(), point(&|m| m.latency_ms.p99)),
    ];
    against_rate("sweep_latency", "Latency vs rate", "ms", &series)
}

/// `loadgen compare`'s sweeps: one line per series of `metric` against the
/// requested rate.
pub fn compare_sweeps(
    name: &'static str,
    title: &str,
    y_desc: &str,
    sweeps: &[(&str, &SweepResult)],
    metric: &dyn Fn(&RunStats) -> Option<f64>,
) -> Result<String, ChartError> {
    let series: Vec<(String, Vec<(f64, f64)>)> = sweeps
        .iter()
        .map(|(label, sweep)| {
            let points = sweep
                .rated()
                .iter()
                .filter_map(|r| Some((r.rate_rps?, metric(&r.stats)?)))
                .collect();
            (label.to_string(), points)
        })
        .collect();
    against_rate(name, title, y_desc, &series)
}

/// The CDF series of one metric over the runs; `prefix` names the series
/// (`loadgen compare`) in each label.
pub fn series_of(
    runs: &[Measured],
    prefix: Option<&str>,
    f: impl Fn(&RequestRecord) -> Vec<u64>,
) -> Vec<Series> {
    runs.iter()
        .map(|m| {
            let v = m
                .records
                .iter()
                .filter(|r| r.ok)
                .flat_map(&f)
                .map(|ns| ns as f64 / 1e6)
                .collect();
            let label = match prefix {
                Some(p) => format!("{p} {}", m.label),
                None => m.label.clone(),
            };
            (label, v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_points_are_sorted_fractions_ending_at_one() {
        let p = cdf_points(&[3.0, 1.0, 2.0, f64::NAN]);
        assert_eq!(p, vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]);
        let many: Vec<f64> = (0..10_001).map(f64::from).collect();
        let p = cdf_points(&many);
        assert!(p.len() <= CDF_POINTS + 1);
        assert_eq!(p.last(), Some(&(10_000.0, 1.0)));
        assert!(p.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert!(cdf_points(&[]).is_empty());
    }

    #[test]
    fn phases_lay_the_server_durations_back_from_the_first_token() {
        let mut r = crate::record::tests::record(vec![10_000_000, 20_000_000], Some(6_000_000));
        if let Some(s) = r.server.as_mut() {
            s.prefill_to_first_token_ns = 2_000_000;
            s.queue_wait_ns = 3_000_000;
        }
        let p = phases(&r).expect("phases");
        assert_eq!(p.first_token, 10.0);
        assert_eq!(p.received, 4.0, "first token - server TTFT");
        assert_eq!(p.admitted, 8.0, "first token - prefill");
        assert_eq!(p.submit, 0.0015);
        assert!(p.intended <= p.submit && p.submit <= p.received && p.received <= p.admitted);
        let mut whole = r.clone();
        whole.streamed = false;
        if let Some(s) = whole.server.as_mut() {
            s.total_ns = 30_000_000;
        }
        let p = phases(&whole).expect("phases");
        assert_eq!(p.finish, 0.05);
        assert_eq!(p.received, 0.0015, "finish - total, not before the submit");
        assert_eq!(
            (p.first_token, p.admitted),
            (0.05, 0.0015),
            "clamped inside the request"
        );
        r.server = None;
        assert!(phases(&r).is_none());
    }
}
