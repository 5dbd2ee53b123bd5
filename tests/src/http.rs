//! Starting `ember-server` with its HTTP front door, and HTTP clients for it.
//!
//! [`HttpServer`] runs the built binary with `--http-listen 127.0.0.1:0` and
//! reads both announcement lines (`listening on ADDR`, then `http listening
//! on ADDR`) from its stdout; `process::Announced` reads only the first, so
//! this module spawns the child itself (stderr to the test's scratch dir,
//! SIGTERM then SIGKILL on drop, the stderr tail printed when a test
//! fails). It waits for `GET /health` = 200, over TLS when the server has
//! `--tls-cert` ([`TestCa`] makes the certificates with rcgen).
//!
//! Clients: [`http_client`] (reqwest, plain or trusting a [`TestCa`]) and
//! [`openai`] (async-openai, the unchanged OpenAI client library, pointed at
//! the server's `/v1`). reqwest is built without a bundled crypto provider,
//! so [`install_crypto`] installs rustls' ring provider first.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

/// How long the server may take to announce both addresses, then to serve.
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(120);
const SERVING_TIMEOUT: Duration = Duration::from_secs(180);

/// Installs rustls' ring provider as the process default (once; reqwest
/// and tonic's clients then use it).
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A certificate authority and a server certificate for `localhost` and
/// 127.0.0.1 signed by it, written as PEM files into `dir`.
pub struct TestCa {
    /// The CA certificate (PEM), for clients to trust.
    pub ca_pem: String,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path) -> anyhow::Result<TestCa> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "ember test CA");
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
        let cert = params.signed_by(&key, &issuer)?;
        let cert_path = dir.join("server.crt");
        let key_path = dir.join("server.key");
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        Ok(TestCa {
            ca_pem: ca.pem(),
            cert_path,
            key_path,
        })
    }

    /// The server flags that use this certificate.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert_path.display().to_string(),
            "--tls-key".into(),
            self.key_path.display().to_string(),
        ]
    }
}

/// A reqwest client; trusting `ca` (only it) when given.
pub fn http_client(ca: Option<&str>) -> anyhow::Result<reqwest::Client> {
    install_crypto();
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(120));
    if let Some(pem) = ca {
        b = b
            .tls_certs_only([reqwest::Certificate::from_pem(pem.as_bytes())?])
            .https_only(true);
    }
    Ok(b.build()?)
}

/// An OpenAI client (async-openai) for `base` (`http://ADDR/v1`) with `key`.
pub fn openai(
    base: &str,
    key: &str,
) -> anyhow::Result<async_openai::Client<async_openai::config::OpenAIConfig>> {
    let config = async_openai::config::OpenAIConfig::new()
        .with_api_base(base)
        .with_api_key(key);
    Ok(async_openai::Client::with_config(config).with_http_client(http_client(None)?))
}

/// A running `ember-server` with `--http-listen`.
pub struct HttpServer {
    /// The server process (SIGTERM, then SIGKILL, on drop).
    child: Child,
    /// The gRPC address (first stdout line).
    grpc: SocketAddr,
    /// The HTTP address (second stdout line).
    http: SocketAddr,
    /// `https` with `--tls-cert`.
    scheme: &'static str,
    /// This server's scratch dir (its stderr is `server.stderr` there).
    pub dir: PathBuf,
    /// Set once the process has been reaped, so nothing signals a reused pid.
    exited: Option<ExitStatus>,
}

impl HttpServer {
    /// Starts `--preset tiny --device cpu --listen 127.0.0.1:0 --http-listen
    /// 127.0.0.1:0` plus `extra`, and waits for `GET /health` = 200 (trusting
    /// `tls`'s CA when given; the caller passes its flags in `extra`).
    pub fn start(tag: &str, extra: &[String], tls: Option<&TestCa>) -> anyhow::Result<HttpServer> {
        let dir = crate::scratch_dir(tag);
        let mut cmd = Command::new(crate::bins::server());
        cmd.args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
            .args(["--preset", "tiny", "--device", "cpu"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("server.stderr"))?);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let mut child = cmd.spawn().context("spawn ember-server")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // Keep reading so the child never blocks on a full pipe.
                let _ = tx.send(line);
            }
        });
        let mut server = HttpServer {
            child,
            grpc: SocketAddr::from(([127, 0, 0, 1], 0)),
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            scheme: if tls.is_some() { "https" } else { "http" },
            dir,
            exited: None,
        };
        let lines = read_addresses(&rx).with_context(|| server.stderr_tail(40))?;
        (server.grpc, server.http) = lines;
        let client = http_client(tls.map(|t| t.ca_pem.as_str()))?;
        let url = server.url("/health");
        crate::block_on(
            None,
            move || async move { wait_healthy(&client, &url).await },
        )
        .with_context(|| server.stderr_tail(40))?;
        Ok(server)
    }

    /// [`Self::start`] without TLS, panicking with the stderr tail on failure.
    pub fn tiny(tag: &str, extra: &[&str]) -> HttpServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::start(tag, &extra, None).unwrap_or_else(|e| panic!("starting ember-server: {e:#}"))
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// `SCHEME://127.0.0.1:PORT{path}` on the HTTP door (the test
    /// certificate names 127.0.0.1).
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme, self.http)
    }

    /// The gRPC door's URL (`https` with TLS).
    pub fn grpc_url(&self) -> String {
        format!("{}://{}", self.scheme, self.grpc)
    }

    /// The OpenAI base URL, `.../v1`.
    pub fn base(&self) -> String {
        self.url("/v1")
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        if self.exited.is_none() {
            let _ = ember_testkit::child::sigterm(self.child.id());
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        while self.exited.is_none() && Instant::now() < end {
            self.exited = self.child.try_wait().ok().flatten();
            std::thread::sleep(Duration::from_millis(20));
        }
        self.exited
    }

    /// The server's whole stderr.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.stderr")).unwrap_or_default()
    }

    /// The last `n` lines of its stderr, framed for a failure message.
    pub fn stderr_tail(&self, n: usize) -> String {
        let text = self.stderr();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- last lines of ember-server stderr ---\n{}\n--- end ---",
            lines[lines.len().saturating_sub(n)..].join("\n")
        )
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.sigterm();
        if self.wait_exit(Duration::from_secs(5)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.stderr_tail(60));
        }
        crate::cleanup_scratch(&self.dir);
    }
}

