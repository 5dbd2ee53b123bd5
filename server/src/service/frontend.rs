//! The one request path behind both front doors.
//!
//! [`Frontend::generate`] takes a `GenerateRequest` (the gRPC door passes the
//! client's; the HTTP door translates OpenAI's JSON into one), and runs, in
//! the caller's task: readiness/draining checks, validation
//! ([`super::validate`]), tokenization on tokio's blocking pool (skipped for
//! `prompt_token_ids`), prompt checks, a pending-queue permit (or
//! RESOURCE_EXHAUSTED at once), the submit to the scheduler; then it spawns
//! the request's [`RequestStream`] task and returns its event stream. A
//! refusal is counted (`received`, `rejected`, the metrics) and recorded on
//! the request's span here, once, whichever door it came through. The doors
//! only translate: the request in, the stream items and errors out.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use ember_common::pb;
use tracing::{Instrument, Span};

use super::arrival::{request_span, Arrival, EventStream};
use super::error::ServiceError;
use super::state::ServiceState;
use super::structured;
use super::submit::{submit, Accepted};
use super::validate::{self, PromptInput};
use crate::metrics::{self, FrontDoor};
use crate::scheduler::{SchedulerHandle, SchedulerStats};

/// Options a door may set beyond the request's own fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenerateOptions {
    /// `max_new_tokens` is an upper bound: once the prompt is tokenized it is
    /// lowered to what fits the model's context and the KV cache (OpenAI's
    /// chat API generates up to the context when no limit is given).
    pub fit_to_context: bool,
    /// The choice index of the request's first sequence (the HTTP door's
    /// prompt lists number each prompt's choices on from the previous).
    pub first_choice: u32,
}

/// What both front doors hold: the scheduler handle and the shared state.
#[derive(Debug, Clone)]
pub struct Frontend {
    scheduler: SchedulerHandle,
    state: Arc<ServiceState>,
}

impl Frontend {
    pub fn new(scheduler: SchedulerHandle, state: Arc<ServiceState>) -> Self {
        Self { scheduler, state }
    }

    pub fn state(&self) -> &ServiceState {
        &self.state
    }

    pub fn scheduler(&self) -> &SchedulerHandle {
        &self.scheduler
    }

    /// Loaded, warmed up and not draining: what health reports as SERVING.
    pub fn is_serving(&self) -> bool {
        self.state.model.get().is_some() && !self.state.draining.load(Ordering::Acquire)
    }

    /// Validates, tokenizes and enqueues `req`; returns its event stream, or
    /// why it was refused (counted and recorded on its span).
    pub async fn generate(
        &self,
        req: pb::GenerateRequest,
        options: GenerateOptions,
        arrival: Arrival,
    ) -> Result<EventStream, ServiceError> {
        let span = request_span(arrival.door);
        let stats = self.scheduler.stats();
        SchedulerStats::bump(&stats.received);
        if !req.request_id.is_empty() && req.request_id.len() <= validate::MAX_REQUEST_ID_LEN {
            // Known now, so a rejected request's line carries it too.
            span.record("request_id", req.request_id.as_str());
        }
        let accepted = self
            .accept(req, options, arrival, &span)
            .instrument(span.clone())
            .await;
        if let Err(err) = &accepted {
            self.record_refusal(&span, err, arrival.door);
        }
        accepted
    }

    /// Counts and logs a request a door refused before it could call
    /// [`Self::generate`] (its translation failed: a wrong type, an
    /// unsupported field, an unknown model), exactly as `generate` counts
    /// its own refusals: `received`, `rejected`, the metrics, one log line.
    pub fn refuse(&self, err: &ServiceError, door: FrontDoor, request_id: Option<&str>) {
        let span = request_span(door);
        if let Some(id) = request_id.filter(|id| id.len() <= validate::MAX_REQUEST_ID_LEN) {
            span.record("request_id", id);
        }
        SchedulerStats::bump(&self.scheduler.stats().received);
        self.record_refusal(&span, err, door);
    }

