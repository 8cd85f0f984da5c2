//! The expirer: jobs whose `expires_at` passed before they ran are discarded
//! (`rebound.expired`) instead of running late.

use std::time::Duration;

use rebound_queue::{Store, StoreError};

use super::MaintenanceService;

pub struct Expirer {
    pub interval: Duration,
    pub batch: i64,
}

impl MaintenanceService for Expirer {
    fn name(&self) -> &'static str {
        "expirer"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self, store: &Store) -> Result<bool, StoreError> {
        let expired = store.expire_due(self.batch).await?;
        if expired > 0 {
            tracing::info!(expired, "discarded jobs that expired before they ran");
        }
        Ok(expired as i64 >= self.batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_queue::testing::TestDb;
    use rebound_queue::{JobState, NewJob};
    use serde_json::json;

    #[tokio::test]
    async fn discards_expired_jobs_that_never_ran() {
        let db = TestDb::new().await;
        let soon = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
        let mut expiring = NewJob::new("ttl.test", json!([]));
        expiring.expires_at = Some(soon);
        let expiring = db.store.enqueue(expiring).await.unwrap().job;
        let mut fresh = NewJob::new("ttl.test", json!([]));
        fresh.expires_at = Some(soon);
        let fresh = db.store.enqueue(fresh).await.unwrap().job;
        sqlx::query("UPDATE jobs SET expires_at = now() - interval '1 second' WHERE id = $1")
            .bind(expiring.id)
            .execute(db.store.pool())
            .await
            .unwrap();

        let expirer = Expirer { interval: Duration::from_millis(10), batch: 100 };
        assert!(!expirer.run_once(&db.store).await.unwrap());
        let gone = db.store.job(expiring.id).await.unwrap();
        assert_eq!(gone.state, JobState::Discarded);
        assert_eq!(gone.last_error.as_ref().and_then(|e| e["type"].as_str()), Some("rebound.expired"));
        assert_eq!(db.store.job(fresh.id).await.unwrap().state, JobState::Available);
    }
}
