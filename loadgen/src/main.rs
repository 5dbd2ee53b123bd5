//! `loadgen`: parse the flags, log to stderr, run the benchmark, turn failed
//! requests into a non-zero exit (unless `--allow-errors`).

use anyhow::bail;
use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = ember_loadgen::Args::parse();
    let filter = EnvFilter::try_from_env("LOADGEN_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();

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
