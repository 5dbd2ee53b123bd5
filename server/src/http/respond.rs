//! A request's event stream turned into an OpenAI response: Server-Sent
//! Events ([`sse`]) or one JSON body ([`collect`]).
//!
//! One request may be several sequences: `n` choices of each of its prompts
//! (completions take a list), all in one event stream, each message tagged
//! with its choice (`index` in the response: prompt `i`'s choice `j` is `i *
//! n + j`). Streaming sends exactly one chunk per generated token (also when
//! its text is empty: held back for a stop string or an unfinished UTF-8
//! character), chat's leading role chunk per choice, a choice's prompt chunk
//! before its first token when it echoes its prompt or asked for
//! `prompt_logprobs`, a last chunk per choice with the finish reason, the held
//! back text and `ember_timing`, the usage chunk (every choice counted) when
//! asked, then `data: [DONE]`. An error after the stream started is one
//! `data: {"error": ...}` event, then `[DONE]`. The SSE body owns the event
//! stream: when the client disconnects, hyper drops the body, the stream
//! tasks see their channel close and cancel their sequences (their KV blocks
//! are freed), as on gRPC.
//!
//! The non-streaming response waits for every choice's `Finished` and
//! returns the whole texts; an error before then is the error's status and
//! body. If the client leaves first, hyper drops the handler's future and
//! with it the stream.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use ember_common::pb::{self, generate_response::Event as PbEvent};
use futures::StreamExt;
use serde_json::Value;

use super::error::HttpError;
use super::prompt_view::PromptView;
use super::shapes::{ChoiceBody, Shape, Usage};
use crate::service::error::StreamError;
use crate::service::stream::StreamItem;

pub use super::prompt_view::Translator;

/// A request's merged event stream (every prompt's, every choice's).
pub type Events = futures::stream::BoxStream<'static, StreamItem>;

/// Streaming: the SSE chunks of each event.
pub struct ChunkWriter {
    pub translator: Translator,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Choices whose prompt chunk was sent.
    prompted: HashSet<u32>,
    finished: usize,
    usage: Usage,
}

impl ChunkWriter {
    pub fn new(translator: Translator, include_usage: bool) -> Self {
        Self {
            translator,
            include_usage,
            prompted: HashSet::new(),
            finished: 0,
            usage: Usage::default(),
        }
    }

    /// The `data:` payloads one stream item becomes.
    pub fn item(&mut self, item: StreamItem) -> Vec<String> {
        let values = match item {
            Ok(msg) => self.message(msg),
            Err(e) => vec![HttpError::from_stream(&e).body()],
        };
        values.iter().map(Value::to_string).collect()
    }

    fn message(&mut self, msg: pb::GenerateResponse) -> Vec<Value> {
        let t = &mut self.translator;
        match msg.event {
            Some(PbEvent::Started(s)) => t.started(&s.request_id),
            Some(PbEvent::PromptLogprobs(p)) => {
                t.prompt_logprobs(&p);
                Vec::new()
            }
            Some(PbEvent::Token(tok)) => {
                let mut out = self.prompt_chunk(tok.choice);
                let t = &mut self.translator;
                let lp = t.token(&tok);
                out.push(t.shape().token_chunk(&tok, lp.as_ref()));
                out
            }
            Some(PbEvent::Finished(f)) => {
                let mut out = self.prompt_chunk(f.choice);
                self.usage = self.translator.add_usage(self.usage, &f);
                self.finished += 1;
                out.push(self.translator.shape().final_chunk(&f));
                if self.include_usage && self.finished == self.translator.expected() {
                    out.push(self.translator.shape().usage_chunk(self.usage));
                }
                out
            }
            None => Vec::new(),
        }
    }

    /// The choice's prompt chunk, once, if it has one.
    fn prompt_chunk(&mut self, choice: u32) -> Vec<Value> {
        if !self.prompted.insert(choice) {
            return Vec::new();
        }
        self.translator.prompt_chunk(choice).into_iter().collect()
    }
}

/// The SSE response: every chunk, then `data: [DONE]`.
pub fn sse(events: Events, mut writer: ChunkWriter) -> Response {
    let body = events
        .flat_map(move |item| futures::stream::iter(writer.item(item)))
        .chain(futures::stream::once(async { "[DONE]".to_string() }))
        .map(|data| Ok::<_, Infallible>(Event::default().data(data)));
    Sse::new(body).into_response()
}

/// One choice's text and logprobs so far, and its end.
#[derive(Debug, Default)]
struct ChoiceState {
    text: String,
    entries: Vec<super::shapes::TokenLogprob>,
    finished: Option<pb::Finished>,
}

/// Non-streaming: every choice's whole text and logprobs.
pub struct Collector {
    pub translator: Translator,
    choices: BTreeMap<u32, ChoiceState>,
    finished: usize,
}

impl Collector {
    pub fn new(translator: Translator) -> Self {
        Self {
            translator,
            choices: BTreeMap::new(),
            finished: 0,
        }
    }

    /// Takes one message; the whole body once every choice has finished.
    pub fn message(&mut self, msg: pb::GenerateResponse) -> Option<Value> {
        match msg.event? {
            PbEvent::Started(s) => {
                self.translator.started(&s.request_id);
            }
            PbEvent::PromptLogprobs(p) => self.translator.prompt_logprobs(&p),
            PbEvent::Token(t) => {
                let lp = self.translator.token(&t);
                let c = self.choices.entry(t.choice).or_default();
                c.entries.extend(lp);
                c.text.push_str(&t.text);
            }
            PbEvent::Finished(f) => {
                let c = self.choices.entry(f.choice).or_default();
                c.text.push_str(&f.trailing_text);
                c.finished = Some(f);
                self.finished += 1;
                if self.finished == self.translator.expected() {
                    return Some(self.body());
                }
            }
        }
        None
    }

    fn body(&mut self) -> Value {
        let t = &self.translator;
        let mut usage = Usage::default();
        let mut texts = Vec::with_capacity(self.choices.len());
        for (&index, c) in &self.choices {
            let PromptView {
                text,
                entries,
                vllm,
            } = t.prompt_view(index);
            let mut all = entries.unwrap_or_default();
            let offset = text.chars().count();
            all.extend(c.entries.iter().cloned().map(|mut e| {
                e.text_offset += offset;
                e
            }));
            texts.push((index, format!("{text}{}", c.text), all, vllm));
            if let Some(f) = &c.finished {
                usage = t.add_usage(usage, f);
            }
        }
        let choices: Vec<ChoiceBody<'_>> = texts
            .iter()
            .zip(self.choices.values())
            .filter_map(|((index, text, all, vllm), c)| {
                Some(ChoiceBody {
                    index: *index,
                    text,
                    logprobs: t.logprobs.then_some(all.as_slice()),
                    prompt_logprobs: vllm.clone(),
                    finished: c.finished.as_ref()?,
                })
            })
            .collect();
        let shape: &Shape = t.shape_ref();
        shape.body(&choices, usage)
    }
}

/// Reads the stream to its end: the body, or the error that ended it.
pub async fn collect(mut events: Events, mut collector: Collector) -> Result<Value, HttpError> {
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
#[path = "respond_tests.rs"]
mod tests;
