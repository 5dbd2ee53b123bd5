//! Prometheus metrics (`--metrics-port`, HTTP `/metrics`).
//!
//! Names are vLLM's (`vllm:` prefix) wherever the meaning matches, so what
//! reads vLLM's series (its Grafana dashboard, the Gateway API inference
//! extension's endpoint picker, autoscaler rules on `vllm:num_requests_waiting`)
//! reads Ember's unchanged; series only Ember has keep the `ember:` prefix.
//! Every series carries a `model_name` label, as vLLM's do. docs/metrics.md
//! has the table, with the `ember:` names they replaced.
//!
//! Histograms and counters are recorded by the per-request stream tasks, off
//! the scheduler thread, from the same instants as the request's
//! `ServerTiming`; the scheduler only sets gauges once per iteration. Without
//! `--metrics-port` no recorder is installed and every call here is a cheap
//! no-op.
//!
//! Both front doors (gRPC and the OpenAI-compatible HTTP API) feed the same
//! series through the same calls; `ember:requests_total{front_door, outcome}`
//! counts each request once, at its end or its rejection, by the door it came
//! in through. vLLM's series keep vLLM's exact label sets.

use std::net::SocketAddr;
use std::time::Duration;

use ember_common::pb::ServerTiming;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

pub const TTFT: &str = "vllm:time_to_first_token_seconds";
pub const INTER_TOKEN_LATENCY: &str = "vllm:inter_token_latency_seconds";
pub const TIME_PER_OUTPUT_TOKEN: &str = "vllm:request_time_per_output_token_seconds";
pub const E2E_LATENCY: &str = "vllm:e2e_request_latency_seconds";
pub const QUEUE_TIME: &str = "vllm:request_queue_time_seconds";
pub const PREFILL_TIME: &str = "vllm:request_prefill_time_seconds";
pub const DECODE_TIME: &str = "vllm:request_decode_time_seconds";
pub const INFERENCE_TIME: &str = "vllm:request_inference_time_seconds";
pub const REQUEST_PROMPT_TOKENS: &str = "vllm:request_prompt_tokens";
pub const REQUEST_GENERATION_TOKENS: &str = "vllm:request_generation_tokens";
pub const NUM_WAITING: &str = "vllm:num_requests_waiting";
pub const NUM_RUNNING: &str = "vllm:num_requests_running";
pub const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
pub const REQUEST_SUCCESS: &str = "vllm:request_success_total";
pub const PROMPT_TOKENS: &str = "vllm:prompt_tokens_total";
pub const GENERATION_TOKENS: &str = "vllm:generation_tokens_total";
pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries_total";
pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits_total";
pub const NUM_PREEMPTIONS: &str = "vllm:num_preemptions_total";
pub const KV_BLOCKS_USED: &str = "ember:kv_cache_blocks_used";
pub const REQUEST_ABORTED: &str = "ember:request_aborted_total";
pub const REQUEST_REJECTED: &str = "ember:request_rejected_total";
pub const REQUESTS_BY_DOOR: &str = "ember:requests_total";
pub const AUTOTUNE_WHILE_SERVING: &str = "ember:autotune_while_serving_total";
pub const COMPILES_WHILE_SERVING: &str = "ember:kernel_compiles_while_serving_total";

/// Latency buckets (seconds) of the request-level histograms.
const LATENCY_BUCKETS: [f64; 20] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
];
/// Per-token buckets (seconds): inter-token latency and TPOT.
const TOKEN_GAP_BUCKETS: [f64; 21] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
/// Token-count buckets (vLLM's 1-2-5 series).
const TOKEN_COUNT_BUCKETS: [f64; 14] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
];

/// How a request ended, as vLLM labels it (`finished_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishedReason {
    /// EOS token, a stop token id or a stop string (`FINISH_REASON_STOP`).
    Stop,
    /// `max_new_tokens` reached.
    Length,
    /// Client gone, grpc-timeout passed or shutdown timeout.
    Abort,
    /// The engine failed its batch.
    Error,
}

impl FinishedReason {
    pub const ALL: [FinishedReason; 4] = [Self::Stop, Self::Length, Self::Abort, Self::Error];

    pub fn label(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
            Self::Error => "error",
        }
    }
}

/// The front door a request came in through (the `front_door` label, and the
/// `front_door` field of the request's log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontDoor {
    /// `ember.v1.Inference` over gRPC.
    Grpc,
    /// The OpenAI-compatible HTTP API (`--http-listen`).
    Http,
}

impl FrontDoor {
    pub const ALL: [FrontDoor; 2] = [Self::Grpc, Self::Http];

    pub fn label(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::Http => "http",
        }
    }
}

/// The `outcome` of a request refused before it was queued (the others are
/// [`FinishedReason`] labels).
pub const OUTCOME_REJECTED: &str = "rejected";

