//! The OpenAI-compatible HTTP front door, end to end against the built
//! `ember-server` (`--http-listen 127.0.0.1:0`, the second stdout line).
//!
//! - An unchanged OpenAI client library (async-openai, pointed at the
//!   server's `/v1`) gets the same text as the gRPC stream for the same
//!   greedy request: completions and chat (through the chat template),
//!   streaming and not, with usage and finish reasons to match.
//! - Bad requests get OpenAI's error shape naming the field (400, 404 for an
//!   unknown model), each refusal counted once.
//! - HTTP/2 without TLS (h2c) is served too.
//!
//! Queue full, deadlines and disconnects are in `http_faults.rs`; SIGTERM,
//! metrics and logs per door in `http_lifecycle.rs`; TLS and API keys in
//! `http_security.rs`.

use anyhow::{bail, ensure, Context};
use async_openai::types::chat::{
    ChatCompletionRequestUserMessage, ChatCompletionStreamOptions, CreateChatCompletionRequestArgs,
};
use async_openai::types::completions::CreateCompletionRequestArgs;
use ember_common::pb::{self, GenerateRequest, SamplingParams};
use ember_tests::client;
use ember_tests::http::{assert_idle, counters, http_client, openai, run, HttpServer, SseReader};
use futures::StreamExt;
use serde_json::{json, Value};

/// The prompt and length of the equality checks.
const PROMPT: &str = "The quick brown fox jumps over the lazy dog";
const CHAT_CONTENT: &str = "Tell me about foxes.";
const TOKENS: u32 = 12;

/// What the gRPC door streams for a greedy request: the whole text, the
/// completion tokens, the finish reason.
async fn grpc_text(
    addr: std::net::SocketAddr,
    prompt: &str,
) -> anyhow::Result<(String, u32, pb::FinishReason)> {
    let mut c = client::connect(addr).await?;
    let req = GenerateRequest {
        prompt: prompt.into(),
        max_new_tokens: TOKENS,
        sampling: Some(SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        }),
        ..Default::default()
    };
    let out = client::generate(&mut c, req, None).await;
    let Some((f, _)) = &out.finished else {
        bail!("gRPC stream did not finish: {}", out.summary());
    };
    let mut text: String = out.tokens.iter().map(|(t, _)| t.text.as_str()).collect();
    text.push_str(&f.trailing_text);
    Ok((text, f.completion_tokens, f.finish_reason()))
}

fn openai_finish(reason: pb::FinishReason) -> &'static str {
    match reason {
        pb::FinishReason::Length => "length",
        pb::FinishReason::Eos | pb::FinishReason::Stop => "stop",
        _ => "abort",
    }
}

