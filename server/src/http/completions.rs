//! `POST /v1/completions`: OpenAI's (legacy) completions request, translated
//! into the service's `GenerateRequest`.
//!
//! `prompt` is a string, an array of token ids, or a list of either (at most
//! [`MAX_PROMPTS`]): one choice per prompt (times `n`), in order.
//! `max_tokens` defaults to 16, as OpenAI's and vLLM's do; with `echo` it may
//! be 0 (the prompt scored, nothing generated). `logprobs` is the legacy
//! integer (0 to 20 alternatives); with `echo` the prompt's tokens get theirs
//! too (the first has none), computed by the prefill. `suffix` exists only
//! in its neutral form. Everything shared with chat is in [`super::params`].

use ember_common::pb;
use serde_json::{Map, Value};

use super::error::FieldNames;
use super::fields::{wrong_type, Fields, Result};
use super::params::{self, Prompt, Translated};
use crate::service::error::ServiceError;
use crate::service::GenerateOptions;

/// OpenAI's and vLLM's default `max_tokens` for completions.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// Translates a completions body.
pub fn translate(obj: &Map<String, Value>) -> Result<Translated> {
    let f = Fields::new(obj);
    let common = params::common(&f)?;
    let prompts = prompts(&f)?;
    let echo = f.bool("echo")?.unwrap_or(false);
    if f.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ServiceError::invalid("suffix", "is not supported"));
    }
    let logprobs = f.u32("logprobs")?;
    let max_new_tokens = f.u32("max_tokens")?.unwrap_or(DEFAULT_MAX_TOKENS);
    // Echoing the prompt with logprobs, or with nothing to generate, needs
    // the prompt's own logprobs from the prefill.
    let echo_scores = match (echo, logprobs, max_new_tokens) {
        (true, Some(n), _) => Some(n),
        (true, None, 0) => Some(0),
        _ => None,
    };
    let request = pb::GenerateRequest {
        request_id: String::new(),
        prompt: String::new(),
        prompt_token_ids: Vec::new(),
        max_new_tokens,
        ignore_eos: common.ignore_eos,
        sampling: Some(common.sampling.clone()),
        stop: common.stop.clone(),
        stop_token_ids: common.stop_token_ids.clone(),
        logprobs,
        priority: common.priority,
        n: common.n,
        prompt_logprobs: common.prompt_logprobs.max(echo_scores),
        response_format: common.response_format.clone(),
    };
    let names = FieldNames {
        prompt: "prompt",
        max_tokens: "max_tokens",
        logprobs: "logprobs",
        stop_as_string: common.stop_as_string,
    };
    Ok(Translated {
        request,
        prompts,
        echo,
        options: GenerateOptions::default(),
        common,
        names,
    })
}

/// Most prompts in one completions request.
pub const MAX_PROMPTS: usize = 256;

