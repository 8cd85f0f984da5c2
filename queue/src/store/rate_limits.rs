//! Per-queue rate limits: set, read, and their live state. The claim statement enforces them
//! (see [`super::claim`]); this module only stores them.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::{PgConnection, Row};
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

impl Window {
    /// Why `period` cannot be a window's (shorter than a millisecond, or longer than
    /// [`crate::bounds::MAX_INTERVAL`]), if it cannot: a queue's windows and a key's alike.
    pub fn check_period(&self) -> Result<(), String> {
        if millis(self.period) < 1 {
            return Err("must be at least a millisecond".into());
        }
        crate::bounds::check_interval(self.period)
    }

    /// Why this window cannot be a throttle, naming its field (`limit` or `period`): a
    /// throttle allows a start, spaced at least a millisecond from the last.
    pub fn check_throttle(&self) -> Result<(), (&'static str, String)> {
        if self.limit == 0 {
            return Err(("limit", "must be at least 1 (use concurrency 0 to stop every start)".into()));
        }
        self.check_period().map_err(|reason| ("period", reason))?;
        if millis(self.period) / i64::from(self.limit) < 1 {
            return Err(("period", "spaces starts less than a millisecond apart; use rate instead".into()));
        }
        Ok(())
    }
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
        if let Some(w) = &self.rate {
            w.check_period().map_err(|reason| StoreError::invalid("rate.period", reason))?;
        }
        if let Some(w) = &self.throttle {
            w.check_throttle().map_err(|(field, reason)| StoreError::invalid(format!("throttle.{field}"), reason))?;
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
    /// An operator's concurrency for the queue, in place of `limit.concurrency` while it
    /// lasts (see [`Store::override_queue_concurrency`]).
    pub override_limit: Option<RateLimitOverride>,
}

impl RateLimitState {
    /// The concurrency claims keep to now: the override's while it lasts, else the limit's.
    pub fn concurrency_in_force(&self) -> Option<u32> {
        self.override_limit.map(|o| o.concurrency).or(self.limit.concurrency)
    }
}

/// The override stored in a row's `override_concurrency` and `override_expires_at`, if one
/// is in force: the row's `override_in_force`, computed by the database's clock as the claim
/// judges it (an ended one the sweep has not yet cleared is none).
pub(super) fn override_from_row(r: &PgRow) -> Result<Option<RateLimitOverride>, StoreError> {
    if !r.try_get::<Option<bool>, _>("override_in_force")?.unwrap_or(false) {
        return Ok(None);
    }
    let expires_at = ts_opt(r, "override_expires_at")?;
    Ok(r.try_get::<Option<i32>, _>("override_concurrency")?.map(|c| RateLimitOverride { concurrency: u32::try_from(c).unwrap_or(0), expires_at }))
}

/// The window stored in columns `max` and `period` (milliseconds) of a row, if both are set.
fn stored_window(r: &PgRow, max: &str, period: &str) -> Result<Option<Window>, StoreError> {
    Ok(match (r.try_get::<Option<i32>, _>(max)?, r.try_get::<Option<i64>, _>(period)?) {
        (Some(m), Some(p)) => Some(Window { limit: u32::try_from(m).unwrap_or(0), period: Duration::from_millis(p.unsigned_abs()) }),
        _ => None,
    })
}

pub(super) fn limit_from_row(r: &PgRow) -> Result<QueueRateLimit, StoreError> {
    let stored: Option<Value> = r.try_get("rate_limit")?;
    // The throttle is stored as its one-start window; the limit as set is in `rate_limit`.
    let throttle = stored.as_ref().and_then(|v| v.get("throttle")).and_then(|t| {
        let limit = t.get("limit")?.as_u64()?;
        let period = iso8601::parse(t.get("period")?.as_str()?).ok()?;
        Some(Window { limit: u32::try_from(limit).ok()?, period })
    });
    Ok(QueueRateLimit {
        concurrency: r.try_get::<Option<i32>, _>("concurrency_limit")?.map(|c| u32::try_from(c).unwrap_or(0)),
        rate: stored_window(r, "rate_max", "rate_period_ms")?,
        throttle,
    })
}

impl Store {
    /// A queue's limits, if it has any.
    pub async fn queue_rate_limit(&self, queue: &str) -> Result<Option<QueueRateLimit>, StoreError> {
        Ok(self.queue_settings(queue).await?.limit)
    }

