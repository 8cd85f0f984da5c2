//! Automatic replay rules of the dead-letter queue (ojs-dead-letter §7), one resource per rule:
//!
//! * `GET /ojs/v1/dead-letter/replay-rules`: every rule, by name.
//! * `GET|PUT|DELETE /ojs/v1/dead-letter/replay-rules/{name}`: one rule. `PUT` takes
//!   `{"filter": {"queue"?, "type"?, "error_type"?}, "delay": "PT1H", "max_replays": 3,
//!   "enabled"?: true}` (the spec's rule without its name, which is the path's) and answers
//!   201 for a new rule, 200 for a replaced one.
//!
//! The spec leaves where rules are configured to implementations; these are Rebound's. Each
//! replay is a `dead_letter.replayed` event and counts in the job's meta (`ojs.replay_count`,
//! `ojs.last_replayed_at`, `ojs.replay_rule`, §7.2).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rebound_queue::policy::iso8601;
use rebound_queue::store::{MAX_REPLAYS, REPLAY_MARGIN, ReplayRule, ReplayRuleSpec, check_rule_name};
use serde_json::{Value, json};

use super::body::JsonObject;
use super::error::ApiError;
use crate::AppState;
use crate::auth::Caller;

fn rule_json(r: &ReplayRule) -> Value {
    let s = &r.spec;
    json!({
        "name": s.name,
        "filter": { "queue": s.queue, "type": s.job_type, "error_type": s.error_type },
        "delay": iso8601::format(s.delay),
        "effective_delay": iso8601::format(s.delay.max(REPLAY_MARGIN)),
        "max_replays": s.max_replays,
        "enabled": s.enabled,
        "replayed_total": r.replayed_total,
        "last_replayed_at": r.last_replayed_at.map(|t| t.to_string()),
        "created_at": r.created_at.to_string(),
        "updated_at": r.updated_at.to_string(),
    })
}

/// A rule's name from the path. One no rule could have is as absent as any other: 404.
fn rule_name(raw: &str) -> Result<&str, ApiError> {
    check_rule_name(raw).map_err(|_| {
        ApiError::not_found("replay rule", "(not a rule name)")
            .hint("replay rule names are lowercase letters, digits, '.', '-' and '_', starting with a letter or digit")
    })?;
    Ok(raw)
}

/// `GET /ojs/v1/dead-letter/replay-rules`.
pub async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let rules = state.store.replay_rules().await?;
    Ok(Json(json!({ "replay_rules": rules.iter().map(rule_json).collect::<Vec<_>>() })))
}

/// `GET /ojs/v1/dead-letter/replay-rules/{name}`.
pub async fn get(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let name = rule_name(&name)?;
    let rule = state.store.replay_rule(name).await?.ok_or_else(|| ApiError::not_found("replay rule", name))?;
    Ok(Json(json!({ "replay_rule": rule_json(&rule) })))
}

/// `PUT /ojs/v1/dead-letter/replay-rules/{name}`: creates (201) or replaces (200) the rule.
pub async fn put(State(state): State<AppState>, caller: Caller, Path(name): Path<String>, body: JsonObject) -> Result<Response, ApiError> {
    check_rule_name(&name).map_err(ApiError::from)?;
    let f = body.fields();
    f.only(&["name", "filter", "delay", "max_replays", "enabled"])?;
    if f.str("name")?.is_some_and(|n| n != name) {
        return Err(f.error("name", "must be the rule's name in the path, or left out"));
    }
    let mut spec = ReplayRuleSpec { name, queue: None, job_type: None, error_type: None, delay: REPLAY_MARGIN, max_replays: 1, enabled: f.bool("enabled")?.unwrap_or(true) };
    if let Some(g) = f.object("filter")? {
        g.only(&["queue", "type", "error_type"])?;
        spec.queue = g.str("queue")?.map(str::to_owned);
        spec.job_type = g.str("type")?.map(str::to_owned);
        // Checked with the rest of the rule by the store, which names `filter.error_type`.
        spec.error_type = g.str("error_type")?.map(str::to_owned);
    }
    let delay = f.str("delay")?.ok_or_else(|| f.error("delay", "is required: an ISO 8601 duration such as PT1H"))?;
    spec.delay = iso8601::parse(delay).map_err(|r| f.error("delay", r))?;
    spec.max_replays = f
        .i64_in("max_replays", 1, i64::from(MAX_REPLAYS))?
        .ok_or_else(|| f.error("max_replays", format!("is required: 1 to {MAX_REPLAYS}")))? as i32;
    let (rule, created) = state.store.put_replay_rule(&spec, &caller.actor()).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({ "replay_rule": rule_json(&rule) }))).into_response())
}

/// `DELETE /ojs/v1/dead-letter/replay-rules/{name}`.
pub async fn delete(State(state): State<AppState>, caller: Caller, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let name = rule_name(&name)?;
    if !state.store.delete_replay_rule(name, &caller.actor()).await? {
        return Err(ApiError::not_found("replay rule", name));
    }
    Ok(Json(json!({ "deleted": true, "name": name })))
}
