//! Several targets: `--balance least` sends requests to the idle target, `rr`
//! alternates whatever the load, and the report (text, JSON, HTML) has
//! per-target figures that match what each target received.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{assert_well_formed, f, loadgen, start, u, MockConfig};

/// A slow target (every request takes 600 ms) and a fast one (~10 ms).
async fn slow_and_fast() -> (common::MockServer, common::MockServer) {
    let slow = start(MockConfig {
        ttft: Duration::from_millis(600),
        itl: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let fast = start(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(2),
        ..Default::default()
    })
    .await;
    (slow, fast)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_outstanding_prefers_the_idle_target_and_reports_each() {
    let (slow, fast) = slow_and_fast().await;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("targets-{}", std::process::id()));
    let run = loadgen(&[
        "--target",
        &slow.url,
        "--target",
        &fast.url,
        "--balance",
        "least",
        "--num-requests",
        "20",
        "--max-new-tokens",
        "2",
        "--submit-interval-ms",
        "30",
        "--report",
        dir.to_str().expect("utf-8"),
    ])
    .await;
    let (to_slow, to_fast) = (
        slow.received.load(Ordering::SeqCst),
        fast.received.load(Ordering::SeqCst),
    );
    slow.stop().await;
    fast.stop().await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    // Request 0 finds both idle (a tie: the first target); from then on the
    // slow target always has requests in flight and the fast one none.
    assert!(
        to_slow <= 3 && to_fast >= 17,
        "slow {to_slow}, fast {to_fast}"
    );
    let per = run.summary["runs"][0]["per_target"]
        .as_array()
        .expect("per_target")
        .clone();
    assert_eq!(per.len(), 2);
    assert_eq!(
        per[0]["target"].as_str(),
        Some(run.measured()[0]["target"].as_str().unwrap_or(""))
    );
    assert_eq!(
        (
            u(&per[0], "requests") as usize,
            u(&per[1], "requests") as usize
        ),
        (to_slow, to_fast)
    );
    assert_eq!(u(&per[1], "ok") as usize, to_fast);
    assert!(f(&per[0], &["ttft_p50_ms"]) >= 600.0, "{per:?}");
    assert!(f(&per[1], &["ttft_p99_ms"]) < 300.0, "{per:?}");
    assert!(
        f(&per[1], &["throughput_completion_tps"]) > f(&per[0], &["throughput_completion_tps"])
    );
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("Per target:") && l.ends_with("balance least")),
        "{}",
        run.stdout
    );
    let html = std::fs::read_to_string(dir.join("index.html")).expect("report");
    assert!(
        html.contains("<p>Per target (r0):</p>"),
        "per-target table in the HTML"
    );
    assert_well_formed(&dir.join("index.html"), true);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_alternates_whatever_the_load_over_http() {
    let (slow, fast) = slow_and_fast().await;
    let run = loadgen(&[
        "--backend",
        "openai",
        "--base-url",
        &format!("{},{}", slow.http_url, fast.http_url),
        "--num-requests",
        "20",
        "--max-new-tokens",
        "2",
        "--submit-interval-ms",
        "30",
    ])
    .await;
    let counts = (
        slow.received.load(Ordering::SeqCst),
        fast.received.load(Ordering::SeqCst),
    );
    slow.stop().await;
    fast.stop().await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    assert_eq!(counts, (10, 10), "rr: exactly half each");
    let per = &run.summary["runs"][0]["per_target"];
    assert_eq!((u(&per[0], "requests"), u(&per[1], "requests")), (10, 10));
    // The slow target's HTTP/1.1 pool holds a connection per request in
    // flight (each lives 600 ms, one arrives every 60 ms): about 10.
    let peaks = run.summary["runs"][0]["streams_per_connection"]
        .as_array()
        .expect("peaks")
        .clone();
    assert!(u(&peaks[0], "connections") >= 8, "{peaks:?}");
    assert!(u(&peaks[1], "connections") <= 3, "{peaks:?}");
    assert!(
        run.stdout.contains("2 target(s), HTTP/1.1:"),
        "{}",
        run.stdout
    );
}
