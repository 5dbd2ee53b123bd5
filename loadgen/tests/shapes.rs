//! Issue 33's request shapes against the mock server: non-streaming
//! requests and requests without a limit on both backends, the prompt nonce,
//! and the flags that cannot be combined. Every check is on what the mock
//! fixes (token counts, its timeline) or on what loadgen wrote.

mod common;

use std::time::Duration;

use common::{loadgen, start, u, MockConfig};

fn mock_cfg() -> MockConfig {
    MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(2),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_requests_end_with_their_body() {
    let mock = start(mock_cfg()).await;
    for endpoint in ["completions", "chat"] {
        let run = loadgen(&[
            "--backend",
            "openai",
            "--base-url",
            &mock.http_url,
            "--endpoint",
            endpoint,
            "--stream",
            "false",
            "--num-requests",
            "4",
            "--max-new-tokens",
            "6",
        ])
        .await;
        assert_eq!(run.code(), Some(0), "{}", run.output());
        assert!(
            run.stdout.contains("Request shape:") && run.stdout.contains("non-streaming"),
            "{}",
            run.stdout
        );
        assert!(run.summary["request_shape"]
            .as_str()
            .is_some_and(|s| s.starts_with("non-streaming")));
        for r in &run.requests {
            assert_eq!(r["streamed"], false, "{r}");
            assert_eq!(u(r, "completion_tokens"), 6, "usage counts: {r}");
            assert_eq!(r["token_recv_ns"].as_array().map(Vec::len), Some(0));
            let (ttft, latency) = (u(r, "client_ttft_ns"), u(r, "latency_ns"));
            assert_eq!(ttft, latency, "TTFT = the end of the body: {r}");
            // The mock's timeline: 20 ms to the first token, 5 more at 2 ms.
            assert!(latency >= 30_000_000, "{r}");
            // TPOT is the server's decode time over the tokens after the
            // first. (A range on it was flaky: the mock's tokens keep an
            // absolute schedule, so a first token stamped late on a loaded
            // machine shortens the decode time it reports.)
            let (tpot, decode) = (u(r, "client_tpot_ns"), u(&r["server"], "decode_ns"));
            assert!(decode > 0, "{r}");
            assert!(
                tpot.abs_diff(decode / 5) <= 1,
                "TPOT from the server's decode time: {r}"
            );
            assert!(r["overhead_ns"].is_i64(), "latency - server total: {r}");
        }
    }
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_limit_the_server_decides_on_both_backends() {
    let mock = start(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_micros(500),
        ..Default::default()
    })
    .await;
    // HTTP: no max_tokens in the body; the mock's OpenAI default is 16.
    let run = loadgen(&[
        "--backend",
        "openai",
        "--base-url",
        &mock.http_url,
        "--endpoint",
        "chat",
        "--max-new-tokens",
        "none",
        "--num-requests",
        "2",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    assert!(run.stdout.contains("no max_tokens sent"), "{}", run.stdout);
    assert!(run.requests.iter().all(|r| u(r, "completion_tokens") == 16));
    // gRPC needs a limit: the server's (256 on the mock) fitted to its
    // context (1024) after the prompt, read from GetServerInfo.
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--max-new-tokens",
        "none",
        "--num-requests",
        "2",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    assert!(
        run.stdout
            .contains("the server's limit (256) fitted to its context (1024)"),
        "{}",
        run.stdout
    );
    assert!(run
        .requests
        .iter()
        .all(|r| u(r, "completion_tokens") == 256));
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nonce_is_fresh_per_invocation_unless_given() {
    let mock = start(mock_cfg()).await;
    let base = [
        "--target",
        &mock.url,
        "--num-requests",
        "1",
        "--unique-prompts",
    ];
    let a = loadgen(&base).await;
    let b = loadgen(&base).await;
    let nonce = |r: &common::LoadgenRun| r.summary["nonce"].as_str().map(String::from);
    assert!(nonce(&a).is_some_and(|n| n.len() == 6), "{}", a.output());
    assert_ne!(nonce(&a), nonce(&b), "a new nonce per invocation");
    let mut fixed = base.to_vec();
    fixed.extend(["--nonce", "run7"]);
    let c = loadgen(&fixed).await;
    assert_eq!(nonce(&c).as_deref(), Some("run7"));
    assert!(c.stdout.contains("Prompt nonce:") && c.stdout.contains("run7"));
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shapes_that_cannot_be_sent_name_their_flag() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["--target", "127.0.0.1:1", "--stream", "false"],
            "--stream",
        ),
        (
            &["--target", "127.0.0.1:1", "--max-new-tokens", "0"],
            "--max-new-tokens",
        ),
        (&["--target", "127.0.0.1:1", "--nonce", "a b"], "--nonce"),
        (
            &["--target", "127.0.0.1:1", "--num-prefixes", "3"],
            "--num-prefixes",
        ),
        (
            &["--target", "127.0.0.1:1", "--duration", "5s"],
            "--duration",
        ),
        (
            &["--target", "127.0.0.1:1", "--think-time-ms", "5"],
            "--think-time-ms",
        ),
    ];
    for (args, flag) in cases {
        let run = loadgen(args).await;
        assert_ne!(run.code(), Some(0), "{args:?}");
        assert!(
            run.stderr.contains(&format!("invalid {flag}")),
            "{args:?}: {}",
            run.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_run_ends_on_time_and_cuts_what_is_left() {
    // A closed loop of 4 for 1.5 s against 100 ms requests: about 15 x 4
    // requests, fired until 1.5 s. A short grace (300 ms) against 1 s
    // requests (ITL 100 ms x 10) cuts those still running at the end.
    let mock = start(MockConfig {
        ttft: Duration::from_millis(40),
        itl: Duration::from_millis(10),
        ..Default::default()
    })
    .await;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--duration",
        "1500ms",
        "--max-concurrency",
        "4",
        "--max-new-tokens",
        "7",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    let r0 = run.run0().expect("a run");
    let n = u(r0, "requests");
    assert!((30..=72).contains(&n), "about 15 x 4 requests: {n}");
    assert_eq!(u(r0, "cut"), 0, "every request fits the 30 s grace");
    let last_start = run
        .requests
        .iter()
        .map(|r| u(r, "submit_start_ns"))
        .max()
        .expect("requests");
    assert!(
        last_start < 1_500_000_000 + 10_000_000,
        "fired until the end only"
    );
    assert!(r0["throughput_in_duration_tps"]
        .as_f64()
        .is_some_and(|t| t > 0.0));
    assert!(run.stdout.contains("Timed run:") && run.stdout.contains("for 1.5 s"));

    let slow = start(MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(100),
        ..Default::default()
    })
    .await;
    let run = loadgen(&[
        "--target",
        &slow.url,
        "--duration",
        "500ms",
        "--duration-grace",
        "300ms",
        "--submit-interval-ms",
        "100",
        "--max-new-tokens",
        "10",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "cut is not failed: {}", run.output());
    let r0 = run.run0().expect("a run");
    assert_eq!(u(r0, "requests"), 5, "fired at 0, 100, ... 400 ms");
    assert_eq!((u(r0, "cut"), u(r0, "failed"), u(r0, "ok")), (5, 0, 0));
    assert!(run.requests.iter().all(|r| r["status"] == "CUT"));
    let finish = run
        .requests
        .iter()
        .map(|r| u(r, "finish_ns"))
        .max()
        .expect("records");
    assert!(
        finish < 1_500_000_000,
        "cut at 800 ms, not at the 1 s end: {finish}"
    );
    mock.stop().await;
    slow.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_carry_their_history_and_stay_on_one_target() {
    let a = start(mock_cfg()).await;
    let b = start(mock_cfg()).await;
    let run = loadgen(&[
        "--backend",
        "openai",
        "--base-url",
        &format!("{},{}", a.http_url, b.http_url),
        "--balance",
        "least",
        "--endpoint",
        "chat",
        "--turns",
        "3",
        "--think-time-ms",
        "20",
        "--num-requests",
        "4",
        "--max-new-tokens",
        "5",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    assert_eq!(run.requests.len(), 12, "4 sessions x 3 turns");
    assert!(run.stdout.contains("sessions of 3 turns"), "{}", run.stdout);
    for s in 0..4 {
        let turns: Vec<_> = (0..3)
            .map(|t| {
                run.requests
                    .iter()
                    .find(|r| u(r, "index") == (s * 3 + t) as u64)
                    .unwrap_or_else(|| panic!("session {s} turn {t}"))
            })
            .collect();
        let target = &turns[0]["target"];
        assert!(
            turns.iter().all(|r| &r["target"] == target),
            "pinned: {turns:?}"
        );
        // The mock counts whitespace words: each turn adds the reply (one
        // word of 5 x) and a new message.
        let prompts: Vec<u64> = turns.iter().map(|r| u(r, "prompt_tokens")).collect();
        assert!(
            prompts.windows(2).all(|w| w[1] > w[0] + 1),
            "history grows: {prompts:?}"
        );
        let gap = u(turns[1], "submit_start_ns") - u(turns[0], "finish_ns");
        assert!(gap >= 20_000_000, "think time before the next turn: {gap}");
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefixes_lead_every_prompt() {
    let mock = start(mock_cfg()).await;
    let metrics = format!("{}/metrics", mock.http_url);
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--shared-prefix-len",
        "40",
        "--num-prefixes",
        "2",
        "--num-requests",
        "6",
        "--max-new-tokens",
        "2",
        "--max-concurrency",
        "1",
        "--scrape-metrics",
        &metrics,
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    assert!(
        run.stdout.contains("shared prefixes: 2 x 40 tokens"),
        "{}",
        run.stdout
    );
    // Token ids are sent (the mock counts them): 40 + the unique suffix.
    for r in &run.requests {
        assert!(u(r, "prompt_tokens") > 45, "{r}");
    }
    assert!(
        run.stdout.contains("from the prefix cache"),
        "{}",
        run.stdout
    );
    mock.stop().await;
}
