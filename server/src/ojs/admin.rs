//! The OJS admin API (`ojs-admin-api.md`) under `/ojs/v1/admin`: queues, jobs, bulk actions,
//! workers, statistics, dead letters and system configuration, on the store functions the
//! dashboard uses. Destructive and bulk operations require `"confirm": true` (400 without it).
//!
//! Pages are `page` / `per_page` as the spec has them; underneath they are keyset pages over
//! the listing index (see [`super::offset_pages`]).

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use jiff::Timestamp;
use rebound_queue::job::{validate_queue, validate_type_filter};
use rebound_queue::policy::iso8601;
use rebound_queue::store::{BulkReport, JobFilter, JobSelection, Maintenance, Order, QueueInfo, QueueRetention, SortKey, WorkerInfo};
use rebound_queue::{Job, JobState};
use serde_json::{Map, Value, json};

use super::body::{Fields, JsonObject, path_uuid};
use super::envelope::{job_json, job_json_with_errors, parse_time};
use super::error::ApiError;
use super::query::QueryParams;
use super::unsupported::unsupported;
use crate::AppState;
use crate::auth::Caller;

/// Counting stops here; `total` is then "at least this many".
const COUNT_CAP: i64 = 100_000;
/// A worker silent this long is stale: it may be deregistered.
const STALE_AFTER: Duration = Duration::from_secs(60);

fn counts(q: &QueueInfo) -> Value {
    json!({
        "scheduled": q.scheduled, "available": q.available, "pending": q.pending, "active": q.active,
        "retryable": q.retryable, "completed": q.completed, "cancelled": q.cancelled, "discarded": q.discarded,
        "dead_letters": q.dead_letters,
    })
}

fn queue_item(q: &QueueInfo) -> Value {
    json!({
        "name": q.name,
        "state": if q.paused { "paused" } else { "active" },
        "paused": q.paused,
        "paused_at": q.paused_at.map(|t| t.to_string()),
        "paused_by": q.paused_by,
        "counts": counts(q),
    })
}

fn queue_name(raw: &str) -> Result<&str, ApiError> {
    validate_queue(raw).map_err(|e| ApiError::invalid_field("name", e.reason))?;
    Ok(raw)
}

/// `confirm` must be `true` for destructive and bulk operations.
fn confirmed(f: &Fields<'_>) -> Result<(), ApiError> {
    match f.bool("confirm")? {
        Some(true) => Ok(()),
        _ => Err(f.error("confirm", "must be true: this operation changes or removes many jobs and cannot be undone")),
    }
}

/// `page` (1-based) and `per_page` (1..=100, default 20).
fn paging(q: &QueryParams) -> Result<(i64, i64), ApiError> {
    let page = q.i64_in("page", 1, 1_000_000)?.unwrap_or(1);
    let per_page = q.i64_in("per_page", 1, 100)?.unwrap_or(20);
    Ok((page, per_page))
}

fn paginated(total: i64, page: i64, per_page: i64, has_more: bool) -> Value {
    json!({ "total": total, "page": page, "per_page": per_page, "has_more": has_more })
}

// ---- queues ----------------------------------------------------------------------------

/// `GET /admin/queues`.
pub async fn queues(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["page", "per_page"])?;
    let (page, per_page) = paging(&q)?;
    let all = state.store.queues().await?;
    let total = all.len() as i64;
    let items: Vec<Value> = all.iter().skip(((page - 1) * per_page) as usize).take(per_page as usize).map(queue_item).collect();
    Ok(Json(json!({ "items": items, "pagination": paginated(total, page, per_page, page * per_page < total) })))
}

