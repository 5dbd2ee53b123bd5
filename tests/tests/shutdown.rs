//! Faults: SIGTERM, with in-flight, queued and just-enqueued requests. Each
//! test ends with the process exiting 0.
//!
//! Some tests run the server with the blocker's small cache
//! (`ember_tests::blocker::FLAGS`) so that requests queue behind each other
//! for KV blocks. Work that must last a while is sized from the server's
//! measured decode step time, so the tests hold on a fast release build as
//! on a slow debug one.
//!
//! Tolerances (also in docs/testing.md): the process exits within
//! `--shutdown-timeout` + 10 s; no stream ends later than SIGTERM +
//! `--shutdown-timeout` + 3 s.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_common::pb::FinishReason;
use ember_tests::blocker;
use ember_tests::client::{self};
use ember_tests::server::Server;
use tokio::sync::oneshot;
use tonic::Code;

/// SIGTERM with a generous `--shutdown-timeout`: in-flight streams run to
/// completion, a new Generate gets UNAVAILABLE while they still run, health
/// is not SERVING, and the process exits 0. The streams are sized from the
/// measured decode step to last at least ~2 s after their first token.
#[test]
fn sigterm_drains_inflight_and_rejects_new() {
    const STREAMS: usize = 4;
    let mut server = Server::tiny(
        "fault-sigterm-drain",
        &["--shutdown-timeout", "60", "--max-batch-size", "8"],
    );
    let addr = server.addr();
    let rt = ember_tests::test_runtime();
    let step = rt.block_on(client::step_time(addr)).unwrap();
    let max_new = ((2.0 / step.as_secs_f64().max(1e-4)).ceil() as u32).clamp(10, 1000);
    eprintln!("decode step {step:?}: {STREAMS} streams x {max_new} tokens");
    let c = rt.block_on(client::connect(addr)).unwrap();
    let live = Arc::new(AtomicU32::new(STREAMS as u32));
    let mut first_tokens = Vec::new();
    let mut streams = Vec::new();
    for i in 0..STREAMS as u32 {
        let (tx, rx) = oneshot::channel();
        first_tokens.push(rx);
        let mut c = c.clone();
        let live = live.clone();
        streams.push(rt.spawn(async move {
            let mut tx = Some(tx);
            let out = client::generate_observed(
                &mut c,
                client::ids_request(vec![100 + i, 200, 300], max_new),
                None,
                |o| {
                    if !o.tokens.is_empty() || o.status.is_some() {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(());
                        }
                    }
                },
            )
            .await;
            live.fetch_sub(1, Ordering::SeqCst);
            out
        }));
    }
    rt.block_on(async {
        for rx in first_tokens {
            let _ = rx.await;
        }
    });
    server.sigterm();
    let sigterm_at = Instant::now();

    // A new request, on a new connection and on the existing one, until one
    // is refused with UNAVAILABLE (the server needs a moment to start
    // draining; anything accepted before that must also complete).
    let (unavailable, late_accepted, health_during) = rt.block_on(async {
        let mut late = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = None;
        while Instant::now() < deadline {
            for fresh in [true, false] {
                let mut cc = if fresh {
                    match client::connect(addr).await {
                        Ok(cc) => cc,
                        // The listener is closed: that refuses new work too.
                        Err(e) => {
                            seen.get_or_insert((
                                format!("connect refused: {e:#}"),
                                live.load(Ordering::SeqCst),
                            ));
                            continue;
                        }
                    }
                } else {
                    c.clone()
                };
                let out =
                    client::generate(&mut cc, client::text_request("too late", 2, true), None)
                        .await;
                match out.code() {
                    Code::Unavailable => {
                        seen.get_or_insert((
                            format!("UNAVAILABLE: {}", out.status.as_ref().unwrap().message()),
                            live.load(Ordering::SeqCst),
                        ));
                    }
                    Code::Ok => late.push(out),
                    other => panic!(
                        "new request during drain got {other:?} (expected UNAVAILABLE): {}",
                        out.summary()
                    ),
                }
            }
            if seen.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let h = client::health_both(addr).await;
        (seen, late, h)
    });
    let (how, live_then) = unavailable.expect("no new request was refused within 5 s of SIGTERM");
    eprintln!("refused new work: {how}; {live_then} streams still running; health during drain: {health_during:?}");
    assert!(
        live_then > 0,
        "premise: the in-flight streams had all ended before the refusal was seen"
    );
    if let Ok(h) = health_during {
        assert_ne!(
            h,
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            "health SERVING while draining"
        );
    }
    for s in streams {
        let out = rt.block_on(s).unwrap();
        assert_eq!(
            out.code(),
            Code::Ok,
            "in-flight stream did not complete: {}",
            out.summary()
        );
        assert_eq!(out.finish_reason(), Some(FinishReason::Length));
        assert_eq!(out.tokens.len(), max_new as usize);
    }
    for out in late_accepted {
        assert_eq!(
            out.tokens.len(),
            2,
            "accepted before drain started but not completed: {}",
            out.summary()
        );
    }
    let status = server
        .wait_exit(Duration::from_secs(60 + 10))
        .expect("server did not exit after draining");
    assert!(
        status.success(),
        "exit status {status}\n{}",
        server.stderr_tail(30)
    );
    eprintln!("exited {status} {:?} after SIGTERM", sigterm_at.elapsed());
}

