//! A non-streaming response (`--stream false`): the whole body arrives at
//! once, so the client knows only when it ended. What it says: the output
//! text, `finish_reason`, `usage`, and Ember's `ember_timing` (the server's
//! breakdown, without per-token times: a non-streaming body has none).

use serde::Deserialize;

use crate::client::openai::wire::{EmberTiming, Usage};
use crate::record::{RequestRecord, ServerRecord, TokenSource};

/// A completion or chat completion body (only what loadgen reads).
#[derive(Debug, Default, Deserialize)]
struct WholeBody {
    /// `choices` (the first is read).
    #[serde(default)]
    choices: Vec<WholeChoice>,
    /// `usage`.
    #[serde(default)]
    usage: Option<Usage>,
    /// Ember's breakdown.
    #[serde(default)]
    ember_timing: Option<EmberTiming>,
}

/// One choice of a whole response.
#[derive(Debug, Default, Deserialize)]
struct WholeChoice {
    /// Completions: the output.
    #[serde(default)]
    text: Option<String>,
    /// Chat: the reply.
    #[serde(default)]
    message: Option<Message>,
    /// Why it ended.
    #[serde(default)]
    finish_reason: Option<String>,
}

/// A chat reply.
#[derive(Debug, Default, Deserialize)]
struct Message {
    /// Its text.
    #[serde(default)]
    content: Option<String>,
}

/// Reads a 200 body into `record` (counts from `usage`, the finish reason);
/// returns the server's timeline (when it sent `ember_timing`) and the
/// output text, or why the body is not a completion.
pub fn read(
    body: &[u8],
    record: &mut RequestRecord,
) -> Result<(Option<ServerRecord>, String), String> {
    let whole: WholeBody = serde_json::from_slice(body).map_err(|e| {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        format!("the body is not an OpenAI completion ({e}): {text}")
    })?;
    let choice = whole
        .choices
        .first()
        .ok_or_else(|| "the body has no choices".to_string())?;
    record.finish_reason = choice.finish_reason.as_deref().map(str::to_uppercase);
    if let Some(n) = whole.usage.and_then(|u| u.completion_tokens) {
        record.completion_tokens = n;
        record.tokens_from = TokenSource::Usage;
    }
    if let Some(p) = whole.usage.and_then(|u| u.prompt_tokens) {
        record.prompt_tokens = Some(p);
    }
    let text = choice
        .text
        .clone()
        .or_else(|| choice.message.as_ref().and_then(|m| m.content.clone()))
        .unwrap_or_default();
    Ok((whole.ember_timing.map(|t| t.record(Vec::new())), text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Begin, Slot};
    use std::time::Instant;

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
            streamed: false,
            keep_reply: false,
        };
        RequestRecord::begin(begin, t0, t0)
    }

    #[test]
    fn completion_and_chat_bodies() {
        let mut r = record();
        let (server, text) = read(
            br#"{"choices":[{"index":0,"text":" a b","finish_reason":"length"}],
                "usage":{"prompt_tokens":5,"completion_tokens":2},
                "ember_timing":{"decode_ns":7,"total_ns":9}}"#,
            &mut r,
        )
        .expect("valid");
        assert_eq!(text, " a b");
        assert_eq!((r.completion_tokens, r.prompt_tokens), (2, Some(5)));
        assert_eq!(r.finish_reason.as_deref(), Some("LENGTH"));
        assert_eq!(server.map(|s| (s.decode_ns, s.total_ns)), Some((7, 9)));
        let mut r = record();
        let (server, text) = read(
            br#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
                "usage":{"completion_tokens":1}}"#,
            &mut r,
        )
        .expect("valid");
        assert_eq!((text.as_str(), server.is_none()), ("hi", true));
        assert!(read(b"{\"choices\":[]}", &mut record()).is_err());
        assert!(read(b"data: x", &mut record()).is_err());
    }
}
