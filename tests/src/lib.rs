//! Test harness for Ember's end-to-end, fault and cross-machine tests.
//!
//! The tests in `tests/tests/*.rs` drive the *built* `ember-server` and
//! `loadgen` binaries over real sockets, the way users run them. This library
//! holds everything they share; `docs/testing.md` says what each test proves.
//!
//! Layout:
//! - [`bins`]: where the binaries under test are (`EMBER_SERVER_BIN`,
//!   `EMBER_LOADGEN_BIN`, else next to the test executable).
//! - [`process`]: a child process that prints `listening on ADDR` first, with
//!   stderr captured to a file, SIGTERM then SIGKILL on drop.
//! - [`server`]: start `ember-server` (port 0, tiny preset, CPU), wait for
//!   health SERVING, assert it is idle (0 KV blocks, 0 active) afterwards.
//! - [`blocker`]: one request that holds every KV block until released, so
//!   that other requests wait in the queue (speed-independent queueing).
//! - [`client`]: tonic client helpers: connect, run one `Generate` stream to
//!   its end, health checks, `GetServerInfo`.
//! - [`http`]: `ember-server` with its HTTP front door (both announced
//!   addresses, TLS certificates made with rcgen) and HTTP / OpenAI clients.
//! - [`loadgen`]: run `loadgen` and parse its `--json` summary and
//!   `--requests-out` lines.
//! - [`netns`]: a pair of network namespaces joined by a veth pair, made and
//!   removed by a test, and running async code inside one of them.
//! - [`relay`]: the delaying TCP relay (the `delay_relay` binary is a thin
//!   wrapper) that stands in for `netem`, which this kernel lacks.
//! - [`stats`]: medians and means for the tolerance checks.

pub mod bins;
pub mod blocker;
pub mod client;
pub mod http;
pub mod loadgen;
pub mod netns;
pub mod process;
pub mod relay;
pub mod server;
pub mod stats;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh directory for one test's files (server stderr, loadgen JSON),
/// unique per process and call: tests in one binary run in parallel threads.
pub fn scratch_dir(tag: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ember-tests-{}-{n}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A two-worker tokio runtime for a test that drives many client streams
/// from its own thread.
pub fn test_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the test's tokio runtime")
}

/// Removes a scratch dir once its owner is done, unless the thread is
/// panicking (a failed test keeps its files) or `EMBER_KEEP_SCRATCH=1`.
pub fn cleanup_scratch(dir: &std::path::Path) {
    if std::thread::panicking() || std::env::var("EMBER_KEEP_SCRATCH").as_deref() == Ok("1") {
        return;
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `make()`'s future to completion on a fresh current-thread runtime in a
/// new OS thread, optionally inside network namespace `netns`.
///
/// Callable from sync tests and from inside another runtime alike (it never
/// nests runtimes on one thread). The namespace is entered by the new thread
/// only (`setns` is per thread), so sockets it opens live in that namespace.
pub fn block_on<F, Fut, T>(netns: Option<&str>, make: F) -> anyhow::Result<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
    T: Send + 'static,
{
    let netns = netns.map(str::to_owned);
    std::thread::spawn(move || {
        if let Some(ns) = &netns {
            netns::enter(ns)?;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(make())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("block_on thread panicked"))?
}
