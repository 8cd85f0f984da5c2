//! The worker protocol: fetch, ack, nack, heartbeat, progress.

use std::collections::HashSet;
use std::time::Duration;

use axum::extract::State;
use axum::{Extension, Json};
use jiff::Timestamp;
use rebound_queue::job::validate_queue;
use rebound_queue::outcome::NextStep;
use rebound_queue::store::{ClaimRequest, Completion, Failure, JobProgress, NamedRun, ProcessUsage, ProgressReport, WorkerRegistration};
use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::{HandlerError, Job, Outcome};
use tokio_util::sync::CancellationToken;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::body::{Fields, JsonObject, json_kind, parse_uuid};
use super::envelope::job_json;
use super::error::ApiError;
use super::test_mode;
use crate::AppState;
use crate::metrics::JobCounter;
use crate::request_task::Unheard;

/// Longest accepted visibility timeout (a day): a longer claim is a stuck job in disguise.
const MAX_VISIBILITY_MS: i64 = 24 * 3600 * 1000;
/// Most jobs one fetch may claim.
const MAX_FETCH: i64 = 1000;
/// The worker id recorded for fetches that name none.
const ANONYMOUS_WORKER: &str = "anonymous";

fn worker_id<'a>(f: &Fields<'a>, required: bool) -> Result<Option<&'a str>, ApiError> {
    match f.str("worker_id")? {
        Some(w) if w.is_empty() || w.len() > 200 => Err(f.error("worker_id", "must be 1 to 200 characters")),
        None if required => Err(f.error("worker_id", "is required")),
        other => Ok(other),
    }
}

fn visibility(f: &Fields<'_>) -> Result<Option<Duration>, ApiError> {
    Ok(f.i64_in("visibility_timeout_ms", 1, MAX_VISIBILITY_MS)?.map(|ms| Duration::from_millis(ms.unsigned_abs())))
}

/// `POST /ojs/v1/workers/fetch`: claims up to `count` jobs from `queues`, in queue order.
pub async fn fetch(State(state): State<AppState>, unheard_by: Option<Extension<Unheard>>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    let names = f.strings("queues")?.ok_or_else(|| f.error("queues", "is required"))?;
    if names.is_empty() || names.len() > 100 {
        return Err(f.error("queues", "must list 1 to 100 queues"));
    }
    let queues = valid_queues(&f, names)?;
    let count = f.i64_in("count", 1, MAX_FETCH)?.unwrap_or(1);
    let named = worker_id(&f, false)?;
    // A worker that said it is stopping, or that an operator quieted, gets no new jobs
    // (graceful shutdown); its heartbeats keep what it runs.
    if let Some(w) = named
        && !state.store.worker_accepts_work(w).await.map_err(|e| ApiError::from(e).retry_safe())?
    {
        return Ok(Json(json!({ "jobs": [] })));
    }
    let req = ClaimRequest {
        worker_id: named.unwrap_or(ANONYMOUS_WORKER).to_owned(),
        queues,
        limit: u32::try_from(count).unwrap_or(1),
        visibility_timeout: visibility(&f)?.unwrap_or(state.config.visibility_timeout),
    };
    if unheard_by.as_ref().is_some_and(|u| u.is_unheard()) {
        return Ok(Json(json!({ "jobs": [] })));
    }
    // In one transaction whose fate is looked up if its answer is lost: jobs claimed for a
    // caller that never heard of them go back uncounted instead of waiting to be charged.
    let jobs = state.store.claim_in_one(&req).await.map_err(|e| ApiError::from(e).retry_safe())?;
    // Taking the answer for delivery keeps the request timeout from answering 408 in its place
    // from here on, so the jobs either reach the caller or go back below.
    if !jobs.is_empty() && unheard_by.as_ref().is_some_and(|u| !u.deliver()) {
        // Its caller hung up or was answered 408 while the claim ran: nobody will run these
        // jobs, so they go back now, uncounted, rather than be charged when their lock lapses.
        // Each job goes back only while it stands at the run this fetch claimed: sent again
        // after a blip, the release must not hand back a later fetch's claim of the same job
        // (by the same worker id: every fetch naming none is "anonymous").
        let runs: Vec<(Uuid, NamedRun)> = jobs.iter().map(|j| (j.id, NamedRun::of(j))).collect();
        let retry = StorageRetry::storage_default();
        match retry.run("handing back an unheard fetch's jobs", &CancellationToken::new(), || state.store.release(&runs, Some(&req.worker_id), UNHEARD_FETCH_REASON)).await {
            Ok(released) => tracing::warn!(worker = req.worker_id, count = released.len(), "a fetch's caller stopped waiting before its answer; its jobs were handed back uncounted"),
            Err(e) => tracing::error!(worker = req.worker_id, count = runs.len(), error = %e, "a fetch's caller stopped waiting, and handing its jobs back failed; they are charged when their locks lapse"),
        }
        return Ok(Json(json!({ "jobs": [] })));
    }
    for job in &jobs {
        record_start_latency(&state, job);
    }
    Ok(Json(json!({ "jobs": jobs.iter().map(job_json).collect::<Vec<_>>() })))
}

