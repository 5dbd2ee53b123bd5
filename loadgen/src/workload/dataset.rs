//! Prompt files: `--dataset PATH` in JSONL (one object per line) or ShareGPT
//! format. A bad file fails before anything connects, naming the file, the line
//! (or entry) and the field.
//!
//! JSONL fields, per line: exactly one of `prompt` (text), `prompt_token_ids`
//! (array of ids) or `input_length` (that many synthetic token ids, as in
//! Mooncake-style traces); optional `max_new_tokens` (alias `output_length`);
//! optional `timestamp` (ms since the trace's start, for `--arrival trace`).
//! Unknown fields are ignored. ShareGPT: a JSON array of objects whose
//! `conversations` list turns `{"from": "human"|"gpt", "value": TEXT}`; the
//! first human turn is the prompt and the GPT-2 token count of the reply that
//! follows it is `max_new_tokens` (entries without a human turn are skipped).

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use ember_common::tokenizer::Gpt2Tokenizer;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::Error;

/// `--dataset-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetFormat {
    /// One JSON object per line.
    Jsonl,
    /// A ShareGPT conversation file (a JSON array).
    Sharegpt,
}

/// What a dataset entry asks the prompt to be.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptSpec {
    /// Text, tokenized by the server (or client-side with `--pretok`).
    Text(String),
    /// Token ids, sent as `prompt_token_ids`.
    Ids(Vec<u32>),
    /// This many synthetic token ids.
    Length(u32),
}

/// One entry of a dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The prompt.
    pub prompt: PromptSpec,
    /// Tokens to generate, if the entry says.
    pub max_new_tokens: Option<u32>,
    /// Arrival time in ms since the trace's start, if the entry has one.
    pub timestamp_ms: Option<f64>,
}

/// Loads a dataset file; never empty.
pub fn load(path: &Path, format: DatasetFormat) -> Result<Vec<Entry>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::File {
        path: path.to_path_buf(),
        source,
    })?;
    let entries = match format {
        DatasetFormat::Jsonl => parse_jsonl(path, &text)?,
        DatasetFormat::Sharegpt => parse_sharegpt(path, &text)?,
    };
    if entries.is_empty() {
        return Err(bad(path, "file", None, "has no entries"));
    }
    Ok(entries)
}

fn bad(
    path: &Path,
    at: impl Into<String>,
    field: Option<&str>,
    reason: impl Into<String>,
) -> Error {
    Error::Dataset {
        path: PathBuf::from(path),
        at: at.into(),
        field: field.map(str::to_owned),
        reason: reason.into(),
    }
}

/// Parses JSONL text (blank lines are skipped).
pub fn parse_jsonl(path: &Path, text: &str) -> Result<Vec<Entry>, Error> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("line {}", i + 1);
        let value: Value = serde_json::from_str(line)
            .map_err(|e| bad(path, &at, None, format!("not JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| bad(path, &at, None, "not a JSON object"))?;
        out.push(entry(obj).map_err(|(field, reason)| bad(path, &at, Some(field), reason))?);
    }
    Ok(out)
}

/// One JSONL object; the error names the field.
fn entry(obj: &Map<String, Value>) -> Result<Entry, (&'static str, String)> {
    let prompts = ["prompt", "prompt_token_ids", "input_length"]
        .iter()
        .filter(|k| obj.contains_key(**k))
        .count();
    if prompts != 1 {
        return Err((
            "prompt",
            format!(
                "needs exactly one of prompt, prompt_token_ids, input_length (found {prompts})"
            ),
        ));
    }
    let prompt = if let Some(v) = obj.get("prompt") {
        match v.as_str() {
            Some(s) if !s.is_empty() => PromptSpec::Text(s.to_owned()),
            _ => return Err(("prompt", format!("must be a non-empty string (got {v})"))),
        }
    } else if let Some(v) = obj.get("prompt_token_ids") {
        let ids = v.as_array().filter(|a| !a.is_empty()).ok_or((
            "prompt_token_ids",
            "must be a non-empty array of token ids".to_owned(),
        ))?;
        let ids = ids
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or((
                "prompt_token_ids",
                "every element must be a token id (u32)".to_owned(),
            ))?;
        PromptSpec::Ids(ids)
    } else {
        PromptSpec::Length(positive(obj, "input_length")?.unwrap_or(1))
    };
    let max_new_tokens = match positive(obj, "max_new_tokens")? {
        Some(n) => Some(n),
        None => positive(obj, "output_length")?,
    };
    let timestamp_ms = match obj.get("timestamp") {
        None => None,
        Some(v) => match v.as_f64() {
            Some(t) if t.is_finite() && t >= 0.0 => Some(t),
            _ => {
                return Err((
                    "timestamp",
                    format!("must be a number of ms >= 0 (got {v})"),
                ))
            }
        },
    };
    Ok(Entry {
        prompt,
        max_new_tokens,
        timestamp_ms,
    })
}

/// An optional integer field >= 1.
fn positive(
    obj: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<u32>, (&'static str, String)> {
    match obj.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err((key, format!("must be an integer >= 1 (got {v})"))),
        },
    }
}

