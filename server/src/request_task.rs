//! Every request's handler runs to its end on a task of its own.
//!
//! A future dropped while it holds a transaction open loses whatever the transaction had done
//! and, if its COMMIT was already on the wire, leaves the caller unsure whether it landed (a
//! re-driven batch, a cancelled job, a triggered cron job sent again). hyper drops a request's
//! future when its client hangs up, and a timeout layer drops it when the time is up. Here the
//! handler is spawned instead, so neither can cut it off: the client that left, or the one told
//! it took too long, just does not hear the answer. The store's own limits (pool acquisition,
//! the storage retry, `idle_in_transaction_session_timeout`) bound how long a handler can run.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Runs the rest of the stack on its own task and answers what it answers.
pub async fn run_to_completion(req: Request, next: Next) -> Response {
    answer(tokio::spawn(next.run(req)).await)
}

/// [`run_to_completion`], answering `408 Request Timeout` if the handler is not done within
/// the given time. The handler still runs to its end.
pub async fn run_to_completion_within(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let handler = tokio::spawn(next.run(req));
    match tokio::time::timeout(limit, handler).await {
        Ok(done) => answer(done),
        Err(_) => {
            tracing::warn!(path, limit_ms = limit.as_millis() as u64, "request timed out; its handler runs on to its end, unheard");
            StatusCode::REQUEST_TIMEOUT.into_response()
        }
    }
}

fn answer(done: Result<Response, tokio::task::JoinError>) -> Response {
    match done {
        Ok(response) => response,
        Err(e) => {
            // A panic in a handler (the task absorbed it) or a runtime shutting down.
            tracing::error!(error = %e, "request handler did not finish");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
