//! What travels between the service and the scheduler thread.
//!
//! A [`Command`] goes in over the command channel (a [`QueuedRequest`] to
//! queue, a cancel); [`Event`]s come back
//! on the request's own channel, in order: `Admitted`, `Prefilled`, every
//! token, then exactly one terminal event ([`Event::Finished`] or
//! [`Event::Failed`]); a request can end after any of them. Times are `Instant`s on the server's monotonic clock; the
//! service turns them into offsets from the request's `received` instant.

use std::time::Instant;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use ember_engine::{SeqId, SequenceRequest, TokenLogprobs};

/// A validated, tokenized request on its way into the pending queue.
#[derive(Debug)]
pub struct QueuedRequest {
    /// What the engine runs: the scheduler-wide sequence id (also the
    /// engine's), the prompt's token ids, the length, sampling and the stop
    /// token ids (stop *strings* stay with the service, which matches them on
    /// the text it produces), logprobs.
    pub seq: SequenceRequest,
    /// Lower is served first (`--scheduling-policy priority`; 0 under fcfs).
    pub priority: i32,
    /// Admit only once this sequence has computed its prompt (the other
    /// choices of an `n` > 1 request follow the first, whose prompt blocks
    /// they then take from the prefix cache instead of computing them).
    pub follows: Option<SeqId>,
    /// When the service handed the request to the scheduler.
    pub enqueued_at: Instant,
    /// Where this request's events go. A closed channel means the client left.
    pub events: mpsc::UnboundedSender<Event>,
    /// A place in the bounded pending queue; dropped at admission (or when the
    /// request leaves the queue any other way), which frees the place.
    pub pending_permit: OwnedSemaphorePermit,
    /// The request's tracing span (made by the gRPC handler): the scheduler
    /// enters it for its log lines about this request.
    pub span: tracing::Span,
}

impl QueuedRequest {
    /// The request's sequence id.
    pub fn id(&self) -> SeqId {
        self.seq.id
    }
}

/// Why a request ended early at the client's or the server's initiative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The client dropped the stream (disconnect, cancelled call).
    ClientGone,
    /// The request's grpc-timeout passed.
    DeadlineExceeded,
    /// The server's shutdown timeout passed.
    Shutdown,
    /// The stream task matched one of the request's stop strings: the request
    /// is done (counted as finished, not cancelled); only its blocks and its
    /// place in the batch are left to free.
    StopString,
}

/// How a finished request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishKind {
    Eos,
    Length,
    /// The sequence sampled this stop token id (not emitted).
    StopToken(u32),
    Cancelled,
    /// Its output constraint (`response_format`) could not be honoured: the
    /// client gets an error, never a normal stop.
    ConstraintFailed,
}

/// The part of a request's timeline only the scheduler sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// When the scheduler took the request out of the pending queue.
    pub admitted_at: Instant,
    /// Requests admitted in the same iteration (into the same prefill step).
    pub prefill_batch_size: u32,
    /// Scheduler iteration of the admission.
    pub iteration: u64,
    /// Leading prompt tokens found in the prefix cache (not computed).
    pub cached_prompt_tokens: u32,
}

/// Events of one request, in stream order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The request left the pending queue into a prefill batch.
    Admitted(Admission),
    /// The whole prompt is in the KV cache; the first token follows. `chunks`
    /// is how many prefill steps computed it (1 unless it was chunked).
    Prefilled { chunks: u32 },
    /// Logprobs of prompt tokens `first ..` (the request's
    /// `prompt_logprobs`), as a prefill step computed them; the pieces come
    /// in order, before the first token.
    PromptLogprobs {
        first: usize,
        logprobs: Vec<TokenLogprobs>,
    },
    /// The request was preempted at `at` (its blocks freed to let others
    /// run): it waits, is admitted again and recomputes its prompt and
    /// tokens so far, then its next `Token` follows. The stream sees no gap
    /// in the indices; the time from here to that token is lost.
    Preempted { at: Instant },
    /// Generated token `index` (0-based), sampled at `at`.
    Token {
        index: u32,
        token_id: u32,
        at: Instant,
        /// Set when the request asked for logprobs.
        logprobs: Option<TokenLogprobs>,
    },
    /// The request is done (possibly without ever being admitted).
    Finished {
        kind: FinishKind,
        completion_tokens: u32,
    },
    /// The engine failed on a batch holding this request.
    Failed { message: String },
}

/// Commands the scheduler thread accepts.
#[derive(Debug)]
pub enum Command {
    /// Queue a request (it holds a pending-queue permit).
    Submit(Box<QueuedRequest>),
    /// Take a request out, queued or running, and free its blocks.
    Cancel { id: SeqId, reason: CancelReason },
    /// Server shutdown timeout: cancel everything queued and running.
    CancelAll,
}
