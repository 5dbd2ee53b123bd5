//! Process logging: one `tracing` subscriber writing to stderr, set up once by
//! the binaries.
//!
//! - `--log-format text` (default): tracing-subscriber's human format, with
//!   ANSI colours only when stderr is a terminal (and `NO_COLOR` is unset), so
//!   log files, pipes and container logs get plain text.
//! - `--log-format json`: one JSON object per line (`timestamp`, `level`,
//!   `fields`, `target`, `span` with the current span's fields), for log
//!   shippers.
//! - Span close events are logged: the per-request span (see
//!   `service::request_span`) closes when the request is done, and that line
//!   carries its id, outcome and timings.
//! - Panics are logged through tracing too (with a backtrace when
//!   `RUST_BACKTRACE` asks for one), so a JSON log stays JSON even then; a
//!   panic inside `ember_engine::panics::expecting_panics` (a caller that
//!   handles it, such as the CUDA probe) is a warning, not an error.
//!
//! `RUST_LOG` filters what is printed (default: the level the binary asks
//! for); the [`AutotuneWatch`] layer beside the printer sees CubeCL's
//! autotune lines whatever it says.

use std::io::IsTerminal;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::autotune_watch::{self, AutotuneWatch};

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber and the panic hook. `default_level` applies
/// when `RUST_LOG` is unset or invalid.
pub fn init(format: LogFormat, default_level: &str) {
    // CubeCL's line per compiled kernel feeds the watch, not the output
    // (a first start compiles hundreds), unless RUST_LOG asks for it.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{default_level},cubecl::compilation=warn")));
    let watch = AutotuneWatch::new(autotune_watch::state().clone()).with_filter(LevelFilter::INFO);
    let printer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_span_events(FmtSpan::CLOSE);
    let registry = tracing_subscriber::registry().with(watch);
    match format {
        LogFormat::Text => registry
            .with(printer.with_ansi(use_colour()).with_filter(filter))
            .init(),
        LogFormat::Json => registry
            .with(
                printer
                    .json()
                    .with_ansi(false)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_filter(filter),
            )
            .init(),
    }
    std::panic::set_hook(Box::new(log_panic));
}

/// Colours only for a person at a terminal who has not opted out
/// (<https://no-color.org>: any non-empty `NO_COLOR`).
fn use_colour() -> bool {
    let opted_out = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    std::io::stderr().is_terminal() && !opted_out
}

fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    if ember_engine::panics::panics_expected() {
        tracing::warn!("panic (handled by its caller): {info}");
        return;
    }
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("unnamed");
    let backtrace = std::backtrace::Backtrace::capture();
    match backtrace.status() {
        std::backtrace::BacktraceStatus::Captured => {
            tracing::error!(thread, %backtrace, "panic: {info}")
        }
        _ => tracing::error!(thread, "panic: {info}"),
    }
}
