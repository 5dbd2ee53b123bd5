//! The one place where errors get their status.
//!
//! Validation -> INVALID_ARGUMENT (the message starts with the field name),
//! queue full -> RESOURCE_EXHAUSTED, loading/draining -> UNAVAILABLE, a passed
//! deadline -> DEADLINE_EXCEEDED, engine failure -> INTERNAL, a missing or
//! wrong API key -> UNAUTHENTICATED, an unknown model (HTTP's `model`
//! field) -> NOT_FOUND. The HTTP front door derives its status
//! from the same gRPC code (`http::error`), so both doors map every error the
//! same way.
//!
//! [`ServiceError`] refuses a request before it is queued; [`StreamError`]
//! ends a stream that had started. Neither knows which door the request came
//! in through: each door words its deadline in its own header's name.

use std::borrow::Cow;

use tonic::{Code, Status};

use crate::scheduler::{QueueFull, SchedulerGone};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A request field has a value the server cannot take.
    #[error("{field}: {message}")]
    InvalidArgument {
        /// The field as the client spells it, indexed for list entries (`stop[3]`).
        field: Cow<'static, str>,
        message: String,
    },
    #[error(transparent)]
    QueueFull(#[from] QueueFull),
    #[error("the model is still loading; retry when health reports SERVING")]
    NotReady,
    #[error("the server is shutting down and admits no new requests")]
    Draining,
    #[error("the scheduler stopped")]
    SchedulerGone(#[from] SchedulerGone),
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
    /// The request named a model this server does not serve (HTTP `model`).
    #[error("the model {asked:?} does not exist: this server serves {served:?}")]
    ModelNotFound { asked: String, served: String },
}

impl ServiceError {
    pub fn invalid(field: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Short label for the rejected-requests metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidArgument { .. } => "invalid_argument",
            Self::QueueFull(_) => "queue_full",
            Self::NotReady => "not_ready",
            Self::Draining => "draining",
            Self::SchedulerGone(_) => "scheduler_gone",
            Self::Tokenizer(_) => "tokenizer",
            Self::ModelNotFound { .. } => "model_not_found",
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::QueueFull(_) => Code::ResourceExhausted,
            Self::NotReady | Self::Draining | Self::SchedulerGone(_) => Code::Unavailable,
            Self::Tokenizer(_) => Code::Internal,
            Self::ModelNotFound { .. } => Code::NotFound,
        }
    }
}

impl From<ServiceError> for Status {
    fn from(err: ServiceError) -> Self {
        Status::new(err.code(), err.to_string())
    }
}

/// Why a started stream ended without `Finished`. The client leaving is not
/// here: nobody is left to tell.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The request's deadline passed while it was `stage` (queued, running).
    #[error("the request's deadline passed while it was {stage}")]
    DeadlineExceeded { stage: &'static str },
    /// The engine failed the batch holding the request.
    #[error("engine failure: {0}")]
    EngineFailed(String),
    /// The request's `response_format` could not be honoured: its grammar
    /// allowed no token the model can emit, or failed (the server's log has
    /// the detail).
    #[error("response_format: the output could not be kept to the requested format (its grammar allowed no token the model can emit, or failed)")]
    ConstraintFailed,
    /// The scheduler dropped the request without a final event: it stopped.
    #[error("the scheduler stopped")]
    SchedulerStopped,
}

impl StreamError {
    pub fn code(&self) -> Code {
        match self {
            Self::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            Self::EngineFailed(_) | Self::ConstraintFailed => Code::Internal,
            Self::SchedulerStopped => Code::Unavailable,
        }
    }

    /// The message, with the deadline named as the client set it
    /// (`grpc-timeout`, `x-request-timeout`).
    pub fn message(&self, deadline_header: &str) -> String {
        match self {
            Self::DeadlineExceeded { stage } => {
                format!("{deadline_header} passed while the request was {stage}")
            }
            other => other.to_string(),
        }
    }

    /// Short label (the `code` of an HTTP error body).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::DeadlineExceeded { .. } => "deadline_exceeded",
            Self::EngineFailed(_) => "engine_failure",
            Self::ConstraintFailed => "constraint_failed",
            Self::SchedulerStopped => "scheduler_gone",
        }
    }

    /// The gRPC status ending the stream.
    pub fn to_status(&self) -> Status {
        Status::new(self.code(), self.message("grpc-timeout"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_errors_keep_their_grpc_wording() {
        let deadline = StreamError::DeadlineExceeded { stage: "queued" };
        let status = deadline.to_status();
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(
            status.message(),
            "grpc-timeout passed while the request was queued"
        );
        assert_eq!(
            deadline.message("x-request-timeout"),
            "x-request-timeout passed while the request was queued"
        );
        let failed = StreamError::EngineFailed("boom".into()).to_status();
        assert_eq!(
            (failed.code(), failed.message()),
            (Code::Internal, "engine failure: boom")
        );
        assert_eq!(
            StreamError::SchedulerStopped.to_status().code(),
            Code::Unavailable
        );
    }
}
