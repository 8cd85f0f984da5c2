//! Rate limits over HTTP (`ojs-rate-limiting.md`). The limit of a queue is the partition
//! `queue:<name>`, set by `PUT /rate-limits/queue:<name>` or the admin
//! `PUT /admin/queues/{name}/rate-limit` (with `expires_at`, an override of its concurrency). Any other key is a keyed limit its jobs share
//! (`options.rate_limit`: a concurrency and a rate window); `PUT /rate-limits/{key}` overrides
//! its concurrency (until `expires_at` if given). `GET /rate-limits[/{key}]` shows both kinds
//! and their state.

use axum::Json;
use axum::extract::{Path, State};
use rebound_queue::job::validate_queue;
use rebound_queue::policy::iso8601;
use jiff::Timestamp;
use rebound_queue::job::validate_rate_limit_key;
use rebound_queue::store::{KeyedRateLimit, QueueRateLimit, RateLimitOverride, RateLimitState, Window};
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
        // Only the spec's PUT takes an override (a queue's config sets its limits as they are).
        return Err(g.error("expires_at", "an override with an end is set by PUT /ojs/v1/rate-limits/queue:<name> with concurrency and expires_at"));
    }
    g.only(&["concurrency", "rate", "throttle", "on_limit", "max_per_second"])?;
    let limit = QueueRateLimit {
        concurrency: g.i64_in("concurrency", 0, i64::from(i32::MAX))?.map(|c| u32::try_from(c).unwrap_or(0)),
        rate: window(&g, "rate")?,
        throttle: throttle(&g)?,
    };
    Ok(limit.is_limited().then_some(limit))
}

