//! The statistics of one run ([`RunStats`], an entry of the JSON `runs`) and
//! the spread of the key numbers across measured runs ([`Summary`]).
//!
//! Failures are counted by status next to the latency statistics (which
//! cover the OK requests, `measure::metrics`); per-target figures are in
//! `measure::targets`; where the token counts came from and how many
//! requests had a server timeline are counted, so the report can say so.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::client::pool::ConnPeak;
use crate::measure::dist::{DistSummary, Spread};
use crate::measure::metrics::{Accumulators, Metrics};
use crate::measure::runner::{RunResult, CUT};
use crate::measure::scrape::ServerSeries;
use crate::measure::slo::{Goodput, Slo};
use crate::measure::targets::TargetStats;
use crate::record::{RequestRecord, TokenSource};

/// How many OK requests got their completion token count from where.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct TokenCounts {
    /// gRPC `Finished.completion_tokens`.
    pub server: usize,
    /// OpenAI `usage`.
    pub usage: usize,
    /// Counted token chunks (the server sent no usage).
    pub chunks: usize,
}

/// The statistics of one run (an entry of the JSON `runs`).
#[derive(Debug, Clone, Serialize)]
pub struct RunStats {
    /// Run number.
    pub run: usize,
    /// Warmup or measured.
    pub warmup: bool,
    /// Requests submitted.
    pub requests: usize,
    /// Requests that finished OK (the latency statistics cover these).
    pub ok: usize,
    /// Requests that failed (cut requests not included).
    pub failed: usize,
    /// A timed run: requests still running after the grace period, cut
    /// (neither OK nor failed; not in the statistics).
    pub cut: usize,
    /// A timed run's duration, seconds.
    pub duration_s: Option<f64>,
    /// A timed run: completion tokens received within the duration / the
    /// duration (the steady state, without the drain at the end).
    pub throughput_in_duration_tps: Option<f64>,
    /// Failures by status name.
    pub errors: BTreeMap<String, usize>,
    /// OK requests by finish reason.
    pub finish_reasons: BTreeMap<String, usize>,
    /// Prompt tokens of the OK requests.
    pub prompt_tokens: u64,
    /// Completion tokens of the OK requests.
    pub completion_tokens: u64,
    /// Where the OK requests' completion token counts came from.
    pub token_counts: TokenCounts,
    /// OK requests whose server sent its timeline (the server-side
    /// breakdown and the overhead cover these).
    pub server_reported: usize,
    /// t0 -> last request ended.
    pub wall_s: f64,
    /// The run's t0 on the wall clock, Unix seconds (several loadgen
    /// processes' runs line up on it).
    pub t0_unix_s: f64,
    /// loadgen's own CPU time (user + system, every thread) from the run's
    /// start to its end, seconds; null where the platform does not tell.
    pub client_cpu_s: Option<f64>,
    /// `client_cpu_s` / the run's wall time: how many cores loadgen kept
    /// busy.
    pub client_cpu_cores: Option<f64>,
    /// First submit start -> last call returned.
    pub submit_wall_s: f64,
    /// (requests - 1) / (last submit start - first submit start).
    pub achieved_rate_rps: Option<f64>,
    /// The rate the schedule asked for, where defined.
    pub requested_rate_rps: Option<f64>,
    /// Completion tokens / wall.
    pub throughput_completion_tps: f64,
    /// (Prompt + completion tokens) / wall.
    pub throughput_total_tps: f64,
    /// The highest peak of concurrent streams on one connection.
    pub max_streams_per_connection: usize,
    /// Each connection's peak.
    pub streams_per_connection: Vec<ConnPeak>,
    /// Connections open at the end of the run (an HTTP/1.1 pool counts each
    /// of its connections).
    pub connections: usize,
    /// Per target, in the order given.
    pub per_target: Vec<TargetStats>,
    /// Distinct scheduler iterations that admitted the OK requests.
    pub admission_iterations: usize,
    /// Largest prefill batch an OK request was admitted with.
    pub max_prefill_batch_size: u32,
    /// Prompt tokens of OK requests the server found in its prefix cache.
    pub cached_prompt_tokens: u64,
    /// Most prefill steps (chunks) an OK request's prompt took.
    pub max_prefill_chunks: u32,
    /// Goodput under --slo (null without it).
    pub goodput: Option<Goodput>,
    /// Why the run stopped before firing every request (null if it did not).
    pub stopped_early: Option<String>,
    /// Requests not fired because the run stopped early.
    pub unsent: usize,
    /// The distributions.
    pub metrics: Metrics,
    /// `--scrape-metrics` / `--gpu-telemetry`: the server's and the GPUs'
    /// time series through the run (absent without either flag).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_metrics: Option<ServerSeries>,
}

