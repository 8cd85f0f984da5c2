//! Cron jobs (`ojs-cron.md`): register (upsert), list, get, delete, enable/disable, and
//! Rebound's pause / resume / trigger.
//!
//! Requests are read in both shapes in use: the spec's (`cron`, top-level `type`, `args`,
//! `options`) and the conformance suites' (`expression`, `job_template: {type, args,
//! options}`). Answers carry both too: `cron_job` and `cron`, `cron_jobs` and `crons`, and
//! in each object `cron` and `expression`, the flat template and `job_template`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rebound_queue::bounds;
use rebound_queue::cron_schedule::CronSchedule;
use rebound_queue::store::{CronJob, CronSpec, CronTemplate, OverlapPolicy, validate_cron_name};
use serde_json::{Map, Value, json};

use super::body::{Fields, JsonObject, json_kind};
use super::envelope::{job_json, parse_new_job};
use super::error::ApiError;
use super::named_pages::{self, NamedPage};
use super::query::QueryParams;
use crate::AppState;
use crate::auth::Caller;

fn ts(t: Option<jiff::Timestamp>) -> Value {
    t.map_or(Value::Null, |t| Value::String(t.to_string()))
}

/// The cron job object.
pub fn cron_json(c: &CronJob) -> Value {
    let t = &c.template;
    let template = json!({ "type": t.job_type, "args": t.args, "meta": t.meta, "options": t.options });
    json!({
        "name": c.name,
        "cron": c.expression,
        "expression": c.expression,
        "timezone": c.timezone,
        "type": t.job_type,
        "args": t.args,
        "meta": t.meta,
        "options": t.options,
        "queue": t.queue,
        "job_template": template,
        "overlap_policy": c.overlap_policy.as_str(),
        "enabled": c.enabled,
        "status": if c.enabled { "active" } else { "paused" },
        "description": c.description,
        "next_run_at": ts(c.next_run_at),
        "last_run_at": ts(c.last_run_at),
        "last_job_id": c.last_job_id.map(|id| id.to_string()),
        "last_outcome": c.last_outcome,
        "run_count": c.run_count,
        "created_at": c.created_at.to_string(),
        "updated_at": c.updated_at.to_string(),
    })
}

fn one(c: &CronJob) -> Value {
    let v = cron_json(c);
    json!({ "cron_job": v, "cron": v })
}

/// The template's job envelope, from `job_template` or the top level.
///
/// Beyond a job envelope's options, a template takes the two the cron spec lists in its own
/// spelling (ojs-cron §2.2), so that they apply to every triggered job rather than only being
/// echoed back: `options.timeout` in whole seconds (a job's `timeout_ms`; giving both is
/// refused), and `options.meta`, merged with the template's `meta`, whose keys win on a clash
/// (it is the envelope's own place for meta).
fn template(f: &Fields<'_>) -> Result<CronTemplate, ApiError> {
    let (map, nested) = match f.object("job_template")? {
        Some(t) => (t.map().clone(), true),
        None => {
            let mut m = Map::new();
            for key in ["type", "args", "meta", "options"] {
                if let Some(v) = f.map().get(key) {
                    m.insert(key.to_owned(), v.clone());
                }
            }
            (m, false)
        }
    };
    let mut map = map;
    // A cron job's args default to none.
    map.entry("args").or_insert_with(|| json!([]));
    let fields = if nested { Fields::nested(&map, "job_template") } else { Fields::of(&map) };
    let envelope = job_envelope(&fields)?;
    let envelope_fields = if nested { Fields::nested(&envelope, "job_template") } else { Fields::of(&envelope) };
    let job = parse_new_job(&envelope_fields, jiff::Timestamp::now())?;
    if job.unique.is_some() || job.scheduled_at.is_some() || job.expires_at.is_some() || job.pending {
        return Err(fields.error("options", "unique, scheduled_at, delay_until, expires_at and pending do not apply to cron jobs"));
    }
    let options = map.get("options").cloned().unwrap_or_else(|| json!({}));
    Ok(CronTemplate::from_job(&job, options))
}