fn record_start_latency(state: &AppState, job: &Job) {
    let Some(started) = job.started_at else { return };
    let due = job.enqueued_at.unwrap_or(job.scheduled_at);
    let waited = started.duration_since(due).as_secs_f64();
    state.metrics.observe_start_latency(&job.queue, waited);
}

/// Why a fetch handed its jobs back: see [`fetch`].
pub const UNHEARD_FETCH_REASON: &str = "fetched for a caller that stopped waiting for the answer (it hung up, or was answered 408), so nobody received the job; the attempt is not counted";

/// The run an ack or nack is about, where the caller names it: the job's `attempt` and
/// `started_at` as the fetch returned them (Rebound's addition to the worker protocol; the
/// SDKs send neither). A nack re-sent after its answer was lost, or an ack from a worker that
/// fetched the same job again, then cannot land on a later run of it: handing a job back
/// gives its attempt number back, so only the start tells the runs apart.
fn named_run(f: &Fields<'_>) -> Result<NamedRun, ApiError> {
    let attempt = f.i64_in("attempt", 1, i64::from(i32::MAX))?.and_then(|a| i32::try_from(a).ok());
    let started_at = match f.str("started_at")? {
        None => None,
        Some(s) => {
            let shown: String = s.chars().take(64).collect();
            let t = s.parse::<Timestamp>().map_err(|e| {
                f.error("started_at", format!("must be the job's started_at as the fetch returned it, an RFC 3339 timestamp with an offset; got {shown:?} ({e})"))
            })?;
            // No run starts outside these bounds, and Postgres cannot compare with every time
            // jiff can hold.
            rebound_queue::bounds::check_time(t).map_err(|reason| f.error("started_at", format!("{reason} (no run of the job started then)")))?;
            Some(t)
        }
    };
    Ok(NamedRun { attempt, started_at })
}

/// `POST /ojs/v1/workers/ack`: an active job completed.
pub async fn ack(State(state): State<AppState>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    let run = named_run(&f)?;
    let completion = Completion {
        id: f.required_uuid("job_id")?,
        attempt: run.attempt,
        worker_id: worker_id(&f, false)?.map(str::to_owned),
        started_at: run.started_at,
        result: f.get("result").cloned(),
    };
    let job = state.store.complete(&completion).await?;
    state.metrics.count(JobCounter::Completed, &job.job_type, &job.queue);
    let mut out = json!({
        "acknowledged": true,
        "id": job.id.to_string(),
        "job_id": job.id.to_string(),
        "state": job.state.as_str(),
        "job": job_json(&job),
    });
    if let (Some(t), Some(m)) = (job.completed_at, out.as_object_mut()) {
        m.insert("completed_at".into(), Value::String(t.to_string()));
    }
    Ok(Json(out))
}