    fn record_refusal(&self, span: &Span, err: &ServiceError, door: FrontDoor) {
        SchedulerStats::bump(&self.scheduler.stats().rejected);
        metrics::rejected(err.reason(), door);
        span.record("rejected", err.reason());
        span.record("error", tracing::field::display(err));
    }

    /// The prompt's token ids (text tokenized on tokio's blocking pool) and
    /// the field they came from, for error messages.
    async fn tokenize(&self, input: PromptInput) -> Result<(Vec<u32>, &'static str), ServiceError> {
        match input {
            PromptInput::Ids(ids) => Ok((ids, "prompt_token_ids")),
            PromptInput::Text(text) => {
                let tokenizer = self.state.tokenizer.clone();
                let ids = tokio::task::spawn_blocking(move || tokenizer.encode(&text))
                    .await
                    .map_err(|e| ServiceError::Tokenizer(e.to_string()))?
                    .map_err(|e| ServiceError::Tokenizer(e.to_string()))?;
                Ok((ids, "prompt"))
            }
        }
    }

    async fn accept(
        &self,
        req: pb::GenerateRequest,
        options: GenerateOptions,
        arrival: Arrival,
        span: &Span,
    ) -> Result<EventStream, ServiceError> {
        if self.state.draining.load(Ordering::Acquire) {
            return Err(ServiceError::Draining);
        }
        let model = self.state.model.get().ok_or(ServiceError::NotReady)?;
        let mut checked = validate::check_request(req, &self.state.knobs)?;
        let input = std::mem::replace(&mut checked.input, PromptInput::Ids(Vec::new()));
        let (prompt, field) = self.tokenize(input).await?;
        let stop = &mut checked.params.stop;
        if options.fit_to_context {
            stop.max_new_tokens = fit_to_context(
                prompt.len(),
                stop.max_new_tokens,
                model.limits.context,
                model.limits.kv_blocks_total * model.limits.block_size,
            );
        }
        validate::check_params(&checked.params, model, &self.state.knobs)?;
        validate::check_prompt(&prompt, field, checked.params.stop.max_new_tokens, model)?;
        let tokenized = Instant::now();
        let tokens = structured::ModelTokens {
            eos: model.config.eos_token_id,
            vocab_size: model.limits.vocab_size,
        };
        let (format, n) = (&checked.response_format, checked.n as usize);
        let constraints = structured::constraints(format, n, &self.state.tokenizer, tokens).await?;
        let accepted = Accepted {
            checked,
            prompt,
            tokenized,
            arrival,
            first_choice: options.first_choice,
            constraints,
        };
        submit(&self.scheduler, &self.state, accepted, span)
    }
}

/// The most new tokens a prompt of `prompt_len` tokens leaves room for, up
/// to `max_new_tokens`: the model's `context` and the KV cache's
/// `kv_tokens` bound prompt + generation. At least 1, so a prompt that
/// leaves no room is refused by the prompt checks, naming it.
pub fn fit_to_context(
    prompt_len: usize,
    max_new_tokens: usize,
    context: usize,
    kv_tokens: usize,
) -> usize {
    let room = context.min(kv_tokens).saturating_sub(prompt_len);
    max_new_tokens.min(room).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_to_context_leaves_room_for_the_prompt() {
        // Room in the context: the cap stays.
        assert_eq!(fit_to_context(10, 100, 1024, 4096), 100);
        // The context is the bound.
        assert_eq!(fit_to_context(1000, 100, 1024, 4096), 24);
        // The KV cache is the bound.
        assert_eq!(fit_to_context(10, 1000, 1024, 256), 246);
        // No room at all: 1, which the prompt checks then refuse.
        assert_eq!(fit_to_context(1024, 100, 1024, 4096), 1);
        assert_eq!(fit_to_context(2000, 100, 1024, 4096), 1);
    }
}
