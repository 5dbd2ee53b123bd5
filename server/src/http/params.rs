//! The request fields `/v1/completions` and `/v1/chat/completions` share:
//! sampling, stops, streaming, and the OpenAI / vLLM fields Ember knows but
//! does not implement.
//!
//! Sampling follows OpenAI's defaults, not the gRPC API's: `temperature`
//! unset is 1.0 (gRPC: greedy), `top_p` 1.0; vLLM's `top_k` (-1 or 0: no
//! limit), `min_p` and `seed` are taken too, as are OpenAI's `n`, penalties and
//! `logit_bias` (keys are token ids as strings) and vLLM's
//! `repetition_penalty`, `min_tokens`, `prompt_logprobs` and `priority`;
//! `response_format` (`text`, `json_object`, `json_schema`) is structured
//! output. A known field Ember cannot honour is refused by name rather than
//! ignored (`best_of` above 1: vLLM V1 dropped it too), so nobody gets
//! silently different results. The values themselves are checked once, by
//! the service's validator, after translation.

use ember_common::pb;

use super::error::FieldNames;
use super::fields::{Fields, Result};
use crate::service::error::ServiceError;
use crate::service::structured;
use crate::service::GenerateOptions;

/// One prompt of a request: text, or token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    pub ids: Vec<u32>,
}

/// An OpenAI request translated into the service's request.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    /// What the gRPC door would have received for the same request, for
    /// each prompt once its prompt fields are set from `prompts`.
    pub request: pb::GenerateRequest,
    /// The request's prompts, in order (one for chat; completions take a
    /// list): each becomes one `generate` call of `n` choices.
    pub prompts: Vec<Prompt>,
    /// Completions' `echo`: every choice's text starts with its prompt.
    pub echo: bool,
    pub options: GenerateOptions,
    /// The shared fields (streaming, the model named).
    pub common: Common,
    /// How this request names the validator's fields.
    pub names: FieldNames,
}

/// OpenAI's default temperature (the gRPC API's unset is greedy).
pub const DEFAULT_TEMPERATURE: f32 = 1.0;

/// The shared fields, translated.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// The `model` the client named, if any (checked against the served name).
    pub model: Option<String>,
    pub sampling: pb::SamplingParams,
    pub stop: Vec<String>,
    /// `stop` came as one string (its errors then name `stop`, not `stop[0]`).
    pub stop_as_string: bool,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub stream: bool,
    /// `stream_options.include_usage`: a usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// vLLM's `priority` (lower first; 0 unless the server schedules by
    /// priority, which the validator checks).
    pub priority: i32,
    /// OpenAI's `n` (0 when absent: one).
    pub n: u32,
    /// vLLM's `prompt_logprobs`.
    pub prompt_logprobs: Option<u32>,
    /// `response_format`, when not plain text.
    pub response_format: Option<pb::ResponseFormat>,
}

/// Reads the shared fields of a completions or chat request.
pub fn common(f: &Fields) -> Result<Common> {
    refuse_unsupported(f)?;
    let top_k = f
        .integer("top_k", i128::from(i32::MIN), i128::from(i32::MAX))?
        .map(|k| k as i32);
    let seed = f
        .integer("seed", i128::from(i64::MIN), i128::from(u64::MAX))?
        // Negative seeds (OpenAI's seed is an int64) keep their bits.
        .map(|s| if s < 0 { s as i64 as u64 } else { s as u64 });
    let sampling = pb::SamplingParams {
        temperature: Some(f.f32("temperature")?.unwrap_or(DEFAULT_TEMPERATURE)),
        top_k,
        top_p: f.f32("top_p")?,
        min_p: f.f32("min_p")?,
        seed,
        repetition_penalty: f.f32("repetition_penalty")?,
        frequency_penalty: f.f32("frequency_penalty")?,
        presence_penalty: f.f32("presence_penalty")?,
        logit_bias: logit_bias(f)?,
        min_tokens: f.u32("min_tokens")?.unwrap_or(0),
    };
    let (stop, stop_as_string) = stop(f)?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        None => false,
        Some(_) if !stream => {
            return Err(ServiceError::invalid(
                "stream_options",
                "only allowed when stream is true",
            ))
        }
        Some(obj) => Fields::nested(obj, "stream_options")
            .bool("include_usage")?
            .unwrap_or(false),
    };
    Ok(Common {
        model: f.str("model")?.map(str::to_string),
        sampling,
        stop,
        stop_as_string,
        stop_token_ids: u32_list(f, "stop_token_ids")?,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        stream,
        include_usage,
        priority: f
            .integer("priority", i128::from(i32::MIN), i128::from(i32::MAX))?
            .map_or(0, |p| p as i32),
        n: f.u32("n")?.unwrap_or(0),
        prompt_logprobs: f.u32("prompt_logprobs")?,
        response_format: response_format(f)?,
    })
}

