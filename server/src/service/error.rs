//! The one place where errors become gRPC statuses.
//!
//! Validation -> INVALID_ARGUMENT (the message starts with the field name),
//! queue full -> RESOURCE_EXHAUSTED, loading/draining -> UNAVAILABLE, grpc-timeout
//! -> DEADLINE_EXCEEDED, engine failure -> INTERNAL.

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
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::QueueFull(_) => Code::ResourceExhausted,
            Self::NotReady | Self::Draining | Self::SchedulerGone(_) => Code::Unavailable,
            Self::Tokenizer(_) => Code::Internal,
        }
    }
}

impl From<ServiceError> for Status {
    fn from(err: ServiceError) -> Self {
        Status::new(err.code(), err.to_string())
    }
}

/// Status for a request whose grpc-timeout passed.
pub fn deadline_exceeded(stage: &str) -> Status {
    Status::deadline_exceeded(format!("grpc-timeout passed while the request was {stage}"))
}

/// Status for a request the engine failed.
pub fn engine_failed(message: &str) -> Status {
    Status::internal(format!("engine failure: {message}"))
}
