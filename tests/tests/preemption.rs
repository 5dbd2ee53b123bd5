//! Real traffic on a small KV cache, through the built server (tiny preset,
//! CPU): blocks are taken as sequences grow, running requests are preempted
//! when the pool runs dry and resumed by recompute, and priority serves an
//! urgent request ahead of a queue. These are issue 30's CPU targets:
//!
//! - `--kv-blocks 64` (16-token blocks) and 16 greedy requests of 200 new
//!   tokens: at least 12 run at once, preemptions happen, and every request
//!   emits exactly the 200 tokens it emits alone;
//! - `--max-batch-size 4 --scheduling-policy priority`: a priority-0 request
//!   sent behind 20 long priority-10 requests gets its first token in well
//!   under half the time a priority-10 request sent with it does.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ember_common::pb::{FinishReason, GenerateRequest};
use ember_tests::client::{self, StreamOutcome};
use ember_tests::server::Server;

const NEW_TOKENS: u32 = 200;

/// Request `i`'s prompt: 9 tokens, distinct per request.
fn prompt(i: u32) -> Vec<u32> {
    (0..9).map(|k| 300 + 37 * i + k).collect()
}

fn tokens(o: &StreamOutcome) -> Vec<u32> {
    o.tokens.iter().map(|(t, _)| t.token_id).collect()
}

#[test]
fn a_small_cache_runs_many_at_once_preempts_and_loses_no_token() {
    const REQUESTS: u32 = 16;
    let server = Server::tiny("preempt-kv64", &["--kv-blocks", "64"]);
    let addr = server.addr();
    let result = server.block_on(move || async move {
        // Peak running requests, sampled while the load runs.
        let peak = Arc::new(AtomicU32::new(0));
        let (p, stop) = (peak.clone(), Arc::new(AtomicU32::new(0)));
        let s = stop.clone();
        let watcher = tokio::spawn(async move {
            while s.load(Ordering::SeqCst) == 0 {
                if let Ok(info) = client::server_info(addr).await {
                    p.fetch_max(info.active_sequences, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        let mut tasks = Vec::new();
        for i in 0..REQUESTS {
            let mut c = client::connect(addr).await?;
            tasks.push(tokio::spawn(async move {
                client::generate(&mut c, client::ids_request(prompt(i), NEW_TOKENS), None).await
            }));
        }
        let mut together = Vec::new();
        for t in tasks {
            together.push(t.await?);
        }
        stop.store(1, Ordering::SeqCst);
        watcher.await?;
        let info = client::wait_idle(addr, Duration::from_secs(10)).await?;
        // Each alone, one after the other.
        let mut alone = Vec::new();
        let mut c = client::connect(addr).await?;
        for i in 0..REQUESTS {
            alone.push(
                client::generate(&mut c, client::ids_request(prompt(i), NEW_TOKENS), None).await,
            );
        }
        anyhow::Ok((together, alone, peak.load(Ordering::SeqCst), info))
    });
    let (together, alone, peak, info) =
        result.unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    let preemptions = info.counters.as_ref().map_or(0, |c| c.preemptions);
    eprintln!("peak running {peak}, preemptions {preemptions}");
    assert!(peak >= 12, "only {peak} ran at once");
    assert!(preemptions > 0, "nothing was preempted: {info:?}");
    let mut preempted_requests = 0;
    for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(
            t.finish_reason(),
            Some(FinishReason::Length),
            "{i}: {}",
            t.summary()
        );
        assert!(t.protocol_errors.is_empty(), "{i}: {:?}", t.protocol_errors);
        let indices: Vec<u32> = t.tokens.iter().map(|(tok, _)| tok.index).collect();
        assert_eq!(
            indices,
            (0..NEW_TOKENS).collect::<Vec<_>>(),
            "{i}: no gap, no repeat"
        );
        assert_eq!(tokens(t), tokens(a), "request {i}: pressured != alone");
        let timing = t
            .finished
            .as_ref()
            .and_then(|(f, _)| f.timing)
            .expect("timing");
        if timing.preemptions > 0 {
            preempted_requests += 1;
            assert!(timing.preempted_ns > 0, "{i}: {timing:?}");
        }
    }
    assert!(preempted_requests > 0);
    server.assert_idle_and_serving();
}

#[test]
fn an_urgent_request_overtakes_a_queue_of_long_low_priority_ones() {
    let server = Server::tiny(
        "preempt-priority",
        &["--max-batch-size", "4", "--scheduling-policy", "priority"],
    );
    let addr = server.addr();
    let result = server.block_on(move || async move {
        let request = |i: u32, n: u32, priority: i32| GenerateRequest {
            priority,
            ..client::ids_request(prompt(i), n)
        };
        let mut long = Vec::new();
        for i in 0..20 {
            let mut c = client::connect(addr).await?;
            long.push(tokio::spawn(async move {
                client::generate(&mut c, request(i, 150, 10), None).await
            }));
        }
        client::wait_info(
            addr,
            Duration::from_secs(10),
            "premise: the queue is full",
            |i| i.active_sequences + i.queue_depth == 20,
        )
        .await?;
        let (mut c10, mut c0) = (client::connect(addr).await?, client::connect(addr).await?);
        let late =
            tokio::spawn(async move { client::generate(&mut c10, request(20, 8, 10), None).await });
        let urgent = client::generate(&mut c0, request(21, 8, 0), None).await;
        let late = late.await?;
        for l in long {
            let o = l.await?;
            anyhow::ensure!(
                o.finish_reason() == Some(FinishReason::Length),
                "{}",
                o.summary()
            );
        }
        anyhow::Ok((urgent, late))
    });
    let (urgent, late) = result.unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    let ttft = |o: &StreamOutcome| {
        let t = o
            .finished
            .as_ref()
            .and_then(|(f, _)| f.timing)
            .expect("timing");
        Duration::from_nanos(t.server_ttft_ns)
    };
    eprintln!(
        "TTFT priority 0: {:?}, priority 10: {:?}",
        ttft(&urgent),
        ttft(&late)
    );
    assert_eq!(
        urgent.finish_reason(),
        Some(FinishReason::Length),
        "{}",
        urgent.summary()
    );
    assert!(
        ttft(&urgent) * 2 < ttft(&late),
        "priority 0 took {:?}, priority 10 {:?}",
        ttft(&urgent),
        ttft(&late)
    );
    let info = server.counters();
    eprintln!("{info:?}");
    server.assert_idle_and_serving();
}
