//! What one request looked like: every client timestamp (ns since the run's
//! t0 on the client's monotonic clock) next to the server's own timeline
//! (durations on the server's clock). This is the `--requests-out` line, and
//! the input of every statistic.
//!
//! The two clocks are never subtracted from each other: reconciliation compares
//! durations (client TTFT vs server TTFT, client vs server inter-token gaps).

use ember_common::pb::{FinishReason, ServerTiming};
use serde::Serialize;
use tonic::Code;

/// One request of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    /// Run number (warmups and measured runs are numbered separately).
    pub run: usize,
    /// True for a warmup run's request (not in the statistics).
    pub warmup: bool,
    /// Position in the run's schedule.
    pub index: usize,
    /// The id sent (and echoed by the server), to find the request in its logs.
    pub request_id: String,
    /// The target URL it went to.
    pub target: String,
    /// Which connection to that target carried it.
    pub channel: usize,
    /// The stream ended with `Finished` and status OK.
    pub ok: bool,
    /// gRPC status code name: "OK", "RESOURCE_EXHAUSTED", ...
    pub status: &'static str,
    /// The status message of a failure.
    pub error_message: Option<String>,
    /// From the server (`Started`/`Finished`), else the client's `--pretok` count.
    pub prompt_tokens: Option<u32>,
    /// `Finished.completion_tokens`, or the tokens received before a failure.
    pub completion_tokens: u32,
    /// "LENGTH", "EOS" or "CANCELLED"; null without a `Finished`.
    pub finish_reason: Option<&'static str>,
    /// When the schedule wanted it submitted.
    pub intended_start_ns: u64,
    /// When the Generate call started.
    pub submit_start_ns: u64,
    /// When the call returned the response stream (or its error).
    pub submit_end_ns: u64,
    /// When the first token arrived.
    pub first_token_ns: Option<u64>,
    /// When the stream ended (the `Finished` message or the failure).
    pub finish_ns: u64,
    /// When each token arrived.
    pub token_recv_ns: Vec<u64>,
    /// submit start - intended start.
    pub submit_lag_ns: u64,
    /// first token - submit start.
    pub client_ttft_ns: Option<u64>,
    /// (last token - first token) / (tokens - 1); null under 2 tokens.
    pub client_tpot_ns: Option<u64>,
    /// finish - submit start.
    pub latency_ns: u64,
    /// finish - intended start (coordinated-omission aware).
    pub latency_from_intended_ns: u64,
    /// Network + client overhead: client TTFT - server TTFT (two durations).
    pub overhead_ns: Option<i64>,
    /// The server's timeline; null unless the request finished OK.
    pub server: Option<ServerRecord>,
}

/// The server's account of one request, from `Started`, `Token` and `Finished`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerRecord {
    /// received -> tokenized.
    pub tokenize_ns: u64,
    /// tokenized -> enqueued.
    pub enqueue_ns: u64,
    /// enqueued -> admitted.
    pub queue_wait_ns: u64,
    /// admitted -> first token.
    pub prefill_to_first_token_ns: u64,
    /// received -> first token.
    pub server_ttft_ns: u64,
    /// first token -> last token.
    pub decode_ns: u64,
    /// received -> finished.
    pub total_ns: u64,
    /// Requests in the prefill batch this one was admitted with.
    pub prefill_batch_size: u32,
    /// Scheduler iteration of the admission.
    pub admitted_iteration: u64,
    /// Leading prompt tokens the server found in its prefix cache.
    pub cached_prompt_tokens: u32,
    /// Prefill steps that computed the rest of the prompt (> 1: chunked).
    pub prefill_chunks: u32,
    /// `Started.server_time_ns` (received -> enqueued).
    pub started_server_time_ns: u64,
    /// Each token's `server_time_ns` (received -> sampled).
    pub token_server_time_ns: Vec<u64>,
}

impl ServerRecord {
    /// Fills the durations from `Finished.timing`.
    pub fn set_timing(&mut self, t: &ServerTiming) {
        self.tokenize_ns = t.tokenize_ns;
        self.enqueue_ns = t.enqueue_ns;
        self.queue_wait_ns = t.queue_wait_ns;
        self.prefill_to_first_token_ns = t.prefill_to_first_token_ns;
        self.server_ttft_ns = t.server_ttft_ns;
        self.decode_ns = t.decode_ns;
        self.total_ns = t.total_ns;
        self.prefill_batch_size = t.prefill_batch_size;
        self.admitted_iteration = t.admitted_iteration;
        self.cached_prompt_tokens = t.cached_prompt_tokens;
        self.prefill_chunks = t.prefill_chunks;
    }

