//! The dead-letter queue (`ojs-dead-letter.md`): list (keyset pages by cursor or offset), get,
//! retry one or all matching a filter, delete one or purge by filter, statistics. Bulk
//! actions require `"confirm": true`.

use axum::Json;
use axum::extract::{Path, State};
use rebound_queue::job::validate_queue;
use jiff::Timestamp;
use rebound_queue::policy::iso8601;
use rebound_queue::PolicyPatch;
use rebound_queue::store::{DeathCursor, JobFilter, JobSelection, PruneConfig, RedriveBudget, RedriveOptions, RedriveOverride};
use serde_json::{Value, json};
use uuid::Uuid;

use super::body::{Fields, JsonObject, path_uuid};
use super::envelope::{job_json, job_json_with_errors, parse_time};
use super::error::ApiError;
use super::query::QueryParams;
use crate::AppState;
use crate::auth::Caller;

/// Counting stops here; `total` is then "at least this many".
const COUNT_CAP: i64 = 100_000;

/// `GET /ojs/v1/dead-letter?queue=&type=&error_type=&q=&dead_since=&dead_before=&limit=&cursor=|offset=`.
/// Searchable (ojs-dead-letter §9.1) by queue, job type, the last error's type (exact, or a
/// prefix with `.*`), a substring of the args or the error message (`q`), and when the job was
/// dead-lettered (`dead_since`, `dead_before`: RFC 3339 times;
/// the listing stays newest-created first, so these search like `q`). Pages are keyset-based
/// (page 1000 costs what page 1 does): follow `next_cursor`, or page by `offset` (see
/// [`super::offset_pages`]), as some SDKs do. `error_type` and `q` are searches, as on the
/// dashboard: each page reads a bounded window of the newest dead letters matching the rest
/// (`rebound_queue::store::SEARCH_WINDOW`), so a search pages by cursor only, and its `total`
/// counts within the window when `pagination.total_searched` says how many were read.
/// `sort=dead_lettered_at` lists them most recently dead-lettered first instead (see
/// [`list_by_death`]).
pub async fn list(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["queue", "type", "error_type", "q", "dead_since", "dead_before", "limit", "cursor", "offset", "sort", "order"])?;
    let by_death = match q.one("sort")? {
        None | Some("created_at") => false,
        Some("dead_lettered_at") => true,
        Some(_) => return Err(ApiError::invalid_field("sort", "must be created_at (the default) or dead_lettered_at")),
    };
    if q.one("order")?.is_some_and(|o| o != "desc") {
        return Err(ApiError::invalid_field("order", "must be desc: the newest first (created, or dead-lettered with sort=dead_lettered_at)"));
    }
    let mut filter = JobFilter::dead_letters();
    for (key, slot) in [("dead_since", &mut filter.dead_after), ("dead_before", &mut filter.dead_before)] {
        if let Some(s) = q.one(key)? {
            *slot = Some(parse_time(s, Timestamp::now()).map_err(|r| ApiError::invalid_field(key, r))?);
        }
    }
    if let Some(e) = q.one("error_type")? {
        filter.error_type = Some(error_type_filter(e).map_err(|r| ApiError::invalid_field("error_type", r))?);
    }
    if let Some(text) = q.one("q")? {
        if text.len() > 200 {
            return Err(ApiError::invalid_field("q", "must be at most 200 characters"));
        }
        filter.text = Some(text.to_owned());
    }
    if let Some(queue) = q.one("queue")? {
        validate_queue(queue).map_err(|e| ApiError::invalid_field("queue", e.reason))?;
        filter.queue = Some(queue.to_owned());
    }
    if let Some(t) = q.one("type")? {
        rebound_queue::job::validate_type_filter(t).map_err(|e| ApiError::invalid_field("type", e.reason))?;
        filter.job_type = Some(t.to_owned());
    }
    let limit = q.i64_in("limit", 1, 200)?.unwrap_or(50);
    if by_death {
        return list_by_death(&state, &q, &filter, limit).await;
    }
    let offset = q.i64_in("offset", 0, i64::from(i32::MAX))?;
    let mut cursor = q.uuid("cursor")?;
    // The listing's identity for remembered offsets: its filter, as the client spelled it.
    let listing = format!("{filter:?}");
    if let Some(offset) = offset.filter(|o| *o > 0) {
        if cursor.is_some() {
            return Err(ApiError::invalid_field("offset", "give either offset or cursor, not both"));
        }
        // Skipping to an offset of a search would check every dead letter row by row.
        if filter.is_search() {
            return Err(ApiError::invalid_field("offset", "a search (error_type, q, dead_since, dead_before) pages by cursor: follow next_cursor"));
        }
        cursor = match state.offset_pages.start_of(&listing, offset) {
            Some(id) => Some(id),
            None if offset > super::offset_pages::MAX_SCANNED_OFFSET => return Err(super::offset_pages::too_deep("offset", offset)),
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
    let counted = state.store.count_jobs_bounded(&filter, COUNT_CAP).await?;
    let ids: Vec<Uuid> = page.items.iter().map(|j| j.id).collect();
    let attempts = state.store.attempts_for(&ids).await?;
    let jobs: Vec<Value> = page.items.iter().map(|j| job_json_with_errors(j, &attempts)).collect();
    let total = counted.n.min(COUNT_CAP);
    let mut pagination = json!({ "total": total, "limit": limit, "offset": offset.unwrap_or(0), "has_more": page.next.is_some() });
    if let Some(p) = pagination.as_object_mut() {
        if let Some(next) = page.next {
            p.insert("next_cursor".into(), Value::String(next.to_string()));
        }
        // `total` is then what the window held, not every match.
        if counted.windowed {
            p.insert("total_searched".into(), json!(rebound_queue::store::SEARCH_WINDOW));
        }
    }
    Ok(Json(json!({ "jobs": jobs, "pagination": pagination })))
}

/// The listing most recently dead-lettered first (`sort=dead_lettered_at`): after a fix, what
/// just failed, whenever it was created. Pages by cursor only (its own kind, as given in
/// `next_cursor`); conditions other than the queue are a search, as in the default order.
async fn list_by_death(state: &AppState, q: &QueryParams, filter: &JobFilter, limit: i64) -> Result<Json<Value>, ApiError> {
    if q.one("offset")?.is_some_and(|o| o != "0") {
        return Err(ApiError::invalid_field("offset", "sort=dead_lettered_at pages by cursor: follow next_cursor"));
    }
    let after = match q.one("cursor")? {
        None => None,
        Some(c) => Some(DeathCursor::parse(c).ok_or_else(|| ApiError::invalid_field("cursor", "is not a cursor of this listing: use next_cursor as given"))?),
    };
    let (items, next, counted) = state.store.dead_letters_by_death_counted(filter, after, limit, COUNT_CAP).await?;
    let ids: Vec<Uuid> = items.iter().map(|j| j.id).collect();
    let attempts = state.store.attempts_for(&ids).await?;
    let jobs: Vec<Value> = items.iter().map(|j| job_json_with_errors(j, &attempts)).collect();
    let mut pagination = json!({ "total": counted.n.min(COUNT_CAP), "limit": limit, "has_more": next.is_some(), "sort": "dead_lettered_at" });
    if let Some(p) = pagination.as_object_mut() {
        if let Some(next) = next {
            p.insert("next_cursor".into(), Value::String(next.encode()));
        }
        if counted.windowed {
            p.insert("total_searched".into(), json!(rebound_queue::store::SEARCH_WINDOW));
        }
    }
    Ok(Json(json!({ "jobs": jobs, "pagination": pagination })))
}

/// `POST /ojs/v1/dead-letter/{id}/retry`: back to `available` with a fresh attempt budget.
pub async fn retry(State(state): State<AppState>, caller: Caller, Path(id): Path<String>, body: Option<JsonObject>) -> Result<Json<Value>, ApiError> {
    retry_one(&state, &caller, &id, body.as_ref(), "OJS dead-letter retry").await
}

/// Re-drives one dead letter with a fresh budget, applying the body's `override` first if it
/// has one (§6.3: `queue`, `meta` merged, `retry` merged over the job's own, `args`,
/// `priority`). Shared by the dead-letter and admin endpoints.
pub async fn retry_one(state: &AppState, caller: &Caller, id: &str, body: Option<&JsonObject>, reason: &str) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(id)?;
    let changes = retry_override(body)?;
    let opts = RedriveOptions { budget: RedriveBudget::Fresh, stagger: None, actor: caller.actor(), reason: Some(reason.into()) };
    let redriven = match &changes {
        Some(changes) => state.store.redrive_with_override(id, changes, &opts).await?,
        None => state.store.redrive(&JobSelection::Ids(vec![id]), &opts).await? == 1,
    };
    if !redriven {
        return Err(ApiError::not_found("dead-letter job", id));
    }
    let job = state.store.job(id).await?;
    Ok(Json(json!({ "job": job_json(&job) })))
}

