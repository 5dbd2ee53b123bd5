//! Failures and the output contract: failed requests show in the report, the
//! JSON and the exit code; bad flags fail fast naming the flag; the JSON keys
//! other tools parse are present.

mod common;

use std::time::Duration;

use common::{loadgen, loadgen_blocking, start, u, MockConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_are_reported_and_fail_the_exit_code() {
    let mock = start(MockConfig {
        fail_every: Some(3),
        ..Default::default()
    })
    .await;
    let args = [
        "--target",
        &mock.url,
        "--num-requests",
        "9",
        "--max-new-tokens",
        "3",
        "--warmup-runs",
        "0",
        "--repeat-runs",
        "1",
    ];
    let run = loadgen(&args).await;
    assert_eq!(run.code(), Some(1), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("9 (6 ok, 3 failed"), "{}", run.stdout);
    assert!(
        run.stdout.contains("RESOURCE_EXHAUSTED 3"),
        "{}",
        run.stdout
    );
    assert!(run.stderr.contains("--allow-errors"), "{}", run.stderr);

    let r0 = &run.summary["runs"][0];
    assert_eq!(u(r0, "requests"), 9);
    assert_eq!(u(r0, "ok"), 6);
    assert_eq!(u(r0, "failed"), 3);
    assert_eq!(u(&r0["errors"], "RESOURCE_EXHAUSTED"), 3);
    // Latency statistics cover the OK requests; lag covers all.
    assert_eq!(u(&r0["metrics"]["ttft_ms"], "count"), 6);
    assert_eq!(u(&r0["metrics"]["submit_lag_ms"], "count"), 9);
    assert_eq!(u(r0, "completion_tokens"), 18);

    let failed: Vec<_> = run.requests.iter().filter(|r| r["ok"] == false).collect();
    assert_eq!(failed.len(), 3);
    for r in failed {
        assert_eq!(r["status"], "RESOURCE_EXHAUSTED");
        assert!(r["error_message"]
            .as_str()
            .is_some_and(|m| m.contains("queue is full")));
        assert!(r["server"].is_null());
        assert!(r["finish_reason"].is_null());
        assert!(r["client_ttft_ns"].is_null());
    }

    // --allow-errors: same report, exit 0.
    let mut allow = args.to_vec();
    allow.push("--allow-errors");
    let run = loadgen(&allow).await;
    mock.stop().await;
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("RESOURCE_EXHAUSTED 3"),
        "{}",
        run.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_timeout_is_a_deadline_exceeded_failure() {
    let mock = start(MockConfig {
        ttft: Duration::from_secs(5),
        ..Default::default()
    })
    .await;
    let started = std::time::Instant::now();
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "2",
        "--max-new-tokens",
        "2",
        "--timeout",
        "0.3",
        "--warmup-runs",
        "0",
        "--repeat-runs",
        "1",
    ])
    .await;
    mock.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the timeout was not applied"
    );
    assert_eq!(run.code(), Some(1));
    assert_eq!(u(&run.summary["runs"][0]["errors"], "DEADLINE_EXCEEDED"), 2);
    assert!(run.stdout.contains("DEADLINE_EXCEEDED 2"), "{}", run.stdout);
}

