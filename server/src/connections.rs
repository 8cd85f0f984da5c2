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
use std::io::ErrorKind;
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
use tokio::time::Instant;
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

/// Files the process holds besides its connections (listener, epoll, log, static files being
/// sent), on top of the database pool's.
const OTHER_FILES: u64 = 128;

/// How many connections the process can hold open, at most `wanted`: the open-file limit's
/// soft value is raised as far as its hard one allows (it is often 1 024, as low as the
/// default cap, and Rust does not raise it), and if that is still short, the cap is lowered to
/// fit, with a warning. At the limit, `accept` would fail, and so would the database pool's
/// reconnections.
pub fn fit_to_file_limit(wanted: usize, pool: u32) -> usize {
    let others = OTHER_FILES + u64::from(pool);
    let needed = wanted as u64 + others;
    match rlimit::increase_nofile_limit(needed) {
        Ok(limit) if limit >= needed => wanted,
        Ok(limit) => {
            let fits = usize::try_from(limit.saturating_sub(others)).unwrap_or(wanted).clamp(1, wanted);
            tracing::warn!(wanted, fits, open_file_limit = limit, "the open-file limit is too low for --max-connections; serving at most {fits} connections (raise LimitNOFILE)");
            fits
        }
        Err(e) => {
            tracing::warn!(error = %e, wanted, "could not read or raise the open-file limit; keeping --max-connections as given");
            wanted
        }
    }
}

/// Serves `app` on `listener` until `stop` resolves, then lets the open connections finish
/// their answers for up to `limits.shutdown_grace` (whatever is left then ends with the
/// process). The client's address reaches handlers as [`ConnectInfo`]`<SocketAddr>`.
pub async fn serve(listener: TcpListener, app: Router, limits: ConnectionLimits, stop: impl Future<Output = ()>) {
    let slots = Arc::new(Semaphore::new(limits.max_open.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let mut stop = std::pin::pin!(stop);
    let mut warned_full = false;
    let mut last_warned: Option<Instant> = None;
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
                // That one connection went away before it was taken: take the next.
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused | ErrorKind::Interrupted) => continue,
                Err(e) => {
                    // Out of file descriptors or memory: accepting again at once would spin.
                    if last_warned.is_none_or(|at: Instant| at.elapsed() >= Duration::from_secs(5)) {
                        last_warned = Some(Instant::now());
                        tracing::warn!(error = %e, "accepting connections failed; trying again every 50 ms");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(50)) => continue,
                        () = &mut stop => break,
                    }
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
            tracing::warn!(grace_s = limits.shutdown_grace.as_secs(), "connections still open after the shutdown grace are left to end with the process");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_fits_the_open_file_limit() {
        // A cap the limit allows is kept (the soft limit raised if need be).
        assert_eq!(fit_to_file_limit(16, 20), 16);
        // One no limit can reach (Linux allows at most a few million files per process) is
        // lowered to what it can hold.
        let fits = fit_to_file_limit(1 << 40, 20);
        assert!((1..1 << 40).contains(&fits), "{fits}");
        let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap_or((0, 0));
        assert!(fits as u64 + 20 <= soft, "{fits} connections do not fit the soft limit {soft}");
    }
}
