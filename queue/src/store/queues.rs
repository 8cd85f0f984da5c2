//! Queues: depth by state, pause and resume.

use jiff::Timestamp;
use serde::Serialize;
use serde_json::json;
use sqlx::Row;

use super::audit::{Actor, record};
use super::notify::notify_queues;
use super::{Store, StoreError, ts_opt};
use crate::job::validate_queue;

/// A queue and how much work is in it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QueueInfo {
    pub name: String,
    pub paused: bool,
    pub paused_at: Option<Timestamp>,
    pub paused_by: Option<String>,
    pub scheduled: i64,
    pub available: i64,
    pub pending: i64,
    pub active: i64,
    pub retryable: i64,
    pub completed: i64,
    pub cancelled: i64,
    pub discarded: i64,
    pub dead_letters: i64,
}

// Reads the maintained counters (see the job_counts migration), never the jobs themselves: a
// queue's counts cost the same at ten million jobs as at ten.
const QUEUE_COUNTS: &str = "
SELECT q.name, COALESCE(s.paused, false) AS paused, s.paused_at, s.paused_by,
       COALESCE(sum(c.n) FILTER (WHERE c.state = 'scheduled'), 0)::bigint AS scheduled,
       COALESCE(sum(c.n) FILTER (WHERE c.state = 'available'), 0)::bigint AS available,
       COALESCE(sum(c.n) FILTER (WHERE c.state = 'pending'), 0)::bigint AS pending,
       COALESCE(sum(c.n) FILTER (WHERE c.state = 'active'), 0)::bigint AS active,
       COALESCE(sum(c.n) FILTER (WHERE c.state = 'retryable'), 0)::bigint AS retryable,
       COALESCE(sum(c.n) FILTER (WHERE c.state = 'completed'), 0)::bigint AS completed,
       COALESCE(sum(c.n) FILTER (WHERE c.state = 'cancelled'), 0)::bigint AS cancelled,
       COALESCE(sum(c.n) FILTER (WHERE c.state = 'discarded'), 0)::bigint AS discarded,
       COALESCE(sum(c.n) FILTER (WHERE c.dead_letter), 0)::bigint AS dead_letters
FROM unnest($1::text[]) AS q(name)
LEFT JOIN queues s ON s.name = q.name
LEFT JOIN job_count_totals c ON c.queue = q.name
GROUP BY q.name, s.paused, s.paused_at, s.paused_by
ORDER BY q.name";

fn info_from_row(r: &sqlx::postgres::PgRow) -> Result<QueueInfo, StoreError> {
    Ok(QueueInfo {
        name: r.try_get("name")?,
        paused: r.try_get("paused")?,
        paused_at: ts_opt(r, "paused_at")?,
        paused_by: r.try_get("paused_by")?,
        scheduled: r.try_get("scheduled")?,
        available: r.try_get("available")?,
        pending: r.try_get("pending")?,
        active: r.try_get("active")?,
        retryable: r.try_get("retryable")?,
        completed: r.try_get("completed")?,
        cancelled: r.try_get("cancelled")?,
        discarded: r.try_get("discarded")?,
        dead_letters: r.try_get("dead_letters")?,
    })
}

impl Store {
    /// Names of every queue that has jobs or settings, from the maintained counters.
    pub async fn queue_names(&self) -> Result<Vec<String>, StoreError> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT queue FROM job_count_totals UNION SELECT name FROM queues ORDER BY 1",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(names)
    }

    /// Every queue with its counts.
    pub async fn queues(&self) -> Result<Vec<QueueInfo>, StoreError> {
        let names = self.queue_names().await?;
        let rows = sqlx::query(QUEUE_COUNTS).bind(&names).fetch_all(&self.pool).await?;
        rows.iter().map(info_from_row).collect()
    }

    /// One queue's counts (zeroes for a queue nobody has used).
    pub async fn queue(&self, name: &str) -> Result<QueueInfo, StoreError> {
        validate_queue(name)?;
        let row = sqlx::query(QUEUE_COUNTS).bind([name]).fetch_one(&self.pool).await?;
        info_from_row(&row)
    }

    /// Pauses (`true`) or resumes a queue: paused queues still accept jobs but nothing is
    /// claimed from them. Audited.
    pub async fn set_queue_paused(&self, name: &str, paused: bool, actor: &Actor) -> Result<QueueInfo, StoreError> {
        validate_queue(name)?;
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO queues (name, paused, paused_at, paused_by, updated_at)
             VALUES ($1, $2, CASE WHEN $2 THEN now() END, CASE WHEN $2 THEN $3 END, now())
             ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, paused_at = EXCLUDED.paused_at,
                                              paused_by = EXCLUDED.paused_by, updated_at = now()",
        )
        .bind(name)
        .bind(paused)
        .bind(&actor.name)
        .execute(&mut *tx)
        .await?;
        record(&mut tx, actor, if paused { "queue.pause" } else { "queue.resume" }, Some(name), json!({})).await?;
        if !paused {
            notify_queues(&mut *tx, &[name.to_string()]).await?;
        }
        tx.commit().await?;
        self.queue(name).await
    }
}

