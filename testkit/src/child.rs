//! A child process that announces its address on its first stdout line: the
//! one implementation, used by loadgen's `--spawn-server`, `loadgen calibrate
//! --mock-process` and the `ember-tests` process helper.
//!
//! `ember-server`, `delay_relay` and `loadgen mock` all print exactly
//! `listening on <ip:port>` on stdout when given port 0. [`Announced::spawn`]
//! starts such a program (optionally inside a network namespace with `ip netns
//! exec`, which execs in place so the pid is the program's own), waits for that
//! line with a timeout (earlier stdout lines are skipped, or forwarded), keeps
//! draining stdout, sends stderr to a file or forwards it with a prefix, and
//! stops the child with SIGTERM, a grace period, then SIGKILL (also on drop;
//! when the thread is panicking, the drop prints the stderr file's tail).

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use std::net::{Ipv4Addr, SocketAddr};

/// The first stdout line's prefix.
pub const LISTENING_PREFIX: &str = "listening on ";

/// The address of a `listening on ADDR` line; an unspecified IP (0.0.0.0)
/// becomes loopback. `None` if the line is something else.
pub fn parse_listening(line: &str) -> Option<Result<SocketAddr, String>> {
    let text = line.strip_prefix(LISTENING_PREFIX)?;
    Some(
        text.trim()
            .parse::<SocketAddr>()
            .map(|mut addr| {
                if addr.ip().is_unspecified() {
                    addr.set_ip(Ipv4Addr::LOCALHOST.into());
                }
                addr
            })
            .map_err(|e| format!("cannot parse the address in `{line}`: {e}")),
    )
}

/// Sends `sig` (e.g. `libc::SIGTERM`) to process `pid`. The caller must own
/// the child and not have reaped it, so the pid cannot have been reused.
#[cfg(unix)]
pub fn signal(pid: u32, sig: i32) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) takes plain integers and has no memory effects.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// SIGTERM: the graceful stop (the server drains).
#[cfg(unix)]
pub fn sigterm(pid: u32) -> std::io::Result<()> {
    signal(pid, libc::SIGTERM)
}

/// Where the child's stderr goes.
#[derive(Debug, Clone)]
pub enum StderrTo {
    /// Into this file (created); [`Announced::stderr_tail`] reads it back.
    File(PathBuf),
    /// To our stderr, each line prefixed (e.g. `[ember-server]`); stdout
    /// lines other than the address line are forwarded the same way.
    Forward(&'static str),
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// Human name for messages ("ember-server", "delay_relay").
    pub name: String,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Run it inside this network namespace (`ip netns exec NS`).
    pub netns: Option<String>,
    /// Where its stderr goes.
    pub stderr: StderrTo,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

/// Why a child could not be started or did not announce its address.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// Creating the stderr file or spawning the process failed.
    #[error("{name}: cannot start {what}: {source}")]
    Start {
        /// The child's name.
        name: String,
        /// What failed.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// It exited, printed something else or nothing in time.
    #[error("{0}")]
    Announce(String),
}

/// A running child that printed `listening on ADDR`.
#[derive(Debug)]
pub struct Announced {
    /// Human name for messages.
    name: String,
    /// The process.
    child: Child,
    /// The address from its `listening on` line.
    addr: SocketAddr,
    /// Where stderr goes, if to a file (printed on failure).
    stderr_path: Option<PathBuf>,
    /// Set once the child has been reaped, so nothing signals a reused pid.
    exited: Option<ExitStatus>,
}

/// Copies lines from a pipe to our stderr with a prefix (until it closes).
fn forward_lines(pipe: impl Read + Send + 'static, prefix: &'static str) {
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            eprintln!("{prefix} {line}");
        }
    });
}

