//! Polling a server: grpc.health.v1 `Check` until SERVING, and
//! `GetServerInfo` until a condition holds (e.g. idle: no KV blocks used,
//! nothing running or queued). One copy, used by loadgen's `--spawn-server`,
//! the server's in-process tests and the `ember-tests` helpers.

use std::time::Duration;

use ember_common::pb::inference_client::InferenceClient;
use ember_common::pb::{GetServerInfoRequest, ServerInfo};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// How often health and info are polled.
pub const POLL: Duration = Duration::from_millis(100);
/// How long one connection attempt or check may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// An endpoint for `target` (`http://host:port`) with [`CHECK_TIMEOUT`].
pub fn endpoint(target: &str) -> Result<Endpoint, String> {
    Endpoint::from_shared(target.to_string())
        .map(|e| e.connect_timeout(CHECK_TIMEOUT))
        .map_err(|e| format!("bad address {target}: {e}"))
}

/// One `Check(service)` on a fresh connection ("" = the whole server).
pub async fn check(endpoint: &Endpoint, service: &str) -> Result<ServingStatus, String> {
    let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    Ok(ServingStatus::try_from(reply.into_inner().status).unwrap_or(ServingStatus::Unknown))
}

/// Why [`wait_serving`] gave up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WaitError {
    /// The target is not a valid address.
    #[error("{0}")]
    BadTarget(String),
    /// The server process ended (the text from `gone()`).
    #[error("{why}; last health: {last}")]
    Gone {
        /// What `gone()` said.
        why: String,
        /// The last health answer.
        last: String,
    },
    /// The deadline passed.
    #[error("last health: {last}")]
    Timeout {
        /// The last health answer.
        last: String,
    },
}

/// Polls `Check` of every name in `services` until all are SERVING. Before
/// each poll `gone()` may report that the server process ended. Fails at
/// `deadline` with the last answer.
pub async fn wait_serving(
    target: &str,
    services: &[&str],
    deadline: Instant,
    mut gone: impl FnMut() -> Option<String>,
) -> Result<(), WaitError> {
    let endpoint = endpoint(target).map_err(WaitError::BadTarget)?;
    let mut last = String::from("no answer yet");
    loop {
        if let Some(why) = gone() {
            return Err(WaitError::Gone { why, last });
        }
        if Instant::now() >= deadline {
            return Err(WaitError::Timeout { last });
        }
        let mut all = true;
        for service in services {
            match tokio::time::timeout(CHECK_TIMEOUT, check(&endpoint, service)).await {
                Ok(Ok(ServingStatus::Serving)) => continue,
                Ok(Ok(other)) => last = format!("{service:?} {}", other.as_str_name()),
                Ok(Err(e)) => last = e,
                Err(_) => last = "health check timed out".to_string(),
            }
            all = false;
            break;
        }
        if all {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `GetServerInfo` over `channel` every `every` until `pred` holds;
/// fails at `deadline` with the last info seen.
pub async fn wait_info(
    channel: Channel,
    every: Duration,
    deadline: Instant,
    mut pred: impl FnMut(&ServerInfo) -> bool,
) -> Result<ServerInfo, String> {
    let mut client = InferenceClient::new(channel);
    loop {
        let info = client
            .get_server_info(GetServerInfoRequest {})
            .await
            .map_err(|s| format!("GetServerInfo: {s}"))?
            .into_inner();
        if pred(&info) {
            return Ok(info);
        }
        if Instant::now() >= deadline {
            return Err(format!("last info {info:?}"));
        }
        tokio::time::sleep(every).await;
    }
}

/// Idle: no KV block used, no sequence running, nothing queued.
pub fn is_idle(info: &ServerInfo) -> bool {
    info.kv_blocks_used == 0 && info.active_sequences == 0 && info.queue_depth == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::{self, MockConfig};

    #[tokio::test]
    async fn waits_for_serving_and_for_info() {
        let server = mock::start(MockConfig {
            health_delay: Duration::from_millis(300),
            ..MockConfig::default()
        })
        .await
        .expect("mock");
        let started = Instant::now();
        wait_serving(
            &server.url,
            &["", ember_common::SERVICE_NAME],
            started + Duration::from_secs(20),
            || None,
        )
        .await
        .expect("SERVING");
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "waited for the delay"
        );
        let gone = wait_serving(
            &server.url,
            &[""],
            Instant::now() + Duration::from_secs(5),
            || Some("exited".to_string()),
        )
        .await;
        assert!(matches!(gone, Err(WaitError::Gone { why, .. }) if why == "exited"));
        let never = wait_serving(
            "http://127.0.0.1:1",
            &[""],
            Instant::now() + Duration::from_millis(300),
            || None,
        )
        .await;
        assert!(matches!(never, Err(WaitError::Timeout { .. })), "{never:?}");
        let channel = endpoint(&server.url)
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let info = wait_info(
            channel,
            POLL,
            Instant::now() + Duration::from_secs(5),
            is_idle,
        )
        .await
        .expect("the mock is idle");
        assert_eq!(info.model, "mock");
        server.stop().await;
    }
}