/// The `error` of a nack, as the store records it.
fn handler_error(e: &Fields<'_>) -> Result<(HandlerError, String), ApiError> {
    let code = e.str("code")?;
    let error_type = e.str("type")?;
    let code = match (code, error_type) {
        (Some(c), _) => c,
        (None, Some(t)) => t,
        (None, None) => return Err(e.error("code", "is required (or give error.type)")),
    };
    if code.is_empty() || code.len() > 200 {
        return Err(e.error("code", "must be 1 to 200 characters"));
    }
    let message = e.required_str("message")?;
    let mut details = match e.get("details") {
        None => None,
        Some(d @ Value::Object(_)) => Some(d.clone()),
        Some(other) => return Err(e.error("details", format!("must be a JSON object, got {}", json_kind(other)))),
    };
    // ojs-rate-limiting §9: the upstream said when to come back. Kept with the error's
    // details, where the store reads it to hold the job's rate-limit key until then.
    if let Some(until) = e.str("rate_limit_until")? {
        let t = super::envelope::parse_time(until, jiff::Timestamp::now()).map_err(|r| e.error("rate_limit_until", r))?;
        let d = details.get_or_insert_with(|| json!({}));
        if let Some(m) = d.as_object_mut() {
            m.insert("rate_limit_until".into(), Value::String(t.to_string()));
        }
    }
    let error = HandlerError {
        error_type: error_type.unwrap_or(code).to_owned(),
        message: message.to_owned(),
        details,
        retryable: e.bool("retryable")?.unwrap_or(true),
    };
    Ok((error, code.to_owned()))
}

/// The OJS handler response codes (`ojs-retry.md` §7), sent as `error.code`, take precedence
/// over the retry policy; any other code is an ordinary failure the policy judges.
fn handler_outcome(code: &str, error: HandlerError) -> Outcome {
    match code {
        "DISCARD" => Outcome::Discard(error),
        "DEAD_LETTER" => Outcome::DeadLetter(error),
        "FAIL" => Outcome::Fail(error),
        _ => Outcome::Retry(error),
    }
}

/// The fields every nack answer carries.
fn nack_answer(job: &Job) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("id".into(), Value::String(job.id.to_string()));
    m.insert("job_id".into(), Value::String(job.id.to_string()));
    m.insert("state".into(), Value::String(job.state.as_str().to_owned()));
    m.insert("attempt".into(), json!(job.attempt));
    m.insert("max_attempts".into(), json!(job.max_attempts));
    m
}

/// `POST /ojs/v1/workers/nack`: an active job failed (or, with `requeue: true`, is handed back
/// without counting the attempt). The live retry policy decides what follows.
pub async fn nack(State(state): State<AppState>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    let id = f.required_uuid("job_id")?;
    let worker = worker_id(&f, false)?;
    let run = named_run(&f)?;
    let requeue = f.bool("requeue")?.unwrap_or(false);
    let error = f.object("error")?;
    if requeue {
        let reason = match &error {
            Some(e) => e.str("message")?.unwrap_or("requeued by the worker").to_owned(),
            None => "requeued by the worker".to_owned(),
        };
        // Only the holder hands a job back, as only it acks or fails it (worker protocol §5.6).
        let job = state.store.release_one(id, worker, run, &reason).await?;
        let mut m = nack_answer(&job);
        m.insert("job".into(), job_json(&job));
        return Ok(Json(Value::Object(m)));
    }
    let error = error.ok_or_else(|| f.error("error", "is required"))?;
    let (handler_error, code) = handler_error(&error)?;
    let mut handler_error = handler_error;
    // A job interrupted by its worker's shutdown did not fail on its own (graceful shutdown §5.3):
    // it is always retried.
    if matches!(handler_error.error_type.as_str(), "ShutdownError" | "ShutdownTimeout") || matches!(code.as_str(), "ShutdownError" | "ShutdownTimeout") {
        handler_error.retryable = true;
    }
    let outcome = handler_outcome(&code, handler_error);
    let failure = Failure { id, attempt: run.attempt, worker_id: worker.map(str::to_owned), outcome, error_code: Some(code) };
    let result = state.store.fail_run(&failure, run.started_at).await?;
    let job = &result.job;
    state.metrics.count(JobCounter::Failed, &job.job_type, &job.queue);
    let follow_up = match result.decision.next {
        NextStep::Retry { .. } => Some(JobCounter::Retried),
        NextStep::Discard => Some(JobCounter::Discarded),
        NextStep::DeadLetter => Some(JobCounter::DeadLettered),
        NextStep::Snooze { .. } => None,
    };
    if let Some(counter) = follow_up {
        state.metrics.count(counter, &job.job_type, &job.queue);
    }
    let mut m = nack_answer(job);
    if let Some(ms) = job.retry_delay_ms.filter(|_| !job.state.is_terminal()) {
        m.insert("retry_delay_ms".into(), json!(ms));
        m.insert("next_attempt_at".into(), Value::String(job.scheduled_at.to_string()));
        if job.state == rebound_queue::JobState::Retryable {
            m.insert("next_retry_at".into(), Value::String(job.scheduled_at.to_string()));
        }
    }
    for (key, t) in [("discarded_at", job.discarded_at), ("completed_at", job.completed_at)] {
        if let Some(t) = t {
            m.insert(key.into(), Value::String(t.to_string()));
        }
    }
    if job.dead_letter {
        m.insert("dead_letter".into(), Value::Bool(true));
    }
    if let Some(e) = &job.last_error {
        m.insert("error".into(), e.clone());
    }
    m.insert("job".into(), job_json(job));
    Ok(Json(Value::Object(m)))
}

