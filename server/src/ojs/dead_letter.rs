//! The dead-letter queue: list (keyset-paginated with an opaque cursor), retry, delete.

use axum::Json;
use axum::extract::{Path, State};
use rebound_queue::job::validate_queue;
use rebound_queue::store::{JobFilter, JobSelection, RedriveBudget, RedriveOptions};
use serde_json::{Value, json};
use uuid::Uuid;

use super::body::path_uuid;
use super::envelope::{job_json, job_json_with_errors};
use super::error::ApiError;
use super::query::QueryParams;
use crate::AppState;
use crate::auth::Caller;

/// Counting stops here; `total` is then "at least this many".
const COUNT_CAP: i64 = 100_000;

/// `GET /ojs/v1/dead-letter?queue=&type=&limit=&cursor=|offset=`. Pages are keyset-based
/// (page 1000 costs what page 1 does): follow `next_cursor`, or page by `offset` (see
/// [`super::offset_pages`]), as some SDKs do.
pub async fn list(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["queue", "type", "limit", "cursor", "offset"])?;
    let mut filter = JobFilter::dead_letters();
    if let Some(queue) = q.one("queue")? {
        validate_queue(queue).map_err(|e| ApiError::invalid_field("queue", e.reason))?;
        filter.queue = Some(queue.to_owned());
    }
    if let Some(t) = q.one("type")? {
        rebound_queue::job::validate_type(t).map_err(|e| ApiError::invalid_field("type", e.reason))?;
        filter.job_type = Some(t.to_owned());
    }
    let limit = q.i64_in("limit", 1, 200)?.unwrap_or(50);
    let offset = q.i64_in("offset", 0, i64::from(i32::MAX))?;
    let mut cursor = q.uuid("cursor")?;
    // The listing's identity for remembered offsets: its filter, as the client spelled it.
    let listing = format!("{:?}|{:?}", filter.queue, filter.job_type);
    if let Some(offset) = offset.filter(|o| *o > 0) {
        if cursor.is_some() {
            return Err(ApiError::invalid_field("offset", "give either offset or cursor, not both"));
        }
        cursor = match state.offset_pages.start_of(&listing, offset) {
            Some(id) => Some(id),
            None => match state.store.job_id_at_offset(&filter, offset).await? {
                Some(id) => Some(id),
                None => {
                    let total = state.store.count_jobs(&filter, COUNT_CAP).await?;
                    let pagination = json!({ "total": total, "limit": limit, "offset": offset, "has_more": false });
                    return Ok(Json(json!({ "jobs": [], "pagination": pagination })));
                }
            },
        };
    }
    let page = state.store.list_jobs(&filter, cursor, limit).await?;
    if let (Some(offset), Some(last)) = (offset, page.items.last()) {
        state.offset_pages.remember(&listing, offset + page.items.len() as i64, last.id);
    }
    let total = state.store.count_jobs(&filter, COUNT_CAP).await?;
    let ids: Vec<Uuid> = page.items.iter().map(|j| j.id).collect();
    let attempts = state.store.attempts_for(&ids).await?;
    let jobs: Vec<Value> = page.items.iter().map(|j| job_json_with_errors(j, &attempts)).collect();
    let mut pagination = json!({ "total": total, "limit": limit, "offset": offset.unwrap_or(0), "has_more": page.next.is_some() });
    if let (Some(next), Some(p)) = (page.next, pagination.as_object_mut()) {
        p.insert("next_cursor".into(), Value::String(next.to_string()));
    }
    Ok(Json(json!({ "jobs": jobs, "pagination": pagination })))
}

/// `POST /ojs/v1/dead-letter/{id}/retry`: back to `available` with a fresh attempt budget.
pub async fn retry(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    let opts = RedriveOptions { budget: RedriveBudget::Fresh, stagger: None, actor: caller.actor(), reason: Some("OJS dead-letter retry".into()) };
    if state.store.redrive(&JobSelection::Ids(vec![id]), &opts).await? == 0 {
        return Err(ApiError::not_found("dead-letter job", id));
    }
    let job = state.store.job(id).await?;
    Ok(Json(json!({ "job": job_json(&job) })))
}

/// `DELETE /ojs/v1/dead-letter/{id}`: removes a dead letter for good.
pub async fn delete(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    let deleted = state.store.purge_dead_letters(&JobSelection::Ids(vec![id]), &caller.actor(), Some("OJS dead-letter delete")).await?;
    if deleted == 0 {
        return Err(ApiError::not_found("dead-letter job", id));
    }
    Ok(Json(json!({ "deleted": true, "job_id": id.to_string() })))
}