/// `logit_bias`: `{"<token id>": bias}`; errors name `logit_bias.<key>`.
fn logit_bias(f: &Fields) -> Result<std::collections::HashMap<u32, f32>> {
    let Some(map) = f.object("logit_bias")? else {
        return Ok(Default::default());
    };
    map.iter()
        .map(|(k, v)| {
            let field = format!("logit_bias.{k}");
            let token = k.parse::<u32>().map_err(|_| {
                ServiceError::invalid(field.clone(), "keys must be token ids (integers)")
            })?;
            let bias = v
                .as_f64()
                .ok_or_else(|| super::fields::wrong_type(field, "a number", v))?;
            Ok((token, bias as f32))
        })
        .collect()
}

/// `response_format` (OpenAI's shapes, read by
/// [`structured::parse_response_format`]); `None` for text.
fn response_format(f: &Fields) -> Result<Option<pb::ResponseFormat>> {
    match f.get("response_format") {
        None => Ok(None),
        Some(v) => Ok(structured::parse_response_format(v, "response_format")?.to_pb()),
    }
}

/// `stop`: a string or a list of strings.
fn stop(f: &Fields) -> Result<(Vec<String>, bool)> {
    let Some(v) = f.get("stop") else {
        return Ok((Vec::new(), false));
    };
    if let Some(s) = v.as_str() {
        return Ok((vec![s.to_string()], true));
    }
    let serde_json::Value::Array(list) = v else {
        return Err(super::fields::wrong_type(
            "stop",
            "a string or an array of strings",
            v,
        ));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        match item.as_str() {
            Some(s) => out.push(s.to_string()),
            None => {
                return Err(super::fields::wrong_type(
                    format!("stop[{i}]"),
                    "a string",
                    item,
                ))
            }
        }
    }
    Ok((out, false))
}

/// A list of token ids (`stop_token_ids`); errors name `field[i]`.
pub fn u32_list(f: &Fields, field: &str) -> Result<Vec<u32>> {
    let Some(list) = f.array(field)? else {
        return Ok(Vec::new());
    };
    ids(list, &f.name(field))
}

/// Token ids from a JSON array; errors name `name[i]`.
pub fn ids(list: &[serde_json::Value], name: &str) -> Result<Vec<u32>> {
    list.iter()
        .enumerate()
        .map(|(i, v)| match super::fields::as_integer(v) {
            Some(id) if (0..=i128::from(u32::MAX)).contains(&id) => Ok(id as u32),
            _ => Err(super::fields::wrong_type(
                format!("{name}[{i}]"),
                "a token id (an integer from 0 to 4294967295)",
                v,
            )),
        })
        .collect()
}

