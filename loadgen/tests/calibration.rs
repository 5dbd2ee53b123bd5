//! Self-calibration: loadgen (the real binary, its own process) against a mock
//! server whose TTFT and inter-token latency are known. What loadgen measures
//! must match what the mock did, at 1 and at 500 concurrent streams.
//!
//! Errors printed (run with `--nocapture` to see them), per request:
//! - TTFT error: client TTFT - the configured TTFT (includes the network,
//!   HTTP/2 and both sides' scheduling: what a real client would also pay);
//! - overhead: client TTFT - the mock's reported server TTFT (the part loadgen
//!   attributes to network + client);
//! - ITL error: each client-side gap - the matching server-side gap.
//!
//! Tolerances (generous for a shared, noisy 2-core machine that runs the mock,
//! loadgen and other builds at once, but tight enough to catch a wrong clock,
//! a unit error or an off-by-one-token):
//! - 1 stream: overhead p50 < 5 ms; |mean client ITL - configured ITL| < 1 ms;
//!   per-gap |client - server| p50 < 1 ms.
//! - 500 streams opened 0.5 ms apart (all open at once): overhead p50 < 50 ms;
//!   |mean client ITL - configured ITL| < 5 ms; per-gap error p50 < 10 ms.
//! - 500 streams opened in one burst: the same but overhead p50 < 250 ms
//!   (opening 500 streams at once on one connection costs real time).
//! - Always: client TTFT >= server TTFT (same machine, one monotonic clock:
//!   causality), and token counts are exact.
//!
//! The TTFT error exceeds the overhead by the mock's own timer overshoot
//! (its tokio sleeps end up to ~1 ms late; it reports what really happened).

mod common;

use std::time::Duration;

use common::{f, loadgen, pct, start, u, MockConfig};

struct Calibration {
    ttft_err_ms: Vec<f64>,
    overhead_ms: Vec<f64>,
    itl_client_ms: Vec<f64>,
    itl_gap_err_ms: Vec<f64>,
}

