//! Recording failed executions: the live policy is read in the same transaction, the pure
//! [`decide`] picks the next state, and the job, its `last_error` and a `job_attempts` row are
//! written together.

use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};
use sqlx::PgConnection;
use uuid::Uuid;

use super::policies::PolicyLayers;
use super::{Store, StoreError, jobs_from_rows, millis};
use crate::job::{Job, JobState};
use crate::outcome::{Decision, HandlerError, NextStep, Outcome, decide};
use crate::policy::RetryPolicy;

/// A failed (or snoozed) execution to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub id: Uuid,
    /// The attempt the caller ran; a failure for an older attempt is refused (see
    /// [`super::Completion::attempt`]).
    pub attempt: Option<i32>,
    pub worker_id: Option<String>,
    pub outcome: Outcome,
    /// A client's own error code (OJS `error.code`), kept beside the error type.
    pub error_code: Option<String>,
}

/// What recording a failure did.
#[derive(Clone, Debug, PartialEq)]
pub struct FailureResult {
    pub job: Job,
    pub decision: Decision,
    /// The effective policy the decision used.
    pub policy: RetryPolicy,
}

/// One locked job and what happened to it.
pub(crate) struct FailedRun {
    pub job: Job,
    pub outcome: Outcome,
    pub worker_id: Option<String>,
    pub error_code: Option<String>,
    /// A crash is no evidence that the job's downstream is unwell: run it again at once
    /// (still counted) instead of backing off.
    pub immediate: bool,
}

const APPLY: &str = "
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::timestamptz[], $5::int4[], $6::jsonb[],
                         $7::int4[], $8::bool[], $9::int4[], $10::text[], $11::text[], $12::text[], $13::text[],
                         $14::text[], $15::jsonb[], $16::jsonb[])
        AS t(id, state, delay_ms, run_at, attempt_delta, last_error, max_attempts, dead_letter, ran_attempt,
             worker_id, outcome, error_type, error_code, error_message, error_details, policy)
), updated AS (
    UPDATE jobs j
    SET state = i.state::job_state,
        attempt = j.attempt + i.attempt_delta,
        max_attempts = i.max_attempts,
        last_error = COALESCE(i.last_error, j.last_error),
        retry_delay_ms = COALESCE(i.delay_ms, j.retry_delay_ms),
        scheduled_at = CASE WHEN i.state IN ('retryable', 'available', 'scheduled')
                            THEN COALESCE(i.run_at, now() + COALESCE(i.delay_ms, 0) * interval '1 millisecond')
                            ELSE j.scheduled_at END,
        enqueued_at = CASE WHEN i.state = 'available' THEN now() ELSE j.enqueued_at END,
        discarded_at = CASE WHEN i.state = 'discarded' THEN now() END,
        completed_at = CASE WHEN i.state = 'discarded' THEN now() ELSE j.completed_at END,
        dead_letter = i.dead_letter,
        dead_lettered_at = CASE WHEN i.dead_letter THEN now() END,
        locked_by = NULL, lock_expires_at = NULL, updated_at = now()
    FROM input i
    -- Optimistic guard: the decision was made on a read of this exact attempt. If the job moved
    -- on meanwhile (cancelled, rescued, claimed again) the failure no longer applies.
    WHERE j.id = i.id AND j.state = 'active' AND j.attempt = i.ran_attempt
    RETURNING j.*
), recorded AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error_type, error_code,
                              error_message, error_details, delay_ms, next_run_at, policy)
    SELECT i.id, i.ran_attempt, i.worker_id, u.started_at, i.outcome, i.error_type, i.error_code,
           i.error_message, i.error_details, i.delay_ms,
           CASE WHEN u.state IN ('retryable', 'available', 'scheduled') THEN u.scheduled_at END, i.policy
    FROM input i JOIN updated u ON u.id = i.id
), woken AS (
    SELECT pg_notify('rebound_jobs', q.queue) FROM (SELECT DISTINCT queue FROM updated WHERE state = 'available') AS q
)
-- Referencing `woken` is what makes Postgres run it (unreferenced SELECT CTEs are skipped).
SELECT * FROM updated WHERE (SELECT count(*) FROM woken) >= 0";

