//! The response pieces of a request's events: chunks per token and choice,
//! the collected body, echo with the prompt's logprobs, usage over choices.

use super::*;
use crate::http::prompt_view::PromptOptions;
use crate::http::shapes::Api;
use ember_common::tokenizer::Gpt2Tokenizer;
use serde_json::json;

fn tok() -> Gpt2Tokenizer {
    Gpt2Tokenizer::embedded().unwrap()
}

fn msg(event: PbEvent) -> StreamItem {
    Ok(pb::GenerateResponse { event: Some(event) })
}

fn translator(api: Api, logprobs: bool, prompts: PromptOptions) -> Translator {
    Translator::new((api, 7, "tiny"), tok(), logprobs, prompts)
}

fn one(n: u32) -> PromptOptions {
    PromptOptions {
        n,
        texts: vec!["Hi".into()],
        ..Default::default()
    }
}

fn token(choice: u32, index: u32, token_id: u32, text: &str, logprob: bool) -> StreamItem {
    msg(PbEvent::Token(pb::Token {
        index,
        token_id,
        text: text.into(),
        server_time_ns: 10 + u64::from(index),
        logprob: logprob.then_some(-1.0),
        top_logprobs: Vec::new(),
        choice,
    }))
}

fn finished(choice: u32, trailing: &str) -> StreamItem {
    msg(PbEvent::Finished(pb::Finished {
        request_id: "r9".into(),
        finish_reason: pb::FinishReason::Length as i32,
        prompt_tokens: 3,
        completion_tokens: 2,
        trailing_text: trailing.into(),
        choice,
        ..Default::default()
    }))
}

fn started() -> StreamItem {
    msg(PbEvent::Started(pb::Started {
        request_id: "r9".into(),
        prompt_tokens: 3,
        server_time_ns: 1,
    }))
}

fn events(logprob: bool) -> Vec<StreamItem> {
    vec![
        started(),
        token(0, 0, 15496, "Hello", logprob),
        token(0, 1, 995, "", logprob),
        finished(0, " world"),
    ]
}

fn parse(chunks: Vec<String>) -> Vec<Value> {
    chunks
        .iter()
        .map(|c| serde_json::from_str(c).unwrap())
        .collect()
}

