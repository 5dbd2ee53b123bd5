//! OpenAI's `response_format`, read into a [`ResponseFormat`].
//!
//! The shapes OpenAI and vLLM accept: `{"type": "text"}`,
//! `{"type": "json_object"}` and `{"type": "json_schema", "json_schema":
//! {"name": ..., "schema": {...}, "strict": ..., "description": ...}}`.
//! Only `schema` is used (`name`, `strict` and `description` are checked for
//! their type and otherwise ignored: decoding is always strict). Every error
//! names the field it is about, under the prefix the caller gives
//! (`response_format.type`, `response_format.json_schema.schema`).

use serde_json::{Map, Value};

use crate::service::error::ServiceError;

/// The field a schema that does not compile is reported under.
pub const SCHEMA_FIELD: &str = "response_format.json_schema.schema";

/// What a sequence's output must be.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ResponseFormat {
    /// Free text (no constraint).
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// A JSON value valid against this JSON Schema (an object).
    JsonSchema { schema: Value },
}

/// Parses OpenAI's `response_format` value; `field` is its name in the
/// request (`response_format`), the prefix of every error's field.
pub fn parse_response_format(v: &Value, field: &str) -> Result<ResponseFormat, ServiceError> {
    let obj = object(v, field, r#"an object such as {"type": "json_object"}"#)?;
    let type_field = format!("{field}.type");
    let kind = match obj.get("type") {
        Some(Value::String(s)) => s.as_str(),
        None | Some(Value::Null) => return Err(ServiceError::invalid(type_field, "is required")),
        Some(_) => return Err(ServiceError::invalid(type_field, "must be a string")),
    };
    match kind {
        "text" => Ok(ResponseFormat::Text),
        "json_object" => Ok(ResponseFormat::JsonObject),
        "json_schema" => json_schema(obj, field),
        other => Err(ServiceError::invalid(
            type_field,
            format!("must be \"text\", \"json_object\" or \"json_schema\", got {other:?}"),
        )),
    }
}

/// The `json_schema` member of a `{"type": "json_schema"}` format.
fn json_schema(format: &Map<String, Value>, field: &str) -> Result<ResponseFormat, ServiceError> {
    let member = format!("{field}.json_schema");
    let spec = match format.get("json_schema") {
        None | Some(Value::Null) => {
            return Err(ServiceError::invalid(
                member,
                "is required when type is \"json_schema\"",
            ))
        }
        Some(v) => object(v, &member, "an object with a \"schema\"")?,
    };
    for (key, check, expected) in [
        ("name", Value::is_string as fn(&Value) -> bool, "a string"),
        ("description", Value::is_string, "a string"),
        ("strict", Value::is_boolean, "a boolean"),
    ] {
        if let Some(v) = spec.get(key).filter(|v| !v.is_null()) {
            if !check(v) {
                let message = format!("must be {expected}");
                return Err(ServiceError::invalid(format!("{member}.{key}"), message));
            }
        }
    }
    let schema_field = format!("{member}.schema");
    match spec.get("schema") {
        Some(schema @ Value::Object(_)) => Ok(ResponseFormat::JsonSchema {
            schema: schema.clone(),
        }),
        None | Some(Value::Null) => Err(ServiceError::invalid(schema_field, "is required")),
        Some(_) => Err(ServiceError::invalid(
            schema_field,
            "must be an object (a JSON Schema)",
        )),
    }
}

fn object<'a>(
    v: &'a Value,
    field: &str,
    expected: &str,
) -> Result<&'a Map<String, Value>, ServiceError> {
    v.as_object()
        .ok_or_else(|| ServiceError::invalid(field.to_string(), format!("must be {expected}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field_of(err: ServiceError) -> String {
        match err {
            ServiceError::InvalidArgument { field, .. } => field.into_owned(),
            other => panic!("not a validation error: {other}"),
        }
    }

    #[test]
    fn reads_the_three_openai_shapes() {
        let parse = |v: Value| parse_response_format(&v, "response_format").unwrap();
        assert_eq!(parse(json!({"type": "text"})), ResponseFormat::Text);
        assert_eq!(
            parse(json!({"type": "json_object"})),
            ResponseFormat::JsonObject
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            parse(json!({"type": "json_schema", "json_schema": {
                "name": "thing", "strict": true, "schema": schema.clone()
            }})),
            ResponseFormat::JsonSchema { schema }
        );
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!("json_object"), "response_format"),
            (json!({}), "response_format.type"),
            (json!({"type": 3}), "response_format.type"),
            (json!({"type": "regex"}), "response_format.type"),
            (
                json!({"type": "json_schema"}),
                "response_format.json_schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": []}),
                "response_format.json_schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x"}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": "{}"}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": 1, "schema": {}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"strict": "yes", "schema": {}}}),
                "response_format.json_schema.strict",
            ),
        ];
        for (value, field) in cases {
            let err = parse_response_format(&value, "response_format").unwrap_err();
            assert_eq!(field_of(err), field, "{value}");
        }
    }
}
