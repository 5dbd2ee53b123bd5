//! vLLM's tokenizer routes: `POST /tokenize`, `POST /detokenize` and
//! `GET /tokenizer_info` (outside `/v1`, as vLLM serves them; behind the API
//! key like `/v1`, where vLLM leaves them open).
//!
//! - `/tokenize`: `{"prompt": TEXT}` or `{"messages": [...]}` (rendered with
//!   the chat endpoint's template, [`chat::render`]; without its closing
//!   `assistant:` when `add_generation_prompt` is false) ->
//!   `{"count", "max_model_len", "tokens", "token_strs"}`; `token_strs` (the
//!   vocabulary's pieces, `Ġworld`) only with `"return_token_strs": true`.
//!   `add_special_tokens` is accepted: GPT-2 adds none either way.
//! - `/detokenize`: `{"tokens": [ids]}` -> `{"prompt": TEXT}`.
//! - `/tokenizer_info`: what lm-evaluation-harness's remote tokenizer reads
//!   (`eos_token`, `bos_token`, the chat template as Jinja, ...).
//!
//! A `model` other than the served one is a 404, as on `/v1`; a wrong type
//! or an id outside the vocabulary a 400 naming the field.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_common::tokenizer::GPT2_EOS_TOKEN;
use serde_json::{json, Map, Value};

use super::app::App;
use super::chat;
use super::error::HttpError;
use super::fields::{self, as_integer, wrong_type, Fields};
use super::handlers::read_body;
use crate::service::error::ServiceError;
use crate::service::tokens;

/// Ember's chat template ([`chat::render`]) in Jinja, for clients that
/// render chats themselves from `/tokenizer_info`.
pub const CHAT_TEMPLATE_JINJA: &str = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";

/// `POST /tokenize`.
pub async fn tokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    respond(tokenize_body(&app, &headers, body).await)
}

/// `POST /detokenize`.
pub async fn detokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    respond(detokenize_body(&app, &headers, body).await)
}

/// `GET /tokenizer_info`.
pub async fn tokenizer_info(State(app): State<Arc<App>>) -> Response {
    let max_len = app.frontend.state().max_model_len();
    Json(json!({
        "tokenizer_class": "GPT2TokenizerFast",
        "eos_token": GPT2_EOS_TOKEN,
        "bos_token": GPT2_EOS_TOKEN,
        "unk_token": GPT2_EOS_TOKEN,
        "pad_token": null,
        "add_bos_token": false,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE_JINJA,
    }))
    .into_response()
}