/// A queue's own retention of its finished jobs, over the pruner's configuration
/// ([`super::PruneConfig`]); an unset part follows the pruner's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueRetention {
    /// How long completed jobs are kept after they completed.
    pub completed: Option<std::time::Duration>,
    /// How long cancelled and (not dead-lettered) discarded jobs are kept.
    pub discarded: Option<std::time::Duration>,
}

impl QueueRetention {
    /// Whether either part is set.
    pub fn is_set(&self) -> bool {
        self.completed.is_some() || self.discarded.is_some()
    }
}

/// What a queue's settings row holds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueSettings {
    /// Its limits, if it has any.
    pub limit: Option<super::QueueRateLimit>,
    /// Its own retention (unset parts: the pruner's).
    pub retention: QueueRetention,
    /// An operator's override of its concurrency, while it lasts (see
    /// [`Store::override_queue_concurrency`]).
    pub concurrency_override: Option<super::RateLimitOverride>,
}

fn retention_of(row: &sqlx::postgres::PgRow) -> Result<QueueRetention, StoreError> {
    let part = |column: &str| -> Result<Option<std::time::Duration>, StoreError> {
        Ok(row.try_get::<Option<i64>, _>(column)?.map(|ms| std::time::Duration::from_millis(ms.unsigned_abs())))
    };
    Ok(QueueRetention { completed: part("retain_completed_ms")?, discarded: part("retain_discarded_ms")? })
}

impl Store {
    /// A queue's own retention (unset parts: the pruner's).
    pub async fn queue_retention(&self, queue: &str) -> Result<QueueRetention, StoreError> {
        Ok(self.queue_settings(queue).await?.retention)
    }

    /// A queue's settings: its settings row, read once.
    pub async fn queue_settings(&self, queue: &str) -> Result<QueueSettings, StoreError> {
        let row = sqlx::query(
            "SELECT *, (override_concurrency IS NOT NULL AND (override_expires_at IS NULL OR override_expires_at > now())) AS override_in_force
             FROM queues WHERE name = $1",
        )
        .bind(queue)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(QueueSettings::default()) };
        let limit = super::rate_limits::limit_from_row(&row)?;
        Ok(QueueSettings {
            limit: Some(limit).filter(super::QueueRateLimit::is_limited),
            retention: retention_of(&row)?,
            concurrency_override: super::rate_limits::override_from_row(&row)?,
        })
    }

    /// The queues with a retention of their own, by name.
    pub async fn queue_retentions(&self) -> Result<Vec<(String, QueueRetention)>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, retain_completed_ms, retain_discarded_ms FROM queues
             WHERE retain_completed_ms IS NOT NULL OR retain_discarded_ms IS NOT NULL ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("name")?, retention_of(r)?))).collect()
    }

    /// Sets a queue's own retention (both parts: an unset one follows the pruner's). Each part
    /// is at most [`crate::bounds::MAX_INTERVAL`]. Audited. The pruner applies it at its next
    /// pass.
    pub async fn set_queue_retention(&self, queue: &str, retention: QueueRetention, actor: &Actor) -> Result<QueueRetention, StoreError> {
        validate_queue(queue)?;
        for (field, d) in [("retention.completed", retention.completed), ("retention.discarded", retention.discarded)] {
            if let Some(d) = d {
                crate::bounds::check_interval(d).map_err(|reason| StoreError::invalid(field, reason))?;
            }
        }
        let ms = |d: Option<std::time::Duration>| d.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO queues (name, retain_completed_ms, retain_discarded_ms, updated_at) VALUES ($1, $2, $3, now())
             ON CONFLICT (name) DO UPDATE SET retain_completed_ms = EXCLUDED.retain_completed_ms,
                 retain_discarded_ms = EXCLUDED.retain_discarded_ms, updated_at = now()",
        )
        .bind(queue)
        .bind(ms(retention.completed))
        .bind(ms(retention.discarded))
        .execute(&mut *tx)
        .await?;
        let iso = |d: Option<std::time::Duration>| d.map(crate::policy::iso8601::format);
        record(&mut tx, actor, "queue.retention", Some(queue), json!({"completed": iso(retention.completed), "discarded": iso(retention.discarded)})).await?;
        tx.commit().await?;
        Ok(retention)
    }
}
