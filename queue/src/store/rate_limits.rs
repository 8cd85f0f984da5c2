//! Per-queue rate limits: set, read, and their live state. The claim statement enforces them
//! (see [`super::claim`]); this module only stores them.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::audit::{Actor, record};
use super::notify::notify_queues;
use super::{Store, StoreError, millis, ts_opt};
use crate::job::validate_queue;
use crate::policy::iso8601;

/// At most `limit` job starts per `period`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Window {
    pub limit: u32,
    pub period: Duration,
}

/// A queue's limits (OJS `RateLimitPolicy` at queue level). Every limit set must allow a
/// start; an empty one means no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueRateLimit {
    /// Most jobs of the queue active at once.
    pub concurrency: Option<u32>,
    /// Most starts per window (fixed windows).
    pub rate: Option<Window>,
    /// Starts spaced evenly: at most `limit` per `period`, at least `period / limit` apart.
    pub throttle: Option<Window>,
}

impl QueueRateLimit {
    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        self.concurrency.is_some() || self.rate.is_some() || self.throttle.is_some()
    }

    /// The OJS shape: `{"concurrency", "rate": {"limit", "period"}, "throttle": {…}}`.
    pub fn to_json(&self) -> Value {
        let window = |w: &Window| json!({ "limit": w.limit, "period": iso8601::format(w.period) });
        let mut v = json!({});
        if let Some(m) = v.as_object_mut() {
            if let Some(c) = self.concurrency {
                m.insert("concurrency".into(), json!(c));
            }
            if let Some(w) = &self.rate {
                m.insert("rate".into(), window(w));
            }
            if let Some(w) = &self.throttle {
                m.insert("throttle".into(), window(w));
            }
        }
        v
    }

    fn validate(&self) -> Result<(), StoreError> {
        for (field, w) in [("rate", &self.rate), ("throttle", &self.throttle)] {
            if let Some(w) = w {
                if millis(w.period) < 1 {
                    return Err(StoreError::invalid(format!("{field}.period"), "must be at least a millisecond"));
                }
                crate::bounds::check_interval(w.period).map_err(|reason| StoreError::invalid(format!("{field}.period"), reason))?;
                if field == "throttle" && w.limit == 0 {
                    return Err(StoreError::invalid("throttle.limit", "must be at least 1 (use concurrency 0 to stop the queue)"));
                }
                if field == "throttle" && millis(w.period) / i64::from(w.limit) < 1 {
                    return Err(StoreError::invalid("throttle", "spaces starts less than a millisecond apart; use rate instead"));
                }
            }
        }
        Ok(())
    }
}

/// A limited queue's state now.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RateLimitState {
    pub queue: String,
    pub limit: QueueRateLimit,
    /// Jobs of the queue active now.
    pub active: i64,
    /// Jobs waiting (`available`).
    pub waiting: i64,
    /// Starts in the current rate window, and when it ends (`None`: no window open).
    pub rate_used: i64,
    pub rate_window_resets_at: Option<Timestamp>,
    /// When the throttle admits the next start (`None`: now).
    pub throttle_next_allowed_at: Option<Timestamp>,
}

fn limit_from_row(r: &PgRow) -> Result<QueueRateLimit, StoreError> {
    let window = |max: Option<i32>, period: Option<i64>| match (max, period) {
        (Some(m), Some(p)) => Some(Window { limit: u32::try_from(m).unwrap_or(0), period: Duration::from_millis(p.unsigned_abs()) }),
        _ => None,
    };
    let stored: Option<Value> = r.try_get("rate_limit")?;
    // The throttle is stored as its one-start window; the limit as set is in `rate_limit`.
    let throttle = stored.as_ref().and_then(|v| v.get("throttle")).and_then(|t| {
        let limit = t.get("limit")?.as_u64()?;
        let period = iso8601::parse(t.get("period")?.as_str()?).ok()?;
        Some(Window { limit: u32::try_from(limit).ok()?, period })
    });
    Ok(QueueRateLimit {
        concurrency: r.try_get::<Option<i32>, _>("concurrency_limit")?.map(|c| u32::try_from(c).unwrap_or(0)),
        rate: window(r.try_get("rate_max")?, r.try_get("rate_period_ms")?),
        throttle,
    })
}

impl Store {
    /// A queue's limits, if it has any.
    pub async fn queue_rate_limit(&self, queue: &str) -> Result<Option<QueueRateLimit>, StoreError> {
        let row = sqlx::query("SELECT * FROM queues WHERE name = $1").bind(queue).fetch_optional(&self.pool).await?;
        Ok(row.as_ref().map(limit_from_row).transpose()?.filter(QueueRateLimit::is_limited))
    }

