//! Schedules, concurrency, connections: loadgen (the binary) against the mock,
//! checked from the `--requests-out` timestamps.
//!
//! Bounds are generous (a shared 2-core machine) but each test fails if the
//! behaviour is wrong: e.g. an absolute schedule that waited for slow submits
//! would be hundreds of ms late, not a few.

mod common;

use std::time::Duration;

use common::{f, loadgen, start, u, MockConfig};

const MS: u64 = 1_000_000;

fn by_index(mut requests: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    requests.retain(|r| r["warmup"] == false);
    requests.sort_by_key(|r| u(r, "index"));
    requests
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_fires_on_time_even_when_submits_are_slow() {
    // Every submit takes 300 ms; requests are due every 25 ms.
    let mock = start(MockConfig {
        submit_delay: Duration::from_millis(300),
        ttft: Duration::from_millis(310),
        itl: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "12",
        "--max-new-tokens",
        "2",
        "--submit-interval-ms",
        "25",
        "--submit-schedule",
        "absolute",
        "--warmup-runs",
        "0",
        "--repeat-runs",
        "1",
    ])
    .await;
    mock.stop().await;
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout, run.stderr);
    let reqs = by_index(run.requests.clone());
    assert_eq!(reqs.len(), 12);
    let mut max_lag = 0;
    for (i, r) in reqs.iter().enumerate() {
        let intended = u(r, "intended_start_ns");
        let start = u(r, "submit_start_ns");
        // The plan: t0 + i * 25 ms, to the nanosecond.
        assert_eq!(intended, i as u64 * 25 * MS, "request {i}");
        assert!(start >= intended, "request {i} fired early");
        assert_eq!(u(r, "submit_lag_ns"), start - intended);
        max_lag = max_lag.max(start - intended);
        // The submits really were slow (else this test proves nothing).
        assert!(
            u(r, "submit_end_ns") - start >= 290 * MS,
            "request {i}: submit not slow"
        );
    }
    println!(
        "absolute schedule: max submit lag {:.3} ms",
        max_lag as f64 / 1e6
    );
    // Waiting for the slow submits would make this >= 300 ms.
    assert!(max_lag < 50 * MS, "max lag {max_lag} ns");
    let achieved = f(&run.summary["runs"][0], &["achieved_rate_rps"]);
    assert!(
        (achieved - 40.0).abs() < 4.0,
        "achieved {achieved} req/s, requested 40"
    );
    assert_eq!(f(&run.summary["runs"][0], &["requested_rate_rps"]), 40.0);
    assert!(run.stdout.contains("Latency from intended"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relative_gaps_are_submit_time_plus_interval() {
    let mock = start(MockConfig {
        submit_delay: Duration::from_millis(60),
        ttft: Duration::from_millis(70),
        itl: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "6",
        "--max-new-tokens",
        "2",
        "--submit-interval-ms",
        "40",
        "--submit-schedule",
        "relative",
        "--warmup-runs",
        "0",
        "--repeat-runs",
        "1",
    ])
    .await;
    mock.stop().await;
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout, run.stderr);
    let reqs = by_index(run.requests.clone());
    for w in reqs.windows(2) {
        let (prev, next) = (&w[0], &w[1]);
        let submit_time = u(prev, "submit_end_ns") - u(prev, "submit_start_ns");
        let gap = u(next, "submit_start_ns") - u(prev, "submit_start_ns");
        let after_return = u(next, "submit_start_ns") - u(prev, "submit_end_ns");
        println!(
            "relative: submit {:.3} ms, gap {:.3} ms, after return {:.3} ms",
            submit_time as f64 / 1e6,
            gap as f64 / 1e6,
            after_return as f64 / 1e6
        );
        assert!(submit_time >= 55 * MS, "submit {submit_time}");
        // The next request waits for the return, then the interval.
        assert!(
            after_return >= 40 * MS,
            "fired {after_return} ns after the return"
        );
        assert!(
            after_return < 80 * MS,
            "fired {after_return} ns after the return"
        );
        assert!(gap >= submit_time + 40 * MS);
        // The intended start is the previous return + interval.
        assert_eq!(
            u(next, "intended_start_ns"),
            u(prev, "submit_end_ns") + 40 * MS
        );
    }
    assert!(run.summary["runs"][0]["requested_rate_rps"].is_null());
    assert!(!run.stdout.contains("Latency from intended"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poisson_rate_matches() {
    let mock = start(MockConfig {
        ttft: Duration::from_millis(2),
        itl: Duration::from_millis(1),
        ..Default::default()
    })
    .await;
    let rate = 100.0;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "300",
        "--max-new-tokens",
        "1",
        "--arrival",
        "poisson",
        "--request-rate",
        "100",
        "--seed",
        "3",
        "--warmup-runs",
        "0",
        "--repeat-runs",
        "1",
    ])
    .await;
    mock.stop().await;
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout, run.stderr);
    let reqs = by_index(run.requests.clone());
    let last = u(&reqs[reqs.len() - 1], "intended_start_ns") as f64 / 1e9;
    let planned = (reqs.len() - 1) as f64 / last;
    // 299 exponential gaps: the rate's relative sd is 1/sqrt(299) = 5.8%;
    // 20% is > 3 sd (and the seed makes it deterministic).
    assert!(
        (planned - rate).abs() / rate < 0.2,
        "planned rate {planned}"
    );
    // Gaps vary like an exponential (fixed gaps would have cv 0).
    let gaps: Vec<f64> = reqs
        .windows(2)
        .map(|w| (u(&w[1], "intended_start_ns") - u(&w[0], "intended_start_ns")) as f64)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
    assert!((0.7..1.3).contains(&(sd / mean)), "cv {}", sd / mean);
    // Firing follows the plan: the achieved rate is the planned one.
    let achieved = f(&run.summary["runs"][0], &["achieved_rate_rps"]);
    println!("poisson: requested {rate}, planned {planned:.2}, achieved {achieved:.2} req/s");
    assert!(
        (achieved - planned).abs() / planned < 0.05,
        "achieved {achieved}"
    );
    assert_eq!(f(&run.summary["runs"][0], &["requested_rate_rps"]), rate);
    let lag_p99 = f(
        &run.summary["runs"][0],
        &["metrics", "submit_lag_ms", "p99"],
    );
    assert!(lag_p99 < 50.0, "submit lag p99 {lag_p99} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_holds_requests_back() {
    let mock = start(MockConfig {
        ttft: Duration::from_millis(150),
        itl: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "6",
        "--max-new-tokens",
        "1",
        "--max-concurrency",
        "2",
        "--warmup-runs",
        "0",
        "--repeat-runs",
        "1",
    ])
    .await;
    mock.stop().await;
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(u(&run.summary["runs"][0], "max_streams_per_connection"), 2);
    let reqs = by_index(run.requests.clone());
    // A burst: all intended at t0; pairs start ~150 ms apart.
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(u(r, "intended_start_ns"), 0);
        let lag = u(r, "submit_lag_ns");
        let wave = (i / 2) as u64;
        assert!(lag >= wave * 140 * MS, "request {i}: lag {lag}");
        assert!(lag < wave * 150 * MS + 100 * MS, "request {i}: lag {lag}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_over_targets_and_channels() {
    let cfg = MockConfig {
        ttft: Duration::from_millis(200),
        itl: Duration::from_millis(5),
        ..Default::default()
    };
    let a = start(cfg.clone()).await;
    let b = start(cfg).await;
    let run = loadgen(&[
        "--target",
        &a.url,
        "--target",
        &b.url,
        "--channels",
        "3",
        "--num-requests",
        "12",
        "--max-new-tokens",
        "1",
        "--warmup-runs",
        "0",
        "--repeat-runs",
        "1",
    ])
    .await;
    let (got_a, got_b) = (
        a.received.load(std::sync::atomic::Ordering::SeqCst),
        b.received.load(std::sync::atomic::Ordering::SeqCst),
    );
    let (url_a, url_b) = (a.url.clone(), b.url.clone());
    a.stop().await;
    b.stop().await;
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout, run.stderr);
    assert_eq!((got_a, got_b), (6, 6));
    let reqs = by_index(run.requests.clone());
    for (i, r) in reqs.iter().enumerate() {
        let want = if i % 2 == 0 { &url_a } else { &url_b };
        assert_eq!(r["target"].as_str(), Some(want.as_str()), "request {i}");
        assert_eq!(u(r, "channel"), (i as u64 / 2) % 3, "request {i}");
    }
    // 6 connections, 2 concurrent streams each (burst, 200 ms TTFT).
    let per_conn = run.summary["runs"][0]["streams_per_connection"]
        .as_array()
        .expect("streams_per_connection")
        .clone();
    assert_eq!(per_conn.len(), 6);
    assert!(
        per_conn.iter().all(|c| u(c, "max_streams") == 2),
        "{per_conn:?}"
    );
    assert_eq!(u(&run.summary["runs"][0], "max_streams_per_connection"), 2);
    assert!(run.stdout.contains("2 target(s) x 3 channel(s)"));
}

/// `--start-at`: two loadgen processes launched 300 ms apart fire their
/// first requests at the same wall-clock instant, and say so in their JSON
/// (`t0_unix_s`): never before the instant asked for, and within a few ms of
/// each other (a process that ignored the flag would start 300 ms apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_at_lines_up_two_processes() {
    let mock = start(MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let at = now + 1.5;
    let args: Vec<String> = [
        "--target",
        &mock.url,
        "--num-requests",
        "4",
        "--max-new-tokens",
        "2",
        "--start-at",
        &format!("{at:.6}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let early = {
        let args = args.clone();
        tokio::task::spawn_blocking(move || common::loadgen_blocking(&args))
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = tokio::task::spawn_blocking(move || common::loadgen_blocking(&args))
        .await
        .expect("loadgen thread");
    let early = early.await.expect("loadgen thread");
    mock.stop().await;
    let mut t0s = Vec::new();
    for run in [&early, &late] {
        assert_eq!(run.code(), Some(0), "{}", run.output());
        let run0 = run.run0().expect("a measured run");
        let t0 = f(run0, &["t0_unix_s"]);
        assert!(t0 >= at - 1e-3, "t0 {t0} before --start-at {at}");
        // Request 0 fires at t0 itself (its submit lag is the usual).
        let first = by_index(run.requests.clone());
        assert!(u(&first[0], "submit_start_ns") < 20 * MS, "{}", first[0]);
        t0s.push(t0);
    }
    let skew_ms = (t0s[0] - t0s[1]).abs() * 1e3;
    assert!(skew_ms < 50.0, "t0s {t0s:?}: {skew_ms:.1} ms apart");
}
