//! `--spawn-server`: run `ember-server` as a child process for the benchmark.
//!
//! The child gets `--listen 127.0.0.1:0` plus the arguments after `--`; its
//! first stdout line is `listening on <ip:port>` (logs go to its stderr, which
//! we forward with a prefix, or write to `--server-log`). We then poll
//! grpc.health.v1 `Check(ember.v1.Inference)` until SERVING, noticing if the
//! child exits, and after the benchmark stop it with SIGTERM (graceful drain),
//! escalating to SIGKILL if it does not exit in time. `kill_on_drop` covers
//! every early return.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, Instant};

use crate::cli::Args;
use crate::error::Error;
use crate::{child, health};

/// How long the server may drain after SIGTERM before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Prefix of the child's forwarded output lines.
const PREFIX: &str = "[ember-server]";

/// A running child server.
#[derive(Debug)]
pub struct SpawnedServer {
    /// The process (killed if this is dropped without [`shutdown`](Self::shutdown)).
    child: Child,
    /// `http://ip:port` from its `listening on` line.
    pub target: String,
    /// Tasks forwarding its stdout/stderr; joined at shutdown so the last
    /// lines are not lost.
    forwarders: Vec<JoinHandle<()>>,
}

/// Starts the server and waits until it reports SERVING.
pub async fn start(args: &Args) -> Result<SpawnedServer, Error> {
    let bin = locate(args.server_bin.as_deref())?;
    let deadline = Instant::now() + Duration::from_secs_f64(args.server_start_timeout);
    let mut cmd = Command::new(&bin);
    cmd.arg("--listen")
        .arg("127.0.0.1:0")
        .args(&args.server_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    match &args.server_log {
        Some(path) => {
            let file = File::create(path).map_err(|source| Error::File {
                path: path.clone(),
                source,
            })?;
            cmd.stderr(Stdio::from(file));
        }
        None => {
            cmd.stderr(Stdio::piped());
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::Spawn(format!("cannot start {}: {e}", bin.display())))?;
    tracing::info!(
        bin = %bin.display(),
        args = ?args.server_args,
        pid = child.id(),
        "started ember-server"
    );

    let mut forwarders = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        forwarders.push(tokio::spawn(forward(stderr, PREFIX)));
    }
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::Spawn("the child's stdout was not captured".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = match timeout_at(deadline, lines.next_line()).await {
            Err(_) => {
                return Err(Error::Spawn(format!(
                    "no `listening on` line within {} s",
                    args.server_start_timeout
                )))
            }
            Ok(Err(e)) => return Err(Error::Spawn(format!("reading the child's stdout: {e}"))),
            Ok(Ok(None)) => {
                let status = wait_briefly(&mut child).await;
                return Err(Error::Spawn(format!(
                    "ember-server exited before printing its address ({status})"
                )));
            }
            Ok(Ok(Some(line))) => line,
        };
        match child::parse_listening(&line) {
            Some(addr) => break addr.map_err(Error::Spawn)?,
            None => eprintln!("{PREFIX} {line}"),
        }
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    forwarders.push(tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{PREFIX} {line}");
        }
    }));

    let target = format!("http://{addr}");
    tracing::info!(%target, "ember-server is listening; waiting for health SERVING");
    let timeout_s = args.server_start_timeout;
    health::wait_serving(
        &target,
        &[ember_common::SERVICE_NAME],
        deadline,
        || match child.try_wait() {
            Ok(Some(status)) => Some(format!("ember-server exited while starting ({status})")),
            _ => None,
        },
    )
    .await
    .map_err(|e| match e {
        health::WaitError::Timeout { last } => Error::Spawn(format!(
            "ember-server not SERVING within {timeout_s} s (last health: {last})"
        )),
        other => Error::Spawn(other.to_string()),
    })?;
    tracing::info!(%target, "ember-server is SERVING");
    Ok(SpawnedServer {
        child,
        target,
        forwarders,
    })
}

impl SpawnedServer {
    /// SIGTERM, wait up to [`SHUTDOWN_GRACE`] for the drain, else SIGKILL.
    pub async fn shutdown(mut self) -> Result<ExitStatus, Error> {
        terminate(&mut self.child);
        let status = match timeout(SHUTDOWN_GRACE, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => return Err(Error::Spawn(format!("waiting for the server: {e}"))),
            Err(_) => {
                tracing::warn!(
                    "ember-server did not exit within {SHUTDOWN_GRACE:?} of SIGTERM; killing it"
                );
                self.child
                    .kill()
                    .await
                    .map_err(|e| Error::Spawn(format!("cannot kill the server: {e}")))?;
                self.child
                    .wait()
                    .await
                    .map_err(|e| Error::Spawn(format!("waiting for the server: {e}")))?
            }
        };
        for f in self.forwarders.drain(..) {
            // The pipes close with the process; don't hang on a grandchild
            // that inherited them.
            let _ = timeout(Duration::from_secs(2), f).await;
        }
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

/// Copies lines of a child pipe to our stderr with a prefix.
async fn forward(pipe: impl AsyncRead + Unpin, prefix: &'static str) {
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("{prefix} {line}");
    }
}

/// The exit status of a child that closed its stdout, if it exits soon.
async fn wait_briefly(child: &mut Child) -> String {
    match timeout(Duration::from_secs(5), child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(e)) => format!("wait failed: {e}"),
        Err(_) => "still running, stdout closed".to_string(),
    }
}

/// Asks the child to stop: SIGTERM on Unix (the server drains), a kill elsewhere.
fn terminate(child: &mut Child) {
    #[cfg(unix)]
    if let Some(pid) = child.id() {
        // Our own child, not yet reaped (we hold its `Child`).
        if let Err(e) = child::sigterm(pid) {
            tracing::warn!(error = %e, "SIGTERM to ember-server failed");
        }
    }
    #[cfg(not(unix))]
    if let Err(e) = child.start_kill() {
        tracing::warn!(error = %e, "stopping ember-server failed");
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
