//! Statistics: HdrHistogram distributions (recorded in microseconds, 3
//! significant figures), the statistics of one run, and the spread of the key
//! numbers across measured runs.
//!
//! Latency statistics cover the requests that finished OK (a failed request has
//! no complete timeline); failures are counted by status next to them. Submit
//! lag and add_request latency cover every request, since every request was
//! submitted.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::record::RequestRecord;
use crate::runner::{ConnPeak, RunResult};
use crate::slo::{Goodput, Slo};

/// One distribution.
#[derive(Debug, Clone)]
pub struct Dist {
    /// The values in microseconds, for percentiles.
    hist: Histogram<u64>,
    /// Exact sum in ns, for the mean.
    sum_ns: u128,
    /// Exact maximum in ns.
    max_ns: u64,
    /// Values recorded.
    count: u64,
    /// Negative values recorded as 0 (possible only for the overhead, if the
    /// two clocks ran at visibly different rates).
    clamped_negative: u64,
}

impl Default for Dist {
    fn default() -> Self {
        Dist {
            // 3 significant figures with auto-resize: a constant, valid setting.
            hist: Histogram::new(3).expect("3 significant figures is a valid histogram setting"),
            sum_ns: 0,
            max_ns: 0,
            count: 0,
            clamped_negative: 0,
        }
    }
}

/// A distribution's summary in milliseconds; `null`s when it is empty.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DistSummary {
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Exact mean.
    pub mean: Option<f64>,
    /// Exact maximum.
    pub max: Option<f64>,
    /// Number of values.
    pub count: u64,
    /// How many negative values were recorded as 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub clamped_negative: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Dist {
    /// Records a duration in ns (rounded to the nearest microsecond).
    pub fn record_ns(&mut self, ns: u64) {
        let us = ns.saturating_add(500) / 1000;
        // `record` grows the (auto-resizing) histogram; `saturating_record`
        // would clamp to its current range instead.
        if self.hist.record(us).is_err() {
            self.hist.saturating_record(us);
        }
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
        self.count += 1;
    }

    /// Records a signed duration; a negative one counts as 0 and is counted.
    pub fn record_signed_ns(&mut self, ns: i64) {
        if ns < 0 {
            self.clamped_negative += 1;
        }
        self.record_ns(u64::try_from(ns).unwrap_or(0));
    }

    /// Percentiles (the middle of their histogram bucket), mean and max in ms.
    pub fn summary(&self) -> DistSummary {
        if self.count == 0 {
            return DistSummary::default();
        }
        let q = |q: f64| {
            let us = self.hist.median_equivalent(self.hist.value_at_quantile(q));
            Some(us as f64 / 1e3)
        };
        DistSummary {
            p50: q(0.50),
            p95: q(0.95),
            p99: q(0.99),
            mean: Some(self.sum_ns as f64 / self.count as f64 / 1e6),
            max: Some(self.max_ns as f64 / 1e6),
            count: self.count,
            clamped_negative: self.clamped_negative,
        }
    }
}