    /// Sets a queue's limits (`None` or an empty limit removes them); they apply to the next
    /// claim. Audited. Returns what is now in force.
    pub async fn set_queue_rate_limit(&self, queue: &str, limit: Option<&QueueRateLimit>, actor: &Actor) -> Result<Option<QueueRateLimit>, StoreError> {
        validate_queue(queue)?;
        let limit = limit.copied().filter(QueueRateLimit::is_limited);
        if let Some(l) = &limit {
            l.validate()?;
        }
        let l = limit.unwrap_or_default();
        let throttle_period = l.throttle.map(|w| millis(w.period) / i64::from(w.limit.max(1)));
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO queues (name, rate_limit, concurrency_limit, rate_max, rate_period_ms, throttle_max, throttle_period_ms, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, now())
             ON CONFLICT (name) DO UPDATE SET rate_limit = EXCLUDED.rate_limit, concurrency_limit = EXCLUDED.concurrency_limit,
                 rate_max = EXCLUDED.rate_max, rate_period_ms = EXCLUDED.rate_period_ms,
                 throttle_max = EXCLUDED.throttle_max, throttle_period_ms = EXCLUDED.throttle_period_ms,
                 rate_window_start = NULL, rate_window_used = 0, throttle_window_start = NULL, throttle_window_used = 0,
                 updated_at = now()",
        )
        .bind(queue)
        .bind(limit.map(|l| l.to_json()))
        .bind(l.concurrency.map(|c| i32::try_from(c).unwrap_or(i32::MAX)))
        .bind(l.rate.map(|w| i32::try_from(w.limit).unwrap_or(i32::MAX)))
        .bind(l.rate.map(|w| millis(w.period)))
        .bind(l.throttle.map(|_| 1i32))
        .bind(throttle_period)
        .execute(&mut *tx)
        .await?;
        record(&mut tx, actor, "queue.rate_limit", Some(queue), json!({"rate_limit": limit.map(|l| l.to_json())})).await?;
        // A raised or removed limit may free waiting jobs now.
        notify_queues(&mut *tx, &[queue.to_owned()]).await?;
        tx.commit().await?;
        Ok(limit)
    }

    /// Every queue with limits, and their state now.
    pub async fn rate_limit_states(&self, queue: Option<&str>) -> Result<Vec<RateLimitState>, StoreError> {
        let rows = sqlx::query(
            "SELECT q.*,
                    (SELECT count(*) FROM jobs j WHERE j.queue = q.name AND j.state = 'active') AS active,
                    (SELECT count(*) FROM jobs j WHERE j.queue = q.name AND j.state = 'available') AS waiting,
                    CASE WHEN q.rate_window_start > now() - q.rate_period_ms * interval '1 millisecond' THEN q.rate_window_used ELSE 0 END AS rate_used,
                    CASE WHEN q.rate_window_start > now() - q.rate_period_ms * interval '1 millisecond'
                         THEN q.rate_window_start + q.rate_period_ms * interval '1 millisecond' END AS rate_resets_at,
                    CASE WHEN q.throttle_window_start > now() - q.throttle_period_ms * interval '1 millisecond'
                         THEN q.throttle_window_start + q.throttle_period_ms * interval '1 millisecond' END AS throttle_next
             FROM queues q
             WHERE (q.rate_max IS NOT NULL OR q.throttle_max IS NOT NULL OR q.concurrency_limit IS NOT NULL)
               AND ($1::text IS NULL OR q.name = $1)
             ORDER BY q.name",
        )
        .bind(queue)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(RateLimitState {
                    queue: r.try_get("name")?,
                    limit: limit_from_row(r)?,
                    active: r.try_get("active")?,
                    waiting: r.try_get("waiting")?,
                    rate_used: i64::from(r.try_get::<i32, _>("rate_used")?),
                    rate_window_resets_at: ts_opt(r, "rate_resets_at")?,
                    throttle_next_allowed_at: ts_opt(r, "throttle_next")?,
                })
            })
            .collect()
    }

    /// When the queue's oldest waiting job became available.
    pub async fn oldest_available_at(&self, queue: &str) -> Result<Option<Timestamp>, StoreError> {
        let row = sqlx::query("SELECT min(COALESCE(enqueued_at, scheduled_at)) AS t FROM jobs WHERE queue = $1 AND state = 'available'")
            .bind(queue)
            .fetch_one(&self.pool)
            .await?;
        Ok(ts_opt(&row, "t")?)
    }
}
