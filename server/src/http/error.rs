//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
//!
//! The HTTP status comes from the gRPC code the service already gave the
//! error ([`http_status`]): one mapping for both doors (400 invalid, 401 no
//! key, 404 unknown model, 429 queue full, 503 loading or draining, 504
//! deadline, 500 engine failure). The validator names fields as the gRPC
//! request spells them; [`FieldNames`] renames them to what this request
//! sent (`max_new_tokens` -> `max_tokens`, `sampling.top_p` -> `top_p`,
//! `prompt` -> `messages` for chat), in `param` and at the head of the
//! message.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tonic::Code;

use super::app::DEADLINE_HEADER;
use super::fields::BODY;
use crate::service::auth::AuthError;
use crate::service::error::{ServiceError, StreamError};

/// HTTP status of a gRPC code, for the codes the service uses.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::Internal | Code::Unknown | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// OpenAI's error `type` for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400..=404 | 413 => "invalid_request_error",
        429 => "rate_limit_error",
        504 => "timeout_error",
        _ => "server_error",
    }
}

/// How this request's fields are called, for renaming the validator's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldNames {
    /// Where the prompt came from: `prompt`, or `messages` for chat.
    pub prompt: &'static str,
    /// `max_tokens` or `max_completion_tokens` (what the client sent; the
    /// prompt field when it sent neither and the limit was derived).
    pub max_tokens: &'static str,
    /// `logprobs` (completions) or `top_logprobs` (chat).
    pub logprobs: &'static str,
    /// `stop` came as one string: `stop[0]` is `stop`.
    pub stop_as_string: bool,
}

impl FieldNames {
    /// The name of the validator's `field` in this request.
    pub fn rename(&self, field: &str) -> String {
        match field {
            "prompt" | "prompt_token_ids" => self.prompt.into(),
            "max_new_tokens" => self.max_tokens.into(),
            "logprobs" => self.logprobs.into(),
            "request_id" => "x-request-id".into(),
            "stop[0]" if self.stop_as_string => "stop".into(),
            other => other.strip_prefix("sampling.").unwrap_or(other).into(),
        }
    }
}

/// An error response.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpError {
    pub status: StatusCode,
    pub message: String,
    /// The offending field, if one.
    pub param: Option<String>,
    /// A short machine-readable label (`queue_full`, `invalid_api_key`, ...).
    pub code: Option<&'static str>,
}

impl HttpError {
    /// A refusal from the service (or from the translation, whose field
    /// names are already this request's).
    pub fn from_service(err: &ServiceError, names: Option<&FieldNames>) -> Self {
        let status = http_status(err.code());
        match err {
            ServiceError::InvalidArgument { field, message } => {
                let param = names.map_or_else(|| field.to_string(), |n| n.rename(field));
                let message = match names {
                    // Messages quote the gRPC field name when they explain a limit.
                    Some(n) => message.replace("max_new_tokens", n.max_tokens),
                    None => message.clone(),
                };
                Self {
                    status,
                    message: format!("{param}: {message}"),
                    param: (param != BODY).then_some(param),
                    code: None,
                }
            }
            ServiceError::ModelNotFound { .. } => Self {
                status,
                message: err.to_string(),
                param: Some("model".into()),
                code: Some("model_not_found"),
            },
            other => Self {
                status,
                message: other.to_string(),
                param: None,
                code: Some(other.reason()),
            },
        }
    }

    /// A stream that ended without finishing.
    pub fn from_stream(err: &StreamError) -> Self {
        Self {
            status: http_status(err.code()),
            message: err.message(DEADLINE_HEADER),
            param: None,
            code: Some(err.reason()),
        }
    }

