//! Prometheus metrics (`--metrics-port`, HTTP `/metrics`).
//!
//! Names follow vLLM's where the meaning matches, with the `ember:` prefix in
//! place of `vllm:` (so dashboards port by a prefix swap). Histograms are
//! recorded by the per-request stream tasks, off the scheduler thread; the
//! scheduler only sets gauges once per iteration. Without `--metrics-port` no
//! recorder is installed and every call here is a cheap no-op.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

pub const TTFT: &str = "ember:time_to_first_token_seconds";
pub const QUEUE_TIME: &str = "ember:request_queue_time_seconds";
pub const PREFILL_TIME: &str = "ember:request_prefill_time_seconds";
pub const INTER_TOKEN_LATENCY: &str = "ember:inter_token_latency_seconds";
pub const E2E_LATENCY: &str = "ember:e2e_request_latency_seconds";
pub const NUM_WAITING: &str = "ember:num_requests_waiting";
pub const NUM_RUNNING: &str = "ember:num_requests_running";
pub const KV_BLOCKS_USED: &str = "ember:kv_cache_blocks_used";
pub const KV_USAGE: &str = "ember:kv_cache_usage_perc";
pub const REQUEST_SUCCESS: &str = "ember:request_success_total";
pub const REQUEST_REJECTED: &str = "ember:request_rejected_total";
pub const PROMPT_TOKENS: &str = "ember:prompt_tokens_total";
pub const GENERATION_TOKENS: &str = "ember:generation_tokens_total";

/// Starts the `/metrics` HTTP listener on the current tokio runtime.
pub fn install(addr: SocketAddr) -> anyhow::Result<()> {
    let latency_buckets = [
        0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
        7.5, 10.0, 20.0, 40.0, 80.0,
    ];
    let itl_buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
        0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    ];
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(&latency_buckets)?
        .set_buckets_for_metric(Matcher::Full(INTER_TOKEN_LATENCY.into()), &itl_buckets)?
        .install()?;
    describe();
    tracing::info!(%addr, "serving Prometheus metrics on /metrics");
    Ok(())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(TTFT, Unit::Seconds, "Server TTFT: received -> first token.");
    describe_histogram!(
        QUEUE_TIME,
        Unit::Seconds,
        "Pending queue wait: enqueued -> admitted."
    );
    describe_histogram!(PREFILL_TIME, Unit::Seconds, "Admitted -> first token.");
    describe_histogram!(
        INTER_TOKEN_LATENCY,
        Unit::Seconds,
        "Gap between consecutive tokens of a request."
    );
    describe_histogram!(E2E_LATENCY, Unit::Seconds, "Received -> finished.");
    describe_gauge!(NUM_WAITING, "Requests in the pending queue.");
    describe_gauge!(NUM_RUNNING, "Sequences admitted and not finished.");
    describe_gauge!(KV_BLOCKS_USED, "KV cache blocks in use.");
    describe_gauge!(KV_USAGE, "Fraction of KV cache blocks in use (0..1).");
    describe_counter!(
        REQUEST_SUCCESS,
        "Finished requests by finished_reason (eos, length, stop, cancelled, deadline, error)."
    );
    describe_counter!(
        REQUEST_REJECTED,
        "Requests refused before queueing, by reason."
    );
    describe_counter!(PROMPT_TOKENS, "Prompt tokens of admitted requests.");
    describe_counter!(GENERATION_TOKENS, "Generated tokens.");
}

/// Scheduler gauges, once per iteration.
pub fn record_gauges(waiting: usize, running: usize, kv_used: usize, kv_total: usize) {
    metrics::gauge!(NUM_WAITING).set(waiting as f64);
    metrics::gauge!(NUM_RUNNING).set(running as f64);
    metrics::gauge!(KV_BLOCKS_USED).set(kv_used as f64);
    metrics::gauge!(KV_USAGE).set(kv_used as f64 / kv_total.max(1) as f64);
}

pub fn observe(name: &'static str, d: Duration) {
    metrics::histogram!(name).record(d.as_secs_f64());
}

pub fn finished(reason: &'static str, prompt_tokens: u32, generated: u32) {
    metrics::counter!(REQUEST_SUCCESS, "finished_reason" => reason).increment(1);
    metrics::counter!(PROMPT_TOKENS).increment(prompt_tokens as u64);
    metrics::counter!(GENERATION_TOKENS).increment(generated as u64);
}

pub fn rejected(reason: &'static str) {
    metrics::counter!(REQUEST_REJECTED, "reason" => reason).increment(1);
}
