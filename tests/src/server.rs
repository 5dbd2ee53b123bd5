//! Starting `ember-server` for a test.
//!
//! Every test starts its own server on port 0 (tests in one binary run in
//! parallel threads), with `--preset tiny --device cpu` unless told otherwise,
//! reads the `listening on ADDR` line, and waits for health SERVING on both ""
//! and `ember.v1.Inference`. The server is stopped (SIGTERM, then SIGKILL) when
//! the [`Server`] is dropped; its stderr is kept in the test's scratch dir and
//! printed if the test panics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context;
use ember_common::pb::ServerInfo;

use crate::process::Announced;

/// How long a debug build may take to print its address, then to warm up
/// (2 CPU cores shared with other tests).
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(120);
const SERVING_TIMEOUT: Duration = Duration::from_secs(180);

/// What to start.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to bind; port 0 picks a free one.
    pub listen: String,
    /// Network namespace to run in (`ip netns exec`), if any.
    pub netns: Option<String>,
    /// Extra flags after the defaults (later flags win in clap only for
    /// single-valued args, so do not repeat the defaults).
    pub args: Vec<String>,
    /// `--preset`.
    pub preset: String,
    /// Scratch dir name for this server's files.
    pub tag: String,
}

impl ServerConfig {
    /// `--listen 127.0.0.1:0 --preset tiny --device cpu`.
    pub fn tiny(tag: &str) -> Self {
        ServerConfig {
            listen: "127.0.0.1:0".into(),
            netns: None,
            args: Vec::new(),
            preset: "tiny".into(),
            tag: tag.into(),
        }
    }

    /// Appends flags, e.g. `.arg("--max-batch-size").arg("4")`.
    pub fn arg(mut self, a: impl ToString) -> Self {
        self.args.push(a.to_string());
        self
    }

    /// Appends `--flag value`.
    pub fn flag(self, name: &str, value: impl ToString) -> Self {
        self.arg(name).arg(value)
    }
}

/// A running `ember-server`.
pub struct Server {
    proc: Announced,
    /// The namespace it runs in: health and info calls are made from there.
    netns: Option<String>,
    /// This server's scratch dir (stderr lives here).
    pub dir: PathBuf,
}

impl Server {
    /// Starts the server and waits until it is SERVING.
    pub fn start(cfg: ServerConfig) -> anyhow::Result<Server> {
        let dir = crate::scratch_dir(&cfg.tag);
        let mut args = vec![
            "--listen".to_owned(),
            cfg.listen.clone(),
            "--preset".into(),
            cfg.preset.clone(),
            "--device".into(),
            "cpu".into(),
        ];
        args.extend(cfg.args.iter().cloned());
        let proc = crate::process::spawn(
            "ember-server",
            &crate::bins::server(),
            &args,
            cfg.netns.as_deref(),
            &dir.join("server.stderr"),
            ANNOUNCE_TIMEOUT,
        )?;
        let server = Server {
            proc,
            netns: cfg.netns.clone(),
            dir,
        };
        let addr = server.addr();
        server
            .block_on(
                move || async move { crate::client::wait_serving(addr, SERVING_TIMEOUT).await },
            )
            .with_context(|| server.proc.stderr_tail(40))?;
        Ok(server)
    }

    /// Starts `--preset tiny --device cpu` on 127.0.0.1:0 with `extra` flags,
    /// panicking with the server's stderr on failure.
    pub fn tiny(tag: &str, extra: &[&str]) -> Server {
        let mut cfg = ServerConfig::tiny(tag);
        cfg.args.extend(extra.iter().map(|s| s.to_string()));
        Server::start(cfg).unwrap_or_else(|e| panic!("starting ember-server: {e:#}"))
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.proc.addr()
    }

    /// `http://ADDR`, for `loadgen --target`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Runs async client code against this server from the right network
    /// namespace (see [`crate::block_on`]).
    pub fn block_on<F, Fut, T>(&self, make: F) -> anyhow::Result<T>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = anyhow::Result<T>>,
        T: Send + 'static,
    {
        crate::block_on(self.netns.as_deref(), make)
    }

    /// `GetServerInfo`.
    pub fn info(&self) -> ServerInfo {
        let addr = self.addr();
        self.block_on(move || async move { crate::client::server_info(addr).await })
            .unwrap_or_else(|e| panic!("GetServerInfo: {e:#}\n{}", self.stderr_tail(40)))
    }

    /// The server's counters from `GetServerInfo` (defaults if it sent none).
    pub fn counters(&self) -> ember_common::pb::Counters {
        self.info().counters.unwrap_or_default()
    }

    /// Panics unless 0 KV blocks used, 0 active, empty queue, health SERVING
    /// and a fresh request completes. Returns the idle info.
    pub fn assert_idle_and_serving(&self) -> ServerInfo {
        let addr = self.addr();
        self.block_on(move || async move { crate::client::assert_idle_and_serving(addr).await })
            .unwrap_or_else(|e| panic!("end-state check failed: {e:#}\n{}", self.stderr_tail(40)))
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        self.proc
            .signal(libc::SIGTERM)
            .expect("SIGTERM ember-server");
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.proc
            .wait_timeout(timeout)
            .expect("wait for ember-server")
    }

    /// The last `n` lines of the server's stderr.
    pub fn stderr_tail(&self, n: usize) -> String {
        self.proc.stderr_tail(n)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.proc.stop(Duration::from_secs(3));
        crate::cleanup_scratch(&self.dir);
    }
}
