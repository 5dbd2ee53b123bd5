//! `loadgen`: parse the flags, log to stderr, run the benchmark, turn failed
//! requests into a non-zero exit (unless `--allow-errors`). `loadgen compare
//! [FLAGS]` runs several targets in turn; `loadgen calibrate [FLAGS]`
//! measures loadgen against its built-in mock server; `loadgen mock [FLAGS]`
//! serves that mock on its own.

use std::io::IsTerminal;

use anyhow::bail;
use clap::Parser;
use ember_loadgen::cli::calibrate::CalibrateArgs;
use ember_loadgen::cli::compare::CompareArgs;
use ember_loadgen::cli::mock::MockArgs;
use ember_loadgen::modes::limits;
use ember_loadgen::Outcome;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mode = match argv.get(1).and_then(|a| a.to_str()) {
        Some(m @ ("calibrate" | "mock" | "compare")) => Some(m.to_owned()),
        _ => None,
    };
    if let Some(m) = &mode {
        // `loadgen calibrate ...` parses as its own command (usage included).
        argv.remove(1);
        argv[0] = format!("loadgen {m}").into();
    }
    let filter = EnvFilter::try_from_env("LOADGEN_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal (never in a file or pipe), unless NO_COLOR.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_ansi(colour)
        .init();
    // Thousands of HTTP/1.1 streams need thousands of sockets.
    let open_files = limits::raise_open_files();
    tracing::debug!(?open_files, "open-file limit");

    let (outcome, allow_errors) = match mode.as_deref() {
        Some("calibrate") => {
            CalibrateArgs::parse_from(argv).run().await?;
            return Ok(());
        }
        Some("mock") => {
            MockArgs::parse_from(argv).serve().await?;
            return Ok(());
        }
        Some(_) => {
            let args = CompareArgs::parse_from(argv);
            let allow = args.base.allow_errors;
            (args.run().await?, allow)
        }
        None => {
            let args = ember_loadgen::Args::parse_from(argv);
            let allow = args.allow_errors;
            (args.run().await?, allow)
        }
    };
    exit_code(outcome, allow_errors)
}

/// Failed requests fail the command, unless `--allow-errors`.
fn exit_code(outcome: Outcome, allow_errors: bool) -> anyhow::Result<()> {
    if outcome.failed > 0 && !allow_errors {
        bail!(
            "{} of {} requests failed (counted by status under Errors); \
             pass --allow-errors to exit 0 anyway",
            outcome.failed,
            outcome.requests
        );
    }
    Ok(())
}
