//! The OJS job envelope on the wire: request JSON → [`NewJob`], stored [`Job`] → response JSON.
//!
//! Parsing names the offending field in every error (`options.priority`, `jobs[2].args`) and
//! accepts what the conformance suites send beyond the prose: `delay_until` as an alias of
//! `scheduled_at`, relative times (`"+PT2S"` = now + 2 s), `unique.keys` with `args_keys` and
//! `meta_keys` as well as the SDKs' `unique.key` and `period_ms`,
//! and the JSON-format placement of `queue`, `priority`, `retry`, … at the top level.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use rebound_queue::job::{Attempt, JobRateLimit, MAX_RATE_LIMIT_CONCURRENCY, OnConflict, OnLimit, UniqueSpec, validate_rate_limit_key};
use rebound_queue::bounds;
use rebound_queue::policy::iso8601;
use rebound_queue::unique_key::{DIMENSIONS, Fingerprint};
use rebound_queue::{Job, JobState, NewJob, PolicyPatch};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::body::{Fields, json_kind};
use super::error::ApiError;

/// Options the server interprets. Each is read from `options`, or else from the top level
/// (where the OJS JSON format puts `queue`, `priority`, `retry`, …). Other option keys
/// (`metadata`, …) are kept in `extra.options`, so clients get them back and the
/// test-mode heartbeat hook can read them.
const OPTIONS: [&str; 12] = [
    "queue", "priority", "timeout_ms", "visibility_timeout_ms", "delay_until", "scheduled_at",
    "expires_at", "retry", "unique", "tags", "pending", "rate_limit",
];

/// Top-level keys of the envelope proper.
const ENVELOPE: [&str; 5] = ["type", "args", "id", "meta", "options"];

/// Keys the server sets; a client sending them (e.g. re-posting a fetched job) is ignored
/// rather than echoed back as if they were the job's.
const SYSTEM_MANAGED: [&str; 18] = [
    "specversion", "state", "attempt", "max_attempts", "created_at", "enqueued_at", "started_at",
    "completed_at", "cancelled_at", "discarded_at", "result", "error", "errors", "retry_delay_ms",
    "next_attempt_at", "next_retry_at", "dead_letter", "rate_limited",
];

/// Parses a job envelope. `now` anchors relative times (`"+PT2S"`).
pub fn parse_new_job(f: &Fields<'_>, now: Timestamp) -> Result<NewJob, ApiError> {
    if let Some(v) = f.str("specversion")?
        && v != "1.0"
    {
        return Err(f.error("specversion", format!("must be \"1.0\", got {v:?}")));
    }
    let job_type = f.required_str("type")?;
    let args = match f.map().get("args") {
        None => return Err(f.error("args", "is required")),
        Some(a @ Value::Array(_)) => a.clone(),
        Some(v) => return Err(f.error("args", format!("must be a JSON array, got {}", json_kind(v)))),
    };
    let mut job = NewJob::new(job_type, args);
    if let Some(id) = f.str("id")? {
        job.id = Some(parse_client_id(id).map_err(|reason| f.error("id", reason))?);
    }
    if let Some(meta) = f.get("meta") {
        if !meta.is_object() {
            return Err(f.error("meta", format!("must be a JSON object, got {}", json_kind(meta))));
        }
        job.meta = meta.clone();
    }

    let options = f.object("options")?;
    // An option is read from `options`, else from the top level (JSON-format placement).
    let pick = |key: &str| -> Fields<'_> {
        match &options {
            Some(o) if o.get(key).is_some() => o.clone(),
            _ if f.get(key).is_some() => f.clone(),
            Some(o) => o.clone(),
            None => f.clone(),
        }
    };

    if let Some(queue) = pick("queue").str("queue")? {
        job.queue = queue.to_owned();
    }
    if let Some(p) = pick("priority").i64_in("priority", -100, 100)? {
        job.priority = i16::try_from(p).map_err(|_| pick("priority").error("priority", "out of range"))?;
    }
    job.timeout_ms = positive_ms(&pick("timeout_ms"), "timeout_ms")?;
    job.visibility_timeout_ms = positive_ms(&pick("visibility_timeout_ms"), "visibility_timeout_ms")?;
    if let Some(tags) = pick("tags").strings("tags")? {
        job.tags = tags.into_iter().map(str::to_owned).collect();
    }
    job.pending = pick("pending").bool("pending")?.unwrap_or(false);
    if let Some(t) = job_time(&pick("delay_until"), "delay_until", now)? {
        job.scheduled_at = Some(t);
    }
    if let Some(t) = job_time(&pick("scheduled_at"), "scheduled_at", now)? {
        job.scheduled_at = Some(t);
    }
    job.expires_at = job_time(&pick("expires_at"), "expires_at", now)?;
    let retry = pick("retry");
    if let Some(v) = retry.get("retry") {
        let patch = PolicyPatch::from_json(v).map_err(|e| {
            let field = if e.field == "retry" { retry.name("retry") } else { format!("{}.{}", retry.name("retry"), e.field) };
            ApiError::invalid_policy(&field, &e.reason)
        })?;
        job.retry = Some(patch);
    }

    if let Some(r) = pick("rate_limit").object("rate_limit")? {
        job.rate_limit = Some(parse_rate_limit(&r)?);
    }

    job.extra = extra_fields(f, options.as_ref());
    // Validate before the unique key is computed, so a bad queue or type is reported as such.
    job.validate().map_err(|e| f.error(&e.field, &e.reason))?;

    let unique = pick("unique");
    if let Some(u) = unique.object("unique")? {
        job.unique = Some(parse_unique(&u, &job)?);
    }
    Ok(job)
}

