//! One request's response stream: scheduler events in, proto messages out.
//!
//! A task per request reads the events the scheduler sends, detokenizes,
//! stamps server times (offsets from `received`) and feeds a small bounded
//! channel that tonic streams to the client. It is also where the request's
//! end is noticed:
//! - the client leaves: tonic drops the response stream, `out.closed()` fires,
//!   and the task sends `Cancel(ClientGone)` (the request may still be queued);
//! - the grpc-timeout passes: the task sends `Cancel(DeadlineExceeded)` and
//!   ends the stream with DEADLINE_EXCEEDED.
//!
//! Latency histograms are recorded here, off the scheduler thread.

use std::time::{Duration, Instant};

use ember_common::pb::{self, generate_response::Event as PbEvent};
use ember_common::tokenizer::IncrementalDetokenizer;
use tokio::sync::mpsc;
use tonic::Status;

use super::error::{deadline_exceeded, engine_failed};
use crate::engine::SeqId;
use crate::metrics;
use crate::scheduler::{Admission, CancelReason, Event, FinishKind, SchedulerHandle};

/// Messages buffered between this task and tonic. Small: tokens should reach
/// the socket as they come, and a slow client backs up into the (bounded by
/// max_new_tokens) scheduler channel, never into the scheduler thread.
pub const OUT_BUFFER: usize = 16;

pub type OutMessage = Result<pb::GenerateResponse, Status>;

/// How close to its grpc-timeout a client that disconnects counts as having
/// hit the deadline (see [`RequestStream::why_gone`]).
pub const DEADLINE_SLACK: Duration = Duration::from_millis(50);

/// Server-side instants of one request known before it reaches the scheduler.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub received: Instant,
    pub tokenized: Instant,
    pub enqueued: Instant,
    pub deadline: Option<Instant>,
}

/// The state of one streaming request.
pub struct RequestStream {
    pub id: SeqId,
    pub request_id: String,
    pub prompt_tokens: u32,
    pub times: Received,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub out: mpsc::Sender<OutMessage>,
    pub detokenizer: IncrementalDetokenizer,
    pub scheduler: SchedulerHandle,
}

/// What happened to a request so far, for the final timing.
#[derive(Debug, Default)]
struct Progress {
    admission: Option<Admission>,
    /// Prefill steps of the prompt, once it is all in the cache.
    prefill_chunks: u32,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

fn ns(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_nanos() as u64
}

impl RequestStream {
    pub async fn run(mut self) {
        let started = pb::Started {
            request_id: self.request_id.clone(),
            prompt_tokens: self.prompt_tokens,
            server_time_ns: ns(self.times.received, self.times.enqueued),
        };
        if self.send(PbEvent::Started(started)).await.is_err() {
            return;
        }
        let mut progress = Progress::default();
        loop {
            let event = tokio::select! {
                biased;
                _ = self.out.closed() => {
                    self.scheduler.cancel(self.id, self.why_gone());
                    return;
                }
                _ = sleep_until_opt(self.times.deadline) => {
                    self.scheduler.cancel(self.id, CancelReason::DeadlineExceeded);
                    let stage = if progress.admission.is_some() { "running" } else { "queued" };
                    let _ = self.out.send(Err(deadline_exceeded(stage))).await;
                    metrics::finished("deadline", self.prompt_tokens, 0);
                    return;
                }
                event = self.events.recv() => event,
            };
            match event {
                Some(Event::Admitted(a)) => {
                    metrics::observe(metrics::QUEUE_TIME, a.admitted_at - self.times.enqueued);
                    progress.admission = Some(a);
                }
                Some(Event::Prefilled { chunks }) => progress.prefill_chunks = chunks,
                Some(Event::Token {
                    index,
                    token_id,
                    at,
                }) => {
                    match progress.last_token {
                        None => {
                            progress.first_token = Some(at);
                            metrics::observe(metrics::TTFT, at - self.times.received);
                            if let Some(a) = progress.admission {
                                metrics::observe(metrics::PREFILL_TIME, at - a.admitted_at);
                            }
                        }
                        Some(prev) => metrics::observe(metrics::INTER_TOKEN_LATENCY, at - prev),
                    }
                    progress.last_token = Some(at);
                    let token = pb::Token {
                        index,
                        token_id,
                        text: self.detokenizer.push(token_id),
                        server_time_ns: ns(self.times.received, at),
                    };
                    if self.send(PbEvent::Token(token)).await.is_err() {
                        return;
                    }
                }
                Some(Event::Finished {
                    kind,
                    completion_tokens,
                }) => {
                    let finished_at = Instant::now();
                    let (reason, label) = match kind {
                        FinishKind::Eos => (pb::FinishReason::Eos, "eos"),
                        FinishKind::Length => (pb::FinishReason::Length, "length"),
                        FinishKind::Cancelled => (pb::FinishReason::Cancelled, "cancelled"),
                    };
                    metrics::finished(label, self.prompt_tokens, completion_tokens);
                    metrics::observe(metrics::E2E_LATENCY, finished_at - self.times.received);
                    let finished = pb::Finished {
                        request_id: self.request_id.clone(),
                        finish_reason: reason as i32,
                        prompt_tokens: self.prompt_tokens,
                        completion_tokens,
                        timing: Some(self.timing(&progress, finished_at)),
                    };
                    let _ = self.send(PbEvent::Finished(finished)).await;
                    return;
                }
                Some(Event::Failed { message }) => {
                    metrics::finished("error", self.prompt_tokens, 0);
                    let _ = self.out.send(Err(engine_failed(&message))).await;
                    return;
                }
                None => {
                    // The scheduler dropped this request without a final event:
                    // it stopped.
                    let _ = self
                        .out
                        .send(Err(Status::unavailable("the scheduler stopped")))
                        .await;
                    return;
                }
            }
        }
    }

