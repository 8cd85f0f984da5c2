//! How long a client may take to send a request's body once its head arrived.
//!
//! The connection's own bounds (see [`crate::connections`]) stop at the head: without a
//! deadline on the body, a client sending a byte now and then held its connection, and the
//! memory and share of the API's body budget its declared size reserved, for as long as it
//! cared to. An API request is answered 408 after its request timeout (30 s by default)
//! anyway, so nobody would hear an answer to a body that took longer.

use std::future::Future;
use std::time::Duration;

/// How long a whole request body may take to arrive.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The body did not arrive within [`DEADLINE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooSlow;

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body did not arrive within {} s", DEADLINE.as_secs())
    }
}

/// Runs `read` (a read of a request body) for at most `deadline`.
pub async fn within<T>(deadline: Duration, read: impl Future<Output = T>) -> Result<T, TooSlow> {
    tokio::time::timeout(deadline, read).await.map_err(|_| TooSlow)
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
        assert_eq!(read.map(|_| ()), Err(TooSlow));
        assert!(started.elapsed() < Duration::from_secs(5));
        // One that arrives in time is read whole.
        let whole = within(Duration::from_secs(5), axum::body::to_bytes(Body::from("csrf=x"), 1024)).await;
        assert_eq!(whole.ok().and_then(Result::ok).as_deref(), Some(&b"csrf=x"[..]));
    }
}