/// A job's `rate_limit` (ojs-rate-limiting §6): its `key`, the key's `concurrency`, `rate`
/// window and `throttle` (or `max_per_second`, the conformance suites' shorthand for a
/// throttle of that many per second), and its `on_limit`.
fn parse_rate_limit(r: &Fields<'_>) -> Result<JobRateLimit, ApiError> {
    r.only(&["key", "concurrency", "rate", "throttle", "max_per_second", "on_limit"])?;
    let on_limit = match r.str("on_limit")? {
        None => OnLimit::Wait,
        Some(s) => OnLimit::parse(s).ok_or_else(|| r.error("on_limit", "must be \"wait\", \"reschedule\" or \"drop\""))?,
    };
    let key = r.required_str("key")?;
    validate_rate_limit_key(key, &r.name("key")).map_err(|e| r.error("key", e.reason))?;
    let concurrency = r.i64_in("concurrency", 0, i64::from(MAX_RATE_LIMIT_CONCURRENCY))?.map(|c| u32::try_from(c).unwrap_or(0));
    let rate = super::rate_limits::key_window(r, "rate")?;
    let throttle = super::rate_limits::throttle(r)?;
    Ok(JobRateLimit { key: key.to_owned(), concurrency, rate, throttle, on_limit })
}

/// A job timeout: positive and at most [`bounds::MAX_TIMEOUT`].
fn positive_ms(f: &Fields<'_>, key: &str) -> Result<Option<i64>, ApiError> {
    let ms = f.i64(key)?;
    if let Some(ms) = ms {
        bounds::check_timeout_ms(ms).map_err(|reason| f.error(key, reason))?;
    }
    Ok(ms)
}

/// A job timestamp.
fn job_time(f: &Fields<'_>, key: &str, now: Timestamp) -> Result<Option<Timestamp>, ApiError> {
    let Some(at) = f.str(key)? else { return Ok(None) };
    parse_time(at, now).map(Some).map_err(|r| f.error(key, r))
}

