//! Reading request bodies: a JSON object, and typed access to its fields with errors that name
//! the field (`options.priority: must be an integer, got string`).
//!
//! Handlers read fields by hand rather than through `serde` derives because the OJS answer to
//! a wrong field is a 400 naming that field, and serde's messages name a line and column.

use axum::body::Bytes;
use axum::extract::{FromRequest, OptionalFromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use rebound_queue::storable;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::error::ApiError;
use crate::request_body;

/// The JSON type name of a value, for error messages.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A request body that is a JSON object.
#[derive(Debug)]
pub struct JsonObject(pub Map<String, Value>);

impl JsonObject {
    /// The fields, for reading.
    pub fn fields(&self) -> Fields<'_> {
        Fields { map: &self.0, prefix: String::new() }
    }
}

/// Content types accepted for request bodies: OJS' own, its `application/json` alias, and
/// any `+json` type. A missing content type is accepted too (curl without `-H`).
fn is_json_content_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || essence == "application/openjobspec+json" || essence.ends_with("+json")
}

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(ct) = req.headers().get(CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("");
            // A 400, not HTTP's usual 415: the binding says so (ojs-http-binding §4.1).
            if !is_json_content_type(ct) {
                return Err(ApiError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "unsupported_media_type",
                    format!("Content-Type {ct:?} is not JSON"),
                    "send Content-Type: application/openjobspec+json (or application/json)",
                )
                .detail("field", "Content-Type"));
            }
        }
        let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
        let deadline = request_body::deadline(req.extensions());
        let bytes = match request_body::within(deadline, Bytes::from_request(req, state)).await {
            Err(slow) => return Err(ApiError::body_too_slow(slow)),
            Ok(Ok(b)) => b,
            Ok(Err(rejection)) => {
                let status = rejection.status();
                let text = rejection.into_response().into_body();
                let text = axum::body::to_bytes(text, 4096).await.unwrap_or_default();
                return Err(ApiError::from_status(status, &method, &path, &String::from_utf8_lossy(&text)));
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::invalid_payload("the body is empty"));
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(map)) => {
                // One check of the whole body covers every field, stored or not: a NUL or an
                // unreadable number is refused here, naming its path, before anything is written.
                storable::check_fields(&map, "").map_err(|e| ApiError::invalid_field(&e.path, e.reason))?;
                Ok(JsonObject(map))
            }
            Ok(other) => Err(ApiError::invalid_field("body", format!("must be a JSON object, got {}", json_kind(&other)))),
            Err(e) => Err(ApiError::invalid_payload(e)),
        }
    }
}

/// A body that may be left out (`Option<JsonObject>`): no body, or only whitespace, is `None`;
/// anything else must be a JSON object, checked as [`JsonObject`] checks it. For endpoints
/// whose body is optional, such as a dead-letter retry with or without an `override`.
impl<S: Send + Sync> OptionalFromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Option<Self>, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let (method, path) = (parts.method.to_string(), parts.uri.path().to_owned());
        let deadline = request_body::deadline(&parts.extensions);
        let bytes = match request_body::within(deadline, Bytes::from_request(Request::from_parts(parts.clone(), body), state)).await {
            Err(slow) => return Err(ApiError::body_too_slow(slow)),
            Ok(Ok(b)) => b,
            Ok(Err(rejection)) => {
                let status = rejection.status();
                return Err(ApiError::from_status(status, &method, &path, "the body could not be read"));
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        <JsonObject as FromRequest<S>>::from_request(Request::from_parts(parts, axum::body::Body::from(bytes)), state).await.map(Some)
    }
}