/// `GET /admin/queues/{name}`: counts, configuration (rate limit), oldest available job.
pub async fn queue(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let q = state.store.queue(queue_name(&name)?).await?;
    let mut v = queue_item(&q);
    let settings = state.store.queue_settings(&name).await?;
    let oldest_at = state.store.oldest_available_at(&name).await?;
    if let Some(m) = v.as_object_mut() {
        let limit = settings.limit;
        m.insert("configuration".into(), json!({
            "concurrency": limit.and_then(|l| l.concurrency), "rate_limit": limit.map(|l| l.to_json()), "retention": retention_json(&settings.retention),
            "concurrency_override": settings.concurrency_override.map(|o| o.to_json()),
        }));
        m.insert("oldest_available_at".into(), json!(oldest_at.map(|t| t.to_string())));
    }
    Ok(Json(v))
}

/// `POST /admin/queues/{name}/pause`.
pub async fn pause_queue(State(state): State<AppState>, caller: Caller, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let q = state.store.set_queue_paused(queue_name(&name)?, true, &caller.actor()).await?;
    Ok(Json(json!({ "name": q.name, "paused": true, "paused_at": q.paused_at.map(|t| t.to_string()), "queue": queue_item(&q) })))
}

/// `POST /admin/queues/{name}/resume`.
pub async fn resume_queue(State(state): State<AppState>, caller: Caller, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let q = state.store.set_queue_paused(queue_name(&name)?, false, &caller.actor()).await?;
    Ok(Json(json!({ "name": q.name, "paused": false, "queue": queue_item(&q) })))
}

/// `DELETE /admin/queues/{name}/jobs` with `{"states", "older_than"?, "confirm": true}`. One
/// call deletes at most `BULK_LIMIT` jobs; `has_more` says matching jobs remain, so a client
/// repeats it rather than taking a capped count for the whole purge.
pub async fn purge_queue(State(state): State<AppState>, caller: Caller, Path(name): Path<String>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    f.only(&["states", "older_than", "confirm"])?;
    confirmed(&f)?;
    let names = f.strings("states")?.ok_or_else(|| f.error("states", "is required: the states of the jobs to purge"))?;
    let states = names
        .iter()
        .enumerate()
        .map(|(i, s)| s.parse::<JobState>().map_err(|e| f.error(&format!("states[{i}]"), e)))
        .collect::<Result<Vec<_>, _>>()?;
    let older_than = time_field(&f, "older_than")?;
    let (purged, has_more) = state.store.purge_queue(queue_name(&name)?, &states, older_than, &caller.actor()).await?;
    Ok(Json(json!({ "purged_count": purged, "states": names, "queue": name, "has_more": has_more })))
}

/// `PUT /admin/queues/{name}/config`: the queue's `rate_limit` (null to remove it) and
/// `concurrency` (its concurrency limit across every worker; null removes it; alone, it
/// leaves the rate and throttle as they are). `retention` belongs to the pruner's configuration.
pub async fn queue_config(State(state): State<AppState>, caller: Caller, Path(name): Path<String>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    f.only(&["rate_limit", "concurrency", "retention"])?;
    // Most of the queue's jobs active at once, across every worker and fetch: the queue's
    // concurrency limit (null removes it).
    // (`get` reads null as absent; here null means "remove".)
    let concurrency = match f.map().get("concurrency") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(_) => Some(Some(u32::try_from(f.i64_in("concurrency", 0, i64::from(i32::MAX))?.unwrap_or(0)).unwrap_or(u32::MAX))),
    };
    let queue = queue_name(&name)?;
    // Read in full before anything is saved: a bad part refuses the whole body.
    let retention = match f.map().get("retention") {
        None => None,
        Some(Value::Null) => Some(QueueRetention::default()),
        Some(_) => Some(retention(&f)?),
    };
    let limit = super::rate_limits::parse(&f, "rate_limit")?;
    // An empty body removes the limits, as it always has; one that names only the retention
    // leaves them as they are.
    let limits_named = f.map().contains_key("rate_limit") || concurrency.is_some() || f.map().is_empty();
    match (f.map().contains_key("rate_limit"), concurrency) {
        _ if !limits_named => {}
        (false, Some(c)) => {
            state.store.set_queue_concurrency(queue, c, &caller.actor()).await?;
        }
        (_, c) => {
            let mut limit = limit;
            // A top-level concurrency wins over one inside the rate_limit.
            if let Some(c) = c {
                limit.get_or_insert_with(Default::default).concurrency = c;
            }
            state.store.set_queue_rate_limit(queue, limit.as_ref(), &caller.actor()).await?;
        }
    }
    if let Some(r) = retention {
        state.store.set_queue_retention(queue, r, &caller.actor()).await?;
    }
    // What the queue's row holds now, written or kept, read once.
    let settings = state.store.queue_settings(queue).await?;
    Ok(Json(json!({ "name": name, "configuration": {
        "concurrency": settings.limit.and_then(|l| l.concurrency),
        "rate_limit": settings.limit.map(|l| l.to_json()),
        "retention": retention_json(&settings.retention),
        "concurrency_override": settings.concurrency_override.map(|o| o.to_json()),
    } })))
}