/// The `override` of a retry body, if any. Other top-level fields are left alone (clients
/// send `{}` or their own bookkeeping); inside `override` an unknown field is refused, so a
/// typo never re-drives a job unchanged.
fn retry_override(body: Option<&JsonObject>) -> Result<Option<RedriveOverride>, ApiError> {
    let Some(body) = body else { return Ok(None) };
    let Some(o) = body.fields().object("override")? else { return Ok(None) };
    o.only(&["queue", "meta", "retry", "args", "priority"])?;
    let retry = match o.get("retry") {
        Some(v) => Some(PolicyPatch::from_json(v).map_err(|e| {
            let field = if e.field == "retry" { "retry".to_string() } else { format!("retry.{}", e.field) };
            o.error(&field, e.reason)
        })?),
        None => None,
    };
    Ok(Some(RedriveOverride {
        queue: o.str("queue")?.map(str::to_owned),
        meta: o.get("meta").cloned(),
        retry,
        args: o.get("args").cloned(),
        priority: o.i64_in("priority", -100, 100)?.map(|p| p as i16),
    }))
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

/// The dead letters a bulk request's fields select: `queue`, `type`, `error_type` (exact or
/// `Prefix.*`), `since` / `older_than` (by when the job was created), `dead_since` /
/// `dead_before` (by when it was dead-lettered: after a fix, the jobs that failed since).
pub fn purge_filter(f: &Fields<'_>) -> Result<JobFilter, ApiError> {
    let mut filter = JobFilter::dead_letters();
    if let Some(queue) = f.str("queue")? {
        validate_queue(queue).map_err(|e| f.error("queue", e.reason))?;
        filter.queue = Some(queue.to_owned());
    }
    if let Some(t) = f.str("type")? {
        rebound_queue::job::validate_type_filter(t).map_err(|e| f.error("type", e.reason))?;
        filter.job_type = Some(t.to_owned());
    }
    if let Some(e) = f.str("error_type")? {
        filter.error_type = Some(error_type_filter(e).map_err(|r| f.error("error_type", r))?);
    }
    for (key, slot) in [
        ("since", &mut filter.created_after),
        ("older_than", &mut filter.created_before),
        ("dead_since", &mut filter.dead_after),
        ("dead_before", &mut filter.dead_before),
    ] {
        if let Some(s) = f.str(key)? {
            *slot = Some(parse_time(s, Timestamp::now()).map_err(|r| f.error(key, r))?);
        }
    }
    Ok(filter)
}

/// An `error_type` filter, as every listing and bulk action takes it. It is matched row by row
/// (a search), so its length is bounded: it is compared with every dead letter in the window.
pub fn error_type_filter(e: &str) -> Result<String, &'static str> {
    if e.is_empty() || e.len() > 200 {
        return Err("must be 1 to 200 characters");
    }
    Ok(e.to_owned())
}

