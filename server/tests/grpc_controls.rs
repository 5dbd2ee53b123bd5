//! In-process gRPC tests of the per-request generation controls: stop strings,
//! stop token ids, logprobs and their validation (helpers in `support`).

mod support;

use ember_common::pb::{self, stop_match::Matched};
use ember_common::tokenizer::Gpt2Tokenizer;
use support::{collect, request, TestServer};
use tonic::Code;

fn text_of(tokens: &[pb::Token]) -> String {
    tokens.iter().map(|t| t.text.as_str()).collect()
}

fn matched(f: &pb::Finished) -> Option<Matched> {
    f.stop.as_ref().and_then(|s| s.matched.clone())
}

/// A stop string made of the last character of token `i`'s text and the first
/// of token `i + 1`'s, whose first occurrence in the whole text is exactly
/// there: `(i, stop, byte offset of the match)`.
fn spanning_stop(tokens: &[pb::Token]) -> Option<(usize, String, usize)> {
    let full = text_of(tokens);
    let mut offset = 0;
    for i in 0..tokens.len().saturating_sub(1) {
        let (a, b) = (&tokens[i].text, &tokens[i + 1].text);
        offset += a.len();
        let (Some(last), Some(first)) = (a.chars().last(), b.chars().next()) else {
            continue;
        };
        let stop = format!("{last}{first}");
        let at = offset - last.len_utf8();
        if full.find(&stop) == Some(at) {
            return Some((i, stop, at));
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_spanning_two_tokens_is_not_emitted_and_frees_the_sequence() {
    let server = TestServer::start(&[]).await;
    let mut client = server.client().await;
    let (_, baseline, _) = collect(&mut client, request("Hello world", 32))
        .await
        .unwrap();
    let full = text_of(&baseline);
    let (i, stop, at) = spanning_stop(&baseline).expect("two tokens with text to stop across");

    let before = server.info().await.counters.unwrap();
    let (_, tokens, finished) = collect(
        &mut client,
        pb::GenerateRequest {
            stop: vec!["never\u{1}matches".into(), stop.clone()],
            ..request("Hello world", 400)
        },
    )
    .await
    .unwrap();
    // The token that completed the stop string is the last one sent; the
    // stop string and everything after it are not.
    assert_eq!(tokens.len(), i + 2, "{stop:?} in {full:?}");
    assert_eq!(text_of(&tokens), full[..at]);
    assert!(!text_of(&tokens).contains(&stop));
    // Token i's last character was held back (it could start the stop string).
    let held = &baseline[i].text;
    assert_eq!(
        tokens[i].text,
        held[..held.len() - stop.chars().next().unwrap().len_utf8()]
    );
    assert_eq!(finished.finish_reason, pb::FinishReason::Stop as i32);
    assert_eq!(matched(&finished), Some(Matched::Stop(stop)));
    assert_eq!(finished.completion_tokens as usize, i + 2);
    assert_eq!(finished.trailing_text, "");

    // The scheduler was told at once: blocks freed, counted as finished, and
    // the sequence did not run on towards its 400 tokens.
    server.assert_idle().await;
    let after = server.info().await.counters.unwrap();
    assert_eq!(after.finished - before.finished, 1);
    assert_eq!(after.cancelled, 0);
    let iterations = after.scheduler_iterations - before.scheduler_iterations;
    assert!(
        iterations < 100,
        "ran {iterations} iterations after the stop"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_token_id_ends_the_stream_without_emitting_it() {
    let server = TestServer::start(&[]).await;
    let mut client = server.client().await;
    let (_, baseline, _) = collect(&mut client, request("Hello world", 32))
        .await
        .unwrap();
    let ids: Vec<u32> = baseline.iter().map(|t| t.token_id).collect();
    let k = (1..ids.len())
        .find(|&k| !ids[..k].contains(&ids[k]))
        .expect("a token not seen before it");
    let (_, tokens, finished) = collect(
        &mut client,
        pb::GenerateRequest {
            stop_token_ids: vec![ids[k]],
            ..request("Hello world", 32)
        },
    )
    .await
    .unwrap();
    let got: Vec<u32> = tokens.iter().map(|t| t.token_id).collect();
    assert_eq!(got, ids[..k]);
    assert_eq!(finished.finish_reason, pb::FinishReason::Stop as i32);
    assert_eq!(matched(&finished), Some(Matched::TokenId(ids[k])));
    assert_eq!(finished.completion_tokens as usize, k);
    assert_eq!(
        text_of(&tokens) + &finished.trailing_text,
        Gpt2Tokenizer::embedded().unwrap().decode(&ids[..k])
    );
    server.assert_idle().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_controls_are_invalid_argument_naming_the_field() {
    let server = TestServer::start(&[]).await;
    let mut client = server.client().await;
    let with = |edit: &dyn Fn(&mut pb::GenerateRequest)| {
        let mut r = request("Hi", 4);
        edit(&mut r);
        r
    };
    let cases: Vec<(pb::GenerateRequest, &str)> = vec![
        (
            with(&|r| r.stop = vec!["a".into(), String::new()]),
            "stop[1]",
        ),
        (with(&|r| r.stop = vec!["x".repeat(257)]), "stop[0]"),
        (with(&|r| r.stop = vec!["s".into(); 17]), "stop"),
        (
            with(&|r| r.stop_token_ids = vec![5, 50257]),
            "stop_token_ids[1]",
        ),
        (with(&|r| r.stop_token_ids = vec![5; 65]), "stop_token_ids"),
        (with(&|r| r.logprobs = Some(21)), "logprobs"),
    ];
    for (req, field) in cases {
        let err = collect(&mut client, req).await.expect_err(field);
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(
            err.message().starts_with(&format!("{field}: ")),
            "{:?} does not name {field}",
            err.message()
        );
    }
    // The largest allowed values are accepted.
    let ok = with(&|r| {
        r.stop = vec!["\u{1}".repeat(256); 16];
        r.stop_token_ids = vec![50256; 64];
        r.logprobs = Some(20);
    });
    let (_, tokens, _) = collect(&mut client, ok).await.unwrap();
    assert_eq!(tokens.len(), 4);
    assert_eq!(tokens[0].top_logprobs.len(), 20);
    server.assert_idle().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_only_with_the_requests_that_ask() {
    let server = TestServer::start(&[]).await;
    let (mut a, mut b, mut c) = (
        server.client().await,
        server.client().await,
        server.client().await,
    );
    let asking = |n| pb::GenerateRequest {
        logprobs: n,
        ..request("Hello world", 12)
    };
    // Concurrent: they share prefill and decode batches.
    let (with, without, top0) = tokio::join!(
        collect(&mut a, asking(Some(4))),
        collect(&mut b, asking(None)),
        collect(&mut c, asking(Some(0))),
    );
    let (with, without, top0) = (with.unwrap().1, without.unwrap().1, top0.unwrap().1);
    let ids = |ts: &[pb::Token]| ts.iter().map(|t| t.token_id).collect::<Vec<_>>();
    assert_eq!(ids(&with), ids(&without));
    assert_eq!(ids(&with), ids(&top0));
    let tokenizer = Gpt2Tokenizer::embedded().unwrap();
    for t in &with {
        let lp = t.logprob.expect("asked for logprobs");
        assert_eq!(t.top_logprobs.len(), 4);
        // Greedy: the sampled token is the most likely alternative.
        assert_eq!(
            (t.top_logprobs[0].token_id, t.top_logprobs[0].logprob),
            (t.token_id, lp)
        );
        assert!(t
            .top_logprobs
            .windows(2)
            .all(|w| w[0].logprob >= w[1].logprob));
        let mass: f32 = t.top_logprobs.iter().map(|a| a.logprob.exp()).sum();
        assert!(lp <= 0.0 && mass <= 1.0 + 1e-5, "{lp} {mass}");
        for alt in &t.top_logprobs {
            assert_eq!(alt.text, tokenizer.decode(&[alt.token_id]));
        }
    }
    assert!(without
        .iter()
        .all(|t| t.logprob.is_none() && t.top_logprobs.is_empty()));
    for (t, w) in top0.iter().zip(&with) {
        assert!(t.top_logprobs.is_empty());
        let lp = t
            .logprob
            .expect("logprobs: 0 still returns the token's logprob");
        assert!((lp - w.logprob.unwrap()).abs() < 1e-4);
    }
    server.assert_idle().await;
    server.stop().await;
}
