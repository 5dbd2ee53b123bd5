//! A request's event stream turned into an OpenAI response: Server-Sent
//! Events ([`sse`]) or one JSON body ([`collect`]).
//!
//! Streaming sends exactly one chunk per generated token (also when its text
//! is empty: held back for a stop string or an unfinished UTF-8 character),
//! chat's leading role chunk, a last chunk with the finish reason, the held
//! back text and `ember_timing`, the usage chunk when asked, then `data:
//! [DONE]`. An error after the stream started is one `data: {"error": ...}`
//! event, then `[DONE]`. The SSE body owns the event stream: when the client
//! disconnects, hyper drops the body, the stream task sees its channel close
//! and cancels the request (its KV blocks are freed), as on gRPC.
//!
//! The non-streaming response waits for `Finished` and returns the whole
//! text; an error before then is the error's status and body. If the client
//! leaves first, hyper drops the handler's future and with it the stream.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use ember_common::pb::{self, generate_response::Event as PbEvent};
use ember_common::tokenizer::Gpt2Tokenizer;
use futures::StreamExt;
use serde_json::Value;

use super::error::HttpError;
use super::shapes::{Api, Shape, TokenLogprob};
use crate::service::error::StreamError;
use crate::service::stream::StreamItem;
use crate::service::EventStream;

/// What turns one request's events into its response's pieces.
pub struct Translator {
    pub api: Api,
    /// Unix seconds when the request arrived.
    pub created: u64,
    pub model: String,
    /// For the text of each sampled token in logprobs.
    pub tokenizer: Gpt2Tokenizer,
    /// The request asked for logprobs.
    pub logprobs: bool,
    /// Known from `Started` on (its id is the request id's).
    shape: Option<Shape>,
    /// Characters of completion text sent so far (logprobs' `text_offset`).
    chars: usize,
}

impl Translator {
    pub fn new(
        api: Api,
        created: u64,
        model: &str,
        tokenizer: Gpt2Tokenizer,
        logprobs: bool,
    ) -> Self {
        Self {
            api,
            created,
            model: model.to_string(),
            tokenizer,
            logprobs,
            shape: None,
            chars: 0,
        }
    }

    fn start(&mut self, request_id: &str) -> &Shape {
        self.shape
            .insert(Shape::new(self.api, request_id, self.created, &self.model))
    }

    fn shape(&mut self) -> &Shape {
        let (api, created) = (self.api, self.created);
        let model = &self.model;
        self.shape
            .get_or_insert_with(|| Shape::new(api, "ember-unknown", created, model))
    }

    /// The token's logprobs (if asked), then its text counted as sent.
    fn token(&mut self, t: &pb::Token) -> Option<TokenLogprob> {
        let entry = t
            .logprob
            .filter(|_| self.logprobs)
            .map(|logprob| TokenLogprob {
                token: self.tokenizer.decode(&[t.token_id]),
                logprob,
                top: t
                    .top_logprobs
                    .iter()
                    .map(|a| (a.text.clone(), a.logprob))
                    .collect(),
                text_offset: self.chars,
            });
        self.chars += t.text.chars().count();
        entry
    }
}

/// Streaming: the SSE chunks of each event.
pub struct ChunkWriter {
    pub translator: Translator,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

impl ChunkWriter {
    /// The `data:` payloads one stream item becomes.
    pub fn item(&mut self, item: StreamItem) -> Vec<String> {
        let values = match item {
            Ok(msg) => self.message(msg),
            Err(e) => vec![HttpError::from_stream(&e).body()],
        };
        values.iter().map(Value::to_string).collect()
    }

    fn message(&mut self, msg: pb::GenerateResponse) -> Vec<Value> {
        match msg.event {
            Some(PbEvent::Started(s)) => {
                let shape = self.translator.start(&s.request_id);
                match shape.api {
                    Api::Chat => vec![shape.role_chunk()],
                    Api::Completions => Vec::new(),
                }
            }
            Some(PbEvent::Token(t)) => {
                let lp = self.translator.token(&t);
                vec![self.translator.shape().token_chunk(&t, lp.as_ref())]
            }
            Some(PbEvent::Finished(f)) => {
                let shape = self.translator.shape();
                let mut out = vec![shape.final_chunk(&f)];
                if self.include_usage {
                    out.push(shape.usage_chunk(&f));
                }
                out
            }
            None => Vec::new(),
        }
    }
}

/// The SSE response: every chunk, then `data: [DONE]`.
pub fn sse(events: EventStream, mut writer: ChunkWriter) -> Response {
    let body = events
        .flat_map(move |item| futures::stream::iter(writer.item(item)))
        .chain(futures::stream::once(async { "[DONE]".to_string() }))
        .map(|data| Ok::<_, Infallible>(Event::default().data(data)));
    Sse::new(body).into_response()
}

/// Non-streaming: the whole text and logprobs.
pub struct Collector {
    pub translator: Translator,
    text: String,
    entries: Vec<TokenLogprob>,
}

impl Collector {
    pub fn new(translator: Translator) -> Self {
        Self {
            translator,
            text: String::new(),
            entries: Vec::new(),
        }
    }