/// Decides and writes the failures of `runs` in one statement, with the given live policies.
/// Each write is guarded by the job still being active at the attempt that was read, so the
/// caller needs no lock: a job that moved on meanwhile is skipped (absent from the answer).
pub(crate) async fn apply_failures(conn: &mut PgConnection, runs: Vec<FailedRun>, layers: &PolicyLayers) -> Result<Vec<FailureResult>, StoreError> {
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let now = Timestamp::now();
    let mut rng = fastrand::Rng::new();

    let n = runs.len();
    let mut ids = Vec::with_capacity(n);
    let mut states = Vec::with_capacity(n);
    let mut delays: Vec<Option<i64>> = Vec::with_capacity(n);
    let mut run_ats: Vec<Option<String>> = Vec::with_capacity(n);
    let mut deltas = Vec::with_capacity(n);
    let mut last_errors: Vec<Option<Value>> = Vec::with_capacity(n);
    let mut max_attempts = Vec::with_capacity(n);
    let mut dead_letters = Vec::with_capacity(n);
    let mut ran_attempts = Vec::with_capacity(n);
    let mut workers: Vec<Option<String>> = Vec::with_capacity(n);
    let mut outcomes = Vec::with_capacity(n);
    let mut error_types: Vec<Option<String>> = Vec::with_capacity(n);
    let mut error_codes: Vec<Option<String>> = Vec::with_capacity(n);
    let mut error_messages: Vec<Option<String>> = Vec::with_capacity(n);
    let mut error_details: Vec<Option<Value>> = Vec::with_capacity(n);
    let mut policies = Vec::with_capacity(n);
    let mut decided = Vec::with_capacity(n);

    for run in &runs {
        let job = &run.job;
        let job_patch = match job.retry_patch() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(job_id = %job.id, error = %e, "stored job retry override no longer parses; ignoring it");
                None
            }
        };
        let policy = layers.resolve_lenient(&job.job_type, job_patch.as_ref());
        let ran = u32::try_from(job.attempt.max(1)).unwrap_or(1);
        let mut decision = decide(ran, &policy, &run.outcome, now, &mut rng);
        if run.immediate && matches!(decision.next, NextStep::Retry { .. }) {
            decision.next = NextStep::Retry { run_at: now, delay: Duration::ZERO };
        }
        let (state, delay, run_at, delta, dead_letter) = match &decision.next {
            // Sub-millisecond backoff is no backoff: skip the round trip through the scheduler.
            NextStep::Retry { delay, .. } if millis(*delay) == 0 => (JobState::Available, Some(0), None, 0, false),
            NextStep::Retry { delay, .. } => (JobState::Retryable, Some(millis(*delay)), None, 0, false),
            NextStep::Snooze { run_at, delay } => {
                let state = if delay.is_zero() { JobState::Available } else { JobState::Scheduled };
                (state, None, Some(run_at.to_string()), -1, false)
            }
            NextStep::Discard => (JobState::Discarded, None, None, 0, false),
            NextStep::DeadLetter => (JobState::Discarded, None, None, 0, true),
        };
        let error = run.outcome.error();
        ids.push(job.id);
        states.push(state.as_str());
        delays.push(delay);
        run_ats.push(run_at);
        deltas.push(delta);
        last_errors.push(error.map(|e| last_error_json(e, run.error_code.as_deref(), job.attempt, now)));
        max_attempts.push(i32::try_from(policy.max_attempts).unwrap_or(i32::MAX));
        dead_letters.push(dead_letter);
        ran_attempts.push(job.attempt);
        workers.push(run.worker_id.clone().or_else(|| job.locked_by.clone()));
        outcomes.push(decision.attempt_outcome.as_str());
        error_types.push(error.map(|e| e.error_type.clone()));
        error_codes.push(run.error_code.clone().or_else(|| error.map(|e| e.error_type.clone())));
        error_messages.push(error.map(|e| e.message.clone()));
        error_details.push(error.and_then(|e| e.details.clone()));
        policies.push(policy.to_json());
        decided.push((decision, policy));
    }

    let rows = sqlx::query(APPLY)
        .bind(&ids)
        .bind(&states)
        .bind(&delays)
        .bind(&run_ats)
        .bind(&deltas)
        .bind(&last_errors)
        .bind(&max_attempts)
        .bind(&dead_letters)
        .bind(&ran_attempts)
        .bind(&workers)
        .bind(&outcomes)
        .bind(&error_types)
        .bind(&error_codes)
        .bind(&error_messages)
        .bind(&error_details)
        .bind(&policies)
        .fetch_all(&mut *conn)
        .await?;
    let mut by_id: std::collections::HashMap<Uuid, Job> = jobs_from_rows(&rows)?.into_iter().map(|j| (j.id, j)).collect();
    Ok(ids
        .iter()
        .zip(decided)
        .filter_map(|(id, (decision, policy))| by_id.remove(id).map(|job| FailureResult { job, decision, policy }))
        .collect())
}

