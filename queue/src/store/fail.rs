//! Recording failed executions: the job and the live policy are read, the pure [`decide`]
//! picks the next state, and the job, its `last_error` and a `job_attempts` row are written
//! together by one statement guarded by the attempt that was read.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgConnection, Row};
use uuid::Uuid;

use super::policies::PolicyLayers;
use super::{NamedRun, Store, StoreError, jobs_from_rows, millis};
use crate::job::{Job, JobState};
use crate::outcome::{Decision, HandlerError, NextStep, Outcome};
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

// The write shared by every way of recording failures; the caller picks what comes back.
macro_rules! apply_failures_sql {
    ($updated:literal, $returning:literal) => {
        concat!(
            "
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::timestamptz[], $5::int4[], $6::jsonb[],
                         $7::int4[], $8::bool[], $9::int4[], $10::text[], $11::text[], $12::text[], $13::text[],
                         $14::text[], $15::jsonb[], $16::int4[], $18::int8[])
        AS t(id, state, delay_ms, run_at, attempt_delta, last_error, max_attempts, dead_letter, ran_attempt,
             worker_id, outcome, error_type, error_code, error_message, error_details, policy_index, started_us)
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
        -- Dead letters are grouped by it (see migrations/…_error_signature_written.sql).
        error_signature = CASE WHEN i.dead_letter THEN rebound_error_signature(COALESCE(i.last_error, j.last_error)) END,
        dead_lettered_at = CASE WHEN i.dead_letter THEN now() END,
        locked_by = NULL, lock_expires_at = NULL, updated_at = now()
    FROM input i
    -- Optimistic guard: the decision was made on a read of this exact attempt. If the job moved
    -- on meanwhile (cancelled, rescued, claimed again) the failure no longer applies.
    -- The state is compared with a sub-select, not a literal, so the planner cannot answer it
    -- from the `active` partial index: statistics rarely see active jobs, so the prepared
    -- statement's generic plan would take that index for one row and rescan the whole batch
    -- once per job (500 x 500 comparisons, ten times the write itself). Without it, every job
    -- is looked up by key.
    WHERE j.id = i.id AND j.state = (SELECT 'active'::job_state) AND j.attempt = i.ran_attempt
      -- The worker named holds it (OJS worker protocol §5.6): a release and a new claim can
      -- give the same attempt number to another worker between the read and this write.
      AND (i.worker_id IS NULL OR j.locked_by = i.worker_id)
      -- The same run, not only the same attempt number: a snooze gives its attempt number
      -- back, so a snooze written again after its answer was lost would otherwise apply to
      -- the next claim of the job by the same worker (see `KnownRun::started_at`).
      AND (i.started_us IS NULL OR j.started_at = 'epoch'::timestamptz + i.started_us * interval '1 microsecond')
    RETURNING ",
            $updated,
            "
), ",
            policy_snapshots_sql!("$17"),
            ", recorded AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error_type, error_code,
                              error_message, error_details, delay_ms, next_run_at, policy_id)
    SELECT i.id, i.ran_attempt, i.worker_id, u.started_at, i.outcome, i.error_type, i.error_code,
           i.error_message, i.error_details, i.delay_ms,
           CASE WHEN u.state IN ('retryable', 'available', 'scheduled') THEN u.scheduled_at END,
           p.id
    FROM input i JOIN updated u ON u.id = i.id LEFT JOIN policies p ON p.policy_index = i.policy_index
), woken AS (
    SELECT pg_notify('rebound_jobs', q.queue) FROM (SELECT DISTINCT queue FROM updated WHERE state = 'available') AS q
)
-- Referencing `woken` is what makes Postgres run it (unreferenced SELECT CTEs are skipped).
SELECT ",
            $returning,
            " FROM updated WHERE (SELECT count(*) FROM woken) >= 0"
        )
    };
}