/// Fields OpenAI or vLLM define that Ember does not implement: their type is
/// checked, and any value but the neutral one is refused by name.
fn refuse_unsupported(f: &Fields) -> Result<()> {
    if let Some(n) = f.integer("best_of", i128::from(i64::MIN), i128::from(i64::MAX))? {
        if n > 1 {
            return Err(ServiceError::invalid(
                "best_of",
                format!(
                    "is not supported (vLLM V1 dropped it too): use n for several choices, got {n}"
                ),
            ));
        }
    }
    f.str("user")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Result<Common> {
        common(&Fields::new(v.as_object().unwrap()))
    }

    fn field_of(v: serde_json::Value) -> String {
        match parse(v.clone()).expect_err(&v.to_string()) {
            ServiceError::InvalidArgument { field, .. } => field.into_owned(),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn penalties_bias_n_and_formats_are_translated() {
        let c = parse(json!({
            "n": 3, "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
            "logit_bias": {"50256": -100, "13": 2.5}, "min_tokens": 3, "prompt_logprobs": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "object"}}}
        }))
        .unwrap();
        assert_eq!((c.n, c.prompt_logprobs), (3, Some(1)));
        let s = &c.sampling;
        assert_eq!(
            (
                s.presence_penalty,
                s.frequency_penalty,
                s.repetition_penalty,
                s.min_tokens
            ),
            (Some(0.5), Some(-1.0), Some(1.2), 3)
        );
        assert_eq!(s.logit_bias[&50256], -100.0);
        assert_eq!(s.logit_bias[&13], 2.5);
        assert_eq!(
            c.response_format,
            Some(pb::ResponseFormat {
                format: Some(pb::response_format::Format::JsonSchema(
                    r#"{"type":"object"}"#.into()
                ))
            })
        );
        assert_eq!(
            parse(json!({"response_format": {"type": "text"}}))
                .unwrap()
                .response_format,
            None
        );
    }

    #[test]
    fn defaults_are_openais() {
        let c = parse(json!({})).unwrap();
        assert_eq!(c.sampling.temperature, Some(1.0));
        assert_eq!(
            (c.sampling.top_p, c.sampling.top_k, c.sampling.seed),
            (None, None, None)
        );
        assert!(!c.stream && !c.include_usage && !c.ignore_eos);
        assert!(c.stop.is_empty() && c.stop_token_ids.is_empty() && c.model.is_none());
    }

    #[test]
    fn every_field_is_translated() {
        let c = parse(json!({
            "model": "gpt2", "temperature": 0, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 42,
            "stop": ["\n", "END"], "stop_token_ids": [50256, 13], "ignore_eos": true,
            "stream": true, "stream_options": {"include_usage": true}, "n": 1,
            "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1,
            "logit_bias": {}, "min_tokens": 0, "user": "u-1", "unknown_field": [1, 2]
        }))
        .unwrap();
        assert_eq!(c.model.as_deref(), Some("gpt2"));
        assert_eq!(
            c.sampling,
            pb::SamplingParams {
                temperature: Some(0.0),
                top_k: Some(7),
                top_p: Some(0.5),
                min_p: Some(0.1),
                seed: Some(42),
                repetition_penalty: Some(1.0),
                frequency_penalty: Some(0.0),
                presence_penalty: Some(0.0),
                ..Default::default()
            }
        );
        assert_eq!(c.stop, vec!["\n".to_string(), "END".into()]);
        assert!(!c.stop_as_string);
        assert_eq!(c.stop_token_ids, vec![50256, 13]);
        assert!(c.ignore_eos && c.stream && c.include_usage);
        let s = parse(json!({"stop": "###", "top_k": -1, "seed": -1})).unwrap();
        assert_eq!((s.stop, s.stop_as_string), (vec!["###".to_string()], true));
        assert_eq!(s.sampling.top_k, Some(-1), "vLLM's -1 (no limit) as it is");
        assert_eq!(s.sampling.seed, Some(u64::MAX));
        // Out-of-range values pass through to the one validator.
        assert_eq!(
            parse(json!({"top_k": -5})).unwrap().sampling.top_k,
            Some(-5)
        );
        assert_eq!(
            parse(json!({"temperature": -1}))
                .unwrap()
                .sampling
                .temperature,
            Some(-1.0)
        );
    }

    #[test]
    fn wrong_types_and_unsupported_values_name_the_field() {
        for (body, field) in [
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"temperature": 1e300}), "temperature"),
            (json!({"top_p": [1]}), "top_p"),
            (json!({"top_k": 1.5}), "top_k"),
            (json!({"top_k": 1e12}), "top_k"),
            (json!({"min_p": "low"}), "min_p"),
            (json!({"seed": "1"}), "seed"),
            (json!({"stop": 5}), "stop"),
            (json!({"stop": ["a", 5]}), "stop[1]"),
            (json!({"stop_token_ids": 5}), "stop_token_ids"),
            (json!({"stop_token_ids": [1, -2]}), "stop_token_ids[1]"),
            (json!({"ignore_eos": "yes"}), "ignore_eos"),
            (json!({"stream": 1}), "stream"),
            (
                json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
            (
                json!({"stream": true, "stream_options": true}),
                "stream_options",
            ),
            (
                json!({"stream": true, "stream_options": {"include_usage": 1}}),
                "stream_options.include_usage",
            ),
            (json!({"n": "1"}), "n"),
            (json!({"n": -1}), "n"),
            (json!({"best_of": 2}), "best_of"),
            (json!({"presence_penalty": "0.5"}), "presence_penalty"),
            (json!({"logit_bias": {"eos": -100}}), "logit_bias.eos"),
            (json!({"logit_bias": {"5": "x"}}), "logit_bias.5"),
            (json!({"logit_bias": []}), "logit_bias"),
            (json!({"min_tokens": -3}), "min_tokens"),
            (json!({"prompt_logprobs": -1}), "prompt_logprobs"),
            (
                json!({"response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format.json_schema.schema",
            ),
            (json!({"user": 7}), "user"),
            (json!({"model": 7}), "model"),
        ] {
            assert_eq!(field_of(body.clone()), field, "{body}");
        }
    }
}
