//! Operator actions of the OJS admin API that the dashboard's store functions do not cover:
//! retrying finished jobs, deleting finished jobs, purging a queue, dead-letter statistics,
//! and asking workers to go quiet or forgetting stale ones.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::json;
use sqlx::Row;
use uuid::Uuid;

use super::audit::{Actor, record};
use super::cancel::{BULK_LIMIT, JobSelection};
use super::listing::JobFilter;
use super::notify::notify_queues;
use super::{Store, StoreError, millis, ts_opt};
use crate::job::JobState;

/// What a bulk action did to the jobs a filter matched.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BulkReport {
    /// Jobs the selection matched (at most [`BULK_LIMIT`]).
    pub matched: u64,
    /// Jobs the action applied to.
    pub succeeded: u64,
    /// Jobs it could not apply to, with why (the first 100).
    pub refused: Vec<(Uuid, String)>,
}

/// Dead letters at a glance.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DeadLetterStats {
    pub total: i64,
    pub by_queue: BTreeMap<String, i64>,
    pub by_error_type: BTreeMap<String, i64>,
    pub oldest_at: Option<Timestamp>,
    pub newest_at: Option<Timestamp>,
}

/// Which jobs a bulk action on finished jobs may touch.
#[derive(Clone, Copy)]
struct Eligible {
    states: &'static [JobState],
    /// Whether workflow jobs that cannot run on their own qualify too.
    workflow_held: bool,
}

impl Store {
    /// Makes finished jobs that did not succeed (`discarded`, dead letters included, and
    /// `cancelled`) run again with a fresh attempt budget. Jobs in other states are reported
    /// as refused, and so are the workflow jobs that cannot run on their own: one cancelled
    /// before it ever ran (a graph's step skipped because one it depends on failed, a chain's
    /// later steps, a batch callback that did not apply, any job of a cancelled workflow, or one
    /// an operator cancelled before it started: it would run out of its order, without what it
    /// is owed), and the job standing for a nested workflow (nothing runs it). Audited.
    pub async fn retry_finished_jobs(&self, sel: &JobSelection, actor: &Actor) -> Result<BulkReport, StoreError> {
        self.bulk_on_finished(
            sel,
            actor,
            "job.bulk_retry",
            Eligible { states: &[JobState::Discarded, JobState::Cancelled], workflow_held: false },
            "UPDATE jobs SET state = 'available', attempt = 0, scheduled_at = now(), enqueued_at = now(),
                             dead_letter = false, dead_lettered_at = NULL, error_signature = NULL, discarded_at = NULL, cancelled_at = NULL,
                             completed_at = NULL, locked_by = NULL, lock_expires_at = NULL, updated_at = now(),
                             -- The operator asked for it to run: it waits for its key's limit
                             -- rather than be dropped or rescheduled again by this statement.
                             rate_limit_on_limit = NULL
             WHERE id = ANY($1) AND state IN ('discarded', 'cancelled')
             RETURNING queue",
        )
        .await
    }

    /// Deletes finished jobs (completed, cancelled, discarded) with their history; others are
    /// reported as refused. Audited.
    pub async fn delete_finished_jobs(&self, sel: &JobSelection, actor: &Actor) -> Result<BulkReport, StoreError> {
        self.bulk_on_finished(
            sel,
            actor,
            "job.bulk_delete",
            Eligible { states: &[JobState::Completed, JobState::Cancelled, JobState::Discarded], workflow_held: true },
            delete_with_history!(
                "SELECT id FROM jobs WHERE id = ANY($1) AND state IN ('completed', 'cancelled', 'discarded')",
                "state IN ('completed', 'cancelled', 'discarded')",
                "'deleted'",
                "$2"
            ),
        )
        .await
    }

    /// Cancels every unfinished job in the selection (active ones too, as
    /// [`Store::cancel_jobs`] does), reporting the finished ones it matched as refused, each
    /// with its state, so that an answer's failures can be named. The unfinished jobs are
    /// taken first, up to [`BULK_LIMIT`], so that finished ones never crowd them out of a
    /// call; the finished ones fill what is left of the limit. Audited as `job.bulk_cancel`.
    pub async fn cancel_unfinished_jobs(&self, sel: &JobSelection, actor: &Actor) -> Result<BulkReport, StoreError> {
        self.cancel_selected(sel, actor, true).await
    }