/// The template as a job envelope: `options.timeout` (seconds) becomes `options.timeout_ms`,
/// and `options.meta` is merged into `meta` (see [`template`]).
fn job_envelope(f: &Fields<'_>) -> Result<Map<String, Value>, ApiError> {
    let mut envelope = f.map().clone();
    let Some(options) = f.object("options")? else { return Ok(envelope) };
    let mut job_options = options.map().clone();
    job_options.remove("timeout");
    job_options.remove("meta");
    if let Some(secs) = options.i64("timeout")? {
        if options.get("timeout_ms").is_some() || f.get("timeout_ms").is_some() {
            return Err(options.error("timeout", "give either timeout (seconds) or timeout_ms, not both"));
        }
        let max = bounds::MAX_TIMEOUT_MS / 1000;
        if !(1..=max).contains(&secs) {
            return Err(options.error("timeout", format!("must be a whole number of seconds from 1 to {max} (7 days), got {secs}")));
        }
        job_options.insert("timeout_ms".into(), json!(secs * 1000));
    }
    if let Some(meta) = options.get("meta") {
        let Value::Object(option_meta) = meta else {
            return Err(options.error("meta", format!("must be a JSON object, got {}", json_kind(meta))));
        };
        match f.get("meta") {
            Some(Value::Object(top)) => {
                let mut merged = option_meta.clone();
                merged.extend(top.iter().map(|(k, v)| (k.clone(), v.clone())));
                envelope.insert("meta".into(), Value::Object(merged));
            }
            None => {
                envelope.insert("meta".into(), meta.clone());
            }
            // Left for the envelope's parser, which names the wrong type.
            Some(_) => {}
        }
    }
    envelope.insert("options".into(), Value::Object(job_options));
    Ok(envelope)
}

fn spec(f: &Fields<'_>) -> Result<CronSpec, ApiError> {
    let name = f.required_str("name")?;
    validate_cron_name(name).map_err(|_| f.error("name", "must be lowercase letters, digits, '.' and '-', starting with a letter or digit, at most 255 characters"))?;
    let (expr_field, expression) = match (f.str("cron")?, f.str("expression")?) {
        (Some(e), _) => ("cron", e),
        (None, Some(e)) => ("expression", e),
        (None, None) => return Err(f.error("cron", "is required (a cron expression such as \"0 9 * * *\" or \"@hourly\"; also accepted as \"expression\")")),
    };
    let timezone = f.str("timezone")?.unwrap_or("UTC");
    let schedule = CronSchedule::new(expression, timezone).map_err(|e| {
        let field = if e.field == "expression" { expr_field } else { "timezone" };
        f.error(field, e.reason)
    })?;
    let overlap_policy = match f.str("overlap_policy")? {
        None => OverlapPolicy::default(),
        Some(p) => p.parse().map_err(|e: String| f.error("overlap_policy", e))?,
    };
    let description = f.str("description")?.map(str::to_owned);
    if description.as_ref().is_some_and(|d| d.chars().count() > 1000) {
        return Err(f.error("description", "must be at most 1000 characters"));
    }
    Ok(CronSpec {
        name: name.to_owned(),
        schedule,
        template: template(f)?,
        overlap_policy,
        enabled: f.bool("enabled")?.unwrap_or(true),
        description,
    })
}

/// The name of a cron job looked up. One no cron job could have is as absent as any other
/// (404, ojs-cron §8.3, §8.4); only registration refuses it as invalid.
fn cron_name(raw: &str) -> Result<&str, ApiError> {
    validate_cron_name(raw).map_err(|_| {
        ApiError::not_found("cron job", format!("{raw:?}"))
            .hint("cron job names are lowercase letters, digits, '.' and '-', starting with a letter or digit")
    })?;
    Ok(raw)
}

