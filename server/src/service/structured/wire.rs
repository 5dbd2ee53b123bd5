//! A [`ResponseFormat`] on the wire: the proto's `ResponseFormat` (what the
//! HTTP door translates OpenAI's `response_format` into, and what gRPC
//! clients send) read back, with the schema's JSON text checked.

use ember_common::pb::{self, response_format::Format};
use serde_json::Value;

use super::format::{ResponseFormat, SCHEMA_FIELD};
use crate::service::error::ServiceError;

impl ResponseFormat {
    /// The proto form; `None` for free text.
    pub fn to_pb(&self) -> Option<pb::ResponseFormat> {
        let format = match self {
            ResponseFormat::Text => return None,
            ResponseFormat::JsonObject => Format::JsonObject(true),
            ResponseFormat::JsonSchema { schema } => Format::JsonSchema(schema.to_string()),
        };
        Some(pb::ResponseFormat {
            format: Some(format),
        })
    }

    /// Reads the proto form. A `json_schema` that is not a JSON object is
    /// INVALID_ARGUMENT naming [`SCHEMA_FIELD`]; `json_object: false` is
    /// free text.
    pub fn from_pb(f: &pb::ResponseFormat) -> Result<ResponseFormat, ServiceError> {
        match &f.format {
            None | Some(Format::JsonObject(false)) => Ok(ResponseFormat::Text),
            Some(Format::JsonObject(true)) => Ok(ResponseFormat::JsonObject),
            Some(Format::JsonSchema(text)) => match serde_json::from_str::<Value>(text) {
                Ok(schema @ Value::Object(_)) => Ok(ResponseFormat::JsonSchema { schema }),
                Ok(_) => Err(ServiceError::invalid(
                    SCHEMA_FIELD,
                    "must be a JSON object (a JSON Schema)",
                )),
                Err(e) => Err(ServiceError::invalid(
                    SCHEMA_FIELD,
                    format!("is not valid JSON: {e}"),
                )),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_and_names_the_schema_field() {
        for f in [
            ResponseFormat::JsonObject,
            ResponseFormat::JsonSchema {
                schema: json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
            },
        ] {
            let back = ResponseFormat::from_pb(&f.to_pb().unwrap()).unwrap();
            assert_eq!(back, f);
        }
        assert!(ResponseFormat::Text.to_pb().is_none());
        for bad in ["[1]", "{not json"] {
            let pb = pb::ResponseFormat {
                format: Some(Format::JsonSchema(bad.into())),
            };
            match ResponseFormat::from_pb(&pb) {
                Err(ServiceError::InvalidArgument { field, .. }) => assert_eq!(field, SCHEMA_FIELD),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