/// A queue config's `retention`: `{completed, discarded}`, each an ISO-8601 duration or null
/// (the pruner's).
fn retention(f: &Fields<'_>) -> Result<QueueRetention, ApiError> {
    let r = f.object("retention")?.ok_or_else(|| f.error("retention", "must be an object {completed, discarded}"))?;
    r.only(&["completed", "discarded"])?;
    // Bounded here too, not only by the store: nothing of the body may be saved before a
    // part of it is refused.
    let part = |key: &str| -> Result<Option<Duration>, ApiError> {
        match r.str(key)? {
            None => Ok(None),
            Some(s) => {
                let d = iso8601::parse(s).map_err(|e| r.error(key, e))?;
                rebound_queue::bounds::check_interval(d).map_err(|e| r.error(key, e))?;
                Ok(Some(d))
            }
        }
    };
    Ok(QueueRetention { completed: part("completed")?, discarded: part("discarded")? })
}

fn retention_json(r: &QueueRetention) -> Value {
    let iso = |d: Option<Duration>| d.map(iso8601::format);
    json!({ "completed": iso(r.completed), "discarded": iso(r.discarded) })
}

// ---- jobs ------------------------------------------------------------------------------

fn time_field(f: &Fields<'_>, key: &str) -> Result<Option<Timestamp>, ApiError> {
    match f.str(key)? {
        None => Ok(None),
        Some(s) => parse_time(s, Timestamp::now()).map(Some).map_err(|r| f.error(key, r)),
    }
}

fn query_time(q: &QueryParams, key: &str) -> Result<Option<Timestamp>, ApiError> {
    match q.one(key)? {
        None => Ok(None),
        Some(s) => parse_time(s, Timestamp::now()).map(Some).map_err(|r| ApiError::invalid_field(key, r)),
    }
}

/// A job filter from the query string: `queue`, `state`, `type`, `since`, `until`.
fn query_filter(q: &QueryParams) -> Result<JobFilter, ApiError> {
    let mut filter = JobFilter::default();
    if let Some(queue) = q.one("queue")? {
        filter.queue = Some(queue_name(queue).map_err(|_| ApiError::invalid_field("queue", format!("{queue:?} is not a queue name")))?.to_owned());
    }
    for s in q.list("state") {
        filter.states.push(s.parse().map_err(|e| ApiError::invalid_field("state", e))?);
    }
    if let Some(t) = q.one("type")? {
        validate_type_filter(t).map_err(|e| ApiError::invalid_field("type", e.reason))?;
        filter.job_type = Some(t.to_owned());
    }
    filter.created_after = query_time(q, "since")?;
    filter.created_before = query_time(q, "until")?;
    Ok(filter)
}

