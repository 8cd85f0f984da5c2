//! When the scheduler next has work: lets a maintenance loop sleep until the next scheduled or
//! retryable job is due, or a rate-limit window that keeps jobs waiting ends, instead of polling
//! on a fixed tick, so a retry due in 1 s becomes available at 1 s rather than up to a tick
//! later, and a key's throttle spaces its jobs by its own spacing (down to a millisecond).

use std::time::Duration;

use super::{Store, StoreError};

/// The shortest sleep of a scheduler after a pass that left no backlog, when a job falls due
/// next: a little after its due time, so the promotion's `now()` is past it, and long enough
/// that retries falling due in a steady stream are promoted in batches of many rather than a
/// transaction (and a commit) each.
pub const SCHEDULER_MIN_WAIT: Duration = Duration::from_millis(20);

/// The shortest sleep when a rate-limit window, hold or override ends next: each end admits
/// what it admits (a throttle one job), so waiting longer would batch nothing and only stretch
/// a spacing under [`SCHEDULER_MIN_WAIT`] to it.
pub const LIMIT_MIN_WAIT: Duration = Duration::from_millis(1);

/// When the scheduler next has work, by kind (see [`Store::next_waits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextWaits {
    /// Until the earliest `scheduled` or `retryable` job is due (zero if one is).
    pub job_due: Option<Duration>,
    /// Until the earliest end of a rate-limit key's spent window, hold or override while jobs
    /// wait for it, or of a queue's override (zero if one is over and not yet cleared).
    pub limit_ends: Option<Duration>,
}

impl NextWaits {
    /// How long a scheduler may sleep: until the earlier of the two, the job's at least
    /// [`SCHEDULER_MIN_WAIT`], the end's at least [`LIMIT_MIN_WAIT`] (but an end already past,
    /// an override its pass has not cleared yet, [`SCHEDULER_MIN_WAIT`] too: should the pass
    /// keep failing to clear it, it is not retried every millisecond), at most `interval`.
    pub fn wait(&self, interval: Duration) -> Duration {
        let due = self.job_due.map(|d| d.max(SCHEDULER_MIN_WAIT));
        let ends = self.limit_ends.map(|d| if d.is_zero() { SCHEDULER_MIN_WAIT } else { d.max(LIMIT_MIN_WAIT) });
        [due, ends].into_iter().flatten().fold(interval, Duration::min)
    }

