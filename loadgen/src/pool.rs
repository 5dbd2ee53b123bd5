//! The connections: `--channels` HTTP/2 connections per target, opened before
//! the first run, with a count of the streams in flight on each.
//!
//! Request i goes to target `i % T`, and on it to channel `(i / T) % C`, so
//! requests spread evenly over every connection. A tonic `Channel` built by one
//! `Endpoint::connect` is one HTTP/2 connection; each carries many streams, and
//! the peak number of concurrent streams per connection is reported because
//! HTTP/2 `max_concurrent_streams` caps it (excess streams wait client-side and
//! show up as add_request latency).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ember_common::pb::inference_client::InferenceClient;
use ember_common::pb::{GetServerInfoRequest, ServerInfo};
use tonic::transport::{Channel, Endpoint};

use crate::error::Error;

/// How long opening one connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP/2 connection to one target.
#[derive(Debug)]
pub struct Conn {
    /// The target URL, copied into each request's record.
    pub target: String,
    /// Which of the target's `--channels` connections this is.
    pub channel: usize,
    /// The client over this connection; cloned per request (cheap).
    client: InferenceClient<Channel>,
    /// Streams open right now (submit start to stream end).
    in_flight: AtomicUsize,
    /// Peak of `in_flight` since the last [`Pool::reset_peaks`].
    peak: AtomicUsize,
}

/// Holds one stream's slot in its connection's in-flight count; dropping it
/// (stream finished, failed or abandoned) releases the slot.
#[derive(Debug)]
pub struct InFlight {
    /// The connection whose count this guard holds.
    conn: Arc<Conn>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Conn {
    /// A client for one request.
    pub fn client(&self) -> InferenceClient<Channel> {
        self.client.clone()
    }

    /// Counts a stream as open on this connection until the guard drops.
    pub fn open_stream(self: &Arc<Self>) -> InFlight {
        let now = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak.fetch_max(now, Ordering::AcqRel);
        InFlight { conn: self.clone() }
    }

    /// Peak concurrent streams since the last reset.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Acquire)
    }
}

/// Every connection of the benchmark, target-major (`conns[t * C + c]`).
#[derive(Debug)]
pub struct Pool {
    /// The connections.
    conns: Vec<Arc<Conn>>,
    /// Number of targets (T), for the round-robin.
    targets: usize,
    /// Connections per target (C).
    channels: usize,
}

impl Pool {
    /// Opens `channels` connections to each target now, so connection setup is
    /// not inside the first requests' latency and a wrong address fails fast.
    pub async fn connect(targets: &[String], channels: usize) -> Result<Pool, Error> {
        let mut conns = Vec::with_capacity(targets.len() * channels);
        for target in targets {
            let endpoint = Endpoint::from_shared(target.clone())
                .map_err(|source| Error::BadTarget {
                    target: target.clone(),
                    source,
                })?
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true);
            for channel in 0..channels {
                let ch = endpoint.connect().await.map_err(|source| Error::Connect {
                    target: target.clone(),
                    source,
                })?;
                conns.push(Arc::new(Conn {
                    target: target.clone(),
                    channel,
                    client: InferenceClient::new(ch),
                    in_flight: AtomicUsize::new(0),
                    peak: AtomicUsize::new(0),
                }));
            }
        }
        Ok(Pool {
            conns,
            targets: targets.len(),
            channels,
        })
    }

    /// The connection of request `index`.
    pub fn pick(&self, index: usize) -> Arc<Conn> {
        let target = index % self.targets;
        let channel = (index / self.targets) % self.channels;
        self.conns[target * self.channels + channel].clone()
    }

    /// Every connection, target-major.
    pub fn conns(&self) -> &[Arc<Conn>] {
        &self.conns
    }

    /// Starts a new peak count (called at the start of each run).
    pub fn reset_peaks(&self) {
        for c in &self.conns {
            c.peak
                .store(c.in_flight.load(Ordering::Acquire), Ordering::Release);
        }
    }

    /// The highest peak over all connections since the last reset.
    pub fn max_peak(&self) -> usize {
        self.conns.iter().map(|c| c.peak()).max().unwrap_or(0)
    }

    /// `GetServerInfo` of each target (first connection of each).
    pub async fn server_infos(&self) -> Vec<(String, Result<ServerInfo, tonic::Status>)> {
        let mut out = Vec::with_capacity(self.targets);
        for conn in self.conns.iter().step_by(self.channels) {
            let reply = conn
                .client()
                .get_server_info(GetServerInfoRequest {})
                .await
                .map(|r| r.into_inner());
            out.push((conn.target.clone(), reply));
        }
        out
    }
}
