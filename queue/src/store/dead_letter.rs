//! The dead-letter queue: re-drive (one, many, all matching a filter; fresh budget or one more
//! attempt; optionally staggered) and purge. Every action is audited with who and why.

use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use super::audit::{Actor, record};
use super::cancel::{BULK_LIMIT, JobSelection};
use super::notify::notify_queues;
use super::{Store, StoreError, millis};

/// How much retry budget a re-driven job gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedriveBudget {
    /// Attempts start again from zero: the whole policy applies anew.
    Fresh,
    /// Exactly one more execution; failing it exhausts the job again.
    OneMore,
}

/// How to re-drive.
#[derive(Clone, Debug, PartialEq)]
pub struct RedriveOptions {
    pub budget: RedriveBudget,
    /// Spread the jobs evenly over this window so a large re-drive is no thundering herd.
    pub stagger: Option<Duration>,
    pub actor: Actor,
    pub reason: Option<String>,
}

/// Re-drive targets: the same selections as other bulk actions, restricted to dead letters.
pub type RedriveTarget = JobSelection;

impl Store {
    /// Re-drives dead letters in the selection (at most 50 000 per call). Returns how many.
    ///
    /// A stagger longer than [`crate::bounds::MAX_INTERVAL`] (365 days) is refused
    /// ([`StoreError::Invalid`] naming `stagger`) before anything is read or written.
    pub async fn redrive(&self, sel: &JobSelection, opts: &RedriveOptions) -> Result<u64, StoreError> {
        if let Some(stagger) = opts.stagger {
            crate::bounds::check_interval(stagger).map_err(|reason| StoreError::invalid("stagger", reason))?;
        }
        let mut tx = self.begin().await?;
        let ids: Vec<Uuid> = sel.select_ids("j.dead_letter", BULK_LIMIT).build_query_scalar().fetch_all(&mut *tx).await?;
        let queues: Vec<String> = sqlx::query_scalar(
            "WITH picked AS (
                 SELECT id, (row_number() OVER (ORDER BY id) - 1)::float8 / GREATEST(count(*) OVER (), 1) AS frac
                 FROM unnest($1::uuid[]) AS id
             ), moved AS (
                 UPDATE jobs j
                 SET state = CASE WHEN $3::bigint IS NULL OR p.frac = 0 THEN 'available'::job_state ELSE 'scheduled'::job_state END,
                     scheduled_at = now() + COALESCE($3::bigint, 0) * p.frac * interval '1 millisecond',
                     enqueued_at = CASE WHEN $3::bigint IS NULL OR p.frac = 0 THEN now() END,
                     attempt = CASE WHEN $2 THEN 0 ELSE j.attempt END,
                     max_attempts = CASE WHEN $2 THEN j.max_attempts ELSE j.attempt + 1 END,
                     -- One more means one more, whatever the live policy says: pin it on the job.
                     retry = CASE WHEN $2 THEN j.retry
                                  ELSE COALESCE(j.retry, '{}'::jsonb) || jsonb_build_object('max_attempts', j.attempt + 1) END,
                     dead_letter = false, dead_lettered_at = NULL, discarded_at = NULL, completed_at = NULL,
                     updated_at = now()
                 FROM picked p
                 WHERE j.id = p.id
                 RETURNING j.queue, j.state
             )
             SELECT DISTINCT queue FROM moved WHERE state = 'available'",
        )
        .bind(&ids)
        .bind(opts.budget == RedriveBudget::Fresh)
        .bind(opts.stagger.map(millis))
        .fetch_all(&mut *tx)
        .await?;
        notify_queues(&mut *tx, &queues).await?;
        let mut details = sel.describe();
        if let Some(o) = details.as_object_mut() {
            o.insert("affected".into(), json!(ids.len()));
            o.insert("budget".into(), json!(if opts.budget == RedriveBudget::Fresh { "fresh" } else { "one_more" }));
            o.insert("stagger_ms".into(), json!(opts.stagger.map(millis)));
            o.insert("reason".into(), json!(opts.reason));
        }
        let target = match sel {
            JobSelection::Ids(ids) if ids.len() == 1 => Some(ids[0].to_string()),
            _ => None,
        };
        // A re-drive that matched nothing did nothing: the caller reports it, the log stays clean.
        if !ids.is_empty() {
            record(&mut tx, &opts.actor, "dead_letter.redrive", target.as_deref(), details).await?;
        }
        tx.commit().await?;
        Ok(ids.len() as u64)
    }

    /// Deletes dead letters in the selection for good, with their attempts. Returns how many.
    pub async fn purge_dead_letters(&self, sel: &JobSelection, actor: &Actor, reason: Option<&str>) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let ids: Vec<Uuid> = sel.select_ids("j.dead_letter", BULK_LIMIT).build_query_scalar().fetch_all(&mut *tx).await?;
        let deleted = sqlx::query_scalar::<_, i64>(delete_with_history!("SELECT unnest($1::uuid[])"))
            .bind(&ids)
            .fetch_one(&mut *tx)
            .await? as u64;
        let mut details = sel.describe();
        if let Some(o) = details.as_object_mut() {
            o.insert("affected".into(), json!(deleted));
            o.insert("reason".into(), json!(reason));
        }
        record(&mut tx, actor, "dead_letter.purge", None, details).await?;
        tx.commit().await?;
        Ok(deleted)
    }
}
