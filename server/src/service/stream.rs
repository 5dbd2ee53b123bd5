//! One request's response stream: scheduler events in, proto messages out.
//!
//! A task per request reads the events the scheduler sends, detokenizes and
//! matches stop strings ([`super::output`]), stamps server times (offsets from
//! `received`) and feeds a small bounded channel that a front door streams to
//! the client: tonic as it is, the HTTP door translated into OpenAI's chunks.
//! The proto messages (`Started`, `Token`, `Finished`) are the one internal
//! vocabulary of a request's events; an end without `Finished` is a
//! [`StreamError`]. It is also where the request's end is noticed:
//! - the client leaves: the front door drops the response stream,
//!   `out.closed()` fires, and the task sends `Cancel(ClientGone)` (the
//!   request may still be queued);
//! - the deadline passes (grpc-timeout, or x-request-timeout on HTTP): the
//!   task sends `Cancel(DeadlineExceeded)` and ends the stream with
//!   [`StreamError::DeadlineExceeded`];
//! - a stop string matches: the task sends `Cancel(StopString)` so the
//!   scheduler frees the sequence at once, sends the completing token (with
//!   the text before the match) and `Finished(STOP)` without waiting.
//!
//! Metrics are recorded here, off the scheduler thread, and the request's
//! outcome and timings are recorded on its tracing span; how each end is
//! labelled is in [`super::ending`].

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use ember_common::pb::{self, generate_response::Event as PbEvent};
use ember_common::tokenizer::Gpt2Tokenizer;
use tokio::sync::mpsc;

use super::ending::{End, Ending};
use super::error::StreamError;
use super::output::{top_logprobs, OutputText};
use super::stop_strings::Released;
use crate::metrics::{self, FinishedReason, FrontDoor};
use crate::scheduler::{Admission, CancelReason, Event, FinishKind, SchedulerHandle};
use ember_engine::{SeqId, TokenLogprobs};

/// Messages buffered between this task and the front door. Small: tokens
/// should reach the socket as they come, and a slow client backs up into the
/// (bounded by max_new_tokens) scheduler channel, never into the scheduler
/// thread.
pub const OUT_BUFFER: usize = 16;

/// One item of a request's response stream.
pub type StreamItem = Result<pb::GenerateResponse, StreamError>;

/// How close to its deadline a client that disconnects counts as having
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
    pub out: mpsc::Sender<StreamItem>,
    /// The door the request came in through (metrics).
    pub door: FrontDoor,
    /// Detokenizer and stop strings: the text of each token.
    pub output: OutputText,
    /// For the text of logprob alternatives.
    pub tokenizer: Gpt2Tokenizer,
    pub scheduler: SchedulerHandle,
    /// The request's tracing span (made by the handler); its close event is
    /// the request's log line.
    pub span: tracing::Span,
    /// Which choice of the request this sequence is (`n` > 1: several
    /// tasks feed one stream, each tagging its messages).
    pub choice: u32,
    /// Whether this task sends the stream's `Started` (the first choice's).
    pub sends_started: bool,
    /// The prompt's token ids, kept when the request asked for its prompt
    /// logprobs (each message names its tokens).
    pub prompt_ids: Option<Vec<u32>>,
}

/// What happened to a request so far, for the final timing.
#[derive(Debug, Default)]
struct Progress {
    admission: Option<Admission>,
    /// Prefill steps of the prompt, once it is all in the cache.
    prefill_chunks: u32,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// Tokens received from the scheduler.
    tokens: u32,
    /// Times the request was preempted, the time lost to it so far (each
    /// preemption to the next token), and the latest preemption while it
    /// has not been made up yet.
    preemptions: u32,
    preempted: Duration,
    preempted_at: Option<Instant>,
    /// The timing sent in the `Finished` message, if one was sent.
    timing: Option<pb::ServerTiming>,
}

impl Progress {
    /// Token `at` arrived: per-token metrics and the first/last instants.
    fn token(&mut self, at: Instant, times: &Received) {
        match self.last_token {
            None => {
                self.first_token = Some(at);
                let prefill = self.admission.map(|a| at - a.admitted_at);
                metrics::first_token(at - times.received, prefill);
            }
            Some(prev) => metrics::next_token(at - prev),
        }
        self.last_token = Some(at);
        self.tokens += 1;
        if let Some(p) = self.preempted_at.take() {
            self.preempted += at.saturating_duration_since(p);
        }
    }