/// Reads `listening on A` then `http listening on B`.
fn read_addresses(rx: &mpsc::Receiver<String>) -> anyhow::Result<(SocketAddr, SocketAddr)> {
    let end = Instant::now() + ANNOUNCE_TIMEOUT;
    let next = || {
        rx.recv_timeout(end.saturating_duration_since(Instant::now()))
            .map_err(|_| anyhow!("ember-server did not announce its addresses"))
    };
    let first = next()?;
    let grpc = first
        .strip_prefix("listening on ")
        .ok_or_else(|| anyhow!("first stdout line: {first:?}"))?
        .trim()
        .parse()?;
    let second = next()?;
    let http = second
        .strip_prefix("http listening on ")
        .ok_or_else(|| anyhow!("second stdout line: {second:?}"))?
        .trim()
        .parse()?;
    Ok((grpc, http))
}

/// Polls `url` until it answers 200.
async fn wait_healthy(client: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let end = tokio::time::Instant::now() + SERVING_TIMEOUT;
    let mut last = String::from("no answer yet");
    while tokio::time::Instant::now() < end {
        match client.get(url).send().await {
            Ok(r) if r.status() == 200 => return Ok(()),
            Ok(r) => last = format!("status {}", r.status()),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{url} not 200 within {SERVING_TIMEOUT:?}; last: {last}")
}

/// Runs async test code on a fresh runtime in its own thread, panicking
/// with the error (and its context).
pub fn run<F, Fut>(make: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    if let Err(e) = crate::block_on(None, make) {
        panic!("{e:#}");
    }
}

/// The server's counters (`GetServerInfo`, over gRPC: the same scheduler).
pub fn counters(server: &HttpServer) -> ember_common::pb::Counters {
    let addr = server.grpc_addr();
    crate::block_on(None, move || async move {
        crate::client::server_info(addr).await
    })
    .unwrap_or_else(|e| panic!("GetServerInfo: {e:#}\n{}", server.stderr_tail(40)))
    .counters
    .unwrap_or_default()
}

/// The end state every test asserts: 0 KV blocks, nothing running or
/// queued, health SERVING, a fresh request completes.
pub fn assert_idle(server: &HttpServer) {
    let addr = server.grpc_addr();
    crate::block_on(None, move || async move {
        crate::client::assert_idle_and_serving(addr).await
    })
    .unwrap_or_else(|e| panic!("end state: {e:#}\n{}", server.stderr_tail(40)));
}

/// Reads a Server-Sent Events body one `data:` payload at a time.
pub struct SseReader {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: Vec<u8>,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> SseReader {
        SseReader {
            body: Box::pin(response.bytes_stream()),
            buf: Vec::new(),
        }
    }

    /// The next event's `data:` payload; `None` at the end of the body.
    pub async fn next_data(&mut self) -> anyhow::Result<Option<String>> {
        use futures::StreamExt;
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(event)?;
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue; // a comment or keep-alive
                }
                return Ok(Some(data.join("\n")));
            }
            match self.body.next().await {
                Some(chunk) => self.buf.extend_from_slice(&chunk?),
                None if self.buf.iter().all(u8::is_ascii_whitespace) => return Ok(None),
                None => bail!(
                    "the SSE body ended inside an event: {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
            }
        }
    }

    /// Every remaining payload, up to and including `[DONE]` (which must be
    /// the last).
    pub async fn all(&mut self) -> anyhow::Result<Vec<String>> {
        let mut out = Vec::new();
        while let Some(d) = self.next_data().await? {
            out.push(d);
        }
        if out.last().map(String::as_str) != Some("[DONE]") {
            bail!("the stream did not end with [DONE]: {out:?}");
        }
        Ok(out)
    }
}
