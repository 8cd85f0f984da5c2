//! How long a client may take to send a request's body once its head arrived.
//!
//! The connection's own bounds (see [`crate::connections`]) stop at the head: without a
//! deadline on the body, a client sending a byte now and then held its connection, and the
//! memory and share of the API's body budget its declared size reserved, for as long as it
//! cared to. The deadline is the server's request timeout (`--request-timeout`): an API
//! request is answered 408 at that time anyway, so nobody would hear an answer to a body that
//! took longer.

use std::future::Future;
use std::time::Duration;

/// The deadline of a request the server set none for (see [`Deadline`]).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

/// How long this request's whole body may take to arrive, set as a request extension by the
/// layer that times the request (the OJS API's request timeout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline(pub Duration);

/// The deadline set on the request, or [`DEFAULT_DEADLINE`].
pub fn deadline(extensions: &axum::http::Extensions) -> Duration {
    extensions.get::<Deadline>().map_or(DEFAULT_DEADLINE, |d| d.0)
}

/// The body did not arrive within the deadline it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooSlow(pub Duration);

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body did not arrive within {} ms", self.0.as_millis())
    }
}

/// Runs `read` (a read of a request body) for at most `deadline`.
pub async fn within<T>(deadline: Duration, read: impl Future<Output = T>) -> Result<T, TooSlow> {
    tokio::time::timeout(deadline, read).await.map_err(|_| TooSlow(deadline))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    #[tokio::test]
    async fn a_body_that_never_ends_is_given_up_at_the_deadline() {
        let never: futures::stream::Pending<Result<axum::body::Bytes, std::io::Error>> = futures::stream::pending();
        let started = tokio::time::Instant::now();
        let read = within(Duration::from_millis(100), axum::body::to_bytes(Body::from_stream(never), 1024)).await;
        assert_eq!(read.map(|_| ()), Err(TooSlow(Duration::from_millis(100))));
        assert!(started.elapsed() < Duration::from_secs(5));
        // One that arrives in time is read whole.
        let whole = within(Duration::from_secs(5), axum::body::to_bytes(Body::from("csrf=x"), 1024)).await;
        assert_eq!(whole.ok().and_then(Result::ok).as_deref(), Some(&b"csrf=x"[..]));
    }
}
