//! Process probes for orchestrators: `/healthz` (alive) and `/readyz` (can reach Postgres).

use axum::extract::State;
use axum::http::StatusCode;

use rebound_queue::Store;

use crate::AppState;

/// `GET /healthz`: the process is up and serving.
pub async fn healthz() -> (StatusCode, &'static str) {
    (StatusCode::OK, "ok\n")
}

/// `GET /readyz`: the database answers and its schema is not behind this server's, so
/// requests can be served.
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    match state.store.pending_migrations().await {
        Ok(pending) if pending.is_empty() => (StatusCode::OK, "ready\n".into()),
        Ok(pending) => (StatusCode::SERVICE_UNAVAILABLE, Store::schema_behind(&pending, "server") + "\n"),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: database unreachable");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable\n".into())
        }
    }
}

