//! Faults: a full queue, malformed requests and deadlines (client
//! disconnects are in `disconnects.rs`, SIGTERM in `shutdown.rs`).
//! Each test ends asserting 0 KV blocks used, 0 active sequences, an empty
//! queue, health SERVING and that a fresh request still completes
//! (`Server::assert_idle_and_serving`).
//!
//! Several tests need requests to *wait* in the pending queue: they hold
//! every KV block with a [`Blocker`] (see `ember_tests::blocker`) and release
//! it when the test has seen what it needs. Work that must last a while is
//! sized from the server's measured decode step time, so the tests hold on a
//! fast release build as on a slow debug one.
//!
//! Tolerances (also in docs/testing.md):
//! - "at once" for RESOURCE_EXHAUSTED: the rejection arrives within 1 s (it is
//!   milliseconds; the bound is for a loaded 2-core CI machine).
//! - deadlines: DEADLINE_EXCEEDED no earlier than the deadline minus 5 ms and
//!   no later than the deadline + 3 s.

use std::time::{Duration, Instant};

use anyhow::Context;
use ember_common::pb::{generate_response::Event, GenerateRequest, SamplingParams};
use ember_tests::blocker::{self, Blocker};
use ember_tests::client::{self};
use ember_tests::server::Server;
use tokio_stream::StreamExt;
use tonic::Code;

