//! The human-readable report on stdout. Its shape matches the seed benchmarks'
//! (`=== streaming benchmark ===` and the same lines, in the same order), so
//! results compare line by line; each measured run prints one block, a warmup
//! run one line, and the runs end with a summary across them.

use std::io::{self, Write};

use crate::stats::{DistSummary, RunStats, Spread, Summary};

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
    line(
        w,
        "Throughput (completion,total)",
        format!(
            "{:.2}, {:.2} tokens/s over {:.3} s",
            s.throughput_completion_tps, s.throughput_total_tps, s.wall_s
        ),
    )?;
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
    )?;
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
