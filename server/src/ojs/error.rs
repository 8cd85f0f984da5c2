//! The OJS error body and the mapping of store errors onto it.
//!
//! Every error the API answers has the same shape:
//! `{"error": {"code", "message", "retryable", "details", "request_id", "hint", "docs_url", "type"}}`.
//! Handlers return [`ApiError`]; the response middleware in [`super::response`] fills in
//! `request_id` (it knows the request, handlers need not) and turns bare error responses
//! from the framework (404, 405, 408, 413, …) into the same shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rebound_queue::StoreError;
use serde_json::{Map, Value, json};

/// Where an OJS client can read about error codes.
const DOCS_URL: &str = "https://openjobspec.org/spec/v1/errors";

/// An error answer of the OJS API.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OJS `error.code`: `invalid_payload`, `invalid_request`, `not_found`, `conflict`, …
    pub code: &'static str,
    /// OJS `error.type`: a broader category (`validation_error`, `parse_error`, …).
    pub kind: &'static str,
    pub message: String,
    pub retryable: bool,
    pub details: Map<String, Value>,
    /// What the client can do about it.
    pub hint: String,
    /// The database connection was lost while the request was out: a request that writes
    /// may have taken effect, and is answered so ([`ApiError::outcome_unknown`]) by the
    /// response layer, which knows the method. Not part of the body.
    pub may_have_landed: bool,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, kind: &'static str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        ApiError { status, code, kind, message: message.into(), retryable: false, details: Map::new(), hint: hint.into(), may_have_landed: false }
    }

    /// The same error with another hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = hint.into();
        self
    }

    /// Adds a `details` entry.
    pub fn detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    /// The body is not JSON at all (or is empty).
    pub fn invalid_payload(reason: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_payload",
            "parse_error",
            format!("the request body is not valid JSON: {reason}"),
            "send a JSON object with Content-Type: application/openjobspec+json (or application/json)",
        )
    }

    /// A field of an otherwise well-formed request is missing or wrong (400).
    pub fn invalid_field(field: &str, reason: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "validation_error",
            format!("{field}: {reason}"),
            format!("fix the field {field:?} and send the request again"),
        )
        .detail("field", field)
    }

    /// A retry policy is invalid (422, `type: validation_error`; the message names the field).
    pub fn invalid_policy(field: &str, reason: impl std::fmt::Display) -> Self {
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            ..ApiError::invalid_field(field, reason)
        }
    }

    /// No such resource.
    pub fn not_found(resource: &str, id: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "not_found",
            format!("{resource} {id} not found"),
            format!("check the {resource} id; finished jobs may have been pruned by retention"),
        )
        .detail("resource_type", resource)
        .detail("resource_id", id.to_string())
    }

    /// No such route.
    pub fn no_route(method: &str, path: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "not_found",
            format!("no endpoint {method} {path}"),
            "see GET /ojs/manifest and the OJS HTTP binding for the endpoints this server offers",
        )
    }

    /// The resource exists but is not in a state that allows the action.
    pub fn conflict(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            "conflict",
            message,
            "fetch the job to see its current state; terminal jobs accept no further transition",
        )
    }

    /// `429 rate_limited`, retryable: the caller is to come back later (the caller of this sets
    /// `Retry-After` to when).
    pub fn rate_limited(message: impl Into<String>, hint: impl Into<String>) -> Self {
        ApiError { retryable: true, ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "rate_limit_error", message, hint) }
    }

    /// Missing, wrong or revoked credentials.
    pub fn unauthenticated(reason: &str) -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "authentication_error",
            reason,
            "send Authorization: Bearer <token>; create a token with `rebound-server token create NAME`",
        )
    }

    /// The database is unreachable or failed; the request may succeed later.
    pub fn backend(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            retryable: true,
            ..ApiError::new(status, "backend_error", "backend_error", message, "retry the request shortly")
        }
    }

    /// A write whose effect is unknown: the database connection was lost while it was out,
    /// so it may have committed unanswered. Sent again as it is, it could be done twice, so it
    /// is not retryable; a job enqueued with a client-chosen `id` is the safe way to resend.
    pub fn outcome_unknown() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backend_error",
            "backend_error",
            "the connection to the database was lost while the request was being carried out: it may or may not have taken effect",
            "check before sending it again (fetch the job or the resource it changed); an enqueue that names its job's `id` can be sent again safely: a duplicate answers 409 with the existing job",
        )
    }

    /// The same error, known to be safe to send again whatever the connection did (the
    /// handler made sure nothing it started stands).
    pub fn retry_safe(mut self) -> Self {
        self.may_have_landed = false;
        self
    }

    /// An error answer for a bare framework response (no handler built one).
    pub fn from_status(status: StatusCode, method: &str, path: &str, body: &str) -> Self {
        let reason = if body.trim().is_empty() { status.canonical_reason().unwrap_or("error").to_owned() } else { body.trim().to_owned() };
        match status {
            StatusCode::NOT_FOUND => ApiError::no_route(method, path),
            StatusCode::METHOD_NOT_ALLOWED => ApiError::new(
                status,
                "invalid_request",
                "method_not_allowed",
                format!("{method} is not allowed on {path}"),
                "see the OJS HTTP binding for the methods this endpoint accepts",
            ),
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                status,
                "invalid_request",
                "payload_too_large",
                format!("the request body is too large: {reason}"),
                "send smaller requests; split large batches",
            ),
            // Not retryable as such: the handler runs on to its end (see `request_task`), so the
            // same request sent again could do its work twice.
            StatusCode::REQUEST_TIMEOUT => ApiError::new(
                status,
                "invalid_request",
                "timeout",
                "the request took too long to answer; it is still being carried out, and its effect may yet land",
                "check the outcome (GET the job, or list what you changed) before sending it again",
            ),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
                status,
                "invalid_request",
                "unsupported_media_type",
                reason,
                "send Content-Type: application/openjobspec+json (or application/json)",
            ),
            s if s.is_server_error() => ApiError::backend(s, reason),
            s => {
                // The framework names a path parameter it could not read in backticks
                // ("Invalid URL: Invalid UTF-8 in `id`"): the error names it as its field.
                let field = reason.split_once(" in `").and_then(|(_, rest)| rest.split_once('`')).map(|(name, _)| name.to_owned());
                let error = ApiError::new(s, "invalid_request", "invalid_request", reason, "check the request against the OJS HTTP binding");
                match field {
                    Some(field) if !field.is_empty() && field.len() <= 64 => error.detail("field", field),
                    _ => error,
                }
            }
        }
    }

    /// A request body that did not arrive in time (see [`crate::request_body`]): nothing was
    /// done with it.
    pub fn body_too_slow(reason: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request",
            "timeout",
            format!("{reason}; nothing was done with the request"),
            "send the whole body without pausing; the request can be sent again",
        )
        .detail("field", "body")
    }

    /// The JSON body, with the request id when known.
    pub fn body(&self, request_id: Option<&str>) -> Value {
        let mut error = json!({
            "code": self.code,
            "type": self.kind,
            "message": self.message,
            "retryable": self.retryable,
            "details": Value::Object(self.details.clone()),
            "hint": self.hint,
            "docs_url": DOCS_URL,
        });
        if let (Some(id), Some(obj)) = (request_id, error.as_object_mut()) {
            obj.insert("request_id".into(), Value::from(id));
        }
        json!({ "error": error })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = axum::Json(self.body(None));
        let mut res = (self.status, body).into_response();
        // The response middleware re-renders the body with the request id from this.
        res.extensions_mut().insert(self);
        res
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => ApiError::not_found("job", id),
            StoreError::Missing { what } => ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "not_found",
                format!("{what} not found"),
                "check the name or id",
            ),
            StoreError::Conflict { id, state, action } => {
                ApiError::conflict(format!("cannot {action} job {id}: it is {state}"))
                    .detail("job_id", id.to_string())
                    .detail("current_state", state.as_str())
            }
            StoreError::NotHeld { id, action, worker } => ApiError::conflict(format!("cannot {action} job {id}: worker {worker} does not hold it"))
                .detail("job_id", id.to_string())
                .detail("current_state", "active")
                .detail("worker_id", worker),
            StoreError::RunEnded { id, action, attempt, started_at } => {
                ApiError::conflict(format!(
                    "cannot {action} job {id}: the run named has ended; the job is active in attempt {attempt}, started {}",
                    started_at.as_deref().unwrap_or("at an unknown time")
                ))
                    .detail("job_id", id.to_string())
                    .detail("current_state", "active")
                    .detail("current_attempt", attempt)
                    .detail("current_started_at", started_at)
            }
            StoreError::Duplicate { reason, existing } => {
                let mut err = ApiError::new(
                    StatusCode::CONFLICT,
                    "duplicate",
                    "duplicate",
                    format!("duplicate: {reason}"),
                    "use a new id, or unique.on_conflict \"ignore\" / \"replace\"",
                );
                if let Some(id) = existing {
                    err = err.detail("existing_job_id", id.to_string());
                }
                err
            }
            StoreError::InvalidJob(v) => ApiError::invalid_field(&v.field, &v.reason),
            StoreError::InvalidPolicy(p) => ApiError::invalid_policy(&p.field, &p.reason),
            StoreError::Invalid { field, reason } => ApiError::invalid_field(&field, reason),
            StoreError::Cancelled => ApiError::backend(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"),
            e if e.is_lock_timeout() => {
                tracing::warn!(error = %e, "a statement of the request gave up waiting for a lock (--lock-timeout)");
                ApiError::backend(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database gave up waiting for a lock this request needs, held by another transaction; the statement that waited changed nothing",
                )
            }
            e if e.is_transient() => {
                tracing::warn!(error = %e, "transient database error");
                ApiError {
                    may_have_landed: e.may_have_landed(),
                    ..ApiError::backend(StatusCode::SERVICE_UNAVAILABLE, "the database is temporarily unavailable")
                }
            }
            e => {
                tracing::error!(error = %e, "database error");
                ApiError::backend(StatusCode::INTERNAL_SERVER_ERROR, "the database failed to answer the request")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_queue::JobState;
    use uuid::Uuid;

    #[test]
    fn bodies_carry_every_ojs_field() {
        let body = ApiError::not_found("job", "x").body(Some("req_1"));
        let e = &body["error"];
        for key in ["code", "type", "message", "retryable", "details", "hint", "docs_url", "request_id"] {
            assert!(e.get(key).is_some(), "{key} missing in {body}");
        }
        assert_eq!(e["code"], "not_found");
        assert_eq!(e["retryable"], false);
        assert!(ApiError::not_found("job", "x").body(None)["error"].get("request_id").is_none());
    }

    #[test]
    fn store_errors_map_to_ojs_codes() {
        let id = Uuid::now_v7();
        let conflict = ApiError::from(StoreError::Conflict { id, state: JobState::Completed, action: "complete" });
        assert_eq!((conflict.status, conflict.code), (StatusCode::CONFLICT, "conflict"));
        assert_eq!(conflict.details["current_state"], "completed");
        let dup = ApiError::from(StoreError::Duplicate { reason: "x".into(), existing: Some(id) });
        assert_eq!((dup.status, dup.code), (StatusCode::CONFLICT, "duplicate"));
        assert_eq!(ApiError::from(StoreError::NotFound(id)).status, StatusCode::NOT_FOUND);
        let policy = ApiError::from(StoreError::InvalidPolicy(rebound_queue::PolicyError::new("max_attempts", "must be >= 0")));
        assert_eq!((policy.status, policy.kind), (StatusCode::UNPROCESSABLE_ENTITY, "validation_error"));
        assert!(policy.message.contains("max_attempts"));
        let invalid = ApiError::from(StoreError::Invalid { field: "username".into(), reason: "empty".into() });
        assert_eq!((invalid.status, invalid.details["field"].as_str()), (StatusCode::BAD_REQUEST, Some("username")));
    }

    #[test]
    fn bare_statuses_become_ojs_errors() {
        assert_eq!(ApiError::from_status(StatusCode::PAYLOAD_TOO_LARGE, "POST", "/x", "length limit exceeded").kind, "payload_too_large");
        assert_eq!(ApiError::from_status(StatusCode::METHOD_NOT_ALLOWED, "PUT", "/x", "").code, "invalid_request");
        assert!(ApiError::from_status(StatusCode::BAD_GATEWAY, "GET", "/x", "").retryable);
    }
}