fn respond(result: Result<Value, HttpError>) -> Response {
    match result {
        Ok(body) => Json(body).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The body as a JSON object, with its `model` (if any) the served one.
async fn read_object(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<Map<String, Value>, HttpError> {
    let bytes = read_body(headers, body)
        .await
        .map_err(|(err, status)| HttpError {
            status,
            ..HttpError::from_service(&err, None)
        })?;
    let obj = fields::parse_body(&bytes).map_err(refused)?;
    if let Some(asked) = Fields::new(&obj).str("model").map_err(refused)? {
        if asked != app.model_name {
            return Err(refused(ServiceError::ModelNotFound {
                asked: asked.to_string(),
                served: app.model_name.clone(),
            }));
        }
    }
    Ok(obj)
}

fn refused(err: ServiceError) -> HttpError {
    HttpError::from_service(&err, None)
}

async fn tokenize_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Value, HttpError> {
    let obj = read_object(app, headers, body).await?;
    let text = text_of(&Fields::new(&obj)).map_err(refused)?;
    let f = Fields::new(&obj);
    f.bool("add_special_tokens").map_err(refused)?;
    let want_strs = f
        .bool("return_token_strs")
        .map_err(refused)?
        .unwrap_or(false);
    let state = app.frontend.state();
    let t = tokens::tokenize(state, text).await.map_err(refused)?;
    let strs = want_strs.then(|| {
        t.ids
            .iter()
            .map(|&id| state.tokenizer.token_piece(id).unwrap_or_default())
            .collect::<Vec<_>>()
    });
    Ok(json!({
        "count": t.ids.len(),
        "max_model_len": t.max_model_len,
        "tokens": t.ids,
        "token_strs": strs,
    }))
}

/// The text to tokenize: `prompt`, or the rendered `messages`.
fn text_of(f: &Fields) -> fields::Result<String> {
    match (f.get("prompt"), f.get("messages")) {
        (Some(_), Some(_)) => Err(ServiceError::invalid(
            "messages",
            "send either \"prompt\" or \"messages\", not both",
        )),
        (Some(_), None) => Ok(f.str("prompt")?.unwrap_or_default().to_string()),
        (None, Some(_)) => {
            let rendered = chat::render(&chat::messages(f)?);
            if f.bool("add_generation_prompt")?.unwrap_or(true) {
                Ok(rendered)
            } else {
                let open = rendered.len() - chat::ASSISTANT_PREFIX.len();
                Ok(rendered[..open].to_string())
            }
        }
        (None, None) => Err(ServiceError::invalid(
            "prompt",
            "is required (or \"messages\")",
        )),
    }
}

async fn detokenize_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Value, HttpError> {
    let obj = read_object(app, headers, body).await?;
    let ids = token_ids(&Fields::new(&obj)).map_err(refused)?;
    let prompt = tokens::detokenize(app.frontend.state(), &ids, "tokens").map_err(refused)?;
    Ok(json!({ "prompt": prompt }))
}

/// `tokens`: a list of non-negative integers (the vocabulary is checked by
/// the service).
fn token_ids(f: &Fields) -> fields::Result<Vec<u32>> {
    let list = f
        .array("tokens")?
        .ok_or_else(|| ServiceError::invalid("tokens", "is required"))?;
    list.iter()
        .enumerate()
        .map(|(i, v)| match as_integer(v) {
            Some(id) if (0..=i128::from(u32::MAX)).contains(&id) => Ok(id as u32),
            _ => Err(wrong_type(format!("tokens[{i}]"), "a token id", v)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: Value) -> fields::Result<String> {
        text_of(&Fields::new(v.as_object().unwrap()))
    }

    fn field_of(err: ServiceError) -> String {
        match err {
            ServiceError::InvalidArgument { field, .. } => field.into_owned(),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn prompt_or_messages_rendered_as_the_chat_endpoint_does() {
        assert_eq!(text(json!({"prompt": "Hello"})).unwrap(), "Hello");
        let messages = json!([{"role": "user", "content": "Hi"}]);
        assert_eq!(
            text(json!({ "messages": messages })).unwrap(),
            "user: Hi\nassistant:"
        );
        assert_eq!(
            text(json!({"messages": messages, "add_generation_prompt": false})).unwrap(),
            "user: Hi\n"
        );
        for (body, field) in [
            (json!({}), "prompt"),
            (json!({"prompt": 3}), "prompt"),
            (json!({"prompt": "a", "messages": messages}), "messages"),
            (
                json!({"messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": messages, "add_generation_prompt": "no"}),
                "add_generation_prompt",
            ),
        ] {
            assert_eq!(field_of(text(body.clone()).unwrap_err()), field, "{body}");
        }
    }

    #[test]
    fn token_ids_name_the_bad_entry() {
        let ids = |v: Value| token_ids(&Fields::new(v.as_object().unwrap()));
        assert_eq!(
            ids(json!({"tokens": [1, 2.0, 50256]})).unwrap(),
            vec![1, 2, 50256]
        );
        for (body, field) in [
            (json!({}), "tokens"),
            (json!({"tokens": "1 2"}), "tokens"),
            (json!({"tokens": [1, -2]}), "tokens[1]"),
            (json!({"tokens": [1, "x"]}), "tokens[1]"),
        ] {
            assert_eq!(field_of(ids(body.clone()).unwrap_err()), field, "{body}");
        }
    }

    #[test]
    fn the_jinja_template_says_what_render_does() {
        // {% for %} lines of `role: content`, then `assistant:`: checked
        // by hand against render's output for one message.
        let rendered = chat::render(&[chat::Message {
            role: "user".into(),
            content: "Hi".into(),
        }]);
        assert_eq!(rendered, "user: Hi\nassistant:");
        assert!(CHAT_TEMPLATE_JINJA.contains("{{ message['role'] }}: {{ message['content'] }}\n"));
        assert!(CHAT_TEMPLATE_JINJA.ends_with("assistant:{% endif %}"));
    }
}