/// Logs the jobs a beat named but could not extend because their claim had already lapsed
/// (they are waiting to run again, or another worker runs them). Jobs that finished meanwhile
/// are not worth a word.
async fn warn_lapsed<'a>(state: &AppState, worker: &str, ids: impl Iterator<Item = &'a Uuid>) {
    let mut lapsed = Vec::new();
    for id in ids.take(20) {
        if let Ok(Some(job)) = state.store.get_job(*id).await
            && !job.state.is_terminal()
        {
            lapsed.push(format!("{id} ({})", job.state));
        }
    }
    if !lapsed.is_empty() {
        tracing::warn!(worker, lapsed = ?lapsed, "heartbeat came too late for these jobs: their claims had lapsed and they were handed back; beat more often than the visibility timeout");
    }
}

/// The most job ids one heartbeat may list, across `active_jobs` and `active_job_ids`.
const MAX_HEARTBEAT_JOBS: usize = 10_000;

/// The job ids a heartbeat lists, leniently: OJS puts them in `active_jobs`; the JS and Go SDKs
/// send `active_jobs` as a count and the ids in `active_job_ids`. Both lists are read, together
/// at most [`MAX_HEARTBEAT_JOBS`] entries. The count, when given, says how many jobs the worker
/// believes it runs.
fn heartbeat_jobs(f: &Fields<'_>) -> Result<(Vec<Uuid>, Option<i64>), ApiError> {
    let mut ids: Vec<Uuid> = Vec::new();
    let mut seen: HashSet<Uuid> = HashSet::new();
    let (mut listed, mut count) = (0usize, None);
    for key in ["active_jobs", "active_job_ids"] {
        let raw = match f.get(key) {
            Some(Value::Number(_)) if key == "active_jobs" => {
                count = f.i64_in(key, 0, 1_000_000)?;
                continue;
            }
            _ => f.strings(key)?.unwrap_or_default(),
        };
        // Counted before any is parsed: the bound is on the work a beat can ask for.
        listed += raw.len();
        if listed > MAX_HEARTBEAT_JOBS {
            return Err(f.error(key, format!("lists more than {MAX_HEARTBEAT_JOBS} jobs (active_jobs and active_job_ids together)")));
        }
        for (i, s) in raw.iter().enumerate() {
            let id = parse_uuid(s).map_err(|r| f.error(&format!("{key}[{i}]"), r))?;
            if seen.insert(id) {
                ids.push(id);
            }
        }
    }
    Ok((ids, count))
}

/// The most queues a heartbeat may say its worker serves (as many as one fetch may name).
const MAX_HEARTBEAT_QUEUES: usize = 100;
/// The longest `hostname` a heartbeat may give, in bytes (a DNS name is at most 253).
const MAX_HOSTNAME: usize = 255;
/// The largest `concurrency` a heartbeat may give.
const MAX_CONCURRENCY: i64 = 100_000;

/// The `queues` a request names, each a valid queue name (an error names `queues[i]`), once
/// each in the order given. The caller bounds how many.
fn valid_queues(f: &Fields<'_>, names: Vec<&str>) -> Result<Vec<String>, ApiError> {
    let mut queues: Vec<String> = Vec::with_capacity(names.len());
    for (i, name) in names.into_iter().enumerate() {
        validate_queue(name).map_err(|e| f.error(&format!("queues[{i}]"), e.reason))?;
        if !queues.iter().any(|q| q == name) {
            queues.push(name.to_owned());
        }
    }
    Ok(queues)
}

