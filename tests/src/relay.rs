//! A delaying TCP relay: a stand-in for `netem delay`, which this kernel lacks.
//!
//! Every accepted connection is paired with a fresh connection to the
//! upstream. In each direction a reader task reads whatever is available,
//! stamps it with the read instant and queues it; a writer task forwards each
//! chunk at exactly `read instant + delay` (tokio timers round up to the next
//! millisecond, so the actual delay is in `[delay, delay + ~2 ms]`). Reading
//! never waits for writing, so the delay does not accumulate: a burst of
//! small writes arrives spread as it was sent, shifted by `delay`, not one
//! `delay` per chunk. Order is kept per direction; an EOF (or read error) is
//! forwarded as a write shutdown after the same delay. Both sockets use
//! TCP_NODELAY so Nagle adds nothing.
//!
//! With delay `d` on the path client -> relay -> server, a request/response
//! exchange costs at least `2d` more than without it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Chunks queued per direction before the reader waits (back-pressure like a
/// TCP window; 64 KiB reads, so at most 64 MiB in flight).
const QUEUE_CHUNKS: usize = 1024;

/// Accepts connections on `listener` forever, relaying each to `upstream`
/// with `delay` in each direction.
pub async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    delay: Duration,
) -> std::io::Result<()> {
    loop {
        let (down, _) = listener.accept().await?;
        tokio::spawn(async move {
            if let Err(e) = relay_connection(down, upstream, delay).await {
                eprintln!("delay_relay: connection to {upstream}: {e}");
            }
        });
    }
}

/// Relays one accepted connection until both directions have ended.
pub async fn relay_connection(
    down: TcpStream,
    upstream: SocketAddr,
    delay: Duration,
) -> std::io::Result<()> {
    let up = TcpStream::connect(upstream).await?;
    down.set_nodelay(true)?;
    up.set_nodelay(true)?;
    let (down_r, down_w) = down.into_split();
    let (up_r, up_w) = up.into_split();
    let a = tokio::spawn(pipe(down_r, up_w, delay));
    let b = tokio::spawn(pipe(up_r, down_w, delay));
    let _ = a.await;
    let _ = b.await;
    Ok(())
}

/// One direction: a reader that stamps chunks and a writer that releases each
/// at its stamp + `delay`.
async fn pipe(mut r: OwnedReadHalf, mut w: OwnedWriteHalf, delay: Duration) {
    // None = EOF or read error: shut the write side down.
    let (tx, mut rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>(QUEUE_CHUNKS);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let chunk = match r.read(&mut buf).await {
                Ok(0) | Err(_) => None,
                Ok(n) => Some(buf[..n].to_vec()),
            };
            let done = chunk.is_none();
            if tx.send((Instant::now(), chunk)).await.is_err() || done {
                break;
            }
        }
    });
    while let Some((read_at, chunk)) = rx.recv().await {
        tokio::time::sleep_until(read_at + delay).await;
        match chunk {
            Some(bytes) => {
                if w.write_all(&bytes).await.is_err() {
                    break;
                }
            }
            None => {
                let _ = w.shutdown().await;
                break;
            }
        }
    }
    // The writer is gone (peer closed or EOF forwarded): stop reading.
    drop(rx);
    reader.abort();
}

