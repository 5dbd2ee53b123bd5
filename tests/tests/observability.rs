//! What an operator reads: the built server's logs and its Prometheus page.
//!
//! - `--log-format json`: with stderr going to a file (not a terminal) every
//!   line is one JSON object and there is no ESC byte; each request's span
//!   closes with one line carrying its id, outcome and timings, including a
//!   rejected request's.
//! - text logs to a file have no ANSI colour codes either.
//! - `/metrics` serves vLLM's names with a `model_name` label, and the counts
//!   match the requests made.
//! - a STOP finish (here a stop token id) is vLLM's `stop` on `/metrics`, and
//!   `stop` in its span's close line.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use ember_common::pb::FinishReason;
use ember_tests::client;
use ember_tests::server::Server;
use serde_json::Value;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog";
const NEW_TOKENS: u32 = 3;

/// Runs one request that generates `NEW_TOKENS` tokens, and one that is
/// rejected (max_new_tokens 0), with the given request ids.
fn one_ok_one_rejected(server: &Server, ok_id: &str, bad_id: &str) {
    let addr = server.addr();
    let (ok_id, bad_id) = (ok_id.to_owned(), bad_id.to_owned());
    let (ok, bad) = server
        .block_on(move || async move {
            let mut c = client::connect(addr).await?;
            let mut req = client::text_request(PROMPT, NEW_TOKENS, true);
            req.request_id = ok_id;
            let ok = client::generate(&mut c, req, None).await;
            let mut req = client::text_request(PROMPT, 0, true);
            req.request_id = bad_id;
            let bad = client::generate(&mut c, req, None).await;
            Ok((ok, bad))
        })
        .expect("client");
    assert_eq!(
        ok.finish_reason(),
        Some(FinishReason::Length),
        "{}",
        ok.summary()
    );
    assert_eq!(
        bad.code(),
        tonic::Code::InvalidArgument,
        "{}",
        bad.summary()
    );
}

/// Stops the server (SIGTERM, drain) and returns its whole stderr.
fn stop_and_read_stderr(mut server: Server) -> Vec<u8> {
    server.sigterm();
    let status = server.wait_exit(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}\n{}",
        server.stderr_tail(20)
    );
    std::fs::read(server.dir.join("server.stderr")).expect("read the server's stderr")
}

/// The close line of the span whose `request_id` is `id`.
fn span_close<'a>(lines: &'a [Value], id: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["fields"]["message"] == "close" && l["span"]["request_id"] == id)
        .unwrap_or_else(|| panic!("no span close line for request {id}"))
}