/// A job filter from a bulk request's `filter` object.
fn body_filter(f: &Fields<'_>) -> Result<JobFilter, ApiError> {
    let Some(g) = f.object("filter")? else { return Err(f.error("filter", "is required (an empty object matches every job)")) };
    g.only(&["queue", "state", "states", "type", "since", "until", "error_type"])?;
    let mut filter = JobFilter::default();
    if let Some(queue) = g.str("queue")? {
        validate_queue(queue).map_err(|e| g.error("queue", e.reason))?;
        filter.queue = Some(queue.to_owned());
    }
    let mut states: Vec<&str> = g.strings("states")?.unwrap_or_default();
    states.extend(g.str("state")?);
    for (i, s) in states.into_iter().enumerate() {
        filter.states.push(s.parse().map_err(|e| g.error(&format!("states[{i}]"), e))?);
    }
    if let Some(t) = g.str("type")? {
        validate_type_filter(t).map_err(|e| g.error("type", e.reason))?;
        filter.job_type = Some(t.to_owned());
    }
    if let Some(e) = g.str("error_type")? {
        filter.error_type = Some(super::dead_letter::error_type_filter(e).map_err(|r| g.error("error_type", r))?);
    }
    filter.created_after = time_field(&g, "since")?;
    filter.created_before = time_field(&g, "until")?;
    Ok(filter)
}

/// One page of jobs matching `filter`, by page number, through keyset pages. A search (error
/// type, text) pages on only from a page served before (whose end is remembered), as the OJS
/// dead-letter listing refuses offsets of one: finding where a page starts otherwise would
/// check every job before it row by row.
async fn job_page(state: &AppState, listing: &str, filter: &JobFilter, page: i64, per_page: i64, order: Order) -> Result<(Vec<Job>, bool), ApiError> {
    let offset = (page - 1) * per_page;
    let after = if offset == 0 {
        None
    } else {
        match state.offset_pages.start_of(listing, offset) {
            Some(id) => Some(id),
            None if filter.is_search() => {
                return Err(ApiError::invalid_field(
                    "page",
                    "a search (error_type) pages on one page at a time from its first: ask for the pages before this one first, narrow the search, or page by cursor through GET /ojs/v1/dead-letter",
                ));
            }
            None if offset > super::offset_pages::MAX_SCANNED_OFFSET => return Err(super::offset_pages::too_deep("page", offset)),
            None => match state.store.job_id_at_offset_ordered(filter, offset, order).await? {
                Some(id) => Some(id),
                None => return Ok((Vec::new(), false)),
            },
        }
    };
    let p = state.store.list_jobs_ordered(filter, after, per_page, order).await?;
    if let Some(last) = p.items.last() {
        state.offset_pages.remember(listing, offset + p.items.len() as i64, last.id);
    }
    Ok((p.items, p.next.is_some()))
}

/// `GET /admin/jobs?queue&state&type&since&until&page&per_page&sort&order`. Sorted by
/// creation (`sort=created_at`, the default), newest first or, with `order=asc`, oldest
/// first, at any size; by `priority` or `scheduled_at` as the store's `list_jobs_sorted` can
/// (a filter matching at most 10 000 jobs, or the orders indexes keep).
pub async fn jobs(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["queue", "state", "type", "since", "until", "page", "per_page", "sort", "order"])?;
    let sort = match q.one("sort")? {
        None | Some("created_at") => None,
        Some("priority") => Some(SortKey::Priority),
        Some("scheduled_at") => Some(SortKey::ScheduledAt),
        Some(other) => {
            return Err(ApiError::invalid_field("sort", format!("must be \"created_at\", \"scheduled_at\" or \"priority\", got {other:?}")));
        }
    };
    let order = match q.one("order")? {
        None | Some("desc") => Order::NewestFirst,
        Some("asc") => Order::OldestFirst,
        Some(other) => return Err(ApiError::invalid_field("order", format!("must be \"asc\" or \"desc\", got {other:?}"))),
    };
    let filter = query_filter(&q)?;
    let (page, per_page) = paging(&q)?;
    if let Some(key) = sort {
        let offset = (page - 1).saturating_mul(per_page);
        let (items, has_more) = state.store.list_jobs_sorted(&filter, key, order == Order::NewestFirst, offset, per_page).await?;
        let total = state.store.count_jobs(&filter, COUNT_CAP).await?;
        return Ok(Json(json!({ "items": items.iter().map(job_json).collect::<Vec<_>>(), "pagination": paginated(total, page, per_page, has_more) })));
    }
    let listing = format!("admin-jobs|{order:?}|{}", serde_json::to_string(&filter).unwrap_or_default());
    let (items, has_more) = job_page(&state, &listing, &filter, page, per_page, order).await?;
    let total = state.store.count_jobs(&filter, COUNT_CAP).await?;
    Ok(Json(json!({ "items": items.iter().map(job_json).collect::<Vec<_>>(), "pagination": paginated(total, page, per_page, has_more) })))
}