/// Starts the `delay_relay` binary at `bin` (inside `netns` if given),
/// listening on `listen` (port 0 picks one) and forwarding to `upstream` with
/// `delay` each way. Its stderr goes to `dir/relay.stderr`.
pub fn spawn_process(
    bin: &std::path::Path,
    listen: &str,
    upstream: SocketAddr,
    delay: Duration,
    netns: Option<&str>,
    dir: &std::path::Path,
) -> anyhow::Result<crate::process::Announced> {
    let args = vec![
        "--listen".to_owned(),
        listen.to_owned(),
        "--upstream".into(),
        upstream.to_string(),
        "--delay-ms".into(),
        format!("{}", delay.as_secs_f64() * 1000.0),
    ];
    crate::process::spawn(
        "delay_relay",
        bin,
        &args,
        netns,
        &dir.join("relay.stderr"),
        Duration::from_secs(30),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts an echo server and a relay in front of it; returns the relay's address.
    async fn echo_behind_relay(delay: Duration) -> SocketAddr {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    s.set_nodelay(true).unwrap();
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay.local_addr().unwrap();
        tokio::spawn(serve(relay, echo_addr, delay));
        relay_addr
    }

    /// One byte there and back costs 2d: d each way, no more than a few ms extra.
    #[tokio::test]
    async fn echo_round_trip_is_two_delays() {
        let d = Duration::from_millis(30);
        let addr = echo_behind_relay(d).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let mut rtts = Vec::new();
        for i in 0..5u8 {
            let t = std::time::Instant::now();
            s.write_all(&[i]).await.unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.unwrap();
            assert_eq!(b[0], i);
            rtts.push(t.elapsed());
        }
        for rtt in &rtts {
            assert!(*rtt >= 2 * d, "RTT {rtt:?} < 2d = {:?}", 2 * d);
        }
        let mut sorted = rtts.clone();
        sorted.sort();
        // Median within 2d + 10 ms (timer rounding is ~1 ms per hop).
        assert!(
            sorted[2] <= 2 * d + Duration::from_millis(10),
            "RTTs {rtts:?}"
        );
    }

    /// 100 small writes sent back to back all come back about 2d after they
    /// were sent: the relay queues with timestamps, it does not sleep d per
    /// chunk in series (which would take 100 * 2d = 6 s).
    #[tokio::test]
    async fn burst_is_not_serialised() {
        let d = Duration::from_millis(30);
        let addr = echo_behind_relay(d).await;
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let (mut r, mut w) = s.into_split();
        let t0 = std::time::Instant::now();
        let writer = tokio::spawn(async move {
            for i in 0..100u32 {
                w.write_all(&i.to_be_bytes()).await.unwrap();
                // Yield so writes go out as separate segments where possible.
                tokio::task::yield_now().await;
            }
            w
        });
        let mut buf = vec![0u8; 400];
        r.read_exact(&mut buf).await.unwrap();
        let total = t0.elapsed();
        let _w = writer.await.unwrap();
        let got: Vec<u32> = buf
            .chunks(4)
            .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, (0..100).collect::<Vec<_>>(), "order preserved");
        assert!(total >= 2 * d, "all 100 back after {total:?} < 2d");
        assert!(
            total <= 2 * d + Duration::from_millis(40),
            "100 writes took {total:?}; expected ~2d"
        );
    }

    /// Writes spaced 2 ms apart over 200 ms each arrive d after they were sent
    /// (one-way through the relay to a sink), so the spacing is preserved.
    #[tokio::test]
    async fn spaced_writes_each_delayed_once() {
        let d = Duration::from_millis(25);
        let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sink_addr = sink.local_addr().unwrap();
        let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = relay.local_addr().unwrap();
        tokio::spawn(serve(relay, sink_addr, d));
        let recv = tokio::spawn(async move {
            let (mut s, _) = sink.accept().await.unwrap();
            let mut arrivals = Vec::new();
            let mut b = [0u8; 4];
            while s.read_exact(&mut b).await.is_ok() {
                arrivals.push((u32::from_be_bytes(b), std::time::Instant::now()));
            }
            arrivals
        });
        let mut s = TcpStream::connect(relay_addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let mut sent = Vec::new();
        for i in 0..100u32 {
            sent.push(std::time::Instant::now());
            s.write_all(&i.to_be_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        s.shutdown().await.unwrap();
        let arrivals = recv.await.unwrap();
        assert_eq!(arrivals.len(), 100);
        let mut late = Vec::new();
        for (i, (seq, at)) in arrivals.iter().enumerate() {
            assert_eq!(*seq as usize, i, "order preserved");
            let one_way = at.duration_since(sent[i]);
            assert!(one_way >= d, "chunk {i} arrived after {one_way:?} < d");
            late.push(one_way);
        }
        late.sort();
        let median = late[late.len() / 2];
        let max = *late.last().unwrap();
        assert!(
            median <= d + Duration::from_millis(5),
            "median one-way {median:?}"
        );
        // No accumulation: the last write is delayed about as much as the first.
        assert!(max <= d + Duration::from_millis(30), "max one-way {max:?}");
    }

    /// EOF is forwarded (after the delay) and the echo side's EOF comes back.
    #[tokio::test]
    async fn eof_propagates() {
        let d = Duration::from_millis(10);
        let addr = echo_behind_relay(d).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"bye").await.unwrap();
        s.shutdown().await.unwrap();
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut all))
            .await
            .expect("EOF came back")
            .unwrap();
        assert_eq!(all, b"bye");
    }
}
