//! `--backend openai` (the real binary) against the mock's OpenAI door:
//! streaming with Ember's extension (the server breakdown and the
//! reconciliation), usage versus the chunk-count fallback, a plain OpenAI
//! server (no extension: "not reported by this server"), error bodies and
//! error events, and per-event timestamps that follow the server's token
//! times (a client that buffered the stream would see gaps of ~0).

mod common;

use std::time::Duration;

use common::{f, loadgen, pct, start, u, MockConfig};
use serde_json::Value;

fn measured(run: &common::LoadgenRun) -> Vec<&Value> {
    run.measured()
}

fn nums(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().expect("u64"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_with_embers_extension_reconcile_like_grpc() {
    let mock = start(MockConfig {
        ttft: Duration::from_millis(30),
        itl: Duration::from_millis(20),
        ..Default::default()
    })
    .await;
    let run = loadgen(&[
        "--backend",
        "openai",
        "--base-url",
        &mock.http_url,
        "--num-requests",
        "6",
        "--max-new-tokens",
        "8",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    assert!(
        run.stdout
            .contains("Model:                                mock"),
        "the model from /v1/models: {}",
        run.stdout
    );
    assert!(
        run.stdout.contains("openai /v1/completions (HTTP/1.1)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("usage for 6 request(s)"),
        "{}",
        run.stdout
    );
    let reqs = measured(&run);
    assert_eq!(reqs.len(), 6);
    let (mut gap_err, mut client_gaps) = (Vec::new(), Vec::new());
    for r in &reqs {
        assert_eq!(r["status"], "OK", "{r}");
        assert_eq!(
            (u(r, "completion_tokens"), r["tokens_from"].as_str()),
            (8, Some("usage")),
            "{r}"
        );
        assert_eq!(
            u(r, "prompt_tokens"),
            12,
            "usage's prompt count (the mock counts words)"
        );
        assert_eq!(r["finish_reason"], "LENGTH");
        let recv = nums(&r["token_recv_ns"]);
        let srv = nums(&r["server"]["token_server_time_ns"]);
        assert_eq!((recv.len(), srv.len()), (8, 8), "one chunk per token");
        let (client_ttft, server_ttft) =
            (u(r, "client_ttft_ns"), u(&r["server"], "server_ttft_ns"));
        assert!(client_ttft >= server_ttft, "causality: {r}");
        assert_eq!(
            r["overhead_ns"].as_i64(),
            Some(client_ttft as i64 - server_ttft as i64)
        );
        assert!(u(&r["server"], "started_server_time_ns") <= server_ttft);
        for i in 1..8 {
            let c = (recv[i] - recv[i - 1]) as f64 / 1e6;
            let s = (srv[i] - srv[i - 1]) as f64 / 1e6;
            client_gaps.push(c);
            gap_err.push((c - s).abs());
        }
    }
    // Each event is stamped when it arrives: client gaps follow the server's
    // 20 ms (a buffering reader would see ~0 ms gaps and a burst at the end).
    let p50 = pct(&mut client_gaps, 0.5);
    assert!((15.0..30.0).contains(&p50), "client ITL p50 {p50} ms");
    let err = pct(&mut gap_err, 0.5);
    assert!(err < 5.0, "|client gap - server gap| p50 {err} ms");
    let run0 = &run.summary["runs"][0];
    assert_eq!(u(run0, "server_reported"), 6);
    assert_eq!(u(&run0["token_counts"], "usage"), 6);
    assert_eq!(f(run0, &["metrics", "server_ttft_ms", "count"]), 6.0);
    assert!(
        run.stdout
            .contains("Network+client overhead p50/p95/p99:  "),
        "{}",
        run.stdout
    );
    assert!(
        !run.stdout.contains("not reported by this server"),
        "{}",
        run.stdout
    );
    assert_eq!(
        u(run0, "connections"),
        6,
        "a burst of 6 on HTTP/1.1: 6 connections"
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_over_http2_counts_chunks_when_the_server_sends_no_usage() {
    let mock = start(MockConfig {
        usage: false,
        ..Default::default()
    })
    .await;
    let run = loadgen(&[
        "--backend",
        "openai",
        "--base-url",
        &format!("{}/v1", mock.http_url),
        "--endpoint",
        "chat",
        "--http",
        "2",
        "--model",
        "m",
        "--num-requests",
        "5",
        "--max-new-tokens",
        "4",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    for r in measured(&run) {
        assert_eq!(r["tokens_from"], "chunks", "{r}");
        assert_eq!(
            u(r, "completion_tokens"),
            4,
            "the role chunk is not a token: {r}"
        );
        assert_eq!(nums(&r["token_recv_ns"]).len(), 4);
        assert!(r["server"].is_object(), "the extension still came");
    }
    assert!(
        run.stdout.contains("counted chunks for 5 (no usage sent)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("openai /v1/chat/completions (HTTP/2)"),
        "{}",
        run.stdout
    );
    assert_eq!(
        u(&run.summary["runs"][0], "max_streams_per_connection"),
        5,
        "multiplexed"
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_openai_server_gets_no_server_breakdown() {
    let mock = start(MockConfig {
        ember_fields: false,
        ..Default::default()
    })
    .await;
    let run = loadgen(&[
        "--backend",
        "openai",
        "--base-url",
        &mock.http_url,
        "--num-requests",
        "4",
        "--max-new-tokens",
        "3",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    for r in measured(&run) {
        assert!(r["server"].is_null() && r["overhead_ns"].is_null(), "{r}");
        assert_eq!(
            nums(&r["token_recv_ns"]).len(),
            3,
            "tokens from non-empty chunks"
        );
        assert!(r["client_ttft_ns"].is_u64() && r["client_tpot_ns"].is_u64());
    }
    for label in [
        "Tokenize",
        "Queue wait",
        "Server TTFT",
        "Network+client overhead",
        "ITL (server)",
        "Admission",
    ] {
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("{label}: {}", run.stdout));
        assert!(line.ends_with("not reported by this server"), "{line}");
    }
    let run0 = &run.summary["runs"][0];
    assert_eq!(u(run0, "server_reported"), 0);
    assert_eq!(f(run0, &["metrics", "overhead_ms", "count"]), 0.0);
    assert!(
        run0["metrics"]["ttft_ms"]["p50"].is_f64(),
        "client metrics still there"
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_statuses_and_error_events_are_reported_with_their_bodies() {
    let rejecting = start(MockConfig {
        fail_every: Some(2),
        ..Default::default()
    })
    .await;
    let args = |url: &str| {
        vec![
            "--backend".to_string(),
            "openai".into(),
            "--base-url".into(),
            url.to_string(),
            "--model".into(),
            "mock".into(),
            "--num-requests".into(),
            "6".into(),
            "--max-new-tokens".into(),
            "4".into(),
        ]
    };
    let a = args(&rejecting.http_url);
    let run = loadgen(&a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(
        run.code(),
        Some(1),
        "failures fail the command: {}",
        run.output()
    );
    let failed: Vec<&Value> = measured(&run)
        .into_iter()
        .filter(|r| r["ok"] == false)
        .collect();
    assert_eq!(failed.len(), 3);
    for r in &failed {
        assert_eq!(r["status"], "HTTP_429", "{r}");
        assert_eq!(
            r["error_message"],
            "mock: pending queue is full (type rate_limit_error, code too_many_requests)"
        );
    }
    assert_eq!(u(&run.summary["runs"][0]["errors"], "HTTP_429"), 3);
    assert!(
        run.stdout
            .contains("Errors:                               3 failed: HTTP_429 3"),
        "{}",
        run.stdout
    );
    rejecting.stop().await;

    let breaking = start(MockConfig {
        fail_after_tokens: Some(2),
        ..Default::default()
    })
    .await;
    let mut a = args(&breaking.http_url);
    a.push("--allow-errors".into());
    let run = loadgen(&a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(run.code(), Some(0), "--allow-errors: {}", run.output());
    for r in measured(&run) {
        assert_eq!(r["status"], "STREAM_ERROR", "{r}");
        assert_eq!(
            r["error_message"],
            "mock: engine failure after 2 tokens (type server_error)"
        );
        assert_eq!(u(r, "completion_tokens"), 2, "the tokens before the error");
    }
    // A wrong path: the server's 404 body is the message.
    let wrong = format!("{}/api", breaking.http_url);
    let run = loadgen(&args(&wrong).iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(run.code(), Some(1));
    let r = measured(&run)[0];
    assert_eq!(r["status"], "HTTP_404", "{r}");
    assert!(
        r["error_message"]
            .as_str()
            .is_some_and(|m| m.contains("no route /api/v1/completions")),
        "{r}"
    );
    breaking.stop().await;
}
