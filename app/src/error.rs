//! The error every server function returns. It travels to the browser as JSON, so the page can
//! say exactly what went wrong (which field, which state), and on the server it sets the HTTP
//! status ([`AppError::status`], applied by the server's session middleware, and by
//! `set_status` to a page that shows the error): a viewer's mutation is a 403, a missing
//! session a 401, a malformed argument a 400, a refused value a 422. Internal failures never
//! carry their text to the browser: only the request id the server logged them under. A reason
//! that quotes input quotes at most its start ([`quoted`]).

use leptos::server_fn::codec::JsonEncoding;
use leptos::server_fn::error::{FromServerFnError, ServerFnErrorErr};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AppError {
    /// No live session: log in again.
    #[error("you are not logged in (or your session expired); log in again")]
    Unauthorized,
    /// Logged in, but the role may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The form's CSRF token does not match the session's.
    #[error("the form has expired or did not come from this dashboard; reload the page and try again")]
    Csrf,
    #[error("{0} not found")]
    NotFound(String),
    /// Input that the store or a policy refused, naming the field.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    /// The target is not in a state that allows the action.
    #[error("{0}")]
    Conflict(String),
    /// Something failed inside the server; the full error is in its log under this request id.
    #[error("something went wrong on the server; its log has the details under request id {0}")]
    Internal(String),
    /// The database could not be reached, and nothing was done: try again shortly.
    #[error("the database cannot be reached right now, so nothing was done; try again shortly (request id {0})")]
    Unavailable(String),
    /// A statement gave up waiting for a lock another transaction holds, and changed nothing:
    /// try again shortly.
    #[error("the database gave up waiting for a lock that another transaction holds, so nothing was done; try again shortly (request id {0})")]
    LockTimeout(String),
    /// The connection to the database was lost while an action was being carried out: it may
    /// have taken effect, so doing it again blindly could do it twice.
    #[error("the connection to the database was lost while this was being done: if it was an action, it may or may not have taken effect; reload the page to see before doing it again (request id {0})")]
    OutcomeUnknown(String),
    #[error("{0}")]
    ServerFn(ServerFnErrorErr),
}

impl AppError {
    /// The field an `Invalid` error names, for showing it beside that field.
    pub fn field(&self) -> Option<&str> {
        match self {
            AppError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    /// The HTTP status the error answers with.
    pub fn status(&self) -> u16 {
        match self {
            AppError::Unauthorized => 401,
            AppError::Forbidden(_) | AppError::Csrf => 403,
            AppError::NotFound(_) => 404,
            AppError::Invalid { .. } => 422,
            AppError::Conflict(_) => 409,
            AppError::Internal(_) => 500,
            AppError::Unavailable(_) | AppError::LockTimeout(_) | AppError::OutcomeUnknown(_) => 503,
            AppError::ServerFn(e) => match e {
                // The request did not carry what the function takes: the caller's mistake.
                ServerFnErrorErr::Args(_) | ServerFnErrorErr::MissingArg(_) | ServerFnErrorErr::Deserialization(_) => 400,
                ServerFnErrorErr::UnsupportedRequestMethod(_) => 405,
                ServerFnErrorErr::Registration(_) => 404,
                _ => 500,
            },
        }
    }

    /// An internal failure: logs `error` with the current request's id and returns an error
    /// that names only the id, so no database or file-system text reaches the browser.
    #[cfg(feature = "ssr")]
    pub fn internal(error: impl std::fmt::Display) -> AppError {
        let id = request_id();
        tracing::error!(request_id = %id, error = %error, "dashboard request failed");
        AppError::Internal(id)
    }
}

/// How many characters of a value a message quotes back: enough to recognise it, never a page
/// of it (a crafted or pasted value is not reflected at length).
pub const QUOTED_CHARS: usize = 40;

/// `input` quoted for a message (`"value"`), cut to [`QUOTED_CHARS`] characters with an
/// ellipsis. Every reason that quotes what the operator typed (or a URL carried) uses it.
pub fn quoted(input: &str) -> String {
    let mut chars = input.chars();
    let head: String = chars.by_ref().take(QUOTED_CHARS).collect();
    let head = if chars.next().is_some() { head + "…" } else { head };
    format!("{head:?}")
}

/// A reason from a validator that quotes `input` whole (`{input:?}`, as the store's do), with
/// the quote cut like [`quoted`].
pub fn requoted(reason: String, input: &str) -> String {
    let whole = format!("{input:?}");
    if reason.contains(&whole) { reason.replacen(&whole, &quoted(input), 1) } else { reason }
}

/// Answers the request being rendered with `error`'s status ([`AppError::status`]): a page
/// that shows an error is not a 200. Pages render with `SsrMode::Async`, so the status is set
/// before the response starts. Outside a request (a test calling a function directly) it does
/// nothing.
#[cfg(feature = "ssr")]
pub fn set_status(error: &AppError) {
    if let Some(res) = leptos::prelude::use_context::<leptos_axum::ResponseOptions>()
        && let Ok(status) = http::StatusCode::from_u16(error.status())
    {
        res.set_status(status);
    }
}

/// The id `rebound-server` gave this request (its `X-Request-Id`), or a fresh one when the
/// request carries none (a test calling a server function directly).
#[cfg(feature = "ssr")]
fn request_id() -> String {
    leptos::prelude::use_context::<http::request::Parts>()
        .and_then(|parts| parts.headers.get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned))
        .unwrap_or_else(|| format!("req_{}", uuid::Uuid::now_v7()))
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        AppError::ServerFn(value)
    }
}

