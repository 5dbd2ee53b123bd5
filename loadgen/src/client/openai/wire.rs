//! The OpenAI wire format, both ways: the request body loadgen sends, and the
//! parts of a streamed chunk (and of an error body) it reads, including
//! Ember's extension (docs/http-api.md):
//!
//! - request: `model`, `prompt` (text or token ids) or `messages` (one user
//!   message), `max_tokens` (left out with `--max-new-tokens none`),
//!   `stream` (with `stream_options.include_usage` when true),
//!   sampling (`temperature` 0 unless given, so the default is greedy as on
//!   gRPC; `top_p`, `top_k`, `seed`), and `ignore_eos` (vLLM's extension,
//!   only with `--no-stop-on-eos`), then `--extra-inputs` (which win);
//! - chunk: `choices[0]` (`text` or `delta.content`, `finish_reason`),
//!   `usage`, `error`, and Ember's `ember` (per token: `server_time_ns`) and
//!   `ember_timing` (the `ServerTiming` fields by name) when the server sends
//!   them. Unknown fields are ignored; missing ones are `None`.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::Endpoint;
use crate::record::ServerRecord;
use crate::workload::turns::flatten;
use crate::workload::{PreparedRequest, Prompt};

/// The JSON body of one request; `extra` (`--extra-inputs`) last.
pub fn body(
    p: &PreparedRequest,
    endpoint: Endpoint,
    model: &str,
    extra: &[(String, Value)],
) -> Vec<u8> {
    let mut v = json!({"model": model, "stream": p.stream});
    if p.stream {
        v["stream_options"] = json!({"include_usage": true});
    }
    if let Some(max) = p.max_new_tokens {
        v["max_tokens"] = json!(max);
    }
    match (endpoint, &p.prompt) {
        (Endpoint::Completions, Prompt::Text(t)) => v["prompt"] = json!(t),
        (Endpoint::Completions, Prompt::Ids(ids)) => v["prompt"] = json!(ids),
        (Endpoint::Chat, Prompt::Text(t)) => {
            v["messages"] = json!([{"role": "user", "content": t}]);
        }
        (Endpoint::Chat, Prompt::Turns(messages)) => {
            let list: Vec<Value> = messages
                .iter()
                .map(|m| json!({"role": m.role.name(), "content": m.content}))
                .collect();
            v["messages"] = Value::Array(list);
        }
        (Endpoint::Completions, Prompt::Turns(messages)) => v["prompt"] = json!(flatten(messages)),
        // The workload decodes ids for chat; should one slip by, send them
        // as text rather than nothing.
        (Endpoint::Chat, Prompt::Ids(ids)) => {
            let text: Vec<String> = ids.iter().map(u32::to_string).collect();
            v["messages"] = json!([{"role": "user", "content": text.join(" ")}]);
        }
    }
    let s = p.sampling.unwrap_or_default();
    v["temperature"] = json!(s.temperature.unwrap_or(0.0));
    if let Some(top_p) = s.top_p {
        v["top_p"] = json!(top_p);
    }
    if let Some(top_k) = s.top_k {
        v["top_k"] = json!(top_k);
    }
    if let Some(min_p) = s.min_p {
        v["min_p"] = json!(min_p);
    }
    if let Some(seed) = s.seed {
        v["seed"] = json!(seed);
    }
    if p.ignore_eos {
        v["ignore_eos"] = json!(true);
    }
    for (key, value) in extra {
        v[key.as_str()] = value.clone();
    }
    v.to_string().into_bytes()
}

/// One streamed chunk (only what loadgen reads).
#[derive(Debug, Default, Deserialize)]
pub struct Chunk {
    /// `choices` (null or missing: none).
    #[serde(default)]
    pub choices: Option<Vec<Choice>>,
    /// `usage` (the include_usage chunk).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// An error event.
    #[serde(default)]
    pub error: Option<ApiError>,
    /// Ember: this chunk is token `index`, sampled at `server_time_ns`.
    #[serde(default)]
    pub ember: Option<EmberToken>,
    /// Ember: the server's breakdown, on the last content chunk.
    #[serde(default)]
    pub ember_timing: Option<EmberTiming>,
}

