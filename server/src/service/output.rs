//! What a request's tokens become on its stream: their text and logprobs.
//!
//! [`OutputText`] runs each token id through the request's incremental
//! detokenizer and then its [`StopStrings`]: this is where the text is
//! produced, so this is where stop strings are matched. At the end of the
//! stream [`OutputText::finish`] releases what was held back (an unfinished
//! UTF-8 character, the start of a stop string that never completed) for
//! `Finished.trailing_text`. [`top_logprobs`] turns the engine's logprobs into
//! proto alternatives, each with its own text.

use ember_common::pb;
use ember_common::tokenizer::{Gpt2Tokenizer, IncrementalDetokenizer};

use super::stop_strings::{Released, StopStrings};
use ember_engine::TokenLogprobs;

/// One request's detokenizer and stop strings.
#[derive(Debug, Clone)]
pub struct OutputText {
    detokenizer: IncrementalDetokenizer,
    stops: StopStrings,
}

impl OutputText {
    pub fn new(tokenizer: &Gpt2Tokenizer, stops: Vec<String>) -> Self {
        Self {
            detokenizer: tokenizer.detokenizer(),
            stops: StopStrings::new(stops),
        }
    }

    /// The text `token_id` releases, or the stop string it completed.
    pub fn push(&mut self, token_id: u32) -> Released {
        let piece = self.detokenizer.push(token_id);
        self.stops.push(&piece)
    }

    /// The end of the stream: everything still held back. The detokenizer's
    /// unfinished bytes (lossy) still go through the stop strings first.
    pub fn finish(&mut self) -> Released {
        let tail = self.detokenizer.flush();
        match self.stops.push(&tail) {
            Released::Text(mut text) => {
                text.push_str(&self.stops.finish());
                Released::Text(text)
            }
            stopped => stopped,
        }
    }
}

/// The proto form of a token's alternatives, each with its text decoded alone.
pub fn top_logprobs(tokenizer: &Gpt2Tokenizer, lp: &TokenLogprobs) -> Vec<pb::TopLogprob> {
    lp.top
        .iter()
        .map(|&(token_id, logprob)| pb::TopLogprob {
            token_id,
            text: tokenizer.decode(&[token_id]),
            logprob,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok() -> Gpt2Tokenizer {
        Gpt2Tokenizer::embedded().unwrap()
    }

    #[test]
    fn a_stop_string_spanning_tokens_is_matched_on_the_text() {
        let t = tok();
        let ids = t.encode("Hello world, again").unwrap();
        let mut out = OutputText::new(&t, vec!["o w".into()]);
        let mut sent = String::new();
        let mut stop = None;
        for id in ids {
            match out.push(id) {
                Released::Text(s) => sent.push_str(&s),
                Released::Stopped { text, stop: s } => {
                    sent.push_str(&text);
                    stop = Some(s);
                    break;
                }
            }
        }
        assert_eq!((sent.as_str(), stop.as_deref()), ("Hell", Some("o w")));
    }

    #[test]
    fn finish_releases_held_text_and_unfinished_bytes() {
        let t = tok();
        let mut out = OutputText::new(&t, vec!["world!".into()]);
        let ids = t.encode("Hello world").unwrap();
        let sent: String = ids
            .iter()
            .map(|&id| match out.push(id) {
                Released::Text(s) => s,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sent, "Hello ");
        assert_eq!(out.finish(), Released::Text("world".into()));

        // The first token of a 4-byte emoji holds bytes the detokenizer
        // cannot complete; at the end they come out as U+FFFD.
        let crab = t.encode("🦀").unwrap();
        assert!(crab.len() > 1);
        let mut out = OutputText::new(&t, Vec::new());
        assert_eq!(out.push(crab[0]), Released::Text(String::new()));
        assert_eq!(out.finish(), Released::Text("\u{FFFD}".into()));
    }

    #[test]
    fn alternatives_carry_their_own_text() {
        let t = tok();
        let lp = TokenLogprobs {
            logprob: -0.5,
            top: vec![(15496, -0.5), (995, -1.5)],
        };
        let top = top_logprobs(&t, &lp);
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].text.as_str(), top[0].token_id), ("Hello", 15496));
        assert_eq!((top[1].text.as_str(), top[1].logprob), (" world", -1.5));
    }
}
