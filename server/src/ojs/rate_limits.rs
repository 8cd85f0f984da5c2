//! Queue rate limits over HTTP (`ojs-rate-limiting.md`): the limit of a queue is the
//! partition `queue:<name>`. `GET /rate-limits[/{key}]` shows limits and their state,
//! `PUT /rate-limits/{key}` and the admin `PUT /admin/queues/{name}/rate-limit` set them.
//! Per-job keyed limits (`options.rate_limit` on a job) are not offered.

use axum::Json;
use axum::extract::{Path, State};
use rebound_queue::job::validate_queue;
use rebound_queue::policy::iso8601;
use rebound_queue::store::{QueueRateLimit, RateLimitState, Window};
use serde_json::{Value, json};

use super::body::{Fields, JsonObject};
use super::error::ApiError;
use super::named_pages::{self, NamedPage};
use super::query::QueryParams;
use super::unsupported::unsupported;
use crate::AppState;
use crate::auth::Caller;

fn window(f: &Fields<'_>, key: &str) -> Result<Option<Window>, ApiError> {
    let Some(w) = f.object(key)? else { return Ok(None) };
    w.only(&["limit", "period"])?;
    let limit = w.i64_in("limit", 0, i64::from(i32::MAX))?.ok_or_else(|| w.error("limit", "is required"))?;
    let period = w.required_str("period")?;
    let period = iso8601::parse(period).map_err(|r| w.error("period", r))?;
    if period.is_zero() {
        return Err(w.error("period", "must be longer than zero"));
    }
    rebound_queue::bounds::check_interval(period).map_err(|r| w.error("period", r))?;
    Ok(Some(Window { limit: u32::try_from(limit).unwrap_or(0), period }))
}

/// A limit from the object `key` of `f` (or from `f` itself when `key` is empty); `None`
/// for `null`, `{}` or no limit at all (the limit is removed).
pub fn parse(f: &Fields<'_>, key: &str) -> Result<Option<QueueRateLimit>, ApiError> {
    let g = if key.is_empty() {
        f.clone()
    } else {
        match f.object(key)? {
            Some(g) => g,
            None => return Ok(None),
        }
    };
    if g.get("key").is_some() || g.get("on_limit").is_some_and(|v| v != "wait") {
        return Err(unsupported("keyed per-job rate limits and on_limit other than \"wait\"").detail("field", g.name("key")));
    }
    if g.get("expires_at").is_some() {
        return Err(unsupported("temporary rate-limit overrides (expires_at)").detail("field", g.name("expires_at")));
    }
    g.only(&["concurrency", "rate", "throttle", "on_limit", "max_per_second"])?;
    let mut limit = QueueRateLimit {
        concurrency: g.i64_in("concurrency", 0, i64::from(i32::MAX))?.map(|c| u32::try_from(c).unwrap_or(0)),
        rate: window(&g, "rate")?,
        throttle: window(&g, "throttle")?,
    };
    // The conformance suites' shorthand.
    if let Some(n) = g.i64_in("max_per_second", 1, 1_000_000)? {
        limit.throttle = Some(Window { limit: u32::try_from(n).unwrap_or(1), period: std::time::Duration::from_secs(1) });
    }
    if let Some(t) = &limit.throttle
        && t.limit == 0
    {
        return Err(g.error("throttle.limit", "must be at least 1 (set concurrency to 0 to stop the queue)"));
    }
    Ok(limit.is_limited().then_some(limit))
}

fn state_json(s: &RateLimitState) -> Value {
    let l = &s.limit;
    let mut v = json!({ "key": format!("queue:{}", s.queue), "queue": s.queue, "waiting_count": s.waiting, "limit": l.to_json() });
    if let Some(m) = v.as_object_mut() {
        if let Some(c) = l.concurrency {
            m.insert("concurrency".into(), json!({ "limit": c, "active": s.active, "available": (i64::from(c) - s.active).max(0) }));
        }
        if let Some(w) = &l.rate {
            m.insert("rate".into(), json!({
                "limit": w.limit, "period": iso8601::format(w.period), "current_count": s.rate_used,
                "window_resets_at": s.rate_window_resets_at.map(|t| t.to_string()),
                "algorithm": "fixed_window",
            }));
        }
        if let Some(w) = &l.throttle {
            m.insert("throttle".into(), json!({
                "limit": w.limit, "period": iso8601::format(w.period),
                "next_allowed_at": s.throttle_next_allowed_at.map(|t| t.to_string()),
            }));
        }
    }
    v
}

/// The queue a partition key names: only `queue:<name>`. A bare key such as `stripe-api` is
/// a keyed partition in the spec, not a queue: taking it as a queue name would limit (or
/// report) a queue nobody meant, so it is refused like any other keyed partition.
fn queue_of(key: &str) -> Result<&str, ApiError> {
    let Some(name) = key.strip_prefix("queue:") else {
        return Err(unsupported(format!("rate-limit key {key:?} (only queue limits, keyed \"queue:<name>\")")).detail("field", "key"));
    };
    validate_queue(name).map_err(|e| ApiError::invalid_field("key", e.reason))?;
    Ok(name)
}

/// `GET /ojs/v1/rate-limits?limit=&cursor=`: by queue (see [`NamedPage`]).
pub async fn list(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&named_pages::PARAMS)?;
    let page = NamedPage::from_query(&q)?;
    let mut states = state.store.rate_limit_states(None).await?;
    states.sort_by(|a, b| a.queue.cmp(&b.queue));
    let (states, pagination) = page.cut(states, |s| &s.queue);
    let items: Vec<Value> = states.iter().map(state_json).collect();
    Ok(Json(json!({ "items": items, "pagination": pagination })))
}

/// `GET /ojs/v1/rate-limits/{key}`.
pub async fn get(State(state): State<AppState>, Path(key): Path<String>) -> Result<Json<Value>, ApiError> {
    let queue = queue_of(&key)?;
    let states = state.store.rate_limit_states(Some(queue)).await?;
    let s = states.first().ok_or_else(|| ApiError::not_found("rate limit", &key))?;
    Ok(Json(state_json(s)))
}

async fn set(state: &AppState, caller: &Caller, queue: &str, body: &JsonObject) -> Result<Json<Value>, ApiError> {
    let limit = parse(&body.fields(), "")?;
    let saved = state.store.set_queue_rate_limit(queue, limit.as_ref(), &caller.actor()).await?;
    Ok(Json(json!({ "key": format!("queue:{queue}"), "queue": queue, "rate_limit": saved.map(|l| l.to_json()) })))
}

/// `PUT /ojs/v1/rate-limits/{key}`: a queue's limit (an empty body object removes it).
pub async fn put(State(state): State<AppState>, caller: Caller, Path(key): Path<String>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let queue = queue_of(&key)?.to_owned();
    set(&state, &caller, &queue, &body).await
}

/// `PUT /ojs/v1/admin/queues/{name}/rate-limit`.
pub async fn put_queue(State(state): State<AppState>, caller: Caller, Path(name): Path<String>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    validate_queue(&name).map_err(|e| ApiError::invalid_field("name", e.reason))?;
    set(&state, &caller, &name, &body).await
}