    /// Sets a queue's limits (`None` or an empty limit removes them); they apply to the next
    /// claim, and its rate and throttle windows start afresh. Audited. Returns the limits as set
    /// (an override of the concurrency, while one lasts, stays in force over them).
    pub async fn set_queue_rate_limit(&self, queue: &str, limit: Option<&QueueRateLimit>, actor: &Actor) -> Result<Option<QueueRateLimit>, StoreError> {
        validate_queue(queue)?;
        let limit = limit.copied().filter(QueueRateLimit::is_limited);
        let mut tx = self.begin().await?;
        write_queue_limit(&mut tx, queue, limit, false).await?;
        record(&mut tx, actor, "queue.rate_limit", Some(queue), json!({"rate_limit": limit.map(|l| l.to_json())})).await?;
        tx.commit().await?;
        Ok(limit)
    }

    /// Sets only a queue's concurrency limit (`None` removes it), keeping its rate and
    /// throttle and their windows as they are (the admin API's queue `concurrency`). Audited.
    /// Returns the queue's limits now.
    pub async fn set_queue_concurrency(&self, queue: &str, concurrency: Option<u32>, actor: &Actor) -> Result<Option<QueueRateLimit>, StoreError> {
        validate_queue(queue)?;
        let mut tx = self.begin().await?;
        // Locked, so that a concurrent change of the rate is neither lost nor half-read.
        let row = sqlx::query("SELECT * FROM queues WHERE name = $1 FOR UPDATE").bind(queue).fetch_optional(&mut *tx).await?;
        let current = row.as_ref().map(limit_from_row).transpose()?.unwrap_or_default();
        let limit = Some(QueueRateLimit { concurrency, ..current }).filter(QueueRateLimit::is_limited);
        write_queue_limit(&mut tx, queue, limit, true).await?;
        record(&mut tx, actor, "queue.concurrency", Some(queue), json!({"concurrency": concurrency, "rate_limit": limit.map(|l| l.to_json())})).await?;
        tx.commit().await?;
        Ok(limit)
    }

    /// Sets an operator's concurrency for a queue, in force over its own limit until
    /// `expires_at` (`None`: until removed), or removes it (`None`); the queue's limit as set
    /// is kept under it and applies again when it ends. Applies to the next claim; a raised
    /// or ended limit wakes the queue's workers. Audited. Returns the queue's state now
    /// (`None`: it has no limit and no override).
    pub async fn override_queue_concurrency(&self, queue: &str, limit: Option<&RateLimitOverride>, actor: &Actor) -> Result<Option<RateLimitState>, StoreError> {
        validate_queue(queue)?;
        if let Some(o) = limit {
            o.validate()?;
        }
        let mut tx = self.begin().await?;
        // Removing one leaves no row behind for a queue that had none, and removing none
        // changes nothing: no audit entry, no wake-up.
        let statement = if limit.is_some() {
            "INSERT INTO queues (name, override_concurrency, override_expires_at, updated_at) VALUES ($1, $2, $3, now())
             ON CONFLICT (name) DO UPDATE SET override_concurrency = EXCLUDED.override_concurrency,
                 override_expires_at = EXCLUDED.override_expires_at, updated_at = now()"
        } else {
            "UPDATE queues SET override_concurrency = $2, override_expires_at = $3, updated_at = now()
             WHERE name = $1 AND override_concurrency IS NOT NULL"
        };
        let changed = sqlx::query(statement)
            .bind(queue)
            .bind(limit.map(|o| i32::try_from(o.concurrency).unwrap_or(i32::MAX)))
            .bind(limit.and_then(|o| o.expires_at).map(jiff_sqlx::Timestamp::from))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if changed == 0 {
            tx.rollback().await?;
            return Ok(self.rate_limit_states(Some(queue)).await?.into_iter().next());
        }
        notify_queues(&mut *tx, &[queue.to_owned()]).await?;
        let detail = limit.map(RateLimitOverride::to_json);
        record(&mut tx, actor, "queue.rate_limit_override", Some(queue), json!({ "override": detail })).await?;
        tx.commit().await?;
        Ok(self.rate_limit_states(Some(queue)).await?.into_iter().next())
    }