/// Every distribution of a run, in report order (keys of the JSON `metrics`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Metrics {
    /// submit start - intended start (all requests).
    pub submit_lag_ms: DistSummary,
    /// submit start -> call returned the stream (all requests).
    pub add_request_ms: DistSummary,
    /// Server: received -> tokenized.
    pub tokenize_ms: DistSummary,
    /// Server: tokenized -> enqueued.
    pub enqueue_ms: DistSummary,
    /// Server: enqueued -> admitted.
    pub queue_wait_ms: DistSummary,
    /// Server: admitted -> first token.
    pub prefill_to_first_token_ms: DistSummary,
    /// Server: received -> first token.
    pub server_ttft_ms: DistSummary,
    /// Client: submit start -> first token received.
    pub ttft_ms: DistSummary,
    /// Client TTFT - server TTFT: network, HTTP/2 and client overhead.
    pub overhead_ms: DistSummary,
    /// Client: (last - first token) / (n - 1), per request.
    pub tpot_ms: DistSummary,
    /// Server: decode_ns / (n - 1), per request.
    pub server_tpot_ms: DistSummary,
    /// Client: every gap between consecutive tokens received.
    pub itl_ms: DistSummary,
    /// Server: every gap between consecutive tokens' server_time_ns.
    pub server_itl_ms: DistSummary,
    /// Client: submit start -> last message.
    pub latency_ms: DistSummary,
    /// Client: intended start -> last message (coordinated-omission aware).
    pub latency_from_intended_ms: DistSummary,
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
    /// Requests that failed.
    pub failed: usize,
    /// Failures by gRPC status name.
    pub errors: BTreeMap<&'static str, usize>,
    /// OK requests by finish reason.
    pub finish_reasons: BTreeMap<&'static str, usize>,
    /// Prompt tokens of the OK requests.
    pub prompt_tokens: u64,
    /// Completion tokens of the OK requests.
    pub completion_tokens: u64,
    /// t0 -> last request ended.
    pub wall_s: f64,
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
        let mut m = Accumulators::default();
        let mut errors = BTreeMap::new();
        let mut finish_reasons = BTreeMap::new();
        let (mut prompt_tokens, mut completion_tokens) = (0u64, 0u64);
        let mut iterations = std::collections::BTreeSet::new();
        let mut max_prefill_batch_size = 0;
        let (mut cached_prompt_tokens, mut max_prefill_chunks) = (0u64, 0u32);
        for r in records {
            m.submit_lag.record_ns(r.submit_lag_ns);
            m.add_request
                .record_ns(r.submit_end_ns.saturating_sub(r.submit_start_ns));
            if !r.ok {
                *errors.entry(r.status).or_insert(0) += 1;
                continue;
            }
            *finish_reasons
                .entry(r.finish_reason.unwrap_or("UNSPECIFIED"))
                .or_insert(0) += 1;
            prompt_tokens += u64::from(r.prompt_tokens.unwrap_or(0));
            completion_tokens += u64::from(r.completion_tokens);
            m.add_ok(r);
            if let Some(s) = &r.server {
                iterations.insert(s.admitted_iteration);
                max_prefill_batch_size = max_prefill_batch_size.max(s.prefill_batch_size);
                cached_prompt_tokens += u64::from(s.cached_prompt_tokens);
                max_prefill_chunks = max_prefill_chunks.max(s.prefill_chunks);
            }
        }
        let ok = records.iter().filter(|r| r.ok).count();
        let first_start = records.iter().map(|r| r.submit_start_ns).min().unwrap_or(0);
        let last_start = records.iter().map(|r| r.submit_start_ns).max().unwrap_or(0);
        let last_submit_end = records.iter().map(|r| r.submit_end_ns).max().unwrap_or(0);
        let wall_ns = records.iter().map(|r| r.finish_ns).max().unwrap_or(0);
        let wall_s = wall_ns as f64 / 1e9;
        let per_s = |n: u64| if wall_s > 0.0 { n as f64 / wall_s } else { 0.0 };
        let achieved_rate_rps = (records.len() > 1 && last_start > first_start)
            .then(|| (records.len() - 1) as f64 / ((last_start - first_start) as f64 / 1e9));
        RunStats {
            run: result.run,
            warmup: result.warmup,
            requests: records.len(),
            ok,
            failed: records.len() - ok,
            errors,
            finish_reasons,
            prompt_tokens,
            completion_tokens,
            wall_s,
            submit_wall_s: last_submit_end.saturating_sub(first_start) as f64 / 1e9,
            achieved_rate_rps,
            requested_rate_rps,
            throughput_completion_tps: per_s(completion_tokens),
            throughput_total_tps: per_s(prompt_tokens + completion_tokens),
            max_streams_per_connection: result
                .conn_peaks
                .iter()
                .map(|c| c.max_streams)
                .max()
                .unwrap_or(0),
            streams_per_connection: result.conn_peaks.clone(),
            admission_iterations: iterations.len(),
            max_prefill_batch_size,
            cached_prompt_tokens,
            max_prefill_chunks,
            goodput: slo.map(|slo| Goodput::of(slo, records, wall_s)),
            stopped_early: result.stopped_early.clone(),
            unsent: result.unsent,
            metrics: m.summaries(),
        }
    }
}

/// The distributions being filled, one per [`Metrics`] field.
#[derive(Debug, Default)]
struct Accumulators {
    submit_lag: Dist,
    add_request: Dist,
    tokenize: Dist,
    enqueue: Dist,
    queue_wait: Dist,
    prefill_to_first_token: Dist,
    server_ttft: Dist,
    ttft: Dist,
    overhead: Dist,
    tpot: Dist,
    server_tpot: Dist,
    itl: Dist,
    server_itl: Dist,
    latency: Dist,
    latency_from_intended: Dist,
}

