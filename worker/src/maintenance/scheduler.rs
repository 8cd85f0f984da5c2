//! The scheduler: moves due `scheduled` and `retryable` jobs to `available` (and notifies
//! their queues), so retries and scheduled jobs start within one interval of being due.

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
        Ok(promoted as i64 >= self.batch)
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
}
