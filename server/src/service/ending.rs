//! How a request's stream ends, and how that end is labelled.
//!
//! [`Ending`] is a finish that sends `Finished` (EOS, length, a stop token id
//! or stop string, or cancelled on the scheduler's side); [`End`] is any end
//! of the stream task. Each end has a `finish_reason` for the request's log
//! line and a vLLM `finished_reason` for the metrics: EOS and every STOP
//! finish are `stop`, `max_new_tokens` is `length`, a client gone, a
//! grpc-timeout or a scheduler that stopped are `abort`, an engine failure is
//! `error`.

use ember_common::pb::{self, stop_match::Matched};

use crate::metrics::FinishedReason;
use crate::scheduler::FinishKind;

/// How a finished request is labelled: `finish_reason` in its log line, and
/// vLLM's `finished_reason`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Labels {
    pub log: &'static str,
    pub metric: FinishedReason,
}

/// How a stream finishes: the proto reason, its labels, the stop match.
#[derive(Debug)]
pub(super) struct Ending {
    pub reason: pb::FinishReason,
    pub labels: Labels,
    pub stop: Option<pb::StopMatch>,
}

impl Ending {
    pub fn of(kind: FinishKind) -> Self {
        use FinishedReason as R;
        let (reason, log, metric, stop) = match kind {
            FinishKind::Eos => (pb::FinishReason::Eos, "eos", R::Stop, None),
            FinishKind::Length => (pb::FinishReason::Length, "length", R::Length, None),
            FinishKind::StopToken(id) => (
                pb::FinishReason::Stop,
                "stop",
                R::Stop,
                Some(Matched::TokenId(id)),
            ),
            FinishKind::Cancelled => (pb::FinishReason::Cancelled, "cancelled", R::Abort, None),
            // The stream task ends such a request with an error instead (it
            // never sends `Finished`); labelled for completeness.
            FinishKind::ConstraintFailed => (
                pb::FinishReason::Unspecified,
                "constraint_failed",
                R::Error,
                None,
            ),
        };
        Self {
            reason,
            labels: Labels { log, metric },
            stop: stop.map(|m| pb::StopMatch { matched: Some(m) }),
        }
    }

    pub fn stop_string(stop: String) -> Self {
        Self {
            reason: pb::FinishReason::Stop,
            labels: Labels {
                log: "stop",
                metric: FinishedReason::Stop,
            },
            stop: Some(pb::StopMatch {
                matched: Some(Matched::Stop(stop)),
            }),
        }
    }
}

/// How a stream ended.
#[derive(Debug)]
pub(super) enum End {
    /// `Finished` was sent (or the client left while it was): EOS, length,
    /// stop token or string, or cancelled on the scheduler's side.
    Finished(Labels),
    /// The client left (the stream was dropped).
    ClientGone,
    /// Its grpc-timeout passed.
    Deadline,
    /// The engine failed its batch.
    Failed,
    /// The scheduler dropped it without a final event: it stopped.
    SchedulerGone,
}

impl End {
    /// `finish_reason` in the request's log line, and vLLM's label for it.
    pub fn labels(&self) -> (&'static str, FinishedReason) {
        match self {
            End::Finished(l) => (l.log, l.metric),
            End::ClientGone => ("cancelled", FinishedReason::Abort),
            End::Deadline => ("deadline", FinishedReason::Abort),
            End::Failed => ("error", FinishedReason::Error),
            End::SchedulerGone => ("scheduler_stopped", FinishedReason::Abort),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(ending: Ending) -> (&'static str, FinishedReason) {
        End::Finished(ending.labels).labels()
    }

    #[test]
    fn stop_finishes_are_vllm_stop() {
        let token = Ending::of(FinishKind::StopToken(7));
        assert_eq!(token.reason, pb::FinishReason::Stop);
        assert_eq!(
            token.stop.as_ref().and_then(|s| s.matched.clone()),
            Some(Matched::TokenId(7))
        );
        assert_eq!(labels(token), ("stop", FinishedReason::Stop));
        let string = Ending::stop_string("\n\n".into());
        assert_eq!(string.reason, pb::FinishReason::Stop);
        assert_eq!(labels(string), ("stop", FinishedReason::Stop));
        assert_eq!(
            labels(Ending::of(FinishKind::Eos)),
            ("eos", FinishedReason::Stop)
        );
    }

    #[test]
    fn other_ends() {
        let length = Ending::of(FinishKind::Length);
        assert_eq!(labels(length), ("length", FinishedReason::Length));
        let cancelled = Ending::of(FinishKind::Cancelled);
        assert_eq!(labels(cancelled), ("cancelled", FinishedReason::Abort));
        assert_eq!(
            End::ClientGone.labels(),
            ("cancelled", FinishedReason::Abort)
        );
        assert_eq!(End::Deadline.labels(), ("deadline", FinishedReason::Abort));
        assert_eq!(End::Failed.labels(), ("error", FinishedReason::Error));
        assert_eq!(
            End::SchedulerGone.labels(),
            ("scheduler_stopped", FinishedReason::Abort)
        );
    }
}