#[test]
fn an_unchanged_openai_client_gets_the_grpc_streams_text() {
    let server = HttpServer::tiny("http-openai", &[]);
    let (grpc, base) = (server.grpc_addr(), server.base());
    run(move || async move {
        let oa = openai(&base, "unused")?;
        let models = oa.models().list().await?;
        ensure!(
            models.data.len() == 1 && models.data[0].id == "tiny",
            "{models:?}"
        );

        // Completions, non-streaming and streaming.
        let (want, n, reason) = grpc_text(grpc, PROMPT).await?;
        ensure!(!want.is_empty(), "the gRPC text is empty");
        let req = CreateCompletionRequestArgs::default()
            .model("tiny")
            .prompt(PROMPT)
            .max_tokens(TOKENS)
            .temperature(0.0)
            .build()?;
        let whole = oa.completions().create(req.clone()).await?;
        ensure!(
            whole.choices[0].text == want,
            "completions: {:?} vs gRPC {want:?}",
            whole.choices[0].text
        );
        let usage = whole.usage.context("usage")?;
        ensure!(
            usage.completion_tokens == n && usage.total_tokens == usage.prompt_tokens + n,
            "{usage:?}"
        );
        let finish = serde_json::to_value(whole.choices[0].finish_reason)?;
        ensure!(finish == json!(openai_finish(reason)), "{finish}");
        let mut stream = oa.completions().create_stream(req).await?;
        let mut text = String::new();
        let mut chunks = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            chunks += 1;
            text.extend(chunk.choices.iter().map(|c| c.text.as_str()));
        }
        ensure!(
            text == want,
            "streamed completions: {text:?} vs gRPC {want:?}"
        );
        ensure!(
            chunks == n + 1,
            "one chunk per token and the last: {chunks} for {n} tokens"
        );

        // Chat, through the template, non-streaming and streaming with usage.
        let templated = format!("user: {CHAT_CONTENT}\nassistant:");
        let (want, n, _) = grpc_text(grpc, &templated).await?;
        let chat = CreateChatCompletionRequestArgs::default()
            .model("tiny")
            .messages([ChatCompletionRequestUserMessage::from(CHAT_CONTENT).into()])
            .max_completion_tokens(TOKENS)
            .temperature(0.0)
            .build()?;
        let whole = oa.chat().create(chat.clone()).await?;
        let content = whole.choices[0].message.content.clone().unwrap_or_default();
        ensure!(content == want, "chat: {content:?} vs gRPC {want:?}");
        ensure!(whole.usage.context("usage")?.completion_tokens == n);
        let mut streamed = chat;
        streamed.stream_options = Some(ChatCompletionStreamOptions {
            include_usage: Some(true),
            include_obfuscation: None,
        });
        let mut stream = oa.chat().create_stream(streamed).await?;
        let (mut text, mut usage, mut role) = (String::new(), None, None);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            usage = usage.or(chunk.usage);
            for c in &chunk.choices {
                role = role.or(c.delta.role);
                text.push_str(c.delta.content.as_deref().unwrap_or(""));
            }
        }
        ensure!(text == want, "streamed chat: {text:?} vs gRPC {want:?}");
        ensure!(role.is_some(), "the first chunk names the assistant role");
        ensure!(usage.context("the usage chunk")?.completion_tokens == n);
        Ok(())
    });
    assert_idle(&server);
}

