//! The scheduler: moves due `scheduled` and `retryable` jobs to `available` (and notifies
//! their queues), and admits jobs waiting for a rate-limit slot that has come free. Between passes it sleeps until the next waiting job is due, if that comes
//! before the interval: a retry due in 1 s becomes available at about 1 s, not up to an
//! interval later (the interval still bounds how late a job scheduled by another process is
//! noticed).

use std::time::Duration;

use rebound_queue::{Store, StoreError};

use super::MaintenanceService;


pub struct Scheduler {
    pub interval: Duration,
    /// Jobs promoted per statement.
    pub batch: i64,
}

impl MaintenanceService for Scheduler {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self, store: &Store) -> Result<bool, StoreError> {
        let promoted = store.promote_due(self.batch).await?;
        if promoted > 0 {
            tracing::debug!(promoted, "scheduler promoted due jobs");
        }
        // Jobs waiting for a rate-limit slot are admitted by the statements that free one;
        // this admits those they could not reach (see `Store::settle_rate_limits`).
        let settled = store.settle_rate_limits(self.batch).await?;
        if settled > 0 {
            tracing::debug!(settled, "scheduler settled rate-limit keys with free slots");
        }
        Ok(promoted as i64 >= self.batch || settled as i64 >= self.batch)
    }

    async fn next_wait(&self, store: &Store) -> Duration {
        store.scheduler_wait(self.interval).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_queue::testing::TestDb;
    use rebound_queue::{JobState, NewJob};
    use serde_json::json;

    #[tokio::test]
    async fn promotes_due_jobs_only() {
        let db = TestDb::new().await;
        let later = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
        let mut due = NewJob::new("sched.test", json!([1]));
        due.scheduled_at = Some(later);
        let mut not_due = NewJob::new("sched.test", json!([2]));
        not_due.scheduled_at = Some(later);
        let due = db.store.enqueue(due).await.unwrap().job;
        let not_due = db.store.enqueue(not_due).await.unwrap().job;
        assert_eq!(due.state, JobState::Scheduled);
        sqlx::query("UPDATE jobs SET scheduled_at = now() - interval '1 second' WHERE id = $1")
            .bind(due.id)
            .execute(db.store.pool())
            .await
            .unwrap();

        let scheduler = Scheduler { interval: Duration::from_millis(10), batch: 1 };
        // A batch of one hits its limit: the pass asks to be run again at once.
        assert!(scheduler.run_once(&db.store).await.unwrap());
        assert_eq!(db.store.job(due.id).await.unwrap().state, JobState::Available);
        assert_eq!(db.store.job(not_due.id).await.unwrap().state, JobState::Scheduled);
        assert!(!scheduler.run_once(&db.store).await.unwrap());
    }

    #[tokio::test]
    async fn sleeps_until_the_next_job_is_due_not_a_whole_interval() {
        let db = TestDb::new().await;
        let scheduler = Scheduler { interval: Duration::from_secs(60), batch: 100 };
        assert_eq!(scheduler.next_wait(&db.store).await, Duration::from_secs(60), "nothing waiting: one interval");
        let mut soon = NewJob::new("sched.test", json!([1]));
        let mut later = NewJob::new("sched.test", json!([0]));
        later.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(30));
        let later = db.store.enqueue(later).await.unwrap().job;
        let wait = scheduler.next_wait(&db.store).await;
        assert!(wait > Duration::from_secs(20) && wait <= Duration::from_secs(30), "until the job is due: {wait:?}");
        db.store.cancel(later.id, None).await.unwrap();
        soon.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(2));
        let soon = db.store.enqueue(soon).await.unwrap().job;

        // Run as the leader runs it: the job is available soon after it is due, long before
        // the minute's interval.
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(crate::maintenance::run_service(scheduler, db.store.clone(), stop.clone()));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while db.store.job(soon.id).await.unwrap().state != JobState::Available {
            assert!(std::time::Instant::now() < deadline, "not promoted within 20 s of a 60 s interval");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        task.await.unwrap();
        // An overdue job: the shortest wait, not zero (the pass that finds it comes next).
        let mut overdue = NewJob::new("sched.test", json!([2]));
        overdue.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600));
        let overdue = db.store.enqueue(overdue).await.unwrap().job;
        sqlx::query("UPDATE jobs SET scheduled_at = now() - interval '1 minute' WHERE id = $1").bind(overdue.id).execute(db.store.pool()).await.unwrap();
        let scheduler = Scheduler { interval: Duration::from_secs(60), batch: 100 };
        assert_eq!(scheduler.next_wait(&db.store).await, rebound_queue::store::SCHEDULER_MIN_WAIT);
    }
}
