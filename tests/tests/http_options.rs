//! The request options real clients send, end to end on the HTTP door of the
//! built `ember-server` (tiny preset, CPU):
//!
//! - a prompt list times `n`: one choice per (prompt, sample) in OpenAI's
//!   order, usage counting each prompt once and every completion token;
//! - `echo` with `logprobs` (lm-evaluation-harness's loglikelihood call):
//!   the prompt's text and tokens first, the first token without a logprob,
//!   and with `max_tokens: 0` nothing generated;
//! - vLLM's `prompt_logprobs`: a list as long as the prompt, `null` first;
//! - `logit_bias` forcing one token, `min_tokens` above `max_tokens`
//!   refused naming the field, penalties accepted;
//! - streamed chat with `n: 2`: every chunk names its choice, each choice
//!   gets its role chunk and exactly one finish reason;
//! - `response_format` with a JSON schema: every sampled choice is JSON
//!   valid against it, ended by the grammar (`stop`); a schema the grammar
//!   compiler refuses is a 400 naming `response_format.json_schema.schema`.
//!
//! The service-level checks (seeds per choice, the gRPC messages) are in
//! `server/tests/grpc_options.rs`.

use anyhow::{ensure, Context};
use ember_tests::http::{assert_idle, http_client, run, HttpServer, SseReader};
use serde_json::{json, Value};

/// POSTs `body` to `url`, returning the status and the JSON body.
async fn post(url: &str, body: Value) -> anyhow::Result<(u16, Value)> {
    let resp = http_client(None)?.post(url).json(&body).send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    let v = serde_json::from_str(&text).with_context(|| format!("{status}: {text}"))?;
    Ok((status, v))
}

fn choices(v: &Value) -> anyhow::Result<&Vec<Value>> {
    v["choices"].as_array().with_context(|| format!("{v}"))
}

#[test]
fn prompt_lists_times_n_come_back_in_openais_order() {
    let server = HttpServer::tiny("http-opt-n", &[]);
    let url = server.url("/v1/completions");
    run(move || async move {
        let prompts = ["The fox", "A much longer prompt about a dog"];
        let body = json!({"model": "tiny", "prompt": prompts, "n": 2, "max_tokens": 5,
                          "temperature": 0.9, "seed": 7, "ignore_eos": true});
        let (status, v) = post(&url, body).await?;
        ensure!(status == 200, "{v}");
        let cs = choices(&v)?;
        ensure!(cs.len() == 4, "2 prompts x n 2: {v}");
        for (i, c) in cs.iter().enumerate() {
            ensure!(c["index"] == json!(i), "choices in index order: {v}");
            ensure!(c["finish_reason"] == json!("length"), "{c}");
        }
        // Each prompt alone, greedy, is what its choices give greedy too.
        let (mut prompt_tokens, mut one) = (0, Vec::new());
        for p in prompts {
            let body = json!({"model": "tiny", "prompt": p, "max_tokens": 5, "temperature": 0,
                              "ignore_eos": true});
            let (_, v) = post(&url, body).await?;
            prompt_tokens += v["usage"]["prompt_tokens"].as_u64().context("usage")?;
            one.push(choices(&v)?[0]["text"].clone());
        }
        let usage = &v["usage"];
        ensure!(
            usage["prompt_tokens"] == json!(prompt_tokens)
                && usage["completion_tokens"] == json!(20)
                && usage["total_tokens"] == json!(prompt_tokens + 20),
            "each prompt counted once, every completion token: {usage}"
        );
        let greedy = json!({"model": "tiny", "prompt": prompts, "n": 2, "max_tokens": 5,
                            "temperature": 0, "ignore_eos": true});
        let (_, v) = post(&url, greedy).await?;
        let texts: Vec<&Value> = choices(&v)?.iter().map(|c| &c["text"]).collect();
        ensure!(
            texts == [&one[0], &one[0], &one[1], &one[1]],
            "{texts:?} vs {one:?}"
        );
        Ok(())
    });
    assert_idle(&server);
}

