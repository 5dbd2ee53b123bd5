//! `--spawn-server`: run `ember-server` as a child process for the benchmark.
//!
//! The child gets `--listen 127.0.0.1:0` plus the arguments after `--`; its
//! first stdout line is `listening on <ip:port>` (logs go to its stderr, which
//! we forward with a prefix, or write to `--server-log`). We then poll
//! grpc.health.v1 `Check(ember.v1.Inference)` until SERVING, noticing if the
//! child exits, and after the benchmark stop it with SIGTERM (graceful drain),
//! escalating to SIGKILL if it does not exit in time. The process handling is
//! `ember_testkit::child::Announced`'s (shared with the end-to-end tests); its
//! blocking waits run on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::time::Instant;

use ember_testkit::child::{Announced, ChildSpec, StderrTo};
use ember_testkit::health;

use crate::error::Error;

/// How long the server may drain after SIGTERM before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long a server that failed to start gets after SIGTERM.
const ABORT_GRACE: Duration = Duration::from_secs(3);
/// Prefix of the child's forwarded output lines.
const PREFIX: &str = "[ember-server]";

/// How to start the server (built by `cli` from `--spawn-server` and its
/// companions).
#[derive(Debug, Clone)]
pub struct SpawnConfig {
    /// `--server-bin`; `None`: `ember-server` next to this executable.
    pub server_bin: Option<PathBuf>,
    /// `--server-log`; `None`: forward its stderr with a prefix.
    pub server_log: Option<PathBuf>,
    /// `--server-start-timeout`, seconds.
    pub start_timeout_s: f64,
    /// The arguments after `--`.
    pub server_args: Vec<String>,
}

/// A running child server.
#[derive(Debug)]
pub struct SpawnedServer {
    /// The process (stopped on drop if [`shutdown`](Self::shutdown) was not called).
    proc: Announced,
    /// `http://ip:port` from its `listening on` line.
    pub target: String,
}

/// Runs a blocking process operation off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("a process task failed: {e}")))
}

/// Starts the server and waits until it reports SERVING.
pub async fn start(args: &SpawnConfig) -> Result<SpawnedServer, Error> {
    let bin = locate(args.server_bin.as_deref())?;
    let timeout_s = args.start_timeout_s;
    let timeout = Duration::from_secs_f64(timeout_s);
    let deadline = Instant::now() + timeout;
    let mut server_args = vec!["--listen".to_string(), "127.0.0.1:0".to_string()];
    server_args.extend(args.server_args.iter().cloned());
    let spec = ChildSpec {
        name: "ember-server".into(),
        program: bin.clone(),
        args: server_args,
        netns: None,
        stderr: match &args.server_log {
            Some(path) => StderrTo::File(path.clone()),
            None => StderrTo::Forward(PREFIX),
        },
        env: Vec::new(),
    };
    tracing::info!(bin = %bin.display(), args = ?args.server_args, "starting ember-server");
    let mut proc = blocking(move || Announced::spawn(&spec, timeout))
        .await?
        .map_err(|e| Error::Spawn(e.to_string()))?;
    let target = format!("http://{}", proc.addr());
    tracing::info!(%target, pid = proc.pid(), "ember-server is listening; waiting for health SERVING");
    let waited = health::wait_serving(&target, &[ember_common::SERVICE_NAME], deadline, || {
        if proc.is_running() {
            None
        } else {
            let status = proc.wait_timeout(Duration::ZERO).ok().flatten();
            Some(format!(
                "ember-server exited while starting ({})",
                status.map_or("unknown status".to_string(), |s| s.to_string())
            ))
        }
    })
    .await;
    if let Err(e) = waited {
        blocking(move || proc.stop(ABORT_GRACE)).await?;
        return Err(match e {
            health::WaitError::Timeout { last } => Error::Spawn(format!(
                "ember-server not SERVING within {timeout_s} s (last health: {last})"
            )),
            other => Error::Spawn(other.to_string()),
        });
    }
    tracing::info!(%target, "ember-server is SERVING");
    Ok(SpawnedServer { proc, target })
}

impl SpawnedServer {
    /// SIGTERM, wait up to [`SHUTDOWN_GRACE`] for the drain, else SIGKILL.
    pub async fn shutdown(self) -> Result<ExitStatus, Error> {
        let mut proc = self.proc;
        let status = blocking(move || proc.stop(SHUTDOWN_GRACE))
            .await?
            .ok_or_else(|| Error::Spawn("cannot reap the server".into()))?;
        tracing::info!(%status, "ember-server stopped");
        Ok(status)
    }
}

/// `--server-bin` if given, else `ember-server` next to this executable.
fn locate(explicit: Option<&Path>) -> Result<PathBuf, Error> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::Spawn(format!("cannot find the loadgen executable: {e}")))?;
    let sibling = exe.with_file_name(format!("ember-server{}", std::env::consts::EXE_SUFFIX));
    if sibling.is_file() {
        Ok(sibling)
    } else {
        Err(Error::Spawn(format!(
            "no ember-server next to {} (build it: `cargo build --release -p ember-server`), \
             or pass --server-bin PATH",
            exe.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_binary_wins() {
        let p = locate(Some(Path::new("/opt/ember-server"))).expect("explicit");
        assert_eq!(p, PathBuf::from("/opt/ember-server"));
    }
}
