//! A mock Ember server with known timings, on two listeners: the gRPC API
//! ([`grpc`], the same proto as `ember-server`, with grpc.health.v1) and the
//! OpenAI-compatible HTTP API ([`http`], Ember's wire contract: SSE chunks
//! with the `ember` / `ember_timing` extension and `usage`). Both follow one
//! [`timeline`], so a request costs the same through either door.
//!
//! `loadgen mock` serves it on its own, `loadgen calibrate` in-process (or as
//! a child), and the tests of loadgen and of the other crates use it as a
//! stand-in server. Knobs a test needs: a submit delay, failures (every k-th
//! request rejected; an engine failure after k tokens), slow health, a slot
//! limit (queueing), an API key both doors require, TLS on both doors, and
//! an HTTP door that behaves like a plain OpenAI server (no Ember fields, no
//! usage). Both keep a prefix cache of the prompts they saw (`prefix`),
//! reported as `cached_prompt_tokens` and on the HTTP door's `/metrics`.

mod chunks;
pub mod config;
pub mod grpc;
pub mod http;
mod prefix;
pub mod timeline;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use crate::mock::config::{MockConfig, TlsIdentity};
use crate::mock::timeline::Shared;

/// A running mock server (both doors).
#[derive(Debug)]
pub struct MockServer {
    /// Where the gRPC door listens.
    pub addr: SocketAddr,
    /// `http://addr` (`https://` with TLS): loadgen's `--target`.
    pub url: String,
    /// Where the HTTP door listens.
    pub http_addr: SocketAddr,
    /// `http://http_addr` (`https://` with TLS): loadgen's `--base-url`.
    pub http_url: String,
    /// Requests received so far, both doors.
    pub received: Arc<AtomicUsize>,
    /// Stops the gRPC door.
    grpc_stop: Option<oneshot::Sender<()>>,
    /// Stops the HTTP door.
    http_stop: Option<oneshot::Sender<()>>,
    /// The two server tasks.
    joins: Vec<JoinHandle<()>>,
}

/// Serves the mock's gRPC door on `grpc_addr` and its HTTP door on
/// `http_addr` (port 0 picks one) until the returned server is stopped.
pub async fn start_on(
    grpc_addr: &str,
    http_addr: &str,
    cfg: MockConfig,
) -> std::io::Result<MockServer> {
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    let grpc_listener = tokio::net::TcpListener::bind(grpc_addr).await?;
    let http_listener = tokio::net::TcpListener::bind(http_addr).await?;
    let (addr, http_addr) = (grpc_listener.local_addr()?, http_listener.local_addr()?);
    let shared = Arc::new(Shared::new(cfg));
    let received = shared.received.clone();
    let (grpc_tx, grpc_rx) = oneshot::channel::<()>();
    let (http_tx, http_rx) = oneshot::channel::<()>();
    let grpc_join = crate::mock::grpc::spawn(grpc_listener, shared.clone(), grpc_rx).await?;
    let http_join = crate::mock::http::spawn(http_listener, shared, http_rx)?;
    Ok(MockServer {
        addr,
        url: format!("{scheme}://{addr}"),
        http_addr,
        http_url: format!("{scheme}://{http_addr}"),
        received,
        grpc_stop: Some(grpc_tx),
        http_stop: Some(http_tx),
        joins: vec![grpc_join, http_join],
    })
}

/// Serves the mock on 127.0.0.1, both doors on free ports.
pub async fn start(cfg: MockConfig) -> std::io::Result<MockServer> {
    start_on("127.0.0.1:0", "127.0.0.1:0", cfg).await
}

impl MockServer {
    /// Stops both doors and joins their tasks.
    pub async fn stop(mut self) {
        for tx in [self.grpc_stop.take(), self.http_stop.take()]
            .into_iter()
            .flatten()
        {
            // The server task may already be gone; nothing to stop then.
            let _ = tx.send(());
        }
        for join in self.joins.drain(..) {
            let _ = join.await;
        }
    }
}
