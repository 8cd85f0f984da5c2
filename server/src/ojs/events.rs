//! `GET /ojs/v1/events`: recent job and cron events, newest first, read back from the store.

use axum::Json;
use axum::extract::State;
use jiff::Timestamp;
use rebound_queue::job::validate_queue;
use rebound_queue::store::{CRON_EVENT_TYPES, CronEvent, EVENT_TYPES, EventFilter, JobEvent};
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

fn cron_event_json(e: &CronEvent) -> Value {
    let mut data = json!({
        "cron_name": e.cron_name,
        "cron_expression": e.expression,
        "timezone": e.timezone,
        "scheduled_time": e.scheduled_time.to_string(),
        "actual_time": e.actual_time.to_string(),
    });
    if let Some(m) = data.as_object_mut() {
        if let Some(id) = e.job_id {
            m.insert("job_id".into(), Value::String(id.to_string()));
        }
        for (k, v) in [("job_type", &e.job_type), ("queue", &e.queue)] {
            if let Some(v) = v {
                m.insert(k.into(), Value::String(v.clone()));
            }
        }
        if e.manual {
            m.insert("manual".into(), Value::Bool(true));
        }
        if let Some(r) = e.reason {
            m.insert("reason".into(), Value::String(r.into()));
        }
    }
    json!({
        "id": format!("{}:{}:{}", e.event_type, e.cron_name, e.scheduled_time),
        "type": e.event_type,
        "time": e.actual_time.to_string(),
        "subject": e.cron_name,
        "data": data,
    })
}

/// `?types=job.completed,job.failed,cron.triggered&queues=q1,q2&job_id=&since=&limit=`:
/// job events and cron events (`cron.triggered`, `cron.skipped`), newest first.
pub async fn list(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["types", "type", "queues", "queue", "job_id", "since", "limit"])?;
    let mut types = q.list("types");
    types.extend(q.list("type"));
    if let Some(bad) = types.iter().find(|t| !EVENT_TYPES.contains(t) && !CRON_EVENT_TYPES.contains(t)) {
        let known: Vec<&str> = EVENT_TYPES.iter().chain(CRON_EVENT_TYPES.iter()).copied().collect();
        return Err(ApiError::invalid_field("types", format!("unknown event type {bad:?}; expected one of {}", known.join(", "))));
    }
    let (cron_types, job_types): (Vec<&str>, Vec<&str>) = types.iter().partition(|t| CRON_EVENT_TYPES.contains(t));
    let mut queues = q.list("queues");
    queues.extend(q.list("queue"));
    for queue in &queues {
        validate_queue(queue).map_err(|e| ApiError::invalid_field("queues", e.reason))?;
    }
    let since = match q.one("since")? {
        None => None,
        // Bounded like every time the API reads: Postgres would not read jiff's spelling of
        // a year before 1 (`-009999-…`), and the query would fail instead of the request.
        Some(s) => Some(super::envelope::parse_time(s, Timestamp::now()).map_err(|r| ApiError::invalid_field("since", r))?),
    };
    let only_cron = !types.is_empty() && job_types.is_empty();
    let only_jobs = !types.is_empty() && cron_types.is_empty();
    let filter = EventFilter {
        types: job_types.into_iter().map(str::to_owned).collect(),
        queues: queues.into_iter().map(str::to_owned).collect(),
        job_id: q.uuid("job_id")?,
        since,
        limit: q.i64_in("limit", 1, 1000)?.unwrap_or(100),
    };
    let jobs = if only_cron { Vec::new() } else { state.store.events(&filter).await? };
    let crons = if only_jobs {
        Vec::new()
    } else {
        let types: Vec<String> = cron_types.into_iter().map(str::to_owned).collect();
        state.store.cron_events(&types, &filter.queues, filter.job_id, filter.since, filter.limit).await?
    };
    let mut all: Vec<(jiff::Timestamp, Value)> = jobs.iter().map(|e| (e.at, event_json(e))).chain(crons.iter().map(|e| (e.actual_time, cron_event_json(e)))).collect();
    all.sort_by_key(|e| std::cmp::Reverse(e.0));
    all.truncate(usize::try_from(filter.limit).unwrap_or(100));
    Ok(Json(json!({ "events": all.into_iter().map(|(_, v)| v).collect::<Vec<_>>() })))
}
