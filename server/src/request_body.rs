//! How long a client may take to send a request's body once its head arrived.
//!
//! The connection's own bounds (see [`crate::connections`]) stop at the head: without a
//! deadline on the body, a client sending a byte now and then held its connection, and the
//! memory and share of the API's body budget its declared size reserved, for as long as it
//! cared to. An API request's body must have arrived nine tenths of its request timeout
//! (`--request-timeout`) after the request did: it is answered 408 at the timeout anyway, so
//! nobody would hear an answer to a body that took longer, and the body's own refusal, which
//! says nothing was done, comes first. A dashboard form has the request timeout, at most 30 s.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How long the body of a request the server set no deadline for may take (see [`Deadline`]),
/// and the most a dashboard form may take.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

/// When this request's whole body must have arrived, set as a request extension by the layer
/// that times the request (the OJS API's request timeout). An instant, not a duration: what
/// runs before the body is read (waiting for a share of the body budget, say) spends the
/// same time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline(pub Instant);

/// The deadline set on the request, or [`DEFAULT_DEADLINE`] from now.
pub fn deadline(extensions: &axum::http::Extensions) -> Instant {
    extensions.get::<Deadline>().map_or_else(|| Instant::now() + DEFAULT_DEADLINE, |d| d.0)
}

/// The body did not arrive by its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooSlow;

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body did not arrive within the request's time")
    }
}

/// Runs `read` (a read of a request body) until `deadline` at most.
pub async fn within<T>(deadline: Instant, read: impl Future<Output = T>) -> Result<T, TooSlow> {
    tokio::time::timeout_at(deadline, read).await.map_err(|_| TooSlow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    #[tokio::test]
    async fn a_body_that_never_ends_is_given_up_at_the_deadline() {
        let never: futures::stream::Pending<Result<axum::body::Bytes, std::io::Error>> = futures::stream::pending();
        let started = Instant::now();
        let read = within(Instant::now() + Duration::from_millis(100), axum::body::to_bytes(Body::from_stream(never), 1024)).await;
        assert_eq!(read.map(|_| ()), Err(TooSlow));
        assert!(started.elapsed() < Duration::from_secs(5));
        // One that arrives in time is read whole.
        let whole = within(Instant::now() + Duration::from_secs(5), axum::body::to_bytes(Body::from("csrf=x"), 1024)).await;
        assert_eq!(whole.ok().and_then(Result::ok).as_deref(), Some(&b"csrf=x"[..]));
    }
}
