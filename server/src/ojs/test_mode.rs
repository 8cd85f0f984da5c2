//! Behaviour that exists only with `--test-mode`, for the OJS conformance runner: wiping all
//! state between cases, and heartbeat directives requested by the job itself
//! (`options.metadata.test_directive`), which is the suites' only way to provoke `quiet` and
//! `terminate`. Without the flag the reset route is not mounted and directives are never read.

use axum::Json;
use axum::extract::State;
use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::{Store, StoreError};
use tokio_util::sync::CancellationToken;
use serde_json::{Value, json};
use uuid::Uuid;

use super::error::ApiError;
use crate::AppState;

/// `POST /ojs/v1/admin/reset`: deletes every job, attempt, policy, queue setting and audit entry.
pub async fn reset(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    tracing::info!("test mode: wiping all jobs and settings");
    // The TRUNCATE locks every table at once, so it can deadlock with a maintenance pass that
    // holds one of them and wants another; Postgres ends one of the two, and a reset that
    // failed leaves the last case's jobs for the next. Sent again (it is idempotent), it lands.
    let retry = StorageRetry::storage_default();
    retry.run("resetting for the next conformance case", &CancellationToken::new(), || state.store.reset_all()).await?;
    Ok(Json(json!({ "reset": true })))
}

/// The strongest directive any of `job_ids` asks for: `terminate` > `quiet` > `running`.
pub async fn directive(store: &Store, job_ids: &[Uuid]) -> Result<&'static str, StoreError> {
    let mut answer = "running";
    for id in job_ids.iter().take(100) {
        let Some(job) = store.get_job(*id).await? else { continue };
        match job.extra.pointer("/options/metadata/test_directive").and_then(Value::as_str) {
            Some("terminate") => return Ok("terminate"),
            Some("quiet") => answer = "quiet",
            _ => {}
        }
    }
    Ok(answer)
}