/// SIGTERM with `--shutdown-timeout 1` while far more work is in flight than
/// fits in 1 s (one 1000-token request running and seven more queued behind
/// it for KV blocks): what is left after the timeout is cancelled with a clear
/// end (FINISH_REASON_CANCELLED or UNAVAILABLE), no stream hangs, exit 0.
#[test]
fn sigterm_cancels_what_outlives_shutdown_timeout() {
    const STREAMS: usize = 8;
    const TIMEOUT_S: u64 = 1;
    let mut flags = vec!["--shutdown-timeout", "1", "--max-batch-size", "8"];
    flags.extend_from_slice(blocker::FLAGS);
    let mut server = Server::tiny("fault-sigterm-timeout", &flags);
    let addr = server.addr();
    let rt = ember_tests::test_runtime();
    let c = rt.block_on(client::connect(addr)).unwrap();
    let mut ready = Vec::new();
    let mut streams = Vec::new();
    for i in 0..STREAMS as u32 {
        let (tx, rx) = oneshot::channel();
        ready.push(rx);
        let mut c = c.clone();
        streams.push(rt.spawn(async move {
            let mut tx = Some(tx);
            // 4 + 1000 tokens: 8 blocks of 128, the whole cache: one runs at a time.
            client::generate_observed(
                &mut c,
                client::ids_request(vec![10 + i, 20, 30, 40], 1000),
                None,
                |o| {
                    let running_or_queued = if i == 0 {
                        !o.tokens.is_empty()
                    } else {
                        o.started.is_some()
                    };
                    if running_or_queued || o.status.is_some() {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(());
                        }
                    }
                },
            )
            .await
        }));
        if i == 0 {
            // The first one is admitted before the rest queue behind it.
            rt.block_on(ready.pop().unwrap()).unwrap();
        }
    }
    rt.block_on(async {
        for rx in ready {
            let _ = rx.await;
        }
        // The server's own view agrees (its gauges are published once per
        // iteration): one running, the rest queued.
        client::wait_info(addr, Duration::from_secs(10), "1 running + 7 queued", |i| {
            i.active_sequences == 1 && i.queue_depth as usize == STREAMS - 1
        })
        .await
        .unwrap();
    });
    server.sigterm();
    let sigterm_at = Instant::now();
    let limit = Duration::from_secs(TIMEOUT_S + 3);
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for s in streams {
        let out = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), s).await })
            .expect("a stream hung after SIGTERM")
            .unwrap();
        let end_at = out
            .status_at
            .or(out.finished.as_ref().map(|f| f.1))
            .unwrap_or_else(Instant::now);
        let kind = match (out.code(), out.finish_reason()) {
            (Code::Ok, Some(FinishReason::Length)) => {
                assert_eq!(out.tokens.len(), 1000, "{}", out.summary());
                "completed"
            }
            (Code::Ok, Some(FinishReason::Cancelled)) => "FINISH_REASON_CANCELLED",
            (Code::Unavailable, _) => "UNAVAILABLE",
            _ => panic!("unclear end after SIGTERM: {}", out.summary()),
        };
        assert!(
            end_at.saturating_duration_since(sigterm_at) <= limit,
            "a stream ended {:?} after SIGTERM (> timeout {TIMEOUT_S} s + 3 s): {}",
            end_at.saturating_duration_since(sigterm_at),
            out.summary()
        );
        *tally.entry(kind.into()).or_default() += 1;
    }
    eprintln!("after SIGTERM with --shutdown-timeout {TIMEOUT_S}: {tally:?}");
    let cancelled = tally.get("FINISH_REASON_CANCELLED").copied().unwrap_or(0)
        + tally.get("UNAVAILABLE").copied().unwrap_or(0);
    assert!(
        cancelled >= 1,
        "8 x 1000 tokens one at a time cannot finish in 1 s, yet none was cancelled: {tally:?}"
    );
    let status = server
        .wait_exit(Duration::from_secs(TIMEOUT_S + 10))
        .unwrap_or_else(|| {
            panic!(
                "server still running {:?} after SIGTERM",
                sigterm_at.elapsed()
            )
        });
    assert!(
        status.success(),
        "exit status {status}\n{}",
        server.stderr_tail(30)
    );
}

