//! Stop strings, matched on the text as the stream task produces it.
//!
//! Detokenization happens in the service (one incremental detokenizer per
//! stream), so stop strings are matched there too, on the text, across token
//! boundaries. The matcher sees each token's text piece and returns what may
//! be sent now: text that could still turn out to be the start of a stop
//! string is held back, and released as soon as a later piece rules that out,
//! or at the end of the stream ([`StopStrings::finish`]). On a match it
//! returns the text before the match; the stop string and anything after it
//! are dropped.
//!
//! Why holding back is enough: everything released so far ends with no
//! proper prefix of any stop string, so a match can only start inside the
//! held text, and searching the held text after each piece finds the earliest
//! match. Among matches the earliest start wins, then the first listed.

/// What one piece of text released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// Text that can be sent (possibly empty: all of it is held back).
    Text(String),
    /// A stop string matched: `text` precedes it and is the last text of the
    /// stream; `stop` is the stop string as the request gave it.
    Stopped { text: String, stop: String },
}

/// One request's stop strings and the text held back for them.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    /// As the request gave them (validated non-empty).
    stops: Vec<String>,
    /// Produced but not released: could still be the start of a stop string.
    held: String,
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
        }
    }

    /// Takes the next piece of text; returns what may be sent now.
    pub fn push(&mut self, piece: &str) -> Released {
        if self.stops.is_empty() {
            return Released::Text(piece.to_string());
        }
        self.held.push_str(piece);
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at); // the first listed wins a tie
        if let Some((at, stop)) = found {
            let stop = stop.clone();
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return Released::Stopped { text, stop };
        }
        let keep = self.partial_match_len();
        let rest = self.held.split_off(self.held.len() - keep);
        Released::Text(std::mem::replace(&mut self.held, rest))
    }

    /// The end of the stream without a match: whatever is still held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Bytes at the end of `held` that are a proper prefix of some stop string
    /// (the longest such suffix; 0 when none is).
    fn partial_match_len(&self) -> usize {
        let held = self.held.as_bytes();
        self.stops
            .iter()
            .filter_map(|s| {
                let longest = (s.len() - 1).min(held.len());
                (1..=longest)
                    .rev()
                    .find(|&k| held.ends_with(&s.as_bytes()[..k]))
            })
            .max()
            .filter(|&k| self.held.is_char_boundary(self.held.len() - k))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopStrings {
        StopStrings::new(stops.iter().map(|s| s.to_string()).collect())
    }

    fn text(s: &str) -> Released {
        Released::Text(s.into())
    }

    fn stopped(text: &str, stop: &str) -> Released {
        Released::Stopped {
            text: text.into(),
            stop: stop.into(),
        }
    }

    #[test]
    fn no_stops_passes_text_through() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("Hello"), text("Hello"));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn a_stop_spanning_pieces_is_held_back_then_dropped() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("the E"), text("the "));
        assert_eq!(m.push("N"), text(""));
        assert_eq!(m.push("Dgame"), stopped("", "END"));
    }

    #[test]
    fn held_text_is_released_when_it_cannot_start_a_match() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("the EN"), text("the "));
        assert_eq!(m.push("a"), text("ENa"));
        assert_eq!(m.push(" E"), text(" "));
        assert_eq!(m.finish(), "E");
    }

    #[test]
    fn text_before_the_match_in_the_same_piece_is_sent() {
        let mut m = matcher(&["\n\n"]);
        assert_eq!(m.push("one\n\ntwo"), stopped("one", "\n\n"));
    }

    #[test]
    fn the_earliest_match_wins_then_the_first_listed() {
        let mut m = matcher(&["cd", "bc"]);
        assert_eq!(m.push("abcd"), stopped("a", "bc"));
        let mut m = matcher(&["ab", "abc"]);
        assert_eq!(m.push("xabc"), stopped("x", "ab"));
        let mut m = matcher(&["abc", "ab"]);
        assert_eq!(m.push("xabc"), stopped("x", "abc"));
    }

    #[test]
    fn overlapping_partial_prefixes_hold_the_longest() {
        // "aab": after "aa" both "a" and "aa" are prefixes of "aab".
        let mut m = matcher(&["aab"]);
        assert_eq!(m.push("xaa"), text("x"));
        assert_eq!(m.push("a"), text("a"));
        assert_eq!(m.push("b"), stopped("", "aab"));
    }

    #[test]
    fn multibyte_stops_split_on_character_boundaries() {
        let mut m = matcher(&["日本"]);
        assert_eq!(m.push("語日"), text("語"));
        assert_eq!(m.push("x"), text("日x"));
        assert_eq!(m.push("日"), text(""));
        assert_eq!(m.push("本語"), stopped("", "日本"));
    }

    #[test]
    fn a_single_character_stop_matches_in_the_first_piece() {
        let mut m = matcher(&["."]);
        assert_eq!(m.push("Hi. there"), stopped("Hi", "."));
    }
}