    /// Clears the queues' overrides that have ended and wakes their workers (the limit under
    /// an override of 0 may admit jobs now). Returns how many ended.
    async fn end_queue_overrides(&self) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        // Locked in name order first, as a fetch over several queues locks them (see
        // `Store::claim_in_one`): a plain UPDATE would lock in table order and could deadlock
        // with it.
        let ended: Vec<String> = sqlx::query_scalar(
            "UPDATE queues SET override_concurrency = NULL, override_expires_at = NULL, updated_at = now()
             WHERE name = ANY(ARRAY(SELECT name FROM queues WHERE override_expires_at <= now() ORDER BY name FOR UPDATE))
             RETURNING name",
        )
        .fetch_all(&mut *tx)
        .await?;
        if !ended.is_empty() {
            notify_queues(&mut *tx, &ended).await?;
        }
        tx.commit().await?;
        Ok(ended.len() as u64)
    }

    /// Every queue with limits, and their state now.
    pub async fn rate_limit_states(&self, queue: Option<&str>) -> Result<Vec<RateLimitState>, StoreError> {
        let rows = sqlx::query(
            "SELECT q.*, (q.override_concurrency IS NOT NULL AND (q.override_expires_at IS NULL OR q.override_expires_at > now())) AS override_in_force,
                    (SELECT count(*) FROM jobs j WHERE j.queue = q.name AND j.state = 'active') AS active,
                    -- Two reads, each on its partial index: jobs claimable, and jobs waiting
                    -- for a slot of their rate-limit key.
                    (SELECT count(*) FROM jobs j WHERE j.queue = q.name AND j.state = 'available' AND NOT j.rate_limited)
                      + (SELECT count(*) FROM jobs j WHERE j.queue = q.name AND j.state = 'available' AND j.rate_limited) AS waiting,
                    CASE WHEN q.rate_window_start > now() - q.rate_period_ms * interval '1 millisecond' THEN q.rate_window_used ELSE 0 END AS rate_used,
                    CASE WHEN q.rate_window_start > now() - q.rate_period_ms * interval '1 millisecond'
                         THEN q.rate_window_start + q.rate_period_ms * interval '1 millisecond' END AS rate_resets_at,
                    CASE WHEN q.throttle_window_start > now() - q.throttle_period_ms * interval '1 millisecond'
                         THEN q.throttle_window_start + q.throttle_period_ms * interval '1 millisecond' END AS throttle_next
             FROM queues q
             WHERE (q.rate_max IS NOT NULL OR q.throttle_max IS NOT NULL OR q.concurrency_limit IS NOT NULL
                    OR (q.override_concurrency IS NOT NULL AND (q.override_expires_at IS NULL OR q.override_expires_at > now())))
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
                    override_limit: override_from_row(r)?,
                })
            })
            .collect()
    }

    /// When the queue's oldest waiting job became available.
    pub async fn oldest_available_at(&self, queue: &str) -> Result<Option<Timestamp>, StoreError> {
        let row = sqlx::query(
            "SELECT LEAST((SELECT min(COALESCE(enqueued_at, scheduled_at)) FROM jobs WHERE queue = $1 AND state = 'available' AND NOT rate_limited),
                          (SELECT min(COALESCE(enqueued_at, scheduled_at)) FROM jobs WHERE queue = $1 AND state = 'available' AND rate_limited)) AS t",
        )
            .bind(queue)
            .fetch_one(&self.pool)
            .await?;
        Ok(ts_opt(&row, "t")?)
    }
}

/// An operator's limit for a rate-limit key (OJS `PUT /rate-limits/{key}`), in force over
/// what its jobs set until `expires_at` (`None`: until removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RateLimitOverride {
    pub concurrency: u32,
    pub expires_at: Option<Timestamp>,
}

impl RateLimitOverride {
    /// The OJS shape: `{"concurrency", "expires_at"}` (`null`: until removed).
    pub fn to_json(&self) -> Value {
        json!({ "concurrency": self.concurrency, "expires_at": self.expires_at.map(|t| t.to_string()) })
    }

