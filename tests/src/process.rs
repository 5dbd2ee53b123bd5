//! A child process that announces its address on its first stdout line.
//!
//! The implementation is `ember_testkit::child::Announced` (one copy, shared
//! with `loadgen --spawn-server`): it spawns the program (optionally inside a
//! network namespace with `ip netns exec`), reads its `listening on ADDR` line
//! with a timeout, keeps draining stdout, and on drop sends SIGTERM, waits a
//! little, then SIGKILL; when the test is panicking, the drop prints the
//! stderr tail. Here: the tests' defaults (stderr to a file, `RUST_LOG=info`
//! unless set).

use std::path::Path;
use std::time::Duration;

pub use ember_testkit::child::Announced;
use ember_testkit::child::{ChildSpec, StderrTo};

/// Spawns `program args...` (inside `netns` if given) with stderr in
/// `stderr_path`, and waits up to `timeout` for its `listening on ADDR` line.
pub fn spawn(
    name: &str,
    program: &Path,
    args: &[String],
    netns: Option<&str>,
    stderr_path: &Path,
    timeout: Duration,
) -> anyhow::Result<Announced> {
    // No NO_COLOR: the server turns colours off by itself when stderr is not a
    // terminal (tests/tests/observability.rs checks its stderr file).
    let mut env = Vec::new();
    if std::env::var_os("RUST_LOG").is_none() {
        env.push(("RUST_LOG".to_string(), "info".to_string()));
    }
    let spec = ChildSpec {
        name: name.to_owned(),
        program: program.to_owned(),
        args: args.to_vec(),
        netns: netns.map(str::to_owned),
        stderr: StderrTo::File(stderr_path.to_owned()),
        env,
    };
    Ok(Announced::spawn(&spec, timeout)?)
}