/// Parses a ShareGPT file.
pub fn parse_sharegpt(path: &Path, text: &str) -> Result<Vec<Entry>, Error> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| bad(path, "file", None, format!("not JSON: {e}")))?;
    let items = value
        .as_array()
        .ok_or_else(|| bad(path, "file", None, "must be a JSON array of conversations"))?;
    let tokenizer = Gpt2Tokenizer::embedded()?;
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("entry {i}");
        let turns = item
            .get("conversations")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                bad(
                    path,
                    &at,
                    Some("conversations"),
                    "must be an array of turns",
                )
            })?;
        let mut texts = Vec::with_capacity(turns.len());
        for (t, turn) in turns.iter().enumerate() {
            let from = turn.get("from").and_then(Value::as_str);
            let value = turn.get("value").and_then(Value::as_str);
            match (from, value) {
                (Some(f), Some(v)) => texts.push((f, v)),
                _ => {
                    let field = format!("conversations[{t}]");
                    return Err(bad(
                        path,
                        &at,
                        Some(&field),
                        "needs string `from` and `value`",
                    ));
                }
            }
        }
        let Some(h) = texts
            .iter()
            .position(|(f, v)| matches!(*f, "human" | "user") && !v.is_empty())
        else {
            continue;
        };
        let max_new_tokens = match texts.get(h + 1) {
            Some((_, reply)) => {
                let n = tokenizer.encode(reply)?.len();
                Some(u32::try_from(n).unwrap_or(u32::MAX).max(1))
            }
            None => None,
        };
        out.push(Entry {
            prompt: PromptSpec::Text(texts[h].1.to_owned()),
            max_new_tokens,
            timestamp_ms: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jsonl(text: &str) -> Result<Vec<Entry>, Error> {
        parse_jsonl(Path::new("d.jsonl"), text)
    }

    #[test]
    fn reads_every_kind_of_line() {
        let e = jsonl(
            "{\"prompt\":\"hi\",\"max_new_tokens\":4}\n\n\
             {\"prompt_token_ids\":[1,2,3],\"timestamp\":12.5}\n\
             {\"input_length\":100,\"output_length\":7,\"hash_ids\":[1]}\n",
        )
        .expect("parses");
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].prompt, PromptSpec::Text("hi".into()));
        assert_eq!(e[0].max_new_tokens, Some(4));
        assert_eq!(e[1].prompt, PromptSpec::Ids(vec![1, 2, 3]));
        assert_eq!(e[1].timestamp_ms, Some(12.5));
        assert_eq!(e[2].prompt, PromptSpec::Length(100));
        assert_eq!(e[2].max_new_tokens, Some(7));
    }

    #[test]
    fn bad_lines_name_file_line_and_field() {
        let cases = [
            (
                "{\"prompt\":\"a\"}\nnot json\n",
                "d.jsonl: line 2: not JSON",
            ),
            (
                "{\"prompt\":\"a\"}\n{\"prompt\":\"\"}",
                "d.jsonl: line 2: field `prompt`",
            ),
            ("[1]", "d.jsonl: line 1: not a JSON object"),
            (
                "{\"max_new_tokens\":3}",
                "d.jsonl: line 1: field `prompt`: needs exactly one",
            ),
            (
                "{\"prompt\":\"a\",\"prompt_token_ids\":[1]}",
                "field `prompt`: needs exactly one",
            ),
            (
                "{\"prompt_token_ids\":[1,-2]}",
                "line 1: field `prompt_token_ids`",
            ),
            (
                "{\"prompt\":\"a\",\"max_new_tokens\":0}",
                "line 1: field `max_new_tokens`",
            ),
            (
                "\n\n{\"prompt\":\"a\",\"timestamp\":-1}",
                "line 3: field `timestamp`",
            ),
            ("{\"input_length\":1.5}", "field `input_length`"),
        ];
        for (text, want) in cases {
            let err = jsonl(text).expect_err(text).to_string();
            assert!(err.contains(want), "{text:?}: {err:?} lacks {want:?}");
        }
    }

    #[test]
    fn sharegpt_takes_the_first_human_turn_and_the_reply_length() {
        let text = r#"[
          {"conversations":[{"from":"human","value":"Hello there"},{"from":"gpt","value":"Hello world"}]},
          {"conversations":[{"from":"gpt","value":"no human"}]},
          {"conversations":[{"from":"human","value":"alone"}]}
        ]"#;
        let e = parse_sharegpt(Path::new("s.json"), text).expect("parses");
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].prompt, PromptSpec::Text("Hello there".into()));
        assert_eq!(
            e[0].max_new_tokens,
            Some(2),
            "\"Hello world\" is 2 GPT-2 tokens"
        );
        assert_eq!(e[1].max_new_tokens, None);
        let err = parse_sharegpt(
            Path::new("s.json"),
            r#"[{"conversations":[{"from":"human"}]}]"#,
        )
        .expect_err("bad turn")
        .to_string();
        assert!(
            err.contains("s.json: entry 0: field `conversations[0]`"),
            "{err}"
        );
    }
}
