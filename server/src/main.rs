//! `ember-server`: parse flags, set up logging, bind, print the address, run.
//!
//! All logic lives in the library (`ember_server::server::run`); this file only
//! deals with the process edges: flags, logs, signals, exit codes.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use ember_server::cli::Args;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// mimalloc keeps freed pages for reuse: the engine allocates multi-MB
/// intermediates every step, which glibc would hand back to the OS each time.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = Args::parse().validate()?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("--listen {}: cannot bind", config.listen))?;
    let addr = listener.local_addr()?;
    // The first stdout line: tests and `loadgen --spawn-server` read it.
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {addr}")?;
    out.flush()?;
    drop(out);
    tracing::info!(%addr, "gRPC listening");
    ember_server::server::run(config, listener, shutdown_signal()).await
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}