    /// Why this override cannot be set, naming its field: a concurrency over
    /// [`crate::job::MAX_RATE_LIMIT_CONCURRENCY`], or an end not in the future.
    fn validate(&self) -> Result<(), StoreError> {
        if self.concurrency > crate::job::MAX_RATE_LIMIT_CONCURRENCY {
            return Err(StoreError::invalid("concurrency", format!("must be at most {}", crate::job::MAX_RATE_LIMIT_CONCURRENCY)));
        }
        if let Some(t) = self.expires_at {
            crate::bounds::check_time(t).map_err(|r| StoreError::invalid("expires_at", r))?;
            if t <= Timestamp::now() {
                return Err(StoreError::invalid("expires_at", "must be in the future"));
            }
        }
        Ok(())
    }
}

/// A rate-limit key shared by jobs (OJS per-job `rate_limit`), and its state now. See
/// migrations/…_keyed_rate_limits.sql for how slots are admitted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyedRateLimit {
    pub key: String,
    /// The concurrency the key's jobs set (the newest enqueue naming one); `None`: none.
    pub concurrency: Option<u32>,
    /// An operator's override, while it lasts.
    pub override_limit: Option<RateLimitOverride>,
    /// Until when a handler's failure (`rate_limit_until`) holds the key: nothing is
    /// admitted before then.
    pub held_until: Option<Timestamp>,
    /// The limit in force now; `None`: every job of the key is admitted.
    pub in_force: Option<u32>,
    /// Jobs of the key running now.
    pub active: i64,
    /// Jobs admitted, `available`, that a worker has not yet claimed: they hold a slot.
    pub admitted: i64,
    /// Jobs `available` but waiting for a slot.
    pub waiting: i64,
    /// The key's rate window (the newest enqueue naming one set it): at most `limit` jobs
    /// admitted, so started, per `period`.
    pub rate: Option<Window>,
    /// Admissions counted in the current window, and when it ends (`None`: no window open).
    pub rate_used: i64,
    pub rate_window_resets_at: Option<Timestamp>,
    /// The key's throttle (the newest enqueue naming one set it): admissions, so starts, at
    /// least `period / limit` apart.
    pub throttle: Option<Window>,
    /// When the throttle admits the next job (`None`: now, or no throttle).
    pub throttle_next_allowed_at: Option<Timestamp>,
    pub updated_at: Timestamp,
}

impl KeyedRateLimit {
    /// Slots free now.
    pub fn free(&self) -> Option<i64> {
        self.in_force.map(|l| (i64::from(l) - self.active - self.admitted).max(0))
    }
}

const KEY_STATES: &str = "
SELECT r.key, r.concurrency, r.override_concurrency, r.override_expires_at, r.updated_at,
       (r.override_concurrency IS NOT NULL AND (r.override_expires_at IS NULL OR r.override_expires_at > now())) AS override_in_force,
       CASE WHEN r.held_until > now() THEN r.held_until END AS held_until,
       rebound_rate_limit_in_force(r) AS in_force,
       r.rate_max, r.rate_period_ms,
       COALESCE(r.rate_max - rebound_rate_limit_window_room(r), 0)::bigint AS rate_used,
       CASE WHEN rebound_rate_limit_window_room(r) < r.rate_max
            THEN r.rate_window_start + r.rate_period_ms * interval '1 millisecond' END AS rate_window_resets_at,
       r.throttle_max, r.throttle_period_ms,
       CASE WHEN rebound_rate_limit_throttle_room(r) = 0
            THEN r.throttle_window_start + rebound_rate_limit_spacing(r) END AS throttle_next_allowed_at,
       (SELECT count(*) FROM jobs j WHERE j.rate_limit_key = r.key AND j.state = 'active' AND NOT j.rate_limited) AS active,
       (SELECT count(*) FROM jobs j WHERE j.rate_limit_key = r.key AND j.state = 'available' AND NOT j.rate_limited) AS admitted,
       (SELECT count(*) FROM jobs j WHERE j.rate_limit_key = r.key AND j.state = 'available' AND j.rate_limited) AS waiting
FROM rate_limit_keys r
WHERE r.key = ANY($1)
ORDER BY r.key";

