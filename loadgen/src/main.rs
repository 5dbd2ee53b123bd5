//! `loadgen`: parse the flags, log to stderr, run the benchmark, turn failed
//! requests into a non-zero exit (unless `--allow-errors`). `loadgen calibrate
//! [FLAGS]` measures loadgen against its built-in mock server instead;
//! `loadgen mock [FLAGS]` serves that mock on its own.

use std::io::IsTerminal;

use anyhow::bail;
use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mode = match argv.get(1).and_then(|a| a.to_str()) {
        Some(m @ ("calibrate" | "mock")) => Some(m.to_owned()),
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

    match mode.as_deref() {
        Some("calibrate") => {
            let cal = ember_loadgen::calibrate::CalibrateArgs::parse_from(argv);
            ember_loadgen::calibrate::run(cal).await?;
            return Ok(());
        }
        Some(_) => {
            let mock = ember_loadgen::mock::MockArgs::parse_from(argv);
            ember_loadgen::mock::serve(mock).await?;
            return Ok(());
        }
        None => {}
    }
    let args = ember_loadgen::Args::parse_from(argv);
    let allow_errors = args.allow_errors;
    let outcome = ember_loadgen::run(args).await?;
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
