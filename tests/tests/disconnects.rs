//! Faults: clients that disconnect at random points of their streams.
//! Each test ends asserting 0 KV blocks used, 0 active sequences, an empty
//! queue, health SERVING and that a fresh request still completes
//! (`Server::assert_idle_and_serving`).
//!
//! Waits are sized from the server's measured decode step time, so the test
//! holds on a fast release build as on a slow debug one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ember_common::pb::{generate_response::Event, GenerateRequest};
use ember_tests::client::{self, Client};
use ember_tests::server::Server;
use rand::{Rng, SeedableRng};
use tokio_stream::StreamExt;

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
    let rt = ember_tests::test_runtime();
    // Sleeps after `started` span 0..3 decode steps: queued, in prefill or
    // just after it, whatever the build's speed.
    let step = rt.block_on(client::step_time(addr)).unwrap();
    let sleep_max_us = (3 * step.as_micros() as u64).max(1000);
    eprintln!("decode step {step:?}: AfterStartedSleep drops within 0..{sleep_max_us} us");
    let before = server.counters();
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
            Some(Event::PromptLogprobs(_)) => {}
            None => anyhow::bail!("message without event"),
        }
    }
}
