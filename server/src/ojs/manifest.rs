//! Discovery: the conformance manifest and the OJS health check.

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::response::OwnBody;
use crate::AppState;
use crate::config::ApiAuth;

/// `GET /ojs/manifest`. The suites read `specversion`, the spec prose `ojs_version`: both.
pub async fn manifest(State(state): State<AppState>) -> Json<Value> {
    let mut extensions = vec!["rebound:retry-policies", "rebound:events"];
    if state.config.api_auth == ApiAuth::Token {
        extensions.push("auth:bearer");
    }
    Json(json!({
        "specversion": "1.0",
        "ojs_version": "1.0",
        "implementation": {
            "name": "rebound",
            "version": env!("CARGO_PKG_VERSION"),
            "language": "rust",
        },
        "conformance_level": 1,
        "protocols": ["http"],
        "backend": "postgres",
        "capabilities": {
            "batch_enqueue": true,
            "cron_jobs": false,
            "dead_letter": true,
            "delayed_jobs": true,
            "job_ttl": true,
            "priority_queues": true,
            "rate_limiting": false,
            "schema_validation": false,
            "unique_jobs": true,
            "workflows": false,
            "pause_resume": true,
        },
        "extensions": extensions,
        "endpoints": {
            "base_url": "/ojs/v1",
            "manifest": "/ojs/manifest",
            "health": "/ojs/v1/health",
        },
    }))
}

/// `GET /ojs/v1/health`: 200 `ok` when the database answers, else 503 `degraded`.
pub async fn health(State(state): State<AppState>) -> Response {
    let started = Instant::now();
    let uptime = state.started_at.elapsed().as_secs();
    match state.store.now().await {
        Ok(_) => Json(json!({
            "status": "ok",
            "version": "1.0",
            "uptime_seconds": uptime,
            "backend": {
                "type": "postgres",
                "status": "connected",
                "latency_ms": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            },
        }))
        .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "health check: database unreachable");
            let body = json!({
                "status": "degraded",
                "version": "1.0",
                "uptime_seconds": uptime,
                "backend": { "type": "postgres", "status": "disconnected", "error": "the database does not answer" },
            });
            let mut res = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
            res.extensions_mut().insert(OwnBody);
            res
        }
    }
}