/// Unknown top-level keys, plus unmodeled options under `options`.
fn extra_fields(f: &Fields<'_>, options: Option<&Fields<'_>>) -> Value {
    let mut extra: Map<String, Value> = f
        .map()
        .iter()
        .filter(|(k, _)| {
            let k = k.as_str();
            !ENVELOPE.contains(&k) && !OPTIONS.contains(&k) && !SYSTEM_MANAGED.contains(&k)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(o) = options {
        let rest: Map<String, Value> =
            o.map().iter().filter(|(k, _)| !OPTIONS.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
        if !rest.is_empty() {
            extra.insert("options".into(), Value::Object(rest));
        }
    }
    Value::Object(extra)
}

fn parse_unique(u: &Fields<'_>, job: &NewJob) -> Result<UniqueSpec, ApiError> {
    let mut fingerprint = Fingerprint::default();
    let named = |key: &str| -> Result<Vec<String>, ApiError> { Ok(u.strings(key)?.unwrap_or_default().into_iter().map(str::to_owned).collect()) };
    fingerprint.dimensions = named("keys")?;
    let mut args_keys = named("args_keys")?;
    // The SDKs' `key` mixes both: dimension names (Python) and args field names (JS).
    for k in named("key")? {
        if DIMENSIONS.contains(&k.as_str()) { fingerprint.dimensions.push(k) } else { args_keys.push(k) }
    }
    if u.get("args_keys").is_some() || !args_keys.is_empty() {
        fingerprint.args_keys = Some(args_keys);
    }
    if u.get("meta_keys").is_some() {
        fingerprint.meta_keys = Some(named("meta_keys")?);
    }
    let key = fingerprint.key(job).map_err(|e| u.error(&e.field, e.reason))?;
    let on_conflict = match u.str("on_conflict")? {
        None | Some("reject") => OnConflict::Reject,
        Some("ignore") => OnConflict::Ignore,
        Some("replace") => OnConflict::Replace,
        Some("replace_except_schedule") => OnConflict::ReplaceExceptSchedule,
        Some(other) => {
            return Err(u.error("on_conflict", format!("must be \"reject\", \"ignore\", \"replace\" or \"replace_except_schedule\", got {other:?}")));
        }
    };
    let states = u
        .strings("states")?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.parse::<JobState>().map_err(|e| u.error(&format!("states[{i}]"), e)))
        .collect::<Result<Vec<_>, _>>()?;
    let period = match u.str("period")? {
        // Go's SDK sends milliseconds.
        None => match u.i64("period_ms")? {
            None => None,
            Some(ms) if ms <= 0 => return Err(u.error("period_ms", "must be a positive number of milliseconds")),
            Some(ms) => {
                let d = Duration::from_millis(ms.unsigned_abs());
                bounds::check_interval(d).map_err(|r| u.error("period_ms", r))?;
                Some(d)
            }
        },
        Some(p) => match iso8601::parse(p) {
            Ok(d) if d.is_zero() => return Err(u.error("period", "must be longer than zero")),
            Ok(d) => {
                bounds::check_interval(d).map_err(|r| u.error("period", r))?;
                Some(d)
            }
            Err(r) => return Err(u.error("period", r)),
        },
    };
    Ok(UniqueSpec { key, on_conflict, states, period })
}

/// A client-chosen id must be a lowercase, hyphenated UUIDv7 (OJS §6.4).
pub fn parse_client_id(s: &str) -> Result<Uuid, String> {
    let id = Uuid::parse_str(s).map_err(|_| format!("{s:?} is not a UUID"))?;
    if id.hyphenated().to_string() != s {
        return Err(format!("{s:?} must be written as a lowercase, hyphenated UUID"));
    }
    if id.get_version_num() != 7 || id.get_variant() != uuid::Variant::RFC4122 {
        return Err(format!("{s:?} is not a UUIDv7"));
    }
    Ok(id)
}

/// An RFC 3339 timestamp, or `+<ISO-8601 duration>` relative to `now`, within
/// [`bounds::EARLIEST_TIME`] ..= [`bounds::LATEST_TIME`] (for filters too: Postgres would not
/// read jiff's spelling of years before 1 or after 9999).
pub fn parse_time(s: &str, now: Timestamp) -> Result<Timestamp, String> {
    let t = match s.strip_prefix('+') {
        Some(rel) => {
            let d = iso8601::parse(rel)?;
            let d = SignedDuration::try_from(d).map_err(|_| format!("{s:?} is too far in the future"))?;
            now.checked_add(d).map_err(|_| format!("{s:?} is too far in the future"))?
        }
        None => s
            .parse::<Timestamp>()
            .map_err(|e| format!("must be an RFC 3339 timestamp with an offset (\"2030-01-01T00:00:00Z\") or a relative \"+PT30S\", got {s:?} ({e})"))?,
    };
    bounds::check_time(t)?;
    Ok(t)
}

fn ts(t: Timestamp) -> Value {
    Value::String(t.to_string())
}

/// The OJS job object. Unset fields are omitted, not sent as `null`.
pub fn job_json(job: &Job) -> Value {
    let mut m: Map<String, Value> = match &job.extra {
        Value::Object(extra) => extra.clone(),
        _ => Map::new(),
    };
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_owned(), v);
    };
    put("id", Value::String(job.id.to_string()));
    put("type", Value::String(job.job_type.clone()));
    put("state", Value::String(job.state.as_str().to_owned()));
    put("queue", Value::String(job.queue.clone()));
    put("args", job.args.clone());
    put("meta", job.meta.clone());
    put("priority", json!(job.priority));
    put("attempt", json!(job.attempt));
    put("max_attempts", json!(job.max_attempts));
    put("created_at", ts(job.created_at));
    let waiting = matches!(job.state, JobState::Scheduled | JobState::Retryable);
    // scheduled_at defaults to the creation time; only a real schedule is worth showing.
    if waiting || job.scheduled_at != job.created_at {
        put("scheduled_at", ts(job.scheduled_at));
    }
    if waiting {
        put("next_attempt_at", ts(job.scheduled_at));
    }
    // The retry spec's name (§10) for the same time; only a retry is one, not a delayed first run.
    if job.state == JobState::Retryable {
        put("next_retry_at", ts(job.scheduled_at));
    }
    let optional_times = [
        ("enqueued_at", job.enqueued_at),
        ("expires_at", job.expires_at),
        ("started_at", job.started_at),
        ("completed_at", job.completed_at),
        ("cancelled_at", job.cancelled_at),
        ("discarded_at", job.discarded_at),
    ];
    for (k, v) in optional_times {
        if let Some(t) = v {
            put(k, ts(t));
        }
    }
    if let Some(ms) = job.timeout_ms {
        put("timeout_ms", json!(ms));
    }
    if let Some(ms) = job.visibility_timeout_ms {
        put("visibility_timeout_ms", json!(ms));
    }
    if !job.tags.is_empty() {
        put("tags", json!(job.tags));
    }
    if let Some(r) = &job.retry {
        put("retry", r.clone());
    }
    if let Some(r) = &job.result {
        put("result", r.clone());
    }
    if let Some(e) = &job.last_error {
        put("error", e.clone());
    }
    if let Some(ms) = job.retry_delay_ms {
        put("retry_delay_ms", json!(ms));
    }
    if job.dead_letter {
        put("dead_letter", Value::Bool(true));
        if let Some(t) = job.dead_lettered_at {
            put("dead_lettered_at", ts(t));
        }
    }
    if let Some(key) = &job.rate_limit_key {
        put("rate_limit", json!({ "key": key }));
        // `available`, and waiting for a slot of its key rather than for a worker.
        if job.rate_limited && job.state == JobState::Available {
            put("rate_limited", Value::Bool(true));
        }
    }
    Value::Object(m)
}

