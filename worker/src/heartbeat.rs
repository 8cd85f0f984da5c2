//! Heartbeats: extends the lock of every held job, and the worker's own row in `workers`.
//!
//! One `UPDATE … WHERE id = ANY(…)` covers every held job, however many. The interval is
//! the configured one but at most a third of the shortest visibility timeout among held jobs,
//! so a lock survives two failed heartbeats. A job the database no longer reports as ours
//! (cancelled by an operator, rescued after a long stall) is marked lost, which stops its
//! handler; whatever it would have written would be refused anyway.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rebound_queue::Store;
use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::StoreError;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::running::RunningJobs;

/// The floor of the heartbeat interval, so a tiny visibility timeout cannot spin the loop.
const MIN_INTERVAL: Duration = Duration::from_millis(50);

pub struct Heartbeat {
    pub store: Store,
    pub worker_id: String,
    pub running: Arc<RunningJobs>,
    pub interval: Duration,
    pub retry: StorageRetry,
    /// Reported in the registry so the dashboard shows a draining worker.
    pub stopping: Arc<AtomicBool>,
}

impl Heartbeat {
    /// The wait before the next heartbeat, given what is held now.
    pub fn next_interval(&self) -> Duration {
        let by_visibility = self.running.shortest_visibility().map(|v| v / 3).unwrap_or(self.interval);
        self.interval.min(by_visibility).max(MIN_INTERVAL)
    }

    /// Beats until `stop` fires.
    pub async fn run(self, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.next_interval()) => {}
            }
            if let Err(e) = self.beat_jobs(&stop).await {
                if matches!(e, StoreError::Cancelled) {
                    return;
                }
                tracing::warn!(error = %e, held = self.running.len(), "could not extend job locks; trying again at the next heartbeat");
            }
            let running = i32::try_from(self.running.len()).unwrap_or(i32::MAX);
            let stopping = self.stopping.load(Ordering::Relaxed);
            match self.retry.run("worker heartbeat", &stop, || self.store.worker_heartbeat(&self.worker_id, running, stopping)).await {
                Ok(()) | Err(StoreError::Cancelled) => {}
                Err(e) => tracing::warn!(error = %e, "could not record the worker heartbeat"),
            }
        }
    }

    /// Extends every held job's lock once; marks the ones that are no longer ours as lost.
    pub async fn beat_jobs(&self, cancel: &CancellationToken) -> Result<(), StoreError> {
        let held = self.running.snapshot();
        if held.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = held.iter().map(|(id, _)| *id).collect();
        let extended: HashSet<Uuid> = self
            .retry
            .run("heartbeat", cancel, || self.store.heartbeat(Some(&self.worker_id), &ids, None))
            .await?
            .into_iter()
            .collect();
        let lost: Vec<(Uuid, i32)> = held.into_iter().filter(|(id, _)| !extended.contains(id)).collect();
        if !lost.is_empty() {
            // A job written back between the snapshot and the update also shows up here; its
            // entry is already gone, so marking it lost does nothing.
            self.running.lose(&lost);
        }
        Ok(())
    }
}
