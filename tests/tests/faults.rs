//! Faults: client disconnects, a full queue, SIGTERM, malformed requests and
//! deadlines. Each test ends asserting 0 KV blocks used, 0 active sequences,
//! an empty queue, health SERVING and that a fresh request still completes
//! (`Server::assert_idle_and_serving`), except the SIGTERM tests, which end
//! with the process exiting 0.
//!
//! Several tests need requests to *wait* in the pending queue: they hold
//! every KV block with a [`Blocker`] (see `ember_tests::blocker`) and release
//! it when the test has seen what it needs. Work that must last a while is
//! sized from the server's measured decode step time, so the tests hold on a
//! fast release build as on a slow debug one.
//!
//! Tolerances (also in docs/testing.md):
//! - "at once" for RESOURCE_EXHAUSTED: the rejection arrives within 1 s (it is
//!   milliseconds; the bound is for a loaded 2-core CI machine).
//! - deadlines: DEADLINE_EXCEEDED no earlier than the deadline minus 5 ms and
//!   no later than the deadline + 3 s.
//! - SIGTERM: the process exits within `--shutdown-timeout` + 10 s; no stream
//!   ends later than SIGTERM + `--shutdown-timeout` + 3 s.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ember_common::pb::{generate_response::Event, FinishReason, GenerateRequest, SamplingParams};
use ember_tests::blocker::{self, Blocker};
use ember_tests::client::{self, Client};
use ember_tests::server::Server;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;
use tokio_stream::StreamExt;
use tonic::Code;

fn counters(s: &Server) -> ember_common::pb::Counters {
    s.info().counters.unwrap_or_default()
}

// ---------------------------------------------------------------------------

/// Where a random-disconnect stream is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum DropAt {
    /// The whole call is abandoned after a random 0-2 ms: before the request
    /// left, during tokenization/enqueue, or while queued.
    Abort,
    /// Right after `started` (enqueued): queued or just admitted.
    AfterStarted,
    /// A random 0-3 decode steps after `started`: queued, in prefill or early decode.
    AfterStartedSleep,
    /// After k tokens, 1 <= k < max_new_tokens: mid-decode (k = 1: right after prefill).
    AfterTokens,
}

