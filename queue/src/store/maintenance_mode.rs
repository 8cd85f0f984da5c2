//! Maintenance mode (OJS admin API §12.1): every queue paused at once, scheduled promotion and
//! cron held, enqueues still accepted. For a database migration or an incident: nothing new
//! starts until an operator turns it off, and nothing is lost meanwhile.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::json;
use sqlx::Row;

use super::audit::{Actor, record};
use super::notify::notify_queues;
use super::{Store, StoreError, millis, ts, ts_opt};

/// The longest maintenance reason kept.
pub const MAX_REASON_CHARS: usize = 1_000;

/// Maintenance mode as it is on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Maintenance {
    pub reason: Option<String>,
    pub enabled_at: Timestamp,
    pub enabled_by: String,
    /// When the operator expected it to end (a note: it ends only when turned off).
    pub estimated_end: Option<Timestamp>,
}

fn maintenance_from_row(row: &sqlx::postgres::PgRow) -> Result<Maintenance, StoreError> {
    Ok(Maintenance {
        reason: row.try_get("reason")?,
        enabled_at: ts(row, "enabled_at")?,
        enabled_by: row.try_get("enabled_by")?,
        estimated_end: ts_opt(row, "estimated_end")?,
    })
}

impl Store {
    /// Maintenance mode, if it is on.
    pub async fn maintenance(&self) -> Result<Option<Maintenance>, StoreError> {
        let row = sqlx::query("SELECT * FROM maintenance").fetch_optional(&self.pool).await?;
        row.as_ref().map(maintenance_from_row).transpose()
    }

    /// Turns maintenance mode on (or updates its reason and estimate if it is on already): no
    /// claim hands out a job, due jobs are not promoted and cron ticks wait until it is turned
    /// off. Running jobs finish. Audited.
    pub async fn enable_maintenance(&self, reason: Option<&str>, estimated: Option<Duration>, actor: &Actor) -> Result<Maintenance, StoreError> {
        if let Some(d) = estimated {
            crate::bounds::check_interval(d).map_err(|r| StoreError::invalid("estimated_duration", r))?;
        }
        if reason.is_some_and(|r| r.chars().count() > MAX_REASON_CHARS || r.chars().any(|c| c.is_control() && c != '\n')) {
            return Err(StoreError::invalid("reason", format!("must be at most {MAX_REASON_CHARS} characters of text")));
        }
        let mut tx = self.begin().await?;
        let row = sqlx::query(
            "INSERT INTO maintenance (reason, enabled_by, estimated_end)
             VALUES ($1, $2, now() + $3::bigint * interval '1 millisecond')
             ON CONFLICT (singleton) DO UPDATE SET reason = EXCLUDED.reason, estimated_end = EXCLUDED.estimated_end
             RETURNING *",
        )
        .bind(reason)
        .bind(&actor.name)
        .bind(estimated.map(millis))
        .fetch_one(&mut *tx)
        .await?;
        record(&mut tx, actor, "system.maintenance_on", None, json!({ "reason": reason, "estimated_ms": estimated.map(millis) })).await?;
        tx.commit().await?;
        maintenance_from_row(&row)
    }

    /// Turns maintenance mode off and wakes the workers of every queue with work waiting.
    /// Returns whether it was on. Audited.
    pub async fn disable_maintenance(&self, actor: &Actor) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let was_on = sqlx::query("DELETE FROM maintenance").execute(&mut *tx).await?.rows_affected() > 0;
        if was_on {
            let waiting: Vec<String> = sqlx::query_scalar("SELECT DISTINCT queue FROM job_count_totals WHERE state = 'available'").fetch_all(&mut *tx).await?;
            notify_queues(&mut *tx, &waiting).await?;
            record(&mut tx, actor, "system.maintenance_off", None, json!({})).await?;
        }
        tx.commit().await?;
        Ok(was_on)
    }
}