/// Starts a `max_new`-token request, sends SIGTERM the moment its `started`
/// arrives, and waits up to `limit` for the stream to end; returns how it
/// ended and how long after SIGTERM. Panics (with the server's log) if the
/// stream is still running at `limit`.
fn sigterm_once_enqueued(
    server: &mut Server,
    max_new: u32,
    limit: Duration,
) -> (client::StreamOutcome, Duration) {
    let rt = ember_tests::test_runtime();
    let mut c = rt.block_on(client::connect(server.addr())).unwrap();
    let (tx, rx) = oneshot::channel();
    let stream = rt.spawn(async move {
        let mut tx = Some(tx);
        client::generate_observed(
            &mut c,
            client::ids_request(vec![11, 12, 13], max_new),
            None,
            |o| {
                if o.started.is_some() || o.status.is_some() {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
            },
        )
        .await
    });
    rt.block_on(rx).unwrap();
    server.sigterm();
    let sigterm_at = Instant::now();
    let out = rt
        .block_on(async { tokio::time::timeout(limit, stream).await })
        .unwrap_or_else(|_| {
            panic!(
                "the stream was still running {limit:?} after SIGTERM\n{}",
                server.stderr_tail(20)
            )
        })
        .unwrap();
    (out, sigterm_at.elapsed())
}

/// SIGTERM the moment a request is enqueued (its `started` arrived): it must
/// still be drained to completion, not lost. Drain must not conclude "idle"
/// from state that lags the request (e.g. gauges published once per
/// scheduler iteration).
#[test]
fn sigterm_just_after_enqueue_still_drains() {
    let mut server = Server::tiny("fault-sigterm-enqueue", &["--shutdown-timeout", "60"]);
    let (out, _) = sigterm_once_enqueued(&mut server, 6, Duration::from_secs(60));
    assert_eq!(
        out.code(),
        Code::Ok,
        "enqueued before SIGTERM but not drained: {}\n{}",
        out.summary(),
        server.stderr_tail(20)
    );
    assert_eq!(out.tokens.len(), 6, "{}", out.summary());
    let status = server
        .wait_exit(Duration::from_secs(70))
        .expect("server did not exit");
    assert!(status.success(), "exit status {status}");
}

/// The same moment with `--shutdown-timeout 1` and a request far longer than
/// that (1000 tokens): the timeout still applies, so the stream ends
/// (cancelled) within about a second instead of running on while the server
/// waits for it.
#[test]
fn sigterm_just_after_enqueue_respects_timeout() {
    let mut server = Server::tiny(
        "fault-sigterm-enqueue-timeout",
        &["--shutdown-timeout", "1"],
    );
    let (out, after) = sigterm_once_enqueued(&mut server, 1000, Duration::from_secs(4));
    eprintln!("ended {after:?} after SIGTERM: {}", out.summary());
    let clear = matches!(
        (out.code(), out.finish_reason()),
        (
            Code::Ok,
            Some(FinishReason::Cancelled | FinishReason::Length)
        ) | (Code::Unavailable, _)
    );
    assert!(clear, "unclear end: {}", out.summary());
    let status = server
        .wait_exit(Duration::from_secs(11))
        .expect("server did not exit within timeout + 10 s");
    assert!(status.success(), "exit status {status}");
}
