//! The pruner: retention. Completed jobs and plain discards go after configurable ages; dead
//! letters after 180 days or beyond 10 000 per queue (oldest first) by default; workers that
//! have been silent for a day are forgotten. Deletes run in bounded batches so pruning never
//! holds long locks, and a pass that hit its batch limit is followed by another at once.
//! Audit entries (a year), cron runs (30 days) and the events' log of finished jobs (with the
//! jobs it names) age out the same way; policy snapshots no attempt refers to any more are
//! swept once a day (it reads the whole attempt history).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rebound_queue::store::{PruneConfig, PruneReport};
use rebound_queue::{Store, StoreError};

use super::MaintenanceService;

pub struct Pruner {
    pub interval: Duration,
    pub retention: PruneConfig,
    snapshots_swept: Mutex<Option<Instant>>,
}

/// How often unreferenced policy snapshots are swept.
const SNAPSHOT_SWEEP_EVERY: Duration = Duration::from_secs(24 * 3600);
/// How soon a sweep that failed (a lock not had within its timeout, say) is tried again.
const SNAPSHOT_SWEEP_RETRY: Duration = Duration::from_secs(3600);

impl Pruner {
    pub fn new(interval: Duration, retention: PruneConfig) -> Pruner {
        Pruner { interval, retention, snapshots_swept: Mutex::new(None) }
    }

    /// True (and remembered) when the daily snapshot sweep is due.
    fn snapshot_sweep_due(&self) -> bool {
        let Ok(mut last) = self.snapshots_swept.lock() else { return false };
        if last.is_some_and(|at| at.elapsed() < SNAPSHOT_SWEEP_EVERY) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// Makes the next sweep due within [`SNAPSHOT_SWEEP_RETRY`] rather than a day.
    fn sweep_again_soon(&self) {
        if let Ok(mut last) = self.snapshots_swept.lock() {
            *last = Instant::now().checked_sub(SNAPSHOT_SWEEP_EVERY - SNAPSHOT_SWEEP_RETRY);
        }
    }

    /// Whether a pass deleted a full batch of something.
    fn hit_limit(&self, r: &PruneReport) -> bool {
        let batch = self.retention.batch.max(1) as u64;
        r.completed >= batch || r.discarded >= batch || r.dead_letters >= batch || r.audit >= batch || r.cron_runs >= batch || r.transitions >= batch || r.heartbeats >= batch || r.progress >= batch || r.worker_events >= batch || r.dead_letter_events >= batch
            || r.workflows >= batch || r.workflow_events >= batch || r.rate_limit_events >= batch || r.rate_limit_keys >= batch
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
        let report = store.prune(&self.retention).await?;
        if report != PruneReport::default() {
            tracing::info!(completed = report.completed, discarded = report.discarded, dead_letters = report.dead_letters,
                workers = report.workers, audit = report.audit, cron_runs = report.cron_runs, transitions = report.transitions, heartbeats = report.heartbeats, progress = report.progress, worker_events = report.worker_events,
                dead_letter_events = report.dead_letter_events, workflows = report.workflows, workflow_events = report.workflow_events, rate_limit_events = report.rate_limit_events, rate_limit_keys = report.rate_limit_keys, "pruned old jobs");
        }
        // A failed sweep is reported here, not returned: the pass above has pruned, and whether
        // it left a backlog to go on with at once must not be lost with the sweep's error.
        if self.snapshot_sweep_due() {
            match store.prune_policy_snapshots().await {
                Ok(0) => {}
                Ok(swept) => tracing::info!(policy_snapshots = swept, "pruned policy snapshots no attempt refers to"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not sweep the policy snapshots; trying again within the hour");
                    self.sweep_again_soon();
                }
            }
        }
        Ok(self.hit_limit(&report))
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
        let batch_of_one = Pruner::new(Duration::from_secs(60), PruneConfig { batch: 1, dead_letters_per_queue: 0, ..pruner.retention.clone() });
        assert!(batch_of_one.run_once(&db.store).await.unwrap());
    }
}
