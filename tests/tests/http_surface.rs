//! The tokenizer on both doors and the refusal of a keyless HTTP/2 request,
//! against the built `ember-server` (tiny preset) with `--api-key`.
//!
//! - `POST /tokenize` (`prompt` or chat `messages`, vLLM's response shape),
//!   `POST /detokenize`, `GET /tokenizer_info`: 401 without the key, the
//!   GPT-2 ids with it, 400 naming the field for bad input, 404 for another
//!   model; gRPC `Tokenize` / `Detokenize` give the same ids and text, and
//!   UNAUTHENTICATED / INVALID_ARGUMENT (naming `token_ids[1]`).
//! - An HTTP/2 request without a key whose body is still arriving gets a
//!   clean 401: the server reads the small body before answering, so it
//!   never resets the stream under the client (curl reported that reset as
//!   a stream error instead of the 401).

use std::time::Duration;

use anyhow::{ensure, Context};
use bytes::Bytes;
use ember_common::pb::inference_client::InferenceClient;
use ember_common::pb::{DetokenizeRequest, TokenizeRequest};
use ember_tests::http::{http_client, HttpServer};
use serde_json::{json, Value};

const KEY: &str = "sk-surface-41aa";

fn keyed<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("header value"),
    );
    r
}

#[test]
fn tokenize_and_detokenize_on_both_doors_behind_the_key() {
    let server = HttpServer::tiny("http-tokenize", &["--api-key", KEY]);
    let (grpc, url) = (server.grpc_url(), server.url(""));
    ember_tests::block_on(None, move || async move {
        let http = http_client(None)?;
        let post = |path: &str, body: Value, key: Option<&str>| {
            let mut req = http.post(format!("{url}{path}")).json(&body);
            if let Some(k) = key {
                req = req.bearer_auth(k);
            }
            req.send()
        };
        // No key: 401 on every tokenizer route.
        let r = post("/tokenize", json!({"prompt": "Hello world"}), None).await?;
        ensure!(r.status() == 401, "tokenize without a key: {}", r.status());
        let r = post("/detokenize", json!({"tokens": [1]}), None).await?;
        ensure!(r.status() == 401, "detokenize without a key: {}", r.status());
        let r = http.get(format!("{url}/tokenizer_info")).send().await?;
        ensure!(r.status() == 401, "tokenizer_info without a key: {}", r.status());

        let r = post(
            "/tokenize",
            json!({"prompt": "Hello world", "add_special_tokens": false, "return_token_strs": true}),
            Some(KEY),
        )
        .await?;
        ensure!(r.status() == 200, "{}", r.status());
        let v: Value = r.json().await?;
        ensure!(v["tokens"] == json!([15496, 995]), "{v}");
        ensure!(v["count"] == 2, "{v}");
        ensure!(v["max_model_len"].as_u64().is_some_and(|n| n > 0), "{v}");
        ensure!(v["token_strs"] == json!(["Hello", "Ġworld"]), "{v}");

        // Chat messages: the chat endpoint's template.
        let messages = json!([{"role": "user", "content": "Hi"}]);
        let v: Value = post("/tokenize", json!({ "messages": messages }), Some(KEY))
            .await?
            .json()
            .await?;
        let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone())?;
        let v: Value = post("/detokenize", json!({ "tokens": ids }), Some(KEY))
            .await?
            .json()
            .await?;
        ensure!(v["prompt"] == "user: Hi\nassistant:", "{v}");

        // Bad input names the field; another model is a 404.
        for (path, body, status, param) in [
            ("/tokenize", json!({}), 400, "prompt"),
            ("/tokenize", json!({"prompt": 7}), 400, "prompt"),
            ("/tokenize", json!({"messages": [{"role": "x", "content": ""}]}), 400, "messages[0].role"),
            ("/detokenize", json!({"tokens": [1, 99999]}), 400, "tokens[1]"),
            ("/detokenize", json!({"tokens": [1, "a"]}), 400, "tokens[1]"),
            ("/detokenize", json!({"prompt": "x"}), 400, "tokens"),
            ("/tokenize", json!({"prompt": "x", "model": "other"}), 404, "model"),
        ] {
            let r = post(path, body.clone(), Some(KEY)).await?;
            ensure!(r.status() == status, "{path} {body}: {}", r.status());
            let v: Value = r.json().await?;
            ensure!(v["error"]["param"] == param, "{path} {body}: {v}");
        }

        let r = http
            .get(format!("{url}/tokenizer_info"))
            .bearer_auth(KEY)
            .send()
            .await?;
        let v: Value = r.json().await?;
        ensure!(v["eos_token"] == "<|endoftext|>", "{v}");
        ensure!(v["chat_template"].as_str().is_some(), "{v}");

        // gRPC: the same ids and text, behind the same key.
        let channel = tonic::transport::Endpoint::from_shared(grpc)?.connect().await?;
        let mut client = InferenceClient::new(channel);
        let refused = client
            .tokenize(TokenizeRequest {
                prompt: "Hello world".into(),
                ..Default::default()
            })
            .await
            .expect_err("no key");
        ensure!(refused.code() == tonic::Code::Unauthenticated, "{refused:?}");
        let t = client
            .tokenize(keyed(
                TokenizeRequest {
                    prompt: "Hello world".into(),
                    add_special_tokens: true,
                },
                KEY,
            ))
            .await?
            .into_inner();
        ensure!(t.token_ids == [15496, 995] && t.count == 2, "{t:?}");
        ensure!(t.max_model_len > 0, "{t:?}");
        let d = client
            .detokenize(keyed(DetokenizeRequest { token_ids: t.token_ids }, KEY))
            .await?
            .into_inner();
        ensure!(d.prompt == "Hello world", "{d:?}");
        let bad = client
            .detokenize(keyed(
                DetokenizeRequest {
                    token_ids: vec![1, 60_000],
                },
                KEY,
            ))
            .await
            .expect_err("id outside the vocabulary");
        ensure!(
            bad.code() == tonic::Code::InvalidArgument && bad.message().starts_with("token_ids[1]"),
            "{bad:?}"
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(20)));
}