#[test]
fn json_logs_are_one_object_per_line_and_each_request_closes_its_span_with_timings() {
    let server = Server::tiny("obs-json", &["--log-format", "json"]);
    one_ok_one_rejected(&server, "obs-json-ok", "obs-json-bad");
    let stderr = stop_and_read_stderr(server);
    assert!(!stderr.contains(&0x1b), "an ESC byte in the JSON log");
    let text = String::from_utf8(stderr).expect("the log is UTF-8");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["fields"]["message"] == "stopped"),
        "the log ends with the shutdown lines:\n{text}"
    );
    for line in &lines {
        for key in ["timestamp", "level", "fields", "target"] {
            assert!(line.get(key).is_some(), "no {key}: {line}");
        }
    }

    let ok = &span_close(&lines, "obs-json-ok")["span"];
    assert_eq!(ok["name"], "request");
    assert_eq!(ok["finish_reason"], "length", "{ok}");
    assert_eq!(ok["completion_tokens"], NEW_TOKENS, "{ok}");
    assert_eq!(ok["prompt_tokens"], 9, "{ok}");
    assert!(ok["seq"].as_u64().is_some(), "{ok}");
    let ms = |key: &str| {
        ok[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a number: {ok}"))
    };
    let (queue, ttft, total) = (ms("queue_wait_ms"), ms("ttft_ms"), ms("total_ms"));
    assert!(
        0.0 <= queue && queue <= ttft && ttft <= total,
        "queue wait <= ttft <= total: {ok}"
    );

    let bad = &span_close(&lines, "obs-json-bad")["span"];
    assert!(bad.get("request_id").is_some());
    assert_eq!(bad["rejected"], "invalid_argument", "{bad}");
    assert!(
        bad["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("max_new_tokens")),
        "the error names the field: {bad}"
    );
    assert!(bad.get("finish_reason").is_none(), "{bad}");
}

#[test]
fn text_logs_to_a_file_have_no_colour_codes() {
    let server = Server::tiny("obs-text", &[]);
    one_ok_one_rejected(&server, "obs-text-ok", "obs-text-bad");
    let stderr = stop_and_read_stderr(server);
    let text = String::from_utf8_lossy(&stderr);
    assert!(
        !stderr.contains(&0x1b),
        "an ESC byte in the text log:\n{text}"
    );
    let close = text
        .lines()
        .find(|l| l.contains("request_id=\"obs-text-ok\"") && l.contains(" close time.busy"))
        .unwrap_or_else(|| panic!("no close line for obs-text-ok:\n{text}"));
    assert!(close.contains("finish_reason=\"length\""), "{close}");
    assert!(close.contains("ttft_ms="), "{close}");
    // Each field once (a field recorded twice on a span is printed twice).
    assert_eq!(close.matches("request_id=").count(), 1, "{close}");
    let rejected = text
        .lines()
        .find(|l| l.contains("request_id=\"obs-text-bad\"") && l.contains(" close time.busy"))
        .unwrap_or_else(|| panic!("no close line for obs-text-bad:\n{text}"));
    assert_eq!(rejected.matches("request_id=").count(), 1, "{rejected}");
}

/// A port nobody listens on right now (for `--metrics-port`, which cannot
/// be 0).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

/// GET `/metrics` over plain HTTP/1.0.
fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    assert!(response.starts_with("HTTP/1."), "{response}");
    assert!(response.contains(" 200 "), "{response}");
    response
}

/// The value of the sample line that starts with `series` (name + labels).
fn sample(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{page}"))
}

#[test]
fn metrics_use_vllms_names_with_a_model_name_label() {
    let port = free_port();
    let server = Server::tiny("obs-metrics", &["--metrics-port", &port.to_string()]);
    one_ok_one_rejected(&server, "obs-metrics-ok", "obs-metrics-bad");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let m = |name: &str| format!("{name}{{model_name=\"tiny\"}}");
    let gauges = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "ember:kv_cache_blocks_used",
    ];
    // The scheduler publishes its gauges just after it sends the last token:
    // scrape until they show the idle state (or give up after 5 s).
    let mut page = scrape(addr);
    for _ in 0..50 {
        if gauges.iter().all(|g| sample(&page, &m(g)) == 0.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        page = scrape(addr);
    }
    let reason = |r: &str| {
        format!("vllm:request_success_total{{model_name=\"tiny\",finished_reason=\"{r}\"}}")
    };
    assert_eq!(sample(&page, &reason("length")), 1.0);
    for r in ["stop", "abort", "error"] {
        assert_eq!(sample(&page, &reason(r)), 0.0, "{r}");
    }
    assert_eq!(sample(&page, &m("vllm:prompt_tokens_total")), 9.0);
    assert_eq!(
        sample(&page, &m("vllm:generation_tokens_total")),
        f64::from(NEW_TOKENS)
    );
    for histogram in [
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ] {
        assert_eq!(
            sample(&page, &m(&format!("{histogram}_count"))),
            1.0,
            "{histogram}"
        );
    }
    assert_eq!(
        sample(&page, &m("vllm:inter_token_latency_seconds_count")),
        f64::from(NEW_TOKENS - 1)
    );
    for gauge in gauges {
        assert_eq!(sample(&page, &m(gauge)), 0.0, "{gauge} once idle");
    }
    // The one admitted prompt was looked up in the (empty) prefix cache.
    assert_eq!(sample(&page, &m("vllm:prefix_cache_queries_total")), 9.0);
    assert_eq!(sample(&page, &m("vllm:prefix_cache_hits_total")), 0.0);
    assert_eq!(
        sample(
            &page,
            "ember:request_rejected_total{model_name=\"tiny\",reason=\"invalid_argument\"}"
        ),
        1.0
    );
    assert!(
        !page.lines().any(|l| l.starts_with("ember:time_to_first")),
        "the old ember: latency names are gone"
    );
    // Nothing was autotuned after SERVING (issue 46: a missed shape stalls
    // every request behind it).
    assert_eq!(sample(&page, &m("ember:autotune_while_serving_total")), 0.0);
    assert_eq!(
        sample(&page, &m("ember:kernel_compiles_while_serving_total")),
        0.0
    );
}