/// Starts the `/metrics` HTTP listener on the current tokio runtime; every
/// series gets `model_name="<model_name>"`.
pub fn install(addr: SocketAddr, model_name: &str) -> anyhow::Result<()> {
    let per_token = Matcher::Full(INTER_TOKEN_LATENCY.into());
    let tpot = Matcher::Full(TIME_PER_OUTPUT_TOKEN.into());
    let prompt = Matcher::Full(REQUEST_PROMPT_TOKENS.into());
    let generation = Matcher::Full(REQUEST_GENERATION_TOKENS.into());
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .add_global_label("model_name", model_name)
        .set_buckets(&LATENCY_BUCKETS)?
        .set_buckets_for_metric(per_token, &TOKEN_GAP_BUCKETS)?
        .set_buckets_for_metric(tpot, &TOKEN_GAP_BUCKETS)?
        .set_buckets_for_metric(prompt, &TOKEN_COUNT_BUCKETS)?
        .set_buckets_for_metric(generation, &TOKEN_COUNT_BUCKETS)?
        .install()?;
    describe();
    start_counters_at_zero();
    tracing::info!(%addr, model_name, "serving Prometheus metrics on /metrics");
    Ok(())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    let s = Unit::Seconds;
    describe_histogram!(TTFT, s, "Server TTFT: received -> first token.");
    describe_histogram!(
        INTER_TOKEN_LATENCY,
        s,
        "Gap between consecutive tokens of a request."
    );
    describe_histogram!(
        TIME_PER_OUTPUT_TOKEN,
        s,
        "Per request: (last token - first token) / (tokens - 1), for 2 or more tokens."
    );
    describe_histogram!(E2E_LATENCY, s, "Received -> finished.");
    describe_histogram!(QUEUE_TIME, s, "Pending queue wait: enqueued -> admitted.");
    describe_histogram!(PREFILL_TIME, s, "Admitted -> first token.");
    describe_histogram!(DECODE_TIME, s, "First token -> last token.");
    describe_histogram!(INFERENCE_TIME, s, "Admitted -> last token.");
    describe_histogram!(
        REQUEST_PROMPT_TOKENS,
        Unit::Count,
        "Prompt tokens per finished request."
    );
    describe_histogram!(
        REQUEST_GENERATION_TOKENS,
        Unit::Count,
        "Generated tokens per finished request."
    );
    describe_gauge!(NUM_WAITING, "Requests in the pending queue.");
    describe_gauge!(NUM_RUNNING, "Sequences admitted and not finished.");
    describe_gauge!(KV_USAGE, "Fraction of KV cache blocks in use (0..1).");
    describe_gauge!(KV_BLOCKS_USED, "KV cache blocks in use.");
    describe_counter!(
        REQUEST_SUCCESS,
        "Ended requests by finished_reason (stop, length, abort, error)."
    );
    describe_counter!(
        REQUEST_ABORTED,
        "Aborted requests by reason (cancelled, deadline)."
    );
    describe_counter!(
        REQUEST_REJECTED,
        "Requests refused before queueing, by reason."
    );
    describe_counter!(
        REQUESTS_BY_DOOR,
        "Requests by front door (grpc, http) and outcome (stop, length, abort, error, rejected)."
    );
    describe_counter!(PROMPT_TOKENS, "Prompt tokens of admitted requests.");
    describe_counter!(GENERATION_TOKENS, "Generated tokens.");
    describe_counter!(
        PREFIX_CACHE_QUERIES,
        "Prompt tokens looked up in the prefix cache."
    );
    describe_counter!(
        PREFIX_CACHE_HITS,
        "Prompt tokens found in the prefix cache."
    );
    describe_counter!(
        NUM_PREEMPTIONS,
        "Running requests preempted (KV blocks freed; resumed later by recompute)."
    );
    describe_counter!(
        AUTOTUNE_WHILE_SERVING,
        "Kernel autotunings after health turned SERVING (shapes the warmup missed; should stay 0)."
    );
    describe_counter!(
        COMPILES_WHILE_SERVING,
        "Kernels compiled after health turned SERVING (kernels the warmup did not run; should stay 0)."
    );
}

/// Counters exist from the start (at 0), so `rate()` works before the first
/// request of each kind.
fn start_counters_at_zero() {
    for reason in FinishedReason::ALL {
        metrics::counter!(REQUEST_SUCCESS, "finished_reason" => reason.label()).absolute(0);
    }
    for door in FrontDoor::ALL {
        let outcomes = FinishedReason::ALL.map(FinishedReason::label);
        for outcome in outcomes.into_iter().chain([OUTCOME_REJECTED]) {
            metrics::counter!(REQUESTS_BY_DOOR, "front_door" => door.label(), "outcome" => outcome)
                .absolute(0);
        }
    }
    for name in [
        PROMPT_TOKENS,
        GENERATION_TOKENS,
        PREFIX_CACHE_QUERIES,
        PREFIX_CACHE_HITS,
        NUM_PREEMPTIONS,
        AUTOTUNE_WHILE_SERVING,
        COMPILES_WHILE_SERVING,
    ] {
        metrics::counter!(name).absolute(0);
    }
}

