//! Every request's handler runs to its end on a task of its own.
//!
//! A future dropped while it holds a transaction open loses whatever the transaction had done
//! and, if its COMMIT was already on the wire, leaves the caller unsure whether it landed (a
//! re-driven batch, a cancelled job, a triggered cron job sent again). hyper drops a request's
//! future when its client hangs up, and a timeout layer drops it when the time is up. Here the
//! handler is spawned instead, so neither can cut it off: the client that left, or the one told
//! it took too long, just does not hear the answer. The store's own limits (pool acquisition,
//! the storage retry, `idle_in_transaction_session_timeout`) bound how long a handler can run,
//! and the server waits for the handlers still running before it exits ([`RequestTasks`]).
//!
//! A handler whose answer matters beyond its effect (a worker fetch: jobs it claims are the
//! caller's to run) learns from [`Unheard`] that nobody is waiting for it any more.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// The handlers of this server's requests: detached from their callers, but waited for at
/// shutdown (see `commands::serve`).
#[derive(Clone, Debug, Default)]
pub struct RequestTasks(TaskTracker);

impl RequestTasks {
    /// Waits up to `grace` for the handlers still running (their callers gone), after the
    /// server stopped taking requests. Whatever is left then is logged.
    pub async fn drain(&self, grace: Duration) {
        self.0.close();
        if tokio::time::timeout(grace, self.0.wait()).await.is_err() {
            tracing::warn!(running = self.0.len(), grace_s = grace.as_secs_f64(), "request handlers still running at exit");
        }
    }
}

/// Whether anybody still waits for the request's answer: not once its client hung up, or it
/// was answered 408. A request extension. A handler whose answer carries something that is
/// lost unheard (a fetch's jobs) takes the answer with [`Unheard::deliver`]: from then on the
/// timeout waits for it instead of answering 408.
#[derive(Clone, Debug, Default)]
pub struct Unheard(Arc<AtomicU8>);

const WAITING: u8 = 0;
const DELIVERING: u8 = 1;
const GONE: u8 = 2;

impl Unheard {
    /// Nobody waits any more.
    pub fn is_unheard(&self) -> bool {
        self.0.load(Ordering::Acquire) == GONE
    }

    /// Takes the answer for delivery: true if the caller was still waiting, and then the
    /// request timeout no longer answers in its place. False if it is gone already.
    pub fn deliver(&self) -> bool {
        self.0.compare_exchange(WAITING, DELIVERING, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// The caller stops waiting, unless the answer is already being delivered (true then).
    fn leave(&self) -> bool {
        match self.0.compare_exchange(WAITING, GONE, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => false,
            Err(state) => state == DELIVERING,
        }
    }
}

/// Runs the rest of the stack on its own task and answers what it answers. Requests under
/// `/ojs/` are left to the API's own layer ([`run_to_completion_within`]), which spawns too.
pub async fn run_to_completion(State(tasks): State<RequestTasks>, req: Request, next: Next) -> Response {
    if req.uri().path().starts_with("/ojs/") {
        return next.run(req).await;
    }
    let (handler, _waiting) = spawn(&tasks, req, next);
    answer(handler.await)
}

/// [`run_to_completion`], answering `408 Request Timeout` if the handler is not done within
/// the given time. The handler still runs to its end.
pub async fn run_to_completion_within(State((tasks, limit)): State<(RequestTasks, Duration)>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    // The body must arrive within the same time, nobody hearing an answer after it; a little
    // less, so that what the client hears is the body's refusal, which says nothing was done.
    req.extensions_mut().insert(crate::request_body::Deadline(tokio::time::Instant::now() + (limit - limit / 10)));
    let (mut handler, waiting) = spawn(&tasks, req, next);
    match tokio::time::timeout(limit, &mut handler).await {
        Ok(done) => answer(done),
        // The handler took its answer for delivery just as the time ran out: it is on its way.
        Err(_) if waiting.0.leave() => answer(handler.await),
        Err(_) => {
            tracing::warn!(path, limit_ms = limit.as_millis() as u64, "request timed out; its handler runs on to its end, unheard");
            StatusCode::REQUEST_TIMEOUT.into_response()
        }
    }
}

/// Marks the request [`Unheard`] when dropped: when its caller stops waiting, however.
struct Waiting(Unheard);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.leave();
    }
}

fn spawn(tasks: &RequestTasks, mut req: Request, next: Next) -> (tokio::task::JoinHandle<Response>, Waiting) {
    let unheard = Unheard::default();
    req.extensions_mut().insert(unheard.clone());
    // In the request's span, which the trace layer outside opened: the handler's log lines
    // keep its method, path and request id.
    let handler = tasks.0.spawn(next.run(req).in_current_span());
    (handler, Waiting(unheard))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_taken_for_delivery_is_waited_for_and_a_gone_caller_gets_none() {
        let taken = Unheard::default();
        assert!(taken.deliver(), "the caller was waiting");
        assert!(taken.leave(), "the timeout then waits for the answer on its way");
        assert!(!taken.is_unheard());

        let gone = Unheard::default();
        assert!(!gone.leave(), "nothing was on its way: the timeout answers 408");
        assert!(gone.is_unheard());
        assert!(!gone.deliver(), "the handler learns nobody waits");
    }
}