/// N >= 200 streams on 4 connections, 32 at a time, each dropped at a random
/// point. Every stream that reached `started` must end up finished or
/// cancelled on the server; some must never be admitted; afterwards nothing
/// is leaked.
#[test]
fn random_disconnects_free_everything() {
    const N: usize = 200;
    const MAX_NEW: u32 = 8;
    let seed: u64 = std::env::var("EMBER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("random_disconnects seed {seed} (set EMBER_TEST_SEED to replay)");
    let server = Server::tiny(
        "fault-disconnect",
        &["--max-batch-size", "8", "--max-pending", "1024"],
    );
    let addr = server.addr();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Sleeps after `started` span 0..3 decode steps: queued, in prefill or
    // just after it, whatever the build's speed.
    let step = rt.block_on(client::step_time(addr)).unwrap();
    let sleep_max_us = (3 * step.as_micros() as u64).max(1000);
    eprintln!("decode step {step:?}: AfterStartedSleep drops within 0..{sleep_max_us} us");
    let before = counters(&server);
    let (results, max_queue) = rt
        .block_on(async move {
            let mut clients = Vec::new();
            for _ in 0..4 {
                clients.push(client::connect(addr).await?);
            }
            // Sample the server's queue while the drops happen.
            let running = Arc::new(AtomicBool::new(true));
            let max_queue = Arc::new(AtomicU32::new(0));
            let sampler = {
                let (running, max_queue) = (running.clone(), max_queue.clone());
                let mut c = clients[0].clone();
                tokio::spawn(async move {
                    while running.load(Ordering::SeqCst) {
                        if let Ok(i) = c
                            .get_server_info(ember_common::pb::GetServerInfoRequest {})
                            .await
                        {
                            max_queue.fetch_max(i.into_inner().queue_depth, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                })
            };
            let sem = Arc::new(tokio::sync::Semaphore::new(32));
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut tasks = Vec::new();
            for i in 0..N {
                let plan = match rng.random_range(0..4) {
                    0 => DropAt::Abort,
                    1 => DropAt::AfterStarted,
                    2 => DropAt::AfterStartedSleep,
                    _ => DropAt::AfterTokens,
                };
                let wait_us = rng.random_range(
                    0..if plan == DropAt::Abort {
                        2000
                    } else {
                        sleep_max_us
                    },
                );
                let k = rng.random_range(1..MAX_NEW) as usize;
                // Prompts of varied length vary the prefill time.
                let words = rng.random_range(1..40);
                let prompt = (0..words)
                    .map(|w| format!("word{}", (i + w) % 97))
                    .collect::<Vec<_>>()
                    .join(" ");
                let mut c = clients[i % clients.len()].clone();
                let permit = sem.clone().acquire_owned().await.unwrap();
                tasks.push(tokio::spawn(async move {
                    let _permit = permit;
                    let req = client::text_request(&prompt, MAX_NEW, true);
                    let r =
                        run_and_drop(&mut c, req, plan, Duration::from_micros(wait_us), k).await;
                    (plan, r)
                }));
            }
            let mut results = Vec::new();
            for t in tasks {
                results.push(t.await?);
            }
            running.store(false, Ordering::SeqCst);
            sampler.await?;
            anyhow::Ok((results, max_queue.load(Ordering::SeqCst)))
        })
        .unwrap();

    let mut table: BTreeMap<DropAt, (usize, usize, usize)> = BTreeMap::new(); // (n, started, completed)
    let mut started = 0u64;
    for (plan, r) in &results {
        let (seen_started, completed) = r.as_ref().unwrap_or_else(|e| panic!("{plan:?}: {e:#}"));
        let e = table.entry(*plan).or_default();
        e.0 += 1;
        e.1 += *seen_started as usize;
        e.2 += *completed as usize;
        started += *seen_started as u64;
    }
    eprintln!("drop plan -> (streams, saw started, completed anyway): {table:?}; max queue depth seen {max_queue}");
    for plan in [
        DropAt::Abort,
        DropAt::AfterStarted,
        DropAt::AfterStartedSleep,
        DropAt::AfterTokens,
    ] {
        assert!(
            table.get(&plan).map_or(0, |e| e.0) >= 20,
            "too few {plan:?} drops: {table:?}"
        );
    }

    let idle = server.assert_idle_and_serving();
    let after = idle.counters.unwrap_or_default();
    let d = |a: u64, b: u64| a - b;
    let (received, admitted) = (
        d(after.received, before.received),
        d(after.admitted, before.admitted),
    );
    let ended = d(after.finished, before.finished)
        + d(after.cancelled, before.cancelled)
        + d(after.deadline_exceeded, before.deadline_exceeded)
        + d(after.failed, before.failed);
    eprintln!("counters before {before:?}\ncounters after {after:?}");
    assert!(
        d(after.cancelled, before.cancelled) > 0,
        "no cancellation counted"
    );
    assert!(
        started <= ended && ended <= N as u64,
        "every stream that was enqueued ends finished or cancelled: {started} saw started, {ended} ended"
    );
    assert!(
        admitted < received,
        "some streams must be dropped before admission: received {received}, admitted {admitted}"
    );
    assert!(
        max_queue > 0,
        "the queue never held a request while drops happened"
    );
}

/// Runs one stream and drops it per `plan`. Returns (saw started, completed
/// before the drop point); an error status before the drop is a failure.
async fn run_and_drop(
    c: &mut Client,
    req: GenerateRequest,
    plan: DropAt,
    wait: Duration,
    k: usize,
) -> anyhow::Result<(bool, bool)> {
    if plan == DropAt::Abort {
        let mut c2 = c.clone();
        let fut = async move {
            let mut s = c2.generate(req).await?.into_inner();
            while let Some(m) = s.next().await {
                m?;
            }
            Ok::<_, tonic::Status>(())
        };
        return match tokio::time::timeout(wait, fut).await {
            Err(_) => Ok((false, false)),
            Ok(Ok(())) => Ok((true, true)),
            Ok(Err(s)) => Err(anyhow::anyhow!("error before the drop: {s}")),
        };
    }
    let mut stream = c
        .generate(req)
        .await
        .map_err(|s| anyhow::anyhow!("call failed: {s}"))?
        .into_inner();
    let mut started = false;
    let mut tokens = 0usize;
    loop {
        let msg = match stream.next().await {
            None => anyhow::bail!("stream ended without finished"),
            Some(Err(s)) => anyhow::bail!("error before the drop: {s}"),
            Some(Ok(m)) => m,
        };
        match msg.event {
            Some(Event::Started(_)) => {
                started = true;
                match plan {
                    DropAt::AfterStarted => return Ok((true, false)),
                    DropAt::AfterStartedSleep => {
                        // Drop after `wait` unless the stream finishes first.
                        let end = tokio::time::sleep(wait);
                        tokio::pin!(end);
                        loop {
                            tokio::select! {
                                _ = &mut end => return Ok((true, false)),
                                m = stream.next() => match m {
                                    Some(Ok(m)) if matches!(m.event, Some(Event::Finished(_))) => return Ok((true, true)),
                                    Some(Ok(_)) => {}
                                    Some(Err(s)) => anyhow::bail!("error before the drop: {s}"),
                                    None => anyhow::bail!("stream ended without finished"),
                                },
                            }
                        }
                    }
                    _ => {}
                }
            }
            Some(Event::Token(_)) => {
                tokens += 1;
                if tokens >= k {
                    return Ok((started, false));
                }
            }
            Some(Event::Finished(_)) => return Ok((started, true)),
            None => anyhow::bail!("message without event"),
        }
    }
}

// ---------------------------------------------------------------------------

/// More requests than `--max-pending` while they must wait (the blocker
/// holds every KV block): the first max-pending are accepted, the excess get
/// RESOURCE_EXHAUSTED at once, and every accepted request completes once the
/// blocker is released.
#[test]
fn queue_full_rejects_excess_at_once() {
    const MAX_PENDING: usize = 4;
    const SUBMIT: usize = 10;
    let mp = MAX_PENDING.to_string();
    let mut flags = vec!["--max-pending", mp.as_str(), "--max-batch-size", "4"];
    flags.extend_from_slice(blocker::FLAGS);
    let server = Server::tiny("fault-queue-full", &flags);
    let addr = server.addr();
    let before = counters(&server);
    let (accepted, rejected) = server
        .block_on(move || async move {
            let blocker = Blocker::start(addr).await?;
            let mut c = client::connect(addr).await?;
            let mut accepted = Vec::new();
            let mut rejected = Vec::new();
            for i in 0..SUBMIT as u32 {
                let t = Instant::now();
                match c.generate(client::ids_request(vec![50 + i, 51], 4)).await {
                    Ok(resp) => {
                        let mut s = resp.into_inner();
                        // The first message must be `started` (enqueued), at once.
                        let first = tokio::time::timeout(Duration::from_secs(5), s.next())
                            .await
                            .context("no first message within 5 s")?;
                        match first {
                            Some(Ok(m)) if matches!(m.event, Some(Event::Started(_))) => {}
                            Some(Err(st)) if st.code() == Code::ResourceExhausted => {
                                rejected.push((i, t.elapsed(), st.message().to_owned()));
                                continue;
                            }
                            other => {
                                anyhow::bail!("request {i}: unexpected first message {other:?}")
                            }
                        }
                        accepted.push(tokio::spawn(async move {
                            let mut out = client::StreamOutcome::new(t);
                            out.started = Some((Default::default(), Instant::now()));
                            while let Some(m) = s.next().await {
                                match m {
                                    Ok(m) => client::record(&mut out, m.event, Instant::now()),
                                    Err(st) => {
                                        out.status = Some(st);
                                        break;
                                    }
                                }
                            }
                            out
                        }));
                    }
                    Err(st) if st.code() == Code::ResourceExhausted => {
                        rejected.push((i, t.elapsed(), st.message().to_owned()));
                    }
                    Err(st) => anyhow::bail!("request {i}: unexpected status {st}"),
                }
            }
            client::wait_info(
                addr,
                Duration::from_secs(10),
                "queue depth = --max-pending",
                |i| i.queue_depth as usize == MAX_PENDING,
            )
            .await?;
            blocker.ensure_running("all submissions were made")?;
            blocker.release().await;
            let mut outs = Vec::new();
            for a in accepted {
                outs.push(a.await?);
            }
            anyhow::Ok((outs, rejected))
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    eprintln!("rejected (index, latency, message): {rejected:?}");
    assert_eq!(
        accepted.len(),
        MAX_PENDING,
        "accepted exactly --max-pending"
    );
    assert_eq!(
        rejected.len(),
        SUBMIT - MAX_PENDING,
        "the excess is rejected"
    );
    for (i, lat, _) in &rejected {
        assert!(
            *lat < Duration::from_secs(1),
            "request {i} rejected after {lat:?}, not at once"
        );
    }
    for a in &accepted {
        assert_eq!(a.code(), Code::Ok, "accepted request: {}", a.summary());
        assert_eq!(a.tokens.len(), 4, "accepted request: {}", a.summary());
        assert!(a.protocol_errors.is_empty(), "{}", a.summary());
    }
    let idle = server.assert_idle_and_serving();
    let after = idle.counters.unwrap_or_default();
    assert_eq!(
        after.rejected - before.rejected,
        (SUBMIT - MAX_PENDING) as u64,
        "rejected counter"
    );
}

// ---------------------------------------------------------------------------

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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
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

/// SIGTERM the moment a request is enqueued (its `started` arrived): it must
/// still be drained to completion, not lost. Drain must not conclude "idle"
/// from state that lags the request (e.g. gauges published once per
/// scheduler iteration).
#[test]
fn sigterm_just_after_enqueue_still_drains() {
    let mut server = Server::tiny("fault-sigterm-enqueue", &["--shutdown-timeout", "60"]);
    let addr = server.addr();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut c = rt.block_on(client::connect(addr)).unwrap();
    let (tx, rx) = oneshot::channel();
    let stream = rt.spawn(async move {
        let mut tx = Some(tx);
        client::generate_observed(
            &mut c,
            client::ids_request(vec![11, 12, 13], 6),
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
    let out = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(60), stream).await })
        .unwrap_or_else(|_| panic!("the stream hung after SIGTERM\n{}", server.stderr_tail(20)))
        .unwrap();
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
    let addr = server.addr();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut c = rt.block_on(client::connect(addr)).unwrap();
    let (tx, rx) = oneshot::channel();
    let stream = rt.spawn(async move {
        let mut tx = Some(tx);
        client::generate_observed(
            &mut c,
            client::ids_request(vec![11, 12, 13], 1000),
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
        .block_on(async { tokio::time::timeout(Duration::from_secs(4), stream).await })
        .unwrap_or_else(|_| {
            panic!(
                "the stream was still running 4 s after SIGTERM with --shutdown-timeout 1\n{}",
                server.stderr_tail(20)
            )
        })
        .unwrap();
    eprintln!(
        "ended {:?} after SIGTERM: {}",
        sigterm_at.elapsed(),
        out.summary()
    );
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

// ---------------------------------------------------------------------------

/// A table of malformed requests, each -> INVALID_ARGUMENT naming the field,
/// plus boundary requests that must be accepted.
#[test]
fn malformed_requests_get_invalid_argument() {
    const LIMIT: u32 = 8;
    let server = Server::tiny(
        "fault-malformed",
        &["--max-new-tokens-limit", &LIMIT.to_string()],
    );
    let addr = server.addr();
    let sampling = |t: Option<f32>, k: Option<i32>, p: Option<f32>| {
        Some(SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            seed: Some(7),
        })
    };
    let base = || client::text_request("Hello there", 2, true);
    let ids = |ids: Vec<u32>, n: u32| GenerateRequest {
        prompt_token_ids: ids,
        max_new_tokens: n,
        ignore_eos: true,
        ..Default::default()
    };
    // All cases at once: rejections are immediate, the accepted ones batch.
    // (case, request, Some(field names any of which the message must contain) = rejected; None = accepted)
    let cases: Vec<(&str, GenerateRequest, Option<&[&str]>)> = vec![
        (
            "empty prompt, no ids",
            GenerateRequest {
                prompt: String::new(),
                ..base()
            },
            Some(&["prompt"]),
        ),
        (
            "both prompt and ids",
            GenerateRequest {
                prompt_token_ids: vec![1, 2],
                ..base()
            },
            Some(&["prompt"]),
        ),
        (
            "token id = vocab size",
            ids(vec![1, 50257], 2),
            Some(&["prompt_token_ids"]),
        ),
        (
            "token id u32::MAX",
            ids(vec![u32::MAX], 2),
            Some(&["prompt_token_ids"]),
        ),
        (
            "prompt + max_new_tokens > context",
            ids(vec![1; 1000], 25),
            Some(&["max_new_tokens", "context"]),
        ),
        (
            "max_new_tokens 0",
            GenerateRequest {
                max_new_tokens: 0,
                ..base()
            },
            Some(&["max_new_tokens"]),
        ),
        (
            "max_new_tokens above limit",
            GenerateRequest {
                max_new_tokens: LIMIT + 1,
                ..base()
            },
            Some(&["max_new_tokens"]),
        ),
        (
            "temperature < 0",
            GenerateRequest {
                sampling: sampling(Some(-0.5), None, None),
                ..base()
            },
            Some(&["temperature"]),
        ),
        (
            "temperature NaN",
            GenerateRequest {
                sampling: sampling(Some(f32::NAN), None, None),
                ..base()
            },
            Some(&["temperature"]),
        ),
        (
            "top_p 0",
            GenerateRequest {
                sampling: sampling(None, None, Some(0.0)),
                ..base()
            },
            Some(&["top_p"]),
        ),
        (
            "top_p > 1",
            GenerateRequest {
                sampling: sampling(None, None, Some(1.5)),
                ..base()
            },
            Some(&["top_p"]),
        ),
        (
            "top_p < 0",
            GenerateRequest {
                sampling: sampling(None, None, Some(-0.1)),
                ..base()
            },
            Some(&["top_p"]),
        ),
        (
            "top_p NaN",
            GenerateRequest {
                sampling: sampling(None, None, Some(f32::NAN)),
                ..base()
            },
            Some(&["top_p"]),
        ),
        (
            "top_k < 0",
            GenerateRequest {
                sampling: sampling(None, Some(-1), None),
                ..base()
            },
            Some(&["top_k"]),
        ),
        // Boundaries that are valid.
        (
            "prompt + max_new_tokens = context",
            ids(vec![1; 1022], 2),
            None,
        ),
        (
            "max_new_tokens = limit",
            GenerateRequest {
                max_new_tokens: LIMIT,
                ..base()
            },
            None,
        ),
        (
            "top_p = 1",
            GenerateRequest {
                sampling: sampling(Some(0.8), None, Some(1.0)),
                ..base()
            },
            None,
        ),
        (
            "temperature 0, top_k 0",
            GenerateRequest {
                sampling: sampling(Some(0.0), Some(0), None),
                ..base()
            },
            None,
        ),
        (
            "top_k 5",
            GenerateRequest {
                sampling: sampling(Some(1.0), Some(5), Some(0.9)),
                ..base()
            },
            None,
        ),
        ("largest token id", ids(vec![50256, 0], 2), None),
    ];
    let results = server
        .block_on(move || async move {
            let c = client::connect(addr).await?;
            let mut tasks = Vec::new();
            for (name, req, expect) in cases {
                let mut c = c.clone();
                tasks.push(tokio::spawn(async move {
                    (name, expect, client::generate(&mut c, req, None).await)
                }));
            }
            let mut results = Vec::new();
            for t in tasks {
                results.push(t.await?);
            }
            anyhow::Ok(results)
        })
        .unwrap();
    let mut failures = Vec::new();
    for (name, expect, out) in &results {
        match expect {
            Some(fields) => {
                let msg = out
                    .status
                    .as_ref()
                    .map(|s| s.message().to_owned())
                    .unwrap_or_default();
                if out.code() != Code::InvalidArgument || !fields.iter().any(|f| msg.contains(f)) {
                    failures.push(format!(
                        "{name}: expected INVALID_ARGUMENT naming {fields:?}, got {}",
                        out.summary()
                    ));
                } else if out.started.is_some() {
                    failures.push(format!(
                        "{name}: rejected after `started`: {}",
                        out.summary()
                    ));
                }
            }
            None => {
                if out.code() != Code::Ok || out.tokens.is_empty() {
                    failures.push(format!("{name}: expected success, got {}", out.summary()));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        results.len(),
        failures.join("\n")
    );
    server.assert_idle_and_serving();
}

// ---------------------------------------------------------------------------

/// Short `grpc-timeout`s -> DEADLINE_EXCEEDED from the server (the client
/// only sends the header), both while running (a 1000-token request; the
/// deadline is 300 ms + 5 decode steps, so it has streamed tokens) and while
/// queued (behind the blocker, 100 ms); the blocks are freed; a generous
/// deadline is harmless.
#[test]
fn deadlines_exceeded_free_blocks() {
    let server = Server::tiny("fault-deadline", blocker::FLAGS);
    let addr = server.addr();
    let before = counters(&server);
    let (running, queued, generous) = server
        .block_on(move || async move {
            let step = client::step_time(addr).await?;
            let mut c = client::connect(addr).await?;
            // While running.
            let running_dl = Duration::from_millis(300) + 5 * step;
            let running = client::generate(
                &mut c,
                client::ids_request(vec![7, 8, 9, 10], 1000),
                Some(running_dl),
            )
            .await;
            client::wait_idle(addr, Duration::from_secs(5))
                .await
                .context("blocks freed after the running deadline")?;
            // While queued.
            let blocker = Blocker::start(addr).await?;
            let queued_dl = Duration::from_millis(100);
            let queued = client::generate(
                &mut c,
                client::ids_request(vec![7, 8, 9, 10], 20),
                Some(queued_dl),
            )
            .await;
            blocker.ensure_running("the queued request's deadline")?;
            blocker.release().await;
            // A deadline that does not expire.
            let generous = client::generate(
                &mut c,
                client::text_request("plenty of time", 4, true),
                Some(Duration::from_secs(60)),
            )
            .await;
            anyhow::Ok(((running, running_dl), (queued, queued_dl), generous))
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    for (what, (out, dl)) in [("running", &running), ("queued", &queued)] {
        assert_eq!(
            out.code(),
            Code::DeadlineExceeded,
            "{what}: {}",
            out.summary()
        );
        let took = out.status_at.unwrap().duration_since(out.call_start);
        assert!(
            took + Duration::from_millis(5) >= *dl && took <= *dl + Duration::from_secs(3),
            "{what}: DEADLINE_EXCEEDED after {took:?} for a {dl:?} deadline"
        );
    }
    assert!(
        !running.0.tokens.is_empty(),
        "the running request streamed no token before its deadline: {}",
        running.0.summary()
    );
    assert!(
        queued.0.tokens.is_empty(),
        "the queued request got tokens, so it was admitted: {}",
        queued.0.summary()
    );
    assert_eq!(
        generous.code(),
        Code::Ok,
        "generous deadline: {}",
        generous.summary()
    );
    let idle = server.assert_idle_and_serving();
    let after = idle.counters.unwrap_or_default();
    // Counters: 2 deadlines + the released blocker (cancelled). The queued
    // deadline is always counted as deadline_exceeded. The running one can be
    // counted as cancelled instead: the stream task sends Cancel(deadline) and
    // drops its event receiver; if the scheduler's in-flight iteration sends a
    // token first, the failed send marks the client gone (worker.rs) and the
    // later Cancel finds nothing. Reported; tighten to == 2 once fixed.
    let dl = after.deadline_exceeded - before.deadline_exceeded;
    let cancelled = after.cancelled - before.cancelled;
    assert!(
        dl >= 1 && dl + cancelled == 3,
        "deadline_exceeded +{dl}, cancelled +{cancelled}: {after:?}"
    );
    if dl < 2 {
        eprintln!(
            "NOTE: the running request's deadline was counted as cancelled (known server race)"
        );
    }
}