/// Runs a seeded sampled request, then the same one with `stop_token_ids` set to one
/// of its tokens (the first not seen before it, at index k >= 1) as
/// `request_id`; returns k, the tokens the stopped request should send.
fn one_length_one_stopped(server: &Server, request_id: &str) -> u32 {
    let addr = server.addr();
    let request_id = request_id.to_owned();
    let (k, stopped) = server
        .block_on(move || async move {
            let mut c = client::connect(addr).await?;
            // Sampled with a fixed seed, so the two runs draw the same tokens
            // (greedy, the tiny model repeats one token).
            let req = ember_common::pb::GenerateRequest {
                sampling: Some(ember_common::pb::SamplingParams {
                    temperature: Some(1.0),
                    seed: Some(7),
                    ..Default::default()
                }),
                ..client::text_request(PROMPT, 16, true)
            };
            let baseline = client::generate(&mut c, req.clone(), None).await;
            let ids: Vec<u32> = baseline.tokens.iter().map(|(t, _)| t.token_id).collect();
            let k = (1..ids.len())
                .find(|&k| !ids[..k].contains(&ids[k]))
                .ok_or_else(|| anyhow::anyhow!("no new token in {ids:?}"))?;
            let req = ember_common::pb::GenerateRequest {
                stop_token_ids: vec![ids[k]],
                request_id,
                ..req
            };
            Ok((k as u32, client::generate(&mut c, req, None).await))
        })
        .expect("client");
    assert_eq!(
        stopped.finish_reason(),
        Some(FinishReason::Stop),
        "{}",
        stopped.summary()
    );
    k
}

#[test]
fn a_stop_finish_is_vllms_stop_in_metrics_and_the_log() {
    let port = free_port();
    let args = ["--log-format", "json", "--metrics-port", &port.to_string()];
    let server = Server::tiny("obs-stop", &args);
    let k = one_length_one_stopped(&server, "obs-stop");
    let page = scrape(SocketAddr::from(([127, 0, 0, 1], port)));
    let reason = |r: &str| {
        format!("vllm:request_success_total{{model_name=\"tiny\",finished_reason=\"{r}\"}}")
    };
    assert_eq!(sample(&page, &reason("stop")), 1.0);
    assert_eq!(sample(&page, &reason("length")), 1.0);
    assert_eq!(sample(&page, &reason("abort")), 0.0);
    // Both are completed requests: both are in the request-level histograms.
    let e2e = "vllm:e2e_request_latency_seconds_count{model_name=\"tiny\"}";
    assert_eq!(sample(&page, e2e), 2.0);

    let stderr = stop_and_read_stderr(server);
    let text = String::from_utf8(stderr).expect("the log is UTF-8");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let stopped = &span_close(&lines, "obs-stop")["span"];
    assert_eq!(stopped["finish_reason"], "stop", "{stopped}");
    assert_eq!(stopped["completion_tokens"], k, "{stopped}");
    for key in ["queue_wait_ms", "ttft_ms", "total_ms"] {
        assert!(stopped[key].as_f64().is_some(), "{key}: {stopped}");
    }
}
