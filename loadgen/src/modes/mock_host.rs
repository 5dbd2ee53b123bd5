//! Where `loadgen calibrate` runs its mock server: on its own thread and
//! current-thread runtime (the default, so serving it takes no turns from
//! loadgen's runtime), on loadgen's runtime (`--shared-runtime`), or as a
//! child process (`--mock-process`: `loadgen mock`, found as this very
//! executable), which is how a real server runs and keeps the mock's sockets
//! out of loadgen's open-file budget.

use std::time::Duration;

use ember_testkit::child::{Announced, ChildSpec, StderrTo};
use ember_testkit::mock::{self, MockConfig, MockServer};

use crate::config::Backend;
use crate::error::Error;

/// Where the mock runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Its own thread and runtime.
    Thread,
    /// Loadgen's runtime.
    Shared,
    /// A child process.
    Process,
}

/// A running mock.
pub enum MockHost {
    /// On loadgen's runtime.
    Shared(MockServer, String),
    /// On its own thread.
    Thread(MockThread, String),
    /// A child `loadgen mock`.
    Process(Box<Announced>, String),
}

impl MockHost {
    /// Starts the mock where asked; `backend` picks the door whose URL
    /// [`url`](Self::url) gives.
    pub async fn start(
        placement: Placement,
        cfg: MockConfig,
        backend: Backend,
    ) -> Result<MockHost, Error> {
        let pick = |s: &MockServer| match backend {
            Backend::Ember => s.url.clone(),
            Backend::Openai => s.http_url.clone(),
        };
        Ok(match placement {
            Placement::Shared => {
                let s = mock::start(cfg)
                    .await
                    .map_err(|e| Error::Internal(format!("cannot start the mock server: {e}")))?;
                let url = pick(&s);
                MockHost::Shared(s, url)
            }
            Placement::Thread => {
                let t = MockThread::start(cfg)?;
                let url = match backend {
                    Backend::Ember => t.urls.0.clone(),
                    Backend::Openai => t.urls.1.clone(),
                };
                MockHost::Thread(t, url)
            }
            Placement::Process => {
                let child = tokio::task::spawn_blocking(move || child(&cfg, backend))
                    .await
                    .map_err(|e| Error::Internal(format!("a process task failed: {e}")))??;
                let url = format!("http://{}", child.addr());
                MockHost::Process(Box::new(child), url)
            }
        })
    }

    /// The URL of the door being calibrated.
    pub fn url(&self) -> &str {
        match self {
            MockHost::Shared(_, u) | MockHost::Thread(_, u) | MockHost::Process(_, u) => u,
        }
    }

    /// Stops the mock.
    pub async fn stop(self) {
        match self {
            MockHost::Shared(s, _) => s.stop().await,
            // Joins a thread that is only waiting for its stop signal.
            MockHost::Thread(t, _) => t.stop(),
            MockHost::Process(mut c, _) => {
                let _ = tokio::task::spawn_blocking(move || c.stop(Duration::from_secs(10))).await;
            }
        }
    }
}

/// Starts `loadgen mock` (this executable) announcing the door to calibrate.
fn child(cfg: &MockConfig, backend: Backend) -> Result<Announced, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Internal(format!("cannot find the loadgen executable: {e}")))?;
    let ms = |d: Duration| (d.as_secs_f64() * 1e3).to_string();
    let announce = match backend {
        Backend::Ember => "grpc",
        Backend::Openai => "http",
    };
    let spec = ChildSpec {
        name: "loadgen mock".into(),
        program: exe,
        args: vec![
            "mock".into(),
            "--ttft-ms".into(),
            ms(cfg.ttft),
            "--itl-ms".into(),
            ms(cfg.itl),
            "--announce".into(),
            announce.into(),
        ],
        netns: None,
        stderr: StderrTo::Forward("[loadgen mock]"),
        env: Vec::new(),
    };
    Announced::spawn(&spec, Duration::from_secs(30))
        .map_err(|e| Error::Internal(format!("cannot start the mock process: {e}")))
}

/// The mock on its own thread and runtime, so serving it does not take turns
/// from loadgen's runtime.
pub struct MockThread {
    /// gRPC and HTTP URLs.
    urls: (String, String),
    /// Stops the mock.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The thread.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MockThread {
    fn start(cfg: MockConfig) -> Result<MockThread, Error> {
        let (url_tx, url_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("loadgen-mock".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = url_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    match mock::start(cfg).await {
                        Ok(server) => {
                            let _ = url_tx.send(Ok((server.url.clone(), server.http_url.clone())));
                            let _ = stop_rx.await;
                            server.stop().await;
                        }
                        Err(e) => {
                            let _ = url_tx.send(Err(e.to_string()));
                        }
                    }
                });
            })
            .map_err(|e| Error::Internal(format!("cannot start the mock thread: {e}")))?;
        let urls = url_rx
            .recv()
            .map_err(|_| Error::Internal("the mock thread ended".into()))?
            .map_err(|e| Error::Internal(format!("cannot start the mock server: {e}")))?;
        Ok(MockThread {
            urls,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
