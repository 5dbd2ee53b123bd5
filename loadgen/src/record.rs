//! What one request looked like: every client timestamp (ns since the run's
//! t0 on the client's monotonic clock) next to the server's own timeline
//! (durations on the server's clock), whichever backend carried it. This is
//! the `--requests-out` line, and the input of every statistic.
//!
//! The two clocks are never subtracted from each other: reconciliation compares
//! durations (client TTFT vs server TTFT, client vs server inter-token gaps).
//! A backend fills a record with [`RequestRecord::begin`], pushes token
//! arrivals, then ends it with [`RequestRecord::succeed`] or
//! [`RequestRecord::fail`]; [`RequestRecord::derive`] computes the rest.

use std::time::Instant;

use serde::Serialize;

/// Where a request sits in its run, and the run's clock.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    /// Run number.
    pub run: usize,
    /// Warmup or measured run.
    pub warmup: bool,
    /// Position in the schedule.
    pub index: usize,
    /// The run's t0: every timestamp is recorded as ns since it.
    pub t0: Instant,
    /// When the schedule wanted this request submitted.
    pub intended: Instant,
    /// When the firing loop handed it to the runtime (submit lag =
    /// firing late + waiting for a worker and building the call).
    pub fired: Instant,
}

/// Nanoseconds from `t0` to `t` (0 if `t` is earlier).
pub fn ns_since(t0: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(t0).as_nanos()).unwrap_or(u64::MAX)
}

/// Where a record's completion token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenSource {
    /// The gRPC `Finished.completion_tokens` (one `Token` message each).
    Server,
    /// The OpenAI `usage` chunk (`stream_options.include_usage`).
    Usage,
    /// No usage came: the number of token chunks received.
    Chunks,
}

/// One request of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    /// Run number (warmups and measured runs are numbered separately).
    pub run: usize,
    /// True for a warmup run's request (not in the statistics).
    pub warmup: bool,
    /// Position in the run's schedule.
    pub index: usize,
    /// `loadgen compare`: the series (target set) it belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series: Option<String>,
    /// The id sent (gRPC `request_id`, HTTP `x-request-id`), to find the
    /// request in the server's logs.
    pub request_id: String,
    /// The target URL it went to.
    pub target: String,
    /// Which connection to that target carried it.
    pub channel: usize,
    /// The stream ended normally (gRPC `Finished` and OK; HTTP `[DONE]`
    /// after a `finish_reason`).
    pub ok: bool,
    /// "OK", a gRPC status code name ("RESOURCE_EXHAUSTED", ...), `HTTP_<code>`
    /// for an HTTP error status, `STREAM_ERROR` for an error event in an SSE
    /// stream, `DEADLINE_EXCEEDED` for the client's `--timeout`.
    pub status: String,
    /// The failure's message (the gRPC status message, the OpenAI error body's
    /// message, type and param).
    pub error_message: Option<String>,
    /// From the server (`Started`/`Finished`, or `usage`), else the client's
    /// own count of the token ids it sent.
    pub prompt_tokens: Option<u32>,
    /// Tokens generated: see `tokens_from`.
    pub completion_tokens: u32,
    /// Where `completion_tokens` came from.
    pub tokens_from: TokenSource,
    /// The response came as a stream (token by token); false for a
    /// non-streaming request (`--stream false`): one body at the end, so
    /// TTFT is the whole latency and the token arrivals are empty.
    pub streamed: bool,
    /// Upper case: "LENGTH", "EOS", "STOP", "CANCELLED" (gRPC); "LENGTH",
    /// "STOP", "ABORT" (HTTP `finish_reason`); null if none came.
    pub finish_reason: Option<String>,
    /// When the schedule wanted it submitted.
    pub intended_start_ns: u64,
    /// When the firing loop handed it to the runtime: the part of the
    /// submit lag before it is the firing loop's, the part after it the
    /// runtime's (a worker picking the task up) and the call's building.
    pub fired_ns: u64,
    /// When the call started.
    pub submit_start_ns: u64,
    /// When the call returned the response stream (response headers), or its
    /// error.
    pub submit_end_ns: u64,
    /// When the first token arrived.
    pub first_token_ns: Option<u64>,
    /// When the stream ended (the last message, or the failure).
    pub finish_ns: u64,
    /// When each token event arrived (a gRPC `Token`, an SSE token chunk).
    pub token_recv_ns: Vec<u64>,
    /// submit start - intended start.
    pub submit_lag_ns: u64,
    /// first token - submit start (non-streaming: the whole body's).
    pub client_ttft_ns: Option<u64>,
    /// (last token - first token) / (completion tokens - 1); null under 2.
    /// Non-streaming: the server's decode time / (completion tokens - 1),
    /// when it sent its timeline (the client sees no tokens apart).
    pub client_tpot_ns: Option<u64>,
    /// finish - submit start.
    pub latency_ns: u64,
    /// finish - intended start (coordinated-omission aware).
    pub latency_from_intended_ns: u64,
    /// Network + client overhead: client TTFT - server TTFT (two durations);
    /// non-streaming: client latency - server total.
    pub overhead_ns: Option<i64>,
    /// The server's timeline; null unless the request finished OK and the
    /// server reported one (gRPC always; HTTP with Ember's extension).
    pub server: Option<ServerRecord>,
    /// The output text, kept only when the next turn of a session needs it
    /// (never written out).
    #[serde(skip)]
    pub reply: Option<String>,
}

