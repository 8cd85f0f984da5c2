//! The rescuer: active jobs whose lock expired (the worker crashed, was killed, or lost the
//! database for longer than the visibility timeout) become a failed attempt
//! `rebound.stalled` and run again at once if their policy allows; jobs past their own
//! `timeout_ms` become `rebound.timeout` with normal backoff.

use std::time::Duration;

use rebound_queue::{Store, StoreError};

use super::MaintenanceService;

pub struct Rescuer {
    pub interval: Duration,
    pub batch: i64,
}

impl MaintenanceService for Rescuer {
    fn name(&self) -> &'static str {
        "rescuer"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self, store: &Store) -> Result<bool, StoreError> {
        let report = store.rescue_expired(self.batch).await?;
        if report.stalled + report.timed_out > 0 {
            tracing::warn!(stalled = report.stalled, timed_out = report.timed_out, "rescued jobs whose worker stopped heartbeating");
        }
        Ok((report.stalled + report.timed_out) as i64 >= self.batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_queue::store::ClaimRequest;
    use rebound_queue::testing::TestDb;
    use rebound_queue::{JobState, NewJob};
    use serde_json::json;

    #[tokio::test]
    async fn expired_locks_become_stalled_attempts_and_run_again() {
        let db = TestDb::new().await;
        let job = db.store.enqueue(NewJob::new("rescue.test", json!([]))).await.unwrap().job;
        let claim = |vis: u64| ClaimRequest {
            worker_id: "crashed-worker".into(),
            queues: vec!["default".into()],
            limit: 1,
            visibility_timeout: Duration::from_millis(vis),
        };
        let claimed = db.store.claim(&claim(1)).await.unwrap();
        assert_eq!(claimed.len(), 1);
        let live = db.store.enqueue(NewJob::new("rescue.test", json!([]))).await.unwrap().job;
        db.store.claim(&claim(60_000)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;

        let rescuer = Rescuer { interval: Duration::from_millis(10), batch: 100 };
        assert!(!rescuer.run_once(&db.store).await.unwrap());
        let rescued = db.store.job(job.id).await.unwrap();
        // A crash is no evidence against the job: it is due again at once, attempt counted.
        assert_eq!(rescued.state, JobState::Available);
        assert_eq!(rescued.attempt, 1);
        let attempts = db.store.attempts(job.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].error_type.as_deref(), Some("rebound.stalled"));
        assert_eq!(attempts[0].worker_id.as_deref(), Some("crashed-worker"));
        // A job whose lock is still valid is left alone.
        assert_eq!(db.store.job(live.id).await.unwrap().state, JobState::Active);
    }
}
