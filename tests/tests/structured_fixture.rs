//! Structured output on a model whose embedding has fewer rows than its
//! tokenizer has tokens: the transformers fixture (`--model-dir
//! engine/tests/fixtures/tiny-gpt2`: 1,000 rows, EOS 999, GPT-2's 50,257-token
//! tokenizer). A `json_schema` request on either door ends in JSON valid
//! against the schema (`stop` / EOS), or in an error the client sees; never
//! in text the grammar did not allow under a normal finish (issue 37: the
//! grammar's vocabulary was GPT-2's whole one, so it planned with tokens the
//! model cannot emit, and its refusal ended the sequence as if it were EOS).

use anyhow::{ensure, Context};
use ember_common::pb;
use ember_tests::client::{connect, generate};
use ember_tests::http::{assert_idle, http_client, run, HttpServer};
use serde_json::{json, Value};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../engine/tests/fixtures/tiny-gpt2"
);

fn schema() -> Value {
    json!({"type": "object", "required": ["name", "age"], "additionalProperties": false,
           "properties": {"name": {"type": "string", "maxLength": 6},
                          "age": {"type": "integer", "minimum": 0, "maximum": 120}}})
}

/// Checks `text` against [`schema`].
fn valid(text: &str) -> anyhow::Result<()> {
    let doc: Value = serde_json::from_str(text).with_context(|| format!("not JSON: {text:?}"))?;
    let obj = doc.as_object().with_context(|| text.to_string())?;
    ensure!(obj.len() == 2, "exactly the two properties: {text}");
    ensure!(
        obj["name"].as_str().is_some_and(|n| n.chars().count() <= 6),
        "{text}"
    );
    ensure!(obj["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
    Ok(())
}

#[test]
fn json_schema_on_a_small_vocabulary_is_valid_json_or_an_error_on_both_doors() {
    let server = HttpServer::tiny("structured-fixture", &["--model-dir", FIXTURE]);
    let url = server.url("/v1/completions");
    let grpc = server.grpc_addr();
    run(move || async move {
        let format = json!({"type": "json_schema",
                            "json_schema": {"name": "person", "schema": schema()}});
        let mut valid_json = 0;
        for (temperature, seed) in [(0.0, 0), (1.0, 1), (1.0, 2), (0.8, 3)] {
            let body = json!({"model": "tiny-gpt2", "prompt": [1, 2, 3], "max_tokens": 120,
                              "temperature": temperature, "seed": seed,
                              "response_format": format});
            let resp = http_client(None)?.post(&url).json(&body).send().await?;
            let status = resp.status().as_u16();
            let v: Value = serde_json::from_str(&resp.text().await?)?;
            if status == 200 {
                let c = &v["choices"][0];
                let text = c["text"].as_str().context("text")?;
                // "stop" only for a grammar that completed (EOS after it).
                if c["finish_reason"] == json!("stop") {
                    valid(text)?;
                    valid_json += 1;
                } else {
                    ensure!(c["finish_reason"] == json!("length"), "{c}");
                }
            } else {
                let message = v["error"]["message"].as_str().unwrap_or_default();
                ensure!(
                    status == 500 && message.contains("response_format"),
                    "an error names the format: {status} {v}"
                );
            }
        }
        ensure!(
            valid_json >= 2,
            "{valid_json} of 4 requests ended in valid JSON"
        );

        let mut client = connect(grpc).await?;
        let req = pb::GenerateRequest {
            prompt_token_ids: vec![1, 2, 3],
            max_new_tokens: 120,
            response_format: Some(pb::ResponseFormat {
                format: Some(pb::response_format::Format::JsonSchema(
                    schema().to_string(),
                )),
            }),
            ..Default::default()
        };
        let out = generate(&mut client, req, None).await;
        match out.status {
            None => {
                let text: String = out.tokens.iter().map(|(t, _)| t.text.as_str()).collect();
                let trailing = out
                    .finished
                    .as_ref()
                    .map(|(f, _)| f.trailing_text.clone())
                    .unwrap_or_default();
                let reason = out.finish_reason();
                ensure!(
                    reason == Some(pb::FinishReason::Eos),
                    "the grammar ends it at EOS: {}",
                    out.summary()
                );
                valid(&(text + &trailing))?;
            }
            Some(s) => ensure!(
                s.code() == tonic::Code::Internal && s.message().contains("response_format"),
                "{s:?}"
            ),
        }
        Ok(())
    });
    assert_idle(&server);
}
