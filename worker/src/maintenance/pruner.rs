//! The pruner: retention. Completed jobs and plain discards go after configurable ages; dead
//! letters after 180 days or beyond 10 000 per queue (oldest first) by default; workers that
//! have been silent for a day are forgotten. Deletes run in bounded batches so pruning never
//! holds long locks, and a pass that hit its batch limit is followed by another at once.
//! Audit entries (a year), cron runs (30 days) and the events' log of finished jobs (with the
//! jobs it names) age out the same way; policy snapshots no attempt refers to any more are
//! swept once a day (it reads the whole attempt history).

use std::time::Duration;

use rebound_queue::retention::RetentionPass;
use rebound_queue::store::PruneConfig;
use rebound_queue::{Store, StoreError};

use super::MaintenanceService;

/// Retention as one of the worker's maintenance services (the pass itself is the queue
/// crate's, which the server runs too when it prunes).
pub struct Pruner {
    pub interval: Duration,
    pub pass: RetentionPass,
}

impl Pruner {
    pub fn new(interval: Duration, retention: PruneConfig) -> Pruner {
        Pruner { interval, pass: RetentionPass::new(retention) }
    }
}

impl MaintenanceService for Pruner {
    fn name(&self) -> &'static str {
        "pruner"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self, store: &Store) -> Result<bool, StoreError> {
        self.pass.run(store).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_queue::store::{ClaimRequest, Completion, Failure};
    use rebound_queue::testing::TestDb;
    use rebound_queue::{HandlerError, NewJob, Outcome};
    use serde_json::json;

    async fn run_one(db: &TestDb, outcome: Option<Outcome>) -> uuid::Uuid {
        let job = db.store.enqueue(NewJob::new("prune.test", json!([]))).await.unwrap().job;
        let claim = ClaimRequest { worker_id: "w".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        let claimed = db.store.claim(&claim).await.unwrap();
        assert_eq!(claimed[0].id, job.id);
        match outcome {
            None => {
                db.store.complete(&Completion { id: job.id, attempt: Some(1), worker_id: None, started_at: None, result: None }).await.unwrap();
            }
            Some(outcome) => {
                db.store.fail(&Failure { id: job.id, attempt: Some(1), worker_id: None, outcome, error_code: None }).await.unwrap();
            }
        }
        job.id
    }

    #[tokio::test]
    async fn retention_by_age_and_dead_letter_cap() {
        let db = TestDb::new().await;
        let completed = run_one(&db, None).await;
        let discarded = run_one(&db, Some(Outcome::Discard(HandlerError::new("x.y", "no")))).await;
        let mut dead = Vec::new();
        for _ in 0..3 {
            dead.push(run_one(&db, Some(Outcome::DeadLetter(HandlerError::new("x.y", "dead")))).await);
            // Distinct dead_lettered_at, so "oldest first" is well defined.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // Nothing is old enough under the defaults.
        let keep = Pruner::new(Duration::from_secs(60), PruneConfig::default());
        assert!(!keep.run_once(&db.store).await.unwrap());
        assert!(db.store.get_job(completed).await.unwrap().is_some());

        let retention = PruneConfig {
            completed_after: Duration::ZERO,
            discarded_after: Duration::ZERO,
            dead_letters_per_queue: 2,
            ..PruneConfig::default()
        };
        let pruner = Pruner::new(Duration::from_secs(60), retention);
        assert!(!pruner.run_once(&db.store).await.unwrap());
        assert!(db.store.get_job(completed).await.unwrap().is_none());
        assert!(db.store.get_job(discarded).await.unwrap().is_none());
        // The oldest dead letter beyond the cap of 2 went; the newer two stay for re-drive.
        assert!(db.store.get_job(dead[0]).await.unwrap().is_none());
        assert!(db.store.get_job(dead[1]).await.unwrap().is_some());
        assert!(db.store.get_job(dead[2]).await.unwrap().is_some());

        // A full batch asks for another pass at once.
        let batch_of_one = Pruner::new(Duration::from_secs(60), PruneConfig { batch: 1, dead_letters_per_queue: 0, ..pruner.pass.config.clone() });
        assert!(batch_of_one.run_once(&db.store).await.unwrap());
    }
}