/// The server's account of one request: gRPC `Started`, `Token` and
/// `Finished.timing`, or HTTP's `ember` and `ember_timing` fields.
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
    /// received -> enqueued (gRPC `Started.server_time_ns`, HTTP
    /// `ember_timing.enqueued_at_ns`).
    pub started_server_time_ns: u64,
    /// Each token's `server_time_ns` (received -> sampled).
    pub token_server_time_ns: Vec<u64>,
}

impl ServerRecord {
    /// Gaps between consecutive tokens on the server's clock.
    pub fn itl_ns(&self) -> impl Iterator<Item = u64> + '_ {
        self.token_server_time_ns
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
    }
}

/// The identity of a request before it is sent.
#[derive(Debug, Clone)]
pub struct Begin<'a> {
    /// Its place and clock.
    pub slot: Slot,
    /// The id it carries.
    pub request_id: String,
    /// Target URL.
    pub target: &'a str,
    /// Connection number on that target.
    pub channel: usize,
    /// Prompt tokens the client knows (token ids sent).
    pub prompt_tokens: Option<u32>,
    /// How the backend counts tokens when the server does not say.
    pub tokens_from: TokenSource,
    /// Streamed (token by token) or one body at the end.
    pub streamed: bool,
    /// Keep the output text (a session's next turn carries it).
    pub keep_reply: bool,
}

impl RequestRecord {
    /// A record whose call starts at `submit_start` and returned at
    /// `submit_end`; it fails as UNKNOWN until the backend says otherwise.
    pub fn begin(b: Begin<'_>, submit_start: Instant, submit_end: Instant) -> RequestRecord {
        let t0 = b.slot.t0;
        RequestRecord {
            run: b.slot.run,
            warmup: b.slot.warmup,
            index: b.slot.index,
            series: None,
            request_id: b.request_id,
            target: b.target.to_string(),
            channel: b.channel,
            ok: false,
            status: "UNKNOWN".into(),
            error_message: None,
            prompt_tokens: b.prompt_tokens,
            completion_tokens: 0,
            tokens_from: b.tokens_from,
            streamed: b.streamed,
            finish_reason: None,
            intended_start_ns: ns_since(t0, b.slot.intended),
            fired_ns: ns_since(t0, b.slot.fired),
            submit_start_ns: ns_since(t0, submit_start),
            submit_end_ns: ns_since(t0, submit_end),
            first_token_ns: None,
            finish_ns: 0,
            token_recv_ns: Vec::new(),
            submit_lag_ns: 0,
            client_ttft_ns: None,
            client_tpot_ns: None,
            latency_ns: 0,
            latency_from_intended_ns: 0,
            overhead_ns: None,
            server: None,
            reply: b.keep_reply.then(String::new),
        }
    }

    /// Ends the record as OK at `finish_ns` (since t0), with the server's
    /// timeline if it sent one, and derives the rest.
    pub fn succeed(mut self, finish_ns: u64, server: Option<ServerRecord>) -> RequestRecord {
        self.ok = true;
        self.status = "OK".into();
        self.finish_ns = finish_ns;
        self.server = server;
        self.derive();
        self
    }

    /// Ends the record as failed with `status` and `message` at `finish_ns`;
    /// the tokens received before the failure count as completion tokens.
    pub fn fail(mut self, status: String, message: String, finish_ns: u64) -> RequestRecord {
        tracing::debug!(request_id = %self.request_id, %status, %message, "request failed");
        self.ok = false;
        self.status = status;
        self.error_message = Some(message);
        self.finish_ns = finish_ns;
        if self.completion_tokens == 0 {
            self.completion_tokens = u32::try_from(self.token_recv_ns.len()).unwrap_or(u32::MAX);
        }
        self.derive();
        self
    }