    /// Time lost to preemptions by `now` (one still pending counts to `now`).
    fn preempted_by(&self, now: Instant) -> Duration {
        self.preempted
            + self
                .preempted_at
                .map_or(Duration::ZERO, |p| now.saturating_duration_since(p))
    }
}

fn ns(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_nanos() as u64
}

impl RequestStream {
    /// Streams the request to its end, then records its metrics and the
    /// timings on its span (whose close event is the request's log line).
    pub async fn run(mut self) {
        let mut progress = Progress::default();
        let end = self.stream(&mut progress).await;
        let timing = progress
            .timing
            .take()
            .unwrap_or_else(|| self.timing(&progress, Instant::now()));
        let (label, reason) = end.labels();
        let timing_if_done = matches!(end, End::Finished(_)).then_some(&timing);
        metrics::finished(
            reason,
            self.door,
            timing_if_done,
            self.prompt_tokens,
            progress.tokens,
        );
        if reason == FinishedReason::Abort {
            metrics::aborted(if matches!(end, End::Deadline) {
                "deadline"
            } else {
                "cancelled"
            });
        }
        self.record_on_span(label, &progress, &timing);
    }

    async fn stream(&mut self, progress: &mut Progress) -> End {
        let started = pb::Started {
            request_id: self.request_id.clone(),
            prompt_tokens: self.prompt_tokens,
            server_time_ns: ns(self.times.received, self.times.enqueued),
        };
        if self.sends_started && self.send(PbEvent::Started(started)).await.is_err() {
            return End::ClientGone;
        }
        loop {
            let event = tokio::select! {
                biased;
                _ = self.out.closed() => {
                    self.scheduler.cancel(self.id, self.why_gone());
                    return End::ClientGone;
                }
                _ = sleep_until_opt(self.times.deadline) => {
                    self.scheduler.cancel(self.id, CancelReason::DeadlineExceeded);
                    let stage = if progress.admission.is_some() { "running" } else { "queued" };
                    let _ = self.out.send(Err(StreamError::DeadlineExceeded { stage })).await;
                    return End::Deadline;
                }
                event = self.events.recv() => event,
            };
            match event {
                Some(Event::Admitted(a)) => {
                    metrics::admitted(a.admitted_at - self.times.enqueued, self.prompt_tokens);
                    progress.admission = Some(a);
                }
                Some(Event::Prefilled { chunks }) => progress.prefill_chunks = chunks,
                Some(Event::PromptLogprobs { first, logprobs }) => {
                    let msg = self.prompt_logprobs(first, &logprobs);
                    if self.send(PbEvent::PromptLogprobs(msg)).await.is_err() {
                        return End::ClientGone;
                    }
                }
                Some(Event::Preempted { at }) => {
                    progress.preemptions += 1;
                    progress.preempted_at = Some(at);
                }
                Some(Event::Token {
                    index,
                    token_id,
                    at,
                    logprobs,
                }) => {
                    progress.token(at, &self.times);
                    let sent = self.send_token(progress, index, token_id, at, logprobs);
                    if let ControlFlow::Break(end) = sent.await {
                        return end;
                    }
                }
                Some(Event::Finished {
                    kind: FinishKind::ConstraintFailed,
                    ..
                }) => {
                    let _ = self.out.send(Err(StreamError::ConstraintFailed)).await;
                    return End::Failed;
                }
                Some(Event::Finished {
                    kind,
                    completion_tokens,
                }) => {
                    let mut ending = Ending::of(kind);
                    let trailing_text = match self.output.finish() {
                        Released::Text(text) => text,
                        // Only the detokenizer's last bytes can complete a
                        // stop string this late.
                        Released::Stopped { text, stop } => {
                            ending = Ending::stop_string(stop);
                            text
                        }
                    };
                    return self
                        .finish(progress, ending, completion_tokens, trailing_text)
                        .await;
                }
                Some(Event::Failed { message }) => {
                    let _ = self.out.send(Err(StreamError::EngineFailed(message))).await;
                    return End::Failed;
                }
                None => {
                    let _ = self.out.send(Err(StreamError::SchedulerStopped)).await;
                    return End::SchedulerGone;
                }
            }
        }
    }

