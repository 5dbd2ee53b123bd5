//! The JSON shapes of OpenAI's responses, with Ember's timeline extension.
//!
//! Pure builders, one per shape: the streaming chunks of `/v1/completions`
//! (`text_completion`) and `/v1/chat/completions` (`chat.completion.chunk`),
//! the whole bodies of both (`text_completion`, `chat.completion`), `usage`,
//! logprobs in each API's format, and Ember's extension fields: `ember`
//! (`index`, `token_id`, `server_time_ns` of a token, as gRPC's `Token`) and
//! `ember_timing` (gRPC's `ServerTiming`, same field names, integers). The
//! wire contract is docs/http-api.md.

use ember_common::pb;
use serde_json::{json, Map, Value};

/// Which API a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

/// What every chunk and body of one response shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub api: Api,
    /// `cmpl-<request id>` or `chatcmpl-<request id>`.
    pub id: String,
    /// Unix seconds when the request arrived.
    pub created: u64,
    /// The served model name.
    pub model: String,
}

/// One token's logprobs, ready for either API's format.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's own text.
    pub token: String,
    pub logprob: f32,
    /// The alternatives asked for: (text, logprob), most likely first.
    pub top: Vec<(String, f32)>,
    /// Characters of the completion text before this token's text.
    pub text_offset: usize,
}

impl Shape {
    pub fn new(api: Api, request_id: &str, created: u64, model: &str) -> Self {
        let prefix = match api {
            Api::Completions => "cmpl",
            Api::Chat => "chatcmpl",
        };
        Self {
            api,
            id: format!("{prefix}-{request_id}"),
            created,
            model: model.to_string(),
        }
    }

    /// `id`, `object`, `created`, `model` and `choices: [choice]`.
    fn envelope(&self, object: &str, choices: Vec<Value>) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(object));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("choices".into(), Value::Array(choices));
        m
    }

    fn chunk_object(&self) -> &'static str {
        match self.api {
            Api::Completions => "text_completion",
            Api::Chat => "chat.completion.chunk",
        }
    }

    /// One streamed choice: `text` (completions) or `delta` (chat).
    fn chunk_choice(&self, text: &str, logprobs: Value, finish: Value) -> Value {
        match self.api {
            Api::Completions => json!({
                "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish
            }),
            Api::Chat => {
                let delta = if text.is_empty() && !finish.is_null() {
                    json!({})
                } else {
                    json!({ "content": text })
                };
                json!({ "index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
            }
        }
    }

    /// Chat's first chunk: the assistant role, no text, no `ember` field.
    pub fn role_chunk(&self) -> Value {
        let choice = json!({
            "index": 0,
            "delta": { "role": "assistant", "content": "" },
            "logprobs": null,
            "finish_reason": null
        });
        Value::Object(self.envelope(self.chunk_object(), vec![choice]))
    }

    /// The chunk of one generated token (its text may be empty).
    pub fn token_chunk(&self, t: &pb::Token, logprob: Option<&TokenLogprob>) -> Value {
        let lp = logprob.map_or(Value::Null, |l| self.logprobs(std::slice::from_ref(l)));
        let choice = self.chunk_choice(&t.text, lp, Value::Null);
        let mut m = self.envelope(self.chunk_object(), vec![choice]);
        m.insert(
            "ember".into(),
            json!({ "index": t.index, "token_id": t.token_id, "server_time_ns": t.server_time_ns }),
        );
        Value::Object(m)
    }

    /// The last content chunk: the held-back text, the finish reason and the
    /// server timeline.
    pub fn final_chunk(&self, f: &pb::Finished) -> Value {
        let choice = self.chunk_choice(&f.trailing_text, Value::Null, json!(finish_reason(f)));
        let mut m = self.envelope(self.chunk_object(), vec![choice]);
        m.insert("ember_timing".into(), timing(f.timing.as_ref()));
        Value::Object(m)
    }

    /// `stream_options.include_usage`'s chunk: no choices, the usage.
    pub fn usage_chunk(&self, f: &pb::Finished) -> Value {
        let mut m = self.envelope(self.chunk_object(), Vec::new());
        m.insert("usage".into(), usage(f));
        Value::Object(m)
    }

    /// A whole (non-streaming) response.
    pub fn body(&self, text: &str, logprobs: Option<&[TokenLogprob]>, f: &pb::Finished) -> Value {
        let lp = logprobs.map_or(Value::Null, |l| self.logprobs(l));
        let finish = json!(finish_reason(f));
        let (object, choice) = match self.api {
            Api::Completions => (
                "text_completion",
                json!({ "index": 0, "text": text, "logprobs": lp, "finish_reason": finish }),
            ),
            Api::Chat => (
                "chat.completion",
                json!({
                    "index": 0,
                    "message": { "role": "assistant", "content": text },
                    "logprobs": lp,
                    "finish_reason": finish
                }),
            ),
        };
        let mut m = self.envelope(object, vec![choice]);
        m.insert("usage".into(), usage(f));
        m.insert("ember_timing".into(), timing(f.timing.as_ref()));
        Value::Object(m)
    }

    /// Logprobs of some tokens in this API's format.
    pub fn logprobs(&self, entries: &[TokenLogprob]) -> Value {
        match self.api {
            Api::Completions => completion_logprobs(entries),
            Api::Chat => chat_logprobs(entries),
        }
    }
}

/// OpenAI's `finish_reason`: EOS and every stop are `stop`, the limit is
/// `length`, a request the server cancelled is `abort` (vLLM's word).
pub fn finish_reason(f: &pb::Finished) -> &'static str {
    match f.finish_reason() {
        pb::FinishReason::Eos | pb::FinishReason::Stop => "stop",
        pb::FinishReason::Length => "length",
        pb::FinishReason::Cancelled | pb::FinishReason::Unspecified => "abort",
    }
}

/// OpenAI's `usage`.
pub fn usage(f: &pb::Finished) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    })
}

/// `ember_timing` of a finish (all zeros if it carried none).
pub fn timing(t: Option<&pb::ServerTiming>) -> Value {
    ember_common::ember_json::timing(&t.copied().unwrap_or_default())
}

/// The legacy completions format: parallel lists. `top_logprobs` maps each
/// alternative's text, and the sampled token's, to its logprob (up to n + 1
/// entries, as OpenAI documents).
fn completion_logprobs(entries: &[TokenLogprob]) -> Value {
    let top: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut m = Map::new();
            for (text, lp) in &e.top {
                m.insert(text.clone(), json!(lp));
            }
            m.entry(e.token.clone()).or_insert(json!(e.logprob));
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": entries.iter().map(|e| &e.token).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": entries.iter().map(|e| e.text_offset).collect::<Vec<_>>(),
    })
}

/// The chat format: one object per token, with its UTF-8 bytes.
fn chat_logprobs(entries: &[TokenLogprob]) -> Value {
    let item =
        |token: &str, lp: f32| json!({ "token": token, "logprob": lp, "bytes": token.as_bytes() });
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = item(&e.token, e.logprob);
            let top: Vec<Value> = e.top.iter().map(|(t, lp)| item(t, *lp)).collect();
            v["top_logprobs"] = Value::Array(top);
            v
        })
        .collect();
    json!({ "content": content })
}

#[cfg(test)]
#[path = "shapes_tests.rs"]
mod tests;
