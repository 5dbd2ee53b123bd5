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
use std::time::Duration;

use clap::{Parser, ValueEnum};
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

/// Serve the mock Ember server (gRPC and OpenAI HTTP) with known timings.
#[derive(Debug, Clone, Parser)]
#[command(name = "loadgen mock")]
pub struct MockArgs {
    /// Address of the gRPC door (port 0 picks one).
    #[arg(long, env = "LOADGEN_MOCK_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Address of the OpenAI HTTP door (port 0 picks one).
    #[arg(long, env = "LOADGEN_MOCK_HTTP_LISTEN", default_value = "127.0.0.1:0")]
    pub http_listen: String,
    /// Which door's address is on the first stdout line (`listening on ADDR`).
    #[arg(long, env = "LOADGEN_MOCK_ANNOUNCE", value_enum, default_value_t = Announce::Grpc)]
    pub announce: Announce,
    /// Time to first token after admission, ms.
    #[arg(long, env = "LOADGEN_MOCK_TTFT_MS", default_value_t = 50.0)]
    pub ttft_ms: f64,
    /// Inter-token latency, ms.
    #[arg(long, env = "LOADGEN_MOCK_ITL_MS", default_value_t = 10.0)]
    pub itl_ms: f64,
    /// Requests generating at once; more wait in a queue (unset: no limit).
    #[arg(long, env = "LOADGEN_MOCK_SLOTS")]
    pub slots: Option<usize>,
    /// Require `authorization: Bearer KEY` on both doors.
    #[arg(long, env = "LOADGEN_MOCK_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// HTTP: leave out Ember's extension fields (a plain OpenAI server).
    #[arg(long, env = "LOADGEN_MOCK_NO_EMBER_FIELDS")]
    pub no_ember_fields: bool,
    /// HTTP: never send `usage` (the client must count chunks).
    #[arg(long, env = "LOADGEN_MOCK_NO_USAGE")]
    pub no_usage: bool,
}

/// Serves the mock until ctrl-c or SIGTERM.
pub async fn serve(args: MockArgs) -> Result<(), Error> {
    for (flag, v) in [("--ttft-ms", args.ttft_ms), ("--itl-ms", args.itl_ms)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(Error::invalid(flag, format!("must be >= 0 (got {v})")));
        }
    }
    if args.slots == Some(0) {
        return Err(Error::invalid("--slots", "must be >= 1"));
    }
    let cfg = MockConfig {
        ttft: Duration::from_secs_f64(args.ttft_ms / 1e3),
        itl: Duration::from_secs_f64(args.itl_ms / 1e3),
        slots: args.slots,
        api_key: args.api_key.clone(),
        ember_fields: !args.no_ember_fields,
        usage: !args.no_usage,
        ..MockConfig::default()
    };
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