#[test]
fn echo_with_logprobs_scores_the_prompt() {
    let server = HttpServer::tiny("http-opt-echo", &[]);
    let url = server.url("/v1/completions");
    run(move || async move {
        let prompt = "The quick brown fox jumps";
        let body = json!({"model": "tiny", "prompt": prompt, "echo": true, "logprobs": 1,
                          "max_tokens": 3, "temperature": 0, "ignore_eos": true});
        let (status, v) = post(&url, body).await?;
        ensure!(status == 200, "{v}");
        let c = &choices(&v)?[0];
        let text = c["text"].as_str().context("text")?;
        ensure!(
            text.starts_with(prompt),
            "echo puts the prompt first: {text:?}"
        );
        let n_prompt = v["usage"]["prompt_tokens"].as_u64().context("usage")? as usize;
        let lp = &c["logprobs"];
        let tokens = lp["tokens"].as_array().context("tokens")?;
        let scores = lp["token_logprobs"].as_array().context("token_logprobs")?;
        ensure!(
            tokens.len() == n_prompt + 3 && scores.len() == n_prompt + 3,
            "{lp}"
        );
        let joined: String = tokens.iter().filter_map(Value::as_str).collect();
        ensure!(
            joined == text,
            "the tokens spell the text: {joined:?} vs {text:?}"
        );
        ensure!(
            scores[0].is_null(),
            "the first prompt token has no logprob: {lp}"
        );
        for s in &scores[1..] {
            let s = s.as_f64().with_context(|| format!("{lp}"))?;
            ensure!(s <= 0.0 && s.is_finite(), "{lp}");
        }
        let top = lp["top_logprobs"].as_array().context("top_logprobs")?;
        ensure!(top.len() == n_prompt + 3 && top[0].is_null(), "{lp}");

        // max_tokens 0: only the prompt, scored (lm-eval's loglikelihood).
        let body = json!({"model": "tiny", "prompt": prompt, "echo": true, "logprobs": 0,
                          "max_tokens": 0, "temperature": 0});
        let (status, v) = post(&url, body).await?;
        ensure!(status == 200, "{v}");
        let c = &choices(&v)?[0];
        ensure!(c["text"] == json!(prompt), "{c}");
        let again = c["logprobs"]["token_logprobs"]
            .as_array()
            .context("scores")?;
        ensure!(again.len() == n_prompt, "{c}");
        for (a, b) in again.iter().zip(scores).skip(1) {
            let (a, b) = (a.as_f64().unwrap_or(1.0), b.as_f64().unwrap_or(-1.0));
            ensure!((a - b).abs() < 1e-3, "same prompt, same scores: {a} vs {b}");
        }
        ensure!(v["usage"]["completion_tokens"] == json!(0), "{v}");
        Ok(())
    });
    assert_idle(&server);
}

#[test]
fn prompt_logprobs_logit_bias_min_tokens_and_penalties() {
    let server = HttpServer::tiny("http-opt-controls", &[]);
    let url = server.url("/v1/completions");
    run(move || async move {
        let prompt = "Four score and seven";
        let body = json!({"model": "tiny", "prompt": prompt, "prompt_logprobs": 2,
                          "max_tokens": 2, "temperature": 0});
        let (status, v) = post(&url, body).await?;
        ensure!(status == 200, "{v}");
        let n_prompt = v["usage"]["prompt_tokens"].as_u64().context("usage")? as usize;
        let pl = choices(&v)?[0]["prompt_logprobs"]
            .as_array()
            .context("prompt_logprobs")?;
        ensure!(pl.len() == n_prompt && pl[0].is_null(), "{pl:?}");
        for entry in &pl[1..] {
            let map = entry.as_object().context("a map of token id to logprob")?;
            // The prompt's own token plus up to 2 alternatives (vLLM's shape).
            ensure!((1..=3).contains(&map.len()), "{entry}");
            for (id, e) in map {
                id.parse::<u32>()
                    .with_context(|| format!("token id key {id}"))?;
                ensure!(
                    e["logprob"].as_f64().is_some() && e["rank"].as_u64().is_some(),
                    "{e}"
                );
                ensure!(e["decoded_token"].is_string(), "{e}");
            }
        }

        // A +100 bias on "," (GPT-2 id 11) makes greedy decoding pick it.
        let body = json!({"model": "tiny", "prompt": prompt, "logit_bias": {"11": 100},
                          "max_tokens": 6, "temperature": 0, "ignore_eos": true});
        let (status, v) = post(&url, body).await?;
        ensure!(status == 200, "{v}");
        ensure!(choices(&v)?[0]["text"] == json!(",,,,,,"), "{v}");

        let body = json!({"model": "tiny", "prompt": prompt, "min_tokens": 9, "max_tokens": 4});
        let (status, v) = post(&url, body).await?;
        ensure!(
            status == 400 && v["error"]["param"] == json!("min_tokens"),
            "{status} {v}"
        );

        let body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 8,
                          "repetition_penalty": 1.3, "frequency_penalty": 0.5,
                          "presence_penalty": 0.5, "min_tokens": 8, "temperature": 0});
        let (status, v) = post(&url, body).await?;
        ensure!(status == 200, "{v}");
        ensure!(v["usage"]["completion_tokens"] == json!(8), "{v}");
        Ok(())
    });
    assert_idle(&server);
}

