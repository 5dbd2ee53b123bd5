//! The human-readable report on stdout. Its shape matches the seed benchmarks'
//! (`=== streaming benchmark ===` and the same lines, in the same order), so
//! results compare line by line; each measured run prints one block, a warmup
//! run one line, and the runs end with a summary across them.

use std::io::{self, Write};

use crate::slo::Slo;
use crate::stats::{DistSummary, Metrics, RunStats, Spread, Summary};
use crate::sweep::SweepResult;

/// What every block's header says about the setup.
#[derive(Debug, Clone)]
pub struct Header {
    /// `ServerInfo.model` (distinct values of all targets, comma-separated).
    pub model: String,
    /// `ServerInfo.device`.
    pub device: String,
    /// Number of targets.
    pub targets: usize,
    /// Connections per target.
    pub channels: usize,
    /// The schedule in words, e.g. "0 ms / absolute (burst)".
    pub schedule: String,
    /// Whether the latency from the intended start is meaningful (absolute).
    pub absolute: bool,
    /// `--max-concurrency`.
    pub max_concurrency: Option<usize>,
    /// `--slo`.
    pub slo: Option<Slo>,
}

/// Width of the label column.
const LABEL: usize = 38;

fn line(w: &mut impl Write, label: &str, value: impl std::fmt::Display) -> io::Result<()> {
    writeln!(w, "{:<LABEL$}{value}", format!("{label}:"))
}

/// "p50 / p95 / p99 ms" with 3 decimals, or "n/a" for an empty distribution.
fn pcts(d: &DistSummary) -> String {
    match (d.p50, d.p95, d.p99) {
        (Some(a), Some(b), Some(c)) => format!("{a:.3} / {b:.3} / {c:.3} ms"),
        _ => "n/a".to_string(),
    }
}

fn pcts_note(d: &DistSummary, note: &str) -> String {
    format!("{:<34}({note})", pcts(d))
}

/// One line for a warmup run.
pub fn warmup(w: &mut impl Write, s: &RunStats, of: usize) -> io::Result<()> {
    writeln!(
        w,
        "=== warmup run {}/{of}: {} requests ({} ok, {} failed{}) in {:.3} s ===",
        s.run + 1,
        s.requests,
        s.ok,
        s.failed,
        errors_inline(s),
        s.wall_s
    )
}

fn errors_inline(s: &RunStats) -> String {
    if s.errors.is_empty() {
        return String::new();
    }
    let list: Vec<String> = s.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(": {}", list.join(", "))
}

/// The block of one measured run.
pub fn run(w: &mut impl Write, h: &Header, s: &RunStats, of: usize) -> io::Result<()> {
    let m = &s.metrics;
    writeln!(w, "=== streaming benchmark ===")?;
    line(w, "Run", format!("{}/{of}", s.run + 1))?;
    line(w, "Model", &h.model)?;
    line(w, "Device", &h.device)?;
    line(
        w,
        "Requests",
        format!(
            "{} ({} ok, {} failed; latency statistics below cover the {} ok requests)",
            s.requests, s.ok, s.failed, s.ok
        ),
    )?;
    line(w, "Prompt tokens (total)", s.prompt_tokens)?;
    line(w, "Completion tokens (total)", s.completion_tokens)?;
    let achieved = s
        .achieved_rate_rps
        .map_or("n/a".to_string(), |r| format!("{r:.2} req/s"));
    let requested = s
        .requested_rate_rps
        .map_or("n/a".to_string(), |r| format!("{r:.2} req/s"));
    line(
        w,
        "Submit wall",
        format!(
            "{:.3} s (achieved rate {achieved}, requested {requested})",
            s.submit_wall_s
        ),
    )?;
    let limit = h
        .max_concurrency
        .map_or(String::new(), |n| format!(", max concurrency {n}"));
    line(
        w,
        "Submit interval/schedule",
        format!("{}{limit}", h.schedule),
    )?;
    latencies(w, h, m)?;
    line(
        w,
        "Throughput (completion,total)",
        format!(
            "{:.2}, {:.2} tokens/s over {:.3} s",
            s.throughput_completion_tps, s.throughput_total_tps, s.wall_s
        ),
    )?;
    goodput(w, h, s)?;
    connections_and_server(w, h, s)?;
    writeln!(w)
}