fn analyse(requests: &[serde_json::Value], ttft: Duration, tokens: usize) -> Calibration {
    let mut c = Calibration {
        ttft_err_ms: Vec::new(),
        overhead_ms: Vec::new(),
        itl_client_ms: Vec::new(),
        itl_gap_err_ms: Vec::new(),
    };
    for r in requests
        .iter()
        .filter(|r| !r["warmup"].as_bool().unwrap_or(true))
    {
        assert_eq!(r["status"], "OK", "{r}");
        let client_ttft = u(r, "client_ttft_ns") as f64;
        let server_ttft = u(&r["server"], "server_ttft_ns") as f64;
        assert!(
            client_ttft >= server_ttft,
            "client TTFT {client_ttft} < server TTFT {server_ttft}: clocks mixed up"
        );
        assert_eq!(
            r["overhead_ns"].as_i64(),
            Some((client_ttft - server_ttft) as i64)
        );
        c.ttft_err_ms
            .push((client_ttft - ttft.as_nanos() as f64) / 1e6);
        c.overhead_ms.push((client_ttft - server_ttft) / 1e6);
        let recv: Vec<u64> = r["token_recv_ns"]
            .as_array()
            .expect("token_recv_ns")
            .iter()
            .map(|v| v.as_u64().expect("u64"))
            .collect();
        let srv: Vec<u64> = r["server"]["token_server_time_ns"]
            .as_array()
            .expect("token_server_time_ns")
            .iter()
            .map(|v| v.as_u64().expect("u64"))
            .collect();
        assert_eq!(recv.len(), tokens);
        assert_eq!(srv.len(), tokens);
        assert_eq!(u(r, "completion_tokens") as usize, tokens);
        for i in 1..tokens {
            let client_gap = (recv[i] - recv[i - 1]) as f64 / 1e6;
            let server_gap = (srv[i] - srv[i - 1]) as f64 / 1e6;
            c.itl_client_ms.push(client_gap);
            c.itl_gap_err_ms.push((client_gap - server_gap).abs());
        }
    }
    c
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

async fn calibrate(
    streams: usize,
    interval_ms: &str,
    ttft: Duration,
    itl: Duration,
    tokens: usize,
) -> Calibration {
    let mock = start(MockConfig {
        ttft,
        itl,
        ..Default::default()
    })
    .await;
    let n = streams.max(20).to_string();
    let streams_s = streams.to_string();
    let tokens_s = tokens.to_string();
    let mut args = vec![
        "--target",
        &mock.url,
        "--num-requests",
        &n,
        "--max-new-tokens",
        &tokens_s,
        "--warmup-runs",
        "1",
        "--repeat-runs",
        "1",
        "--submit-interval-ms",
        interval_ms,
    ];
    if streams == 1 {
        args.extend(["--max-concurrency", &streams_s]);
    }
    let run = loadgen(&args).await;
    mock.stop().await;
    assert_eq!(
        run.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    let json_run = &run.summary["runs"][0];
    assert_eq!(u(json_run, "ok") as usize, streams.max(20));
    let peak = u(json_run, "max_streams_per_connection") as usize;
    // Ramped runs may peak a little under `streams` on a slow machine.
    assert!(
        peak <= streams && peak * 10 >= streams * 9,
        "peak {peak} streams"
    );
    let c = analyse(&run.requests, ttft, tokens);
    // The report's own numbers agree with the raw lines.
    let json_itl_mean = f(json_run, &["metrics", "itl_ms", "mean"]);
    assert!((json_itl_mean - mean(&c.itl_client_ms)).abs() < 0.01);
    let mut ttft_err = c.ttft_err_ms.clone();
    let mut overhead = c.overhead_ms.clone();
    let mut gap = c.itl_gap_err_ms.clone();
    println!(
        "calibration at {streams} concurrent stream(s) (peak {peak}, interval {interval_ms} ms, \
         TTFT {ttft:?}, ITL {itl:?}, {tokens} tokens, {} requests): TTFT error p50 {:.3} ms p99 {:.3} ms; overhead (client - server TTFT) \
         p50 {:.3} ms p99 {:.3} ms; mean client ITL {:.3} ms (error {:+.3} ms); \
         |client gap - server gap| p50 {:.3} ms p99 {:.3} ms",
        ttft_err.len(),
        pct(&mut ttft_err, 0.50),
        pct(&mut ttft_err, 0.99),
        pct(&mut overhead, 0.50),
        pct(&mut overhead, 0.99),
        mean(&c.itl_client_ms),
        mean(&c.itl_client_ms) - itl.as_secs_f64() * 1e3,
        pct(&mut gap, 0.50),
        pct(&mut gap, 0.99),
    );
    c
}

/// One test, so the measurements never run at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibration_at_1_and_500_streams() {
    let itl = Duration::from_millis(20);
    let mut c = calibrate(1, "0", Duration::from_millis(50), itl, 8).await;
    let overhead_p50 = pct(&mut c.overhead_ms, 0.5);
    assert!(
        overhead_p50 < 5.0,
        "1 stream: overhead p50 {overhead_p50} ms"
    );
    let itl_err = (mean(&c.itl_client_ms) - 20.0).abs();
    assert!(itl_err < 1.0, "1 stream: mean ITL error {itl_err} ms");
    let gap_p50 = pct(&mut c.itl_gap_err_ms, 0.5);
    assert!(gap_p50 < 1.0, "1 stream: per-gap error p50 {gap_p50} ms");

    // 500 streams opened 0.5 ms apart (all 500 open at once: each lives
    // 200 + 7 * 40 = 480 ms, the last starts at 250 ms).
    let itl = Duration::from_millis(40);
    let mut c = calibrate(500, "0.5", Duration::from_millis(200), itl, 8).await;
    let overhead_p50 = pct(&mut c.overhead_ms, 0.5);
    assert!(
        overhead_p50 < 50.0,
        "500 ramped: overhead p50 {overhead_p50} ms"
    );
    let itl_err = (mean(&c.itl_client_ms) - 40.0).abs();
    assert!(itl_err < 5.0, "500 ramped: mean ITL error {itl_err} ms");
    let gap_p50 = pct(&mut c.itl_gap_err_ms, 0.5);
    assert!(gap_p50 < 10.0, "500 ramped: per-gap error p50 {gap_p50} ms");

    // 500 streams opened in one burst: opening them all on one connection
    // (both processes sharing the cores) is part of what the client sees.
    let mut c = calibrate(500, "0", Duration::from_millis(200), itl, 8).await;
    let overhead_p50 = pct(&mut c.overhead_ms, 0.5);
    assert!(
        overhead_p50 < 250.0,
        "500 burst: overhead p50 {overhead_p50} ms"
    );
    let itl_err = (mean(&c.itl_client_ms) - 40.0).abs();
    assert!(itl_err < 5.0, "500 burst: mean ITL error {itl_err} ms");
    let gap_p50 = pct(&mut c.itl_gap_err_ms, 0.5);
    assert!(gap_p50 < 10.0, "500 burst: per-gap error p50 {gap_p50} ms");
}