/// What a heartbeat says of its worker (worker protocol §4.2: `hostname`, `pid`, `queues`,
/// `concurrency`), for the worker list and the `worker.heartbeat` event. Absent, empty or zero
/// is not said: the JS SDK sends pid 0 when it cannot tell. `labels` and `started_at` are not
/// kept (the worker row has no place for them).
fn heartbeat_worker(f: &Fields<'_>, id: &str) -> Result<WorkerRegistration, ApiError> {
    let host = f.str("hostname")?.unwrap_or_default();
    if host.len() > MAX_HOSTNAME || host.chars().any(char::is_control) {
        return Err(f.error("hostname", format!("must be at most {MAX_HOSTNAME} bytes, without control characters")));
    }
    let pid = f.i64_in("pid", 0, i64::from(i32::MAX))?.unwrap_or(0);
    let names = f.strings("queues")?.unwrap_or_default();
    if names.len() > MAX_HEARTBEAT_QUEUES {
        return Err(f.error("queues", format!("must list at most {MAX_HEARTBEAT_QUEUES} queues")));
    }
    let queues = valid_queues(f, names)?;
    let concurrency = f.i64_in("concurrency", 0, MAX_CONCURRENCY)?.unwrap_or(0);
    Ok(WorkerRegistration {
        id: id.to_owned(),
        host: host.to_owned(),
        pid: i32::try_from(pid).unwrap_or(0),
        queues,
        concurrency: i32::try_from(concurrency).unwrap_or(0),
        version: String::new(),
    })
}

/// `POST /ojs/v1/workers/heartbeat`: extends the claims of `active_jobs` (or `active_job_ids`)
/// and answers the worker's directive (`running`, or in test mode what the job's metadata asks
/// for). A beat that leaves running jobs unextended is logged: one that names no ids while
/// saying jobs run (their claims will lapse), and ids whose claims had lapsed already.
pub async fn heartbeat(State(state): State<AppState>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    let worker = worker_id(&f, true)?.unwrap_or(ANONYMOUS_WORKER);
    let (ids, claimed_count) = heartbeat_jobs(&f)?;
    let vis = visibility(&f)?;
    // Every field is read before any claim is extended, so a bad one changes nothing.
    let about = heartbeat_worker(&f, worker)?;
    // The worker's own state (graceful shutdown: `quiet` while draining, `terminate` at the end).
    let own_state = f.str("state")?;
    let stopping = matches!(own_state, Some("quiet" | "terminate" | "terminated" | "stopping"));
    // What the client says it uses (the `worker.heartbeat` event's optional fields): a
    // petabyte and a thousand cores are bounds no real process passes.
    let usage = ProcessUsage { memory_mb: f.f64_in("memory_mb", 0.0, 1e9)?, cpu_percent: f.f64_in("cpu_percent", 0.0, 100_000.0)? };
    // Any holder's claim is extended: OJS workers need not send the id they fetched with.
    // A job whose row another request is writing (its ack, most likely) is `busy`: still
    // held, left for the next beat rather than waited for.
    let held = state.store.heartbeat(None, &ids, vis).await?;
    let said_running = claimed_count.unwrap_or(0).max(i64::try_from(ids.len()).unwrap_or(i64::MAX));
    if ids.is_empty() && said_running > 0 {
        tracing::warn!(worker, said_running, "heartbeat says jobs are running but names none (send their ids in active_jobs): no claim was extended; they will lapse and be run again");
    } else if held.extended.len() + held.busy.len() < ids.len() {
        warn_lapsed(&state, worker, ids.iter().filter(|id| !held.extended.contains(id) && !held.busy.contains(id))).await;
    }
    let requested = state.store.ojs_worker_beat_as(&about, i32::try_from(said_running).unwrap_or(i32::MAX), stopping, usage).await?;
    let directive = match requested.as_deref() {
        Some("terminate") => "terminate",
        Some("quiet") => "quiet",
        _ if state.config.test_mode => test_mode::directive(&state.store, &ids).await?,
        _ => "running",
    };
    // Never a step back from where the worker says it is (worker protocol §2: no transition
    // from `terminate` to `quiet` or `running`): a naive client obeying `running` would resume.
    let directive = match own_state {
        Some("terminate" | "terminated" | "stopping") => "terminate",
        Some("quiet") if directive == "running" => "quiet",
        _ => directive,
    };
    Ok(Json(json!({
        "state": directive,
        "jobs_extended": held.extended.iter().map(Uuid::to_string).collect::<Vec<_>>(),
        "jobs_busy": held.busy.iter().map(Uuid::to_string).collect::<Vec<_>>(),
        "server_time": Timestamp::now().to_string(),
    })))
}