/// One finished run: its statistics and its requests (what the reports
/// draw).
#[derive(Debug, Clone)]
pub struct Measured {
    /// Its name in the reports (`r0`, `2.00 req/s`, a compare series).
    pub label: String,
    /// Its statistics.
    pub stats: RunStats,
    /// Its requests.
    pub records: Vec<RequestRecord>,
}

/// What the OK requests' counts and server timelines add up to.
#[derive(Debug, Default)]
struct Totals {
    cut: usize,
    errors: BTreeMap<String, usize>,
    finish_reasons: BTreeMap<String, usize>,
    prompt_tokens: u64,
    completion_tokens: u64,
    token_counts: TokenCounts,
    server_reported: usize,
    iterations: std::collections::BTreeSet<u64>,
    max_prefill_batch_size: u32,
    cached_prompt_tokens: u64,
    max_prefill_chunks: u32,
}

impl Totals {
    fn add(&mut self, r: &RequestRecord) {
        if r.status == CUT {
            self.cut += 1;
            return;
        }
        if !r.ok {
            *self.errors.entry(r.status.clone()).or_insert(0) += 1;
            return;
        }
        let reason = r.finish_reason.as_deref().unwrap_or("UNSPECIFIED");
        *self.finish_reasons.entry(reason.to_string()).or_insert(0) += 1;
        self.prompt_tokens += u64::from(r.prompt_tokens.unwrap_or(0));
        self.completion_tokens += u64::from(r.completion_tokens);
        match r.tokens_from {
            TokenSource::Server => self.token_counts.server += 1,
            TokenSource::Usage => self.token_counts.usage += 1,
            TokenSource::Chunks => self.token_counts.chunks += 1,
        }
        if let Some(s) = &r.server {
            self.server_reported += 1;
            self.iterations.insert(s.admitted_iteration);
            self.max_prefill_batch_size = self.max_prefill_batch_size.max(s.prefill_batch_size);
            self.cached_prompt_tokens += u64::from(s.cached_prompt_tokens);
            self.max_prefill_chunks = self.max_prefill_chunks.max(s.prefill_chunks);
        }
    }
}

/// Seconds from the run's t0 to its last finish, and the achieved
/// submission rate.
fn timing(records: &[RequestRecord]) -> (f64, f64, Option<f64>) {
    let first_start = records.iter().map(|r| r.submit_start_ns).min().unwrap_or(0);
    let last_start = records.iter().map(|r| r.submit_start_ns).max().unwrap_or(0);
    let last_submit_end = records.iter().map(|r| r.submit_end_ns).max().unwrap_or(0);
    let wall_s = records.iter().map(|r| r.finish_ns).max().unwrap_or(0) as f64 / 1e9;
    let submit_wall_s = last_submit_end.saturating_sub(first_start) as f64 / 1e9;
    let achieved = (records.len() > 1 && last_start > first_start)
        .then(|| (records.len() - 1) as f64 / ((last_start - first_start) as f64 / 1e9));
    (wall_s, submit_wall_s, achieved)
}