/// The admin view of one job: the envelope, its errors, its effective retry policy, and its
/// timestamps gathered under `metadata`.
async fn job_detail(state: &AppState, job: &Job) -> Result<Value, ApiError> {
    let attempts = state.store.attempts(job.id).await?;
    let mut v = job_json_with_errors(job, &attempts);
    let patch = job.retry_patch().ok().flatten();
    let effective = state.store.effective_policy(&job.job_type, patch.as_ref()).await?;
    if let Some(m) = v.as_object_mut() {
        m.insert("specversion".into(), json!("1.0"));
        m.insert("retry_policy".into(), effective.policy.to_json());
        let t = |x: Option<Timestamp>| x.map(|t| t.to_string());
        m.insert(
            "metadata".into(),
            json!({
                "created_at": job.created_at.to_string(), "enqueued_at": t(job.enqueued_at), "started_at": t(job.started_at),
                "scheduled_at": job.scheduled_at.to_string(), "completed_at": t(job.completed_at),
                "cancelled_at": t(job.cancelled_at), "discarded_at": t(job.discarded_at),
            }),
        );
    }
    Ok(v)
}

/// `GET /admin/jobs/{id}`.
pub async fn job(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    let job = state.store.get_job(id).await?.ok_or_else(|| ApiError::not_found("job", id))?;
    Ok(Json(job_detail(&state, &job).await?))
}

/// `POST /admin/jobs/{id}/cancel`: the data-plane cancel under the admin path.
pub async fn cancel_job(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    let (job, previous) = state.store.cancel_from(id, Some(&caller.actor())).await?;
    let mut v = job_json(&job);
    if let Some(m) = v.as_object_mut() {
        m.insert("previous_state".into(), json!(previous.as_str()));
    }
    Ok(Json(json!({ "job": v })))
}

/// `POST /admin/jobs/{id}/retry`: a discarded or cancelled job runs again, attempts reset.
pub async fn retry_job(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = path_uuid(&id)?;
    let report = state.store.retry_finished_jobs(&JobSelection::Ids(vec![id]), &caller.actor()).await?;
    if report.matched == 0 {
        return Err(ApiError::not_found("job", id));
    }
    if let Some((_, why)) = report.refused.first() {
        return Err(ApiError::conflict(format!("cannot retry job {id}: {why}")));
    }
    Ok(Json(json!({ "job": job_json(&state.store.job(id).await?) })))
}

fn bulk_json(action: &str, r: &BulkReport) -> Value {
    let errors: Vec<Value> = r.refused.iter().map(|(id, why)| json!({ "job_id": id.to_string(), "error": why })).collect();
    json!({
        "action": action,
        "matched": r.matched,
        "succeeded": r.succeeded,
        "failed": r.matched - r.succeeded,
        "errors": errors,
    })
}