const APPLY: &str = apply_failures_sql!("j.*", "*");
// Only what the rest of the statement reads, so the batch's full rows are never materialised.
const APPLY_IDS: &str = apply_failures_sql!("j.id, j.started_at, j.state, j.scheduled_at, j.queue", "id");

/// What deciding one failure needs to know about its job and run.
struct FailingRun<'a> {
    id: Uuid,
    job_type: &'a str,
    attempt: i32,
    retry: Option<&'a Value>,
    locked_by: Option<&'a str>,
    outcome: &'a Outcome,
    worker_id: Option<&'a str>,
    error_code: Option<&'a str>,
    immediate: bool,
    /// The run's start, to guard the write by (see [`KnownRun::started_at`]): as the worker
    /// that ran it knows it, or as read just before writing ([`start_read`]); `None` only for
    /// a row whose start could not be read as stored.
    started_at: Option<Timestamp>,
}

impl<'a> FailingRun<'a> {
    /// A failure a worker or client reported for a run of a job of `job_type`.
    fn reported(f: &'a Failure, job_type: &'a str, attempt: i32, retry: Option<&'a Value>, locked_by: Option<&'a str>) -> Self {
        FailingRun {
            id: f.id,
            job_type,
            attempt,
            retry,
            locked_by,
            outcome: &f.outcome,
            worker_id: f.worker_id.as_deref(),
            error_code: f.error_code.as_deref(),
            immediate: false,
            started_at: None,
        }
    }
}

impl<'a> From<&'a FailedRun> for FailingRun<'a> {
    fn from(run: &'a FailedRun) -> Self {
        FailingRun {
            id: run.job.id,
            job_type: &run.job.job_type,
            attempt: run.job.attempt,
            retry: run.job.retry.as_ref(),
            locked_by: run.job.locked_by.as_deref(),
            outcome: &run.outcome,
            worker_id: run.worker_id.as_deref(),
            error_code: run.error_code.as_deref(),
            immediate: run.immediate,
            started_at: start_read(run.job.started_at),
        }
    }
}

/// The start to guard a write by, for a job read just before it: the write lands only on the
/// run read, not on a claim of the same attempt number made in between. (A start out of range,
/// read as the extreme it was clamped to, could never match: such a hand-edited row is written
/// unguarded rather than never rescued.)
fn start_read(started_at: Option<Timestamp>) -> Option<Timestamp> {
    started_at.filter(|t| *t != Timestamp::MIN && *t != Timestamp::MAX)
}

/// The decisions for a batch of failures, as the write statement's parameters.
struct DecidedFailures {
    ids: Vec<Uuid>,
    states: Vec<&'static str>,
    delays: Vec<Option<i64>>,
    run_ats: Vec<Option<String>>,
    deltas: Vec<i32>,
    last_errors: Vec<Option<Value>>,
    max_attempts: Vec<i32>,
    dead_letters: Vec<bool>,
    ran_attempts: Vec<i32>,
    workers: Vec<Option<String>>,
    outcomes: Vec<&'static str>,
    error_types: Vec<Option<String>>,
    error_codes: Vec<Option<String>>,
    error_messages: Vec<Option<String>>,
    error_details: Vec<Option<Value>>,
    /// 1-based index into `policy_json` / `policies` for each job.
    policy_index: Vec<i32>,
    /// Microseconds since the epoch.
    started: Vec<Option<i64>>,
    policy_json: Vec<Value>,
    policies: Vec<Arc<RetryPolicy>>,
    decisions: Vec<Decision>,
}