    /// Gaps between consecutive token arrivals on the client's clock.
    pub fn itl_ns(&self) -> impl Iterator<Item = u64> + '_ {
        self.token_recv_ns
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
    }

    /// Fills the fields derived from the timestamps. TPOT divides by the
    /// completion tokens (the server's count), so a server that packs several
    /// tokens into one chunk still gets its per-token time.
    pub fn derive(&mut self) {
        self.submit_lag_ns = self.submit_start_ns.saturating_sub(self.intended_start_ns);
        self.latency_ns = self.finish_ns.saturating_sub(self.submit_start_ns);
        self.latency_from_intended_ns = self.finish_ns.saturating_sub(self.intended_start_ns);
        if !self.streamed {
            self.derive_whole();
            return;
        }
        self.first_token_ns = self.token_recv_ns.first().copied();
        self.client_ttft_ns = self
            .first_token_ns
            .map(|f| f.saturating_sub(self.submit_start_ns));
        let tokens = u64::from(self.completion_tokens).max(self.token_recv_ns.len() as u64);
        self.client_tpot_ns = match (self.token_recv_ns.first(), self.token_recv_ns.last()) {
            (Some(first), Some(last)) if tokens >= 2 && last > first => {
                Some((last - first) / (tokens - 1))
            }
            (Some(_), Some(_)) if self.token_recv_ns.len() >= 2 => Some(0),
            _ => None,
        };
        self.overhead_ns = match (self.client_ttft_ns, &self.server) {
            (Some(client), Some(server)) => Some(client as i64 - server.server_ttft_ns as i64),
            _ => None,
        };
    }

    /// A non-streaming request: every token arrives with the body, so the
    /// first token is the end; TPOT is the server's, the overhead compares
    /// the whole latency with the server's total.
    fn derive_whole(&mut self) {
        let tokens = u64::from(self.completion_tokens);
        self.first_token_ns = (self.ok && tokens > 0).then_some(self.finish_ns);
        self.client_ttft_ns = self
            .first_token_ns
            .map(|f| f.saturating_sub(self.submit_start_ns));
        self.client_tpot_ns = self
            .server
            .as_ref()
            .filter(|_| tokens >= 2)
            .map(|s| s.decode_ns / (tokens - 1));
        self.overhead_ns = self
            .server
            .as_ref()
            .map(|s| self.latency_ns as i64 - s.total_ns as i64);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(recv: Vec<u64>, server_ttft: Option<u64>) -> RequestRecord {
        let t0 = Instant::now();
        let slot = Slot {
            run: 0,
            warmup: false,
            index: 0,
            t0,
            intended: t0 + std::time::Duration::from_nanos(1_000),
            fired: t0 + std::time::Duration::from_nanos(1_200),
        };
        let begin = Begin {
            slot,
            request_id: "x".into(),
            target: "t",
            channel: 0,
            prompt_tokens: Some(3),
            tokens_from: TokenSource::Server,
            streamed: true,
            keep_reply: false,
        };
        let mut r = RequestRecord::begin(begin, t0, t0);
        r.submit_start_ns = 1_500;
        r.submit_end_ns = 2_000;
        r.completion_tokens = recv.len() as u32;
        r.token_recv_ns = recv;
        r.finish_reason = Some("LENGTH".into());
        let server = server_ttft.map(|t| ServerRecord {
            server_ttft_ns: t,
            ..Default::default()
        });
        r.succeed(50_000, server)
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
    fn tpot_divides_by_the_reported_token_count() {
        // Two chunks 30 us apart that carried 4 tokens (usage said so).
        let mut r = record(vec![10_000, 40_000], None);
        r.completion_tokens = 4;
        r.derive();
        assert_eq!(r.client_tpot_ns, Some(10_000));
    }

    #[test]
    fn a_whole_body_is_its_own_first_token() {
        let mut r = record(Vec::new(), None);
        r.streamed = false;
        r.completion_tokens = 5;
        r.server = Some(ServerRecord {
            decode_ns: 8_000,
            total_ns: 40_000,
            ..Default::default()
        });
        r.derive();
        assert_eq!(r.first_token_ns, Some(50_000));
        assert_eq!(r.client_ttft_ns, Some(r.latency_ns));
        assert_eq!(r.client_tpot_ns, Some(2_000), "server decode / (n - 1)");
        assert_eq!(
            r.overhead_ns,
            Some(48_500 - 40_000),
            "latency - server total"
        );
        assert_eq!(r.itl_ns().count(), 0);
        r.server = None;
        r.derive();
        assert_eq!((r.client_tpot_ns, r.overhead_ns), (None, None));
    }

    #[test]
    fn one_token_has_no_tpot_and_failure_no_overhead() {
        let r = record(vec![10_000], None);
        assert_eq!(r.client_tpot_ns, None);
        assert_eq!(r.overhead_ns, None);
        assert_eq!(r.itl_ns().count(), 0);
        let failed =
            record(vec![10_000, 20_000], None).fail("HTTP_429".into(), "full".into(), 60_000);
        assert!(!failed.ok);
        assert_eq!(failed.status, "HTTP_429");
        assert_eq!(failed.completion_tokens, 2);
    }
}