/// The `last_error` mirror, in the OJS error shape.
fn last_error_json(e: &HandlerError, code: Option<&str>, attempt: i32, now: Timestamp) -> Value {
    let mut v = json!({
        "type": e.error_type,
        "code": code.unwrap_or(&e.error_type),
        "message": e.message,
        "retryable": e.retryable,
        "attempt": attempt,
        "occurred_at": now.to_string(),
    });
    if let (Some(details), Some(obj)) = (&e.details, v.as_object_mut()) {
        obj.insert("details".into(), details.clone());
    }
    v
}

impl Store {
    /// Records one failed execution of an active job (OJS nack). Not active is a conflict.
    pub async fn fail(&self, failure: &Failure) -> Result<FailureResult, StoreError> {
        let mut out = self.fail_batch(std::slice::from_ref(failure)).await?;
        match out.pop() {
            Some(r) => Ok(r),
            None => Err(self.conflict_or_missing(failure.id, "fail").await),
        }
    }

    /// Records many failures in one transaction (the worker's completer). Failures of jobs that
    /// are no longer active at that attempt are skipped and absent from the answer.
    pub async fn fail_batch(&self, failures: &[Failure]) -> Result<Vec<FailureResult>, StoreError> {
        if failures.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = failures.iter().map(|f| f.id).collect();
        // Two reads at once on two connections (the jobs, and the live policies of their
        // types), then one guarded write: the fail path costs two round trips, not six.
        let mut conn = self.pool.acquire().await?;
        let mut policy_conn = self.pool.acquire().await?;
        let (rows, layers) = tokio::join!(
            sqlx::query("SELECT * FROM jobs WHERE id = ANY($1) AND state = 'active'").bind(&ids).fetch_all(&mut *conn),
            PolicyLayers::load_for_jobs(&mut policy_conn, &ids),
        );
        drop(policy_conn);
        let (rows, layers) = (rows?, layers?);
        let mut locked: std::collections::HashMap<Uuid, Job> = jobs_from_rows(&rows)?.into_iter().map(|j| (j.id, j)).collect();
        let runs: Vec<FailedRun> = failures
            .iter()
            .filter_map(|f| {
                let job = locked.remove(&f.id)?;
                if f.attempt.is_some_and(|a| a != job.attempt) {
                    return None;
                }
                Some(FailedRun {
                    job,
                    outcome: f.outcome.clone(),
                    worker_id: f.worker_id.clone(),
                    error_code: f.error_code.clone(),
                    immediate: false,
                })
            })
            .collect();
        apply_failures(&mut conn, runs, &layers).await
    }
}