/// Scheduler gauges, once per iteration.
pub fn record_gauges(waiting: usize, running: usize, kv_used: usize, kv_total: usize) {
    metrics::gauge!(NUM_WAITING).set(waiting as f64);
    metrics::gauge!(NUM_RUNNING).set(running as f64);
    metrics::gauge!(KV_BLOCKS_USED).set(kv_used as f64);
    metrics::gauge!(KV_USAGE).set(kv_used as f64 / kv_total.max(1) as f64);
}

/// One prefix-cache lookup at admission, in tokens: every admitted prompt's
/// `queried_tokens` were looked up, `hit_tokens` of them were already cached
/// and not computed (vLLM counts the same way; hit rate = rate(hits) /
/// rate(queries)).
pub fn record_prefix_cache(queried_tokens: u64, hit_tokens: u64) {
    metrics::counter!(PREFIX_CACHE_QUERIES).increment(queried_tokens);
    metrics::counter!(PREFIX_CACHE_HITS).increment(hit_tokens);
}

/// A running request was preempted (by the scheduler thread: the one
/// counter it records, at the moment of the preemption).
pub fn preempted() {
    metrics::counter!(NUM_PREEMPTIONS).increment(1);
}

/// The request left the pending queue after `queue_wait`.
pub fn admitted(queue_wait: Duration, prompt_tokens: u32) {
    metrics::histogram!(QUEUE_TIME).record(queue_wait.as_secs_f64());
    metrics::counter!(PROMPT_TOKENS).increment(u64::from(prompt_tokens));
}

/// The request's first token: `ttft` after it was received, `prefill` after
/// it was admitted.
pub fn first_token(ttft: Duration, prefill: Option<Duration>) {
    metrics::histogram!(TTFT).record(ttft.as_secs_f64());
    if let Some(p) = prefill {
        metrics::histogram!(PREFILL_TIME).record(p.as_secs_f64());
    }
    metrics::counter!(GENERATION_TOKENS).increment(1);
}

/// A later token, `gap` after the previous one.
pub fn next_token(gap: Duration) {
    metrics::histogram!(INTER_TOKEN_LATENCY).record(gap.as_secs_f64());
    metrics::counter!(GENERATION_TOKENS).increment(1);
}

/// The request ended. Request-level histograms are recorded for completed
/// requests (stop, length) only, from their `ServerTiming`, so an aborted
/// request's truncated latency never lands among real ones.
pub fn finished(
    reason: FinishedReason,
    door: FrontDoor,
    timing: Option<&ServerTiming>,
    prompt: u32,
    generated: u32,
) {
    metrics::counter!(REQUEST_SUCCESS, "finished_reason" => reason.label()).increment(1);
    metrics::counter!(REQUESTS_BY_DOOR, "front_door" => door.label(), "outcome" => reason.label())
        .increment(1);
    let Some(t) = timing else { return };
    if !matches!(reason, FinishedReason::Stop | FinishedReason::Length) {
        return;
    }
    let secs = |ns: u64| Duration::from_nanos(ns).as_secs_f64();
    metrics::histogram!(E2E_LATENCY).record(secs(t.total_ns));
    metrics::histogram!(DECODE_TIME).record(secs(t.decode_ns));
    metrics::histogram!(INFERENCE_TIME).record(secs(t.prefill_to_first_token_ns + t.decode_ns));
    if generated >= 2 {
        let tpot = secs(t.decode_ns) / f64::from(generated - 1);
        metrics::histogram!(TIME_PER_OUTPUT_TOKEN).record(tpot);
    }
    metrics::histogram!(REQUEST_PROMPT_TOKENS).record(f64::from(prompt));
    metrics::histogram!(REQUEST_GENERATION_TOKENS).record(f64::from(generated));
}

/// An aborted request's cause: `cancelled` (client gone, shutdown) or
/// `deadline` (its deadline passed: grpc-timeout, or x-request-timeout on
/// HTTP).
pub fn aborted(cause: &'static str) {
    metrics::counter!(REQUEST_ABORTED, "reason" => cause).increment(1);
}

/// A request refused before it was queued (`reason`: the
/// `ember:request_rejected_total` label), at `door`.
pub fn rejected(reason: &'static str, door: FrontDoor) {
    metrics::counter!(REQUEST_REJECTED, "reason" => reason).increment(1);
    metrics::counter!(REQUESTS_BY_DOOR, "front_door" => door.label(), "outcome" => OUTCOME_REJECTED)
        .increment(1);
}
