//! Accepting HTTP connections, bounded: how many are open at once, how long a client may take
//! to send a request's head (or sit idle between requests), and how long a stopping server
//! waits for the connections still open.
//!
//! `axum::serve` gives hyper no timer, which turns hyper's header timeout off: a connection
//! that sends nothing, or its head a byte at a time, was held open for ever, and enough of
//! them took every file descriptor the process had, so that nobody could connect at all (and
//! a stopping server waited on them until it was killed). So connections are served here,
//! with hyper's own HTTP/1 server, as axum would serve them otherwise.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// The bounds on connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once; past it new ones wait in the listen backlog.
    pub max_open: usize,
    /// How long a client has to send a request's head once the connection is ready for one:
    /// after it connects, and after each answer while the connection is kept alive.
    pub header_timeout: Duration,
    /// How long a stopping server waits for open connections to finish their answers.
    pub shutdown_grace: Duration,
}

/// Serves `app` on `listener` until `stop` resolves, then lets the open connections finish
/// their answers for up to `limits.shutdown_grace` (whatever is left then ends with the
/// process). The client's
/// address reaches handlers as [`ConnectInfo`]`<SocketAddr>`.
pub async fn serve(listener: TcpListener, app: Router, limits: ConnectionLimits, stop: impl Future<Output = ()>) {
    let slots = Arc::new(Semaphore::new(limits.max_open.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let mut stop = std::pin::pin!(stop);
    let mut warned_full = false;
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        if slots.available_permits() == 0 && !warned_full {
            warned_full = true;
            tracing::warn!(max_open = limits.max_open, "every connection slot is taken; new connections wait until one closes");
        } else if slots.available_permits() > limits.max_open / 10 {
            warned_full = false;
        }
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: accepting again at once would spin.
                    tracing::warn!(error = %e, "accepting a connection failed; trying again shortly");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let service = app.clone().map_request(move |req: Request<Incoming>| {
            let mut req = req.map(Body::new);
            req.extensions_mut().insert(ConnectInfo(peer));
            req
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!(grace_s = limits.shutdown_grace.as_secs(), "connections still open after the shutdown grace are closed");
        }
    }
}
