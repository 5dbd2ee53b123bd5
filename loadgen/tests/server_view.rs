//! `--scrape-metrics` and `--gpu-telemetry` against the mock server: the
//! mock's `/metrics` (vLLM's names) sampled through a run into the JSON, the
//! text report and the HTML report's time series; without NVML (this
//! machine has no GPU) a note, not an error.

mod common;

use std::time::Duration;

use common::{assert_well_formed, loadgen, start, MockConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_view_is_sampled_through_the_run() {
    // 4 slots and a burst of 12 requests of ~300 ms: 4 run, 8 wait.
    let mock = start(MockConfig {
        ttft: Duration::from_millis(50),
        itl: Duration::from_millis(25),
        slots: Some(4),
        ..Default::default()
    })
    .await;
    let metrics = format!("{}/metrics", mock.http_url);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("server-view-{}", std::process::id()));
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "12",
        "--max-new-tokens",
        "10",
        "--scrape-metrics",
        &metrics,
        "--scrape-interval-ms",
        "50",
        "--gpu-telemetry",
        "--report",
        dir.to_str().expect("utf-8"),
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    let m = &run.run0().expect("a run")["server_metrics"];
    let samples = m["samples"].as_array().expect("samples");
    assert!(samples.len() >= 10, "about 1 s at 50 ms: {}", samples.len());
    assert_eq!(m["failed_scrapes"], 0, "{m}");
    assert_eq!(m["max_running"], 4.0, "the mock's slots: {m}");
    let waiting = m["max_waiting"].as_f64().expect("waiting");
    assert!((4.0..=8.0).contains(&waiting), "{m}");
    assert_eq!(m["max_kv_cache_usage"], 1.0, "4 of 4 slots: {m}");
    assert_eq!(m["preemptions"], 0.0);
    let t: Vec<f64> = samples.iter().filter_map(|s| s["t_s"].as_f64()).collect();
    assert!(t.windows(2).all(|w| w[0] <= w[1]), "in time order");
    // No NVML here: a note, and the run went on.
    assert!(
        m["gpu_note"].as_str().is_some_and(|n| n.contains("NVML")),
        "{m}"
    );
    assert!(
        run.stdout.contains("Server metrics:") && run.stdout.contains("running max 4"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("GPU telemetry:") && run.stdout.contains("NVML"));
    for chart in ["server_state.svg", "usage.svg"] {
        assert_well_formed(&dir.join(chart), false);
    }
    let page = std::fs::read_to_string(dir.join("index.html")).expect("page");
    assert!(
        page.contains("id=\"server_state.svg\""),
        "charted in the page"
    );
    assert_well_formed(&dir.join("index.html"), true);
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_counted_not_fatal() {
    let mock = start(MockConfig::default()).await;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "2",
        "--scrape-metrics",
        "http://127.0.0.1:1/metrics",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    let m = &run.run0().expect("a run")["server_metrics"];
    assert!(m["failed_scrapes"].as_u64().is_some_and(|n| n >= 1), "{m}");
    assert!(m["max_running"].is_null());
    let bad = loadgen(&["--target", &mock.url, "--scrape-metrics", "localhost:9/m"]).await;
    assert!(
        bad.stderr.contains("invalid --scrape-metrics"),
        "{}",
        bad.stderr
    );
    mock.stop().await;
}