async fn found(state: &AppState, name: &str) -> Result<CronJob, ApiError> {
    state.store.cron_job(cron_name(name)?).await?.ok_or_else(|| ApiError::not_found("cron job", name))
}

/// `POST /ojs/v1/cron`: 201 for a new cron job, 200 for an update of the one of that name.
pub async fn register(State(state): State<AppState>, caller: Caller, body: JsonObject) -> Result<Response, ApiError> {
    let spec = spec(&body.fields())?;
    let (cron, created) = state.store.register_cron(&spec, &caller.actor()).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(one(&cron))).into_response())
}

/// `GET /ojs/v1/cron?enabled=true|false&limit=&cursor=`: by name (see [`NamedPage`]).
pub async fn list(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    let mut allowed = vec!["enabled"];
    allowed.extend(named_pages::PARAMS);
    q.only(&allowed)?;
    let page = NamedPage::from_query(&q)?;
    let enabled = match q.one("enabled")? {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => return Err(ApiError::invalid_field("enabled", format!("must be true or false, got {other:?}"))),
    };
    let mut crons = state.store.cron_jobs(enabled).await?;
    crons.sort_by(|a, b| a.name.cmp(&b.name));
    let (crons, pagination) = page.cut(crons, |c| &c.name);
    let items: Vec<Value> = crons.iter().map(cron_json).collect();
    Ok(Json(json!({
        "cron_jobs": items,
        "crons": items,
        "count": pagination["total"],
        "pagination": pagination,
    })))
}

/// `GET /ojs/v1/cron/{name}`.
pub async fn get(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(one(&found(&state, &name).await?)))
}

/// `DELETE /ojs/v1/cron/{name}`: jobs it already enqueued are left alone.
pub async fn delete(State(state): State<AppState>, caller: Caller, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let gone = state.store.delete_cron(cron_name(&name)?, &caller.actor()).await?.ok_or_else(|| ApiError::not_found("cron job", &name))?;
    let mut v = one(&gone);
    if let Some(m) = v.as_object_mut() {
        m.insert("deleted".into(), Value::Bool(true));
        m.insert("name".into(), Value::String(gone.name.clone()));
    }
    Ok(Json(v))
}

/// `PATCH /ojs/v1/cron/{name}` with `{"enabled": bool}` (OJS toggle).
pub async fn toggle(State(state): State<AppState>, caller: Caller, Path(name): Path<String>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    f.only(&["enabled"])?;
    let enabled = f.bool("enabled")?.ok_or_else(|| f.error("enabled", "is required"))?;
    set_enabled(&state, &caller, &name, enabled).await
}

async fn set_enabled(state: &AppState, caller: &Caller, name: &str, enabled: bool) -> Result<Json<Value>, ApiError> {
    found(state, name).await?;
    let cron = state.store.set_cron_enabled(name, enabled, &caller.actor()).await?;
    Ok(Json(one(&cron)))
}

/// `POST /ojs/v1/cron/{name}/pause`.
pub async fn pause(State(state): State<AppState>, caller: Caller, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    set_enabled(&state, &caller, &name, false).await
}

/// `POST /ojs/v1/cron/{name}/resume`.
pub async fn resume(State(state): State<AppState>, caller: Caller, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    set_enabled(&state, &caller, &name, true).await
}

/// `POST /ojs/v1/cron/{name}/trigger`: enqueue its job now, off schedule.
pub async fn trigger(State(state): State<AppState>, caller: Caller, Path(name): Path<String>) -> Result<Response, ApiError> {
    found(&state, &name).await?;
    let (cron, job) = state.store.trigger_cron(&name, &caller.actor()).await?;
    let mut v = one(&cron);
    if let Some(m) = v.as_object_mut() {
        m.insert("job".into(), job_json(&job));
    }
    Ok((StatusCode::CREATED, Json(v)).into_response())
}
