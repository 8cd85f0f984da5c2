//! Jobs: enqueue (single and batch), get, cancel, activate.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::header::LOCATION;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use rebound_queue::store::{EnqueueOutcome, Enqueued};
use serde_json::{Value, json};

use super::body::{Fields, JsonObject, json_kind, path_uuid};
use super::envelope::{job_json, job_json_with_errors, parse_new_job};
use super::error::ApiError;
use crate::AppState;
use crate::auth::Caller;
use crate::metrics::JobCounter;

/// The most jobs one batch may hold (OJS asks for at least 1 000; 10 000 is its "should").
pub const MAX_BATCH: usize = 10_000;

fn count_created(state: &AppState, e: &Enqueued) {
    if e.outcome != EnqueueOutcome::Existing {
        state.metrics.count(JobCounter::Enqueued, &e.job.job_type, &e.job.queue);
    }
}

/// `POST /ojs/v1/jobs`: 201 with the new job; 200 with the existing one when a unique key
/// with `on_conflict: "ignore"` matched.
pub async fn enqueue(State(state): State<AppState>, body: JsonObject) -> Result<Response, ApiError> {
    let job = parse_new_job(&body.fields(), Timestamp::now())?;
    let out = state.store.enqueue(job).await?;
    count_created(&state, &out);
    let existing = out.outcome == EnqueueOutcome::Existing;
    let status = if existing { StatusCode::OK } else { StatusCode::CREATED };
    let mut body = json!({ "job": job_json(&out.job) });
    // ojs-unique-jobs §7: the 200 of an ignored duplicate says so in the body as well.
    if existing && let Some(m) = body.as_object_mut() {
        m.insert("deduplicated".into(), Value::Bool(true));
    }
    let mut res = (status, Json(body)).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/ojs/v1/jobs/{}", out.job.id)) {
        res.headers_mut().insert(LOCATION, location);
    }
    Ok(res)
}

/// `POST /ojs/v1/jobs/batch`: all or nothing.
pub async fn enqueue_batch(State(state): State<AppState>, body: JsonObject) -> Result<Response, ApiError> {
    let f = body.fields();
    let items = f.array("jobs")?.ok_or_else(|| f.error("jobs", "is required"))?;
    if items.is_empty() {
        return Err(f.error("jobs", "must hold at least one job"));
    }
    if items.len() > MAX_BATCH {
        return Err(f.error("jobs", format!("holds {} jobs; the most one batch may hold is {MAX_BATCH}", items.len())));
    }
    let now = Timestamp::now();
    let jobs = items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::Object(map) => parse_new_job(&Fields::nested(map, &format!("jobs[{i}]")), now),
            other => Err(f.error(&format!("jobs[{i}]"), format!("must be a JSON object, got {}", json_kind(other)))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let out = state.store.enqueue_batch(jobs).await?;
    out.iter().for_each(|e| count_created(&state, e));
    let jobs: Vec<Value> = out.iter().map(|e| job_json(&e.job)).collect();
    Ok((StatusCode::CREATED, Json(json!({ "count": jobs.len(), "jobs": jobs }))).into_response())
}

/// `GET /ojs/v1/jobs/{id}`, with the error history in `errors[]`.
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    let job = state.store.get_job(id).await?.ok_or_else(|| ApiError::not_found("job", id))?;
    let attempts = state.store.attempts(id).await?;
    Ok(Json(json!({ "job": job_json_with_errors(&job, &attempts) })))
}

/// `GET /ojs/v1/jobs/{id}/progress`: the job's latest progress report (0 before any).
pub async fn progress(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    state.store.get_job(id).await?.ok_or_else(|| ApiError::not_found("job", id))?;
    let latest = state.store.latest_progress(id).await?;
    Ok(Json(super::workers::progress_json(id, latest.as_ref())))
}

/// `DELETE /ojs/v1/jobs/{id}`: cancels a job that has not finished; 409 if it has.
pub async fn cancel(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    let (job, previous) = state.store.cancel_from(id, Some(&caller.actor())).await?;
    let mut job = job_json(&job);
    if let Some(m) = job.as_object_mut() {
        m.insert("previous_state".into(), Value::String(previous.as_str().to_owned()));
    }
    Ok(Json(json!({ "job": job })))
}

/// `POST /ojs/v1/jobs/{id}/activate`: a `pending` job becomes available (or scheduled);
/// audited, as a cancel is.
pub async fn activate(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    let job = state.store.activate(id, Some(&caller.actor())).await?;
    Ok(Json(json!({ "job": job_json(&job) })))
}
