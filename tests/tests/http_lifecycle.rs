//! The HTTP door in the server's lifecycle and observability, against the
//! built `ember-server`:
//!
//! - SIGTERM drains HTTP like gRPC: `/health` turns 503, a new request gets
//!   503 (`draining`) on HTTP and UNAVAILABLE on gRPC, a running SSE stream
//!   still gets every token, its last chunk and `[DONE]`, and the process
//!   exits 0.
//! - `/metrics` counts each door (`ember:requests_total{front_door,
//!   outcome}`) while vLLM's series count both together, and each request's
//!   log line names its door (`front_door` in the span).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use ember_tests::client;
use ember_tests::http::{http_client, HttpServer, SseReader};
use serde_json::{json, Value};

#[test]
fn sigterm_drains_http_streams_and_refuses_new_requests() {
    let mut server = HttpServer::tiny("http-sigterm", &["--shutdown-timeout", "60"]);
    let (grpc, completions, health) = (
        server.grpc_addr(),
        server.url("/v1/completions"),
        server.url("/health"),
    );
    // Long enough to still run after SIGTERM: about 2 s of decode steps.
    let step = ember_tests::block_on(None, move || async move { client::step_time(grpc).await })
        .expect("step time");
    let tokens =
        (Duration::from_secs(2).as_nanos() / step.as_nanos().max(1)).clamp(16, 1000) as u64;
    let http = http_client(None).expect("client");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let stream = {
        let (http, completions) = (http.clone(), completions.clone());
        std::thread::spawn(move || {
            ember_tests::block_on(None, move || async move {
                let body = json!({
                    "prompt": "Draining:", "max_tokens": tokens, "ignore_eos": true,
                    "temperature": 0, "stream": true
                });
                let r = http.post(&completions).json(&body).send().await?;
                ensure!(r.status() == 200, "{}", r.status());
                let mut sse = SseReader::new(r);
                let first = sse.next_data().await?.context("no first chunk")?;
                let _ = tx.send(());
                let mut events = vec![first];
                events.extend(sse.all().await?);
                Ok((events, Instant::now()))
            })
        })
    };
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the stream started");
    server.sigterm();
    let refused = ember_tests::block_on(None, move || async move {
        let end = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let h = http.get(&health).send().await?.status();
            if h == 503 {
                break;
            }
            ensure!(
                tokio::time::Instant::now() < end,
                "/health still {h} after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let r = http
            .post(&completions)
            .json(&json!({"prompt": "late", "max_tokens": 2}))
            .send()
            .await?;
        ensure!(
            r.status() == 503,
            "a new HTTP request while draining: {}",
            r.status()
        );
        let v: Value = r.json().await?;
        ensure!(v["error"]["code"] == "draining", "{v}");
        let mut c = client::connect(grpc).await?;
        let late = client::generate(&mut c, client::text_request("late", 2, true), None).await;
        ensure!(
            late.code() == tonic::Code::Unavailable,
            "gRPC while draining: {}",
            late.summary()
        );
        Ok(Instant::now())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    let (events, stream_end) = stream.join().expect("stream thread").expect("the stream");
    assert!(
        stream_end > refused,
        "premise: the stream was still running while new requests were refused"
    );
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("a JSON chunk"))
        .collect();
    assert_eq!(
        chunks.len() as u64,
        tokens + 1,
        "every token's chunk and the last"
    );
    let last = chunks.last().expect("a last chunk");
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    let status = server.wait_exit(Duration::from_secs(70));
    assert!(status.is_some_and(|s| s.success()), "exit {status:?}");
}

#[test]
fn metrics_and_log_lines_name_the_front_door() {
    let port = free_port();
    let mut server = HttpServer::tiny(
        "http-metrics",
        &["--metrics-port", &port.to_string(), "--log-format", "json"],
    );
    let (grpc, completions) = (server.grpc_addr(), server.url("/v1/completions"));
    ember_tests::block_on(None, move || async move {
        let mut c = client::connect(grpc).await?;
        let mut ok = client::text_request("Hello there", 3, true);
        ok.request_id = "door-grpc-ok".into();
        ensure!(client::generate(&mut c, ok, None).await.code() == tonic::Code::Ok);
        let bad = client::text_request("Hello there", 0, true);
        ensure!(client::generate(&mut c, bad, None).await.code() == tonic::Code::InvalidArgument);
        let http = http_client(None)?;
        let r = http
            .post(&completions)
            .header("x-request-id", "door-http-ok")
            .json(&json!({"prompt": "Hello there", "max_tokens": 3, "ignore_eos": true}))
            .send()
            .await?;
        ensure!(r.status() == 200 && r.headers()["x-request-id"] == "door-http-ok");
        let r = http
            .post(&completions)
            .header("x-request-id", "door-http-bad")
            .json(&json!({"prompt": "Hello there", "n": 17}))
            .send()
            .await?;
        ensure!(r.status() == 400);
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    let page = scrape(SocketAddr::from(([127, 0, 0, 1], port)));
    let door = |d: &str, outcome: &str| {
        sample(
            &page,
            &format!("ember:requests_total{{model_name=\"tiny\",front_door=\"{d}\",outcome=\"{outcome}\"}}"),
        )
    };
    for d in ["grpc", "http"] {
        assert_eq!(door(d, "length"), 1.0, "{d}");
        assert_eq!(door(d, "rejected"), 1.0, "{d}");
        assert_eq!(door(d, "abort"), 0.0, "{d}");
    }
    let success = "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"}";
    assert_eq!(
        sample(&page, success),
        2.0,
        "vLLM's series count both doors"
    );
    let rejected = "ember:request_rejected_total{model_name=\"tiny\",reason=\"invalid_argument\"}";
    assert_eq!(sample(&page, rejected), 2.0);

    server.sigterm();
    assert!(server
        .wait_exit(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    let lines: Vec<Value> = server
        .stderr()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for (id, d) in [
        ("door-grpc-ok", "grpc"),
        ("door-http-ok", "http"),
        ("door-http-bad", "http"),
    ] {
        let close = lines
            .iter()
            .find(|l| l["fields"]["message"] == "close" && l["span"]["request_id"] == id)
            .unwrap_or_else(|| panic!("no close line for {id}"));
        assert_eq!(close["span"]["front_door"], d, "{close}");
    }
    let bad = lines
        .iter()
        .find(|l| l["span"]["request_id"] == "door-http-bad" && l["fields"]["message"] == "close")
        .expect("the refused request's line");
    assert_eq!(bad["span"]["rejected"], "invalid_argument", "{bad}");
    assert!(
        bad["span"]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("n: ")),
        "{bad}"
    );
}

/// GET `/metrics` over plain HTTP/1.0.
fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to /metrics");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("send");
    let mut page = String::new();
    stream.read_to_string(&mut page).expect("read");
    page
}

/// The value of the sample line that starts with `series`.
fn sample(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{page}"))
}

/// A port nobody listens on right now (for `--metrics-port`).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}