#[test]
fn one_chunk_per_token_then_the_last_and_usage() {
    let mut w = ChunkWriter::new(translator(Api::Chat, false, one(1)), true);
    let chunks: Vec<String> = events(false).into_iter().flat_map(|e| w.item(e)).collect();
    let v = parse(chunks);
    assert_eq!(v.len(), 5, "role, 2 tokens, last, usage: {v:?}");
    assert_eq!(v[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(v[0].get("ember").is_none());
    assert_eq!(v[1]["id"], "chatcmpl-r9");
    assert_eq!(
        v[2]["choices"][0]["delta"]["content"], "",
        "an empty token still has its chunk"
    );
    assert_eq!(v[2]["ember"]["index"], 1);
    assert_eq!(v[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(v[3]["choices"][0]["delta"]["content"], " world");
    assert!(v[3].get("ember_timing").is_some());
    assert_eq!(v[4]["usage"]["total_tokens"], 5);

    let mut w = ChunkWriter::new(translator(Api::Completions, true, one(1)), false);
    let v = parse(events(true).into_iter().flat_map(|e| w.item(e)).collect());
    assert_eq!(v.len(), 3, "no role chunk, no usage chunk: {v:?}");
    assert_eq!(v[0]["choices"][0]["logprobs"]["tokens"], json!(["Hello"]));
    assert_eq!(v[1]["choices"][0]["logprobs"]["text_offset"], json!([5]));
}

#[test]
fn an_error_is_one_error_event() {
    let mut w = ChunkWriter::new(translator(Api::Completions, false, one(1)), false);
    let v = parse(w.item(Err(StreamError::DeadlineExceeded { stage: "queued" })));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["error"]["code"], "deadline_exceeded");
    assert_eq!(v[0]["error"]["type"], "timeout_error");
}

#[test]
fn the_collector_joins_the_text_and_the_trailing_text() {
    let mut c = Collector::new(translator(Api::Completions, true, one(1)));
    let bodies: Vec<Value> = events(true)
        .into_iter()
        .filter_map(|e| c.message(e.unwrap()))
        .collect();
    assert_eq!(bodies.len(), 1);
    let b = &bodies[0];
    assert_eq!(b["id"], "cmpl-r9");
    assert_eq!(b["choices"][0]["text"], "Hello world");
    assert_eq!(
        b["choices"][0]["logprobs"]["tokens"],
        json!(["Hello", " world"])
    );
    assert_eq!(b["choices"][0]["logprobs"]["text_offset"], json!([0, 5]));
    assert_eq!(
        b["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    );
}

#[test]
fn choices_are_indexed_and_usage_counts_each_prompt_once() {
    // Two choices of one prompt, their messages interleaved.
    let items = vec![
        started(),
        token(1, 0, 15496, "A", false),
        token(0, 0, 995, "B", false),
        finished(1, ""),
        finished(0, "!"),
    ];
    let mut c = Collector::new(translator(Api::Completions, false, one(2)));
    let body = items
        .iter()
        .cloned()
        .find_map(|e| c.message(e.unwrap()))
        .expect("a body once both finished");
    assert_eq!(body["choices"][0]["index"], 0);
    assert_eq!(body["choices"][0]["text"], "B!");
    assert_eq!(body["choices"][1]["text"], "A");
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    assert_eq!(body["usage"]["completion_tokens"], 4);
    assert_eq!(body["ember_timings"].as_array().map(Vec::len), Some(2));

    let mut w = ChunkWriter::new(translator(Api::Chat, false, one(2)), true);
    let v = parse(items.into_iter().flat_map(|e| w.item(e)).collect());
    let indices: Vec<u64> = v
        .iter()
        .filter_map(|c| c["choices"].get(0).and_then(|x| x["index"].as_u64()))
        .collect();
    assert_eq!(indices, [0, 1, 1, 0, 1, 0], "roles, tokens, finishes");
    assert_eq!(v.last().unwrap()["usage"]["completion_tokens"], 4);
}

#[test]
fn echo_puts_the_prompt_and_its_logprobs_first() {
    let prompts = PromptOptions {
        echo: true,
        prompt_logprobs: true,
        n: 1,
        texts: vec!["Hello world".into()],
    };
    let scored = msg(PbEvent::PromptLogprobs(pb::PromptLogprobs {
        first: 1,
        tokens: vec![pb::PromptTokenLogprob {
            token_id: 995,
            logprob: -2.5,
            top_logprobs: vec![pb::TopLogprob {
                token_id: 11,
                text: ",".into(),
                logprob: -0.5,
            }],
        }],
        choice: 0,
        first_token_id: 15496,
    }));
    let items = vec![
        started(),
        scored,
        token(0, 0, 0, "!", true),
        finished(0, ""),
    ];
    let mut c = Collector::new(translator(Api::Completions, true, prompts));
    let body = items
        .into_iter()
        .find_map(|e| c.message(e.unwrap()))
        .unwrap();
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], "Hello world!");
    let lp = &choice["logprobs"];
    assert_eq!(lp["tokens"], json!(["Hello", " world", "!"]));
    assert_eq!(lp["token_logprobs"], json!([null, -2.5, -1.0]));
    assert_eq!(lp["top_logprobs"][0], json!(null));
    assert_eq!(lp["text_offset"], json!([0, 5, 11]));
    // vLLM's prompt_logprobs: null, then the token and its alternatives.
    let p = &choice["prompt_logprobs"];
    assert_eq!(p[0], json!(null));
    assert_eq!(p[1]["995"]["logprob"], json!(-2.5));
    assert_eq!(p[1]["995"]["rank"], json!(2));
    assert_eq!(p[1]["11"]["rank"], json!(1));
}