#[test]
fn streamed_chat_with_n_names_every_choice() {
    let server = HttpServer::tiny("http-opt-chat-n", &[]);
    let url = server.url("/v1/chat/completions");
    run(move || async move {
        let body = json!({"model": "tiny", "n": 2, "stream": true, "max_tokens": 4,
                          "messages": [{"role": "user", "content": "Hi"}],
                          "stream_options": {"include_usage": true}, "ignore_eos": true});
        let resp = http_client(None)?.post(&url).json(&body).send().await?;
        ensure!(resp.status().as_u16() == 200);
        let mut sse = SseReader::new(resp);
        let (mut roles, mut finishes, mut content, mut usage) = ([0; 2], [0; 2], [0; 2], None);
        for data in sse.all().await? {
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(&data)?;
            if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
                usage = Some(u.clone());
            }
            for c in chunk["choices"].as_array().into_iter().flatten() {
                let i = c["index"].as_u64().context("index")? as usize;
                ensure!(i < 2, "{chunk}");
                roles[i] += c["delta"]["role"].is_string() as usize;
                content[i] += c["delta"]["content"].is_string() as usize;
                finishes[i] += c["finish_reason"].is_string() as usize;
            }
        }
        ensure!(
            roles == [1, 1] && finishes == [1, 1],
            "{roles:?} {finishes:?}"
        );
        ensure!(content[0] >= 4 && content[1] >= 4, "{content:?}");
        let usage = usage.context("the usage chunk")?;
        ensure!(usage["completion_tokens"] == json!(8), "{usage}");
        Ok(())
    });
    assert_idle(&server);
}

#[test]
fn response_format_json_schema_constrains_every_choice() {
    let server = HttpServer::tiny("http-opt-json", &[]);
    let url = server.url("/v1/chat/completions");
    run(move || async move {
        let schema = json!({"type": "object", "required": ["name", "age", "tags"],
            "additionalProperties": false,
            "properties": {"name": {"type": "string", "maxLength": 8},
                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                           "tags": {"type": "array", "maxItems": 2,
                                    "items": {"enum": ["a", "b"]}}}});
        let format = json!({"type": "json_schema",
                            "json_schema": {"name": "person", "schema": schema, "strict": true}});
        let body = json!({"model": "tiny", "n": 3, "temperature": 1.0, "seed": 3,
                          "max_tokens": 200, "response_format": format,
                          "messages": [{"role": "user", "content": "A person, as JSON"}]});
        let (status, v) = post(&url, body).await?;
        ensure!(status == 200, "{v}");
        ensure!(choices(&v)?.len() == 3, "{v}");
        for c in choices(&v)? {
            let text = c["message"]["content"].as_str().context("content")?;
            ensure!(
                c["finish_reason"] == json!("stop"),
                "the grammar ends it: {c}"
            );
            let doc: Value = serde_json::from_str(text).with_context(|| text.to_string())?;
            let obj = doc.as_object().with_context(|| text.to_string())?;
            ensure!(obj.len() == 3, "exactly the three properties: {text}");
            ensure!(
                obj["name"].as_str().is_some_and(|n| n.chars().count() <= 8),
                "{text}"
            );
            ensure!(obj["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
            let tags = obj["tags"].as_array().with_context(|| text.to_string())?;
            ensure!(tags.len() <= 2, "{text}");
            ensure!(tags.iter().all(|t| t == "a" || t == "b"), "{text}");
        }

        let body = json!({"model": "tiny", "max_tokens": 50, "response_format": {"type": "json_object"},
                          "messages": [{"role": "user", "content": "JSON please"}], "seed": 1});
        let (status, v) = post(&url, body).await?;
        ensure!(status == 200, "{v}");
        let c = &choices(&v)?[0];
        if c["finish_reason"] == json!("stop") {
            let text = c["message"]["content"].as_str().context("content")?;
            let doc: Value = serde_json::from_str(text).with_context(|| text.to_string())?;
            ensure!(doc.is_object(), "{text}");
        }

        let bad = json!({"type": "json_schema",
                         "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}});
        let body = json!({"model": "tiny", "response_format": bad,
                          "messages": [{"role": "user", "content": "x"}]});
        let (status, v) = post(&url, body).await?;
        ensure!(
            status == 400 && v["error"]["param"] == json!("response_format.json_schema.schema"),
            "{status} {v}"
        );
        Ok(())
    });
    assert_idle(&server);
}
