//! The connections of a benchmark: per target, `--channels` gRPC or HTTP/2
//! connections (or one HTTP/1.1 pool), opened before the first run, with a
//! count of the streams in flight on each target and each connection.
//!
//! Which connection a request takes (`--balance`):
//! - `rr`: request i goes to target `i % T`, and on it to channel
//!   `(i / T) % C`, so requests spread evenly over every connection;
//! - `least`: the target with the fewest requests in flight (ties go
//!   round-robin), and on it the least busy channel.
//!
//! A request is counted as in flight from the moment it is picked (so a burst
//! of picks sees its own earlier picks) until its [`Lease`] drops. The peak of
//! concurrent streams per connection is reported because HTTP/2
//! `max_concurrent_streams` caps it (excess streams wait client-side and show
//! up as add_request latency).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::client::grpc::{GrpcConn, ServerLimits};
use crate::client::openai::HttpConn;
use crate::config::{Backend, Balance, ConnConfig};
use crate::error::Error;

/// One connection's client.
#[derive(Debug)]
pub enum Transport {
    /// A gRPC (HTTP/2) connection.
    Grpc(GrpcConn),
    /// An OpenAI HTTP/2 connection or HTTP/1.1 pool.
    Http(HttpConn),
}

/// One connection (or HTTP/1.1 pool) to one target.
#[derive(Debug)]
pub struct Conn {
    /// The target URL, copied into each request's record.
    pub target: String,
    /// Which of the target's `--channels` connections this is.
    pub channel: usize,
    /// The client.
    pub transport: Transport,
    /// Streams open right now (picked, not yet finished).
    in_flight: AtomicUsize,
    /// Peak of `in_flight` since the last [`Pool::reset_peaks`].
    peak: AtomicUsize,
}

impl Conn {
    /// Peak concurrent streams since the last reset.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Acquire)
    }

    /// Connections this entry stands for (an HTTP/1.1 pool: as many as it
    /// opened; otherwise 1).
    pub fn connections(&self) -> usize {
        match &self.transport {
            Transport::Grpc(_) => 1,
            Transport::Http(h) => h.connections(),
        }
    }
}

/// One target's connections and its in-flight count.
#[derive(Debug)]
struct Target {
    /// Its connections, channel order.
    conns: Vec<Arc<Conn>>,
    /// Requests in flight to this target.
    in_flight: Arc<AtomicUsize>,
}

/// Holds one request's place in its target's and connection's in-flight
/// counts; dropping it (stream finished, failed or abandoned) releases both.
#[derive(Debug)]
pub struct Lease {
    /// The connection to send on.
    pub conn: Arc<Conn>,
    /// Which target (in the order given) it is on.
    pub target_index: usize,
    /// The target's count.
    target: Arc<AtomicUsize>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.target.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Peak concurrent streams on one connection during a run.
#[derive(Debug, Clone, Serialize)]
pub struct ConnPeak {
    /// Target URL.
    pub target: String,
    /// Connection number on that target.
    pub channel: usize,
    /// Most streams open at once.
    pub max_streams: usize,
    /// Connections it stands for (an HTTP/1.1 pool's count; else 1).
    pub connections: usize,
}

/// Every connection of the benchmark.
#[derive(Debug)]
pub struct Pool {
    /// Per target, in the order given.
    targets: Vec<Target>,
    /// `--balance`.
    balance: Balance,
    /// Whether each target is one HTTP/1.1 pool rather than connections.
    http1: bool,
}

impl Pool {
    /// Opens the connections to each target now, so connection setup is not
    /// inside the first requests' latency and a wrong address fails fast.
    pub async fn connect(urls: &[String], conn: &ConnConfig) -> Result<Pool, Error> {
        let http1 = conn.is_http1();
        let channels = if http1 { 1 } else { conn.channels };
        let mut targets = Vec::with_capacity(urls.len());
        for url in urls {
            let mut conns = Vec::with_capacity(channels);
            for channel in 0..channels {
                let transport = match conn.backend {
                    Backend::Ember => Transport::Grpc(GrpcConn::connect(url, conn).await?),
                    Backend::Openai => Transport::Http(HttpConn::connect(url, conn).await?),
                };
                conns.push(Arc::new(Conn {
                    target: url.clone(),
                    channel,
                    transport,
                    in_flight: AtomicUsize::new(0),
                    peak: AtomicUsize::new(0),
                }));
            }
            targets.push(Target {
                conns,
                in_flight: Arc::new(AtomicUsize::new(0)),
            });
        }
        Ok(Pool {
            targets,
            balance: conn.balance,
            http1,
        })
    }

    /// The target URLs, in order.
    pub fn urls(&self) -> Vec<String> {
        self.targets
            .iter()
            .filter_map(|t| t.conns.first().map(|c| c.target.clone()))
            .collect()
    }

