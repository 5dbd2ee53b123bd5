//! The response shapes against OpenAI's (and the contract's) field by field.

use super::*;

fn shape(api: Api) -> Shape {
    Shape::new(api, "r1", 1_700_000_000, "tiny")
}

fn token(index: u32, text: &str) -> pb::Token {
    pb::Token {
        index,
        token_id: 100 + index,
        text: text.into(),
        server_time_ns: 5_000 + u64::from(index),
        ..Default::default()
    }
}

fn finished(reason: pb::FinishReason, trailing: &str) -> pb::Finished {
    pb::Finished {
        request_id: "r1".into(),
        finish_reason: reason as i32,
        prompt_tokens: 4,
        completion_tokens: 2,
        timing: Some(pb::ServerTiming {
            tokenize_ns: 1,
            server_ttft_ns: 9,
            total_ns: 20,
            prefill_chunks: 1,
            ..Default::default()
        }),
        stop: None,
        trailing_text: trailing.into(),
        choice: 0,
    }
}

#[test]
fn completion_chunks() {
    let s = shape(Api::Completions);
    assert_eq!(s.id, "cmpl-r1");
    assert_eq!(
        s.token_chunk(&token(0, " Hi"), None),
        json!({
            "id": "cmpl-r1", "object": "text_completion", "created": 1_700_000_000u64, "model": "tiny",
            "choices": [{"index": 0, "text": " Hi", "logprobs": null, "finish_reason": null}],
            "ember": {"index": 0, "token_id": 100, "server_time_ns": 5000}
        })
    );
    let last = s.final_chunk(&finished(pb::FinishReason::Length, "!"));
    assert_eq!(
        last["choices"],
        json!([{"index": 0, "text": "!", "logprobs": null, "finish_reason": "length"}])
    );
    assert!(
        last.get("ember").is_none(),
        "no ember field on the last chunk"
    );
    assert_eq!(last["ember_timing"]["total_ns"], 20);
    assert_eq!(
        s.usage_chunk(Usage {
            prompt_tokens: 4,
            completion_tokens: 2
        }),
        json!({
            "id": "cmpl-r1", "object": "text_completion", "created": 1_700_000_000u64, "model": "tiny",
            "choices": [],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
        })
    );
}

#[test]
fn chat_chunks() {
    let s = shape(Api::Chat);
    assert_eq!(s.id, "chatcmpl-r1");
    assert_eq!(
        s.role_chunk(0),
        json!({
            "id": "chatcmpl-r1", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
            "model": "tiny",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": null, "finish_reason": null}]
        })
    );
    let c = s.token_chunk(&token(1, ""), None);
    assert_eq!(c["object"], "chat.completion.chunk");
    assert_eq!(
        c["choices"],
        json!([{"index": 0, "delta": {"content": ""}, "logprobs": null, "finish_reason": null}])
    );
    assert_eq!(
        c["ember"],
        json!({"index": 1, "token_id": 101, "server_time_ns": 5001})
    );
    let last = s.final_chunk(&finished(pb::FinishReason::Stop, ""));
    assert_eq!(
        last["choices"],
        json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}])
    );
    let last = s.final_chunk(&finished(pb::FinishReason::Cancelled, "tail"));
    assert_eq!(last["choices"][0]["delta"], json!({"content": "tail"}));
    assert_eq!(last["choices"][0]["finish_reason"], "abort");
}

#[test]
fn whole_bodies() {
    let f = finished(pb::FinishReason::Eos, "");
    let one = |f| ChoiceBody {
        index: 0,
        text: "Hello",
        logprobs: None,
        prompt_logprobs: None,
        finished: f,
    };
    let usage = Usage {
        prompt_tokens: 4,
        completion_tokens: 2,
    };
    let c = shape(Api::Completions).body(&[one(&f)], usage);
    assert_eq!(c["object"], "text_completion");
    assert_eq!(
        c["choices"],
        json!([{"index": 0, "text": "Hello", "logprobs": null, "finish_reason": "stop"}])
    );
    assert_eq!(c["usage"]["total_tokens"], 6);
    assert_eq!(c["ember_timing"]["server_ttft_ns"], 9);
    let chat = shape(Api::Chat).body(&[one(&f)], usage);
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(
        chat["choices"],
        json!([{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                "logprobs": null, "finish_reason": "stop"}])
    );
}

#[test]
fn timing_has_exactly_the_server_timing_fields() {
    let t = timing(Some(&pb::ServerTiming::default()));
    let mut keys: Vec<&str> = t.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want = vec![
        "tokenize_ns",
        "enqueue_ns",
        "queue_wait_ns",
        "prefill_to_first_token_ns",
        "server_ttft_ns",
        "decode_ns",
        "total_ns",
        "prefill_batch_size",
        "admitted_iteration",
        "tokenized_at_ns",
        "enqueued_at_ns",
        "admitted_at_ns",
        "first_token_at_ns",
        "finished_at_ns",
        "cached_prompt_tokens",
        "prefill_chunks",
        "preemptions",
        "preempted_ns",
    ];
    want.sort_unstable();
    assert_eq!(keys, want);
    assert!(t.as_object().unwrap().values().all(Value::is_u64));
}

fn entries() -> Vec<TokenLogprob> {
    vec![
        TokenLogprob {
            token: " Hi".into(),
            logprob: Some(-0.5),
            top: vec![(" Hi".into(), -0.5), (" Yo".into(), -1.5)],
            text_offset: 0,
        },
        TokenLogprob {
            token: "!".into(),
            logprob: Some(-2.0),
            top: vec![(".".into(), -0.25)],
            text_offset: 3,
        },
    ]
}

#[test]
fn completion_logprobs_are_the_legacy_lists() {
    let lp = shape(Api::Completions).logprobs(&entries());
    assert_eq!(
        lp,
        json!({
            "tokens": [" Hi", "!"],
            "token_logprobs": [-0.5, -2.0],
            // The sampled token is in the map even when not among the top n.
            "top_logprobs": [{" Hi": -0.5, " Yo": -1.5}, {".": -0.25, "!": -2.0}],
            "text_offset": [0, 3]
        })
    );
    let chunk = shape(Api::Completions).token_chunk(&token(0, " Hi"), Some(&entries()[0]));
    assert_eq!(chunk["choices"][0]["logprobs"]["tokens"], json!([" Hi"]));
}

#[test]
fn chat_logprobs_are_per_token_objects() {
    let lp = shape(Api::Chat).logprobs(&entries()[1..]);
    assert_eq!(
        lp,
        json!({"content": [{
            "token": "!", "logprob": -2.0, "bytes": [33],
            "top_logprobs": [{"token": ".", "logprob": -0.25, "bytes": [46]}]
        }]})
    );
}
