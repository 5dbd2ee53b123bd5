//! The distributions of one run ([`Metrics`], the JSON `metrics` object)
//! and the accumulators that fill them from request records.
//!
//! Latency distributions cover the requests that finished OK (a failed
//! request has no complete timeline); submit lag and add_request latency
//! cover every request, since every request was submitted. The server's
//! distributions take the OK requests whose server sent its timeline.

use serde::Serialize;

use crate::measure::dist::{Dist, DistSummary};
use crate::record::RequestRecord;

/// Every distribution of a run, in report order (keys of the JSON `metrics`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Metrics {
    /// submit start - intended start (all requests).
    pub submit_lag_ms: DistSummary,
    /// Of that, fired - intended start: the firing loop's lateness.
    pub fire_lag_ms: DistSummary,
    /// And submit start - fired: a worker picking the request up, then
    /// building the call.
    pub pickup_ms: DistSummary,
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

/// The distributions being filled, one per [`Metrics`] field.
#[derive(Debug, Default)]
pub struct Accumulators {
    submit_lag: Dist,
    fire_lag: Dist,
    pickup: Dist,
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
    /// Records one request: submit lag and add_request latency for every
    /// request, the rest for OK ones.
    pub fn add(&mut self, r: &RequestRecord) {
        self.submit_lag.record_ns(r.submit_lag_ns);
        self.fire_lag
            .record_ns(r.fired_ns.saturating_sub(r.intended_start_ns));
        self.pickup
            .record_ns(r.submit_start_ns.saturating_sub(r.fired_ns));
        self.add_request
            .record_ns(r.submit_end_ns.saturating_sub(r.submit_start_ns));
        if r.ok {
            self.add_ok(r);
        }
    }

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

    pub fn summaries(&self) -> Metrics {
        Metrics {
            submit_lag_ms: self.submit_lag.summary(),
            fire_lag_ms: self.fire_lag.summary(),
            pickup_ms: self.pickup.summary(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::record;

    #[test]
    fn submit_lag_splits_into_firing_and_pickup() {
        // `record`: due at 1.0 us, handed over at 1.2 us, submitted at 1.5 us.
        let mut a = Accumulators::default();
        a.add(&record(vec![10_000], None));
        let m = a.summaries();
        // The mean is exact to the ns (percentiles are whole microseconds).
        let ms = |d: &DistSummary| d.mean.expect("one value");
        assert!((ms(&m.submit_lag_ms) - 500e-6).abs() < 1e-6);
        assert!((ms(&m.fire_lag_ms) - 200e-6).abs() < 1e-6);
        assert!((ms(&m.pickup_ms) - 300e-6).abs() < 1e-6);
    }
}