/// One choice of a chunk.
#[derive(Debug, Default, Deserialize)]
pub struct Choice {
    /// Completions: the text of this chunk.
    #[serde(default)]
    pub text: Option<String>,
    /// Chat: the delta of this chunk.
    #[serde(default)]
    pub delta: Option<Delta>,
    /// Set on the last content chunk.
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// A chat delta.
#[derive(Debug, Default, Deserialize)]
pub struct Delta {
    /// The text of this chunk.
    #[serde(default)]
    pub content: Option<String>,
}

impl Choice {
    /// The chunk's text, from either endpoint's shape.
    pub fn content(&self) -> &str {
        self.text
            .as_deref()
            .or_else(|| self.delta.as_ref().and_then(|d| d.content.as_deref()))
            .unwrap_or("")
    }
}

/// OpenAI's `usage`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    /// Generated tokens.
    #[serde(default)]
    pub completion_tokens: Option<u32>,
}

/// Ember's per-token extension.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct EmberToken {
    /// ns since the server received the request, when it sampled the token.
    pub server_time_ns: u64,
}

/// Ember's `ember_timing`: the `ServerTiming` fields by their proto names.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub struct EmberTiming {
    pub tokenize_ns: u64,
    pub enqueue_ns: u64,
    pub queue_wait_ns: u64,
    pub prefill_to_first_token_ns: u64,
    pub server_ttft_ns: u64,
    pub decode_ns: u64,
    pub total_ns: u64,
    pub prefill_batch_size: u32,
    pub admitted_iteration: u64,
    pub enqueued_at_ns: u64,
    pub cached_prompt_tokens: u32,
    pub prefill_chunks: u32,
}

impl EmberTiming {
    /// The server record of a request with this timing and these token times.
    pub fn record(&self, token_server_time_ns: Vec<u64>) -> ServerRecord {
        ServerRecord {
            tokenize_ns: self.tokenize_ns,
            enqueue_ns: self.enqueue_ns,
            queue_wait_ns: self.queue_wait_ns,
            prefill_to_first_token_ns: self.prefill_to_first_token_ns,
            server_ttft_ns: self.server_ttft_ns,
            decode_ns: self.decode_ns,
            total_ns: self.total_ns,
            prefill_batch_size: self.prefill_batch_size,
            admitted_iteration: self.admitted_iteration,
            cached_prompt_tokens: self.cached_prompt_tokens,
            prefill_chunks: self.prefill_chunks,
            started_server_time_ns: self.enqueued_at_ns,
            token_server_time_ns,
        }
    }
}

/// An OpenAI error object.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ApiError {
    /// What went wrong.
    #[serde(default)]
    pub message: Option<String>,
    /// `invalid_request_error`, ...
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The field at fault.
    #[serde(default)]
    pub param: Option<String>,
    /// A string or number code.
    #[serde(default)]
    pub code: Option<Value>,
}

impl ApiError {
    /// One line: `message (type T, param P, code C)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(k) = &self.kind {
            parts.push(format!("type {k}"));
        }
        if let Some(p) = &self.param {
            parts.push(format!("param {p}"));
        }
        match &self.code {
            None | Some(Value::Null) => {}
            Some(Value::String(c)) => parts.push(format!("code {c}")),
            Some(c) => parts.push(format!("code {c}")),
        }
        let message = self.message.as_deref().unwrap_or("(no message)");
        if parts.is_empty() {
            message.to_string()
        } else {
            format!("{message} ({})", parts.join(", "))
        }
    }
}