/// `POST /admin/jobs/bulk/{retry|cancel|delete}` with `{"filter": {…}, "confirm": true}`.
pub async fn bulk(State(state): State<AppState>, caller: Caller, Path(action): Path<String>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    f.only(&["filter", "confirm"])?;
    confirmed(&f)?;
    let sel = JobSelection::Filter(body_filter(&f)?);
    let actor = caller.actor();
    let report = match action.as_str() {
        "retry" => state.store.retry_finished_jobs(&sel, &actor).await?,
        "delete" => state.store.delete_finished_jobs(&sel, &actor).await?,
        "cancel" => state.store.cancel_unfinished_jobs(&sel, &actor).await?,
        other => return Err(ApiError::invalid_field("action", format!("unknown bulk action {other:?}; use retry, cancel or delete"))),
    };
    Ok(Json(bulk_json(&action, &report)))
}

// ---- workers ---------------------------------------------------------------------------

fn worker_state(w: &WorkerInfo) -> &'static str {
    if w.silent_for_secs >= STALE_AFTER.as_secs_f64() {
        "stale"
    } else if w.stopping {
        "quiet"
    } else {
        "running"
    }
}

fn worker_json(w: &WorkerInfo) -> Value {
    json!({
        "id": w.id,
        "hostname": w.host,
        "pid": w.pid,
        "state": worker_state(w),
        "queues": w.queues,
        "concurrency": w.concurrency,
        "active_jobs": w.running,
        "started_at": w.started_at.to_string(),
        "last_heartbeat_at": w.last_heartbeat_at.to_string(),
        "version": w.version,
        "memory_mb": w.usage.memory_mb,
        "cpu_percent": w.usage.cpu_percent,
    })
}

/// `GET /admin/workers`.
pub async fn workers(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["page", "per_page"])?;
    let (page, per_page) = paging(&q)?;
    let all = state.store.workers().await?;
    let total = all.len() as i64;
    let count = |s: &str| all.iter().filter(|w| worker_state(w) == s).count();
    let items: Vec<Value> = all.iter().skip(((page - 1) * per_page) as usize).take(per_page as usize).map(worker_json).collect();
    Ok(Json(json!({
        "items": items,
        "summary": { "total": total, "running": count("running"), "quiet": count("quiet"), "stale": count("stale") },
        "pagination": paginated(total, page, per_page, page * per_page < total),
    })))
}

async fn find_worker(state: &AppState, id: &str) -> Result<WorkerInfo, ApiError> {
    state.store.workers().await?.into_iter().find(|w| w.id == id).ok_or_else(|| ApiError::not_found("worker", id))
}

/// `GET /admin/workers/{id}`: the worker and the jobs it is running.
pub async fn worker(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let w = find_worker(&state, &id).await?;
    let mut v = worker_json(&w);
    let jobs = state.store.active_jobs_of(&id).await?;
    if let Some(m) = v.as_object_mut() {
        m.insert("active_job_ids".into(), json!(jobs.iter().map(ToString::to_string).collect::<Vec<_>>()));
        m.insert("requested_state".into(), json!(state.store.requested_worker_state(&id).await?));
    }
    Ok(Json(v))
}

/// `POST /admin/workers/{id}/quiet`: its next heartbeat answers `quiet` (and fetches for it
/// return nothing).
pub async fn quiet_worker(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if !state.store.request_worker_state(&id, "quiet", &caller.actor()).await? {
        return Err(ApiError::not_found("worker", &id));
    }
    Ok(Json(json!({ "id": id, "requested_state": "quiet" })))
}

/// `DELETE /admin/workers/{id}`: only a stale worker. Its active jobs whose claims have lapsed
/// are rescheduled at once as the rescuer reschedules a dead worker's (the attempt counted);
/// `released_jobs` says how many. The others are left until their claims lapse: the worker
/// may only be cut off, and still running them.
pub async fn deregister_worker(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    match state.store.deregister_stale_worker(&id, STALE_AFTER, &caller.actor()).await {
        Ok(Some(released)) => Ok(Json(json!({ "deleted": true, "id": id, "released_jobs": released }))),
        Ok(None) => Err(ApiError::not_found("worker", &id)),
        Err(rebound_queue::StoreError::Invalid { reason, .. }) => Err(ApiError::conflict(reason)),
        Err(e) => Err(e.into()),
    }
}

