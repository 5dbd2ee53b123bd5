//! `POST /v1/chat/completions`: OpenAI's chat request, rendered into a prompt
//! with Ember's plain chat template and translated into the service's
//! `GenerateRequest`.
//!
//! GPT-2 has no chat template, so Ember applies one documented, plain one
//! ([`render`]): each message becomes a `role: content` line, and the prompt
//! ends with `assistant:`, which the model continues. Roles are `system`,
//! `developer`, `user` and `assistant`; `content` is a string or an array of
//! `{"type": "text", "text": ...}` parts (joined). Nothing is added to
//! `stop`: a client that wants the reply to end at the next turn sends
//! `"stop": ["\nuser:"]`.
//!
//! The generation limit is `max_completion_tokens`, else the older
//! `max_tokens`; with neither, the reply may run to the end of the model's
//! context (capped by `--max-new-tokens-limit`), as in OpenAI's and vLLM's
//! chat APIs. `logprobs: true` with `top_logprobs: n` asks for logprobs;
//! tools are refused by name.

use ember_common::pb;
use serde_json::{Map, Value};

use super::error::FieldNames;
use super::fields::{wrong_type, Fields, Result};
use super::params::{self, Prompt, Translated};
use crate::scheduler::SchedulerKnobs;
use crate::service::error::ServiceError;
use crate::service::GenerateOptions;

/// Roles the template knows.
pub const ROLES: [&str; 4] = ["system", "developer", "user", "assistant"];

/// What the prompt ends with: the model writes the assistant's turn.
pub const ASSISTANT_PREFIX: &str = "assistant:";

/// One chat message, as the template sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// Ember's chat template: `role: content` per message, one per line, then
/// `assistant:`.
pub fn render(messages: &[Message]) -> String {
    let mut prompt = String::new();
    for m in messages {
        prompt.push_str(&m.role);
        prompt.push_str(": ");
        prompt.push_str(&m.content);
        prompt.push('\n');
    }
    prompt.push_str(ASSISTANT_PREFIX);
    prompt
}

/// Translates a chat body; `knobs` bound the default generation limit.
pub fn translate(obj: &Map<String, Value>, knobs: &SchedulerKnobs) -> Result<Translated> {
    let f = Fields::new(obj);
    let common = params::common(&f)?;
    let messages = messages(&f)?;
    refuse_tools(&f)?;
    let (limit, max_tokens_name, fit) =
        match (f.u32("max_completion_tokens")?, f.u32("max_tokens")?) {
            (Some(n), _) => (n, "max_completion_tokens", false),
            (None, Some(n)) => (n, "max_tokens", false),
            // Up to the context, found once the prompt is tokenized.
            (None, None) => (knobs.max_new_tokens_limit as u32, "messages", true),
        };
    let want_logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.u32("top_logprobs")?;
    if top.is_some_and(|n| n > 0) && !want_logprobs {
        return Err(ServiceError::invalid(
            "top_logprobs",
            "needs \"logprobs\": true",
        ));
    }
    let request = pb::GenerateRequest {
        request_id: String::new(),
        prompt: String::new(),
        prompt_token_ids: Vec::new(),
        max_new_tokens: limit,
        ignore_eos: common.ignore_eos,
        sampling: Some(common.sampling.clone()),
        stop: common.stop.clone(),
        stop_token_ids: common.stop_token_ids.clone(),
        logprobs: want_logprobs.then_some(top.unwrap_or(0)),
        priority: common.priority,
        n: common.n,
        prompt_logprobs: common.prompt_logprobs,
        response_format: common.response_format.clone(),
    };
    let prompts = vec![Prompt {
        text: render(&messages),
        ids: Vec::new(),
    }];
    let names = FieldNames {
        prompt: "messages",
        max_tokens: max_tokens_name,
        logprobs: "top_logprobs",
        stop_as_string: common.stop_as_string,
    };
    Ok(Translated {
        request,
        prompts,
        echo: false,
        options: GenerateOptions {
            fit_to_context: fit,
            first_choice: 0,
        },
        common,
        names,
    })
}

/// `messages`: a non-empty array of `{role, content}` (also read by
/// `/tokenize`).
pub fn messages(f: &Fields) -> Result<Vec<Message>> {
    let Some(list) = f.array("messages")? else {
        return Err(ServiceError::invalid("messages", "is required"));
    };
    if list.is_empty() {
        return Err(ServiceError::invalid(
            "messages",
            "must hold at least one message",
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let name = format!("messages[{i}]");
            let obj = m
                .as_object()
                .ok_or_else(|| wrong_type(name.clone(), "an object", m))?;
            let mf = Fields::nested(obj, &name);
            let role = mf
                .str("role")?
                .ok_or_else(|| ServiceError::invalid(mf.name("role"), "is required"))?;
            if !ROLES.contains(&role) {
                return Err(ServiceError::invalid(
                    mf.name("role"),
                    format!("must be one of {}, got {role:?}", ROLES.join(", ")),
                ));
            }
            Ok(Message {
                role: role.to_string(),
                content: content(&mf)?,
            })
        })
        .collect()
}

/// A message's `content`: a string, or text parts joined.
fn content(mf: &Fields) -> Result<String> {
    let name = mf.name("content");
    match mf.get("content") {
        None => Err(ServiceError::invalid(name, "is required")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let part_name = format!("{name}[{j}]");
                let obj = part
                    .as_object()
                    .ok_or_else(|| wrong_type(part_name.clone(), "an object", part))?;
                let pf = Fields::nested(obj, &part_name);
                match pf.str("type")? {
                    Some("text") => {}
                    other => {
                        return Err(ServiceError::invalid(
                            pf.name("type"),
                            format!("only \"text\" parts are supported, got {other:?}"),
                        ))
                    }
                }
                let piece = pf
                    .str("text")?
                    .ok_or_else(|| ServiceError::invalid(pf.name("text"), "is required"))?;
                text.push_str(piece);
            }
            Ok(text)
        }
        Some(other) => Err(wrong_type(
            name,
            "a string or an array of text parts",
            other,
        )),
    }
}

