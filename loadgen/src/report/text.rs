//! The human-readable run block on stdout. Its shape matches the seed
//! benchmarks' (`=== streaming benchmark ===` and the same lines, in the same
//! order), so results compare line by line; each measured run prints one
//! block, a warmup run one line. The tables (sweep rows, the summary across
//! runs, per-target figures, compare series) are in `report::tables`.
//!
//! Lines that need the server's own account (tokenize, queue wait, prefill,
//! server TTFT and ITL, the client-vs-server overhead, admission, prefix
//! cache) say "not reported by this server" when no OK request carried one
//! (an OpenAI server without Ember's extension).

use std::io::{self, Write};

use crate::measure::dist::DistSummary;
use crate::measure::metrics::Metrics;
use crate::measure::stats::RunStats;
use crate::report::fmt::{line, pcts, pcts_note, NOT_REPORTED};
use crate::report::model::Header;
use crate::report::tables;

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

/// Where the completion token counts came from, in words.
fn token_sources(s: &RunStats) -> String {
    let c = s.token_counts;
    let mut parts = Vec::new();
    if c.server > 0 {
        parts.push(format!("the server's count for {}", c.server));
    }
    if c.usage > 0 {
        parts.push(format!("usage for {}", c.usage));
    }
    if c.chunks > 0 {
        parts.push(format!("counted chunks for {} (no usage sent)", c.chunks));
    }
    if parts.is_empty() {
        return String::new();
    }
    format!(" ({} request(s))", parts.join(", "))
}

