//! Reading one streamed response into a record. Every body frame is
//! timestamped the moment `frame()` hands it over, and the SSE events it
//! completes get that instant (see `sse`): the time the bytes arrived, not
//! the time a line reader got round to them.
//!
//! Which chunks are tokens: a chunk with Ember's `ember` field is one token
//! (even with empty text: bytes held back for a stop string); once a stream
//! has shown `ember`, chunks without it (chat's role chunk, the finish chunk)
//! are not tokens. From a server without the extension, a chunk with
//! non-empty text is a token event (it may carry several tokens; `usage`
//! then gives the count). The completion token count is `usage`'s when the
//! server sent one, else the number of token chunks, and the record says
//! which.

use std::time::Instant;

use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::client::openai::sse::SseParser;
use crate::client::openai::wire::{Chunk, EmberTiming, Usage};
use crate::record::{ns_since, RequestRecord, TokenSource};

/// How a stream ended, for the caller to finish the record.
#[derive(Debug)]
pub enum End {
    /// `[DONE]` (or the body's end) after a `finish_reason`: OK at this time.
    Ok(Instant),
    /// A failure: status name, message, when.
    Failed(String, String, Instant),
}

/// What the chunks of one stream said, beyond the token arrivals.
#[derive(Debug, Default)]
pub struct Reader {
    /// SSE framing state.
    sse: SseParser,
    /// Events completed by the current frame.
    events: Vec<Vec<u8>>,
    /// A chunk carried Ember's `ember` field.
    saw_ember: bool,
    /// `server_time_ns` of each `ember` token.
    server_tokens: Vec<u64>,
    /// `ember_timing`, if sent.
    timing: Option<EmberTiming>,
    /// `usage`, if sent.
    usage: Option<Usage>,
    /// The `finish_reason`, upper-cased.
    finish_reason: Option<String>,
    /// An `error` event's description.
    error: Option<String>,
    /// `[DONE]` arrived, and when.
    done: Option<Instant>,
}