/// Typed, field-naming access to a JSON object, possibly nested (`options.`, `jobs[3].`).
#[derive(Clone, Debug)]
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    /// Fields of a top-level object.
    pub fn of(map: &'a Map<String, Value>) -> Self {
        Fields { map, prefix: String::new() }
    }

    /// Fields of a nested object, named under `prefix` (e.g. `jobs[2]`).
    pub fn nested(map: &'a Map<String, Value>, prefix: &str) -> Self {
        Fields { map, prefix: format!("{prefix}.") }
    }

    /// The full name of a field, as errors report it.
    pub fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The object itself.
    pub fn map(&self) -> &'a Map<String, Value> {
        self.map
    }

    /// An error about `key`.
    pub fn error(&self, key: &str, reason: impl std::fmt::Display) -> ApiError {
        ApiError::invalid_field(&self.name(key), reason)
    }

    /// The raw value; JSON `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// Refuses keys outside `allowed` (for Rebound's own endpoints, where a typo should not be
    /// silently ignored).
    pub fn only(&self, allowed: &[&str]) -> Result<(), ApiError> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(self.error(k, format!("unknown field; expected one of {}", allowed.join(", ")))),
            None => Ok(()),
        }
    }

    pub fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.error(key, format!("must be a string, got {}", json_kind(v)))),
        }
    }

    pub fn required_str(&self, key: &str) -> Result<&'a str, ApiError> {
        self.str(key)?.ok_or_else(|| self.error(key, "is required"))
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.error(key, format!("must be a boolean, got {}", json_kind(v)))),
        }
    }

    /// An integer (not `1.5`, not `"1"`).
    pub fn i64(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(i) => Ok(Some(i)),
                None if n.as_u64().is_some() => Err(self.error(key, format!("is out of range, got {n}"))),
                None => Err(self.error(key, format!("must be an integer, got {n}"))),
            },
            Some(v) => Err(self.error(key, format!("must be an integer, got {}", json_kind(v)))),
        }
    }

    /// An integer within `min..=max`.
    pub fn i64_in(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        match self.i64(key)? {
            Some(i) if !(min..=max).contains(&i) => Err(self.error(key, format!("must be between {min} and {max}, got {i}"))),
            other => Ok(other),
        }
    }

    /// A number (integer or not) within `min..=max`.
    pub fn f64_in(&self, key: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) if (min..=max).contains(&x) => Ok(Some(x)),
                _ => Err(self.error(key, format!("must be between {min} and {max}, got {n}"))),
            },
            Some(v) => Err(self.error(key, format!("must be a number, got {}", json_kind(v)))),
        }
    }

    pub fn object(&self, key: &str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(Fields { map: m, prefix: format!("{}.", self.name(key)) })),
            Some(v) => Err(self.error(key, format!("must be a JSON object, got {}", json_kind(v)))),
        }
    }

    pub fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.error(key, format!("must be an array, got {}", json_kind(v)))),
        }
    }

    /// An array of strings.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>, ApiError> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.as_str()),
                other => Err(self.error(&format!("{key}[{i}]"), format!("must be a string, got {}", json_kind(other)))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A job id: any UUID spelling, as a lookup key.
    pub fn uuid(&self, key: &str) -> Result<Option<Uuid>, ApiError> {
        match self.str(key)? {
            None => Ok(None),
            Some(s) => parse_uuid(s).map(Some).map_err(|reason| self.error(key, reason)),
        }
    }

    pub fn required_uuid(&self, key: &str) -> Result<Uuid, ApiError> {
        self.uuid(key)?.ok_or_else(|| self.error(key, "is required"))
    }
}

/// Parses a UUID used to look a job up.
pub fn parse_uuid(s: &str) -> Result<Uuid, String> {
    Uuid::parse_str(s).map_err(|_| format!("{s:?} is not a UUID"))
}

/// Parses a job id from a URL path segment.
pub fn path_uuid(s: &str) -> Result<Uuid, ApiError> {
    parse_uuid(s).map_err(|reason| ApiError::invalid_field("id", reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: &Value) -> Fields<'_> {
        Fields::nested(v.as_object().expect("object"), "options")
    }

    #[test]
    fn errors_name_the_nested_field() {
        let v = json!({"priority": "high", "tags": ["a", 1], "n": 1.5, "big": u64::MAX, "o": [], "nothing": null});
        let f = fields(&v);
        assert_eq!(f.i64("priority").unwrap_err().details["field"], "options.priority");
        assert_eq!(f.strings("tags").unwrap_err().details["field"], "options.tags[1]");
        assert!(f.i64("n").unwrap_err().message.contains("must be an integer"));
        assert!(f.i64("big").unwrap_err().message.contains("out of range"));
        assert!(f.object("o").unwrap_err().message.contains("got array"));
        assert_eq!(f.str("nothing").ok(), Some(None));
        assert!(f.required_str("nothing").unwrap_err().message.contains("is required"));
        assert!(f.only(&["priority"]).is_err());
    }

    #[test]
    fn json_content_types() {
        for ok in ["application/json", "application/openjobspec+json", "application/json; charset=utf-8", "application/vnd.x+json"] {
            assert!(is_json_content_type(ok), "{ok}");
        }
        for bad in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"] {
            assert!(!is_json_content_type(bad), "{bad}");
        }
    }
}