/// The block of one measured run.
pub fn run(w: &mut impl Write, h: &Header, s: &RunStats, of: usize) -> io::Result<()> {
    writeln!(w, "=== streaming benchmark ===")?;
    line(w, "Run", format!("{}/{of}", s.run + 1))?;
    line(w, "Model", &h.model)?;
    line(w, "Device", &h.device)?;
    line(w, "Backend", &h.backend)?;
    line(w, "Request shape", &h.request_shape)?;
    line(w, "Prompt nonce", &h.nonce)?;
    line(
        w,
        "Requests",
        format!(
            "{} ({} ok, {} failed; latency statistics below cover the {} ok requests)",
            s.requests, s.ok, s.failed, s.ok
        ),
    )?;
    line(w, "Prompt tokens (total)", s.prompt_tokens)?;
    line(
        w,
        "Completion tokens (total)",
        format!("{}{}", s.completion_tokens, token_sources(s)),
    )?;
    let rate = |r: Option<f64>| r.map_or("n/a".to_string(), |r| format!("{r:.2} req/s"));
    line(
        w,
        "Submit wall",
        format!(
            "{:.3} s (achieved rate {}, requested {})",
            s.submit_wall_s,
            rate(s.achieved_rate_rps),
            rate(s.requested_rate_rps)
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
    latencies(w, h, s)?;
    line(
        w,
        "Throughput (completion,total)",
        format!(
            "{:.2}, {:.2} tokens/s over {:.3} s",
            s.throughput_completion_tps, s.throughput_total_tps, s.wall_s
        ),
    )?;
    client_cpu(w, s)?;
    goodput(w, h, s)?;
    connections_and_server(w, h, s)?;
    server_view(w, s)?;
    writeln!(w)
}

/// loadgen's own CPU use over the run, next to the host's cores.
fn client_cpu(w: &mut impl Write, s: &RunStats) -> io::Result<()> {
    let (Some(cpu), Some(cores)) = (s.client_cpu_s, s.client_cpu_cores) else {
        return Ok(());
    };
    let host = std::thread::available_parallelism().map_or(0, |n| n.get());
    line(
        w,
        "Client CPU",
        format!("{cpu:.3} s (user + system): {cores:.2} of {host} cores over the run"),
    )
}

/// `--scrape-metrics` and `--gpu-telemetry`: what the server's metrics and
/// the GPUs showed through the run.
fn server_view(w: &mut impl Write, s: &RunStats) -> io::Result<()> {
    let Some(m) = &s.server_metrics else {
        return Ok(());
    };
    let v = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("n/a".to_string(), f);
    if let Some(url) = &m.url {
        line(
            w,
            "Server metrics",
            format!(
                "running max {}, waiting max {}, KV cache usage max {}, preemptions {}, prefix cache hit rate {} ({} samples from {url}, {} failed)",
                v(m.max_running, &|x| format!("{x:.0}")),
                v(m.max_waiting, &|x| format!("{x:.0}")),
                v(m.max_kv_cache_usage, &|x| format!("{:.1}%", x * 100.0)),
                v(m.preemptions, &|x| format!("{x:.0}")),
                v(m.prefix_cache_hit_rate, &|x| format!("{:.1}%", x * 100.0)),
                m.samples.len(),
                m.failed_scrapes
            ),
        )?;
    }
    match (&m.gpu_note, m.gpu_util_mean_pct) {
        (Some(note), _) => line(w, "GPU telemetry", note),
        (None, Some(u)) => line(
            w,
            "GPU telemetry",
            format!("utilization mean {u:.1}% over {} samples", m.samples.len()),
        ),
        (None, None) => Ok(()),
    }
}

/// The lines of a run block after goodput: connections (and per-target
/// figures), what the server reported about admission and prefill, finish
/// reasons and errors.
fn connections_and_server(w: &mut impl Write, h: &Header, s: &RunStats) -> io::Result<()> {
    let conns = if h.http1 {
        format!(
            "{} target(s), HTTP/1.1: {} connection(s) open, max in-flight streams per target {}",
            h.targets, s.connections, s.max_streams_per_connection
        )
    } else {
        format!(
            "{} target(s) x {} channel(s); max in-flight streams per connection {}",
            h.targets, h.channels, s.max_streams_per_connection
        )
    };
    line(w, "Connections", conns)?;
    if s.per_target.len() > 1 {
        line(w, "Per target", format!("balance {}", h.balance))?;
        tables::per_target(w, &s.per_target)?;
    }
    let reported = s.server_reported > 0 || s.ok == 0;
    let admission = format!(
        "{} scheduler iteration(s), max prefill batch {}",
        s.admission_iterations, s.max_prefill_batch_size
    );
    line(
        w,
        "Admission",
        if reported {
            admission
        } else {
            NOT_REPORTED.into()
        },
    )?;
    let cached_share = if s.prompt_tokens > 0 {
        100.0 * s.cached_prompt_tokens as f64 / s.prompt_tokens as f64
    } else {
        0.0
    };
    let prefill = format!(
        "{} of {} prompt tokens from the prefix cache ({cached_share:.1}%), at most {} chunk(s) per prompt",
        s.cached_prompt_tokens, s.prompt_tokens, s.max_prefill_chunks
    );
    line(
        w,
        "Prefill",
        if reported {
            prefill
        } else {
            NOT_REPORTED.into()
        },
    )?;
    let list = |m: &std::collections::BTreeMap<String, usize>| -> Vec<String> {
        m.iter().map(|(k, v)| format!("{k} {v}")).collect()
    };
    let reasons = list(&s.finish_reasons);
    line(
        w,
        "Finish reasons",
        if reasons.is_empty() {
            "none".to_string()
        } else {
            reasons.join(", ")
        },
    )?;
    let errors = list(&s.errors);
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
fn latencies(w: &mut impl Write, h: &Header, s: &RunStats) -> io::Result<()> {
    let m: &Metrics = &s.metrics;
    // Nothing to say about the server when no OK request carried its account.
    let reported = s.server_reported > 0 || s.ok == 0;
    let server = |d: &DistSummary, note: &str| {
        if reported {
            pcts_note(d, note)
        } else {
            NOT_REPORTED.to_string()
        }
    };
    line(
        w,
        "Submit lag p50/p95/p99",
        pcts_note(&m.submit_lag_ms, "all requests"),
    )?;
    line(
        w,
        "  firing loop late p50/p95/p99",
        pcts_note(&m.fire_lag_ms, "due -> handed to the runtime"),
    )?;
    line(
        w,
        "  worker pickup p50/p95/p99",
        pcts_note(&m.pickup_ms, "handed over -> submit start"),
    )?;
    line(
        w,
        "add_request latency p50/p95/p99",
        pcts_note(&m.add_request_ms, "submit start -> call returned"),
    )?;
    line(w, "Tokenize p50/p95/p99", server(&m.tokenize_ms, "server"))?;
    line(
        w,
        "Queue wait p50/p95/p99",
        server(&m.queue_wait_ms, "server"),
    )?;
    line(
        w,
        "Prefill->first token p50/p95/p99",
        server(&m.prefill_to_first_token_ms, "server"),
    )?;
    line(
        w,
        "Server TTFT p50/p95/p99",
        server(&m.server_ttft_ms, "server"),
    )?;
    line(w, "TTFT p50/p95/p99", pcts_note(&m.ttft_ms, "client"))?;
    let clamped = if m.overhead_ms.clamped_negative > 0 {
        format!(
            "; {} negative values counted as 0",
            m.overhead_ms.clamped_negative
        )
    } else {
        String::new()
    };
    let partial = if reported && s.server_reported < s.ok {
        format!("; {} of {} ok requests reported", s.server_reported, s.ok)
    } else {
        String::new()
    };
    line(
        w,
        "Network+client overhead p50/p95/p99",
        server(
            &m.overhead_ms,
            &format!("client TTFT - server TTFT{clamped}{partial}"),
        ),
    )?;
    line(w, "TPOT p50/p95/p99", pcts_note(&m.tpot_ms, "client"))?;
    line(w, "ITL (client) p50/p95/p99", pcts(&m.itl_ms))?;
    line(
        w,
        "ITL (server) p50/p95/p99",
        server(&m.server_itl_ms, "server"),
    )?;
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
    if let (Some(d), Some(tps)) = (s.duration_s, s.throughput_in_duration_tps) {
        line(
            w,
            "Timed run",
            format!(
                "{d:.1} s: {tps:.2} completion tokens/s received within it; {} request(s) cut after the grace (neither ok nor failed, not in the statistics)",
                s.cut
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::stats::tests::stats_of;
    use crate::record::tests::record;
    use crate::record::TokenSource;

    fn header() -> Header {
        Header {
            model: "m".into(),
            device: "d".into(),
            backend: "openai /v1/completions (HTTP/1.1)".into(),
            request_shape: "streaming, max_new_tokens 32".into(),
            nonce: "abc123".into(),
            targets: 2,
            channels: 1,
            http1: true,
            balance: "least".into(),
            schedule: "0 ms / absolute (burst)".into(),
            absolute: true,
            max_concurrency: None,
            slo: None,
        }
    }

    fn block(s: &RunStats) -> String {
        let mut out = Vec::new();
        run(&mut out, &header(), s, 1).expect("writes");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn a_server_without_the_extension_is_said_so() {
        let mut a = record(vec![1_000_000, 2_000_000], None);
        a.tokens_from = TokenSource::Chunks;
        let text = block(&stats_of(vec![a]));
        for label in [
            "Tokenize",
            "Queue wait",
            "Server TTFT",
            "Network+client overhead",
            "ITL (server)",
            "Admission",
            "Prefill:",
        ] {
            let l = text
                .lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("{label}: {text}"));
            assert!(l.ends_with(NOT_REPORTED), "{l}");
        }
        assert!(
            text.contains("counted chunks for 1 (no usage sent)"),
            "{text}"
        );
        assert!(text.contains("HTTP/1.1: 0 connection(s) open"), "{text}");
    }

    #[test]
    fn several_targets_get_a_table() {
        let mut a = record(vec![1_000_000, 2_000_000], Some(500_000));
        a.tokens_from = TokenSource::Usage;
        let mut b = a.clone();
        b.target = "u".into();
        a.target = "t".into();
        let text = block(&stats_of(vec![a, b]));
        assert!(
            text.lines()
                .any(|l| l.starts_with("Per target:") && l.ends_with("balance least")),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l.trim_start().starts_with("t ")),
            "{text}"
        );
        assert!(text.contains("usage for 2"), "{text}");
        assert!(!text.contains(NOT_REPORTED), "{text}");
    }
}
