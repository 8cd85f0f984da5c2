//! Rebound's admin API for per-type retry policies (OJS has none): list, get, put (validated,
//! versioned), delete, version history, and a preview of the schedule a policy would produce.
//! `*` names the editable global default layer.

use axum::Json;
use axum::extract::{Path, State};
use rebound_queue::job::validate_type;
use rebound_queue::policy::{PolicyError, ResolvedPolicy, iso8601, resolve};
use rebound_queue::store::{DEFAULT_POLICY_KEY, StoredPolicy};
use rebound_queue::{PolicyPatch, RetryPolicy};
use serde_json::{Value, json};

use super::body::JsonObject;
use super::envelope::millis_json;
use super::error::ApiError;
use super::query::QueryParams;
use crate::AppState;
use crate::auth::Caller;

/// Most rows a preview computes.
const MAX_PREVIEW_ROWS: i64 = 1000;

/// A policy's key: a job type, or `*`. `field` names it in errors.
fn policy_key<'a>(raw: &'a str, field: &str) -> Result<&'a str, ApiError> {
    if raw != DEFAULT_POLICY_KEY {
        validate_type(raw).map_err(|e| ApiError::invalid_field(field, format!("{}; or \"*\" for the global default", e.reason)))?;
    }
    Ok(raw)
}

fn policy_error(prefix: &str, e: &PolicyError) -> ApiError {
    let field = if prefix.is_empty() { e.field.clone() } else { format!("{prefix}.{}", e.field) };
    ApiError::invalid_policy(&field, &e.reason)
}

fn stored_json(p: &StoredPolicy) -> Value {
    json!({
        "job_type": p.job_type,
        "policy": p.policy,
        "version": p.version,
        "updated_at": p.updated_at.to_string(),
        "updated_by": p.updated_by,
    })
}

fn effective_json(r: &ResolvedPolicy) -> Value {
    json!({ "policy": r.policy.to_json(), "sources": r.sources_json() })
}

/// `GET /ojs/v1/admin/policies`: every saved policy, `*` first, and the built-in defaults.
pub async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let policies = state.store.policies().await?;
    Ok(Json(json!({
        "policies": policies.iter().map(stored_json).collect::<Vec<_>>(),
        "builtin_defaults": RetryPolicy::default().to_json(),
    })))
}

/// `GET /ojs/v1/admin/policies/{type}`: the saved policy and the effective one it yields.
pub async fn get(State(state): State<AppState>, Path(job_type): Path<String>) -> Result<Json<Value>, ApiError> {
    let key = policy_key(&job_type, "type")?;
    let stored = state.store.policy(key).await?.ok_or_else(|| ApiError::not_found("retry policy", key))?;
    let effective = state.store.effective_policy(key, None).await?;
    Ok(Json(json!({ "policy": stored_json(&stored), "effective": effective_json(&effective) })))
}

/// `PUT /ojs/v1/admin/policies/{type}?note=…`: the body is an OJS retry object (partial: unset
/// fields fall back to the layers below). Invalid → 422 naming the field, nothing saved.
pub async fn put(State(state): State<AppState>, caller: Caller, Path(job_type): Path<String>, q: QueryParams, body: JsonObject) -> Result<Json<Value>, ApiError> {
    q.only(&["note"])?;
    let key = policy_key(&job_type, "type")?;
    let note = q.one("note")?;
    if note.is_some_and(|n| n.chars().count() > 500) {
        return Err(ApiError::invalid_field("note", "must be at most 500 characters"));
    }
    let patch = PolicyPatch::from_json(&Value::Object(body.0)).map_err(|e| policy_error("", &e))?;
    let stored = state.store.put_policy(key, &patch, &caller.actor(), note).await?;
    let effective = state.store.effective_policy(key, None).await?;
    Ok(Json(json!({ "policy": stored_json(&stored), "effective": effective_json(&effective) })))
}

/// `DELETE /ojs/v1/admin/policies/{type}`: jobs of the type fall back to the defaults.
pub async fn delete(State(state): State<AppState>, caller: Caller, Path(job_type): Path<String>) -> Result<Json<Value>, ApiError> {
    let key = policy_key(&job_type, "type")?;
    if !state.store.delete_policy(key, &caller.actor()).await? {
        return Err(ApiError::not_found("retry policy", key));
    }
    Ok(Json(json!({ "deleted": true, "job_type": key })))
}

/// `GET /ojs/v1/admin/policies/{type}/versions`: every saved version, newest first.
pub async fn versions(State(state): State<AppState>, Path(job_type): Path<String>) -> Result<Json<Value>, ApiError> {
    let key = policy_key(&job_type, "type")?;
    let history = state.store.policy_history(key).await?;
    let versions: Vec<Value> = history
        .iter()
        .map(|v| {
            json!({
                "version": v.version,
                "policy": v.policy,
                "created_at": v.created_at.to_string(),
                "created_by": v.created_by,
                "note": v.note,
            })
        })
        .collect();
    Ok(Json(json!({ "job_type": key, "versions": versions })))
}

/// `POST /ojs/v1/admin/policies/preview` with `{"policy": {…}, "job_type"?, "attempts_made"?,
/// "limit"?}`: the effective policy if `policy` were saved for `job_type` (for `*`: as the
/// global default; without a type: over the current global default), and its planned retries
/// (delay, jitter band and cumulative wait per retry) and time until exhaustion.
pub async fn preview(State(state): State<AppState>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    f.only(&["policy", "job_type", "attempts_made", "limit"])?;
    let patch_json = f.get("policy").ok_or_else(|| f.error("policy", "is required"))?;
    let patch = PolicyPatch::from_json(patch_json).map_err(|e| match e.field.as_str() {
        "retry" => ApiError::invalid_policy("policy", &e.reason),
        _ => policy_error("policy", &e),
    })?;
    let job_type = match f.str("job_type")? {
        Some(t) => Some(policy_key(t, "job_type")?),
        None => None,
    };
    let attempts_made = f.i64_in("attempts_made", 0, i64::from(u32::MAX))?.unwrap_or(0);
    let limit = f.i64_in("limit", 1, MAX_PREVIEW_ROWS)?.unwrap_or(100);

    let resolved = if job_type == Some(DEFAULT_POLICY_KEY) {
        resolve(&patch.apply_to(&RetryPolicy::default()), None, None)
    } else {
        let star = match state.store.policy(DEFAULT_POLICY_KEY).await? {
            // Stored before the bounds existed, it may hold longer intervals: preview it as the
            // failure path applies it (capped), not as an error about the caller's policy.
            Some(p) => PolicyPatch::from_stored_json(&p.policy).map(|mut star| {
                star.clamp_to_bounds();
                star
            }).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "stored global default policy does not parse; previewing over the built-in defaults");
                PolicyPatch::default()
            }),
            None => PolicyPatch::default(),
        };
        resolve(&star.apply_to(&RetryPolicy::default()), Some(&patch), None)
    }
    .map_err(|e| policy_error("policy", &e))?;

    let policy = &resolved.policy;
    let planned = policy.planned_retries(u32::try_from(attempts_made).unwrap_or(u32::MAX), usize::try_from(limit).unwrap_or(100));
    let total = policy.total_delay();
    Ok(Json(json!({
        "job_type": job_type,
        "policy": policy.to_json(),
        "sources": resolved.sources_json(),
        "max_attempts": policy.effective_max_attempts(),
        "planned_retries": planned,
        "total_delay_ms": millis_json(total),
        "total_delay": iso8601::format(total),
        "retries_total": policy.effective_max_attempts().saturating_sub(1),
    })))
}