#[test]
fn a_keyless_http2_request_gets_a_clean_401_while_its_body_is_still_arriving() {
    let server = HttpServer::tiny("http-h2-401", &["--api-key", KEY]);
    let addr = server.http_addr();
    ember_tests::block_on(None, move || async move {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let (client, connection) = h2::client::handshake(tcp).await?;
        tokio::spawn(connection);
        let mut client = client.ready().await?;
        let request = http::Request::post(format!("http://{addr}/v1/completions"))
            .header("content-type", "application/json")
            .body(())?;
        let (response, mut body) = client.send_request(request, false)?;
        body.send_data(Bytes::from_static(b"{\"prompt\": \"Hel"), false)?;
        // The server has had time to answer; it must not have reset the
        // stream we are still sending on.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let reset = futures::future::poll_fn(|cx| {
            std::task::Poll::Ready(match body.poll_reset(cx) {
                std::task::Poll::Ready(r) => Some(r),
                std::task::Poll::Pending => None,
            })
        })
        .await;
        ensure!(
            reset.is_none(),
            "the server reset the stream before the body ended: {reset:?}"
        );
        body.send_data(Bytes::from_static(b"lo\", \"max_tokens\": 2}"), true)
            .context("sending the rest of the body")?;
        let response = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .context("no response")??;
        ensure!(response.status() == 401, "{}", response.status());
        let mut received = response.into_body();
        let mut bytes = Vec::new();
        while let Some(chunk) = received.data().await {
            let chunk = chunk.context("the 401's body")?;
            let _ = received.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        let v: Value = serde_json::from_slice(&bytes)?;
        ensure!(v["error"]["code"] == "invalid_api_key", "{v}");
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(20)));
}
