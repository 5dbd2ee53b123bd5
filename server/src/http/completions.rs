//! `POST /v1/completions`: OpenAI's (legacy) completions request, translated
//! into the service's `GenerateRequest`.
//!
//! `prompt` is a string or an array of token ids (a one-element array of
//! either is taken too; batches of prompts are refused by name: send one
//! request per prompt). `max_tokens` defaults to 16, as OpenAI's and vLLM's
//! do. `logprobs` is the legacy integer (0 to 20 alternatives). `echo`,
//! `suffix` and `best_of` exist only in their neutral form. Everything
//! shared with chat is in [`super::params`].

use ember_common::pb;
use serde_json::{Map, Value};

use super::error::FieldNames;
use super::fields::{wrong_type, Fields, Result};
use super::params::{self, Translated};
use crate::service::error::ServiceError;
use crate::service::GenerateOptions;

/// OpenAI's and vLLM's default `max_tokens` for completions.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// Translates a completions body.
pub fn translate(obj: &Map<String, Value>) -> Result<Translated> {
    let f = Fields::new(obj);
    let common = params::common(&f)?;
    let (prompt, prompt_token_ids) = prompt(&f)?;
    if f.bool("echo")? == Some(true) {
        return Err(ServiceError::invalid(
            "echo",
            "is not supported: only false (the prompt is not sent back)",
        ));
    }
    if f.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ServiceError::invalid("suffix", "is not supported"));
    }
    if let Some(n) = f.integer("best_of", i128::from(i64::MIN), i128::from(i64::MAX))? {
        if n != 1 {
            return Err(ServiceError::invalid(
                "best_of",
                format!("only best_of = 1 is supported, got {n}"),
            ));
        }
    }
    let request = pb::GenerateRequest {
        request_id: String::new(),
        prompt,
        prompt_token_ids,
        max_new_tokens: f.u32("max_tokens")?.unwrap_or(DEFAULT_MAX_TOKENS),
        ignore_eos: common.ignore_eos,
        sampling: Some(common.sampling),
        stop: common.stop.clone(),
        stop_token_ids: common.stop_token_ids.clone(),
        logprobs: f.u32("logprobs")?,
        priority: common.priority,
    };
    let names = FieldNames {
        prompt: "prompt",
        max_tokens: "max_tokens",
        logprobs: "logprobs",
        stop_as_string: common.stop_as_string,
    };
    Ok(Translated {
        request,
        options: GenerateOptions::default(),
        common,
        names,
    })
}

/// `prompt`: text, or token ids. An empty one passes through to the
/// validator, which refuses it.
fn prompt(f: &Fields) -> Result<(String, Vec<u32>)> {
    let expected = "a string or an array of token ids";
    let Some(v) = f.get("prompt") else {
        return Err(ServiceError::invalid("prompt", "is required"));
    };
    let list = match v {
        Value::String(s) => return Ok((s.clone(), Vec::new())),
        Value::Array(list) => list,
        other => return Err(wrong_type("prompt", expected, other)),
    };
    match list.first() {
        Some(Value::String(_)) | Some(Value::Array(_)) if list.len() > 1 => {
            Err(ServiceError::invalid(
                "prompt",
                format!(
                    "{} prompts in one request are not supported: send one request per prompt",
                    list.len()
                ),
            ))
        }
        Some(Value::String(s)) => Ok((s.clone(), Vec::new())),
        Some(Value::Array(ids)) => Ok((String::new(), params::ids(ids, "prompt[0]")?)),
        _ => Ok((String::new(), params::ids(list, "prompt")?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn translate_json(v: Value) -> Result<Translated> {
        translate(v.as_object().unwrap())
    }

    fn field_of(v: Value) -> String {
        match translate_json(v.clone()).expect_err(&v.to_string()) {
            ServiceError::InvalidArgument { field, .. } => field.into_owned(),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_full_request_becomes_the_grpc_request() {
        let t = translate_json(json!({
            "model": "tiny", "prompt": "Hello", "max_tokens": 8, "temperature": 0,
            "top_p": 0.9, "top_k": 5, "seed": 3, "stop": ["\n"], "stop_token_ids": [13],
            "logprobs": 2, "ignore_eos": true, "stream": true,
            "stream_options": {"include_usage": true}, "n": 1, "echo": false,
            "suffix": null, "best_of": 1
        }))
        .unwrap();
        assert_eq!(
            t.request,
            pb::GenerateRequest {
                request_id: String::new(),
                prompt: "Hello".into(),
                prompt_token_ids: vec![],
                max_new_tokens: 8,
                ignore_eos: true,
                sampling: Some(pb::SamplingParams {
                    temperature: Some(0.0),
                    top_k: Some(5),
                    top_p: Some(0.9),
                    seed: Some(3),
                }),
                stop: vec!["\n".into()],
                stop_token_ids: vec![13],
                logprobs: Some(2),
                priority: 0,
            }
        );
        assert!(t.common.stream && t.common.include_usage);
        assert_eq!(t.options, GenerateOptions::default());
        assert_eq!(t.names.max_tokens, "max_tokens");
    }

    #[test]
    fn prompts_are_text_or_token_ids() {
        let p = |v: Value| {
            let r = translate_json(json!({ "prompt": v })).unwrap().request;
            (r.prompt, r.prompt_token_ids)
        };
        assert_eq!(p(json!("hi")), ("hi".into(), vec![]));
        assert_eq!(p(json!([1, 2, 3])), (String::new(), vec![1, 2, 3]));
        assert_eq!(p(json!(["hi"])), ("hi".into(), vec![]));
        assert_eq!(p(json!([[4, 5]])), (String::new(), vec![4, 5]));
        // Empty: left to the validator, which refuses it naming `prompt`.
        assert_eq!(p(json!([])), (String::new(), vec![]));
        let r = translate_json(json!({"prompt": "x"})).unwrap().request;
        assert_eq!(r.max_new_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(r.logprobs, None);
    }

    #[test]
    fn bad_fields_are_named() {
        for (body, field) in [
            (json!({}), "prompt"),
            (json!({"prompt": 5}), "prompt"),
            (json!({"prompt": {"text": "x"}}), "prompt"),
            (json!({"prompt": ["a", "b"]}), "prompt"),
            (json!({"prompt": [[1], [2]]}), "prompt"),
            (json!({"prompt": [1, "x"]}), "prompt[1]"),
            (json!({"prompt": [1, -1]}), "prompt[1]"),
            (json!({"prompt": [[1, 2.5]]}), "prompt[0][1]"),
            (json!({"prompt": "x", "max_tokens": "8"}), "max_tokens"),
            (json!({"prompt": "x", "max_tokens": -1}), "max_tokens"),
            (json!({"prompt": "x", "logprobs": true}), "logprobs"),
            (json!({"prompt": "x", "logprobs": -1}), "logprobs"),
            (json!({"prompt": "x", "echo": true}), "echo"),
            (json!({"prompt": "x", "echo": "no"}), "echo"),
            (json!({"prompt": "x", "suffix": "tail"}), "suffix"),
            (json!({"prompt": "x", "best_of": 3}), "best_of"),
            (json!({"prompt": "x", "n": 3}), "n"),
            (json!({"prompt": "x", "temperature": "0"}), "temperature"),
        ] {
            assert_eq!(field_of(body.clone()), field, "{body}");
        }
    }
}
