//! The OpenAI backend's connections to one target, on hyper's
//! connection-level client (no hidden pool: loadgen decides when a connection
//! is opened and reused, and counts them).
//!
//! - HTTP/1.1 ([`Http1Pool`]): one stream per connection, so the pool holds
//!   as many keep-alive connections as there are streams in flight: a request
//!   takes an idle connection or dials a new one, and gives it back once its
//!   body has been read to the end. Thousands of concurrent streams mean
//!   thousands of sockets (loadgen raises its open-file limit at start).
//! - HTTP/2 ([`Http2Conn`]): one connection carrying every stream (h2c on
//!   `http://`, ALPN `h2` on `https://`), redialled if it closes; `--channels`
//!   makes several.
//!
//! [`Dialer`] holds what both need: the address, the TLS settings, the
//! request paths.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::{http1, http2};
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use crate::client::tls;
use crate::config::{ConnConfig, HttpVersion};
use crate::error::Error;

/// A request body (every request is one JSON document).
pub type Body = Full<Bytes>;

/// How long dialling one connection (TCP + TLS + HTTP/2 preface) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 windows: thousands of streams share one connection.
const CONNECTION_WINDOW: u32 = 16 << 20;
const STREAM_WINDOW: u32 = 1 << 20;

/// Where and how to open connections to one target.
#[derive(Debug)]
pub struct Dialer {
    /// The target as given (`http(s)://host:port[/prefix]`), for records.
    pub url: String,
    /// `host:port` as in the URL (the Host header / :authority).
    pub authority: String,
    /// Host to connect to (IPv6 without brackets).
    host: String,
    /// Port (80 / 443 by default).
    port: u16,
    /// `https`.
    https: bool,
    /// The URL's path without a trailing `/` ("" or e.g. "/v1").
    prefix: String,
    /// HTTP/1.1 or HTTP/2.
    pub version: HttpVersion,
    /// TLS, for `https://` targets.
    tls: Option<Tls>,
}

/// The TLS connector and the name the certificate must carry.
struct Tls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tls({:?})", self.name)
    }
}

impl Dialer {
    /// Parses a `--base-url` and prepares TLS for it.
    pub fn new(url: &str, conn: &ConnConfig) -> Result<Dialer, Error> {
        let bad = |reason: String| Error::BadTarget {
            flag: "--base-url",
            target: url.to_string(),
            reason,
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: hyper::http::uri::InvalidUri| bad(e.to_string()))?;
        let https = uri.scheme_str() == Some("https");
        let authority = uri
            .authority()
            .ok_or_else(|| bad("no host".into()))?
            .to_string();
        let host = uri
            .host()
            .ok_or_else(|| bad("no host".into()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let alpn: &[u8] = match conn.http {
                HttpVersion::Http1 => b"http/1.1",
                HttpVersion::Http2 => b"h2",
            };
            let config = tls::http_config(conn.tls_ca.as_deref(), alpn)?;
            let name = ServerName::try_from(host.clone()).map_err(|e| bad(e.to_string()))?;
            Some(Tls {
                connector: TlsConnector::from(config),
                name,
            })
        } else {
            None
        };
        Ok(Dialer {
            url: url.to_string(),
            authority,
            host,
            port,
            https,
            prefix: uri.path().trim_end_matches('/').to_string(),
            version: conn.http,
            tls,
        })
    }

    /// The request path of an API route (`/completions`, `/models`): under
    /// `/v1` unless the base URL already ends with it.
    pub fn path(&self, route: &str) -> String {
        if self.prefix.ends_with("/v1") {
            format!("{}{route}", self.prefix)
        } else {
            format!("{}/v1{route}", self.prefix)
        }
    }

    /// The request URI for `path`: origin-form for HTTP/1.1 (with a Host
    /// header), absolute for HTTP/2 (its :scheme and :authority).
    pub fn uri(&self, path: &str) -> String {
        match self.version {
            HttpVersion::Http1 => path.to_string(),
            HttpVersion::Http2 => {
                let scheme = if self.https { "https" } else { "http" };
                format!("{scheme}://{}{path}", self.authority)
            }
        }
    }

    /// TCP (no Nagle: every request and chunk is a small write), then TLS.
    async fn io(&self) -> Result<Box<dyn Io>, String> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("connect {}:{}: {e}", self.host, self.port))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let Some(tls) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let stream = tls
            .connector
            .connect(tls.name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        if self.version == HttpVersion::Http2 && alpn.as_deref() != Some(b"h2") {
            return Err("the server did not agree to HTTP/2 (ALPN h2) over TLS".into());
        }
        Ok(Box::new(stream))
    }

    /// A new HTTP/1.1 connection (its task runs until the connection closes).
    pub async fn http1(&self) -> Result<http1::SendRequest<Body>, String> {
        let dial = async {
            let io = self.io().await?;
            let (sender, conn) = http1::handshake(TokioIo::new(io))
                .await
                .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "HTTP/1.1 connection ended");
                }
            });
            Ok(sender)
        };
        tokio::time::timeout(CONNECT_TIMEOUT, dial)
            .await
            .map_err(|_| format!("connecting took longer than {CONNECT_TIMEOUT:?}"))?
    }

    /// A new HTTP/2 connection.
    pub async fn http2(&self) -> Result<http2::SendRequest<Body>, String> {
        let dial = async {
            let io = self.io().await?;
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .initial_connection_window_size(CONNECTION_WINDOW)
                .initial_stream_window_size(STREAM_WINDOW)
                .handshake(TokioIo::new(io))
                .await
                .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "HTTP/2 connection ended");
                }
            });
            Ok(sender)
        };
        tokio::time::timeout(CONNECT_TIMEOUT, dial)
            .await
            .map_err(|_| format!("connecting took longer than {CONNECT_TIMEOUT:?}"))?
    }
}

