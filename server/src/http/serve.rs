//! The HTTP listener: accept, TLS (when configured), HTTP/1.1 or HTTP/2 per
//! connection (ALPN, or the preface on plain TCP), and a graceful stop.
//!
//! Each connection gets its own task; a TLS handshake happens there, with a
//! time limit, so a slow or silent client never holds up the accept loop.
//! When `shutdown` resolves (the server has already drained: every accepted
//! request has finished or been cancelled) the listener closes, idle
//! connections are closed, and connections still writing a response get
//! [`CLOSE_TIMEOUT`] to finish it; then the rest are dropped.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's headers (HTTP/1.1).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connections get to finish after the listener stops.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` resolves, then stops as
/// described above.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    // The connection tasks, so none outlives the server (each holds the
    // router, and through it the scheduler handle).
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors, a connection reset before accept:
                // wait a little instead of spinning.
                tracing::warn!(error = %e, "HTTP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let router = router.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            match tls {
                None => serve_connection(stream, router, watcher).await,
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls_stream)) => serve_connection(tls_stream, router, watcher).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("HTTP listener stopped"),
        _ = tokio::time::sleep(CLOSE_TIMEOUT) => {
            tracing::warn!(timeout = ?CLOSE_TIMEOUT, "HTTP connections still open after the close timeout; dropping them");
        }
    }
    connections.shutdown().await;
}

/// One connection, HTTP/1.1 or HTTP/2, until it closes or the server stops.
async fn serve_connection<I>(io: I, router: Router, watcher: Watcher)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let service = TowerToHyperService::new(router);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}