/// The message of an error response body: its `error` object if it has one,
/// else the body's text (cut short).
pub fn error_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Body {
        error: ApiError,
    }
    match serde_json::from_slice::<Body>(body) {
        Ok(b) => b.error.describe(),
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            match text.char_indices().nth(300) {
                Some((i, _)) => format!("{}...", &text[..i]),
                None if text.is_empty() => "(empty body)".to_string(),
                None => text.to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Sampling;

    fn prepared(prompt: Prompt) -> PreparedRequest {
        PreparedRequest {
            request_id: "r".into(),
            prompt,
            max_new_tokens: Some(8),
            stream: true,
            keep_reply: false,
            ignore_eos: false,
            sampling: None,
            prompt_tokens: None,
        }
    }

    #[test]
    fn request_bodies() {
        let v: Value = serde_json::from_slice(&body(
            &prepared(Prompt::Ids(vec![1, 2])),
            Endpoint::Completions,
            "m",
            &[],
        ))
        .expect("json");
        assert_eq!(v["prompt"], json!([1, 2]));
        assert_eq!(
            (v["max_tokens"].as_u64(), v["stream"].as_bool()),
            (Some(8), Some(true))
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["temperature"], 0.0, "greedy unless asked");
        assert!(v.get("ignore_eos").is_none() && v.get("seed").is_none());
        let mut p = prepared(Prompt::Text("hi".into()));
        p.ignore_eos = true;
        p.sampling = Some(Sampling {
            temperature: Some(0.5),
            top_k: Some(3),
            top_p: None,
            min_p: Some(0.05),
            seed: Some(7),
        });
        let v: Value = serde_json::from_slice(&body(&p, Endpoint::Chat, "m", &[])).expect("json");
        assert_eq!(v["messages"], json!([{"role": "user", "content": "hi"}]));
        assert_eq!(
            (v["top_k"].as_i64(), v["seed"].as_u64()),
            (Some(3), Some(7))
        );
        let min_p = v["min_p"].as_f64().expect("min_p sent");
        assert!((min_p - 0.05).abs() < 1e-6, "{min_p}");
        assert_eq!(v["ignore_eos"], true);
        assert!(v.get("prompt").is_none());
        p.max_new_tokens = None;
        p.stream = false;
        let v: Value = serde_json::from_slice(&body(&p, Endpoint::Chat, "m", &[])).expect("json");
        assert!(
            v.get("max_tokens").is_none(),
            "no limit: the server decides"
        );
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none());
        let extra = [
            ("frequency_penalty".to_string(), json!(0.5)),
            ("temperature".to_string(), json!(0.7)),
        ];
        let v: Value =
            serde_json::from_slice(&body(&p, Endpoint::Chat, "m", &extra)).expect("json");
        assert_eq!(v["frequency_penalty"], 0.5);
        assert_eq!(
            v["temperature"], 0.7,
            "--extra-inputs win over loadgen's own"
        );
    }

    #[test]
    fn chunks_of_the_contract_parse() {
        let token: Chunk = serde_json::from_str(
            r#"{"id":"c","object":"text_completion","created":1,"model":"m",
               "choices":[{"index":0,"text":"x","logprobs":null,"finish_reason":null}],
               "ember":{"index":0,"token_id":5,"server_time_ns":1234}}"#,
        )
        .expect("token chunk");
        let c = &token.choices.as_ref().expect("choices")[0];
        assert_eq!((c.content(), c.finish_reason.as_deref()), ("x", None));
        assert_eq!(token.ember.map(|e| e.server_time_ns), Some(1234));
        let last: Chunk = serde_json::from_str(
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}],
               "ember_timing":{"tokenize_ns":1,"server_ttft_ns":9,"enqueued_at_ns":2,
               "prefill_batch_size":3,"future_field":7}}"#,
        )
        .expect("last chunk");
        let t = last.ember_timing.expect("timing");
        let r = t.record(vec![4, 5]);
        assert_eq!(
            (
                r.server_ttft_ns,
                r.started_server_time_ns,
                r.prefill_batch_size
            ),
            (9, 2, 3)
        );
        let usage: Chunk = serde_json::from_str(
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#,
        )
        .expect("usage chunk");
        assert_eq!(usage.usage.and_then(|u| u.completion_tokens), Some(4));
        let vllm: Chunk = serde_json::from_str(r#"{"choices":null,"usage":null}"#).expect("nulls");
        assert!(vllm.choices.is_none() && vllm.usage.is_none());
    }

    #[test]
    fn error_bodies() {
        let m = error_message(
            br#"{"error":{"message":"max_tokens: must be >= 1","type":"invalid_request_error","param":"max_tokens","code":null}}"#,
        );
        assert_eq!(
            m,
            "max_tokens: must be >= 1 (type invalid_request_error, param max_tokens)"
        );
        assert_eq!(error_message(b"Bad Gateway"), "Bad Gateway");
        assert_eq!(error_message(b""), "(empty body)");
    }
}
