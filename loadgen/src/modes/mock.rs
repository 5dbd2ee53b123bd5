//! `loadgen mock`: serves the mock server (`ember_testkit::mock`) on its own,
//! both doors: Ember's gRPC API and the OpenAI HTTP API, on one timeline
//! (TTFT, then a token every ITL; with `--slots N` a queue in front). For
//! trying loadgen's flags without a model, and as `loadgen calibrate
//! --mock-process`'s child.
//!
//! stdout: first `listening on ADDR` for the door `--announce` names (what
//! `ember_testkit::child` reads), then `grpc listening on ADDR` and
//! `http listening on ADDR` for both. Stops on SIGTERM or ctrl-c.

use std::io::Write;

use clap::ValueEnum;
use ember_testkit::mock::{self, MockConfig};

use crate::error::Error;

/// Which door's address goes on the first stdout line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Announce {
    /// The gRPC door (`--listen`).
    Grpc,
    /// The HTTP door (`--http-listen`).
    Http,
}

/// What `loadgen mock` serves (built by `cli::mock`).
#[derive(Debug, Clone)]
pub struct MockServe {
    /// Address of the gRPC door.
    pub listen: String,
    /// Address of the OpenAI HTTP door.
    pub http_listen: String,
    /// Which door's address is on the first stdout line.
    pub announce: Announce,
    /// What the mock does with each request.
    pub mock: MockConfig,
}

/// Serves the mock until ctrl-c or SIGTERM.
pub async fn serve(args: MockServe) -> Result<(), Error> {
    let cfg = args.mock.clone();
    let server = mock::start_on(&args.listen, &args.http_listen, cfg)
        .await
        .map_err(|e| {
            Error::Internal(format!(
                "cannot serve the mock on {} and {}: {e}",
                args.listen, args.http_listen
            ))
        })?;
    let first = match args.announce {
        Announce::Grpc => server.addr,
        Announce::Http => server.http_addr,
    };
    // A parent may read the first line and close the pipe: the other lines
    // are for people, so a closed stdout is not an error here.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {first}")
        .and_then(|()| writeln!(out, "grpc listening on {}", server.addr))
        .and_then(|()| writeln!(out, "http listening on {}", server.http_addr))
        .and_then(|()| out.flush());
    drop(out);
    stop_signal().await;
    server.stop().await;
    Ok(())
}

/// ctrl-c, or SIGTERM on Unix.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
