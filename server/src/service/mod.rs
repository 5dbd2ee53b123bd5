//! The gRPC front: `ember.v1.Inference`.
//!
//! `Generate` runs, in the handler task: readiness/draining checks, request
//! validation ([`validate`]), tokenization on tokio's blocking pool (skipped for
//! `prompt_token_ids`), prompt checks, a pending-queue permit (or
//! RESOURCE_EXHAUSTED at once), then the submit to the scheduler. The response
//! stream is fed by a [`stream::RequestStream`] task, which turns tokens into
//! text ([`output`]: the detokenizer, then the stop strings of
//! [`stop_strings`]) and logprobs. Errors become statuses in one place
//! ([`error`]). Each call gets a tracing span ([`request_span`]) that follows
//! the request into the scheduler and the stream task.
//!
//! Handlers never touch the engine: they hold a [`SchedulerHandle`] and read
//! the [`ModelInfo`] published once the model is loaded.

mod ending;
pub mod error;
pub mod in_flight;
pub mod output;
pub mod stop_strings;
pub mod stream;
pub mod validate;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ember_common::pb::{self, inference_server::Inference};
use ember_common::tokenizer::Gpt2Tokenizer;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span};

use crate::scheduler::{ModelInfo, QueuedRequest, SchedulerHandle, SchedulerKnobs, SchedulerStats};
use ember_engine::SequenceRequest;
use error::ServiceError;
use in_flight::InFlightTracker;
use output::OutputText;
use stream::{OutMessage, Received, RequestStream};
use validate::PromptInput;

/// State shared by every handler.
#[derive(Debug)]
pub struct ServiceState {
    /// Set once when the scheduler reports the model loaded and warmed up.
    pub model: OnceLock<ModelInfo>,
    /// Set on SIGTERM/SIGINT: new requests get UNAVAILABLE.
    pub draining: AtomicBool,
    pub knobs: SchedulerKnobs,
    /// Tokens per KV block (`--block-size`), reported by `GetServerInfo`.
    pub block_size: usize,
    /// Whether the prefix cache is on, reported by `GetServerInfo`.
    pub prefix_caching: bool,
    pub tokenizer: Gpt2Tokenizer,
    /// Seed mixed into the seed of requests that set none.
    pub seed: u64,
    /// Accepted requests whose stream has not ended (the drain waits on it).
    pub in_flight: InFlightTracker,
}

#[derive(Debug, Clone)]
pub struct InferenceService {
    scheduler: SchedulerHandle,
    state: Arc<ServiceState>,
}

impl InferenceService {
    pub fn new(scheduler: SchedulerHandle, state: Arc<ServiceState>) -> Self {
        Self { scheduler, state }
    }