/// The job object with `errors[]`, the job's failed attempts oldest first.
pub fn job_json_with_errors<'a>(job: &Job, attempts: impl IntoIterator<Item = &'a Attempt>) -> Value {
    let mut v = job_json(job);
    let errors: Vec<Value> = attempts.into_iter().filter(|a| a.job_id == job.id && a.error_type.is_some()).map(error_json).collect();
    if let Some(m) = v.as_object_mut() {
        m.insert("errors".into(), Value::Array(errors));
    }
    v
}

/// One entry of `errors[]`.
fn error_json(a: &Attempt) -> Value {
    let mut e = json!({
        "type": a.error_type,
        "code": a.error_code.as_ref().or(a.error_type.as_ref()),
        "message": a.error_message.clone().unwrap_or_default(),
        // A drop (`on_limit`) was no failure to retry: the job asked to be dropped.
        "retryable": !matches!(a.outcome.as_str(), "non_retryable" | "dropped"),
        "attempt": a.attempt,
        "occurred_at": a.finished_at.to_string(),
        "outcome": a.outcome,
    });
    if let (Some(d), Some(m)) = (&a.error_details, e.as_object_mut()) {
        m.insert("details".into(), d.clone());
    }
    e
}

/// Milliseconds as a JSON number (saturating).
pub fn millis_json(d: Duration) -> Value {
    json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().expect("timestamp")
    }

    fn parse(v: Value) -> Result<NewJob, ApiError> {
        let map = v.as_object().cloned().expect("object");
        parse_new_job(&Fields::of(&map), now())
    }

    fn field_of(v: Value) -> String {
        let e = parse(v).expect_err("should be rejected");
        e.details.get("field").and_then(Value::as_str).unwrap_or("").to_owned()
    }

    #[test]
    fn parses_the_full_envelope() {
        let job = parse(json!({
            "type": "report.generate", "args": [1], "meta": {"a": 1}, "x_custom": true, "state": "completed",
            "options": {"queue": "reports", "priority": 10, "timeout_ms": 5000, "delay_until": "+PT2S",
                        "expires_at": "2099-12-31T23:59:59Z", "tags": ["t"], "metadata": {"test_directive": "quiet"},
                        "retry": {"max_attempts": 5}, "unique": {"keys": ["type", "args"], "on_conflict": "ignore", "period": "PT1H"}}
        }))
        .expect("valid");
        assert_eq!(job.queue, "reports");
        assert_eq!(job.priority, 10);
        assert_eq!(job.timeout_ms, Some(5000));
        assert_eq!(job.scheduled_at, Some("2026-01-01T00:00:02Z".parse().expect("ts")));
        assert_eq!(job.expires_at.map(|t| t.to_string()).as_deref(), Some("2099-12-31T23:59:59Z"));
        assert_eq!(job.retry.and_then(|r| r.max_attempts), Some(5));
        let unique = job.unique.expect("unique");
        assert_eq!((unique.on_conflict, unique.period), (OnConflict::Ignore, Some(Duration::from_secs(3600))));
        assert_eq!(job.extra, json!({"x_custom": true, "options": {"metadata": {"test_directive": "quiet"}}}));
    }

    #[test]
    fn top_level_placement_is_accepted() {
        let job = parse(json!({"type": "a.b", "args": [], "queue": "q1", "priority": -5})).expect("valid");
        assert_eq!((job.queue.as_str(), job.priority), ("q1", -5));
    }

    #[test]
    fn bad_fields_are_named() {
        assert_eq!(field_of(json!({"args": []})), "type");
        assert_eq!(field_of(json!({"type": 5, "args": []})), "type");
        assert_eq!(field_of(json!({"type": "Email.Send", "args": []})), "type");
        assert_eq!(field_of(json!({"type": "a"})), "args");
        assert_eq!(field_of(json!({"type": "a", "args": {}})), "args");
        assert_eq!(field_of(json!({"type": "a", "args": null})), "args");
        assert_eq!(field_of(json!({"type": "a", "args": [], "meta": []})), "meta");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": []})), "options");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"priority": 101}})), "options.priority");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"priority": 999999999999i64}})), "options.priority");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"queue": "Bad Queue"}})), "options.queue");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"timeout_ms": 0}})), "options.timeout_ms");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"delay_until": "tomorrow"}})), "options.delay_until");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"expires_at": "+P1M"}})), "options.expires_at");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"retry": {"max_attempts": -1}}})), "options.retry.max_attempts");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"retry": []}})), "options.retry");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"unique": {"states": ["done"]}}})), "options.unique.states[0]");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"unique": {"period": "1h"}}})), "options.unique.period");
        assert_eq!(field_of(json!({"type": "a", "args": [], "options": {"unique": {"on_conflict": "x"}}})), "options.unique.on_conflict");
        assert_eq!(field_of(json!({"type": "a", "args": [], "specversion": "2.0"})), "specversion");
        let policy = parse(json!({"type": "a", "args": [], "options": {"retry": {"backoff_coefficient": 0.5}}})).expect_err("bad");
        assert_eq!(policy.status.as_u16(), 422);
        assert!(policy.message.contains("backoff_coefficient"));
    }

    #[test]
    fn client_ids_must_be_lowercase_v7() {
        assert!(parse_client_id("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f").is_ok());
        for bad in ["", "not-a-uuid", "550e8400-e29b-41d4-a716-446655440000", "019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F", "019461a81a2b7c3d8e4f5a6b7c8d9e0f"] {
            assert!(parse_client_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn response_omits_unset_fields_and_keeps_extras() {
        let job = parse(json!({"type": "a.b", "args": [1], "x_custom_field": "v"})).expect("valid");
        let stored = job.into_job(Uuid::now_v7(), JobState::Available, 3, now());
        let v = job_json(&stored);
        assert_eq!(v["x_custom_field"], "v");
        assert_eq!(v["enqueued_at"], "2026-01-01T00:00:00Z");
        for absent in ["started_at", "completed_at", "error", "result", "scheduled_at", "next_attempt_at", "next_retry_at"] {
            assert!(v.get(absent).is_none(), "{absent} in {v}");
        }
    }

    #[test]
    fn a_job_waiting_for_a_retry_says_when_by_both_names() {
        let due: Timestamp = "2026-01-01T00:05:00Z".parse().expect("timestamp");
        let job = parse(json!({"type": "a.b", "args": [], "next_retry_at": "1999-01-01T00:00:00Z"})).expect("valid");
        let mut stored = job.into_job(Uuid::now_v7(), JobState::Retryable, 3, now());
        stored.scheduled_at = due;
        let v = job_json(&stored);
        assert_eq!((v["next_retry_at"].as_str(), v["next_attempt_at"].as_str()), (Some("2026-01-01T00:05:00Z"), Some("2026-01-01T00:05:00Z")), "{v}");
        // A delayed first run waits too, but not for a retry; a client's copy is never echoed.
        stored.state = JobState::Scheduled;
        let v = job_json(&stored);
        assert_eq!((v.get("next_retry_at"), v["next_attempt_at"].as_str()), (None, Some("2026-01-01T00:05:00Z")), "{v}");
    }
}
