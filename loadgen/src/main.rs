//! `loadgen`: parse the flags, log to stderr, run the benchmark, turn failed
//! requests into a non-zero exit (unless `--allow-errors`). `loadgen calibrate
//! [FLAGS]` measures loadgen against its built-in mock server instead.

use anyhow::bail;
use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let calibrate = argv.get(1).is_some_and(|a| a == "calibrate");
    if calibrate {
        argv.remove(1);
    }
    let filter = EnvFilter::try_from_env("LOADGEN_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();

    if calibrate {
        let cal = ember_loadgen::calibrate::CalibrateArgs::parse_from(argv);
        ember_loadgen::calibrate::run(cal).await?;
        return Ok(());
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
