//! Completing jobs (singly, or in batches for the worker's completer) and releasing them
//! back without counting the attempt.

use jiff::Timestamp;
use serde_json::Value;
use uuid::Uuid;

use super::{NamedRun, Store, StoreError, jobs_from_rows};
use crate::job::Job;

/// A finished execution to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub id: Uuid,
    /// The attempt the caller ran. When set, a completion for an older attempt (the job was
    /// rescued and claimed again meanwhile) is refused instead of completing someone else's run.
    pub attempt: Option<i32>,
    pub worker_id: Option<String>,
    /// When the run being completed started, as its claim (or its last write) stored it. When
    /// set, the completion is refused unless the job still stands at that run: attempt numbers
    /// repeat (a snooze or a release gives one back), so a result written again after its first
    /// write's answer was lost could otherwise land on the next claim of the same attempt.
    pub started_at: Option<Timestamp>,
    pub result: Option<Value>,
}

// A successful execution is not a `job_attempts` row: the job row already holds all of it
// (attempt, started_at, completed_at, and locked_by, kept as the worker that ran it), so
// completing is one row update, as in the raw-SQL ceiling. Failed executions, which carry
// errors and the policy that judged them, keep their rows; `job_history` joins the two.
macro_rules! complete_sql {
    ($returning:literal) => {
        concat!(
            "
UPDATE jobs j
SET state = 'completed', completed_at = now(), result = i.result, last_error = NULL,
    locked_by = COALESCE(i.worker_id, j.locked_by), lock_expires_at = NULL, updated_at = now()
FROM unnest($1::uuid[], $2::int4[], $3::text[], $4::jsonb[], $5::int8[]) AS i(id, attempt, worker_id, result, started_us)
-- A sub-select rather than a literal, so the plan never rests on the statistics' idea of how
-- many jobs are active (see the same guard in fail.rs): each job is looked up by key.
WHERE j.id = i.id AND j.state = (SELECT 'active'::job_state) AND (i.attempt IS NULL OR j.attempt = i.attempt)
  -- A worker that names itself completes only what it holds (OJS worker protocol §5.6).
  AND (i.worker_id IS NULL OR j.locked_by = i.worker_id)
  -- The same run, not only the same attempt number (see `Completion::started_at`).
  AND (i.started_us IS NULL OR j.started_at = 'epoch'::timestamptz + i.started_us * interval '1 microsecond')
RETURNING ",
            $returning
        )
    };
}

const COMPLETE: &str = complete_sql!("j.*");

// The CTEs `released`, `recorded` and `woken`: hand the active jobs `$selection` picks back to
// `available`, uncounted (the attempt number goes back; a `released` row with the reason
// `$reason` says the execution did not count), and notify the queues that have work again.
// `released` returns `$returning` plus `attempt_worker`; the statement must reference `woken`
// (unreferenced SELECT CTEs are not run).
macro_rules! release_ctes {
    ($selection:literal, $reason:literal, $returning:literal) => {
        concat!(
            "released AS (
    UPDATE jobs j
    SET state = 'available', attempt = GREATEST(j.attempt - 1, 0), locked_by = NULL, lock_expires_at = NULL,
        enqueued_at = now(), scheduled_at = now(), updated_at = now()
    -- The job as it was, for the worker that held it.
    FROM jobs o
    WHERE o.id = j.id AND j.state = 'active' AND ",
            $selection,
            "
    RETURNING ",
            $returning,
            ", o.locked_by AS attempt_worker
), recorded AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error_message)
    SELECT id, attempt + 1, attempt_worker, started_at, 'released', ",
            $reason,
            " FROM released
), woken AS (
    SELECT pg_notify('rebound_jobs', q.queue) FROM (SELECT DISTINCT queue FROM released) AS q
)"
        )
    };
}
pub(crate) use release_ctes;

macro_rules! release_sql {
    ($selection:literal) => {
        concat!("WITH ", release_ctes!($selection, "$3", "j.*"), " SELECT * FROM released WHERE (SELECT count(*) FROM woken) >= 0")
    };
}
pub(crate) use release_sql;

/// Why [`Store::release_orphans`] handed a job back, as its `released` row says.
pub const ORPHAN_REASON: &str = "claimed while the connection to the database was lost, so the worker never received it; the attempt is not counted";
// The worker's completer only needs to know which results were taken: returning the ids alone
// spares Postgres sending, and the worker decoding, every full row of every batch.
const COMPLETE_IDS: &str = complete_sql!("j.id");

impl Store {
    /// Completes one active job (OJS ack). A job that is not active, or is held by another
    /// worker than the one named, is a conflict.
    pub async fn complete(&self, c: &Completion) -> Result<Job, StoreError> {
        let jobs = self.complete_rows(std::slice::from_ref(c)).await?;
        match jobs.into_iter().next() {
            Some(job) => Ok(job),
            None => Err(self.refusal(c.id, "complete", c.worker_id.as_deref(), NamedRun { attempt: c.attempt, started_at: c.started_at }).await),
        }
    }

