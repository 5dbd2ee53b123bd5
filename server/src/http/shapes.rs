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
    /// `None` for a prompt's first token (nothing before it to predict it).
    pub logprob: Option<f32>,
    /// The alternatives asked for: (text, logprob), most likely first.
    pub top: Vec<(String, f32)>,
    /// Characters of the choice's text before this token's text.
    pub text_offset: usize,
}

/// One choice of a whole (non-streaming) response.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceBody<'a> {
    pub index: u32,
    /// The whole text (with `echo`, the prompt's first).
    pub text: &'a str,
    pub logprobs: Option<&'a [TokenLogprob]>,
    /// vLLM's `prompt_logprobs` of the choice's prompt, when asked.
    pub prompt_logprobs: Option<Value>,
    pub finished: &'a pb::Finished,
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
    fn chunk_choice(&self, index: u32, text: &str, logprobs: Value, finish: Value) -> Value {
        match self.api {
            Api::Completions => json!({
                "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish
            }),
            Api::Chat => {
                let delta = if text.is_empty() && !finish.is_null() {
                    json!({})
                } else {
                    json!({ "content": text })
                };
                json!({ "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
            }
        }
    }

    /// Chat's first chunk of a choice: the assistant role, no text, no
    /// `ember` field.
    pub fn role_chunk(&self, index: u32) -> Value {
        let choice = json!({
            "index": index,
            "delta": { "role": "assistant", "content": "" },
            "logprobs": null,
            "finish_reason": null
        });
        Value::Object(self.envelope(self.chunk_object(), vec![choice]))
    }

    /// A choice's prompt chunk, before its first token: the prompt's text
    /// (`echo`), its tokens' logprobs (echo with `logprobs`) and vLLM's
    /// `prompt_logprobs` (when asked).
    pub fn prompt_chunk(
        &self,
        index: u32,
        text: &str,
        logprobs: Option<&[TokenLogprob]>,
        prompt_logprobs: Option<Value>,
    ) -> Value {
        let lp = logprobs.map_or(Value::Null, |l| self.logprobs(l));
        let mut choice = self.chunk_choice(index, text, lp, Value::Null);
        if let Some(p) = prompt_logprobs {
            choice["prompt_logprobs"] = p;
        }
        Value::Object(self.envelope(self.chunk_object(), vec![choice]))
    }

    /// The chunk of one generated token (its text may be empty).
    pub fn token_chunk(&self, t: &pb::Token, logprob: Option<&TokenLogprob>) -> Value {
        let lp = logprob.map_or(Value::Null, |l| self.logprobs(std::slice::from_ref(l)));
        let choice = self.chunk_choice(t.choice, &t.text, lp, Value::Null);
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
        let finish = json!(finish_reason(f));
        let choice = self.chunk_choice(f.choice, &f.trailing_text, Value::Null, finish);
        let mut m = self.envelope(self.chunk_object(), vec![choice]);
        m.insert("ember_timing".into(), timing(f.timing.as_ref()));
        Value::Object(m)
    }

    /// `stream_options.include_usage`'s chunk: no choices, the usage.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut m = self.envelope(self.chunk_object(), Vec::new());
        m.insert("usage".into(), usage.json());
        Value::Object(m)
    }

    /// A whole (non-streaming) response: its choices in index order, the
    /// summed usage, and `ember_timing` of the first choice (every choice's
    /// in `ember_timings` when there are several).
    pub fn body(&self, choices: &[ChoiceBody<'_>], usage: Usage) -> Value {
        let object = match self.api {
            Api::Completions => "text_completion",
            Api::Chat => "chat.completion",
        };
        let values: Vec<Value> = choices
            .iter()
            .map(|c| {
                let lp = c.logprobs.map_or(Value::Null, |l| self.logprobs(l));
                let finish = json!(finish_reason(c.finished));
                let mut v = match self.api {
                    Api::Completions => json!({
                        "index": c.index, "text": c.text, "logprobs": lp, "finish_reason": finish
                    }),
                    Api::Chat => json!({
                        "index": c.index,
                        "message": { "role": "assistant", "content": c.text },
                        "logprobs": lp,
                        "finish_reason": finish
                    }),
                };
                if let Some(p) = &c.prompt_logprobs {
                    v["prompt_logprobs"] = p.clone();
                }
                v
            })
            .collect();
        let mut m = self.envelope(object, values);
        m.insert("usage".into(), usage.json());
        let first = choices.first().and_then(|c| c.finished.timing.as_ref());
        m.insert("ember_timing".into(), timing(first));
        if choices.len() > 1 {
            let all: Vec<Value> = choices
                .iter()
                .map(|c| timing(c.finished.timing.as_ref()))
                .collect();
            m.insert("ember_timings".into(), Value::Array(all));
        }
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

/// OpenAI's `usage`: each prompt counted once, every choice's tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

impl Usage {
    pub fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

/// vLLM's `prompt_logprobs`: `null` for the first token, then per token a
/// map from token id to `{logprob, rank, decoded_token}` holding the prompt
/// token and its alternatives (rank 1 is the most likely; the prompt
/// token's rank is its place among the alternatives, or one past them).
pub fn vllm_prompt_logprobs(tokens: &[(u32, PromptLogprob)]) -> Value {
    let mut out = vec![Value::Null];
    for (id, p) in tokens {
        let mut m = Map::new();
        for (rank, (alt, text, lp)) in p.top.iter().enumerate() {
            m.insert(
                alt.to_string(),
                json!({"logprob": lp, "rank": rank + 1, "decoded_token": text}),
            );
        }
        let rank = p
            .top
            .iter()
            .position(|a| a.0 == *id)
            .map_or(p.top.len() + 1, |r| r + 1);
        m.entry(id.to_string())
            .or_insert(json!({"logprob": p.logprob, "rank": rank, "decoded_token": p.text}));
        out.push(Value::Object(m));
    }
    Value::Array(out)
}

/// One scored prompt token (see [`vllm_prompt_logprobs`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    pub text: String,
    pub logprob: f32,
    /// (id, text, logprob), most likely first.
    pub top: Vec<(u32, String, f32)>,
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
            match e.logprob {
                Some(lp) => {
                    m.entry(e.token.clone()).or_insert(json!(lp));
                    Value::Object(m)
                }
                // A prompt's first token: nothing to predict it.
                None => Value::Null,
            }
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
    let item = |token: &str, lp: Option<f32>| json!({ "token": token, "logprob": lp, "bytes": token.as_bytes() });
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = item(&e.token, e.logprob);
            let top: Vec<Value> = e.top.iter().map(|(t, lp)| item(t, Some(*lp))).collect();
            v["top_logprobs"] = Value::Array(top);
            v
        })
        .collect();
    json!({ "content": content })
}

#[cfg(test)]
#[path = "shapes_tests.rs"]
mod tests;