impl Announced {
    /// Spawns the child and waits up to `timeout` for its `listening on ADDR`
    /// line.
    pub fn spawn(spec: &ChildSpec, timeout: Duration) -> Result<Announced, ChildError> {
        let name = spec.name.clone();
        let start_err = |what: String| {
            let name = name.clone();
            move |source| ChildError::Start { name, what, source }
        };
        let mut cmd = match &spec.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&spec.program);
                c
            }
            None => Command::new(&spec.program),
        };
        cmd.args(&spec.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
        let (stderr_path, forward) = match &spec.stderr {
            StderrTo::File(path) => {
                let file = std::fs::File::create(path)
                    .map_err(start_err(format!("create {}", path.display())))?;
                cmd.stderr(file);
                (Some(path.clone()), None)
            }
            StderrTo::Forward(prefix) => {
                cmd.stderr(Stdio::piped());
                (None, Some(*prefix))
            }
        };
        let mut child = cmd
            .spawn()
            .map_err(start_err(spec.program.display().to_string()))?;
        if let (Some(prefix), Some(err)) = (forward, child.stderr.take()) {
            forward_lines(err, prefix);
        }
        let stdout = child.stdout.take();
        let mut me = Announced {
            name: name.clone(),
            child,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            stderr_path,
            exited: None,
        };
        let Some(stdout) = stdout else {
            return Err(ChildError::Announce(format!(
                "{name}: stdout was not captured"
            )));
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut found = false;
            for line in lines.by_ref() {
                let Ok(line) = line else { break };
                if !found {
                    if let Some(addr) = parse_listening(&line) {
                        found = true;
                        let _ = tx.send(Some(addr));
                        continue;
                    }
                }
                // Keep draining so the child never blocks on a full pipe.
                if let Some(prefix) = forward {
                    eprintln!("{prefix} {line}");
                }
            }
            if !found {
                let _ = tx.send(None);
            }
        });
        let deadline = Instant::now() + timeout;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Some(Ok(addr))) => {
                me.addr = addr;
                Ok(me)
            }
            Ok(Some(Err(e))) => Err(ChildError::Announce(format!(
                "{name}: {e}\n{}",
                me.stderr_tail(40)
            ))),
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                // stdout closed: the child is exiting; give it a moment.
                let status = me.wait_timeout(Duration::from_secs(5)).ok().flatten();
                let status = status.map_or("still running, stdout closed".to_string(), |s| {
                    s.to_string()
                });
                Err(ChildError::Announce(format!(
                    "{name} exited before printing its address ({status})\n{}",
                    me.stderr_tail(40)
                )))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Err(ChildError::Announce(format!(
                "{name}: no `listening on` line within {timeout:?}\n{}",
                me.stderr_tail(40)
            ))),
        }
    }

    /// The announced address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` (e.g. `libc::SIGTERM`) to the child, unless it was reaped.
    #[cfg(unix)]
    pub fn signal(&self, sig: i32) -> std::io::Result<()> {
        if self.exited.is_some() {
            return Err(std::io::Error::other(format!(
                "{} already exited",
                self.name
            )));
        }
        signal(self.child.id(), sig)
    }

    /// Waits up to `timeout` for the child to exit; `None` if it did not.
    pub fn wait_timeout(&mut self, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
        if let Some(s) = self.exited {
            return Ok(Some(s));
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait()? {
                self.exited = Some(s);
                return Ok(Some(s));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.wait_timeout(Duration::ZERO), Ok(None))
    }

    /// The last `n` lines of the child's stderr file, framed for a failure
    /// message (empty when stderr is forwarded).
    pub fn stderr_tail(&self, n: usize) -> String {
        let Some(path) = &self.stderr_path else {
            return String::new();
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(n)..];
        format!(
            "--- last {} lines of {} stderr ({}) ---\n{}\n--- end ---",
            tail.len(),
            self.name,
            path.display(),
            tail.join("\n")
        )
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; returns the exit status.
    /// Idempotent.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.exited.is_some() {
            return self.exited;
        }
        #[cfg(unix)]
        let _ = self.signal(libc::SIGTERM);
        if let Ok(Some(s)) = self.wait_timeout(grace) {
            return Some(s);
        }
        tracing::warn!(name = %self.name, ?grace, "did not exit after SIGTERM; killing it");
        let _ = self.child.kill();
        self.exited = self.child.wait().ok();
        self.exited
    }
}

impl Drop for Announced {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
        if std::thread::panicking() {
            eprintln!("{}", self.stderr_tail(60));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announced_children_start_report_and_stop() {
        let dir = std::env::temp_dir().join(format!("lg-child-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let sh = |name: &str, script: &str, timeout: Duration| {
            let spec = ChildSpec {
                name: name.into(),
                program: "sh".into(),
                args: vec!["-c".into(), script.into()],
                netns: None,
                stderr: StderrTo::File(dir.join(format!("{name}.stderr"))),
                env: Vec::new(),
            };
            Announced::spawn(&spec, timeout)
        };
        let mut ok = sh(
            "ok",
            "echo oops >&2; echo noise; echo 'listening on 127.0.0.1:4567'; exec sleep 30",
            Duration::from_secs(10),
        )
        .expect("announces");
        assert_eq!(ok.addr().to_string(), "127.0.0.1:4567");
        assert!(ok.is_running());
        let status = ok.stop(Duration::from_secs(5)).expect("exited");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM), "stopped by SIGTERM");
        assert!(ok.stderr_tail(5).contains("oops"));
        let gone = sh("gone", "echo bye >&2; exit 3", Duration::from_secs(10)).expect_err("exits");
        assert!(
            gone.to_string()
                .contains("gone exited before printing its address (exit status: 3)"),
            "{gone}"
        );
        assert!(gone.to_string().contains("bye"), "the stderr tail: {gone}");
        let slow = sh("slow", "exec sleep 30", Duration::from_millis(200)).expect_err("silent");
        assert!(
            slow.to_string().contains("no `listening on` line within"),
            "{slow}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn listening_lines() {
        let ok = |l: &str| {
            parse_listening(l)
                .expect("a listening line")
                .expect("parses")
                .to_string()
        };
        assert_eq!(ok("listening on 127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(ok("listening on 0.0.0.0:7 "), "127.0.0.1:7");
        assert!(parse_listening("listening on nonsense")
            .expect("a listening line")
            .is_err());
        assert!(parse_listening("INFO starting").is_none());
    }

    #[cfg(unix)]
    #[test]
    fn signal_reaches_a_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        sigterm(child.id()).expect("SIGTERM");
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }
}
