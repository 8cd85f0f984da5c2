//! `GET /ojs/v1/events`: recent job events, newest first, read back from the store.

use axum::Json;
use axum::extract::State;
use jiff::Timestamp;
use rebound_queue::job::validate_queue;
use rebound_queue::store::{EVENT_TYPES, EventFilter, JobEvent};
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::query::QueryParams;
use crate::AppState;

fn event_json(e: &JobEvent) -> Value {
    let mut data = Map::new();
    data.insert("job_id".into(), Value::String(e.job_id.to_string()));
    data.insert("job_type".into(), Value::String(e.job_type.clone()));
    data.insert("queue".into(), Value::String(e.queue.clone()));
    if let Some(a) = e.attempt {
        data.insert("attempt".into(), json!(a));
    }
    if let Some(ms) = e.duration_ms {
        data.insert("duration_ms".into(), json!(ms));
    }
    if let Some(err) = &e.error {
        data.insert("error".into(), err.clone());
    }
    if let Some(w) = &e.worker_id {
        data.insert("worker_id".into(), Value::String(w.clone()));
    }
    json!({
        "id": format!("{}:{}:{}", e.event_type, e.job_id, e.attempt.unwrap_or(0)),
        "type": e.event_type,
        "time": e.at.to_string(),
        "subject": e.job_id.to_string(),
        "data": data,
    })
}

/// `?types=job.completed,job.failed&queues=q1,q2&job_id=&since=&limit=`.
pub async fn list(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["types", "type", "queues", "queue", "job_id", "since", "limit"])?;
    let mut types = q.list("types");
    types.extend(q.list("type"));
    if let Some(bad) = types.iter().find(|t| !EVENT_TYPES.contains(t)) {
        return Err(ApiError::invalid_field("types", format!("unknown event type {bad:?}; expected one of {}", EVENT_TYPES.join(", "))));
    }
    let mut queues = q.list("queues");
    queues.extend(q.list("queue"));
    for queue in &queues {
        validate_queue(queue).map_err(|e| ApiError::invalid_field("queues", e.reason))?;
    }
    let since = match q.one("since")? {
        None => None,
        Some(s) => Some(s.parse::<Timestamp>().map_err(|e| ApiError::invalid_field("since", format!("must be an RFC 3339 timestamp, got {s:?} ({e})")))?),
    };
    let filter = EventFilter {
        types: types.into_iter().map(str::to_owned).collect(),
        queues: queues.into_iter().map(str::to_owned).collect(),
        job_id: q.uuid("job_id")?,
        since,
        limit: q.i64_in("limit", 1, 1000)?.unwrap_or(100),
    };
    let events = state.store.events(&filter).await?;
    Ok(Json(json!({ "events": events.iter().map(event_json).collect::<Vec<_>>() })))
}