// ---- statistics ------------------------------------------------------------------------

/// `GET /admin/stats`.
pub async fn stats(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let queues = state.store.queues().await?;
    let workers = state.store.workers().await?;
    let mut jobs = Map::new();
    for s in JobState::ALL {
        jobs.insert(s.as_str().into(), json!(0));
    }
    let mut dead = 0;
    for q in &queues {
        for (k, v) in counts(q).as_object().into_iter().flatten() {
            if k == "dead_letters" {
                dead += v.as_i64().unwrap_or(0);
            } else if let Some(slot) = jobs.get_mut(k) {
                *slot = json!(slot.as_i64().unwrap_or(0) + v.as_i64().unwrap_or(0));
            }
        }
    }
    let minutes = state.store.throughput(5).await?;
    let (done, failed): (i64, i64) = minutes.iter().fold((0, 0), |(d, f), (_, c, x)| (d + c, f + x));
    Ok(Json(json!({
        "queues": queues.len(),
        "workers": workers.iter().filter(|w| worker_state(w) != "stale").count(),
        "jobs": jobs,
        "dead_letters": dead,
        "throughput": { "processed_per_minute": done as f64 / 5.0, "failed_per_minute": failed as f64 / 5.0, "window_minutes": 5 },
        "uptime_seconds": state.started_at.elapsed().as_secs(),
    })))
}

/// `GET /admin/stats/history?period=1m|5m|1h&since=&until=`: completions and failures per
/// period, from the jobs and attempts still kept (pruned history drops out).
pub async fn stats_history(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["period", "since", "until", "queue"])?;
    if q.one("queue")?.is_some() {
        return Err(unsupported("per-queue history").detail("field", "queue"));
    }
    let period = q.one("period")?.unwrap_or("5m");
    let minutes_per = match period {
        "1m" => 1,
        "5m" => 5,
        "1h" => 60,
        other => return Err(ApiError::invalid_field("period", format!("must be 1m, 5m or 1h, got {other:?}"))),
    };
    let now = Timestamp::now();
    let since = query_time(&q, "since")?.unwrap_or(now - jiff::SignedDuration::from_hours(1));
    let until = query_time(&q, "until")?.unwrap_or(now);
    let span = now.duration_since(since).as_secs() / 60 + 1;
    if !(1..=24 * 60).contains(&span) {
        return Err(ApiError::invalid_field("since", "must be within the last 24 hours"));
    }
    let rows = state.store.throughput(span).await?;
    let mut buckets: Vec<(Timestamp, i64, i64)> = Vec::new();
    for (minute, done, failed) in rows.into_iter().filter(|(m, _, _)| *m >= since - jiff::SignedDuration::from_mins(1) && *m <= until) {
        let start = Timestamp::from_second(minute.as_second() - minute.as_second().rem_euclid(60 * minutes_per)).unwrap_or(minute);
        match buckets.last_mut() {
            Some(b) if b.0 == start => {
                b.1 += done;
                b.2 += failed;
            }
            _ => buckets.push((start, done, failed)),
        }
    }
    let data: Vec<Value> = buckets.iter().map(|(t, d, f)| json!({ "timestamp": t.to_string(), "processed": d, "failed": f })).collect();
    Ok(Json(json!({ "period": period, "data": data })))
}

// ---- dead letters ----------------------------------------------------------------------

