//! The JSON the mock's HTTP door sends, in OpenAI's shapes plus Ember's
//! extension, exactly as Ember's wire contract (docs/http-api.md) has them:
//!
//! - one chunk per token, with `"ember": {"index", "token_id",
//!   "server_time_ns"}` (chat: after one leading role chunk without it);
//! - a last content chunk with `finish_reason`, no `ember`, and
//!   `"ember_timing"` holding every `ServerTiming` field by its proto name;
//! - with `stream_options.include_usage`, a chunk with `"choices": []` and
//!   `usage` before `[DONE]`;
//! - errors as `{"error": {"message", "type", "param", "code"}}`.
//!
//! Without the extension (`ember_fields: false`) the same chunks carry no
//! `ember` / `ember_timing`: a plain OpenAI server.

use ember_common::pb::ServerTiming;
use hyper::body::Bytes;
use serde_json::{json, Value};

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// Builds one request's chunks.
#[derive(Debug, Clone)]
pub(crate) struct Chunker {
    /// The endpoint.
    pub kind: Kind,
    /// `cmpl-mock-N` / `chatcmpl-mock-N`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model named in the request.
    pub model: String,
    /// Whether to add Ember's extension.
    pub ember: bool,
}

/// `data: JSON\n\n`.
pub(crate) fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// The final event of every stream.
pub(crate) fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// An OpenAI error object.
pub(crate) fn error(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// OpenAI's `usage`.
pub(crate) fn usage(prompt: u32, completion: u32) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion})
}

impl Chunker {
    fn object(&self) -> &'static str {
        match self.kind {
            Kind::Completions => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        }
    }

    /// One choice carrying `text` (completions: `text`; chat: `delta`).
    fn choice(&self, text: &str, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
            Kind::Chat if finish.is_some() && text.is_empty() => {
                json!({"index": 0, "delta": {}, "finish_reason": finish})
            }
            Kind::Chat => json!({"index": 0, "delta": {"content": text}, "finish_reason": finish}),
        }
    }

    fn chunk(&self, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(), "created": self.created,
               "model": self.model, "choices": choices})
    }

    /// Chat's leading chunk: the assistant role, empty content, no `ember`.
    pub fn role(&self) -> Bytes {
        let choice = json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                            "finish_reason": null});
        event(&self.chunk(json!([choice])))
    }

    /// Token `i`, sampled `server_time_ns` after the request was received.
    pub fn token(&self, i: u32, server_time_ns: u64) -> Bytes {
        let mut c = self.chunk(json!([self.choice("x", None)]));
        if self.ember {
            c["ember"] = json!({"index": i, "token_id": 100 + i, "server_time_ns": server_time_ns});
        }
        event(&c)
    }

    /// The last content chunk: `finish_reason`, and `ember_timing`.
    pub fn finish(&self, reason: &str, t: &ServerTiming) -> Bytes {
        let mut c = self.chunk(json!([self.choice("", Some(reason))]));
        if self.ember {
            c["ember_timing"] = ember_common::ember_json::timing(t);
        }
        event(&c)
    }

    /// The usage chunk (`choices: []`).
    pub fn usage(&self, prompt: u32, completion: u32) -> Bytes {
        let mut c = self.chunk(json!([]));
        c["usage"] = usage(prompt, completion);
        event(&c)
    }

    /// A whole non-streaming response.
    pub fn whole(&self, tokens: u32, prompt: u32, t: &ServerTiming) -> Value {
        let text = "x".repeat(tokens as usize);
        let choice = match self.kind {
            Kind::Completions => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length"})
            }
            Kind::Chat => json!({"index": 0, "finish_reason": "length",
                                 "message": {"role": "assistant", "content": text}}),
        };
        let object = match self.kind {
            Kind::Completions => "text_completion",
            Kind::Chat => "chat.completion",
        };
        let mut v = json!({"id": self.id, "object": object, "created": self.created,
                           "model": self.model, "choices": [choice],
                           "usage": usage(prompt, tokens)});
        if self.ember {
            v["ember_timing"] = ember_common::ember_json::timing(t);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &Bytes) -> Value {
        let text = std::str::from_utf8(b).expect("utf-8");
        let json = text
            .strip_prefix("data: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .expect("one SSE event");
        serde_json::from_str(json).expect("JSON")
    }

    #[test]
    fn chunks_have_the_contracts_shape() {
        let c = Chunker {
            kind: Kind::Chat,
            id: "chatcmpl-mock-1".into(),
            created: 7,
            model: "mock".into(),
            ember: true,
        };
        let role = parse(&c.role());
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
        assert!(role.get("ember").is_none());
        let tok = parse(&c.token(2, 99));
        assert_eq!(tok["object"], "chat.completion.chunk");
        assert_eq!(tok["choices"][0]["delta"]["content"], "x");
        assert_eq!(tok["ember"]["server_time_ns"], 99);
        assert_eq!(tok["ember"]["index"], 2);
        let fin = parse(&c.finish("length", &ServerTiming::default()));
        assert_eq!(fin["choices"][0]["finish_reason"], "length");
        assert!(fin.get("ember").is_none());
        assert_eq!(fin["ember_timing"].as_object().map(|o| o.len()), Some(18));
        let u = parse(&c.usage(3, 4));
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["total_tokens"], 7);
        let plain = Chunker {
            ember: false,
            kind: Kind::Completions,
            ..c
        };
        let tok = parse(&plain.token(0, 1));
        assert_eq!(tok["choices"][0]["text"], "x");
        assert!(tok.get("ember").is_none());
        assert!(parse(&plain.finish("stop", &ServerTiming::default()))
            .get("ember_timing")
            .is_none());
    }
}