    /// Completes many jobs in one statement. Returns the ids completed; the others were no
    /// longer active at that attempt (rescued, cancelled), or were held by another worker than
    /// the one named, and are left alone.
    pub async fn complete_batch(&self, items: &[Completion]) -> Result<Vec<Uuid>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let c = CompletionColumns::of(items);
        Ok(sqlx::query_scalar(COMPLETE_IDS)
            .bind(&c.ids)
            .bind(&c.attempts)
            .bind(&c.workers)
            .bind(&c.results)
            .bind(&c.started)
            .fetch_all(&self.pool)
            .await?)
    }

    async fn complete_rows(&self, items: &[Completion]) -> Result<Vec<Job>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let c = CompletionColumns::of(items);
        let rows = sqlx::query(COMPLETE)
            .bind(&c.ids)
            .bind(&c.attempts)
            .bind(&c.workers)
            .bind(&c.results)
            .bind(&c.started)
            .fetch_all(&self.pool)
            .await?;
        jobs_from_rows(&rows)
    }

    /// Hands active jobs back to `available` without counting the attempt (a worker shutting
    /// down, a fetch whose caller left). Each job goes back only if it still stands at the run
    /// named beside it (see [`NamedRun`]): sent again after its first answer was lost, the
    /// release must not hand back the next claim of the same job, which reuses the attempt
    /// number it gave back. Returns the jobs released.
    pub async fn release(&self, runs: &[(Uuid, NamedRun)], worker_id: Option<&str>, reason: &str) -> Result<Vec<Job>, StoreError> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = runs.iter().map(|(id, _)| *id).collect();
        let attempts: Vec<Option<i32>> = runs.iter().map(|(_, run)| run.attempt).collect();
        let started: Vec<Option<i64>> = runs.iter().map(|(_, run)| run.started_us()).collect();
        let rows = sqlx::query(release_sql!(
            "j.id = ANY($1) AND ($2::text IS NULL OR j.locked_by = $2)
       AND EXISTS (SELECT 1 FROM unnest($1::uuid[], $4::int4[], $5::int8[]) AS r(id, attempt, started_us)
                   WHERE r.id = j.id AND (r.attempt IS NULL OR j.attempt = r.attempt)
                     AND (r.started_us IS NULL OR j.started_at = 'epoch'::timestamptz + r.started_us * interval '1 microsecond'))"
        ))
        .bind(&ids)
        .bind(worker_id)
        .bind(reason)
        .bind(&attempts)
        .bind(&started)
        .fetch_all(&self.pool)
        .await?;
        jobs_from_rows(&rows)
    }

    /// Hands back, without counting the attempt, every job still active under `worker_id`
    /// that is not in `known`: the worker holds everything it runs, so a job it does not know
    /// is one whose claim committed while the answer was lost with the connection. It never
    /// started, so it costs nothing. Jobs claimed by a claim still in flight must be in
    /// `known` (or the caller must have no claim in flight). Only jobs claimed since the worker
    /// last registered are its own: a process that reuses a configured id after its
    /// predecessor crashed must not hand back, uncounted, the jobs that predecessor was
    /// running (they did start, and one that crashed its worker would never be charged).
    /// Returns the jobs handed back.
    pub async fn release_orphans(&self, worker_id: &str, known: &[Uuid]) -> Result<Vec<Job>, StoreError> {
        let rows = sqlx::query(release_sql!(
            "j.locked_by = $2 AND NOT (j.id = ANY($1))
       AND j.started_at >= COALESCE((SELECT w.started_at FROM workers w WHERE w.id = $2), '-infinity')"
        ))
        .bind(known)
        .bind(worker_id)
        .bind(ORPHAN_REASON)
        .fetch_all(&self.pool)
        .await?;
        jobs_from_rows(&rows)
    }

    /// Which of `ids` are active and locked under `worker_id` now (a worker's check of the
    /// runs it abandoned: the others have been rescued).
    pub async fn jobs_locked_by(&self, worker_id: &str, ids: &[Uuid]) -> Result<Vec<Uuid>, StoreError> {
        Ok(sqlx::query_scalar("SELECT id FROM jobs WHERE id = ANY($1) AND state = 'active' AND locked_by = $2")
            .bind(ids)
            .bind(worker_id)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Releases one job (an OJS nack with `requeue: true`); not active, not this worker's,
    /// or no longer at the run named, is a conflict.
    pub async fn release_one(&self, id: Uuid, worker_id: Option<&str>, run: NamedRun, reason: &str) -> Result<Job, StoreError> {
        let rows = sqlx::query(release_sql!(
            "j.id = $1 AND ($2::text IS NULL OR j.locked_by = $2) AND ($4::int4 IS NULL OR j.attempt = $4)
       AND ($5::int8 IS NULL OR j.started_at = 'epoch'::timestamptz + $5 * interval '1 microsecond')"
        ))
        .bind(id)
        .bind(worker_id)
        .bind(reason)
        .bind(run.attempt)
        .bind(run.started_us())
        .fetch_all(&self.pool)
        .await?;
        match jobs_from_rows(&rows)?.into_iter().next() {
            Some(job) => Ok(job),
            None => Err(self.refusal(id, "release", worker_id, run).await),
        }
    }
}

/// The completions as the statements' array parameters.
struct CompletionColumns<'a> {
    ids: Vec<Uuid>,
    attempts: Vec<Option<i32>>,
    workers: Vec<Option<&'a str>>,
    results: Vec<Option<&'a Value>>,
    /// Microseconds since the epoch, as the in-place write sends times.
    started: Vec<Option<i64>>,
}

impl<'a> CompletionColumns<'a> {
    fn of(items: &'a [Completion]) -> Self {
        CompletionColumns {
            ids: items.iter().map(|c| c.id).collect(),
            attempts: items.iter().map(|c| c.attempt).collect(),
            workers: items.iter().map(|c| c.worker_id.as_deref()).collect(),
            results: items.iter().map(|c| c.result.as_ref()).collect(),
            started: items.iter().map(|c| c.started_at.map(|t| t.as_microsecond())).collect(),
        }
    }
}