    /// Sends one token with its text and logprobs. Breaks when the stream
    /// ended: the client left, or the token completed a stop string (then it
    /// is the last token, and `Finished(STOP)` follows it).
    async fn send_token(
        &mut self,
        progress: &mut Progress,
        index: u32,
        token_id: u32,
        at: Instant,
        logprobs: Option<TokenLogprobs>,
    ) -> ControlFlow<End> {
        let (text, stop) = match self.output.push(token_id) {
            Released::Text(text) => (text, None),
            Released::Stopped { text, stop } => {
                // The sequence leaves the batch before its next step and its
                // blocks are freed (counted as finished).
                self.scheduler.cancel(self.id, CancelReason::StopString);
                (text, Some(stop))
            }
        };
        let token = pb::Token {
            index,
            token_id,
            text,
            server_time_ns: ns(self.times.received, at),
            logprob: logprobs.as_ref().map(|lp| lp.logprob),
            top_logprobs: logprobs
                .as_ref()
                .map(|lp| top_logprobs(&self.tokenizer, lp))
                .unwrap_or_default(),
            choice: self.choice,
        };
        if self.send(PbEvent::Token(token)).await.is_err() {
            return ControlFlow::Break(End::ClientGone);
        }
        match stop {
            Some(stop) => {
                let ending = Ending::stop_string(stop);
                let end = self.finish(progress, ending, index + 1, String::new());
                ControlFlow::Break(end.await)
            }
            None => ControlFlow::Continue(()),
        }
    }

    /// Sends the final message; its timing is kept for the request's
    /// metrics and span.
    async fn finish(
        &mut self,
        progress: &mut Progress,
        ending: Ending,
        completion_tokens: u32,
        trailing_text: String,
    ) -> End {
        let timing = self.timing(progress, Instant::now());
        let finished = pb::Finished {
            request_id: self.request_id.clone(),
            finish_reason: ending.reason as i32,
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
            timing: Some(timing),
            stop: ending.stop,
            trailing_text,
            choice: self.choice,
        };
        progress.timing = Some(timing);
        let _ = self.send(PbEvent::Finished(finished)).await;
        End::Finished(ending.labels)
    }

    /// The request's outcome on its span: the span's close event (one log
    /// line per request) carries them. Stages that never happened stay unset.
    fn record_on_span(&self, finish_reason: &str, p: &Progress, t: &pb::ServerTiming) {
        let ms = |ns: u64| ns as f64 / 1e6;
        let span = &self.span;
        span.record("finish_reason", finish_reason);
        span.record("completion_tokens", p.tokens);
        if p.admission.is_some() {
            span.record("queue_wait_ms", ms(t.queue_wait_ns));
        }
        if p.first_token.is_some() {
            span.record("ttft_ms", ms(t.server_ttft_ns));
        }
        span.record("total_ms", ms(t.total_ns));
        if p.preemptions > 0 {
            span.record("preemptions", p.preemptions);
            span.record("preempted_ms", ms(t.preempted_ns));
        }
    }

    /// The message of prompt tokens `first ..` and their logprobs.
    fn prompt_logprobs(&self, first: usize, logprobs: &[TokenLogprobs]) -> pb::PromptLogprobs {
        let ids = self.prompt_ids.as_deref().unwrap_or_default();
        pb::PromptLogprobs {
            first: first as u32,
            tokens: logprobs
                .iter()
                .enumerate()
                .map(|(i, lp)| pb::PromptTokenLogprob {
                    token_id: ids.get(first + i).copied().unwrap_or_default(),
                    logprob: lp.logprob,
                    top_logprobs: top_logprobs(&self.tokenizer, lp),
                })
                .collect(),
            choice: self.choice,
            first_token_id: ids.first().copied().unwrap_or_default(),
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

    /// Why the client left. Clients enforce their own deadline too (gRPC's
    /// always do), and theirs started earlier (before the request crossed the
    /// network), so a client that leaves within [`DEADLINE_SLACK`] of the
    /// deadline left because of it.
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
            preemptions: p.preemptions,
            preempted_ns: p.preempted_by(finished_at).as_nanos() as u64,
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
