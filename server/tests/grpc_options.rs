//! In-process gRPC tests of the generation options of issue 31 through the
//! whole request path (the engine's results against transformers are the
//! engine's tests): penalties, logit_bias and min_tokens reach the engine
//! and are validated naming the field; `n` choices share one stream, each
//! with its seed, the followers taking the prompt from the prefix cache;
//! prompt logprobs come before the first token, and max_new_tokens 0 scores
//! the prompt alone.

mod support;

use ember_common::pb;
use support::{collect, collect_all, request, TestServer};
use tonic::Code;

fn ids(tokens: &[pb::Token]) -> Vec<u32> {
    tokens.iter().map(|t| t.token_id).collect()
}

fn sampled(seed: u64) -> pb::SamplingParams {
    pb::SamplingParams {
        temperature: Some(1.0),
        seed: Some(seed),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_reach_the_engine_and_bad_ones_name_their_field() {
    let server = TestServer::start(&[]).await;
    let mut client = server.client().await;
    let (_, plain, _) = collect(&mut client, request("Hello world", 24))
        .await
        .unwrap();
    let first = plain[0].token_id;
    let with = |sampling: pb::SamplingParams| pb::GenerateRequest {
        sampling: Some(sampling),
        ..request("Hello world", 24)
    };
    // A bias of -100 on the greedy first token moves it.
    let (_, biased, _) = collect(
        &mut client,
        with(pb::SamplingParams {
            logit_bias: [(first, -100.0)].into_iter().collect(),
            ..Default::default()
        }),
    )
    .await
    .unwrap();
    assert_ne!(biased[0].token_id, first);
    // A strong frequency penalty forbids repeats the plain run makes.
    let (_, penalized, _) = collect(
        &mut client,
        with(pb::SamplingParams {
            frequency_penalty: Some(2.0),
            presence_penalty: Some(2.0),
            ..Default::default()
        }),
    )
    .await
    .unwrap();
    assert_ne!(ids(&penalized), ids(&plain));
    for (req, field) in [
        (
            with(pb::SamplingParams {
                repetition_penalty: Some(0.0),
                ..Default::default()
            }),
            "sampling.repetition_penalty",
        ),
        (
            with(pb::SamplingParams {
                frequency_penalty: Some(2.5),
                ..Default::default()
            }),
            "sampling.frequency_penalty",
        ),
        (
            with(pb::SamplingParams {
                logit_bias: [(50257, 1.0)].into_iter().collect(),
                ..Default::default()
            }),
            "sampling.logit_bias[50257]",
        ),
        (
            with(pb::SamplingParams {
                min_tokens: 25,
                ..Default::default()
            }),
            "sampling.min_tokens",
        ),
        (
            pb::GenerateRequest {
                n: 17,
                ..request("x", 4)
            },
            "n",
        ),
        (
            pb::GenerateRequest {
                prompt_logprobs: Some(21),
                ..request("x", 4)
            },
            "prompt_logprobs",
        ),
        (
            pb::GenerateRequest {
                priority: 3,
                ..request("x", 4)
            },
            "priority",
        ),
        (request("x", 0), "max_new_tokens"),
        (
            with(pb::SamplingParams {
                min_p: Some(1.5),
                ..Default::default()
            }),
            "sampling.min_p",
        ),
    ] {
        let err = collect(&mut client, req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(
            err.message().starts_with(field),
            "{field}: {}",
            err.message()
        );
    }
    server.assert_idle().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_share_a_stream_and_each_is_its_seeded_single_run() {
    let server = TestServer::start(&["--block-size", "4"]).await;
    let mut client = server.client().await;
    let prompt = "The quick brown fox jumps over the lazy dog again and again";
    let one = |seed| pb::GenerateRequest {
        sampling: Some(sampled(seed)),
        ..request(prompt, 12)
    };
    let w = collect_all(&mut client, pb::GenerateRequest { n: 3, ..one(40) })
        .await
        .unwrap();
    assert_eq!(w.started.len(), 1);
    assert_eq!(w.finished.len(), 3);
    for j in 0..3u32 {
        let mine: Vec<pb::Token> = w.tokens.iter().filter(|t| t.choice == j).cloned().collect();
        let (_, alone, _) = collect(&mut client, one(40 + u64::from(j))).await.unwrap();
        assert_eq!(
            ids(&mine),
            ids(&alone),
            "choice {j} = the single run with seed 40 + {j}"
        );
        let f = w.finished.iter().find(|f| f.choice == j).unwrap();
        assert_eq!(f.completion_tokens, 12);
        let cached = f.timing.as_ref().unwrap().cached_prompt_tokens;
        // The followers take the leader's prompt blocks from the prefix cache.
        assert!(j == 0 || cached > 0, "choice {j}: {cached} cached");
    }
    server.assert_idle().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_come_first_and_zero_new_tokens_scores_the_prompt() {
    let server = TestServer::start(&[]).await;
    let mut client = server.client().await;
    let req = pb::GenerateRequest {
        prompt_token_ids: vec![464, 2068, 7586, 21831, 18045],
        prompt_logprobs: Some(2),
        ..request("", 3)
    };
    let w = collect_all(&mut client, req.clone()).await.unwrap();
    let scored: Vec<&pb::PromptTokenLogprob> =
        w.prompt_logprobs.iter().flat_map(|p| &p.tokens).collect();
    assert_eq!(w.prompt_logprobs[0].first, 1);
    assert_eq!(w.prompt_logprobs[0].first_token_id, 464);
    assert_eq!(
        scored.iter().map(|t| t.token_id).collect::<Vec<_>>(),
        [2068, 7586, 21831, 18045]
    );
    assert!(scored
        .iter()
        .all(|t| t.logprob <= 0.0 && t.top_logprobs.len() == 2));
    assert_eq!(w.tokens.len(), 3);
    let only = collect_all(
        &mut client,
        pb::GenerateRequest {
            max_new_tokens: 0,
            ..req
        },
    )
    .await
    .unwrap();
    assert!(only.tokens.is_empty());
    assert_eq!(only.finished[0].completion_tokens, 0);
    let again: Vec<f32> = only
        .prompt_logprobs
        .iter()
        .flat_map(|p| p.tokens.iter().map(|t| t.logprob))
        .collect();
    assert_eq!(again, scored.iter().map(|t| t.logprob).collect::<Vec<_>>());
    server.assert_idle().await;
    server.stop().await;
}