fn key_state_from_row(r: &PgRow) -> Result<KeyedRateLimit, StoreError> {
    let count = |c: Option<i32>| c.map(|c| u32::try_from(c).unwrap_or(0));
    let override_limit = override_from_row(r)?;
    Ok(KeyedRateLimit {
        key: r.try_get("key")?,
        concurrency: count(r.try_get("concurrency")?),
        override_limit,
        held_until: ts_opt(r, "held_until")?,
        in_force: count(r.try_get("in_force")?),
        active: r.try_get("active")?,
        admitted: r.try_get("admitted")?,
        waiting: r.try_get("waiting")?,
        rate: stored_window(r, "rate_max", "rate_period_ms")?,
        rate_used: r.try_get("rate_used")?,
        rate_window_resets_at: ts_opt(r, "rate_window_resets_at")?,
        throttle: stored_window(r, "throttle_max", "throttle_period_ms")?,
        throttle_next_allowed_at: ts_opt(r, "throttle_next_allowed_at")?,
        updated_at: super::ts(r, "updated_at")?,
    })
}

/// Keys with jobs waiting and, by a read without locks, a free slot and room in their rate
/// window and throttle (which admitted jobs no worker has claimed fill), or a waiting job to
/// drop (one another transaction held when its key was settled): the sweep settles these (a
/// window that ended leaves its waiting jobs to it).
const KEYS_TO_SETTLE: &str = "
SELECT w.key FROM rebound_rate_limit_waiting_keys() AS w(key) LEFT JOIN rate_limit_keys r ON r.key = w.key
CROSS JOIN LATERAL (
    SELECT count(*) AS holding, count(*) FILTER (WHERE j.state = 'available') AS admitted
    FROM jobs j WHERE j.rate_limit_key = w.key AND j.state IN ('available', 'active') AND NOT j.rate_limited) c
WHERE (((rebound_rate_limit_in_force(r) IS NULL OR c.holding < rebound_rate_limit_in_force(r))
         AND (r.rate_max IS NULL AND r.throttle_max IS NULL OR rebound_rate_limit_window_admits(r, c.admitted)))
       OR EXISTS (SELECT 1 FROM jobs j WHERE j.rate_limit_key = w.key AND j.state = 'available' AND j.rate_limited
                                         AND j.rate_limit_on_limit = 'drop' AND j.workflow_id IS NULL))
LIMIT $1";