/// The lines of a run block after goodput: connections, what the server
/// reported about admission and prefill, finish reasons and errors.
fn connections_and_server(w: &mut impl Write, h: &Header, s: &RunStats) -> io::Result<()> {
    line(
        w,
        "Connections",
        format!(
            "{} target(s) x {} channel(s); max in-flight streams per connection {}",
            h.targets, h.channels, s.max_streams_per_connection
        ),
    )?;
    line(
        w,
        "Admission",
        format!(
            "{} scheduler iteration(s), max prefill batch {}",
            s.admission_iterations, s.max_prefill_batch_size
        ),
    )?;
    let cached_share = if s.prompt_tokens > 0 {
        100.0 * s.cached_prompt_tokens as f64 / s.prompt_tokens as f64
    } else {
        0.0
    };
    line(
        w,
        "Prefill",
        format!(
            "{} of {} prompt tokens from the prefix cache ({cached_share:.1}%), at most {} chunk(s) per prompt",
            s.cached_prompt_tokens, s.prompt_tokens, s.max_prefill_chunks
        ),
    )?;
    let reasons: Vec<String> = s
        .finish_reasons
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    line(
        w,
        "Finish reasons",
        if reasons.is_empty() {
            "none".to_string()
        } else {
            reasons.join(", ")
        },
    )?;
    let errors: Vec<String> = s.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
    line(
        w,
        "Errors",
        if errors.is_empty() {
            "none".to_string()
        } else {
            format!("{} failed: {}", s.failed, errors.join(", "))
        },
    )
}

/// The distribution lines of a run block, submit lag to latency.
fn latencies(w: &mut impl Write, h: &Header, m: &Metrics) -> io::Result<()> {
    line(
        w,
        "Submit lag p50/p95/p99",
        pcts_note(&m.submit_lag_ms, "all requests"),
    )?;
    line(
        w,
        "add_request latency p50/p95/p99",
        pcts_note(&m.add_request_ms, "submit start -> call returned"),
    )?;
    line(
        w,
        "Tokenize p50/p95/p99",
        pcts_note(&m.tokenize_ms, "server"),
    )?;
    line(
        w,
        "Queue wait p50/p95/p99",
        pcts_note(&m.queue_wait_ms, "server"),
    )?;
    line(
        w,
        "Prefill->first token p50/p95/p99",
        pcts_note(&m.prefill_to_first_token_ms, "server"),
    )?;
    line(w, "Server TTFT p50/p95/p99", pcts(&m.server_ttft_ms))?;
    line(w, "TTFT p50/p95/p99", pcts_note(&m.ttft_ms, "client"))?;
    let clamped = if m.overhead_ms.clamped_negative > 0 {
        format!(
            "; {} negative values counted as 0",
            m.overhead_ms.clamped_negative
        )
    } else {
        String::new()
    };
    line(
        w,
        "Network+client overhead p50/p95/p99",
        pcts_note(
            &m.overhead_ms,
            &format!("client TTFT - server TTFT{clamped}"),
        ),
    )?;
    line(w, "TPOT p50/p95/p99", pcts_note(&m.tpot_ms, "client"))?;
    line(w, "ITL (client) p50/p95/p99", pcts(&m.itl_ms))?;
    line(w, "ITL (server) p50/p95/p99", pcts(&m.server_itl_ms))?;
    line(
        w,
        "Latency p50/p95/p99",
        pcts_note(&m.latency_ms, "submit start -> end"),
    )?;
    if h.absolute {
        line(
            w,
            "Latency from intended p50/p95/p99",
            pcts_note(&m.latency_from_intended_ms, "intended start -> end"),
        )?;
    }
    Ok(())
}

/// The goodput line (with --slo) and the early-stop line (if any).
fn goodput(w: &mut impl Write, h: &Header, s: &RunStats) -> io::Result<()> {
    if let (Some(g), Some(slo)) = (&s.goodput, &h.slo) {
        line(
            w,
            "Goodput",
            format!(
                "{:.2} req/s ({} of {} requests good, {:.1}%; SLO {slo})",
                g.rps,
                g.good,
                s.requests,
                g.share * 100.0
            ),
        )?;
    }
    if let Some(reason) = &s.stopped_early {
        line(
            w,
            "Stopped early",
            format!("{reason}; {} request(s) not sent", s.unsent),
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
        let two = |d: &DistSummary| match (d.p50, d.p99) {
            (Some(a), Some(b)) => format!("{a:.1}/{b:.1}"),
            _ => "n/a".to_string(),
        };
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
            if s.wall_s > 0.0 {
                s.ok as f64 / s.wall_s
            } else {
                0.0
            },
            format!("{}/{}", s.ok, s.failed),
            s.throughput_completion_tps,
            good,
            two(&m.ttft_ms),
            two(&m.tpot_ms),
            m.latency_ms
                .p99
                .map_or("n/a".to_string(), |v| format!("{v:.1}")),
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