    /// The earlier of the two.
    pub fn earliest(&self) -> Option<Duration> {
        match (self.job_due, self.limit_ends) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Store {
    /// How long a scheduler may sleep after a pass that left no backlog: until the next
    /// scheduled or retryable job is due (at least [`SCHEDULER_MIN_WAIT`]) or a rate-limit
    /// window, hold or override that keeps jobs waiting ends (at least [`LIMIT_MIN_WAIT`]; see
    /// [`Store::next_waits`]), at most `interval` (jobs scheduled by other processes are
    /// noticed within it); `interval` if the database cannot say (logged).
    pub async fn scheduler_wait(&self, interval: Duration) -> Duration {
        match self.next_waits().await {
            Ok(w) => w.wait(interval),
            Err(e) => {
                tracing::warn!(error = %e, "scheduler: cannot read when the next job is due; waiting one interval");
                interval
            }
        }
    }

    /// Time until the scheduler next has work ([`NextWaits::earliest`] of
    /// [`Store::next_waits`]): zero if a job is already due (or a queue's override is over and
    /// not yet cleared), `None` if nothing waits for a time or maintenance mode is on.
    pub async fn time_until_next_due(&self) -> Result<Option<Duration>, StoreError> {
        Ok(self.next_waits().await?.earliest())
    }

    /// Time until the earliest `scheduled` or `retryable` job is due, and until a rate-limit
    /// key's spent window (rate or throttle), hold or override ends while jobs wait for it, or
    /// a queue's override ends, by the database's clock; nothing at all in maintenance mode
    /// (nothing is promoted while it is: once it is off, the pass after the scheduler's
    /// interval promotes what fell due).
    pub async fn next_waits(&self) -> Result<NextWaits, StoreError> {
        // (LEAST passes over a NULL: nothing waiting of that kind.) A window that admitted
        // nothing new (its key's admitted jobs sit unclaimed in a paused queue) is not begun,
        // so has no end to wait for. A key's hold or override ending may free its waiting
        // jobs as a window's end does, and a queue's its queue's (the sweep clears it and wakes
        // the workers). In maintenance mode nothing is promoted or admitted, so an overdue
        // job must not wake the scheduler every SCHEDULER_MIN_WAIT until it ends. A job not
        // yet due is waited for until its time (a retry's queue is then told of it); a pass
        // promotes every job already due but a retry within its claim window (or one a claim
        // holds locked), so such a retry is waited for until its window ends. Jobs already due
        // after a pass are few (a window's worth), so that minimum reads few rows.
        let row: Option<(Option<f64>, Option<f64>)> = sqlx::query_as(
            "SELECT EXTRACT(EPOCH FROM (LEAST(
                        (SELECT min(scheduled_at) FROM jobs WHERE state IN ('scheduled', 'retryable') AND scheduled_at > now()),
                        (SELECT min(CASE WHEN state = 'retryable' AND rate_limit_key IS NULL
                                         THEN scheduled_at + $1 * interval '1 millisecond' ELSE scheduled_at END)
                         FROM jobs WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= now())
                    ) - now()))::float8 * 1000,
                    EXTRACT(EPOCH FROM (LEAST(
                        (SELECT min(LEAST(rebound_rate_limit_windows_end(r),
                                          CASE WHEN r.held_until > now() THEN r.held_until END,
                                          CASE WHEN r.override_expires_at > now() THEN r.override_expires_at END))
                         FROM rebound_rate_limit_waiting_keys() AS w(key) JOIN rate_limit_keys r ON r.key = w.key),
                        (SELECT min(override_expires_at) FROM queues)
                    ) - now()))::float8 * 1000
             WHERE NOT EXISTS (SELECT 1 FROM maintenance)",
        )
        .bind(super::millis(super::RETRY_CLAIM_WINDOW))
        .fetch_optional(&self.pool)
        .await?;
        let wait = |ms: Option<f64>| ms.map(|ms| if ms > 0.0 { Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX) } else { Duration::ZERO });
        Ok(row.map(|(due, ends)| NextWaits { job_due: wait(due), limit_ends: wait(ends) }).unwrap_or_default())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use super::{LIMIT_MIN_WAIT, NextWaits, SCHEDULER_MIN_WAIT};

    #[test]
    fn each_kind_of_wait_keeps_its_own_floor() {
        let second = Duration::from_secs(1);
        let ms = Duration::from_millis;
        let w = |job_due, limit_ends| NextWaits { job_due, limit_ends }.wait(second);
        assert_eq!(w(None, None), second, "nothing waiting: the interval");
        assert_eq!(w(Some(Duration::ZERO), None), SCHEDULER_MIN_WAIT, "due jobs are promoted in batches");
        assert_eq!(w(Some(ms(5)), None), SCHEDULER_MIN_WAIT);
        assert_eq!(w(None, Some(ms(5))), ms(5), "a spacing's end is waited for, not stretched");
        assert_eq!(w(None, Some(Duration::from_micros(10))), LIMIT_MIN_WAIT);
        assert_eq!(w(None, Some(Duration::ZERO)), SCHEDULER_MIN_WAIT, "an end past, not yet cleared, is not a spin");
        assert_eq!(w(Some(ms(5)), Some(ms(7))), ms(7), "the earlier, each floored");
        assert_eq!(w(Some(ms(50)), Some(ms(3))), ms(3));
        assert_eq!(w(None, Some(Duration::from_secs(60))), second, "at most the interval");
    }

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