    /// Whether each target is an HTTP/1.1 pool (a stream per connection).
    pub fn is_http1(&self) -> bool {
        self.http1
    }

    /// The connection of request `index`, already counted as in flight.
    pub fn pick(&self, index: usize) -> Lease {
        let t = self.targets.len();
        let target = match self.balance {
            Balance::Rr => index % t,
            Balance::Least => {
                let best = least(&self.targets, index % t, |x| &x.in_flight);
                self.targets
                    .iter()
                    .position(|x| std::ptr::eq(x, best))
                    .unwrap_or(index % t)
            }
        };
        self.pick_on(target, index)
    }

    /// The connection of request `index` on target `target` (a session's
    /// later turns stay on its first turn's target).
    pub fn pick_on(&self, target_index: usize, index: usize) -> Lease {
        let t = self.targets.len();
        let target = &self.targets[target_index % t];
        let c = target.conns.len();
        let conn = match self.balance {
            Balance::Rr => &target.conns[(index / t) % c],
            Balance::Least => least(&target.conns, (index / t) % c, |x| &x.in_flight),
        };
        target.in_flight.fetch_add(1, Ordering::AcqRel);
        let now = conn.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        conn.peak.fetch_max(now, Ordering::AcqRel);
        Lease {
            conn: conn.clone(),
            target_index: target_index % t,
            target: target.in_flight.clone(),
        }
    }

    /// The first gRPC target's bounds (`--max-new-tokens none`); `None` for
    /// the OpenAI backend.
    pub fn server_limits(&self) -> Option<ServerLimits> {
        self.conns().find_map(|c| match &c.transport {
            Transport::Grpc(g) => Some(g.limits()),
            Transport::Http(_) => None,
        })
    }

    /// Every connection, target-major.
    pub fn conns(&self) -> impl Iterator<Item = &Arc<Conn>> {
        self.targets.iter().flat_map(|t| t.conns.iter())
    }

    /// Each connection's peak since the last reset.
    pub fn peaks(&self) -> Vec<ConnPeak> {
        self.conns()
            .map(|c| ConnPeak {
                target: c.target.clone(),
                channel: c.channel,
                max_streams: c.peak(),
                connections: c.connections(),
            })
            .collect()
    }

    /// Starts a new peak count (called at the start of each run).
    pub fn reset_peaks(&self) {
        for c in self.conns() {
            c.peak
                .store(c.in_flight.load(Ordering::Acquire), Ordering::Release);
        }
    }

    /// Model and device of each target (distinct values, comma-separated):
    /// gRPC `GetServerInfo`; the OpenAI model in use and no device (the API
    /// has none). "unknown" where a target does not answer.
    pub async fn describe(&self) -> (String, String) {
        let mut models: Vec<String> = Vec::new();
        let mut devices: Vec<String> = Vec::new();
        for conn in self.targets.iter().filter_map(|t| t.conns.first()) {
            let (model, device) = match &conn.transport {
                Transport::Grpc(g) => g.describe().await.unwrap_or_else(|e| {
                    tracing::warn!(target = %conn.target, error = %e, "no server info");
                    ("unknown".to_string(), "unknown".to_string())
                }),
                Transport::Http(h) => (h.model.clone(), "not reported (OpenAI API)".to_string()),
            };
            if !models.contains(&model) {
                models.push(model);
            }
            if !devices.contains(&device) {
                devices.push(device);
            }
        }
        (models.join(", "), devices.join(", "))
    }
}

/// The item with the smallest count, scanning from `start` so that ties go
/// round-robin.
fn least<T>(items: &[T], start: usize, count: impl Fn(&T) -> &AtomicUsize) -> &T {
    let n = items.len();
    let mut best = start % n;
    let mut best_count = count(&items[best]).load(Ordering::Acquire);
    for k in 1..n {
        let i = (start + k) % n;
        let c = count(&items[i]).load(Ordering::Acquire);
        if c < best_count {
            (best, best_count) = (i, c);
        }
    }
    &items[best]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_prefers_the_idle_and_breaks_ties_round_robin() {
        let counts: Vec<AtomicUsize> = [3, 1, 1, 5].into_iter().map(AtomicUsize::new).collect();
        let pick = |start| least(&counts, start, |c| c) as *const _;
        assert_eq!(pick(0), &counts[1] as *const _, "fewest in flight");
        assert_eq!(
            pick(2),
            &counts[2] as *const _,
            "a tie goes to the first from start"
        );
        assert_eq!(pick(3), &counts[1] as *const _);
        let idle: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        let picks: Vec<usize> = (0..3)
            .map(|s| {
                let p = least(&idle, s, |c| c) as *const AtomicUsize;
                idle.iter().position(|c| std::ptr::eq(c, p)).unwrap_or(99)
            })
            .collect();
        assert_eq!(picks, vec![0, 1, 2], "all idle: round-robin");
    }
}
