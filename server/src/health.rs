//! Process probes for orchestrators: `/healthz` (alive) and `/readyz` (can reach Postgres).

use axum::extract::State;
use axum::http::StatusCode;

use crate::AppState;

/// `GET /healthz`: the process is up and serving.
pub async fn healthz() -> (StatusCode, &'static str) {
    (StatusCode::OK, "ok\n")
}

/// `GET /readyz`: the database answers, so requests can be served.
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    match state.store.now().await {
        Ok(_) => (StatusCode::OK, "ready\n"),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: database unreachable");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable\n")
        }
    }
}
