//! Test support: the mock server (now `ember_loadgen::mock`, shared with
//! `loadgen calibrate`) started for a test, and a runner for the `loadgen`
//! binary.
#![allow(dead_code)] // each test binary uses a different part

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub use ember_loadgen::mock::{MockConfig, MockServer};

/// Serves the mock on `addr` (use port 0).
pub async fn start_on(addr: &str, cfg: MockConfig) -> MockServer {
    ember_loadgen::mock::start_on(addr, cfg)
        .await
        .expect("start the mock server")
}

/// Serves the mock on 127.0.0.1 on a free port.
pub async fn start(cfg: MockConfig) -> MockServer {
    start_on("127.0.0.1:0", cfg).await
}

pub use ember_loadgen::harness::LoadgenRun;

/// A fresh directory for one run's files.
fn run_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let k = N.fetch_add(1, Ordering::SeqCst);
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("loadgen-{}-{k}", std::process::id()))
}

/// Runs the loadgen binary with `args` plus `--json` and `--requests-out`
/// (blocking the calling thread, so call it from `spawn_blocking`).
pub fn loadgen_blocking(args: &[String]) -> LoadgenRun {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_loadgen"));
    ember_loadgen::harness::run(&[], &bin, args, run_dir(), Duration::from_secs(300))
        .expect("run loadgen")
}

/// Runs loadgen from an async test without blocking the mock's runtime.
pub async fn loadgen(args: &[&str]) -> LoadgenRun {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || loadgen_blocking(&args))
        .await
        .expect("loadgen thread")
}

/// A u64 field of a JSON object.
pub fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a u64 in {v}"))
}

/// A f64 field reached by a path of keys.
pub fn f(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for k in path {
        cur = &cur[*k];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number"))
}

/// Percentile (nearest rank) of a non-empty slice.
pub fn pct(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}
