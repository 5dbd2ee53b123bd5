//! One Generate call: submit it, read its stream, timestamp every event on the
//! client's monotonic clock, and keep the server's timeline next to it.
//!
//! Nothing here fails: a gRPC error, a client deadline or a stream that ends
//! early becomes a record with `ok: false` and the status code's name.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_common::pb::generate_response::Event;
use ember_common::pb::GenerateResponse;
use tokio::sync::oneshot;
use tonic::{Status, Streaming};

use crate::pool::Conn;
use crate::record::{finish_reason_name, status_name, RequestRecord, ServerRecord};
use crate::workload::PreparedRequest;

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
}

/// Nanoseconds from `t0` to `t` (0 if `t` is earlier).
pub fn ns_since(t0: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(t0).as_nanos()).unwrap_or(u64::MAX)
}

/// Runs one request to its end. `submitted` receives the instant the call
/// returned (the relative schedule waits for it).
pub async fn execute(
    conn: Arc<Conn>,
    prepared: PreparedRequest,
    slot: Slot,
    timeout: Duration,
    submitted: Option<oneshot::Sender<Instant>>,
) -> RequestRecord {
    let _in_flight = conn.open_stream();
    let mut client = conn.client();
    let request_id = prepared.request.request_id.clone();
    let mut request = tonic::Request::new(prepared.request);
    request.set_timeout(timeout);

    let submit_start = Instant::now();
    let deadline = tokio::time::Instant::from_std(submit_start + timeout);
    let call = tokio::time::timeout_at(deadline, client.generate(request)).await;
    let submit_end = Instant::now();
    if let Some(tx) = submitted {
        // The scheduler may have stopped waiting; nothing to do then.
        let _ = tx.send(submit_end);
    }

    let mut record = RequestRecord {
        run: slot.run,
        warmup: slot.warmup,
        index: slot.index,
        request_id,
        target: conn.target.clone(),
        channel: conn.channel,
        ok: false,
        status: "UNKNOWN",
        error_message: None,
        prompt_tokens: prepared.prompt_tokens,
        completion_tokens: 0,
        finish_reason: None,
        intended_start_ns: ns_since(slot.t0, slot.intended),
        submit_start_ns: ns_since(slot.t0, submit_start),
        submit_end_ns: ns_since(slot.t0, submit_end),
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
    };
    let mut server = ServerRecord::default();

    let outcome = match call {
        Err(_) => Err((
            Status::deadline_exceeded("client --timeout passed before the call returned"),
            Instant::now(),
        )),
        Ok(Err(status)) => Err((status, submit_end)),
        Ok(Ok(response)) => {
            read_stream(
                response.into_inner(),
                deadline,
                slot.t0,
                &mut record,
                &mut server,
            )
            .await
        }
    };
    match outcome {
        Ok(finished_at) => {
            record.ok = true;
            record.status = "OK";
            record.finish_ns = ns_since(slot.t0, finished_at);
            record.server = Some(server);
        }
        Err((status, at)) => {
            record.status = status_name(status.code());
            record.error_message = Some(status.message().to_string());
            record.finish_ns = ns_since(slot.t0, at);
            if record.completion_tokens == 0 {
                record.completion_tokens = saturating_u32(record.token_recv_ns.len());
            }
            tracing::debug!(
                request_id = %record.request_id,
                status = record.status,
                message = status.message(),
                "request failed"
            );
        }
    }
    record.derive();
    record
}

/// Reads `started`, the tokens and `finished`, then the trailers (which carry
/// the final status). Returns when `finished` arrived, or the failure and when.
async fn read_stream(
    mut stream: Streaming<GenerateResponse>,
    deadline: tokio::time::Instant,
    t0: Instant,
    record: &mut RequestRecord,
    server: &mut ServerRecord,
) -> Result<Instant, (Status, Instant)> {
    let mut finished_at = None;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.message()).await;
        let now = Instant::now();
        let message = match next {
            Err(_) => {
                let status = Status::deadline_exceeded("client --timeout passed during the stream");
                return Err((status, now));
            }
            Ok(Err(status)) => return Err((status, now)),
            Ok(Ok(None)) => {
                return finished_at.ok_or_else(|| {
                    let status = Status::unknown("stream ended without a Finished message");
                    (status, now)
                });
            }
            Ok(Ok(Some(message))) => message,
        };
        match message.event {
            Some(Event::Started(started)) => {
                record.prompt_tokens = Some(started.prompt_tokens);
                server.started_server_time_ns = started.server_time_ns;
            }
            Some(Event::Token(token)) => {
                record.token_recv_ns.push(ns_since(t0, now));
                server.token_server_time_ns.push(token.server_time_ns);
            }
            Some(Event::Finished(finished)) => {
                finished_at = Some(now);
                record.prompt_tokens = Some(finished.prompt_tokens);
                record.completion_tokens = finished.completion_tokens;
                record.finish_reason = finish_reason_name(finished.finish_reason);
                if let Some(timing) = &finished.timing {
                    server.set_timing(timing);
                }
                if finished.completion_tokens as usize != record.token_recv_ns.len() {
                    tracing::warn!(
                        request_id = %finished.request_id,
                        reported = finished.completion_tokens,
                        received = record.token_recv_ns.len(),
                        "completion_tokens differs from the tokens received"
                    );
                }
            }
            // An event added to the proto after this build: not ours to judge.
            None => {}
        }
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
