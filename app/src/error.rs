//! The error every server function returns. It travels to the browser as JSON, so the page can
//! say exactly what went wrong (which field, which state), and on the server it sets the HTTP
//! status: a viewer's mutation is a 403, a missing session a 401.

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
    #[error("internal error: {0}")]
    Internal(String),
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
            AppError::Internal(_) | AppError::ServerFn(_) => 500,
        }
    }
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
            StoreError::Conflict { .. } | StoreError::Duplicate { .. } => AppError::Conflict(e.to_string()),
            StoreError::InvalidJob(v) => AppError::Invalid { field: v.field, reason: v.reason },
            StoreError::InvalidPolicy(p) => AppError::Invalid { field: p.field, reason: p.reason },
            StoreError::Invalid { field, reason } => AppError::Invalid { field, reason },
            other => {
                tracing::error!(error = %other, "dashboard store operation failed");
                AppError::Internal(other.to_string())
            }
        }
    }
}

#[cfg(feature = "ssr")]
impl From<rebound_queue::PolicyError> for AppError {
    fn from(p: rebound_queue::PolicyError) -> Self {
        AppError::Invalid { field: p.field, reason: p.reason }
    }
}
