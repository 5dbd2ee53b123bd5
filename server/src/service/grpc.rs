//! The gRPC front door: `ember.v1.Inference`.
//!
//! `Generate` only translates: the `grpc-timeout` header becomes the
//! request's deadline, the request goes to [`Frontend::generate`] as it is,
//! and the stream's errors become statuses ([`StreamError::to_status`]).
//! `GetServerInfo` reads the scheduler's live counters; `Tokenize` and
//! `Detokenize` are [`super::tokens`]. The API key check, if
//! any, is an interceptor in front of this service ([`super::auth`]).

use std::pin::Pin;
use std::time::{Duration, Instant};

use ember_common::pb::{self, inference_server::Inference};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::arrival::Arrival;
use super::error::StreamError;
use super::frontend::{Frontend, GenerateOptions};
use super::tokens;
use crate::metrics::FrontDoor;
use crate::scheduler::SchedulerStats;

/// The gRPC response stream: the request's events, errors as statuses.
pub type GrpcStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateResponse, Status>> + Send>>;

#[derive(Debug, Clone)]
pub struct InferenceService {
    frontend: Frontend,
}

impl InferenceService {
    pub fn new(frontend: Frontend) -> Self {
        Self { frontend }
    }
}

#[tonic::async_trait]
impl Inference for InferenceService {
    type GenerateStream = GrpcStream;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let received = Instant::now();
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map(|d| received + d);
        let arrival = Arrival {
            door: FrontDoor::Grpc,
            received,
            deadline,
        };
        let events = self
            .frontend
            .generate(request.into_inner(), GenerateOptions::default(), arrival)
            .await?;
        let stream = events.map(|item| item.map_err(|e: StreamError| e.to_status()));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_server_info(
        &self,
        _request: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::ServerInfo>, Status> {
        let s = self.frontend.scheduler().stats();
        let get = SchedulerStats::get;
        let state = self.frontend.state();
        let k = &state.knobs;
        let mut info = pb::ServerInfo {
            knobs: Some(pb::SchedulerKnobs {
                max_batch_size: k.max_batch_size as u32,
                prefill_max_batch_size: k.prefill_max_batch_size as u32,
                prefill_max_tokens: k.prefill_max_tokens as u32,
                max_pending: k.max_pending as u32,
                block_size: state.block_size as u32,
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
                preemptions: get(&s.preemptions),
            }),
            version: env!("CARGO_PKG_VERSION").to_string(),
            prefix_cache_enabled: state.prefix_caching,
            prefix_cache_queried_tokens: get(&s.prefix_cache_queried_tokens),
            prefix_cache_hit_tokens: get(&s.prefix_cache_hit_tokens),
            ..Default::default()
        };
        if let Some(m) = state.model.get() {
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

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        tokens::grpc_tokenize(self.frontend.state(), request).await
    }

    async fn detokenize(
        &self,
        request: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        tokens::grpc_detokenize(self.frontend.state(), request)
    }
}

/// Parses a `grpc-timeout` header value: up to 8 digits and a unit
/// (H, M, S, m, u, n), per the gRPC over HTTP/2 spec.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_values() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("12x"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
    }
}
