//! How a request arrived, and what it becomes: [`Arrival`] (its door, its
//! t = 0, its deadline), its response stream ([`EventStream`]) and its
//! tracing span ([`request_span`]). Below the frontend and the submit that
//! both use them.

use std::time::Instant;

use tokio_stream::wrappers::ReceiverStream;
use tracing::Span;

use super::stream::StreamItem;
use crate::metrics::FrontDoor;

/// A request's response stream: `Started`, `Token`s, then `Finished`, or a
/// [`super::error::StreamError`]. Dropping it cancels the request.
pub type EventStream = ReceiverStream<StreamItem>;

/// How a request arrived.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// Which front door it came through (metrics, the log line).
    pub door: FrontDoor,
    /// When the door's handler was entered (t = 0 of the server timeline).
    pub received: Instant,
    /// When the request must be over (grpc-timeout, x-request-timeout).
    pub deadline: Option<Instant>,
}

impl Arrival {
    /// A request entering `door` now, with no deadline.
    pub fn now(door: FrontDoor) -> Self {
        Self {
            door,
            received: Instant::now(),
            deadline: None,
        }
    }
}

/// One request's span, made when it arrives at either door. Its fields are
/// filled in as they become known: `front_door` at once; `request_id`, `seq`
/// (the scheduler's id) and `prompt_tokens` once accepted; `rejected` and
/// `error` if refused; and, by the stream task at the end, `finish_reason`,
/// `completion_tokens`, `queue_wait_ms`, `ttft_ms`, `total_ms` and, for a
/// request that was preempted, `preemptions` and `preempted_ms`. The
/// scheduler enters it for its lines about the request, and its close event
/// (logged by `main`'s subscriber) is the request's summary line.
pub fn request_span(door: FrontDoor) -> Span {
    use tracing::field::Empty;
    tracing::info_span!(
        "request",
        front_door = door.label(),
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
        preemptions = Empty,
        preempted_ms = Empty,
        choice = Empty,
    )
}
