//! Handing an accepted request to the scheduler: one sequence per choice
//! (`n`), each with its pending-queue permit, its seed (the request's + its
//! index, so each choice is reproducible) and its stream task, all feeding
//! one response stream.
//!
//! The first choice is the leader: it alone sends `Started` and computes the
//! prompt logprobs; the others follow it (`QueuedRequest::follows`): the
//! scheduler admits them once the leader has computed the prompt, whose KV
//! blocks they then take from the prefix cache. The permits are taken all or
//! none (RESOURCE_EXHAUSTED names the queue either way). Every choice has its
//! own span (its own log line, with its `choice`); the first is the
//! request's.

use std::time::Instant;

use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{Instrument, Span};

use super::arrival::{request_span, Arrival, EventStream};
use super::error::ServiceError;
use super::output::OutputText;
use super::state::ServiceState;
use super::stream::{self, Received, RequestStream};
use super::validate::CheckedRequest;
use crate::scheduler::{QueuedRequest, SchedulerHandle};
use ember_engine::{SeqId, SequenceRequest, SharedConstraint};

/// What [`submit`] hands to the scheduler: the checked request, its prompt,
/// when it was tokenized, how it arrived, and the choice index of its first
/// sequence (the HTTP door's prompt lists number their choices on).
pub struct Accepted {
    pub checked: CheckedRequest,
    pub prompt: Vec<u32>,
    pub tokenized: Instant,
    pub arrival: Arrival,
    pub first_choice: u32,
    /// Each choice's structured-output constraint (`None` for free text).
    pub constraints: Vec<Option<SharedConstraint>>,
}

/// Queues every choice of `a` and spawns their stream tasks (module docs).
pub fn submit(
    scheduler: &SchedulerHandle,
    state: &ServiceState,
    a: Accepted,
    span: &Span,
) -> Result<EventStream, ServiceError> {
    let c = &a.checked;
    let n = c.n.max(1);
    let permits = (0..n)
        .map(|_| scheduler.reserve())
        .collect::<Result<Vec<OwnedSemaphorePermit>, _>>()?;
    let ids: Vec<SeqId> = (0..n).map(|_| scheduler.next_id()).collect();
    // Unset: reproducible per server seed and request number, distinct per
    // request.
    let seed = c
        .params
        .sampling
        .seed
        .unwrap_or_else(|| state.seed ^ ids[0].wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let request_id = if c.request_id.is_empty() {
        let made = format!("ember-{}", ids[0]);
        // (A client's id was recorded on arrival: twice prints it twice.)
        span.record("request_id", made.as_str());
        made
    } else {
        c.request_id.clone()
    };
    let prompt_tokens = a.prompt.len() as u32;
    span.record("seq", ids[0]);
    span.record("prompt_tokens", prompt_tokens);
    let (out, out_rx) = mpsc::channel(stream::OUT_BUFFER);
    let shared = Shared {
        scheduler,
        state,
        a: &a,
        leader: ids[0],
        seed,
        request_id: &request_id,
        out: &out,
    };
    for (j, (id, permit)) in ids.iter().copied().zip(permits).enumerate() {
        let choice_span = if j == 0 {
            span.clone()
        } else {
            let s = request_span(a.arrival.door);
            s.record("request_id", request_id.as_str());
            s.record("seq", id);
            s.record("prompt_tokens", prompt_tokens);
            s
        };
        shared.choice(j as u32, id, permit, choice_span)?;
    }
    Ok(ReceiverStream::new(out_rx))
}

/// What every choice of one request shares.
struct Shared<'a> {
    scheduler: &'a SchedulerHandle,
    state: &'a ServiceState,
    a: &'a Accepted,
    /// The first choice's sequence id (the others follow it).
    leader: SeqId,
    /// The request's seed (choice `j` samples with `seed + j`).
    seed: u64,
    request_id: &'a str,
    out: &'a mpsc::Sender<stream::StreamItem>,
}

impl Shared<'_> {
    /// Queues choice `j` as sequence `id` and spawns its stream task.
    fn choice(
        &self,
        j: u32,
        id: SeqId,
        permit: OwnedSemaphorePermit,
        span: Span,
    ) -> Result<(), ServiceError> {
        let (a, c) = (self.a, &self.a.checked);
        let leader = j == 0;
        let choice = a.first_choice + j;
        span.record("choice", choice);
        let mut params = c.params.clone();
        params.sampling.seed = Some(self.seed.wrapping_add(u64::from(j)));
        params.constraint = a.constraints.get(j as usize).cloned().flatten();
        params.outputs.prompt_logprobs = params.outputs.prompt_logprobs.filter(|_| leader);
        let prompt_logprobs = params.outputs.prompt_logprobs.is_some();
        let seq = SequenceRequest {
            id,
            prompt: a.prompt.clone(),
            params,
            resume: None,
        };
        let (events_tx, events) = mpsc::unbounded_channel();
        let enqueued = Instant::now();
        // Counted until the stream task ends (or the submit fails): the
        // shutdown drain waits for the count to reach zero.
        let in_flight = self.state.in_flight.enter();
        self.scheduler.submit(QueuedRequest {
            seq,
            priority: c.priority,
            follows: (!leader).then_some(self.leader),
            enqueued_at: enqueued,
            events: events_tx,
            pending_permit: permit,
            span: span.clone(),
        })?;
        let task = RequestStream {
            id,
            request_id: self.request_id.to_string(),
            prompt_tokens: a.prompt.len() as u32,
            times: Received {
                received: a.arrival.received,
                tokenized: a.tokenized,
                enqueued,
                deadline: a.arrival.deadline,
            },
            events,
            out: self.out.clone(),
            door: a.arrival.door,
            output: OutputText::new(&self.state.tokenizer, c.params.stop.stop_strings.clone()),
            tokenizer: self.state.tokenizer.clone(),
            scheduler: self.scheduler.clone(),
            span: span.clone(),
            choice,
            sends_started: leader,
            prompt_ids: prompt_logprobs.then(|| a.prompt.clone()),
        };
        tokio::spawn(
            async move {
                task.run().await;
                drop(in_flight);
            }
            .instrument(span),
        );
        Ok(())
    }
}