/// Every field of a bad request is named in OpenAI's error shape, and the
/// statuses are the gRPC door's.
#[test]
fn bad_requests_get_openais_error_shape_naming_the_field() {
    let server = HttpServer::tiny("http-errors", &["--max-new-tokens-limit", "64"]);
    let url = |p: &str| server.url(p);
    let (completions, chat) = (url("/v1/completions"), url("/v1/chat/completions"));
    let cases: Vec<(String, Value, u16, Option<&str>)> = vec![
        (
            completions.clone(),
            json!({"prompt": "x", "max_tokens": "5"}),
            400,
            Some("max_tokens"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "max_tokens": 0}),
            400,
            Some("max_tokens"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "max_tokens": 65}),
            400,
            Some("max_tokens"),
        ),
        (
            completions.clone(),
            json!({"prompt": vec![1; 1000], "max_tokens": 30}),
            400,
            Some("max_tokens"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "temperature": -1}),
            400,
            Some("temperature"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "top_p": 1.5}),
            400,
            Some("top_p"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "top_k": -3}),
            400,
            Some("top_k"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "min_p": 1.5}),
            400,
            Some("min_p"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "n": 17}),
            400,
            Some("n"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "echo": "yes"}),
            400,
            Some("echo"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "frequency_penalty": 3}),
            400,
            Some("frequency_penalty"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "logit_bias": {"50257": 1}}),
            400,
            Some("logit_bias[50257]"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "max_tokens": 4, "min_tokens": 5}),
            400,
            Some("min_tokens"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "logprobs": 21}),
            400,
            Some("logprobs"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "stop": ["ok", ""]}),
            400,
            Some("stop[1]"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "stop": ""}),
            400,
            Some("stop"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "stop_token_ids": [50257]}),
            400,
            Some("stop_token_ids[0]"),
        ),
        (
            completions.clone(),
            json!({"prompt": [50257]}),
            400,
            Some("prompt"),
        ),
        (
            completions.clone(),
            json!({"prompt": ""}),
            400,
            Some("prompt"),
        ),
        (
            completions.clone(),
            json!({"max_tokens": 3}),
            400,
            Some("prompt"),
        ),
        (
            completions.clone(),
            json!({"prompt": "x", "model": "gpt-4"}),
            404,
            Some("model"),
        ),
        (
            completions.clone(),
            json!(["not", "an", "object"]),
            400,
            None,
        ),
        (chat.clone(), json!({"messages": []}), 400, Some("messages")),
        (
            chat.clone(),
            json!({"messages": [{"role": "robot", "content": "x"}]}),
            400,
            Some("messages[0].role"),
        ),
        (
            chat.clone(),
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 65}),
            400,
            Some("max_completion_tokens"),
        ),
        (
            chat.clone(),
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
            400,
            Some("top_logprobs"),
        ),
        (
            chat.clone(),
            json!({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
            400,
            Some("stream"),
        ),
    ];
    let n_cases = cases.len() as u64;
    let before = counters(&server);
    run(move || async move {
        let http = http_client(None)?;
        for (url, body, status, param) in cases {
            let r = http.post(&url).json(&body).send().await?;
            let got = r.status().as_u16();
            let v: Value = r.json().await?;
            let e = &v["error"];
            ensure!(got == status, "{body}: status {got}, want {status}: {v}");
            ensure!(
                e["param"] == json!(param),
                "{body}: param {}, want {param:?}",
                e["param"]
            );
            let message = e["message"].as_str().context("message")?;
            if let Some(p) = param {
                ensure!(
                    message.starts_with(&format!("{p}: ")) || status == 404,
                    "{body}: {message}"
                );
            }
            ensure!(e["type"].is_string() && e.get("code").is_some(), "{v}");
        }
        // The validator's limits are explained in the request's own words.
        let over = json!({"prompt": vec![1; 1000], "max_tokens": 30});
        let v: Value = http
            .post(&completions)
            .json(&over)
            .send()
            .await?
            .json()
            .await?;
        let message = v["error"]["message"].as_str().unwrap_or("");
        ensure!(
            message.contains("max_tokens (30)") && !message.contains("max_new_tokens"),
            "{message}"
        );
        // A body that is not JSON.
        let r = http.post(&completions).body("{not json").send().await?;
        ensure!(r.status() == 400, "bad JSON: {}", r.status());
        // The unchanged client's view of an error: status, param, message.
        let oa = openai(&completions.replace("/completions", ""), "unused")?;
        let req = CreateCompletionRequestArgs::default()
            .model("tiny")
            .prompt("x")
            .n(17)
            .build()?;
        match oa.completions().create(req).await {
            Err(async_openai::error::OpenAIError::ApiError(e)) => {
                ensure!(e.status_code == 400, "{e}");
                ensure!(e.api_error.param.as_deref() == Some("n"), "{e}");
                ensure!(
                    e.api_error.r#type.as_deref() == Some("invalid_request_error"),
                    "{e}"
                );
            }
            other => bail!("n = 17 through the OpenAI client: {other:?}"),
        }
        Ok(())
    });
    let after = counters(&server);
    assert_eq!(
        after.rejected - before.rejected,
        n_cases + 3,
        "every refusal counted once"
    );
    assert_idle(&server);
}

/// HTTP/2 without TLS (h2c, prior knowledge) is served too: a whole body and
/// a stream with one chunk per token.
#[test]
fn http2_cleartext_is_served() {
    let server = HttpServer::tiny("http-h2c", &[]);
    let completions = server.url("/v1/completions");
    run(move || async move {
        ember_tests::http::install_crypto();
        let h2 = reqwest::Client::builder().http2_prior_knowledge().build()?;
        let body = json!({"prompt": "Two", "max_tokens": 5, "ignore_eos": true, "temperature": 0});
        let r = h2.post(&completions).json(&body).send().await?;
        ensure!(r.version() == reqwest::Version::HTTP_2, "{:?}", r.version());
        let v: Value = r.json().await?;
        ensure!(v["usage"]["completion_tokens"] == 5, "{v}");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let r = h2.post(&completions).json(&streamed).send().await?;
        ensure!(r.version() == reqwest::Version::HTTP_2, "{:?}", r.version());
        let events = SseReader::new(r).all().await?;
        ensure!(
            events.len() == 5 + 2,
            "5 token chunks, the last, [DONE]: {events:?}"
        );
        Ok(())
    });
    assert_idle(&server);
}