#[test]
fn bad_flags_fail_fast_naming_the_flag() {
    // 127.0.0.1:1 is never listened on: a validation error must come first.
    let cases: &[(&[&str], &str)] = &[
        (&["--submit-interval-ms", "-5"], "--submit-interval-ms"),
        (&["--num-requests", "0"], "--num-requests"),
        (&["--repeat-runs", "0"], "--repeat-runs"),
        (&["--channels", "0"], "--channels"),
        (&["--max-concurrency", "0"], "--max-concurrency"),
        (
            &["--arrival", "poisson", "--request-rate", "0"],
            "--request-rate",
        ),
        (&["--arrival", "poisson"], "--request-rate"),
        (&["--timeout", "-1"], "--timeout"),
    ];
    for (extra, flag) in cases {
        let mut args: Vec<String> = vec!["--target".into(), "127.0.0.1:1".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let run = loadgen_blocking(&args);
        assert_eq!(run.code(), Some(1), "{extra:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(&format!("invalid {flag}")),
            "{extra:?}: stderr does not name {flag}: {}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{extra:?}: ran anyway");
    }
    // No target at all.
    let run = loadgen_blocking(&[]);
    assert_eq!(run.code(), Some(1));
    assert!(run.stderr.contains("--target"), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_keys_are_the_contract() {
    let mock = start(MockConfig::default()).await;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "3",
        "--max-new-tokens",
        "2",
        "--warmup-runs",
        "1",
        "--repeat-runs",
        "2",
        "--pretok",
    ])
    .await;
    mock.stop().await;
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.stdout.matches("=== streaming benchmark ===").count(), 2);
    assert_eq!(run.stdout.matches("=== warmup run").count(), 1);
    assert!(run
        .stdout
        .contains("=== summary over 2 measured run(s) ==="));
    for line in [
        "Model:",
        "Device:",
        "Requests:",
        "Prompt tokens (total):",
        "Completion tokens (total):",
        "Submit wall:",
        "Submit interval/schedule:",
        "Submit lag p50/p95/p99:",
        "add_request latency p50/p95/p99:",
        "Tokenize p50/p95/p99:",
        "Queue wait p50/p95/p99:",
        "Prefill->first token p50/p95/p99:",
        "Server TTFT p50/p95/p99:",
        "TTFT p50/p95/p99:",
        "Network+client overhead p50/p95/p99:",
        "TPOT p50/p95/p99:",
        "ITL (client) p50/p95/p99:",
        "ITL (server) p50/p95/p99:",
        "Latency p50/p95/p99:",
        "Throughput (completion,total):",
        "Errors:",
    ] {
        assert!(
            run.stdout.contains(line),
            "report lacks {line:?}:\n{}",
            run.stdout
        );
    }

    assert_eq!(run.requests.len(), 9, "warmups included");
    assert_eq!(
        run.requests.iter().filter(|r| r["warmup"] == true).count(),
        3
    );
    let r = &run.requests[0];
    for key in [
        "run",
        "warmup",
        "index",
        "request_id",
        "target",
        "ok",
        "status",
        "error_message",
        "prompt_tokens",
        "completion_tokens",
        "finish_reason",
        "intended_start_ns",
        "submit_start_ns",
        "submit_end_ns",
        "first_token_ns",
        "finish_ns",
        "token_recv_ns",
        "submit_lag_ns",
        "client_ttft_ns",
        "client_tpot_ns",
        "latency_ns",
        "latency_from_intended_ns",
        "overhead_ns",
        "server",
    ] {
        assert!(r.get(key).is_some(), "requests-out lacks {key}: {r}");
    }
    for key in [
        "tokenize_ns",
        "enqueue_ns",
        "queue_wait_ns",
        "prefill_to_first_token_ns",
        "server_ttft_ns",
        "decode_ns",
        "total_ns",
        "prefill_batch_size",
        "admitted_iteration",
        "token_server_time_ns",
    ] {
        assert!(r["server"].get(key).is_some(), "server lacks {key}: {r}");
    }
    assert_eq!(r["status"], "OK");
    assert_eq!(r["finish_reason"], "LENGTH");
    // --pretok: the default prompt went as token ids (the mock counts them).
    assert!(u(r, "prompt_tokens") > 5);

    let j = &run.summary;
    assert_eq!(j["model"], "mock");
    assert_eq!(j["device"], "test");
    assert_eq!(j["config"]["num_requests"], 3);
    assert_eq!(j["runs"].as_array().map(Vec::len), Some(2));
    let r0 = &j["runs"][0];
    for key in [
        "run",
        "requests",
        "ok",
        "failed",
        "errors",
        "prompt_tokens",
        "completion_tokens",
        "wall_s",
        "achieved_rate_rps",
        "requested_rate_rps",
        "throughput_completion_tps",
        "throughput_total_tps",
        "max_streams_per_connection",
        "metrics",
    ] {
        assert!(r0.get(key).is_some(), "run lacks {key}");
    }
    for key in [
        "submit_lag_ms",
        "add_request_ms",
        "tokenize_ms",
        "queue_wait_ms",
        "prefill_to_first_token_ms",
        "server_ttft_ms",
        "ttft_ms",
        "overhead_ms",
        "tpot_ms",
        "itl_ms",
        "server_itl_ms",
        "latency_ms",
        "latency_from_intended_ms",
    ] {
        let m = &r0["metrics"][key];
        for stat in ["p50", "p95", "p99", "mean", "max", "count"] {
            assert!(m.get(stat).is_some(), "metrics.{key} lacks {stat}");
        }
    }
    assert_eq!(u(&r0["metrics"]["itl_ms"], "count"), 3);
    for key in [
        "ttft_p99_ms",
        "tpot_p99_ms",
        "latency_p99_ms",
        "throughput_completion_tps",
    ] {
        for stat in ["mean", "min", "max"] {
            assert!(
                j["summary"][key].get(stat).is_some(),
                "summary.{key} lacks {stat}"
            );
        }
    }
}