    /// Gaps between consecutive tokens on the server's clock.
    pub fn itl_ns(&self) -> impl Iterator<Item = u64> + '_ {
        self.token_server_time_ns
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
    }
}

impl RequestRecord {
    /// Gaps between consecutive token arrivals on the client's clock.
    pub fn itl_ns(&self) -> impl Iterator<Item = u64> + '_ {
        self.token_recv_ns
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
    }

    /// Fills the fields derived from the timestamps.
    pub fn derive(&mut self) {
        self.submit_lag_ns = self.submit_start_ns.saturating_sub(self.intended_start_ns);
        self.first_token_ns = self.token_recv_ns.first().copied();
        self.client_ttft_ns = self
            .first_token_ns
            .map(|f| f.saturating_sub(self.submit_start_ns));
        self.client_tpot_ns = match (self.token_recv_ns.first(), self.token_recv_ns.last()) {
            (Some(first), Some(last)) if self.token_recv_ns.len() >= 2 => {
                Some((last - first) / (self.token_recv_ns.len() as u64 - 1))
            }
            _ => None,
        };
        self.latency_ns = self.finish_ns.saturating_sub(self.submit_start_ns);
        self.latency_from_intended_ns = self.finish_ns.saturating_sub(self.intended_start_ns);
        self.overhead_ns = match (self.client_ttft_ns, &self.server) {
            (Some(client), Some(server)) => Some(client as i64 - server.server_ttft_ns as i64),
            _ => None,
        };
    }
}

/// The canonical upper-case name of a gRPC status code ("RESOURCE_EXHAUSTED").
pub fn status_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// "EOS", "LENGTH", "CANCELLED"; `None` for an unspecified or unknown value.
pub fn finish_reason_name(value: i32) -> Option<&'static str> {
    match FinishReason::try_from(value).ok()? {
        FinishReason::Eos => Some("EOS"),
        FinishReason::Length => Some("LENGTH"),
        FinishReason::Cancelled => Some("CANCELLED"),
        FinishReason::Stop => Some("STOP"),
        FinishReason::Unspecified => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(recv: Vec<u64>, server_ttft: Option<u64>) -> RequestRecord {
        let mut r = RequestRecord {
            run: 0,
            warmup: false,
            index: 0,
            request_id: "x".into(),
            target: "t".into(),
            channel: 0,
            ok: true,
            status: "OK",
            error_message: None,
            prompt_tokens: Some(3),
            completion_tokens: recv.len() as u32,
            finish_reason: Some("LENGTH"),
            intended_start_ns: 1_000,
            submit_start_ns: 1_500,
            submit_end_ns: 2_000,
            first_token_ns: None,
            finish_ns: 50_000,
            token_recv_ns: recv,
            submit_lag_ns: 0,
            client_ttft_ns: None,
            client_tpot_ns: None,
            latency_ns: 0,
            latency_from_intended_ns: 0,
            overhead_ns: None,
            server: server_ttft.map(|t| ServerRecord {
                server_ttft_ns: t,
                ..Default::default()
            }),
        };
        r.derive();
        r
    }

    #[test]
    fn derived_fields() {
        let r = record(vec![10_000, 20_000, 40_000], Some(8_000));
        assert_eq!(r.submit_lag_ns, 500);
        assert_eq!(r.first_token_ns, Some(10_000));
        assert_eq!(r.client_ttft_ns, Some(8_500));
        assert_eq!(r.client_tpot_ns, Some(15_000));
        assert_eq!(r.latency_ns, 48_500);
        assert_eq!(r.latency_from_intended_ns, 49_000);
        assert_eq!(r.overhead_ns, Some(500));
        assert_eq!(r.itl_ns().collect::<Vec<_>>(), vec![10_000, 20_000]);
    }

    #[test]
    fn one_token_has_no_tpot_and_failure_no_overhead() {
        let r = record(vec![10_000], None);
        assert_eq!(r.client_tpot_ns, None);
        assert_eq!(r.overhead_ns, None);
        assert_eq!(r.itl_ns().count(), 0);
    }

    #[test]
    fn names() {
        assert_eq!(status_name(Code::ResourceExhausted), "RESOURCE_EXHAUSTED");
        assert_eq!(
            finish_reason_name(FinishReason::Length as i32),
            Some("LENGTH")
        );
        assert_eq!(finish_reason_name(99), None);
    }
}