/// Completion tokens received within the first `d` of the run, per second
/// of it: each streamed token by its arrival, a non-streamed request's
/// tokens by its end.
fn in_duration_tps(records: &[RequestRecord], d: std::time::Duration) -> f64 {
    let end = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let tokens: u64 = records
        .iter()
        .map(|r| {
            if r.streamed {
                r.token_recv_ns.iter().filter(|&&t| t <= end).count() as u64
            } else if r.ok && r.finish_ns <= end {
                u64::from(r.completion_tokens)
            } else {
                0
            }
        })
        .sum();
    tokens as f64 / d.as_secs_f64().max(1e-9)
}

impl RunStats {
    /// Computes a run's statistics. `requested_rate_rps` comes from the flags
    /// (or the sweep), `slo` from --slo.
    pub fn from_run(
        result: &RunResult,
        requested_rate_rps: Option<f64>,
        slo: Option<&Slo>,
    ) -> RunStats {
        let records = &result.records;
        let (mut m, mut t) = (Accumulators::default(), Totals::default());
        for r in records {
            m.add(r);
            t.add(r);
        }
        let ok = records.iter().filter(|r| r.ok).count();
        let (wall_s, submit_wall_s, achieved_rate_rps) = timing(records);
        let per_s = |n: u64| if wall_s > 0.0 { n as f64 / wall_s } else { 0.0 };
        let peaks = &result.conn_peaks;
        RunStats {
            run: result.run,
            warmup: result.warmup,
            requests: records.len(),
            ok,
            failed: records.len() - ok - t.cut,
            cut: t.cut,
            duration_s: result.duration.map(|d| d.as_secs_f64()),
            throughput_in_duration_tps: result.duration.map(|d| in_duration_tps(records, d)),
            prompt_tokens: t.prompt_tokens,
            completion_tokens: t.completion_tokens,
            wall_s,
            t0_unix_s: result.t0_unix_s,
            client_cpu_s: result.client_cpu.map(|d| d.as_secs_f64()),
            client_cpu_cores: result
                .client_cpu
                .filter(|_| wall_s > 0.0)
                .map(|d| d.as_secs_f64() / wall_s),
            submit_wall_s,
            achieved_rate_rps,
            requested_rate_rps,
            throughput_completion_tps: per_s(t.completion_tokens),
            throughput_total_tps: per_s(t.prompt_tokens + t.completion_tokens),
            max_streams_per_connection: peaks.iter().map(|c| c.max_streams).max().unwrap_or(0),
            streams_per_connection: peaks.clone(),
            connections: peaks.iter().map(|c| c.connections).sum(),
            per_target: TargetStats::of(&result.targets, records, wall_s),
            admission_iterations: t.iterations.len(),
            max_prefill_batch_size: t.max_prefill_batch_size,
            cached_prompt_tokens: t.cached_prompt_tokens,
            max_prefill_chunks: t.max_prefill_chunks,
            goodput: slo.map(|slo| Goodput::of(slo, records, wall_s)),
            stopped_early: result.stopped_early.clone(),
            unsent: result.unsent,
            metrics: m.summaries(),
            server_metrics: None,
            errors: t.errors,
            finish_reasons: t.finish_reasons,
            token_counts: t.token_counts,
            server_reported: t.server_reported,
        }
    }
}

/// The key numbers across measured runs (the JSON `summary`).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Measured runs.
    pub runs: usize,
    /// Client TTFT p99.
    pub ttft_p99_ms: Option<Spread>,
    /// Client TPOT p99.
    pub tpot_p99_ms: Option<Spread>,
    /// Client ITL p99.
    pub itl_p99_ms: Option<Spread>,
    /// Network + client overhead p99.
    pub overhead_p99_ms: Option<Spread>,
    /// Client latency p99.
    pub latency_p99_ms: Option<Spread>,
    /// Completion tokens/s.
    pub throughput_completion_tps: Option<Spread>,
    /// Total tokens/s.
    pub throughput_total_tps: Option<Spread>,
    /// Failed requests over all measured runs.
    pub failed: usize,
}

