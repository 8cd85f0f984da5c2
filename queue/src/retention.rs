//! One pass of retention as the pruning leader runs it, worker or server: the bounded deletes
//! of [`Store::prune`], and once a day the sweep of policy snapshots no attempt refers to.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::{PruneConfig, PruneReport, Store, StoreError};

/// How often unreferenced policy snapshots are swept.
const SNAPSHOT_SWEEP_EVERY: Duration = Duration::from_secs(24 * 3600);
/// How soon a sweep that failed (a lock not had within its timeout, say) is tried again.
const SNAPSHOT_SWEEP_RETRY: Duration = Duration::from_secs(3600);

/// Retention's passes, with the memory of when the snapshots were last swept.
#[derive(Debug)]
pub struct RetentionPass {
    /// What is kept, and how much a statement deletes.
    pub config: PruneConfig,
    snapshots_swept: Mutex<Option<Instant>>,
}

impl RetentionPass {
    /// A pass keeping what `config` says; the first [`RetentionPass::run`] sweeps snapshots.
    pub fn new(config: PruneConfig) -> RetentionPass {
        RetentionPass { config, snapshots_swept: Mutex::new(None) }
    }

    /// Prunes one batch of everything that has aged out, and sweeps the snapshots when a day
    /// has passed since the last sweep. True when a batch was full: more may be waiting, and
    /// the caller should run again at once rather than after its interval.
    pub async fn run(&self, store: &Store) -> Result<bool, StoreError> {
        let report = store.prune(&self.config).await?;
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
        let batch = self.config.batch.max(1) as u64;
        r.completed >= batch || r.discarded >= batch || r.dead_letters >= batch || r.audit >= batch || r.cron_runs >= batch || r.transitions >= batch || r.heartbeats >= batch || r.progress >= batch || r.worker_events >= batch || r.dead_letter_events >= batch
            || r.workflows >= batch || r.workflow_events >= batch || r.rate_limit_events >= batch || r.rate_limit_keys >= batch
    }
}
