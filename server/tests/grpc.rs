//! In-process gRPC tests: the real server (`server::run`) on 127.0.0.1:0 with
//! the tiny model on the CPU, driven by a tonic client (helpers in `support`).

mod support;

use std::time::Duration;

use ember_common::pb::{self, generate_response::Event};
use support::{collect, request, TestServer};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_tokens_with_an_ordered_timeline_that_adds_up() {
    let server = TestServer::start(&[]).await;
    assert_eq!(server.health().await, ServingStatus::Serving);
    let mut client = server.client().await;
    let (started, tokens, finished) = collect(
        &mut client,
        pb::GenerateRequest {
            request_id: "mine".into(),
            ..request("Hello world", 8)
        },
    )
    .await
    .unwrap();
    assert_eq!(started.request_id, "mine");
    assert_eq!(started.prompt_tokens, 2);
    assert_eq!(tokens.len(), 8);
    assert_eq!(finished.completion_tokens, 8);
    assert_eq!(finished.finish_reason, pb::FinishReason::Length as i32);
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(t.index as usize, i);
    }
    let t = finished.timing.unwrap();
    // received <= tokenized <= enqueued <= admitted <= first token <= ... <= finished
    let points = [
        0,
        t.tokenized_at_ns,
        t.enqueued_at_ns,
        t.admitted_at_ns,
        t.first_token_at_ns,
    ];
    assert!(points.windows(2).all(|w| w[0] <= w[1]), "{t:?}");
    assert!(tokens
        .windows(2)
        .all(|w| w[0].server_time_ns <= w[1].server_time_ns));
    assert_eq!(tokens[0].server_time_ns, t.first_token_at_ns);
    assert!(tokens.last().unwrap().server_time_ns <= t.finished_at_ns);
    assert_eq!(started.server_time_ns, t.enqueued_at_ns);
    // The stages add up exactly.
    assert_eq!(
        t.tokenize_ns + t.enqueue_ns + t.queue_wait_ns + t.prefill_to_first_token_ns,
        t.server_ttft_ns
    );
    assert_eq!(t.server_ttft_ns, t.first_token_at_ns);
    assert_eq!(
        t.decode_ns,
        tokens.last().unwrap().server_time_ns - tokens[0].server_time_ns
    );
    assert_eq!(t.total_ns, t.finished_at_ns);
    assert_eq!(t.prefill_batch_size, 1);

    // Pre-tokenized input skips the tokenizer and gives the same greedy tokens.
    let (_, pretok, _) = collect(
        &mut client,
        pb::GenerateRequest {
            prompt: String::new(),
            prompt_token_ids: vec![15496, 995],
            ..request("", 8)
        },
    )
    .await
    .unwrap();
    let ids = |ts: &[pb::Token]| ts.iter().map(|t| t.token_id).collect::<Vec<_>>();
    assert_eq!(ids(&pretok), ids(&tokens));

    let info = server.info().await;
    assert_eq!(info.vocab_size, 50257);
    assert_eq!(info.counters.unwrap().finished, 2);
    server.assert_idle().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_validation_case_returns_its_status() {
    let server = TestServer::start(&["--max-new-tokens-limit", "64"]).await;
    let mut client = server.client().await;
    let sampling = |s: pb::SamplingParams| pb::GenerateRequest {
        sampling: Some(s),
        ..request("Hi", 4)
    };
    let cases: Vec<(&str, pb::GenerateRequest, &str)> = vec![
        ("empty input", request("", 4), "prompt"),
        (
            "both inputs",
            pb::GenerateRequest {
                prompt_token_ids: vec![1],
                ..request("Hi", 4)
            },
            "prompt",
        ),
        (
            "token id >= vocab",
            pb::GenerateRequest {
                prompt_token_ids: vec![50257],
                ..request("", 4)
            },
            "prompt_token_ids",
        ),
        (
            "beyond context",
            pb::GenerateRequest {
                prompt_token_ids: vec![1; 1000],
                ..request("", 60)
            },
            "max_new_tokens",
        ),
        ("max_new_tokens 0", request("Hi", 0), "max_new_tokens"),
        ("above limit", request("Hi", 65), "max_new_tokens"),
        (
            "temperature < 0",
            sampling(pb::SamplingParams {
                temperature: Some(-0.5),
                ..Default::default()
            }),
            "sampling.temperature",
        ),
        (
            "temperature NaN",
            sampling(pb::SamplingParams {
                temperature: Some(f32::NAN),
                ..Default::default()
            }),
            "sampling.temperature",
        ),
        (
            "top_p 0",
            sampling(pb::SamplingParams {
                top_p: Some(0.0),
                ..Default::default()
            }),
            "sampling.top_p",
        ),
        (
            "top_p > 1",
            sampling(pb::SamplingParams {
                top_p: Some(1.01),
                ..Default::default()
            }),
            "sampling.top_p",
        ),
        (
            "top_k < 0",
            sampling(pb::SamplingParams {
                top_k: Some(-3),
                ..Default::default()
            }),
            "sampling.top_k",
        ),
    ];
    for (name, req, field) in cases {
        let err = collect(&mut client, req).await.expect_err(name);
        assert_eq!(err.code(), Code::InvalidArgument, "{name}: {err:?}");
        assert!(
            err.message().starts_with(field),
            "{name}: {:?} does not name {field}",
            err.message()
        );
    }
    // Valid sampling works and is reproducible with a seed.
    let seeded = || {
        sampling(pb::SamplingParams {
            temperature: Some(0.9),
            top_k: Some(50),
            top_p: Some(0.95),
            seed: Some(1234),
            ..Default::default()
        })
    };
    let (_, a, _) = collect(&mut client, seeded()).await.unwrap();
    let (_, b, _) = collect(&mut client, seeded()).await.unwrap();
    let ids = |ts: &[pb::Token]| ts.iter().map(|t| t.token_id).collect::<Vec<_>>();
    assert_eq!(ids(&a), ids(&b));
    let counters = server.info().await.counters.unwrap();
    assert_eq!(counters.rejected, 11);
    server.assert_idle().await;
    server.stop().await;
}

