//! Cancelling jobs, and the bulk manual actions an operator takes from the dashboard.

use serde_json::json;
use sqlx::{Postgres, QueryBuilder, Row};
use uuid::Uuid;

use super::audit::{Actor, record};
use super::listing::JobFilter;
use super::notify::notify_queues;
use super::{NamedRun, Store, StoreError, job_from_row, jobs_from_rows};
use crate::job::{Job, JobState};

/// Which jobs a bulk action applies to: listed ids, or everything matching a filter.
#[derive(Clone, Debug, PartialEq)]
pub enum JobSelection {
    Ids(Vec<Uuid>),
    Filter(JobFilter),
}

impl JobSelection {
    /// `SELECT id FROM jobs j WHERE <selection> AND <extra>`, locked, bounded by `limit`.
    ///
    /// A row another transaction is writing at that moment (a worker's result, a promotion) is
    /// waited for, then checked again, not skipped: an operator's action must reach every job
    /// it matches, and skipped ones were left out without a word. Rows are locked in id order,
    /// the order the worker's result batches are written in (sorted by id) and an index scan
    /// over `id = ANY(…)` visits them, so the two do not wait on each other in a cycle. Rarer
    /// cycles (a workflow step's completion releasing the next step while a bulk action holds
    /// it) are broken by Postgres's deadlock detector within a second: the worker's write is
    /// retried, the operator is told nothing was done.
    pub(crate) fn select_ids(&self, extra: &str, limit: i64) -> QueryBuilder<Postgres> {
        let mut qb = self.select_ids_unlocked(extra, limit);
        qb.push(" FOR UPDATE");
        qb
    }

    /// [`JobSelection::select_ids`] for reading only: no row is locked, none is skipped.
    pub(crate) fn select_ids_unlocked(&self, extra: &str, limit: i64) -> QueryBuilder<Postgres> {
        let mut qb = QueryBuilder::<Postgres>::new("SELECT j.id FROM jobs j WHERE ");
        qb.push(extra.to_string());
        match self {
            JobSelection::Ids(ids) => {
                qb.push(" AND j.id = ANY(").push_bind(ids.clone()).push(")");
            }
            JobSelection::Filter(f) => f.push_conditions(&mut qb),
        }
        qb.push(" ORDER BY j.id LIMIT ").push_bind(limit);
        qb
    }

    pub(crate) fn describe(&self) -> serde_json::Value {
        match self {
            JobSelection::Ids(ids) => json!({"ids": ids.iter().take(100).collect::<Vec<_>>(), "count": ids.len()}),
            JobSelection::Filter(f) => json!({"filter": f}),
        }
    }
}

/// The most jobs one bulk action touches; an operator repeats the action for more.
pub const BULK_LIMIT: i64 = 50_000;

impl Store {
    /// Cancels a job that has not finished (active jobs too: their worker's result is then
    /// refused). A finished job is a conflict. With an actor, the action is audited.
    pub async fn cancel(&self, id: Uuid, actor: Option<&Actor>) -> Result<Job, StoreError> {
        Ok(self.cancel_from(id, actor).await?.0)
    }

    /// [`Store::cancel`], also telling the state the job was cancelled from (OJS answers it as
    /// `previous_state`).
    pub async fn cancel_from(&self, id: Uuid, actor: Option<&Actor>) -> Result<(Job, JobState), StoreError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query(
            "UPDATE jobs j SET state = 'cancelled', cancelled_at = now(), locked_by = NULL, lock_expires_at = NULL,
                               updated_at = now()
             FROM (SELECT id, state FROM jobs WHERE id = $1 FOR UPDATE) AS before
             WHERE j.id = before.id AND before.state NOT IN ('completed', 'cancelled', 'discarded')
             RETURNING j.*, before.state AS previous_state",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            // Nothing was written; a failed rollback closes the connection instead.
            let _ = tx.rollback().await;
            return Err(self.refusal(id, "cancel", None, NamedRun::default()).await);
        };
        let previous: JobState = row.try_get("previous_state")?;
        if let Some(actor) = actor {
            record(&mut tx, actor, "job.cancel", Some(&id.to_string()), json!({"previous_state": previous.as_str()})).await?;
        }
        tx.commit().await?;
        Ok((job_from_row(&row)?, previous))
    }

    /// Cancels every unfinished job in the selection. Returns how many
    /// ([`Store::cancel_unfinished_jobs`] also names the finished ones it matched).
    pub async fn cancel_jobs(&self, sel: &JobSelection, actor: &Actor) -> Result<u64, StoreError> {
        Ok(self.cancel_selected(sel, actor, false).await?.succeeded)
    }

    /// Makes waiting jobs (scheduled, retryable) run now. Returns how many.
    pub async fn retry_jobs_now(&self, sel: &JobSelection, actor: &Actor) -> Result<u64, StoreError> {
        self.bulk(sel, actor, "job.bulk_retry_now", "j.state IN ('scheduled', 'retryable')",
            // As for a retry (see `retry_finished_jobs`): run now, so it waits for its key.
            "UPDATE jobs SET state = 'available', scheduled_at = now(), enqueued_at = now(), updated_at = now(), rate_limit_on_limit = NULL")
            .await
    }

    /// Discards jobs that are not running or finished. Returns how many.
    pub async fn discard_jobs(&self, sel: &JobSelection, actor: &Actor) -> Result<u64, StoreError> {
        self.bulk(sel, actor, "job.bulk_discard", "j.state IN ('scheduled', 'available', 'pending', 'retryable')",
            "UPDATE jobs SET state = 'discarded', discarded_at = now(), completed_at = now(), updated_at = now()")
            .await
    }

    async fn bulk(&self, sel: &JobSelection, actor: &Actor, action: &str, eligible: &str, update: &'static str) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let ids: Vec<Uuid> = sel.select_ids(eligible, BULK_LIMIT).build_query_scalar().fetch_all(&mut *tx).await?;
        let mut qb = QueryBuilder::<Postgres>::new(update);
        qb.push(" WHERE id = ANY(").push_bind(ids.clone()).push(") RETURNING *");
        let rows = qb.build().fetch_all(&mut *tx).await?;
        let jobs = jobs_from_rows(&rows)?;
        let mut queues: Vec<String> = jobs.iter().filter(|j| j.state == crate::JobState::Available).map(|j| j.queue.clone()).collect();
        queues.sort();
        queues.dedup();
        notify_queues(&mut *tx, &queues).await?;
        let mut details = sel.describe();
        if let Some(o) = details.as_object_mut() {
            o.insert("affected".into(), json!(jobs.len()));
        }
        record(&mut tx, actor, action, None, details).await?;
        tx.commit().await?;
        Ok(jobs.len() as u64)
    }
}