/// More requests than `--max-pending` while they must wait (the blocker
/// holds every KV block): the first max-pending are accepted, the excess get
/// RESOURCE_EXHAUSTED at once, and every accepted request completes once the
/// blocker is released.
#[test]
fn queue_full_rejects_excess_at_once() {
    const MAX_PENDING: usize = 4;
    const SUBMIT: usize = 10;
    let mp = MAX_PENDING.to_string();
    let mut flags = vec!["--max-pending", mp.as_str(), "--max-batch-size", "4"];
    flags.extend_from_slice(blocker::FLAGS);
    let server = Server::tiny("fault-queue-full", &flags);
    let addr = server.addr();
    let before = server.counters();
    let (accepted, rejected) = server
        .block_on(move || async move {
            let blocker = Blocker::start(addr).await?;
            let mut c = client::connect(addr).await?;
            let mut accepted = Vec::new();
            let mut rejected = Vec::new();
            for i in 0..SUBMIT as u32 {
                let t = Instant::now();
                match c.generate(client::ids_request(vec![50 + i, 51], 4)).await {
                    Ok(resp) => {
                        let mut s = resp.into_inner();
                        // The first message must be `started` (enqueued), at once.
                        let first = tokio::time::timeout(Duration::from_secs(5), s.next())
                            .await
                            .context("no first message within 5 s")?;
                        match first {
                            Some(Ok(m)) if matches!(m.event, Some(Event::Started(_))) => {}
                            Some(Err(st)) if st.code() == Code::ResourceExhausted => {
                                rejected.push((i, t.elapsed(), st.message().to_owned()));
                                continue;
                            }
                            other => {
                                anyhow::bail!("request {i}: unexpected first message {other:?}")
                            }
                        }
                        accepted.push(tokio::spawn(async move {
                            let mut out = client::StreamOutcome::new(t);
                            out.started = Some((Default::default(), Instant::now()));
                            while let Some(m) = s.next().await {
                                match m {
                                    Ok(m) => client::record(&mut out, m.event, Instant::now()),
                                    Err(st) => {
                                        out.status = Some(st);
                                        break;
                                    }
                                }
                            }
                            out
                        }));
                    }
                    Err(st) if st.code() == Code::ResourceExhausted => {
                        rejected.push((i, t.elapsed(), st.message().to_owned()));
                    }
                    Err(st) => anyhow::bail!("request {i}: unexpected status {st}"),
                }
            }
            client::wait_info(
                addr,
                Duration::from_secs(10),
                "queue depth = --max-pending",
                |i| i.queue_depth as usize == MAX_PENDING,
            )
            .await?;
            blocker.ensure_running("all submissions were made")?;
            blocker.release().await;
            let mut outs = Vec::new();
            for a in accepted {
                outs.push(a.await?);
            }
            anyhow::Ok((outs, rejected))
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    eprintln!("rejected (index, latency, message): {rejected:?}");
    assert_eq!(
        accepted.len(),
        MAX_PENDING,
        "accepted exactly --max-pending"
    );
    assert_eq!(
        rejected.len(),
        SUBMIT - MAX_PENDING,
        "the excess is rejected"
    );
    for (i, lat, _) in &rejected {
        assert!(
            *lat < Duration::from_secs(1),
            "request {i} rejected after {lat:?}, not at once"
        );
    }
    for a in &accepted {
        assert_eq!(a.code(), Code::Ok, "accepted request: {}", a.summary());
        assert_eq!(a.tokens.len(), 4, "accepted request: {}", a.summary());
        assert!(a.protocol_errors.is_empty(), "{}", a.summary());
    }
    let idle = server.assert_idle_and_serving();
    let after = idle.counters.unwrap_or_default();
    assert_eq!(
        after.rejected - before.rejected,
        (SUBMIT - MAX_PENDING) as u64,
        "rejected counter"
    );
}

// ---------------------------------------------------------------------------

/// A table of malformed requests, each -> INVALID_ARGUMENT naming the field,
/// plus boundary requests that must be accepted.
#[test]
fn malformed_requests_get_invalid_argument() {
    const LIMIT: u32 = 8;
    let server = Server::tiny(
        "fault-malformed",
        &["--max-new-tokens-limit", &LIMIT.to_string()],
    );
    let addr = server.addr();
    let sampling = |t: Option<f32>, k: Option<i32>, p: Option<f32>| {
        Some(SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            seed: Some(7),
            ..Default::default()
        })
    };
    let base = || client::text_request("Hello there", 2, true);
    let ids = |ids: Vec<u32>, n: u32| GenerateRequest {
        prompt_token_ids: ids,
        max_new_tokens: n,
        ignore_eos: true,
        ..Default::default()
    };
    // All cases at once: rejections are immediate, the accepted ones batch.
    // (case, request, Some(field names any of which the message must contain) = rejected; None = accepted)
    let cases: Vec<(&str, GenerateRequest, Option<&[&str]>)> = vec![
        (
            "empty prompt, no ids",
            GenerateRequest {
                prompt: String::new(),
                ..base()
            },
            Some(&["prompt"]),
        ),
        (
            "both prompt and ids",
            GenerateRequest {
                prompt_token_ids: vec![1, 2],
                ..base()
            },
            Some(&["prompt"]),
        ),
        (
            "token id = vocab size",
            ids(vec![1, 50257], 2),
            Some(&["prompt_token_ids"]),
        ),
        (
            "token id u32::MAX",
            ids(vec![u32::MAX], 2),
            Some(&["prompt_token_ids"]),
        ),
        (
            "prompt + max_new_tokens > context",
            ids(vec![1; 1000], 25),
            Some(&["max_new_tokens", "context"]),
        ),
        (
            "max_new_tokens 0",
            GenerateRequest {
                max_new_tokens: 0,
                ..base()
            },
            Some(&["max_new_tokens"]),
        ),
        (
            "max_new_tokens above limit",
            GenerateRequest {
                max_new_tokens: LIMIT + 1,
                ..base()
            },
            Some(&["max_new_tokens"]),
        ),
        (
            "temperature < 0",
            GenerateRequest {
                sampling: sampling(Some(-0.5), None, None),
                ..base()
            },
            Some(&["temperature"]),
        ),
        (
            "temperature NaN",
            GenerateRequest {
                sampling: sampling(Some(f32::NAN), None, None),
                ..base()
            },
            Some(&["temperature"]),
        ),
        (
            "top_p 0",
            GenerateRequest {
                sampling: sampling(None, None, Some(0.0)),
                ..base()
            },
            Some(&["top_p"]),
        ),
        (
            "top_p > 1",
            GenerateRequest {
                sampling: sampling(None, None, Some(1.5)),
                ..base()
            },
            Some(&["top_p"]),
        ),
        (
            "top_p < 0",
            GenerateRequest {
                sampling: sampling(None, None, Some(-0.1)),
                ..base()
            },
            Some(&["top_p"]),
        ),
        (
            "top_p NaN",
            GenerateRequest {
                sampling: sampling(None, None, Some(f32::NAN)),
                ..base()
            },
            Some(&["top_p"]),
        ),
        (
            "top_k < -1",
            GenerateRequest {
                sampling: sampling(None, Some(-2), None),
                ..base()
            },
            Some(&["top_k"]),
        ),
        // Boundaries that are valid.
        (
            "prompt + max_new_tokens = context",
            ids(vec![1; 1022], 2),
            None,
        ),
        (
            "max_new_tokens = limit",
            GenerateRequest {
                max_new_tokens: LIMIT,
                ..base()
            },
            None,
        ),
        (
            "top_p = 1",
            GenerateRequest {
                sampling: sampling(Some(0.8), None, Some(1.0)),
                ..base()
            },
            None,
        ),
        (
            "temperature 0, top_k 0",
            GenerateRequest {
                sampling: sampling(Some(0.0), Some(0), None),
                ..base()
            },
            None,
        ),
        (
            "top_k 5",
            GenerateRequest {
                sampling: sampling(Some(1.0), Some(5), Some(0.9)),
                ..base()
            },
            None,
        ),
        ("largest token id", ids(vec![50256, 0], 2), None),
    ];
    let results = server
        .block_on(move || async move {
            let c = client::connect(addr).await?;
            let mut tasks = Vec::new();
            for (name, req, expect) in cases {
                let mut c = c.clone();
                tasks.push(tokio::spawn(async move {
                    (name, expect, client::generate(&mut c, req, None).await)
                }));
            }
            let mut results = Vec::new();
            for t in tasks {
                results.push(t.await?);
            }
            anyhow::Ok(results)
        })
        .unwrap();
    let mut failures = Vec::new();
    for (name, expect, out) in &results {
        match expect {
            Some(fields) => {
                let msg = out
                    .status
                    .as_ref()
                    .map(|s| s.message().to_owned())
                    .unwrap_or_default();
                if out.code() != Code::InvalidArgument || !fields.iter().any(|f| msg.contains(f)) {
                    failures.push(format!(
                        "{name}: expected INVALID_ARGUMENT naming {fields:?}, got {}",
                        out.summary()
                    ));
                } else if out.started.is_some() {
                    failures.push(format!(
                        "{name}: rejected after `started`: {}",
                        out.summary()
                    ));
                }
            }
            None => {
                if out.code() != Code::Ok || out.tokens.is_empty() {
                    failures.push(format!("{name}: expected success, got {}", out.summary()));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        results.len(),
        failures.join("\n")
    );
    server.assert_idle_and_serving();
}

// ---------------------------------------------------------------------------

/// Short `grpc-timeout`s -> DEADLINE_EXCEEDED from the server (the client
/// only sends the header), both while running (a 1000-token request; the
/// deadline is 300 ms + 5 decode steps, so it has streamed tokens) and while
/// queued (behind the blocker, 100 ms); the blocks are freed; a generous
/// deadline is harmless.
#[test]
fn deadlines_exceeded_free_blocks() {
    let server = Server::tiny("fault-deadline", blocker::FLAGS);
    let addr = server.addr();
    let before = server.counters();
    let (running, queued, generous) = server
        .block_on(move || async move {
            let step = client::step_time(addr).await?;
            let mut c = client::connect(addr).await?;
            // While running.
            let running_dl = Duration::from_millis(300) + 5 * step;
            let running = client::generate(
                &mut c,
                client::ids_request(vec![7, 8, 9, 10], 1000),
                Some(running_dl),
            )
            .await;
            client::wait_idle(addr, Duration::from_secs(5))
                .await
                .context("blocks freed after the running deadline")?;
            // While queued.
            let blocker = Blocker::start(addr).await?;
            let queued_dl = Duration::from_millis(100);
            let queued = client::generate(
                &mut c,
                client::ids_request(vec![7, 8, 9, 10], 20),
                Some(queued_dl),
            )
            .await;
            blocker.ensure_running("the queued request's deadline")?;
            blocker.release().await;
            // A deadline that does not expire.
            let generous = client::generate(
                &mut c,
                client::text_request("plenty of time", 4, true),
                Some(Duration::from_secs(60)),
            )
            .await;
            anyhow::Ok(((running, running_dl), (queued, queued_dl), generous))
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    for (what, (out, dl)) in [("running", &running), ("queued", &queued)] {
        assert_eq!(
            out.code(),
            Code::DeadlineExceeded,
            "{what}: {}",
            out.summary()
        );
        let took = out.status_at.unwrap().duration_since(out.call_start);
        assert!(
            took + Duration::from_millis(5) >= *dl && took <= *dl + Duration::from_secs(3),
            "{what}: DEADLINE_EXCEEDED after {took:?} for a {dl:?} deadline"
        );
    }
    assert!(
        !running.0.tokens.is_empty(),
        "the running request streamed no token before its deadline: {}",
        running.0.summary()
    );
    assert!(
        queued.0.tokens.is_empty(),
        "the queued request got tokens, so it was admitted: {}",
        queued.0.summary()
    );
    assert_eq!(
        generous.code(),
        Code::Ok,
        "generous deadline: {}",
        generous.summary()
    );
    let idle = server.assert_idle_and_serving();
    let after = idle.counters.unwrap_or_default();
    // Counters: 2 deadlines + the released blocker (cancelled). The queued
    // deadline is always counted as deadline_exceeded. The running one can be
    // counted as cancelled instead: the stream task sends Cancel(deadline) and
    // drops its event receiver; if the scheduler's in-flight iteration sends a
    // token first, the failed send marks the client gone (worker.rs) and the
    // later Cancel finds nothing. Reported; tighten to == 2 once fixed.
    let dl = after.deadline_exceeded - before.deadline_exceeded;
    let cancelled = after.cancelled - before.cancelled;
    assert!(
        dl >= 1 && dl + cancelled == 3,
        "deadline_exceeded +{dl}, cancelled +{cancelled}: {after:?}"
    );
    if dl < 2 {
        eprintln!(
            "NOTE: the running request's deadline was counted as cancelled (known server race)"
        );
    }
}