/// `GET /admin/dead-letter`: the job listing (§7.1's parameters) restricted to dead letters.
pub async fn dead_letters(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["queue", "type", "since", "until", "page", "per_page", "error_type"])?;
    let mut filter = query_filter(&q)?;
    filter.dead_letter = Some(true);
    if let Some(e) = q.one("error_type")? {
        filter.error_type = Some(super::dead_letter::error_type_filter(e).map_err(|r| ApiError::invalid_field("error_type", r))?);
    }
    let (page, per_page) = paging(&q)?;
    let listing = format!("admin-dead|{}", serde_json::to_string(&filter).unwrap_or_default());
    let (items, has_more) = job_page(&state, &listing, &filter, page, per_page, Order::NewestFirst).await?;
    let ids: Vec<_> = items.iter().map(|j| j.id).collect();
    let attempts = state.store.attempts_for(&ids).await?;
    let total = state.store.count_jobs(&filter, COUNT_CAP).await?;
    Ok(Json(json!({
        "items": items.iter().map(|j| job_json_with_errors(j, &attempts)).collect::<Vec<_>>(),
        "pagination": paginated(total, page, per_page, has_more),
    })))
}

/// `POST /admin/dead-letter/{id}/retry`.
pub async fn retry_dead_letter(State(state): State<AppState>, caller: Caller, Path(id): Path<String>, body: Option<JsonObject>) -> Result<Json<Value>, ApiError> {
    super::dead_letter::retry_one(&state, &caller, &id, body.as_ref(), "OJS admin dead-letter retry").await
}

/// `DELETE /admin/dead-letter` with `{"older_than"?, "queue"?, "type"?, "confirm": true}`.
pub async fn purge_dead_letters(State(state): State<AppState>, caller: Caller, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    f.only(&["older_than", "queue", "type", "error_type", "confirm"])?;
    confirmed(&f)?;
    let filter = super::dead_letter::purge_filter(&f)?;
    let purged = state.store.purge_dead_letters(&JobSelection::Filter(filter), &caller.actor(), Some("OJS admin dead-letter purge")).await?;
    Ok(Json(json!({ "purged_count": purged })))
}

// ---- system ----------------------------------------------------------------------------

/// `GET /admin/system/config`: the server's settings, nothing secret.
pub async fn system_config(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let c = &state.config;
    Ok(Json(json!({
        "implementation": { "name": "rebound", "version": env!("CARGO_PKG_VERSION") },
        "api_auth": format!("{:?}", c.api_auth).to_lowercase(),
        "test_mode": c.test_mode,
        "default_visibility_timeout_ms": u64::try_from(c.visibility_timeout.as_millis()).unwrap_or(u64::MAX),
        "max_body_bytes": c.max_body_bytes,
        "request_timeout_ms": u64::try_from(c.request_timeout.as_millis()).unwrap_or(u64::MAX),
        "maintenance": maintenance_json(state.store.maintenance().await?.as_ref()),
    })))
}

/// `POST /admin/system/maintenance` with `{"enabled": true|false, "reason"?, "estimated_duration"?: "PT30M"}`
/// (§12.1): while enabled, fetches and Rebound's workers get no jobs, due jobs are not
/// promoted and cron ticks wait; enqueues are accepted. Audited.
pub async fn system_maintenance(State(state): State<AppState>, caller: Caller, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    f.only(&["enabled", "reason", "estimated_duration"])?;
    let enabled = f.bool("enabled")?.ok_or_else(|| f.error("enabled", "is required: true or false"))?;
    if !enabled {
        state.store.disable_maintenance(&caller.actor()).await?;
        return Ok(Json(maintenance_json(None)));
    }
    let reason = f.str("reason")?;
    let estimated = match f.str("estimated_duration")? {
        Some(d) => Some(iso8601::parse(d).map_err(|r| f.error("estimated_duration", r))?),
        None => None,
    };
    let on = state.store.enable_maintenance(reason, estimated, &caller.actor()).await?;
    Ok(Json(maintenance_json(Some(&on))))
}

fn maintenance_json(m: Option<&Maintenance>) -> Value {
    match m {
        Some(m) => json!({
            "maintenance": true,
            "reason": m.reason,
            "enabled_at": m.enabled_at.to_string(),
            "enabled_by": m.enabled_by,
            "estimated_end": m.estimated_end.map(|t| t.to_string()),
        }),
        None => json!({ "maintenance": false }),
    }
}