    /// Sends one message; a closed stream means the client left.
    async fn send(&mut self, event: PbEvent) -> Result<(), ()> {
        let msg = pb::GenerateResponse { event: Some(event) };
        if self.out.send(Ok(msg)).await.is_err() {
            self.scheduler.cancel(self.id, self.why_gone());
            return Err(());
        }
        Ok(())
    }

    /// Why the client left. gRPC clients enforce their own deadline too, and
    /// theirs started earlier (before the request crossed the network), so a
    /// client that leaves within [`DEADLINE_SLACK`] of the deadline left
    /// because of it.
    fn why_gone(&self) -> CancelReason {
        match self.times.deadline {
            Some(d) if Instant::now() + DEADLINE_SLACK >= d => CancelReason::DeadlineExceeded,
            _ => CancelReason::ClientGone,
        }
    }

    fn timing(&self, p: &Progress, finished_at: Instant) -> pb::ServerTiming {
        let t = &self.times;
        let at = |i: Option<Instant>| i.map_or(0, |i| ns(t.received, i));
        let admitted = p.admission.map(|a| a.admitted_at);
        pb::ServerTiming {
            tokenize_ns: ns(t.received, t.tokenized),
            enqueue_ns: ns(t.tokenized, t.enqueued),
            queue_wait_ns: admitted.map_or(0, |a| ns(t.enqueued, a)),
            prefill_to_first_token_ns: match (admitted, p.first_token) {
                (Some(a), Some(f)) => ns(a, f),
                _ => 0,
            },
            server_ttft_ns: at(p.first_token),
            decode_ns: match (p.first_token, p.last_token) {
                (Some(f), Some(l)) => ns(f, l),
                _ => 0,
            },
            total_ns: ns(t.received, finished_at),
            prefill_batch_size: p.admission.map_or(0, |a| a.prefill_batch_size),
            admitted_iteration: p.admission.map_or(0, |a| a.iteration),
            tokenized_at_ns: ns(t.received, t.tokenized),
            enqueued_at_ns: ns(t.received, t.enqueued),
            admitted_at_ns: at(admitted),
            first_token_at_ns: at(p.first_token),
            finished_at_ns: ns(t.received, finished_at),
            cached_prompt_tokens: p.admission.map_or(0, |a| a.cached_prompt_tokens),
            prefill_chunks: p.prefill_chunks,
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Parses a `grpc-timeout` header value: up to 8 digits and a unit
/// (H, M, S, m, u, n), per the gRPC over HTTP/2 spec.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_values() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("12x"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
    }
}