#[cfg(feature = "ssr")]
impl From<rebound_queue::StoreError> for AppError {
    fn from(e: rebound_queue::StoreError) -> Self {
        use rebound_queue::StoreError;
        match e {
            StoreError::NotFound(id) => AppError::NotFound(format!("job {id}")),
            StoreError::Missing { what } => AppError::NotFound(what),
            StoreError::Conflict { .. } | StoreError::NotHeld { .. } | StoreError::RunEnded { .. } | StoreError::Duplicate { .. } => AppError::Conflict(e.to_string()),
            StoreError::InvalidJob(v) => AppError::Invalid { field: v.field, reason: v.reason },
            StoreError::InvalidPolicy(p) => AppError::Invalid { field: p.field, reason: p.reason },
            StoreError::Invalid { field, reason } => AppError::Invalid { field, reason },
            other if other.is_lock_timeout() => {
                let id = request_id();
                tracing::warn!(request_id = %id, error = %other, "dashboard request failed: a statement gave up waiting for a lock");
                AppError::LockTimeout(id)
            }
            other if other.is_transient() => {
                let id = request_id();
                tracing::warn!(request_id = %id, error = %other, "dashboard request failed: the database is unavailable");
                if other.may_have_landed() { AppError::OutcomeUnknown(id) } else { AppError::Unavailable(id) }
            }
            other => AppError::internal(other),
        }
    }
}

#[cfg(feature = "ssr")]
impl From<rebound_queue::PolicyError> for AppError {
    fn from(p: rebound_queue::PolicyError) -> Self {
        AppError::Invalid { field: p.field, reason: p.reason }
    }
}

#[cfg(feature = "ssr")]
impl From<rebound_queue::job::JobValidationError> for AppError {
    fn from(v: rebound_queue::job::JobValidationError) -> Self {
        AppError::Invalid { field: v.field, reason: v.reason }
    }
}

/// Checks a queue name from a form before it reaches the store (a space or a NUL would be
/// stored, or refused by Postgres as an internal error).
#[cfg(feature = "ssr")]
pub fn check_queue(queue: &str) -> Result<(), AppError> {
    rebound_queue::job::validate_queue(queue).map_err(|v| AppError::Invalid { field: "queue".into(), reason: requoted(v.reason, queue) })
}

/// Checks a job type from a policy form, like [`check_queue`] (`*`, the defaults, included).
#[cfg(feature = "ssr")]
pub fn check_job_type(job_type: &str) -> Result<(), AppError> {
    if job_type == rebound_queue::store::DEFAULT_POLICY_KEY {
        return Ok(());
    }
    rebound_queue::job::validate_type(job_type).map_err(|v| AppError::Invalid { field: "job_type".into(), reason: requoted(v.reason, job_type) })
}

#[cfg(test)]
mod tests {
    use super::{QUOTED_CHARS, quoted, requoted};

    #[test]
    fn quotes_are_cut_to_a_recognisable_start() {
        assert_eq!(quoted("forever"), "\"forever\"");
        let long = "é".repeat(1000);
        let q = quoted(&long);
        assert_eq!(q, format!("\"{}…\"", "é".repeat(QUOTED_CHARS)));
        assert_eq!(quoted(&"x".repeat(QUOTED_CHARS)), format!("\"{}\"", "x".repeat(QUOTED_CHARS)), "exactly the limit is not cut");
        let reason = format!("{:?} is not a valid queue name: lowercase letters", "Q".repeat(500));
        let cut = requoted(reason, &"Q".repeat(500));
        assert!(cut.starts_with(&format!("\"{}…\" is not a valid queue name", "Q".repeat(QUOTED_CHARS))), "{cut}");
        assert_eq!(requoted("must be a number".into(), "abc"), "must be a number", "a reason without the quote is kept");
    }
}