    /// No or a wrong API key.
    pub fn unauthorized(err: AuthError) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: err.to_string(),
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// A path no route serves.
    pub fn no_route(method: &str, path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("no route for {method} {path}"),
            param: None,
            code: Some("not_found"),
        }
    }

    /// `{"error": {...}}`.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": error_type(self.status),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::QueueFull;

    const COMPLETIONS: FieldNames = FieldNames {
        prompt: "prompt",
        max_tokens: "max_tokens",
        logprobs: "logprobs",
        stop_as_string: false,
    };

    #[test]
    fn service_errors_map_to_the_same_statuses_as_grpc() {
        let cases = [
            (ServiceError::invalid("x", "bad"), 400, None),
            (
                ServiceError::QueueFull(QueueFull(4)),
                429,
                Some("queue_full"),
            ),
            (ServiceError::Draining, 503, Some("draining")),
            (ServiceError::NotReady, 503, Some("not_ready")),
            (ServiceError::Tokenizer("x".into()), 500, Some("tokenizer")),
            (
                ServiceError::ModelNotFound {
                    asked: "gpt5".into(),
                    served: "tiny".into(),
                },
                404,
                Some("model_not_found"),
            ),
        ];
        for (err, status, code) in cases {
            let e = HttpError::from_service(&err, None);
            assert_eq!((e.status.as_u16(), e.code), (status, code), "{err}");
        }
        let deadline = HttpError::from_stream(&StreamError::DeadlineExceeded { stage: "running" });
        assert_eq!(deadline.status.as_u16(), 504);
        assert_eq!(
            deadline.message,
            "x-request-timeout passed while the request was running"
        );
        assert_eq!(deadline.body()["error"]["type"], "timeout_error");
        let failed = HttpError::from_stream(&StreamError::EngineFailed("oom".into()));
        assert_eq!(failed.status.as_u16(), 500);
    }

    #[test]
    fn validator_fields_are_renamed_to_the_requests_own() {
        let chat = FieldNames {
            prompt: "messages",
            max_tokens: "max_completion_tokens",
            logprobs: "top_logprobs",
            stop_as_string: true,
        };
        for (field, completions, chat_name) in [
            ("prompt", "prompt", "messages"),
            ("prompt_token_ids", "prompt", "messages"),
            ("max_new_tokens", "max_tokens", "max_completion_tokens"),
            ("sampling.temperature", "temperature", "temperature"),
            ("sampling.top_p", "top_p", "top_p"),
            ("sampling.top_k", "top_k", "top_k"),
            ("stop[0]", "stop[0]", "stop"),
            ("stop[2]", "stop[2]", "stop[2]"),
            (
                "stop_token_ids[1]",
                "stop_token_ids[1]",
                "stop_token_ids[1]",
            ),
            ("logprobs", "logprobs", "top_logprobs"),
            ("request_id", "x-request-id", "x-request-id"),
        ] {
            assert_eq!(COMPLETIONS.rename(field), completions);
            assert_eq!(chat.rename(field), chat_name);
        }
        let err = ServiceError::invalid(
            "max_new_tokens",
            "prompt (5 tokens) + max_new_tokens (2000) exceeds the model's context of 1024 tokens",
        );
        let e = HttpError::from_service(&err, Some(&COMPLETIONS));
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(
            e.message,
            "max_tokens: prompt (5 tokens) + max_tokens (2000) exceeds the model's context of 1024 tokens"
        );
    }

    #[test]
    fn the_body_is_openais_shape() {
        let e = HttpError::from_service(
            &ServiceError::invalid("sampling.top_p", "must be in (0, 1], got 2"),
            Some(&COMPLETIONS),
        );
        assert_eq!(
            e.body(),
            json!({"error": {
                "message": "top_p: must be in (0, 1], got 2",
                "type": "invalid_request_error",
                "param": "top_p",
                "code": null
            }})
        );
        let body = HttpError::from_service(&ServiceError::invalid(BODY, "not valid JSON"), None);
        assert_eq!(body.param, None);
        let unauthorized = HttpError::unauthorized(AuthError::Invalid).into_response();
        assert_eq!(unauthorized.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(unauthorized.headers()[header::WWW_AUTHENTICATE], "Bearer");
    }
}