    /// Takes one message; the whole body once it is `Finished`.
    pub fn message(&mut self, msg: pb::GenerateResponse) -> Option<Value> {
        match msg.event? {
            PbEvent::Started(s) => {
                self.translator.start(&s.request_id);
                None
            }
            PbEvent::Token(t) => {
                if let Some(lp) = self.translator.token(&t) {
                    self.entries.push(lp);
                }
                self.text.push_str(&t.text);
                None
            }
            PbEvent::Finished(f) => {
                self.text.push_str(&f.trailing_text);
                let logprobs = self.translator.logprobs.then_some(self.entries.as_slice());
                Some(self.translator.shape().body(&self.text, logprobs, &f))
            }
        }
    }
}

/// Reads the stream to its end: the body, or the error that ended it.
pub async fn collect(
    mut events: EventStream,
    mut collector: Collector,
) -> Result<Value, HttpError> {
    while let Some(item) = events.next().await {
        match item {
            Ok(msg) => {
                if let Some(body) = collector.message(msg) {
                    return Ok(body);
                }
            }
            Err(e) => return Err(HttpError::from_stream(&e)),
        }
    }
    Err(HttpError::from_stream(&StreamError::SchedulerStopped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tok() -> Gpt2Tokenizer {
        Gpt2Tokenizer::embedded().unwrap()
    }

    fn msg(event: PbEvent) -> StreamItem {
        Ok(pb::GenerateResponse { event: Some(event) })
    }

    fn events(logprob: bool) -> Vec<StreamItem> {
        let token = |index: u32, token_id: u32, text: &str| {
            msg(PbEvent::Token(pb::Token {
                index,
                token_id,
                text: text.into(),
                server_time_ns: 10 + u64::from(index),
                logprob: logprob.then_some(-1.0),
                top_logprobs: Vec::new(),
            }))
        };
        vec![
            msg(PbEvent::Started(pb::Started {
                request_id: "r9".into(),
                prompt_tokens: 3,
                server_time_ns: 1,
            })),
            token(0, 15496, "Hello"),
            token(1, 995, ""),
            msg(PbEvent::Finished(pb::Finished {
                request_id: "r9".into(),
                finish_reason: pb::FinishReason::Length as i32,
                prompt_tokens: 3,
                completion_tokens: 2,
                trailing_text: " world".into(),
                ..Default::default()
            })),
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
        let mut w = ChunkWriter {
            translator: Translator::new(Api::Chat, 7, "tiny", tok(), false),
            include_usage: true,
        };
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

        let mut w = ChunkWriter {
            translator: Translator::new(Api::Completions, 7, "tiny", tok(), true),
            include_usage: false,
        };
        let v = parse(events(true).into_iter().flat_map(|e| w.item(e)).collect());
        assert_eq!(v.len(), 3, "no role chunk, no usage chunk: {v:?}");
        assert_eq!(v[0]["choices"][0]["logprobs"]["tokens"], json!(["Hello"]));
        assert_eq!(v[1]["choices"][0]["logprobs"]["text_offset"], json!([5]));
    }

    #[test]
    fn an_error_is_one_error_event() {
        let mut w = ChunkWriter {
            translator: Translator::new(Api::Completions, 7, "tiny", tok(), false),
            include_usage: false,
        };
        let v = parse(w.item(Err(StreamError::DeadlineExceeded { stage: "queued" })));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0]["error"]["code"], "deadline_exceeded");
        assert_eq!(v[0]["error"]["type"], "timeout_error");
    }

    #[test]
    fn the_collector_joins_the_text_and_the_trailing_text() {
        let mut c = Collector::new(Translator::new(Api::Completions, 7, "tiny", tok(), true));
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
}