impl Reader {
    /// Reads the body to its end (or `deadline`), filling `record`'s token
    /// arrivals.
    pub async fn read(
        mut self,
        mut body: Incoming,
        deadline: tokio::time::Instant,
        t0: Instant,
        record: &mut RequestRecord,
    ) -> (End, Self) {
        loop {
            let next = tokio::time::timeout_at(deadline, body.frame()).await;
            let now = Instant::now();
            let frame = match next {
                Err(_) => {
                    let m = "client --timeout passed during the stream".to_string();
                    return (End::Failed("DEADLINE_EXCEEDED".into(), m, now), self);
                }
                Ok(None) => return (self.end(now), self),
                Ok(Some(Err(e))) => {
                    let m = format!("the stream broke: {e}");
                    return (End::Failed("UNAVAILABLE".into(), m, now), self);
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            self.sse.push(&data, &mut self.events);
            let events = std::mem::take(&mut self.events);
            for e in &events {
                if let Err(m) = self.event(e, ns_since(t0, now), now, record) {
                    return (End::Failed("BAD_RESPONSE".into(), m, now), self);
                }
            }
            self.events = events;
            self.events.clear();
        }
    }

    /// One SSE event's data, which arrived at `at_ns` (`now`).
    fn event(
        &mut self,
        data: &[u8],
        at_ns: u64,
        now: Instant,
        record: &mut RequestRecord,
    ) -> Result<(), String> {
        if data == b"[DONE]" {
            self.done.get_or_insert(now);
            return Ok(());
        }
        let chunk: Chunk = serde_json::from_slice(data).map_err(|e| {
            let text = String::from_utf8_lossy(&data[..data.len().min(200)]).into_owned();
            format!("a chunk is not OpenAI JSON ({e}): {text}")
        })?;
        if let Some(error) = &chunk.error {
            self.error.get_or_insert_with(|| error.describe());
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        if chunk.ember_timing.is_some() {
            self.timing = chunk.ember_timing;
        }
        let choice = chunk.choices.as_ref().and_then(|c| c.first());
        let token = match (&chunk.ember, self.saw_ember) {
            (Some(e), _) => {
                self.saw_ember = true;
                self.server_tokens.push(e.server_time_ns);
                true
            }
            (None, true) => false,
            (None, false) => choice.is_some_and(|c| !c.content().is_empty()),
        };
        if token {
            record.token_recv_ns.push(at_ns);
        }
        if let (Some(reply), Some(c)) = (record.reply.as_mut(), choice) {
            reply.push_str(c.content());
        }
        if let Some(reason) = choice.and_then(|c| c.finish_reason.as_deref()) {
            self.finish_reason = Some(reason.to_uppercase());
        }
        Ok(())
    }

    /// The body ended at `now`.
    fn end(&self, now: Instant) -> End {
        if let Some(e) = &self.error {
            return End::Failed("STREAM_ERROR".into(), e.clone(), now);
        }
        match (self.finish_reason.is_some(), self.done) {
            (true, done) => End::Ok(done.unwrap_or(now)),
            (false, _) => End::Failed(
                "UNKNOWN".into(),
                "the stream ended without a finish_reason".into(),
                now,
            ),
        }
    }

    /// Puts what the chunks said into the record: counts (usage, else
    /// chunks), finish reason; returns the server timeline if the server sent
    /// Ember's extension.
    pub fn apply(self, record: &mut RequestRecord) -> Option<crate::record::ServerRecord> {
        record.finish_reason = self.finish_reason;
        let chunks = u32::try_from(record.token_recv_ns.len()).unwrap_or(u32::MAX);
        match self.usage.and_then(|u| u.completion_tokens) {
            Some(n) => {
                record.completion_tokens = n;
                record.tokens_from = TokenSource::Usage;
            }
            None => {
                record.completion_tokens = chunks;
                record.tokens_from = TokenSource::Chunks;
            }
        }
        if let Some(p) = self.usage.and_then(|u| u.prompt_tokens) {
            record.prompt_tokens = Some(p);
        }
        self.timing.map(|t| t.record(self.server_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Begin, Slot};

    fn record() -> RequestRecord {
        let t0 = Instant::now();
        let slot = Slot {
            run: 0,
            warmup: false,
            index: 0,
            t0,
            intended: t0,
            fired: t0,
        };
        let begin = Begin {
            slot,
            request_id: "r".into(),
            target: "t",
            channel: 0,
            prompt_tokens: None,
            tokens_from: TokenSource::Chunks,
            streamed: true,
            keep_reply: false,
        };
        RequestRecord::begin(begin, t0, t0)
    }

    fn feed(reader: &mut Reader, r: &mut RequestRecord, events: &[&str]) {
        for (i, e) in events.iter().enumerate() {
            reader
                .event(e.as_bytes(), i as u64 * 10, Instant::now(), r)
                .expect("valid chunk");
        }
    }

    #[test]
    fn ember_chunks_count_exactly_and_carry_the_timeline() {
        let (mut reader, mut r) = (Reader::default(), record());
        feed(
            &mut reader,
            &mut r,
            &[
                r#"{"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
                r#"{"choices":[{"delta":{"content":"a"},"finish_reason":null}],"ember":{"server_time_ns":5}}"#,
                r#"{"choices":[{"delta":{"content":""},"finish_reason":null}],"ember":{"server_time_ns":7}}"#,
                r#"{"choices":[{"delta":{"content":"tail"},"finish_reason":"stop"}],"ember_timing":{"server_ttft_ns":4}}"#,
                r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
                "[DONE]",
            ],
        );
        assert!(matches!(reader.end(Instant::now()), End::Ok(_)));
        assert_eq!(
            r.token_recv_ns,
            vec![10, 20],
            "the role and finish chunks are not tokens"
        );
        let server = reader.apply(&mut r).expect("Ember's extension");
        assert_eq!(server.token_server_time_ns, vec![5, 7]);
        assert_eq!(server.server_ttft_ns, 4);
        assert_eq!(
            (r.completion_tokens, r.tokens_from),
            (2, TokenSource::Usage)
        );
        assert_eq!(
            (r.prompt_tokens, r.finish_reason.as_deref()),
            (Some(3), Some("STOP"))
        );
    }

    #[test]
    fn a_plain_server_counts_chunks_without_usage() {
        let (mut reader, mut r) = (Reader::default(), record());
        feed(
            &mut reader,
            &mut r,
            &[
                r#"{"choices":[{"text":"a","finish_reason":null}]}"#,
                r#"{"choices":[{"text":"","finish_reason":null}]}"#,
                r#"{"choices":[{"text":"b","finish_reason":"length"}]}"#,
                "[DONE]",
            ],
        );
        assert_eq!(
            r.token_recv_ns,
            vec![0, 20],
            "an empty chunk carries no token"
        );
        assert!(reader.apply(&mut r).is_none(), "no server timeline");
        assert_eq!(
            (r.completion_tokens, r.tokens_from),
            (2, TokenSource::Chunks)
        );
    }

    #[test]
    fn error_events_and_missing_finish_fail() {
        let (mut reader, mut r) = (Reader::default(), record());
        feed(
            &mut reader,
            &mut r,
            &[
                r#"{"choices":[{"text":"a"}]}"#,
                r#"{"error":{"message":"engine failure","type":"server_error"}}"#,
                "[DONE]",
            ],
        );
        match reader.end(Instant::now()) {
            End::Failed(status, m, _) => {
                assert_eq!(status, "STREAM_ERROR");
                assert_eq!(m, "engine failure (type server_error)");
            }
            other => panic!("{other:?}"),
        }
        let (mut reader, mut r) = (Reader::default(), record());
        feed(&mut reader, &mut r, &[r#"{"choices":[{"text":"a"}]}"#]);
        assert!(matches!(reader.end(Instant::now()), End::Failed(s, _, _) if s == "UNKNOWN"));
        let mut reader = Reader::default();
        assert!(reader
            .event(b"{not json", 0, Instant::now(), &mut r)
            .is_err());
    }
}