impl Accumulators {
    /// Records everything an OK request contributes beyond submit lag.
    fn add_ok(&mut self, r: &RequestRecord) {
        if let Some(v) = r.client_ttft_ns {
            self.ttft.record_ns(v);
        }
        if let Some(v) = r.overhead_ns {
            self.overhead.record_signed_ns(v);
        }
        if let Some(v) = r.client_tpot_ns {
            self.tpot.record_ns(v);
        }
        for gap in r.itl_ns() {
            self.itl.record_ns(gap);
        }
        self.latency.record_ns(r.latency_ns);
        self.latency_from_intended
            .record_ns(r.latency_from_intended_ns);
        let Some(s) = &r.server else { return };
        self.tokenize.record_ns(s.tokenize_ns);
        self.enqueue.record_ns(s.enqueue_ns);
        self.queue_wait.record_ns(s.queue_wait_ns);
        self.prefill_to_first_token
            .record_ns(s.prefill_to_first_token_ns);
        self.server_ttft.record_ns(s.server_ttft_ns);
        if s.token_server_time_ns.len() >= 2 {
            self.server_tpot
                .record_ns(s.decode_ns / (s.token_server_time_ns.len() as u64 - 1));
        }
        for gap in s.itl_ns() {
            self.server_itl.record_ns(gap);
        }
    }

    fn summaries(&self) -> Metrics {
        Metrics {
            submit_lag_ms: self.submit_lag.summary(),
            add_request_ms: self.add_request.summary(),
            tokenize_ms: self.tokenize.summary(),
            enqueue_ms: self.enqueue.summary(),
            queue_wait_ms: self.queue_wait.summary(),
            prefill_to_first_token_ms: self.prefill_to_first_token.summary(),
            server_ttft_ms: self.server_ttft.summary(),
            ttft_ms: self.ttft.summary(),
            overhead_ms: self.overhead.summary(),
            tpot_ms: self.tpot.summary(),
            server_tpot_ms: self.server_tpot.summary(),
            itl_ms: self.itl.summary(),
            server_itl_ms: self.server_itl.summary(),
            latency_ms: self.latency.summary(),
            latency_from_intended_ms: self.latency_from_intended.summary(),
        }
    }
}

/// Mean and spread of one number across measured runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Mean over runs.
    pub mean: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
    /// Sample standard deviation (0 for a single run).
    pub stdev: f64,
}

impl Spread {
    /// The spread of the values present; `None` if there are none.
    pub fn of(values: impl IntoIterator<Item = Option<f64>>) -> Option<Spread> {
        let v: Vec<f64> = values.into_iter().flatten().collect();
        if v.is_empty() {
            return None;
        }
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = if v.len() > 1 {
            v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        Some(Spread {
            mean,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            stdev: var.sqrt(),
        })
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

    /// The statistics of a run with no requests.
    pub(crate) fn empty_stats() -> RunStats {
        let result = RunResult {
            run: 0,
            warmup: false,
            records: Vec::new(),
            conn_peaks: Vec::new(),
            stopped_early: None,
            unsent: 0,
        };
        RunStats::from_run(&result, None, None)
    }

    #[test]
    fn dist_percentiles_within_histogram_precision() {
        let mut d = Dist::default();
        for ms in 1..=100u64 {
            d.record_ns(ms * 1_000_000);
        }
        let s = d.summary();
        let close = |a: Option<f64>, b: f64| (a.expect("present") - b).abs() <= b * 1e-3;
        assert!(close(s.p50, 50.0), "{s:?}");
        assert!(close(s.p95, 95.0), "{s:?}");
        assert!(close(s.p99, 99.0), "{s:?}");
        assert!(close(s.mean, 50.5), "{s:?}");
        assert!(close(s.max, 100.0), "{s:?}");
        assert_eq!(s.count, 100);
        assert!(Dist::default().summary().p50.is_none());
    }

    #[test]
    fn negative_overhead_is_clamped_and_counted() {
        let mut d = Dist::default();
        d.record_signed_ns(-5);
        d.record_signed_ns(2_000_000);
        let s = d.summary();
        assert_eq!(s.clamped_negative, 1);
        assert_eq!(s.count, 2);
    }

    #[test]
    fn spread() {
        let s = Spread::of([Some(1.0), None, Some(3.0)]).expect("values");
        assert_eq!((s.mean, s.min, s.max), (2.0, 1.0, 3.0));
        assert!((s.stdev - 2f64.sqrt()).abs() < 1e-12);
        assert!(Spread::of([None]).is_none());
    }
}
