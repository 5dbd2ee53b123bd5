//! A child process that announces its address on its first stdout line.
//!
//! Both `ember-server` and `delay_relay` print exactly `listening on ADDR`
//! first when given port 0. [`Announced`] spawns such a program (optionally
//! inside a network namespace with `ip netns exec`, which execs in place so the
//! pid is the program's own), reads that line with a timeout, keeps draining
//! stdout, sends stderr to a file, and on drop sends SIGTERM, waits a little,
//! then SIGKILL. When the test is panicking, the drop prints the stderr tail.
//! The line parsing and the signal are `ember_loadgen::child`'s (one copy,
//! shared with `loadgen --spawn-server`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

/// A running child that printed `listening on ADDR`.
pub struct Announced {
    /// Human name for messages ("ember-server", "delay_relay").
    name: String,
    child: Child,
    /// The address from the first stdout line.
    addr: SocketAddr,
    /// Where stderr goes; printed on failure.
    stderr_path: PathBuf,
    /// Set once the child has been reaped, so drop does not signal a reused pid.
    exited: Option<ExitStatus>,
}

impl Announced {
    /// Spawns `program args...` (inside `netns` if given) and waits up to
    /// `timeout` for its `listening on ADDR` line.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        netns: Option<&str>,
        stderr_path: &Path,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args);
        let stderr = std::fs::File::create(stderr_path)
            .with_context(|| format!("create {}", stderr_path.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        // Plain logs in the stderr file (tracing-subscriber honours NO_COLOR).
        cmd.env("NO_COLOR", "1");
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", program.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next();
            let _ = tx.send(first);
            // Keep draining so the child never blocks on a full pipe.
            for _ in lines {}
        });
        let mut me = Announced {
            name: name.to_owned(),
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            stderr_path: stderr_path.to_owned(),
            exited: None,
        };
        let line = match rx.recv_timeout(timeout) {
            Ok(Some(Ok(line))) => line,
            Ok(Some(Err(e))) => bail!("{name}: reading stdout: {e}\n{}", me.stderr_tail(40)),
            Ok(None) => {
                let status = me.child.wait().ok();
                me.exited = status;
                bail!(
                    "{name} exited ({status:?}) before printing its address\n{}",
                    me.stderr_tail(40)
                )
            }
            Err(_) => bail!(
                "{name} printed no `listening on` line within {timeout:?}\n{}",
                me.stderr_tail(40)
            ),
        };
        me.addr = ember_loadgen::child::parse_listening(&line)
            .ok_or_else(|| {
                anyhow!("{name}: first stdout line is {line:?}, expected `listening on ADDR`")
            })?
            .map_err(|e| anyhow!("{name}: {e}"))?;
        Ok(me)
    }

    /// The announced address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the child.
    pub fn signal(&self, signal: i32) -> anyhow::Result<()> {
        if self.exited.is_some() {
            bail!("{} already exited", self.name);
        }
        // A pid we own and have not reaped (`exited` is unset).
        ember_loadgen::child::signal(self.child.id(), signal)
            .with_context(|| format!("kill({}, {signal})", self.child.id()))
    }

    /// Waits up to `timeout` for the child to exit; `None` if it did not.
    pub fn wait_timeout(&mut self, timeout: Duration) -> anyhow::Result<Option<ExitStatus>> {
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

    /// The last `n` lines of the child's stderr, framed for a failure message.
    pub fn stderr_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(n)..];
        format!(
            "--- last {} lines of {} stderr ({}) ---\n{}\n--- end ---",
            tail.len(),
            self.name,
            self.stderr_path.display(),
            tail.join("\n")
        )
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Idempotent.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited.is_some() {
            return;
        }
        let _ = self.signal(libc::SIGTERM);
        if let Ok(Some(_)) = self.wait_timeout(grace) {
            return;
        }
        let _ = self.child.kill();
        self.exited = self.child.wait().ok();
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
