//! Issue 13's per-run features against the mock server: goodput under SLOs,
//! datasets and synthetic lengths, gamma arrivals and trace replay, the live
//! view, and stopping a run whose client is the bottleneck. Every check is on
//! numbers the mock or the seed fixes (token counts, planned offsets, a TTFT
//! the mock cannot beat), not on how fast this machine is.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{loadgen, start, u, MockConfig};

fn tmp_file(name: &str, text: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("features-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("write the test file");
    path
}

fn mock_cfg(ttft_ms: u64) -> MockConfig {
    MockConfig {
        ttft: Duration::from_millis(ttft_ms),
        itl: Duration::from_millis(2),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodput_counts_only_ok_requests_within_every_objective() {
    let mock = start(MockConfig {
        fail_every: Some(4),
        ..mock_cfg(5)
    })
    .await;
    let base = [
        "--target",
        &mock.url,
        "--num-requests",
        "8",
        "--max-new-tokens",
        "3",
        "--allow-errors",
    ];
    // Generous objectives: the 6 OK requests are good, the 2 failures are not.
    let mut args = base.to_vec();
    args.extend(["--slo", "ttft=10s,tpot=10s,e2e=20s"]);
    let run = loadgen(&args).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let g = &run.summary["runs"][0]["goodput"];
    assert_eq!(u(g, "good"), 6, "{g}");
    assert!((g["share"].as_f64().expect("share") - 0.75).abs() < 1e-9);
    assert!(g["rps"].as_f64().expect("rps") > 0.0);
    assert!(
        run.stdout.contains("Goodput:") && run.stdout.contains("6 of 8 requests good, 75.0%"),
        "{}",
        run.stdout
    );
    // A TTFT objective below the mock's 5 ms TTFT: nothing is good.
    let mut args = base.to_vec();
    args.extend(["--slo", "ttft=1ms"]);
    let run = loadgen(&args).await;
    assert_eq!(u(&run.summary["runs"][0]["goodput"], "good"), 0);
    // Without --slo there is no goodput.
    let run = loadgen(&base).await;
    assert!(run.summary["runs"][0]["goodput"].is_null());
    assert!(!run.stdout.contains("Goodput:"));
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dataset_entries_set_prompts_and_lengths() {
    let mock = start(mock_cfg(1)).await;
    let data = tmp_file(
        "data.jsonl",
        "{\"prompt\":\"one two three four\",\"max_new_tokens\":2}\n\
         {\"prompt_token_ids\":[5,6,7],\"max_new_tokens\":3}\n\
         {\"input_length\":5}\n",
    );
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "6",
        "--dataset",
        data.to_str().expect("utf-8"),
        "--max-new-tokens",
        "4",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let got: Vec<(u64, u64)> = run
        .requests
        .iter()
        .map(|r| (u(r, "prompt_tokens"), u(r, "completion_tokens")))
        .collect();
    // The mock counts words of text prompts and ids of id prompts.
    assert_eq!(got, vec![(4, 2), (3, 3), (5, 4), (4, 2), (3, 3), (5, 4)]);

    // Synthetic lengths, seeded.
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "40",
        "--input-len",
        "uniform:3..6",
        "--output-len",
        "fixed:2",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let lens: Vec<u64> = run.requests.iter().map(|r| u(r, "prompt_tokens")).collect();
    assert!(lens.iter().all(|l| (3..=6).contains(l)), "{lens:?}");
    assert!(
        lens.iter().any(|&l| l != lens[0]),
        "drawn, not fixed: {lens:?}"
    );
    assert!(run.requests.iter().all(|r| u(r, "completion_tokens") == 2));
    mock.stop().await;
    let _ = std::fs::remove_file(data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_dataset_fails_fast_naming_file_line_and_field() {
    let data = tmp_file(
        "bad.jsonl",
        "{\"prompt\":\"ok\"}\n{\"prompt_token_ids\":[1,\"x\"]}\n",
    );
    // Port 1 on loopback: nothing listens, so reaching the connection would fail differently.
    let run = loadgen(&[
        "--target",
        "127.0.0.1:1",
        "--dataset",
        data.to_str().expect("utf-8"),
    ])
    .await;
    assert_ne!(run.code(), Some(0));
    let want = format!("{}: line 2: field `prompt_token_ids`", data.display());
    assert!(
        run.stderr.contains(&want),
        "stderr lacks {want:?}:\n{}",
        run.stderr
    );
    let run = loadgen(&["--target", "127.0.0.1:1", "--input-len", "uniform:9..2"]).await;
    assert_ne!(run.code(), Some(0));
    assert!(run.stderr.contains("--input-len"), "{}", run.stderr);
    let _ = std::fs::remove_file(data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gamma_and_trace_arrivals_fire_on_their_plan() {
    let mock = start(mock_cfg(1)).await;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "20",
        "--arrival",
        "gamma",
        "--request-rate",
        "200",
        "--burstiness",
        "0.5",
        "--seed",
        "9",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let planned = ember_loadgen::workload::schedule::gamma_offsets(20, 200.0, 0.5, 9);
    let intended: Vec<u64> = run
        .requests
        .iter()
        .map(|r| u(r, "intended_start_ns"))
        .collect();
    let first = intended[0];
    for (i, (got, want)) in intended.iter().zip(&planned).enumerate() {
        let want = first + want.as_nanos() as u64;
        assert!(
            got.abs_diff(want) <= 1,
            "request {i}: intended {got} ns, planned {want} ns"
        );
    }
    assert!(
        run.stdout.contains("gamma 200 req/s, burstiness 0.5"),
        "{}",
        run.stdout
    );

    // Trace replay at half the recorded time scale; --num-requests caps it.
    let trace = tmp_file(
        "trace.jsonl",
        "{\"timestamp\":1000,\"input_length\":3,\"output_length\":2}\n\
         {\"timestamp\":1100,\"input_length\":3,\"output_length\":2}\n\
         {\"timestamp\":1400,\"input_length\":3,\"output_length\":2}\n\
         {\"timestamp\":9000,\"input_length\":3,\"output_length\":2}\n",
    );
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "3",
        "--arrival",
        "trace",
        "--dataset",
        trace.to_str().expect("utf-8"),
        "--trace-time-scale",
        "0.5",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let intended: Vec<u64> = run
        .requests
        .iter()
        .map(|r| u(r, "intended_start_ns") - u(&run.requests[0], "intended_start_ns"))
        .collect();
    assert_eq!(intended, vec![0, 50_000_000, 200_000_000]);
    assert!(run
        .requests
        .iter()
        .all(|r| u(r, "submit_start_ns") >= u(r, "intended_start_ns")));
    mock.stop().await;
    let _ = std::fs::remove_file(trace);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_prints_status_lines_when_not_a_terminal() {
    let mock = start(mock_cfg(1000)).await;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "4",
        "--max-new-tokens",
        "2",
        "--progress-interval-s",
        "0.1",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    // stderr is a pipe here, so auto means status lines; the last one is
    // drawn when the run ends.
    assert!(
        run.stderr.contains("loadgen r0: 4/4 done, 0 failed"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("loadgen r0: 0/4 done"),
        "a line while waiting for the 1 s TTFT (ticks every 0.1 s):\n{}",
        run.stderr
    );
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "2",
        "--progress",
        "off",
    ])
    .await;
    assert!(!run.stderr.contains("loadgen r0:"), "{}", run.stderr);
    // --progress bar: redrawn in place (carriage return, clear line), ending full.
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "2",
        "--progress",
        "bar",
    ])
    .await;
    let full = format!("\r\x1b[2Kr0 [{}] 2/2 done, 0 failed", "#".repeat(24));
    assert!(run.stderr.contains(&full), "{:?}", run.stderr);
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stops_early_when_the_submit_lag_p99_passes_the_limit() {
    let mock = start(mock_cfg(1)).await;
    // 1 us: no submission on any machine starts within a microsecond of its
    // due time (the request task must first be scheduled on another runtime).
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "400",
        "--submit-interval-ms",
        "1",
        "--max-new-tokens",
        "1",
        "--max-submit-lag-ms",
        "0.001",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let r = &run.summary["runs"][0];
    let reason = r["stopped_early"].as_str().expect("stopped_early is set");
    assert!(reason.contains("client is the bottleneck"), "{reason}");
    let (sent, unsent) = (u(r, "requests"), u(r, "unsent"));
    assert!(
        sent >= 50 && unsent > 0 && sent + unsent == 400,
        "sent {sent}, unsent {unsent}"
    );
    assert!(run.stdout.contains("Stopped early:"), "{}", run.stdout);
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_mock_serves_on_its_own_and_queues_beyond_its_slots() {
    use std::io::BufRead;
    let mut mock = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["mock", "--slots", "1", "--ttft-ms", "30", "--itl-ms", "1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn loadgen mock");
    let stdout = mock.stdout.take().expect("piped stdout");
    let line = std::io::BufReader::new(stdout)
        .lines()
        .next()
        .expect("a first line")
        .expect("readable");
    let addr = ember_testkit::child::parse_listening(&line)
        .expect("a listening line")
        .expect("an address");
    let url = format!("http://{addr}");
    let run = loadgen(&[
        "--target",
        &url,
        "--num-requests",
        "3",
        "--max-new-tokens",
        "2",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let mut waits: Vec<u64> = run
        .requests
        .iter()
        .map(|r| u(&r["server"], "queue_wait_ns"))
        .collect();
    waits.sort_unstable();
    // One slot: each request holds it for >= 31 ms (sleeps never end early),
    // so the second waits >= 31 ms and the third >= 62 ms.
    assert!(
        waits[1] >= 31_000_000 && waits[2] >= 62_000_000,
        "queue waits {waits:?}"
    );
    ember_testkit::child::sigterm(mock.id()).expect("SIGTERM");
    let status = mock.wait().expect("wait");
    assert!(
        status.success(),
        "loadgen mock exits 0 on SIGTERM: {status}"
    );
}

#[test]
fn loadgen_mock_keeps_serving_when_its_stdout_is_gone() {
    // A parent reads the first line and may close the pipe; writing the
    // other lines must not kill the mock. /dev/full fails every write.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut mock = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .arg("mock")
        .stdout(full)
        .spawn()
        .expect("spawn loadgen mock");
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        mock.try_wait().expect("try_wait").is_none(),
        "loadgen mock died when stdout failed"
    );
    ember_testkit::child::sigterm(mock.id()).expect("SIGTERM");
    let status = mock.wait().expect("wait");
    assert!(status.success(), "exits 0 on SIGTERM: {status}");
}