/// Tools are not implemented: refused by name.
fn refuse_tools(f: &Fields) -> Result<()> {
    if f.array("tools")?.is_some_and(|t| !t.is_empty()) {
        return Err(ServiceError::invalid("tools", "are not supported"));
    }
    if f.array("functions")?.is_some_and(|t| !t.is_empty()) {
        return Err(ServiceError::invalid("functions", "are not supported"));
    }
    if let Some(v) = f.get("tool_choice") {
        if v.as_str() != Some("none") && v.as_str() != Some("auto") {
            return Err(ServiceError::invalid(
                "tool_choice",
                "only \"none\" or \"auto\" (with no tools) is supported",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::SchedulingPolicy;
    use serde_json::json;

    fn knobs() -> SchedulerKnobs {
        SchedulerKnobs {
            max_batch_size: 8,
            prefill_max_batch_size: 8,
            prefill_max_tokens: 512,
            max_pending: 16,
            max_new_tokens_limit: 256,
            policy: SchedulingPolicy::Fcfs,
            async_scheduling: true,
        }
    }

    fn translate_json(v: Value) -> Result<Translated> {
        translate(v.as_object().unwrap(), &knobs())
    }

    fn field_of(v: Value) -> String {
        match translate_json(v.clone()).expect_err(&v.to_string()) {
            ServiceError::InvalidArgument { field, .. } => field.into_owned(),
            other => panic!("{other}"),
        }
    }

    fn hello() -> Value {
        json!([{"role": "user", "content": "Hello"}])
    }

    #[test]
    fn the_template_is_role_lines_then_assistant() {
        let m = |role: &str, content: &str| Message {
            role: role.into(),
            content: content.into(),
        };
        assert_eq!(
            render(&[
                m("system", "Be brief."),
                m("user", "Hi\nthere"),
                m("assistant", "Hello."),
                m("user", "Bye")
            ]),
            "system: Be brief.\nuser: Hi\nthere\nassistant: Hello.\nuser: Bye\nassistant:"
        );
        assert_eq!(render(&[m("user", "")]), "user: \nassistant:");
    }

    #[test]
    fn a_chat_request_becomes_the_grpc_request() {
        let t = translate_json(json!({
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}], "name": "bob"}
            ],
            "max_completion_tokens": 12, "max_tokens": 99, "temperature": 0, "logprobs": true,
            "top_logprobs": 3, "stop": "\nuser:", "tools": [], "tool_choice": "none",
            "response_format": {"type": "text"}, "stream": false
        }))
        .unwrap();
        assert_eq!(
            t.prompts[0].text,
            "system: Be brief.\nuser: Hi there\nassistant:"
        );
        assert_eq!(t.request.max_new_tokens, 12, "max_completion_tokens wins");
        assert_eq!(t.request.logprobs, Some(3));
        assert_eq!(t.request.stop, vec!["\nuser:".to_string()]);
        assert_eq!(t.names.max_tokens, "max_completion_tokens");
        assert_eq!(
            (t.names.prompt, t.names.logprobs),
            ("messages", "top_logprobs")
        );
        assert!(!t.options.fit_to_context);

        let t = translate_json(json!({"messages": hello(), "max_tokens": 5})).unwrap();
        assert_eq!(
            (t.request.max_new_tokens, t.names.max_tokens),
            (5, "max_tokens")
        );
        assert_eq!(t.request.logprobs, None);
        assert_eq!(t.request.sampling.unwrap().temperature, Some(1.0));

        // No limit: up to the context, at most --max-new-tokens-limit.
        let t = translate_json(json!({"messages": hello()})).unwrap();
        assert!(t.options.fit_to_context);
        assert_eq!(t.request.max_new_tokens, 256);
        assert_eq!(t.names.max_tokens, "messages");

        let t = translate_json(json!({"messages": hello(), "logprobs": true})).unwrap();
        assert_eq!(t.request.logprobs, Some(0));
    }

    #[test]
    fn bad_fields_are_named() {
        for (body, field) in [
            (json!({}), "messages"),
            (json!({"messages": []}), "messages"),
            (json!({"messages": "hi"}), "messages"),
            (json!({"messages": ["hi"]}), "messages[0]"),
            (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": 1, "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user"}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": 5}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": ["x"]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
                "messages[0].content[0].text",
            ),
            (
                json!({"messages": hello(), "max_completion_tokens": "5"}),
                "max_completion_tokens",
            ),
            (json!({"messages": hello(), "max_tokens": -5}), "max_tokens"),
            (json!({"messages": hello(), "logprobs": 3}), "logprobs"),
            (
                json!({"messages": hello(), "top_logprobs": 2}),
                "top_logprobs",
            ),
            (
                json!({"messages": hello(), "logprobs": true, "top_logprobs": "2"}),
                "top_logprobs",
            ),
            (
                json!({"messages": hello(), "tools": [{"type": "function"}]}),
                "tools",
            ),
            (
                json!({"messages": hello(), "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"messages": hello(), "response_format": {"type": "yaml"}}),
                "response_format.type",
            ),
            (json!({"messages": hello(), "n": "2"}), "n"),
            (json!({"messages": hello(), "stream": "yes"}), "stream"),
        ] {
            assert_eq!(field_of(body.clone()), field, "{body}");
        }
    }
}
