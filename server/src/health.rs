//! Process probes for orchestrators: `/healthz` (alive) and `/readyz` (can reach Postgres),
//! and the shared look at the database behind them and the OJS health check.
//!
//! The probes need no credentials, so anyone who can reach the server can call them as often
//! as they like. Each kind of look at the database is shared: one runs at a time, and its
//! answer serves every probe of that kind for [`PROBE_FRESH`]. A flood of probes then costs at
//! most one statement a second per kind (three kinds) and as many pooled connections, never
//! the pool that real requests wait for. A look that takes longer than [`LOOK_TIMEOUT`]
//! answers "unreachable", so the probes waiting for it are not held with it.

use std::future::Future;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use tokio::sync::Mutex;

use rebound_queue::Store;

use crate::AppState;

/// How long one look at the database answers the probes.
pub const PROBE_FRESH: Duration = Duration::from_secs(1);

/// How long a look may take before it counts as the database not answering.
pub const LOOK_TIMEOUT: Duration = Duration::from_secs(5);

/// The last answer of one kind of look, and the turn at taking the next.
#[derive(Debug)]
pub struct Probe<T> {
    last: Mutex<Option<(Instant, T)>>,
}

impl<T> Default for Probe<T> {
    fn default() -> Self {
        Probe { last: Mutex::new(None) }
    }
}

impl<T: Clone> Probe<T> {
    /// The last answer if it is fresh, else `look`'s, or `timed_out` if it takes longer than
    /// [`LOOK_TIMEOUT`] (while it runs, other callers wait for it rather than look
    /// themselves). A caller dropped while looking leaves no answer.
    pub async fn answer<F: Future<Output = T>>(&self, look: impl FnOnce() -> F, timed_out: T) -> T {
        let mut last = self.last.lock().await;
        if let Some((at, answer)) = last.as_ref()
            && at.elapsed() < PROBE_FRESH
        {
            return answer.clone();
        }
        let answer = tokio::time::timeout(LOOK_TIMEOUT, look()).await.unwrap_or(timed_out);
        *last = Some((Instant::now(), answer.clone()));
        answer
    }
}

/// The shared looks at the database of [`readyz`], the OJS health check and `/metrics`
/// (which `--public-metrics` serves to anyone; Prometheus scrapes it every few seconds).
#[derive(Debug, Default)]
pub struct Probes {
    /// The queues' counts by state for `/metrics`; `None` when the database did not answer.
    pub depth: Probe<Option<std::sync::Arc<rebound_queue::store::Stats>>>,
    /// Migrations this server has that the database lacks; `Err` when it did not answer.
    pub readiness: Probe<Result<Vec<String>, ()>>,
    /// How long the database took to answer; `Err` when it did not.
    pub ping: Probe<Result<Duration, ()>>,
}

impl Probes {
    /// [`Probes::ping`]'s answer, looking through `store` when it is stale.
    pub async fn ping(&self, store: &Store) -> Result<Duration, ()> {
        self.ping
            .answer(|| async {
                let started = Instant::now();
                match store.now().await {
                    Ok(_) => Ok(started.elapsed()),
                    Err(e) => {
                        tracing::warn!(error = %e, "health check: database unreachable");
                        Err(())
                    }
                }
            }, Err(()))
            .await
    }
}

/// `GET /healthz`: the process is up and serving.
pub async fn healthz() -> (StatusCode, &'static str) {
    (StatusCode::OK, "ok\n")
}

/// `GET /readyz`: the database answers and its schema is not behind this server's, so
/// requests can be served.
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    let looked = state
        .probes
        .readiness
        .answer(|| async {
            state.store.pending_migrations().await.map_err(|e| {
                tracing::warn!(error = %e, "readiness: database unreachable");
            })
        }, Err(()))
        .await;
    match looked {
        Ok(pending) if pending.is_empty() => (StatusCode::OK, "ready\n".into()),
        Ok(pending) => (StatusCode::SERVICE_UNAVAILABLE, Store::schema_behind(&pending, "server") + "\n"),
        Err(()) => (StatusCode::SERVICE_UNAVAILABLE, "database unreachable\n".into()),
    }
}
