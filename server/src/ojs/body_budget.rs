//! A bound on the request bodies handled at once.
//!
//! A body is parsed whole into JSON values, which take many times its size: a 4 MiB array of
//! small numbers is some two million `Value`s, 64 MiB, copied again to build the job. With
//! no bound, a few dozen such requests at once could take the server's memory. So each
//! request with a body takes a share of a budget (its length, or the largest body when its
//! length is not known) for as long as it is handled, and waits for it while others hold
//! the budget. One that cannot get its share within half the request timeout is answered
//! 503, retryable: nothing was done. Checked after authentication, so a stranger cannot take the
//! budget by declaring large bodies and sending them slowly.

use std::sync::Arc;

use axum::body::HttpBody;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::error::ApiError;
use crate::AppState;

/// The budget's unit: one permit is this many bytes.
const UNIT: usize = 1024;

/// Bodies of known length up to this size take no share: a worker's acks and heartbeats must
/// not queue behind a large enqueue, and what they can take is bounded by the connections.
const SMALL: u64 = 64 * 1024;

/// A budget of `bytes` (at least one unit).
pub fn budget(bytes: usize) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(bytes.div_ceil(UNIT).clamp(1, Semaphore::MAX_PERMITS)))
}

/// The share of the budget a request takes: its body's length as far as it is known (a
/// declared length, or what an in-memory body holds; bodies longer than the largest accepted
/// one are refused anyway), or the largest accepted one when it is not known (a chunked or
/// HTTP/2 body without a length); `None` when it has no body or a small one.
fn share(req: &Request, max_body_bytes: usize) -> Option<usize> {
    let hint = req.body().size_hint();
    let bytes = match hint.exact().or(hint.upper()) {
        Some(n) if n <= SMALL => return None,
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX).min(max_body_bytes),
        None => max_body_bytes,
    };
    Some(bytes.div_ceil(UNIT).max(1))
}

pub async fn admit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(units) = share(&req, state.config.max_body_bytes) else {
        return next.run(req).await;
    };
    // A share larger than the whole budget could never be granted: it takes all of it.
    let units = u32::try_from(units.min(state.body_budget_units)).unwrap_or(u32::MAX);
    // Half the request timeout: the answer must come before the timeout's 408, which says the
    // request goes on, since one given up here does not.
    let waited = tokio::time::timeout(state.config.request_timeout / 2, state.body_budget.clone().acquire_many_owned(units)).await;
    let Ok(Ok(_share)) = waited else {
        return ApiError {
            retryable: true,
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                "backend_error",
                "the server is handling as many request bodies as it holds at once; nothing was done",
                "retry the request shortly",
            )
        }
        .into_response();
    };
    next.run(req).await
}