/// Resolves each job's effective policy with the given live layers and decides its next step.
/// Jobs without an override of their own share their type's policy, resolved once per batch.
fn decide_failures<'a>(runs: impl ExactSizeIterator<Item = FailingRun<'a>>, layers: &PolicyLayers) -> DecidedFailures {
    let now = Timestamp::now();
    let mut rng = fastrand::Rng::new();
    let n = runs.len();
    let mut d = DecidedFailures {
        ids: Vec::with_capacity(n),
        states: Vec::with_capacity(n),
        delays: Vec::with_capacity(n),
        run_ats: Vec::with_capacity(n),
        deltas: Vec::with_capacity(n),
        last_errors: Vec::with_capacity(n),
        max_attempts: Vec::with_capacity(n),
        dead_letters: Vec::with_capacity(n),
        ran_attempts: Vec::with_capacity(n),
        workers: Vec::with_capacity(n),
        outcomes: Vec::with_capacity(n),
        error_types: Vec::with_capacity(n),
        error_codes: Vec::with_capacity(n),
        error_messages: Vec::with_capacity(n),
        error_details: Vec::with_capacity(n),
        policy_index: Vec::with_capacity(n),
        started: Vec::with_capacity(n),
        policy_json: Vec::new(),
        policies: Vec::new(),
        decisions: Vec::with_capacity(n),
    };
    for run in runs {
        // The same decision the worker makes for retries in place. Jobs without an override
        // of their own share their type's resolved policy (one `Arc`), sent and stored once.
        let (policy, mut decision) = layers.decide(run.job_type, run.retry, run.attempt, run.outcome, now, &mut rng);
        let index = match d.policies.iter().position(|p| Arc::ptr_eq(p, &policy)) {
            Some(i) => i,
            None => {
                d.policy_json.push(policy.to_json());
                d.policies.push(policy.clone());
                d.policies.len() - 1
            }
        };
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
        d.ids.push(run.id);
        d.states.push(state.as_str());
        d.delays.push(delay);
        d.run_ats.push(run_at);
        d.deltas.push(delta);
        d.last_errors.push(error.map(|e| last_error_json(e, run.error_code, run.attempt, now)));
        d.max_attempts.push(i32::try_from(policy.max_attempts).unwrap_or(i32::MAX));
        d.dead_letters.push(dead_letter);
        d.ran_attempts.push(run.attempt);
        d.workers.push(run.worker_id.or(run.locked_by).map(str::to_string));
        d.outcomes.push(decision.attempt_outcome.as_str());
        d.error_types.push(error.map(|e| e.error_type.clone()));
        d.error_codes.push(run.error_code.map(str::to_string).or_else(|| error.map(|e| e.error_type.clone())));
        d.error_messages.push(error.map(|e| e.message.clone()));
        d.error_details.push(error.and_then(|e| e.details.clone()));
        d.policy_index.push(i32::try_from(index + 1).unwrap_or(i32::MAX));
        d.started.push(run.started_at.map(|t| t.as_microsecond()));
        d.decisions.push(decision);
    }
    d
}

impl DecidedFailures {
    /// The write statement's parameters, in order.
    fn arguments(&self) -> Result<PgArguments, sqlx::Error> {
        let mut args = PgArguments::default();
        self.add_to(&mut args).map_err(sqlx::Error::Encode)?;
        Ok(args)
    }

    fn add_to(&self, args: &mut PgArguments) -> Result<(), sqlx::error::BoxDynError> {
        args.add(&self.ids)?;
        args.add(&self.states)?;
        args.add(&self.delays)?;
        args.add(&self.run_ats)?;
        args.add(&self.deltas)?;
        args.add(&self.last_errors)?;
        args.add(&self.max_attempts)?;
        args.add(&self.dead_letters)?;
        args.add(&self.ran_attempts)?;
        args.add(&self.workers)?;
        args.add(&self.outcomes)?;
        args.add(&self.error_types)?;
        args.add(&self.error_codes)?;
        args.add(&self.error_messages)?;
        args.add(&self.error_details)?;
        args.add(&self.policy_index)?;
        args.add(&self.policy_json)?;
        args.add(&self.started)?;
        Ok(())
    }
}