/// `GET /ojs/v1/dead-letter/{id}`: one dead letter with its full error history.
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    let job = state.store.get_job(id).await?.filter(|j| j.dead_letter).ok_or_else(|| ApiError::not_found("dead-letter job", id))?;
    let attempts = state.store.attempts(id).await?;
    Ok(Json(json!({ "job": job_json_with_errors(&job, &attempts) })))
}

/// `POST /ojs/v1/dead-letter/retry` with `{"filter": {queue, type, since, older_than, dead_since, dead_before, error_type}, "confirm": true}`.
pub async fn retry_matching(State(state): State<AppState>, caller: Caller, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    f.only(&["filter", "confirm"])?;
    if f.bool("confirm")? != Some(true) {
        return Err(f.error("confirm", "must be true: this re-drives every dead letter the filter matches"));
    }
    let g = f.object("filter")?.ok_or_else(|| f.error("filter", "is required (an empty object matches every dead letter)"))?;
    g.only(&["queue", "type", "since", "older_than", "dead_since", "dead_before", "error_type"])?;
    let filter = purge_filter(&g)?;
    let opts = RedriveOptions { budget: RedriveBudget::Fresh, stagger: None, actor: caller.actor(), reason: Some("OJS dead-letter bulk retry".into()) };
    let retried = state.store.redrive(&JobSelection::Filter(filter), &opts).await?;
    Ok(Json(json!({ "retried": retried, "matched": retried })))
}