fn state_json(s: &RateLimitState) -> Value {
    let l = &s.limit;
    let mut v = json!({ "key": format!("queue:{}", s.queue), "queue": s.queue, "waiting_count": s.waiting, "limit": l.to_json() });
    if let Some(m) = v.as_object_mut() {
        // The concurrency claims keep to now; `limit` stays as set under an override.
        if let Some(c) = s.concurrency_in_force() {
            m.insert("concurrency".into(), json!({ "limit": c, "active": s.active, "available": (i64::from(c) - s.active).max(0) }));
        }
        if let Some(o) = &s.override_limit {
            m.insert("override".into(), o.to_json());
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

/// What a partition key names: a queue's limit (`queue:<name>`), or a key its jobs share.
enum Partition<'k> {
    Queue(&'k str),
    Keyed(&'k str),
}

fn partition(key: &str) -> Result<Partition<'_>, ApiError> {
    match key.strip_prefix("queue:") {
        Some(name) => {
            validate_queue(name).map_err(|e| ApiError::invalid_field("key", e.reason))?;
            Ok(Partition::Queue(name))
        }
        None => {
            validate_rate_limit_key(key, "key").map_err(|e| ApiError::invalid_field("key", e.reason))?;
            Ok(Partition::Keyed(key))
        }
    }
}

fn keyed_json(k: &KeyedRateLimit) -> Value {
    let mut v = json!({
        "key": k.key,
        "concurrency": { "limit": k.in_force, "active": k.active, "admitted": k.admitted, "available": k.free() },
        "waiting_count": k.waiting,
        "limit": { "concurrency": k.concurrency },
        "updated_at": k.updated_at.to_string(),
    });
    if let Some(m) = v.as_object_mut() {
        if let Some(o) = &k.override_limit {
            m.insert("override".into(), o.to_json());
        }
        // A handler's `rate_limit_until` (§9): nothing is admitted before it.
        if let Some(t) = k.held_until {
            m.insert("held_until".into(), Value::String(t.to_string()));
        }
        if let Some(w) = &k.rate {
            let limit = json!({ "limit": w.limit, "period": iso8601::format(w.period) });
            if let Some(l) = m.get_mut("limit").and_then(Value::as_object_mut) {
                l.insert("rate".into(), limit);
            }
            m.insert("rate".into(), json!({
                "limit": w.limit, "period": iso8601::format(w.period), "current_count": k.rate_used,
                "window_resets_at": k.rate_window_resets_at.map(|t| t.to_string()),
                "algorithm": "fixed_window",
            }));
        }
        if let Some(w) = &k.throttle {
            let limit = json!({ "limit": w.limit, "period": iso8601::format(w.period) });
            if let Some(l) = m.get_mut("limit").and_then(Value::as_object_mut) {
                l.insert("throttle".into(), limit);
            }
            m.insert("throttle".into(), json!({
                "limit": w.limit, "period": iso8601::format(w.period),
                "next_allowed_at": k.throttle_next_allowed_at.map(|t| t.to_string()),
            }));
        }
    }
    v
}

/// `GET /ojs/v1/rate-limits?limit=&cursor=`: queue limits and keyed limits, by key (see
/// [`NamedPage`]; a queue's key is `queue:<name>`, which no job's key can be).
pub async fn list(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&named_pages::PARAMS)?;
    let page = NamedPage::from_query(&q)?;
    // Queues are few and read whole; keys can be many, so only those this page can need.
    let queues = state.store.rate_limit_states(None).await?;
    let mut all: Vec<(String, Option<RateLimitState>)> = queues.into_iter().map(|s| (format!("queue:{}", s.queue), Some(s))).collect();
    let (after, wanted) = page.window();
    let (key_total, keys_before) = state.store.rate_limit_key_count(after).await?;
    let queues_before = all.iter().filter(|(k, _)| after.is_some_and(|c| k.as_str() <= c)).count();
    let total = all.len() + usize::try_from(key_total).unwrap_or(0);
    let before = queues_before + usize::try_from(keys_before).unwrap_or(0);
    let names = state.store.rate_limit_key_names(after, i64::try_from(wanted).unwrap_or(i64::MAX)).await?;
    all.extend(names.into_iter().map(|k| (k, None)));
    all.sort_by(|a, b| a.0.cmp(&b.0));
    if after.is_some() {
        // Only what follows the cursor, so `before` counts every name left out ahead of it.
        all.retain(|(k, _)| after.is_some_and(|c| k.as_str() > c));
    }
    let (page_items, pagination) = page.cut_window(all, before, total, |(k, _)| k);
    let keyed: Vec<String> = page_items.iter().filter(|(_, s)| s.is_none()).map(|(k, _)| k.clone()).collect();
    let keyed = state.store.rate_limit_keys(&keyed).await?;
    let items: Vec<Value> = page_items
        .iter()
        .filter_map(|(k, s)| match s {
            Some(s) => Some(state_json(s)),
            // A key removed between the two reads is left out of its page.
            None => keyed.iter().find(|r| &r.key == k).map(keyed_json),
        })
        .collect();
    Ok(Json(json!({ "items": items, "pagination": pagination })))
}

/// `GET /ojs/v1/rate-limits/{key}`.
pub async fn get(State(state): State<AppState>, Path(key): Path<String>) -> Result<Json<Value>, ApiError> {
    match partition(&key)? {
        Partition::Queue(queue) => {
            let states = state.store.rate_limit_states(Some(queue)).await?;
            let s = states.first().ok_or_else(|| ApiError::not_found("rate limit", &key))?;
            Ok(Json(state_json(s)))
        }
        Partition::Keyed(k) => {
            let s = state.store.rate_limit_key(k).await?.ok_or_else(|| ApiError::not_found("rate limit", &key))?;
            Ok(Json(keyed_json(&s)))
        }
    }
}

/// A queue's limits (`{"concurrency", "rate", "throttle"}`: replaced whole, `{}` removes
/// them), or, when the body names `expires_at`, an operator's override of its concurrency
/// over them, parsed as a key's (see [`parse_override`]): `{"concurrency": 0, "expires_at":
/// "…"}` stops the queue until then and leaves its limits as set; a null `expires_at` lasts
/// until removed, and a null (or no) `concurrency` with a null `expires_at` removes it.
async fn set(state: &AppState, caller: &Caller, queue: &str, body: &JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    if f.map().contains_key("expires_at") {
        let o = parse_override(&f, "a queue's rate and throttle are its limit's: set them without expires_at")?;
        let saved = state.store.override_queue_concurrency(queue, o.as_ref(), &caller.actor()).await?;
        return Ok(Json(match saved {
            Some(s) => state_json(&s),
            None => json!({ "key": format!("queue:{queue}"), "queue": queue, "limit": {}, "waiting_count": 0 }),
        }));
    }
    let limit = parse(&f, "")?;
    let saved = state.store.set_queue_rate_limit(queue, limit.as_ref(), &caller.actor()).await?;
    Ok(Json(json!({ "key": format!("queue:{queue}"), "queue": queue, "rate_limit": saved.map(|l| l.to_json()) })))
}

/// Refuses windows in an override (`rate`, `throttle`, `max_per_second`): an override is of
/// the concurrency alone, and a window accepted and not applied would leave its client
/// believing it in force. `hint` says where the windows are set.
fn refuse_override_windows(f: &Fields<'_>, hint: &str) -> Result<(), ApiError> {
    for windowed in ["rate", "throttle", "max_per_second"] {
        if f.get(windowed).is_some_and(|v| !v.is_null()) {
            return Err(unsupported(format!("windows in an override ({})", f.name(windowed)))
                .detail("field", f.name(windowed))
                .hint(hint));
        }
    }
    Ok(())
}

/// A job's per-key window `name` (`rate` or `throttle`): `{limit, period}` (RL-R001, RL-R002).
pub fn key_window(f: &Fields<'_>, name: &str) -> Result<Option<Window>, ApiError> {
    let w = window(f, name)?;
    if let Some(w) = &w
        && w.limit > rebound_queue::job::MAX_RATE_LIMIT_CONCURRENCY
    {
        return Err(ApiError::invalid_field(&f.name(&format!("{name}.limit")), format!("must be at most {}", rebound_queue::job::MAX_RATE_LIMIT_CONCURRENCY)));
    }
    Ok(w)
}

/// A throttle, a queue's or a job's key's (RL-R002): `throttle: {limit, period}`, or
/// `max_per_second: n` (the conformance suites' shorthand for `{n, PT1S}`), not both.
pub fn throttle(f: &Fields<'_>) -> Result<Option<Window>, ApiError> {
    let throttle = key_window(f, "throttle")?;
    let shorthand = f.i64_in("max_per_second", 1, i64::from(rebound_queue::job::MAX_RATE_LIMIT_CONCURRENCY))?;
    let throttle = match (throttle, shorthand) {
        (Some(_), Some(_)) => return Err(f.error("max_per_second", "is a throttle of its own: give throttle or max_per_second, not both")),
        (Some(t), None) => Some(t),
        (None, Some(n)) => Some(Window { limit: u32::try_from(n).unwrap_or(1), period: std::time::Duration::from_secs(1) }),
        (None, None) => None,
    };
    if let Some(t) = &throttle {
        let field = |sub: &str| if shorthand.is_some() { "max_per_second".to_owned() } else { format!("throttle.{sub}") };
        t.check_throttle().map_err(|(sub, reason)| f.error(&field(sub), reason))?;
    }
    Ok(throttle)
}

/// An override of a concurrency (a key's, or a queue's: see [`set`]): `{"concurrency": n,
/// "expires_at": "…"}` (a null or no `expires_at`: until removed); no `concurrency` (and no
/// end) removes the override.
fn parse_override(f: &Fields<'_>, windows_hint: &str) -> Result<Option<RateLimitOverride>, ApiError> {
    refuse_override_windows(f, windows_hint)?;
    f.only(&["concurrency", "expires_at", "rate", "throttle", "max_per_second"])?;
    let Some(concurrency) = f.i64_in("concurrency", 0, i64::from(rebound_queue::job::MAX_RATE_LIMIT_CONCURRENCY))? else {
        if f.get("expires_at").is_some_and(|v| !v.is_null()) {
            return Err(f.error("concurrency", "is required with expires_at"));
        }
        return Ok(None);
    };
    let expires_at = match f.str("expires_at")? {
        None => None,
        Some(t) => Some(super::envelope::parse_time(t, Timestamp::now()).map_err(|r| f.error("expires_at", r))?),
    };
    Ok(Some(RateLimitOverride { concurrency: u32::try_from(concurrency).unwrap_or(0), expires_at }))
}

/// `PUT /ojs/v1/rate-limits/{key}`: a queue's limit (an empty body object removes it), or an
/// override of a keyed limit (see [`parse_override`]).
pub async fn put(State(state): State<AppState>, caller: Caller, Path(key): Path<String>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    match partition(&key)? {
        Partition::Queue(queue) => {
            let queue = queue.to_owned();
            set(&state, &caller, &queue, &body).await
        }
        Partition::Keyed(k) => {
            let o = parse_override(&body.fields(), "a key's rate window and throttle are set by its jobs' rate_limit; override its concurrency (0 stops it)")?;
            let saved = state.store.override_rate_limit(k, o.as_ref(), &caller.actor()).await?;
            Ok(Json(keyed_json(&saved)))
        }
    }
}

/// `PUT /ojs/v1/admin/queues/{name}/rate-limit`.
pub async fn put_queue(State(state): State<AppState>, caller: Caller, Path(name): Path<String>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    validate_queue(&name).map_err(|e| ApiError::invalid_field("name", e.reason))?;
    set(&state, &caller, &name, &body).await
}