/// A progress report as the API answers it (`progress` is the SDKs' name for `percentage`).
pub fn progress_json(job_id: Uuid, p: Option<&JobProgress>) -> Value {
    json!({
        "job_id": job_id.to_string(),
        "progress": p.map_or(0.0, |p| p.percentage),
        "percentage": p.map_or(0.0, |p| p.percentage),
        "message": p.and_then(|p| p.message.clone()),
        "data": p.and_then(|p| p.data.clone()),
        "attempt": p.map(|p| p.attempt),
        "worker_id": p.and_then(|p| p.worker_id.clone()),
        "updated_at": p.map(|p| p.at.to_string()),
    })
}

/// `POST /ojs/v1/workers/progress` (the SDKs' `reportProgress`): a running job's progress,
/// `percentage` (or `progress`) from 0 to 100 with an optional `message` and `data`. Kept
/// (`GET /ojs/v1/jobs/{id}/progress`) and emitted as a `job.progress` event. A job that is not
/// running is a 409; the report is recorded under the worker holding the job.
pub async fn progress(State(state): State<AppState>, body: JsonObject) -> Result<Json<Value>, ApiError> {
    let f = body.fields();
    let job_id = f.required_uuid("job_id")?;
    let key = if f.get("percentage").is_some() { "percentage" } else { "progress" };
    let percentage = match f.get(key) {
        Some(Value::Number(n)) => n.as_f64().ok_or_else(|| f.error(key, format!("must be a number from 0 to 100, got {n}")))?,
        Some(v) => return Err(f.error(key, format!("must be a number from 0 to 100, got {}", json_kind(v)))),
        None => return Err(f.error("percentage", "is required")),
    };
    if !(0.0..=100.0).contains(&percentage) {
        return Err(f.error(key, format!("must be a number from 0 to 100, got {percentage}")));
    }
    let report = ProgressReport {
        job_id,
        attempt: None,
        worker_id: None,
        percentage,
        message: f.str("message")?.map(str::to_owned),
        data: f.get("data").cloned(),
    };
    let kept = state.store.report_progress(&report).await?;
    Ok(Json(progress_json(job_id, Some(&kept))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize, from: u128) -> Vec<Value> {
        (0..n).map(|i| json!(Uuid::from_u128(from + i as u128).to_string())).collect()
    }

    fn jobs_of(body: Value) -> Result<(Vec<Uuid>, Option<i64>), ApiError> {
        let map = body.as_object().cloned().unwrap_or_default();
        heartbeat_jobs(&Fields::of(&map))
    }

    #[test]
    fn heartbeat_ids_are_deduplicated_in_order_across_both_keys() {
        let (got, count) = jobs_of(json!({"active_jobs": ids(3, 1), "active_job_ids": ids(3, 2)})).expect("valid");
        assert_eq!(got, (1..=4).map(Uuid::from_u128).collect::<Vec<_>>());
        assert_eq!(count, None);
        let (got, count) = jobs_of(json!({"active_jobs": 2, "active_job_ids": ids(2, 7)})).expect("valid");
        assert_eq!((got.len(), count), (2, Some(2)));
    }

    #[test]
    fn heartbeat_ids_are_bounded_across_both_keys() {
        let (got, _) = jobs_of(json!({"active_jobs": ids(5_000, 0), "active_job_ids": ids(5_000, 5_000)})).expect("at the bound");
        assert_eq!(got.len(), MAX_HEARTBEAT_JOBS);
        // Each list under the old per-key bound, together over it.
        let e = jobs_of(json!({"active_jobs": ids(6_000, 0), "active_job_ids": ids(6_000, 0)})).expect_err("over the bound");
        assert_eq!(e.details["field"], "active_job_ids");
        let e = jobs_of(json!({"active_jobs": ids(10_001, 0)})).expect_err("over the bound");
        assert_eq!(e.details["field"], "active_jobs");
    }
}
