//! When the scheduler next has work: lets a maintenance loop sleep until the next scheduled or
//! retryable job is due, or a rate-limit window that keeps jobs waiting ends, instead of polling
//! on a fixed tick, so a retry due in 1 s becomes available at 1 s rather than up to a tick
//! later, and a key's throttle spaces its jobs by its own spacing.

use std::time::Duration;

use super::{Store, StoreError};

/// The shortest sleep of a scheduler after a pass that left no backlog: a little after a due
/// time, so the promotion's `now()` is past it, and long enough that retries falling due in a
/// steady stream are promoted in batches of many rather than a transaction (and a commit) each.
pub const SCHEDULER_MIN_WAIT: Duration = Duration::from_millis(20);

impl Store {
    /// How long a scheduler may sleep after a pass that left no backlog: until the next
    /// scheduled or retryable job is due or a rate-limit window that keeps jobs waiting ends
    /// (see [`Store::time_until_next_due`]; at least [`SCHEDULER_MIN_WAIT`]), at most `interval`
    /// (jobs scheduled by other processes are noticed within it); `interval` if the database
    /// cannot say (logged).
    pub async fn scheduler_wait(&self, interval: Duration) -> Duration {
        match self.time_until_next_due().await {
            Ok(Some(until)) => interval.min(until.max(SCHEDULER_MIN_WAIT)),
            Ok(None) => interval,
            Err(e) => {
                tracing::warn!(error = %e, "scheduler: cannot read when the next job is due; waiting one interval");
                interval
            }
        }
    }

    /// Time until the earliest `scheduled` or `retryable` job is due, or a rate-limit key's
    /// spent window (rate or throttle), hold or override ends while jobs wait for it, or a
    /// queue's override ends, by the database's clock; zero if one is already due, `None` if nothing is waiting for a time
    /// or maintenance mode is on (nothing is promoted while it is: once it is off, the pass
    /// after the scheduler's interval promotes what fell due).
    pub async fn time_until_next_due(&self) -> Result<Option<Duration>, StoreError> {
        // (LEAST passes over a NULL: nothing waiting of that kind.) A window that admitted
        // nothing new (its key's admitted jobs sit unclaimed in a paused queue) is not begun,
        // so has no end to wait for. A key's hold or override ending may free its waiting
        // jobs as a window's end does, and a queue's its queue's (the sweep clears it and wakes
        // the workers). In maintenance mode nothing is promoted or admitted, so
        // an overdue job must not wake the scheduler every SCHEDULER_MIN_WAIT until it ends.
        let ms: Option<f64> = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM (LEAST(
                 (SELECT min(scheduled_at) FROM jobs WHERE state IN ('scheduled', 'retryable')),
                 (SELECT min(LEAST(rebound_rate_limit_windows_end(r),
                                   CASE WHEN r.held_until > now() THEN r.held_until END,
                                   CASE WHEN r.override_expires_at > now() THEN r.override_expires_at END))
                  FROM rebound_rate_limit_waiting_keys() AS w(key) JOIN rate_limit_keys r ON r.key = w.key),
                 (SELECT min(override_expires_at) FROM queues)
             ) - now()))::float8 * 1000
             WHERE NOT EXISTS (SELECT 1 FROM maintenance)",
        )
        .fetch_optional(&self.pool)
        .await?
        .flatten();
        Ok(ms.map(|ms| if ms > 0.0 { Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX) } else { Duration::ZERO }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use crate::NewJob;
    use crate::testing::TestDb;

    #[tokio::test]
    async fn time_until_the_earliest_waiting_job() {
        let db = TestDb::new().await;
        let s = &db.store;
        assert_eq!(s.time_until_next_due().await.unwrap(), None);
        s.enqueue(NewJob::new("a", serde_json::json!([]))).await.unwrap();
        assert_eq!(s.time_until_next_due().await.unwrap(), None, "available jobs are not waiting");
        let mut later = NewJob::new("a", serde_json::json!([]));
        later.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600));
        s.enqueue(later).await.unwrap();
        let until = s.time_until_next_due().await.unwrap().unwrap();
        assert!(until > Duration::from_secs(3500) && until <= Duration::from_secs(3600), "{until:?}");
        let mut past = NewJob::new("a", serde_json::json!([]));
        past.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3));
        s.enqueue(past).await.unwrap();
        sqlx::query("UPDATE jobs SET scheduled_at = now() - interval '1 minute' WHERE state = 'scheduled' AND scheduled_at < now() + interval '1 minute'")
            .execute(s.pool())
            .await
            .unwrap();
        assert_eq!(s.time_until_next_due().await.unwrap(), Some(Duration::ZERO), "an overdue job is due now");
    }
}