impl Store {
    /// Up to `limit` of the rate-limit keys jobs have named (or an operator has limited), in
    /// key order (bytes), after `after` if given.
    pub async fn rate_limit_key_names(&self, after: Option<&str>, limit: i64) -> Result<Vec<String>, StoreError> {
        // Byte order ("C"), as the API merges these with the queues' names and pages by them.
        Ok(sqlx::query_scalar(r#"SELECT key FROM rate_limit_keys WHERE $1::text IS NULL OR key COLLATE "C" > $1 ORDER BY key COLLATE "C" LIMIT $2"#)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    /// How many rate-limit keys there are, and how many of them sort (by bytes) at or before
    /// `upto`.
    pub async fn rate_limit_key_count(&self, upto: Option<&str>) -> Result<(i64, i64), StoreError> {
        Ok(sqlx::query_as(r#"SELECT count(*), count(*) FILTER (WHERE key COLLATE "C" <= $1) FROM rate_limit_keys"#).bind(upto).fetch_one(&self.pool).await?)
    }

    /// The named keys' limits and state, in key order (unknown keys are left out).
    pub async fn rate_limit_keys(&self, keys: &[String]) -> Result<Vec<KeyedRateLimit>, StoreError> {
        let rows = sqlx::query(KEY_STATES).bind(keys).fetch_all(&self.pool).await?;
        rows.iter().map(key_state_from_row).collect()
    }

    /// One key's limit and state.
    pub async fn rate_limit_key(&self, key: &str) -> Result<Option<KeyedRateLimit>, StoreError> {
        Ok(self.rate_limit_keys(&[key.to_owned()]).await?.into_iter().next())
    }

    /// Sets (or with `None` removes) an operator's override of a key's limit, and brings the
    /// key to it in the same transaction: waiting jobs are admitted into new room, and
    /// admitted jobs no worker has claimed yet are held back when the limit falls below what
    /// holds (running jobs finish). Audited. A key no job has named yet is created, so a limit
    /// can be in place before its jobs come.
    pub async fn override_rate_limit(&self, key: &str, limit: Option<&RateLimitOverride>, actor: &Actor) -> Result<KeyedRateLimit, StoreError> {
        crate::job::validate_rate_limit_key(key, "key")?;
        if let Some(o) = limit {
            o.validate()?;
        }
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO rate_limit_keys (key, override_concurrency, override_expires_at) VALUES ($1, $2, $3)
             ON CONFLICT (key) DO UPDATE SET override_concurrency = EXCLUDED.override_concurrency,
                 override_expires_at = EXCLUDED.override_expires_at, updated_at = now()",
        )
        .bind(key)
        .bind(limit.map(|o| i32::try_from(o.concurrency).unwrap_or(i32::MAX)))
        .bind(limit.and_then(|o| o.expires_at).map(jiff_sqlx::Timestamp::from))
        .execute(&mut *tx)
        .await?;
        sqlx::query("SELECT rebound_rate_limit_settle($1)").bind(key).execute(&mut *tx).await?;
        let detail = limit.map(RateLimitOverride::to_json);
        record(&mut tx, actor, "rate_limit.override", Some(key), json!({ "override": detail })).await?;
        tx.commit().await?;
        self.rate_limit_key(key).await?.ok_or_else(|| StoreError::Missing { what: format!("rate-limit key {key}") })
    }

    /// The sweep: ends the overrides whose time is up (bringing their keys and queues to the
    /// limit in force again), then settles every key with jobs waiting and a slot free, one
    /// key per transaction. The statements that move keyed jobs settle their keys themselves;
    /// this catches what they could not (a waiting job another transaction held at that
    /// moment). Returns how many keys it settled and overrides it ended.
    pub async fn settle_rate_limits(&self, batch: i64) -> Result<u64, StoreError> {
        let queues_ended = self.end_queue_overrides().await?;
        let ended: i32 = sqlx::query_scalar("SELECT rebound_rate_limit_end_overrides()").fetch_one(&self.pool).await?;
        let keys: Vec<String> = sqlx::query_scalar(KEYS_TO_SETTLE).bind(batch.max(1)).fetch_all(&self.pool).await?;
        for key in &keys {
            sqlx::query("SELECT rebound_rate_limit_settle($1)").bind(key).execute(&self.pool).await?;
        }
        Ok(keys.len() as u64 + u64::try_from(ended).unwrap_or(0) + queues_ended)
    }
}

/// Writes a queue's limits (validated here; `None` removes them) and wakes its workers: a raised
/// or removed limit may free waiting jobs now. The rate and throttle windows start afresh
/// unless `keep_windows`.
async fn write_queue_limit(tx: &mut PgConnection, queue: &str, limit: Option<QueueRateLimit>, keep_windows: bool) -> Result<(), StoreError> {
    if let Some(l) = &limit {
        l.validate()?;
    }
    let l = limit.unwrap_or_default();
    let throttle_period = l.throttle.map(|w| millis(w.period) / i64::from(w.limit.max(1)));
    sqlx::query(
        "INSERT INTO queues (name, rate_limit, concurrency_limit, rate_max, rate_period_ms, throttle_max, throttle_period_ms, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, now())
         ON CONFLICT (name) DO UPDATE SET rate_limit = EXCLUDED.rate_limit, concurrency_limit = EXCLUDED.concurrency_limit,
             rate_max = EXCLUDED.rate_max, rate_period_ms = EXCLUDED.rate_period_ms,
             throttle_max = EXCLUDED.throttle_max, throttle_period_ms = EXCLUDED.throttle_period_ms,
             rate_window_start = CASE WHEN $8 THEN queues.rate_window_start END,
             rate_window_used = CASE WHEN $8 THEN queues.rate_window_used ELSE 0 END,
             throttle_window_start = CASE WHEN $8 THEN queues.throttle_window_start END,
             throttle_window_used = CASE WHEN $8 THEN queues.throttle_window_used ELSE 0 END,
             updated_at = now()",
    )
    .bind(queue)
    .bind(limit.map(|l| l.to_json()))
    .bind(l.concurrency.map(|c| i32::try_from(c).unwrap_or(i32::MAX)))
    .bind(l.rate.map(|w| i32::try_from(w.limit).unwrap_or(i32::MAX)))
    .bind(l.rate.map(|w| millis(w.period)))
    .bind(l.throttle.map(|_| 1i32))
    .bind(throttle_period)
    .bind(keep_windows)
    .execute(&mut *tx)
    .await?;
    notify_queues(&mut *tx, &[queue.to_owned()]).await?;
    Ok(())
}
