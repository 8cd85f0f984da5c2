//! Recording failures that the worker holding the job retried at once, in place.
//!
//! When the live policy retries a failure with no backoff, sending the job back through the
//! queue buys nothing: it would become `available` and be claimed again at once, by any
//! worker. The worker that holds it runs it again instead, under the same lock, and reports
//! the failed executions together with how the next one stands: still running (the job
//! stays `active` at its new attempt, its lock renewed) or completed. One statement writes
//! the job and an attempt row per failure, guarded like every result by the attempt stored.

use std::sync::Arc;

use jiff::Timestamp;
use serde_json::Value;
use sqlx::Arguments;
use sqlx::postgres::PgArguments;
use uuid::Uuid;

use super::fail::last_error_json;
use super::{Store, StoreError};
use crate::outcome::{AttemptOutcome, HandlerError};
use crate::policy::RetryPolicy;

/// One failed execution that was retried in place.
#[derive(Clone, Debug, PartialEq)]
pub struct RetriedInPlace {
    pub attempt: i32,
    pub error: HandlerError,
    /// The effective policy that retried it at once; kept with the attempt as every failure's is.
    pub policy: Arc<RetryPolicy>,
    /// On the database's clock, like every other time of a job: the worker counts from the
    /// claim's timestamp with its own monotonic clock rather than reading its wall clock.
    pub started_at: Timestamp,
    pub finished_at: Timestamp,
}

/// How the execution after the retried ones stands.
#[derive(Clone, Debug, PartialEq)]
pub enum InPlaceEnd {
    /// Still running: the job stays `active` at its new attempt and its lock is renewed.
    Running,
    /// Completed, with this result.
    Completed(Option<Value>),
}

/// A job retried in place by the worker holding it.
#[derive(Clone, Debug, PartialEq)]
pub struct InPlaceRun {
    pub id: Uuid,
    /// The job's attempt as stored (claimed, or last written): the write is refused otherwise.
    pub stored_attempt: i32,
    /// When the stored run started (set by the claim, or by the last write of this kind): with
    /// `stored_attempt`, the run the write is guarded by. Attempt numbers alone repeat (a
    /// snooze or a release gives one back). `None` guards by the attempt alone.
    pub stored_started_at: Option<Timestamp>,
    pub worker_id: String,
    /// The failed executions, oldest first, from `stored_attempt` on. Not empty.
    pub retried: Vec<RetriedInPlace>,
    /// When the execution after the last failed one started.
    pub started_at: Timestamp,
    pub end: InPlaceEnd,
}

impl InPlaceRun {
    /// The attempt of the execution after the retried ones: the job's attempt once written.
    pub fn current_attempt(&self) -> i32 {
        self.stored_attempt + i32::try_from(self.retried.len()).unwrap_or(i32::MAX)
    }
}

const RECORD: &str = concat!(
    "
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::int4[], $3::int4[], $4::text[], $5::int8[], $6::bool[], $7::jsonb[],
                         $8::jsonb[], $9::int4[], $20::int8[])
        AS t(id, stored_attempt, new_attempt, worker_id, started_at, completed, result, last_error, max_attempts, stored_started)
), updated AS (
    UPDATE jobs j
    -- Times come as microseconds since the epoch (on the database's clock: see RetriedInPlace).
    SET attempt = i.new_attempt, started_at = 'epoch'::timestamptz + i.started_at * interval '1 microsecond',
        max_attempts = i.max_attempts,
        state = CASE WHEN i.completed THEN 'completed' ELSE 'active' END::job_state,
        completed_at = CASE WHEN i.completed THEN now() END,
        result = CASE WHEN i.completed THEN i.result END,
        last_error = CASE WHEN i.completed THEN NULL ELSE i.last_error END,
        retry_delay_ms = 0,
        locked_by = i.worker_id,
        lock_expires_at = CASE WHEN i.completed THEN NULL
                               ELSE now() + LEAST(COALESCE(j.visibility_timeout_ms, 30000), 604800000) * interval '1 millisecond' END,
        updated_at = now()
    FROM input i
    -- Looked up by key whatever the statistics say (see the same guard in fail.rs).
    WHERE j.id = i.id AND j.state = (SELECT 'active'::job_state) AND j.attempt = i.stored_attempt
      AND (i.stored_started IS NULL OR j.started_at = 'epoch'::timestamptz + i.stored_started * interval '1 microsecond')
    RETURNING j.id, j.queue
), retried AS (
    SELECT * FROM unnest($10::uuid[], $11::int4[], $12::int8[], $13::int8[], $14::text[], $15::text[],
                         $16::jsonb[], $17::int4[])
        AS t(job_id, attempt, started_at, finished_at, error_type, error_message, error_details, policy_index)
), ",
    policy_snapshots_sql!("$18"),
    ", recorded AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, finished_at, outcome, error_type, error_code,
                              error_message, error_details, delay_ms, next_run_at, policy_id)
    SELECT r.job_id, r.attempt, i.worker_id,
           'epoch'::timestamptz + r.started_at * interval '1 microsecond',
           'epoch'::timestamptz + r.finished_at * interval '1 microsecond',
           $19, r.error_type, r.error_type, r.error_message, r.error_details, 0,
           'epoch'::timestamptz + r.finished_at * interval '1 microsecond', p.id
    FROM retried r JOIN updated u ON u.id = r.job_id JOIN input i ON i.id = r.job_id
    LEFT JOIN policies p ON p.policy_index = r.policy_index
    -- History is read in row order: number the rows in attempt order.
    ORDER BY r.job_id, r.attempt
), started AS (
    -- The executions started in place (every one after the stored attempt's) go into the
    -- events' log of starts, which claims write (`job.started`), each at its own start.
    INSERT INTO job_transitions (at, queue, state, job_ids, attempts, worker_id)
    SELECT 'epoch'::timestamptz + s.started_at * interval '1 microsecond', u.queue, 'active', ARRAY[s.job_id], ARRAY[s.attempt], i.worker_id
    FROM (SELECT job_id, attempt, started_at FROM retried UNION ALL SELECT id, new_attempt, started_at FROM input) s
    JOIN updated u ON u.id = s.job_id JOIN input i ON i.id = s.job_id
    WHERE s.attempt > i.stored_attempt
)
SELECT id FROM updated
UNION ALL
-- Written by an earlier try whose answer was lost with the connection: the job already stands
-- at its new attempt under this worker's lock, so the write is done, not refused (refused, the
-- worker would stop the execution that is running). This reads the statement's snapshot, from
-- before `updated`.
SELECT j.id FROM jobs j JOIN input i ON i.id = j.id
WHERE NOT i.completed AND j.state = 'active' AND j.attempt = i.new_attempt AND j.locked_by = i.worker_id
  AND j.started_at = 'epoch'::timestamptz + i.started_at * interval '1 microsecond'"
);

