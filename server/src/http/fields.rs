//! Reading an OpenAI request body's fields, each with its type checked.
//!
//! Bodies are read as a JSON object and each known field is taken out with
//! the getter for its type, so a wrong type is a 400 whose message starts
//! with the field's name (`max_tokens: must be an integer, got a string`),
//! which serde's derived errors do not give. An absent field and `null` are
//! the same (unset). Fields nobody asks for are ignored, as OpenAI and vLLM
//! ignore them. Integers may be written as numbers with no fraction (`16.0`),
//! as Python clients sometimes send them.

use serde_json::{Map, Value};

use crate::service::error::ServiceError;

pub type Result<T> = std::result::Result<T, ServiceError>;

/// The pseudo-field of errors about the body as a whole (`param` is null).
pub const BODY: &str = "body";

/// A JSON object's fields; `path` prefixes the names in errors
/// (`stream_options.include_usage`, `messages[2].content`).
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
    path: &'a str,
}

/// How a value is called in an error message.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `field: must be EXPECTED, got KIND`.
pub fn wrong_type(field: impl Into<String>, expected: &str, got: &Value) -> ServiceError {
    ServiceError::invalid(
        field.into(),
        format!("must be {expected}, got {}", kind_of(got)),
    )
}

/// Parses a request body into a JSON object.
pub fn parse_body(body: &[u8]) -> Result<Map<String, Value>> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ServiceError::invalid(BODY, format!("not valid JSON: {e}")))?;
    match value {
        Value::Object(obj) => Ok(obj),
        other => Err(wrong_type(BODY, "a JSON object", &other)),
    }
}

/// An integer value (`16`, or `16.0`), if it is one.
pub fn as_integer(v: &Value) -> Option<i128> {
    if let Some(i) = v.as_i64() {
        return Some(i128::from(i));
    }
    if let Some(u) = v.as_u64() {
        return Some(i128::from(u));
    }
    let f = v.as_f64()?;
    (f.fract() == 0.0 && f.abs() < 1e18).then_some(f as i128)
}

impl<'a> Fields<'a> {
    pub fn new(obj: &'a Map<String, Value>) -> Self {
        Self { obj, path: "" }
    }

    /// The fields of a nested object whose own name is `path`.
    pub fn nested(obj: &'a Map<String, Value>, path: &'a str) -> Self {
        Self { obj, path }
    }

    /// The name of `field` in errors.
    pub fn name(&self, field: &str) -> String {
        if self.path.is_empty() {
            field.to_string()
        } else {
            format!("{}.{field}", self.path)
        }
    }

    /// The value, unless absent or null.
    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    pub fn bool(&self, field: &str) -> Result<Option<bool>> {
        self.typed(field, "a boolean", Value::as_bool)
    }

    pub fn str(&self, field: &str) -> Result<Option<&'a str>> {
        self.typed(field, "a string", Value::as_str)
    }

    pub fn array(&self, field: &str) -> Result<Option<&'a Vec<Value>>> {
        self.typed(field, "an array", Value::as_array)
    }

    pub fn object(&self, field: &str) -> Result<Option<&'a Map<String, Value>>> {
        self.typed(field, "an object", Value::as_object)
    }

    /// A number, as f32 (finite: JSON has no NaN, and overflow is refused).
    pub fn f32(&self, field: &str) -> Result<Option<f32>> {
        let Some(n) = self.typed(field, "a number", Value::as_f64)? else {
            return Ok(None);
        };
        let f = n as f32;
        if !f.is_finite() {
            return Err(ServiceError::invalid(
                self.name(field),
                format!("{n} is out of range"),
            ));
        }
        Ok(Some(f))
    }

    /// An integer in `lo..=hi`.
    pub fn integer(&self, field: &str, lo: i128, hi: i128) -> Result<Option<i128>> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        match as_integer(v) {
            Some(i) if (lo..=hi).contains(&i) => Ok(Some(i)),
            Some(i) => Err(ServiceError::invalid(
                self.name(field),
                format!("must be an integer from {lo} to {hi}, got {i}"),
            )),
            None => Err(wrong_type(self.name(field), "an integer", v)),
        }
    }

    /// A non-negative integer that fits a u32.
    pub fn u32(&self, field: &str) -> Result<Option<u32>> {
        Ok(self
            .integer(field, 0, i128::from(u32::MAX))?
            .map(|i| i as u32))
    }

    fn typed<T>(
        &self,
        field: &str,
        expected: &str,
        take: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => take(v)
                .map(Some)
                .ok_or_else(|| wrong_type(self.name(field), expected, v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field_of(err: ServiceError) -> String {
        match err {
            ServiceError::InvalidArgument { field, .. } => field.into_owned(),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn bodies_must_be_json_objects() {
        assert!(parse_body(br#"{"a": 1}"#).is_ok());
        for bad in [&b"{"[..], b"[1]", b"\"x\"", b""] {
            let err = parse_body(bad).unwrap_err();
            assert!(err.to_string().starts_with("body: "), "{err}");
        }
    }

    #[test]
    fn getters_check_types_and_name_the_field() {
        let obj = json!({
            "b": true, "s": "x", "n": 1.5, "i": 16, "f": 16.0, "neg": -1,
            "big": 1e300, "null": null, "o": {"x": 1}, "a": [1]
        });
        let obj = obj.as_object().unwrap();
        let f = Fields::new(obj);
        assert_eq!(f.bool("b").unwrap(), Some(true));
        assert_eq!(f.str("s").unwrap(), Some("x"));
        assert_eq!(f.f32("n").unwrap(), Some(1.5));
        assert_eq!(f.f32("i").unwrap(), Some(16.0));
        assert_eq!(f.u32("i").unwrap(), Some(16));
        assert_eq!(f.u32("f").unwrap(), Some(16));
        assert_eq!(f.u32("missing").unwrap(), None);
        assert_eq!(f.u32("null").unwrap(), None);
        assert!(f.object("o").unwrap().is_some());
        assert!(f.array("a").unwrap().is_some());
        assert_eq!(f.integer("neg", -1, 5).unwrap(), Some(-1));
        for (field, err) in [
            ("s", f.bool("s").unwrap_err()),
            ("b", f.str("b").unwrap_err()),
            ("s", f.f32("s").unwrap_err()),
            ("big", f.f32("big").unwrap_err()),
            ("n", f.u32("n").unwrap_err()),
            ("neg", f.u32("neg").unwrap_err()),
            ("s", f.u32("s").unwrap_err()),
            ("a", f.object("a").unwrap_err()),
            ("o", f.array("o").unwrap_err()),
        ] {
            assert_eq!(field_of(err), field);
        }
        let e = f.bool("s").unwrap_err().to_string();
        assert_eq!(e, "s: must be a boolean, got a string");
        let inner = Fields::nested(f.object("o").unwrap().unwrap(), "o");
        assert_eq!(field_of(inner.str("x").unwrap_err()), "o.x");
    }
}