/// `DELETE /ojs/v1/dead-letter` with `{"queue"?, "type"?, "error_type"?, "older_than"?, "confirm": true}`.
pub async fn purge(State(state): State<AppState>, caller: Caller, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    f.only(&["queue", "type", "error_type", "since", "older_than", "dead_since", "dead_before", "confirm"])?;
    if f.bool("confirm")? != Some(true) {
        return Err(f.error("confirm", "must be true: this deletes every dead letter the filter matches, for good"));
    }
    let filter = purge_filter(&f)?;
    let purged = state.store.purge_dead_letters(&JobSelection::Filter(filter), &caller.actor(), Some("OJS dead-letter purge")).await?;
    Ok(Json(json!({ "purged_count": purged, "deleted": purged })))
}

/// `GET /ojs/v1/dead-letter/stats?queue=&type=`: counts by queue and error type, the age span,
/// and the retention: this server's when it prunes (`--prune`), else the pruner's defaults
/// (workers configure their own under `[prune]`, which the server cannot see).
pub async fn stats(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["queue", "type"])?;
    let mut filter = JobFilter::dead_letters();
    if let Some(queue) = q.one("queue")? {
        validate_queue(queue).map_err(|e| ApiError::invalid_field("queue", e.reason))?;
        filter.queue = Some(queue.to_owned());
    }
    if let Some(t) = q.one("type")? {
        rebound_queue::job::validate_type_filter(t).map_err(|e| ApiError::invalid_field("type", e.reason))?;
        filter.job_type = Some(t.to_owned());
    }
    let s = state.store.dead_letter_stats(&filter).await?;
    let (retention, source) = match &state.config.retention {
        Some(own) => (own.clone(), "this server's pruner (--prune)"),
        None => (PruneConfig::default(), "defaults of the worker's pruner"),
    };
    Ok(Json(json!({
        "total": s.total,
        "by_queue": s.by_queue,
        "by_error_type": s.by_error_type,
        "oldest_at": s.oldest_at.map(|t| t.to_string()),
        "newest_at": s.newest_at.map(|t| t.to_string()),
        "retention": {
            "max_age": iso8601::format(retention.dead_letters_after),
            "max_count": retention.dead_letters_per_queue,
            "max_count_scope": "queue",
            "source": source,
            "next_prune_at": null,
        },
    })))
}
