//! `ember-server`: parse flags, set up logging, bind, print the address, run.
//!
//! All logic lives in the library (`ember_server::server::run`); this file only
//! deals with the process edges: flags, logs, signals, exit codes. Logging is
//! set up right after the flags parse, so every later failure (a bad flag
//! value, a port in use, a device that cannot start) is logged in the chosen
//! `--log-format` and exits with status 1.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use ember_server::cli::Args;
use ember_server::logging;
use tokio::net::TcpListener;

/// mimalloc keeps freed pages for reuse: the engine allocates multi-MB
/// intermediates every step, which glibc would hand back to the OS each time.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let args = Args::parse();
    logging::init(args.log_format, "info");
    if let Err(e) = run(args).await {
        tracing::error!("ember-server failed: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = args.validate()?;
    if config.prepare_cache {
        return ember_server::server::prepare_cache(config).await;
    }
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