/// `GenerateRequest` as the wire sees it, with `prompt` (tag 2) as raw bytes:
/// lets a test send a prompt that is not UTF-8, which the real type cannot
/// hold.
#[derive(Clone, PartialEq, prost::Message)]
struct RawGenerateRequest {
    #[prost(bytes = "vec", tag = "2")]
    prompt: Vec<u8>,
    #[prost(uint32, tag = "4")]
    max_new_tokens: u32,
}

/// Sends a [`RawGenerateRequest`] to `Generate` and reads the stream to its end.
async fn generate_raw(server: &TestServer, prompt: &[u8]) -> Result<usize, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<RawGenerateRequest, pb::GenerateResponse>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/ember.v1.Inference/Generate");
    let req = tonic::Request::new(RawGenerateRequest {
        prompt: prompt.to_vec(),
        max_new_tokens: 2,
    });
    let mut stream = grpc.server_streaming(req, path, codec).await?.into_inner();
    let mut messages = 0;
    while stream.message().await?.is_some() {
        messages += 1;
    }
    Ok(messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_request_is_invalid_argument_naming_the_field() {
    let server = TestServer::start(&[]).await;
    // The same path with valid UTF-8: Started, 2 tokens, Finished.
    assert_eq!(generate_raw(&server, b"Hello").await.unwrap(), 4);
    let err = generate_raw(&server, b"Hello \xff\xfe world")
        .await
        .expect_err("a prompt that is not UTF-8 cannot be decoded");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("GenerateRequest.prompt"),
        "the message names the field: {:?}",
        err.message()
    );
    // The server is unharmed.
    assert_eq!(generate_raw(&server, b"Hello").await.unwrap(), 4);
    server.assert_idle().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_full_is_resource_exhausted_and_accepted_requests_complete() {
    // One running sequence at a time, two places in the queue.
    let server = TestServer::start(&["--max-batch-size", "1", "--max-pending", "2"]).await;
    let mut tasks = Vec::new();
    let mut codes = Vec::new();
    for i in 0..6 {
        let mut client = server.client().await;
        match client.generate(request(&format!("request {i}"), 200)).await {
            Ok(resp) => tasks.push(tokio::spawn(async move {
                let mut s = resp.into_inner();
                let mut n = 0;
                while let Some(m) = s.message().await.unwrap() {
                    if let Some(Event::Finished(f)) = m.event {
                        n = f.completion_tokens;
                    }
                }
                n
            })),
            Err(status) => codes.push(status.code()),
        }
    }
    assert!(!codes.is_empty(), "nothing was rejected");
    assert!(
        codes.iter().all(|c| *c == Code::ResourceExhausted),
        "{codes:?}"
    );
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    server.assert_idle().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_frees_its_blocks() {
    let server = TestServer::start(&[]).await;
    let mut client = server.client().await;
    let mut stream = client
        .generate(request("drop me", 500))
        .await
        .unwrap()
        .into_inner();
    // Wait for a few tokens, then walk away.
    let mut seen = 0;
    while seen < 3 {
        if let Some(Event::Token(_)) = stream.message().await.unwrap().unwrap().event {
            seen += 1;
        }
    }
    assert!(server.info().await.kv_blocks_used > 0);
    drop(stream);
    server.assert_idle().await;
    assert_eq!(server.info().await.counters.unwrap().cancelled, 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_exceeded_frees_blocks() {
    let server = TestServer::start(&[]).await;
    let mut client = server.client().await;
    let mut req = tonic::Request::new(request("slow", 1000 - 2));
    req.set_timeout(Duration::from_millis(150));
    let result = async {
        let mut s = client.generate(req).await?.into_inner();
        while s.message().await?.is_some() {}
        Ok::<_, tonic::Status>(())
    }
    .await;
    assert_eq!(result.unwrap_err().code(), Code::DeadlineExceeded);
    server.assert_idle().await;
    let c = server.info().await.counters.unwrap();
    assert_eq!(c.deadline_exceeded, 1, "{c:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_before_ready_and_serving_after() {
    let server = TestServer::spawn(&[]).await;
    // Seen at least once NOT_SERVING or already SERVING; then SERVING for good.
    let first = server.health().await;
    assert!(matches!(
        first,
        ServingStatus::NotServing | ServingStatus::Serving
    ));
    if first == ServingStatus::NotServing {
        // Before SERVING, Generate is UNAVAILABLE.
        let mut client = server.client().await;
        if let Err(e) = collect(&mut client, request("early", 1)).await {
            assert_eq!(e.code(), Code::Unavailable);
        }
    }
    server.wait_serving().await;
    assert_eq!(server.health().await, ServingStatus::Serving);
    server.stop().await;
}

/// A greedy request for exactly these token ids.
fn ids_request(prompt_token_ids: Vec<u32>, n: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        prompt_token_ids,
        max_new_tokens: n,
        ignore_eos: true,
        ..Default::default()
    }
}

fn token_ids(tokens: &[pb::Token]) -> Vec<u32> {
    tokens.iter().map(|t| t.token_id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_prefix_is_served_from_the_cache_with_the_same_tokens() {
    let shared: Vec<u32> = (0..200).map(|i| (i * 37 + 11) % 50_000).collect();
    let prompt = |turn: u32| {
        [
            shared.clone(),
            (0..10).map(|i| 1000 + turn * 10 + i).collect(),
        ]
        .concat()
    };
    let on = TestServer::start(&[]).await;
    let off = TestServer::start(&["--no-prefix-cache"]).await;
    let (mut on_client, mut off_client) = (on.client().await, off.client().await);
    for (turn, cached) in [(1, 0), (2, 192)] {
        let (_, got, f) = collect(&mut on_client, ids_request(prompt(turn), 8))
            .await
            .unwrap();
        let (_, want, f_off) = collect(&mut off_client, ids_request(prompt(turn), 8))
            .await
            .unwrap();
        assert_eq!(token_ids(&got), token_ids(&want), "turn {turn}");
        // The second request finds the shared prefix's 12 full blocks of 16
        // and prefills only the last 8 shared tokens and its own 10.
        let t = f.timing.unwrap();
        assert_eq!((t.cached_prompt_tokens, t.prefill_chunks), (cached, 1));
        assert_eq!(f_off.timing.unwrap().cached_prompt_tokens, 0);
    }
    let info = on.info().await;
    assert!(info.prefix_cache_enabled);
    assert_eq!(
        (
            info.prefix_cache_queried_tokens,
            info.prefix_cache_hit_tokens
        ),
        (420, 192)
    );
    let info = off.info().await;
    assert!(!info.prefix_cache_enabled);
    assert_eq!(info.prefix_cache_queried_tokens, 0);
    on.assert_idle().await;
    off.assert_idle().await;
    on.stop().await;
    off.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_longer_than_the_prefill_budget_is_chunked_with_the_same_tokens() {
    let prompt: Vec<u32> = (0..300).map(|i| (i * 101 + 7) % 50_000).collect();
    let chunked = TestServer::start(&["--prefill-max-tokens", "64", "--no-prefix-cache"]).await;
    let whole = TestServer::start(&["--no-prefix-cache"]).await;
    let (_, got, f) = collect(&mut chunked.client().await, ids_request(prompt.clone(), 6))
        .await
        .unwrap();
    let (_, want, f_whole) = collect(&mut whole.client().await, ids_request(prompt, 6))
        .await
        .unwrap();
    assert_eq!(token_ids(&got), token_ids(&want));
    assert_eq!(f.timing.unwrap().prefill_chunks, 5); // ceil(300 / 64)
    assert_eq!(f_whole.timing.unwrap().prefill_chunks, 1);
    chunked.assert_idle().await;
    chunked.stop().await;
    whole.stop().await;
}