/// Decides and writes the failures of `runs` in one statement, with the given live policies.
/// Each write is guarded by the job still being active at the attempt that was read, so the
/// caller needs no lock: a job that moved on meanwhile is skipped (absent from the answer).
pub(crate) async fn apply_failures(conn: &mut PgConnection, runs: Vec<FailedRun>, layers: &PolicyLayers) -> Result<Vec<FailureResult>, StoreError> {
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let decided = decide_failures(runs.iter().map(FailingRun::from), layers);
    let rows = sqlx::query_with(APPLY, decided.arguments()?).fetch_all(&mut *conn).await?;
    let mut by_id: HashMap<Uuid, Job> = jobs_from_rows(&rows)?.into_iter().map(|j| (j.id, j)).collect();
    let DecidedFailures { ids, decisions, policy_index, policies, .. } = decided;
    Ok(ids
        .iter()
        .zip(decisions)
        .zip(policy_index)
        .filter_map(|((id, decision), index)| {
            let policy = RetryPolicy::clone(policies.get(usize::try_from(index).ok()?.checked_sub(1)?)?);
            by_id.remove(id).map(|job| FailureResult { job, decision, policy })
        })
        .collect())
}

/// The `last_error` mirror, in the OJS error shape.
pub(crate) fn last_error_json(e: &HandlerError, code: Option<&str>, attempt: i32, now: Timestamp) -> Value {
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
    /// Records one failed execution of an active job (OJS nack). Not active, or held by
    /// another worker than the one named, is a conflict.
    pub async fn fail(&self, failure: &Failure) -> Result<FailureResult, StoreError> {
        self.fail_run(failure, None).await
    }

    /// Like [`Store::fail`], for a caller that also names when the run it reports started
    /// (see [`NamedRun`]): a job claimed again since, even at the same attempt number, is a
    /// conflict rather than charged with another run's failure.
    pub async fn fail_run(&self, failure: &Failure, started_at: Option<Timestamp>) -> Result<FailureResult, StoreError> {
        let mut out = self.fail_batch_at(std::slice::from_ref(failure), &[started_at]).await?;
        match out.pop() {
            Some(r) => Ok(r),
            None => {
                let run = NamedRun { attempt: failure.attempt, started_at };
                Err(self.refusal(failure.id, "fail", failure.worker_id.as_deref(), run).await)
            }
        }
    }

    /// Records many failures in one transaction. Failures of jobs that are no longer active
    /// at that attempt, or that name another worker than the one holding the job, are skipped
    /// and absent from the answer.
    pub async fn fail_batch(&self, failures: &[Failure]) -> Result<Vec<FailureResult>, StoreError> {
        self.fail_batch_at(failures, &[]).await
    }

    /// [`Store::fail_batch`], each failure at index `i` also guarded by the start `started[i]`
    /// names, where there is one.
    async fn fail_batch_at(&self, failures: &[Failure], started: &[Option<Timestamp>]) -> Result<Vec<FailureResult>, StoreError> {
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
        let mut locked: HashMap<Uuid, Job> = jobs_from_rows(&rows)?.into_iter().map(|j| (j.id, j)).collect();
        let runs: Vec<FailedRun> = failures
            .iter()
            .enumerate()
            .filter_map(|(i, f)| {
                let job = locked.remove(&f.id)?;
                let named = NamedRun { attempt: f.attempt, started_at: started.get(i).copied().flatten() };
                if !named.matches(job.attempt, job.started_at) {
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

    /// Like [`Store::fail_batch`], for a caller that only needs to know which failures were
    /// recorded: reads only what deciding needs, and answers with the ids of the jobs written
    /// rather than every updated row (the worker, which knows its jobs, uses
    /// [`Store::fail_batch_known`] and skips the read). Failures of jobs that are no
    /// longer active at that attempt are skipped and absent from the answer.
    pub async fn fail_batch_ids(&self, failures: &[Failure]) -> Result<Vec<Uuid>, StoreError> {
        if failures.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = failures.iter().map(|f| f.id).collect();
        let mut conn = self.pool.acquire().await?;
        let mut policy_conn = self.pool.acquire().await?;
        let (rows, layers) = tokio::join!(
            sqlx::query("SELECT id, type, attempt, retry, locked_by, started_at FROM jobs WHERE id = ANY($1) AND state = 'active'")
                .bind(&ids)
                .fetch_all(&mut *conn),
            PolicyLayers::load_for_jobs(&mut policy_conn, &ids),
        );
        drop(policy_conn);
        let (rows, layers) = (rows?, layers?);
        let mut active: HashMap<Uuid, ActiveRun> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let run = ActiveRun {
                job_type: row.try_get("type")?,
                attempt: row.try_get("attempt")?,
                retry: row.try_get("retry")?,
                locked_by: row.try_get("locked_by")?,
                started_at: super::ts_opt(row, "started_at")?,
            };
            active.insert(row.try_get("id")?, run);
        }
        // One failure per job: a second one for the same attempt would record it twice.
        let mut taken: HashSet<Uuid> = HashSet::with_capacity(failures.len());
        let runs: Vec<FailingRun> = failures
            .iter()
            .filter_map(|f| {
                let run = active.get(&f.id)?;
                if f.attempt.is_some_and(|a| a != run.attempt) || !taken.insert(f.id) {
                    return None;
                }
                Some(FailingRun { started_at: start_read(run.started_at), ..FailingRun::reported(f, &run.job_type, run.attempt, run.retry.as_ref(), run.locked_by.as_deref()) })
            })
            .collect();
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let decided = decide_failures(runs.into_iter(), &layers);
        Ok(sqlx::query_scalar_with(APPLY_IDS, decided.arguments()?).fetch_all(&mut *conn).await?)
    }

    /// Like [`Store::fail_batch_ids`], for the worker that ran the jobs and so already knows
    /// what deciding needs of them ([`KnownRun`]): only the live policies are read, then one
    /// statement writes. The write is guarded like every failure (still `active`, at the
    /// attempt that ran), so a job that moved on meanwhile is skipped, never overwritten.
    /// Each failure must name its attempt; one that does not is skipped.
    pub async fn fail_batch_known(&self, failures: &[(Failure, KnownRun)]) -> Result<Vec<Uuid>, StoreError> {
        let mut taken: HashSet<Uuid> = HashSet::with_capacity(failures.len());
        let runs: Vec<FailingRun> = failures
            .iter()
            .filter_map(|(f, known)| {
                let attempt = f.attempt?;
                if !taken.insert(f.id) {
                    return None;
                }
                Some(FailingRun { started_at: known.started_at, ..FailingRun::reported(f, &known.job_type, attempt, known.retry.as_ref(), f.worker_id.as_deref()) })
            })
            .collect();
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let mut types: Vec<String> = runs.iter().map(|r| r.job_type.to_string()).collect();
        types.sort();
        types.dedup();
        let mut conn = self.pool.acquire().await?;
        let layers = PolicyLayers::load(&mut conn, &types).await?;
        let decided = decide_failures(runs.into_iter(), &layers);
        Ok(sqlx::query_scalar_with(APPLY_IDS, decided.arguments()?).fetch_all(&mut *conn).await?)
    }
}

/// What the worker that ran a job knows of it from its claim, which is all that deciding its
/// failure needs besides the live policies (see [`Store::fail_batch_known`]).
#[derive(Clone, Debug, PartialEq)]
pub struct KnownRun {
    pub job_type: String,
    /// The job's own retry override, as claimed.
    pub retry: Option<Value>,
    /// When the run started, as the database stores it (set by the claim, moved on by each
    /// write of failures retried in place). The failure is written only if the job still
    /// stands at this run: a snooze gives its attempt number back, so the attempt alone
    /// cannot tell this run from the next claim of the same job.
    pub started_at: Option<Timestamp>,
}

/// What [`Store::fail_batch_ids`] reads of an active job.
struct ActiveRun {
    job_type: String,
    attempt: i32,
    retry: Option<Value>,
    locked_by: Option<String>,
    started_at: Option<Timestamp>,
}