impl Store {
    /// Records jobs retried in place by the worker holding them (see the module docs). Returns
    /// the ids written; a job whose stored attempt moved on meanwhile (cancelled, rescued) is
    /// left alone and absent from the answer, and so are its failures.
    pub async fn record_in_place(&self, runs: &[&InPlaceRun]) -> Result<Vec<Uuid>, StoreError> {
        let runs: Vec<&InPlaceRun> = runs.iter().copied().filter(|r| !r.retried.is_empty()).collect();
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        // A batch holds a few distinct policies: each is sent (and stored) once.
        let mut policies: Vec<&Arc<RetryPolicy>> = Vec::new();
        let mut policy_json: Vec<Value> = Vec::new();
        let n = runs.len();
        let (mut ids, mut stored, mut new_attempts, mut workers, mut started) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        let mut stored_started: Vec<Option<i64>> = Vec::with_capacity(n);
        let (mut completed, mut results, mut last_errors, mut max_attempts) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut r_ids, mut r_attempts, mut r_started, mut r_finished) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut r_types, mut r_messages, mut r_details, mut r_policies) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for run in &runs {
            let Some(last) = run.retried.last() else { continue };
            ids.push(run.id);
            stored.push(run.stored_attempt);
            stored_started.push(run.stored_started_at.map(|t| t.as_microsecond()));
            new_attempts.push(run.current_attempt());
            workers.push(run.worker_id.as_str());
            started.push(run.started_at.as_microsecond());
            let result = match &run.end {
                InPlaceEnd::Running => None,
                InPlaceEnd::Completed(result) => Some(result.clone()),
            };
            // A completed job keeps no last error (as any completion); a running one shows its last.
            last_errors.push(result.is_none().then(|| last_error_json(&last.error, None, last.attempt, last.finished_at)));
            completed.push(result.is_some());
            results.push(result.flatten());
            max_attempts.push(i32::try_from(last.policy.max_attempts).unwrap_or(i32::MAX));
            for r in &run.retried {
                r_ids.push(run.id);
                r_attempts.push(r.attempt);
                r_started.push(r.started_at.as_microsecond());
                r_finished.push(r.finished_at.as_microsecond());
                r_types.push(r.error.error_type.as_str());
                r_messages.push(r.error.message.as_str());
                r_details.push(r.error.details.clone());
                let at = match policies.iter().position(|known| Arc::ptr_eq(known, &r.policy) || **known == r.policy) {
                    Some(at) => at,
                    None => {
                        policy_json.push(r.policy.to_json());
                        policies.push(&r.policy);
                        policies.len() - 1
                    }
                };
                r_policies.push(i32::try_from(at + 1).unwrap_or(i32::MAX));
            }
        }
        let mut args = PgArguments::default();
        let mut add = || -> Result<(), sqlx::error::BoxDynError> {
            args.add(&ids)?;
            args.add(&stored)?;
            args.add(&new_attempts)?;
            args.add(&workers)?;
            args.add(&started)?;
            args.add(&completed)?;
            args.add(&results)?;
            args.add(&last_errors)?;
            args.add(&max_attempts)?;
            args.add(&r_ids)?;
            args.add(&r_attempts)?;
            args.add(&r_started)?;
            args.add(&r_finished)?;
            args.add(&r_types)?;
            args.add(&r_messages)?;
            args.add(&r_details)?;
            args.add(&r_policies)?;
            args.add(&policy_json)?;
            args.add(AttemptOutcome::Retried.as_str())?;
            args.add(&stored_started)?;
            Ok(())
        };
        add().map_err(sqlx::Error::Encode)?;
        Ok(sqlx::query_scalar_with(RECORD, args).fetch_all(&self.pool).await?)
    }
}