    /// Cancels the selection's unfinished jobs; with `name_refused`, also reads which finished
    /// ones it matched, to name them (a caller that only counts is spared that read).
    pub(crate) async fn cancel_selected(&self, sel: &JobSelection, actor: &Actor, name_refused: bool) -> Result<BulkReport, StoreError> {
        let mut tx = self.begin().await?;
        let ids: Vec<Uuid> = sel.select_ids("j.state NOT IN ('completed', 'cancelled', 'discarded')", BULK_LIMIT).build_query_scalar().fetch_all(&mut *tx).await?;
        // The finished ones are read before the cancel, which would make its own jobs finished,
        // and without locks: they are only reported, and locking them would hold up the pruner.
        let room = BULK_LIMIT - i64::try_from(ids.len()).unwrap_or(BULK_LIMIT);
        let finished: Vec<Uuid> = if name_refused && room > 0 {
            sel.select_ids_unlocked("j.state IN ('completed', 'cancelled', 'discarded')", room).build_query_scalar().fetch_all(&mut *tx).await?
        } else {
            Vec::new()
        };
        let succeeded = sqlx::query(
            "UPDATE jobs SET state = 'cancelled', cancelled_at = now(), locked_by = NULL, lock_expires_at = NULL, updated_at = now()
             WHERE id = ANY($1) AND state NOT IN ('completed', 'cancelled', 'discarded')",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let refused: Vec<(Uuid, JobState)> = sqlx::query_as("SELECT id, state FROM jobs WHERE id = ANY($1) ORDER BY id LIMIT 100")
            .bind(&finished)
            .fetch_all(&mut *tx)
            .await?;
        let mut details = sel.describe();
        if let Some(o) = details.as_object_mut() {
            o.insert("affected".into(), json!(succeeded));
            if name_refused {
                o.insert("refused".into(), json!(finished.len()));
            }
        }
        record(&mut tx, actor, "job.bulk_cancel", None, details).await?;
        tx.commit().await?;
        Ok(BulkReport {
            matched: (ids.len() + finished.len()) as u64,
            succeeded,
            refused: refused.into_iter().map(|(id, s)| (id, format!("job is {s}; a finished job cannot be cancelled"))).collect(),
        })
    }

    async fn bulk_on_finished(&self, sel: &JobSelection, actor: &Actor, action: &str, eligible: Eligible, apply: &'static str) -> Result<BulkReport, StoreError> {
        let mut tx = self.begin().await?;
        let mut qb = sel.select_ids_unlocked("true", BULK_LIMIT);
        let matched: Vec<Uuid> = qb.build_query_scalar().fetch_all(&mut *tx).await?;
        // Only the rows the action may change are locked (in id order, as everything that
        // waits for rows takes them): the others, running or waiting jobs that are only
        // reported as refused, are read as they are, not held away from their workers.
        let eligible_states: Vec<&str> = eligible.states.iter().map(|s| s.as_str()).collect();
        let states: Vec<(Uuid, JobState, bool)> = sqlx::query_as(
            "SELECT id, state,
                    COALESCE(last_error->>'type' = 'rebound.upstream_failed', false)
                    -- Cancelled by its workflow (or with it) before it ever ran: a chain's later
                    -- steps, a batch's callbacks that did not apply. Run alone, it would run
                    -- out of its order, without the results it is owed.
                    OR (state = 'cancelled' AND workflow_id IS NOT NULL AND started_at IS NULL)
                    OR EXISTS (SELECT 1 FROM workflows c WHERE c.parent_job = jobs.id) AS held
             FROM jobs WHERE id = ANY($1) AND state::text = ANY($2) ORDER BY id FOR UPDATE OF jobs",
        )
        .bind(&matched)
        .bind(&eligible_states)
        .fetch_all(&mut *tx)
        .await?;
        let locked: std::collections::HashSet<Uuid> = states.iter().map(|(id, _, _)| *id).collect();
        let others: Vec<Uuid> = matched.iter().copied().filter(|id| !locked.contains(id)).collect();
        let mut states = states;
        states.extend(
            sqlx::query_as::<_, (Uuid, JobState, bool)>("SELECT id, state, false FROM jobs WHERE id = ANY($1)").bind(&others).fetch_all(&mut *tx).await?,
        );
        let (ok, refused): (Vec<_>, Vec<_>) =
            states.into_iter().partition(|(id, s, held)| locked.contains(id) && eligible.states.contains(s) && (eligible.workflow_held || !held));
        let ids: Vec<Uuid> = ok.iter().map(|(id, _, _)| *id).collect();
        let succeeded = if apply.starts_with("WITH gone") {
            // A deletion logs its dead letters by who deleted them (see delete_with_history).
            sqlx::query_scalar::<_, i64>(apply).bind(&ids).bind(&actor.name).fetch_one(&mut *tx).await? as u64
        } else {
            let mut queues: Vec<String> = sqlx::query_scalar(apply).bind(&ids).fetch_all(&mut *tx).await?;
            let n = queues.len() as u64;
            queues.sort();
            queues.dedup();
            notify_queues(&mut *tx, &queues).await?;
            n
        };
        let mut details = sel.describe();
        if let Some(o) = details.as_object_mut() {
            o.insert("affected".into(), json!(succeeded));
            o.insert("refused".into(), json!(refused.len()));
        }
        record(&mut tx, actor, action, None, details).await?;
        tx.commit().await?;
        let allowed: Vec<&str> = eligible.states.iter().map(|s| s.as_str()).collect();
        Ok(BulkReport {
            matched: matched.len() as u64,
            succeeded,
            refused: refused
                .into_iter()
                .take(100)
                .map(|(id, s, held)| match held && eligible.states.contains(&s) {
                    true => (id, "job belongs to a workflow that decides when it runs (a step or callback it cancelled before it ran, or the job standing for a nested workflow)".to_string()),
                    false => (id, format!("job is {s}; only {} jobs qualify", allowed.join(" or "))),
                })
                .collect(),
        })
    }

    /// Deletes a queue's jobs in `states` (not `active`: a worker holds those), optionally only
    /// those finished (or, unfinished, created) before `older_than`. At most [`BULK_LIMIT`] per
    /// call: returns how many were deleted and whether matching jobs remain beyond that cap (the
    /// caller repeats the purge for them). Audited.
    pub async fn purge_queue(&self, queue: &str, states: &[JobState], older_than: Option<Timestamp>, actor: &Actor) -> Result<(u64, bool), StoreError> {
        if states.is_empty() {
            return Err(StoreError::invalid("states", "name at least one state to purge"));
        }
        if states.contains(&JobState::Active) {
            return Err(StoreError::invalid("states", "active jobs cannot be purged: a worker is running them; cancel them instead"));
        }
        let mut tx = self.begin().await?;
        let deleted = sqlx::query_scalar::<_, i64>(delete_with_history!(
            "SELECT id FROM jobs WHERE queue = $1 AND state = ANY($2)
               AND ($3::timestamptz IS NULL OR COALESCE(completed_at, cancelled_at, discarded_at, created_at) < $3::timestamptz)
             LIMIT $4",
            // A job moved meanwhile (re-driven into another queue, finished after the
            // cutoff) no longer matches: it stays.
            "queue = $1 AND state = ANY($2)
               AND ($3::timestamptz IS NULL OR COALESCE(completed_at, cancelled_at, discarded_at, created_at) < $3::timestamptz)",
            "'deleted'",
            "$5"
        ))
        .bind(queue)
        .bind(states)
        .bind(older_than.map(|t| t.to_string()))
        .bind(BULK_LIMIT)
        .bind(&actor.name)
        .fetch_one(&mut *tx)
        .await? as u64;
        // Only a purge that reached the cap can have left any; the deleted rows are gone from
        // this transaction's view, so whatever still matches is what remains.
        let has_more = deleted >= BULK_LIMIT as u64
            && sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM jobs WHERE queue = $1 AND state = ANY($2)
                   AND ($3::timestamptz IS NULL OR COALESCE(completed_at, cancelled_at, discarded_at, created_at) < $3::timestamptz))",
            )
            .bind(queue)
            .bind(states)
            .bind(older_than.map(|t| t.to_string()))
            .fetch_one(&mut *tx)
            .await?;
        let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        record(&mut tx, actor, "queue.purge", Some(queue), json!({"states": states, "older_than": older_than.map(|t| t.to_string()), "affected": deleted, "has_more": has_more})).await?;
        tx.commit().await?;
        Ok((deleted, has_more))
    }

    /// Counts of dead letters by queue and by error type, and their age span.
    pub async fn dead_letter_stats(&self, filter: &JobFilter) -> Result<DeadLetterStats, StoreError> {
        let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "SELECT j.queue, COALESCE(j.last_error->>'type', 'Unknown') AS error_type, count(*) AS n,
                    min(j.dead_lettered_at) AS oldest, max(j.dead_lettered_at) AS newest
             FROM jobs j WHERE j.dead_letter",
        );
        let mut f = filter.clone();
        f.dead_letter = None;
        f.push_conditions(&mut qb);
        qb.push(" GROUP BY 1, 2");
        let rows = qb.build().fetch_all(&self.pool).await?;
        let mut stats = DeadLetterStats::default();
        for r in &rows {
            let n: i64 = r.try_get("n")?;
            stats.total += n;
            *stats.by_queue.entry(r.try_get("queue")?).or_default() += n;
            *stats.by_error_type.entry(r.try_get("error_type")?).or_default() += n;
            let (oldest, newest) = (ts_opt(r, "oldest")?, ts_opt(r, "newest")?);
            stats.oldest_at = [stats.oldest_at, oldest].into_iter().flatten().min();
            stats.newest_at = [stats.newest_at, newest].into_iter().flatten().max();
        }
        Ok(stats)
    }

    /// Asks a worker to go `quiet` or `terminate` at its next heartbeat (OJS directives).
    /// Returns false if no such worker is registered. Audited.
    pub async fn request_worker_state(&self, id: &str, state: &str, actor: &Actor) -> Result<bool, StoreError> {
        if !matches!(state, "quiet" | "terminate") {
            return Err(StoreError::invalid("state", format!("must be \"quiet\" or \"terminate\", got {state:?}")));
        }
        let mut tx = self.begin().await?;
        let n = sqlx::query("UPDATE workers SET requested_state = $2 WHERE id = $1").bind(id).bind(state).execute(&mut *tx).await?.rows_affected();
        if n == 1 {
            record(&mut tx, actor, &format!("worker.{state}"), Some(id), json!({})).await?;
        }
        tx.commit().await?;
        Ok(n == 1)
    }

    /// The directive an operator asked for a worker, if any (`quiet`, `terminate`).
    pub async fn requested_worker_state(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar::<_, Option<String>>("SELECT requested_state FROM workers WHERE id = $1").bind(id).fetch_optional(&self.pool).await?.flatten())
    }

    /// Whether a worker may be handed jobs: not when it said it is stopping or an operator
    /// asked it to go quiet. Unknown workers may.
    pub async fn worker_accepts_work(&self, id: &str) -> Result<bool, StoreError> {
        let blocked: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM workers WHERE id = $1 AND (stopping OR requested_state IS NOT NULL))")
            .bind(id)
            .fetch_one(&self.pool)
            .await?;
        Ok(!blocked)
    }

    /// Forgets a worker that has been silent for at least `stale_after`, and reschedules its
    /// active jobs as the rescuer does for any worker that died: each whose lock has lapsed is
    /// a failed attempt (`rebound.stalled`, counted: it may have run, and a job that kills its
    /// worker must spend its budget) and its policy decides what follows; one whose lock still
    /// holds is left until it lapses (the worker may only be cut off, and still running it).
    /// `Ok(None)` if no such worker; [`StoreError::Invalid`] if it is not stale. Returns how
    /// many jobs were rescheduled now. Audited.
    pub async fn deregister_stale_worker(&self, id: &str, stale_after: Duration, actor: &Actor) -> Result<Option<u64>, StoreError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("SELECT last_heartbeat_at < now() - $2 * interval '1 millisecond' AS stale FROM workers WHERE id = $1 FOR UPDATE")
            .bind(id)
            .bind(millis(stale_after))
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(None);
        };
        if !row.try_get::<bool, _>("stale")? {
            tx.rollback().await?;
            return Err(StoreError::invalid("id", format!("worker {id} sent a heartbeat within the last {}s; only stale workers can be deregistered (ask it to go quiet instead)", stale_after.as_secs())));
        }
        sqlx::query("DELETE FROM workers WHERE id = $1").bind(id).execute(&mut *tx).await?;
        record(&mut tx, actor, "worker.deregister", Some(id), json!({})).await?;
        tx.commit().await?;
        // After the commit, as the rescuer's own pass (its batch size too): whatever this
        // leaves, failed or beyond the batch, the rescuer reschedules at its next passes.
        match self.rescue(1000, Some(id)).await {
            Ok(rescued) => Ok(Some(rescued.stalled + rescued.timed_out)),
            Err(e) => {
                tracing::warn!(worker = id, error = %e, "deregistered; rescheduling its lapsed jobs failed, and is left to the rescuer");
                Ok(Some(0))
            }
        }
    }

    /// Ids of the jobs a worker is running.
    pub async fn active_jobs_of(&self, worker_id: &str) -> Result<Vec<Uuid>, StoreError> {
        Ok(sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'active' AND locked_by = $1 ORDER BY id LIMIT 1000")
            .bind(worker_id)
            .fetch_all(&self.pool)
            .await?)
    }
}