/// `prompt`: text, token ids, or a list of either. An empty one passes
/// through to the validator, which refuses it.
fn prompts(f: &Fields) -> Result<Vec<Prompt>> {
    let expected = "a string, an array of token ids, or a list of either";
    let Some(v) = f.get("prompt") else {
        return Err(ServiceError::invalid("prompt", "is required"));
    };
    let text = |s: &str| Prompt {
        text: s.to_string(),
        ids: Vec::new(),
    };
    let list = match v {
        Value::String(s) => return Ok(vec![text(s)]),
        Value::Array(list) => list,
        other => return Err(wrong_type("prompt", expected, other)),
    };
    let a_list = matches!(list.first(), Some(Value::String(_) | Value::Array(_)));
    if a_list && list.len() > MAX_PROMPTS {
        return Err(ServiceError::invalid(
            "prompt",
            format!(
                "at most {MAX_PROMPTS} prompts per request, got {}",
                list.len()
            ),
        ));
    }
    match list.first() {
        Some(Value::String(_) | Value::Array(_)) => list
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(text(s)),
                Value::Array(ids) => Ok(Prompt {
                    text: String::new(),
                    ids: params::ids(ids, &format!("prompt[{i}]"))?,
                }),
                other => Err(wrong_type(
                    format!("prompt[{i}]"),
                    "a string or an array of token ids",
                    other,
                )),
            })
            .collect(),
        _ => Ok(vec![Prompt {
            text: String::new(),
            ids: params::ids(list, "prompt")?,
        }]),
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
            "stream_options": {"include_usage": true}, "n": 2, "echo": false,
            "suffix": null, "best_of": 1, "frequency_penalty": 0.5
        }))
        .unwrap();
        assert_eq!(
            t.request,
            pb::GenerateRequest {
                request_id: String::new(),
                prompt: String::new(),
                prompt_token_ids: vec![],
                max_new_tokens: 8,
                ignore_eos: true,
                sampling: Some(pb::SamplingParams {
                    temperature: Some(0.0),
                    top_k: Some(5),
                    top_p: Some(0.9),
                    seed: Some(3),
                    frequency_penalty: Some(0.5),
                    ..Default::default()
                }),
                stop: vec!["\n".into()],
                stop_token_ids: vec![13],
                logprobs: Some(2),
                priority: 0,
                n: 2,
                prompt_logprobs: None,
                response_format: None,
            }
        );
        assert_eq!(
            t.prompts,
            [Prompt {
                text: "Hello".into(),
                ids: vec![]
            }]
        );
        assert!(t.common.stream && t.common.include_usage && !t.echo);
        assert_eq!(t.options, GenerateOptions::default());
        assert_eq!(t.names.max_tokens, "max_tokens");
    }

    #[test]
    fn prompts_are_text_token_ids_or_lists_of_either() {
        let p = |v: Value| translate_json(json!({ "prompt": v })).unwrap().prompts;
        let text = |s: &str| Prompt {
            text: s.into(),
            ids: vec![],
        };
        let ids = |i: &[u32]| Prompt {
            text: String::new(),
            ids: i.to_vec(),
        };
        assert_eq!(p(json!("hi")), [text("hi")]);
        assert_eq!(p(json!([1, 2, 3])), [ids(&[1, 2, 3])]);
        assert_eq!(p(json!(["hi", "yo"])), [text("hi"), text("yo")]);
        assert_eq!(p(json!([[4, 5], [6]])), [ids(&[4, 5]), ids(&[6])]);
        // Empty: left to the validator, which refuses it naming `prompt`.
        assert_eq!(p(json!([])), [ids(&[])]);
        let r = translate_json(json!({"prompt": "x"})).unwrap().request;
        assert_eq!(r.max_new_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(r.logprobs, None);
    }

    #[test]
    fn echo_asks_for_the_prompts_logprobs_when_it_needs_them() {
        let t = |v: Value| translate_json(v).unwrap();
        let e = t(json!({"prompt": "x", "echo": true, "logprobs": 1, "max_tokens": 0}));
        assert!(e.echo);
        assert_eq!(
            (e.request.prompt_logprobs, e.request.max_new_tokens),
            (Some(1), 0)
        );
        let e = t(json!({"prompt": "x", "echo": true, "max_tokens": 0}));
        assert_eq!(e.request.prompt_logprobs, Some(0));
        let e = t(json!({"prompt": "x", "echo": true}));
        assert_eq!(e.request.prompt_logprobs, None, "the prompt's text alone");
        let e = t(json!({"prompt": "x", "prompt_logprobs": 3}));
        assert_eq!(e.request.prompt_logprobs, Some(3));
    }

    #[test]
    fn bad_fields_are_named() {
        for (body, field) in [
            (json!({}), "prompt"),
            (json!({"prompt": 5}), "prompt"),
            (json!({"prompt": {"text": "x"}}), "prompt"),
            (json!({"prompt": ["a", 5]}), "prompt[1]"),
            (json!({"prompt": [[1], [-2]]}), "prompt[1][0]"),
            (json!({"prompt": [1, "x"]}), "prompt[1]"),
            (json!({"prompt": [1, -1]}), "prompt[1]"),
            (json!({"prompt": [[1, 2.5]]}), "prompt[0][1]"),
            (json!({"prompt": "x", "max_tokens": "8"}), "max_tokens"),
            (json!({"prompt": "x", "max_tokens": -1}), "max_tokens"),
            (json!({"prompt": "x", "logprobs": true}), "logprobs"),
            (json!({"prompt": "x", "logprobs": -1}), "logprobs"),
            (json!({"prompt": "x", "echo": "no"}), "echo"),
            (json!({"prompt": "x", "suffix": "tail"}), "suffix"),
            (json!({"prompt": "x", "best_of": 3}), "best_of"),
            (json!({"prompt": "x", "temperature": "0"}), "temperature"),
        ] {
            assert_eq!(field_of(body.clone()), field, "{body}");
        }
        let many = vec!["p"; MAX_PROMPTS + 1];
        assert_eq!(field_of(json!({ "prompt": many })), "prompt");
    }
}