/// A byte stream a connection runs on: TCP, or TLS over TCP.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// HTTP/1.1 keep-alive connections to one target: idle ones are reused,
/// new ones dialled when none is idle.
#[derive(Debug, Default)]
pub struct Http1Pool {
    /// Idle connections (most recently used last).
    idle: Mutex<Vec<http1::SendRequest<Body>>>,
    /// Connections opened so far.
    pub opened: AtomicUsize,
}

impl Http1Pool {
    fn pop(&self) -> Option<http1::SendRequest<Body>> {
        // A panic while holding this lock leaves a plain Vec: still usable.
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    /// An idle connection ready for a request, or a new one.
    pub async fn checkout(&self, dialer: &Dialer) -> Result<http1::SendRequest<Body>, String> {
        while let Some(mut sender) = self.pop() {
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        let sender = dialer.http1().await?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(sender)
    }

    /// Returns a connection whose response was read to the end.
    pub fn checkin(&self, sender: http1::SendRequest<Body>) {
        if !sender.is_closed() {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(sender);
        }
    }
}

/// One HTTP/2 connection, redialled when it closes.
#[derive(Debug)]
pub struct Http2Conn {
    /// The current connection.
    sender: tokio::sync::Mutex<Option<http2::SendRequest<Body>>>,
    /// Connections opened so far (1 unless one closed).
    pub opened: AtomicUsize,
}

impl Http2Conn {
    /// Dials the connection now.
    pub async fn connect(dialer: &Dialer) -> Result<Http2Conn, String> {
        let sender = dialer.http2().await?;
        Ok(Http2Conn {
            sender: tokio::sync::Mutex::new(Some(sender)),
            opened: AtomicUsize::new(1),
        })
    }

    /// A handle on the connection for one stream (waits for stream
    /// capacity).
    pub async fn get(&self, dialer: &Dialer) -> Result<http2::SendRequest<Body>, String> {
        let mut sender = {
            let mut current = self.sender.lock().await;
            match current.as_ref() {
                Some(s) if !s.is_closed() => s.clone(),
                _ => {
                    let s = dialer.http2().await?;
                    self.opened.fetch_add(1, Ordering::Relaxed);
                    *current = Some(s.clone());
                    s
                }
            }
        };
        sender.ready().await.map_err(|e| e.to_string())?;
        Ok(sender)
    }
}

/// Either kind of connection to one target.
#[derive(Debug)]
pub enum Connections {
    /// HTTP/1.1 pool.
    H1(Http1Pool),
    /// One HTTP/2 connection.
    H2(Http2Conn),
}

/// The connection a request went out on, to give back after its body.
pub enum Used {
    /// An HTTP/1.1 connection: back to the pool once the body is read.
    H1(http1::SendRequest<Body>),
    /// HTTP/2: nothing to give back.
    H2,
}

impl Connections {
    /// Opens the transport the dialer's HTTP version asks for (HTTP/1.1:
    /// one connection, to fail fast on a wrong address).
    pub async fn connect(dialer: &Dialer) -> Result<Connections, String> {
        Ok(match dialer.version {
            HttpVersion::Http1 => {
                let pool = Http1Pool::default();
                let first = pool.checkout(dialer).await?;
                pool.checkin(first);
                Connections::H1(pool)
            }
            HttpVersion::Http2 => Connections::H2(Http2Conn::connect(dialer).await?),
        })
    }

    /// Sends a request; the response's head has arrived when this returns.
    pub async fn send(
        &self,
        dialer: &Dialer,
        req: Request<Body>,
    ) -> Result<(Response<Incoming>, Used), String> {
        match self {
            Connections::H1(pool) => {
                let mut sender = pool.checkout(dialer).await?;
                let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
                Ok((resp, Used::H1(sender)))
            }
            Connections::H2(conn) => {
                let mut sender = conn.get(dialer).await?;
                let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
                Ok((resp, Used::H2))
            }
        }
    }

    /// Gives a connection back after its response body was read to the end.
    pub fn release(&self, used: Used) {
        if let (Connections::H1(pool), Used::H1(sender)) = (self, used) {
            pool.checkin(sender);
        }
    }

    /// Connections opened so far.
    pub fn opened(&self) -> usize {
        match self {
            Connections::H1(p) => p.opened.load(Ordering::Relaxed),
            Connections::H2(c) => c.opened.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Backend, Balance, Endpoint};

    fn dialer(url: &str, http: HttpVersion) -> Dialer {
        let conn = ConnConfig {
            backend: Backend::Openai,
            endpoint: Endpoint::Completions,
            model: None,
            api_key: None,
            tls_ca: None,
            http,
            channels: 1,
            balance: Balance::Rr,
            extra_inputs: Vec::new(),
        };
        Dialer::new(url, &conn).expect("dialer")
    }

    #[test]
    fn paths_and_uris() {
        let d = dialer("http://h:8000", HttpVersion::Http1);
        assert_eq!(d.path("/completions"), "/v1/completions");
        assert_eq!(d.uri(&d.path("/models")), "/v1/models");
        assert_eq!(d.authority, "h:8000");
        let d = dialer("http://h:8000/v1", HttpVersion::Http2);
        assert_eq!(d.path("/chat/completions"), "/v1/chat/completions");
        assert_eq!(d.uri("/v1/models"), "http://h:8000/v1/models");
        let d = dialer("http://[::1]/api", HttpVersion::Http1);
        assert_eq!((d.host.as_str(), d.port), ("::1", 80));
        assert_eq!(d.path("/completions"), "/api/v1/completions");
    }
}
