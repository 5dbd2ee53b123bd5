//! Server-Sent Events, parsed incrementally as body frames arrive: push the
//! bytes of each frame, get back the `data` of every event those bytes
//! completed. Nothing waits for more than the event's own bytes (no line
//! reader with its own buffer), so the caller can stamp each event with the
//! arrival time of the frame that completed it.
//!
//! The WHATWG rules that matter for LLM streams: lines end with `\n`, `\r\n`
//! or `\r`; a blank line ends an event; `data:` lines (one leading space
//! dropped) join with `\n`; comments (`:`) and other fields (`event`, `id`,
//! `retry`) are ignored; an event without data is not dispatched.

/// The parser's state between frames.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of an unfinished line.
    line: Vec<u8>,
    /// The `data` of the event being read (lines joined with `\n`).
    data: Vec<u8>,
    /// Whether the event being read has a `data` field (even an empty one).
    has_data: bool,
    /// The previous byte was a `\r` (a following `\n` belongs to it).
    after_cr: bool,
}

impl SseParser {
    /// Consumes `bytes`; appends the `data` of each event they completed to
    /// `out`, in order.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<Vec<u8>>) {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(end) => {
                    self.line.extend_from_slice(&rest[..end]);
                    self.after_cr = rest[end] == b'\r';
                    rest = &rest[end + 1..];
                    self.end_line(out);
                }
                None => {
                    self.line.extend_from_slice(rest);
                    rest = &[];
                }
            }
        }
    }

    /// One complete line (without its terminator) is in `self.line`.
    fn end_line(&mut self, out: &mut Vec<Vec<u8>>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if self.has_data {
                let mut data = std::mem::take(&mut self.data);
                data.pop(); // the `\n` after the last data line
                out.push(data);
            }
            self.data.clear();
            self.has_data = false;
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => return, // a comment
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&line[..], &[][..]),
        };
        if field == b"data" {
            self.data.extend_from_slice(value);
            self.data.push(b'\n');
            self.has_data = true;
        }
        // Reuse the line's allocation for the next one.
        self.line = line;
        self.line.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, &mut out);
        }
        out.into_iter()
            .map(|d| String::from_utf8(d).expect("utf-8"))
            .collect()
    }

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let stream =
            b"data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":2}\r\n\r\nevent: x\ndata:[DONE]\r\r";
        let want = vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"];
        assert_eq!(all(&[stream]), want);
        for cut in 0..stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(all(&[a, b]), want, "split at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(all(&bytes), want, "one byte at a time");
    }

    #[test]
    fn an_event_comes_out_when_its_blank_line_arrives() {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        p.push(b"data: one\n", &mut out);
        assert!(out.is_empty(), "not finished yet");
        p.push(b"\ndata: two", &mut out);
        assert_eq!(out, vec![b"one".to_vec()]);
        p.push(b"\n\n", &mut out);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn multiline_data_and_fields_without_data() {
        assert_eq!(all(&[b"data: a\ndata:b\n\nid: 3\n\n"]), vec!["a\nb"]);
        assert_eq!(all(&[b"data\n\n"]), vec![""], "an empty data field");
    }
}