impl Summary {
    /// The summary of the measured runs.
    pub fn of(runs: &[RunStats]) -> Summary {
        let p99 =
            |f: fn(&Metrics) -> &DistSummary| Spread::of(runs.iter().map(|r| f(&r.metrics).p99));
        Summary {
            runs: runs.len(),
            ttft_p99_ms: p99(|m| &m.ttft_ms),
            tpot_p99_ms: p99(|m| &m.tpot_ms),
            itl_p99_ms: p99(|m| &m.itl_ms),
            overhead_p99_ms: p99(|m| &m.overhead_ms),
            latency_p99_ms: p99(|m| &m.latency_ms),
            throughput_completion_tps: Spread::of(
                runs.iter().map(|r| Some(r.throughput_completion_tps)),
            ),
            throughput_total_tps: Spread::of(runs.iter().map(|r| Some(r.throughput_total_tps))),
            failed: runs.iter().map(|r| r.failed).sum(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::tests::record;

    /// The statistics of a run with these records (two targets, "t" and "u").
    pub(crate) fn stats_of(records: Vec<RequestRecord>) -> RunStats {
        let result = RunResult {
            run: 0,
            warmup: false,
            records,
            targets: vec!["t".into(), "u".into()],
            conn_peaks: Vec::new(),
            stopped_early: None,
            unsent: 0,
            duration: None,
            t0_unix_s: 0.0,
            client_cpu: None,
        };
        RunStats::from_run(&result, None, None)
    }

    /// The statistics of a run with no requests.
    pub(crate) fn empty_stats() -> RunStats {
        stats_of(Vec::new())
    }

    #[test]
    fn cut_requests_are_neither_ok_nor_failed() {
        let mut cut = record(vec![10_000], None).fail(CUT.into(), "cut".into(), 90_000);
        cut.status = CUT.into();
        let a = record(vec![10_000, 20_000, 60_000], None);
        let mut whole = record(Vec::new(), None);
        whole.streamed = false;
        whole.completion_tokens = 7;
        whole.finish_ns = 30_000;
        let result = RunResult {
            run: 0,
            warmup: false,
            records: vec![a, cut, whole],
            targets: vec!["t".into()],
            conn_peaks: Vec::new(),
            stopped_early: None,
            unsent: 0,
            duration: Some(std::time::Duration::from_nanos(40_000)),
            t0_unix_s: 0.0,
            client_cpu: None,
        };
        let s = RunStats::from_run(&result, None, None);
        assert_eq!((s.ok, s.failed, s.cut), (2, 0, 1));
        assert!(s.errors.is_empty());
        // Within 40 us: 2 streamed tokens of `a`, 1 of the cut one, 7 of
        // the whole body that ended at 30 us.
        let tps = s.throughput_in_duration_tps.expect("timed");
        assert!((tps - 10.0 / 40e-6).abs() < 1e-3, "{tps}");
    }

    #[test]
    fn counts_sources_and_server_reports() {
        let a = record(vec![10_000, 20_000], Some(5_000));
        let mut b = record(vec![10_000, 20_000, 30_000], None);
        b.tokens_from = TokenSource::Usage;
        let mut c = record(vec![10_000], None);
        c.tokens_from = TokenSource::Chunks;
        let failed = record(vec![], None).fail("HTTP_429".into(), "full".into(), 9);
        let s = stats_of(vec![a, b, c, failed]);
        assert_eq!((s.ok, s.failed), (3, 1));
        assert_eq!(s.errors.get("HTTP_429"), Some(&1));
        let tc = s.token_counts;
        assert_eq!((tc.server, tc.usage, tc.chunks), (1, 1, 1));
        assert_eq!(s.server_reported, 1);
        assert_eq!(
            s.metrics.server_ttft_ms.count, 1,
            "server metrics from reporting requests"
        );
        assert_eq!(
            s.metrics.ttft_ms.count, 3,
            "client metrics from every OK request"
        );
        assert_eq!(s.completion_tokens, 6);
    }
}