    async fn accept(
        &self,
        req: pb::GenerateRequest,
        received: Instant,
        deadline: Option<Instant>,
        span: &Span,
    ) -> Result<ReceiverStream<OutMessage>, ServiceError> {
        if self.state.draining.load(Ordering::Acquire) {
            return Err(ServiceError::Draining);
        }
        let model = self.state.model.get().ok_or(ServiceError::NotReady)?;
        let checked = validate::check_request(req, &self.state.knobs)?;
        validate::check_controls(&checked, model)?;
        let (prompt, field) = match checked.input {
            PromptInput::Ids(ids) => (ids, "prompt_token_ids"),
            PromptInput::Text(text) => {
                let tokenizer = self.state.tokenizer.clone();
                let ids = tokio::task::spawn_blocking(move || tokenizer.encode(&text))
                    .await
                    .map_err(|e| ServiceError::Tokenizer(e.to_string()))?
                    .map_err(|e| ServiceError::Tokenizer(e.to_string()))?;
                (ids, "prompt")
            }
        };
        validate::check_prompt(&prompt, field, checked.max_new_tokens, model)?;
        let tokenized = Instant::now();

        let permit = self.scheduler.reserve()?;
        let id = self.scheduler.next_id();
        let mut sampling = checked.sampling;
        if !checked.seed_given {
            // Reproducible per server seed and request number, distinct per request.
            sampling.seed = self.state.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        let request_id = if checked.request_id.is_empty() {
            format!("ember-{id}")
        } else {
            checked.request_id
        };
        let prompt_tokens = prompt.len() as u32;
        span.record("request_id", request_id.as_str());
        span.record("seq", id);
        span.record("prompt_tokens", prompt_tokens);
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let enqueued = Instant::now();
        let in_flight = self.state.in_flight.enter();
        self.scheduler.submit(QueuedRequest {
            seq: SequenceRequest {
                id,
                prompt,
                max_new_tokens: checked.max_new_tokens,
                ignore_eos: checked.ignore_eos,
                sampling,
                stop_token_ids: checked.stop_token_ids,
                logprobs: checked.logprobs,
            },
            enqueued_at: enqueued,
            events: events_tx,
            pending_permit: permit,
            span: span.clone(),
        })?;

        let (out_tx, out_rx) = mpsc::channel(stream::OUT_BUFFER);
        let task = RequestStream {
            id,
            request_id,
            prompt_tokens,
            times: Received {
                received,
                tokenized,
                enqueued,
                deadline,
            },
            events: events_rx,
            out: out_tx,
            output: OutputText::new(&self.state.tokenizer, checked.stop),
            tokenizer: self.state.tokenizer.clone(),
            scheduler: self.scheduler.clone(),
            span: span.clone(),
        };
        tokio::spawn(
            async move {
                task.run().await;
                drop(in_flight);
            }
            .instrument(span.clone()),
        );
        Ok(ReceiverStream::new(out_rx))
    }
}

/// One request's span, made when its `Generate` call arrives. Its fields are
/// filled in as they become known: `request_id`, `seq` (the scheduler's id)
/// and `prompt_tokens` once accepted; `rejected` and `error` if refused; and,
/// by the stream task at the end, `finish_reason`, `completion_tokens`,
/// `queue_wait_ms`, `ttft_ms` and `total_ms`. The scheduler enters it for its
/// lines about the request, and its close event (logged by `main`'s
/// subscriber) is the request's summary line.
fn request_span() -> Span {
    use tracing::field::Empty;
    tracing::info_span!(
        "request",
        request_id = Empty,
        seq = Empty,
        prompt_tokens = Empty,
        rejected = Empty,
        error = Empty,
        finish_reason = Empty,
        completion_tokens = Empty,
        queue_wait_ms = Empty,
        ttft_ms = Empty,
        total_ms = Empty,
    )
}

#[tonic::async_trait]
impl Inference for InferenceService {
    type GenerateStream = ReceiverStream<OutMessage>;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let received = Instant::now();
        let span = request_span();
        let stats = self.scheduler.stats();
        SchedulerStats::bump(&stats.received);
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(stream::parse_grpc_timeout)
            .map(|d| received + d);
        let req = request.into_inner();
        if !req.request_id.is_empty() && req.request_id.len() <= validate::MAX_REQUEST_ID_LEN {
            // Known now, so a rejected request's line carries it too.
            span.record("request_id", req.request_id.as_str());
        }
        let accepted = self
            .accept(req, received, deadline, &span)
            .instrument(span.clone())
            .await;
        match accepted {
            Ok(stream) => Ok(Response::new(stream)),
            Err(err) => {
                SchedulerStats::bump(&stats.rejected);
                crate::metrics::rejected(err.reason());
                span.record("rejected", err.reason());
                span.record("error", tracing::field::display(&err));
                Err(err.into())
            }
        }
    }

    async fn get_server_info(
        &self,
        _request: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::ServerInfo>, Status> {
        let s = self.scheduler.stats();
        let get = SchedulerStats::get;
        let k = &self.state.knobs;
        let mut info = pb::ServerInfo {
            knobs: Some(pb::SchedulerKnobs {
                max_batch_size: k.max_batch_size as u32,
                prefill_max_batch_size: k.prefill_max_batch_size as u32,
                prefill_max_tokens: k.prefill_max_tokens as u32,
                max_pending: k.max_pending as u32,
                block_size: self.state.block_size as u32,
                max_new_tokens_limit: k.max_new_tokens_limit as u32,
            }),
            queue_depth: get(&s.queue_depth) as u32,
            active_sequences: get(&s.active_sequences) as u32,
            kv_blocks_total: get(&s.kv_blocks_total) as u32,
            kv_blocks_used: get(&s.kv_blocks_used) as u32,
            counters: Some(pb::Counters {
                received: get(&s.received),
                admitted: get(&s.admitted),
                finished: get(&s.finished),
                cancelled: get(&s.cancelled),
                rejected: get(&s.rejected),
                failed: get(&s.failed),
                deadline_exceeded: get(&s.deadline_exceeded),
                scheduler_iterations: get(&s.iterations),
            }),
            version: env!("CARGO_PKG_VERSION").to_string(),
            prefix_cache_enabled: self.state.prefix_caching,
            prefix_cache_queried_tokens: get(&s.prefix_cache_queried_tokens),
            prefix_cache_hit_tokens: get(&s.prefix_cache_hit_tokens),
            ..Default::default()
        };
        if let Some(m) = self.state.model.get() {
            info.model = m.name.clone();
            info.device = m.device.clone();
            info.n_layer = m.config.n_layer as u32;
            info.n_head = m.config.n_head as u32;
            info.n_embd = m.config.n_embd as u32;
            info.n_positions = m.config.n_positions as u32;
            info.vocab_size = m.config.vocab_size as u32;
        }
        Ok(Response::new(info))
    }
}
