//! Heartbeats: one statement ([`Store::worker_beat`]) extends the lock of every held job,
//! hands back the lapsed jobs locked under this worker's id that it does not know (claims
//! whose answer was lost: see [`crate::orphans`]), and records the worker's own heartbeat and
//! status in `workers`. One statement, so the worker's row is never fresher than its locks.
//!
//! The interval is the configured one but at most a third of the shortest visibility timeout
//! among held jobs, so a lock survives two failed heartbeats. A job the database no longer
//! reports as ours (cancelled by an operator, rescued after a long stall) is marked lost,
//! which stops its handler; whatever it would have written would be refused anyway. A worker
//! whose row is gone (pruned while the worker was cut off, or deleted by hand) registers again.
//!
//! The answer also carries what an operator asked of the worker from the dashboard or the OJS
//! admin API: `quiet` stops its claims (running jobs finish; the worker stays up, holding no
//! work, until it is stopped), `terminate` shuts it down as SIGTERM does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rebound_queue::Store;
use rebound_queue::StoreError;
use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::store::{WorkerBeat, WorkerRegistration};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::completer::ResultBacklog;
use crate::health::Health;
use crate::orphans::Orphans;
use crate::running::RunningJobs;
use crate::usage::UsageMeter;

/// The floor of the heartbeat interval, so a tiny visibility timeout cannot spin the loop.
const MIN_INTERVAL: Duration = Duration::from_millis(50);

/// The longest a heartbeat waits to learn which abandoned runs have ended (claims wait
/// meanwhile).
const ABANDONED_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the beat that reports a shutdown may outlast the heartbeats' stop.
const FINAL_BEAT_GRACE: Duration = Duration::from_secs(2);

pub struct Heartbeat {
    pub store: Store,
    pub registration: WorkerRegistration,
    pub running: Arc<RunningJobs>,
    pub interval: Duration,
    pub retry: StorageRetry,
    /// Reported in the registry so the dashboard shows a draining worker.
    pub stopping: Arc<AtomicBool>,
    pub health: Arc<Health>,
    pub backlog: Arc<ResultBacklog>,
    pub orphans: Arc<Orphans>,
    /// Cancelled to stop the claim loops (an operator's `quiet`).
    pub quiet: CancellationToken,
    /// The worker's shutdown (an operator's `terminate`).
    pub terminate: CancellationToken,
    /// Memory and CPU, reported with each beat (CPU since the previous one).
    pub usage: std::sync::Mutex<UsageMeter>,
}

impl Heartbeat {
    /// The wait before the next heartbeat, given what is held now.
    pub fn next_interval(&self) -> Duration {
        let by_visibility = self.running.shortest_visibility().map(|v| v / 3).unwrap_or(self.interval);
        self.interval.min(by_visibility).max(MIN_INTERVAL)
    }

    /// Beats until `stop` fires.
    pub async fn run(self, stop: CancellationToken) {
        // Going quiet or shutting down is reported at once, not at the next interval: the
        // dashboard and the OJS `worker.quiet` event see a drain shorter than an interval too.
        let (mut quiet_told, mut stopping_told) = (false, false);
        // The beat that reports the drain must land even when the drain ends first (an idle
        // worker's takes milliseconds and then stops the heartbeats), but must not hold up
        // the shutdown for long when the database is away: it gets FINAL_BEAT_GRACE past `stop`.
        let final_cancel = CancellationToken::new();
        {
            let (stop, final_cancel) = (stop.clone(), final_cancel.clone());
            tokio::spawn(async move {
                stop.cancelled().await;
                tokio::time::sleep(FINAL_BEAT_GRACE).await;
                final_cancel.cancel();
            });
        }
        loop {
            let mut cancel = &stop;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.quiet.cancelled(), if !quiet_told => quiet_told = true,
                _ = self.terminate.cancelled(), if !stopping_told => {
                    stopping_told = true;
                    cancel = &final_cancel;
                }
                _ = tokio::time::sleep(self.next_interval()) => {}
            }
            match self.beat(cancel).await {
                Ok(()) | Err(StoreError::Cancelled) => {}
                Err(e) => tracing::warn!(error = %e, held = self.running.len(),
                    "could not send the heartbeat (job locks, worker row); trying again at the next one"),
            }
        }
    }

    /// Forgets the abandoned runs (see [`RunningJobs::abandon`]) whose jobs are no longer
    /// locked under this worker's id (the rescuer has counted them), so the set does not grow
    /// for the life of the process. Called with claims kept out: a job not locked here now
    /// cannot become so again but by a claim. A failed or slow read (claims wait for it, so it
    /// gets [`ABANDONED_CHECK_TIMEOUT`]) or a cancelled one keeps them all until next time.
    async fn forget_ended_abandoned_runs(&self, cancel: &CancellationToken) {
        let abandoned = self.running.abandoned();
        if abandoned.is_empty() {
            return;
        }
        // A read only: dropping it mid-flight leaves nothing half-done.
        let read = tokio::time::timeout(ABANDONED_CHECK_TIMEOUT, self.store.jobs_locked_by(&self.registration.id, &abandoned));
        let still = tokio::select! {
            _ = cancel.cancelled() => return,
            r = read => r,
        };
        match still {
            Ok(Ok(still)) => self.running.forget_abandoned(&abandoned, &still),
            Ok(Err(e)) => tracing::debug!(error = %e, abandoned = abandoned.len(), "could not read which abandoned runs have ended; keeping them until the next heartbeat"),
            Err(_) => tracing::debug!(abandoned = abandoned.len(), "reading which abandoned runs have ended took too long; keeping them until the next heartbeat"),
        }
    }

    /// One heartbeat; marks the held jobs that are no longer ours as lost.
    pub async fn beat(&self, cancel: &CancellationToken) -> Result<(), StoreError> {
        // No claim may land between the snapshot below and the statement's answer, however
        // long the statement waits for a connection (see `crate::orphans`).
        let _no_claims = self.orphans.exclusive().await;
        let held = self.running.snapshot();
        let held_ids: Vec<Uuid> = held.iter().map(|(id, _)| *id).collect();
        let known = self.running.known();
        // The shutdown token fires before the runtime sets `stopping`: either means draining.
        let stopping = self.stopping.load(Ordering::Relaxed) || self.terminate.is_cancelled();
        let (status, detail) = self.health.status(stopping, self.quiet.is_cancelled(), self.backlog.len());
        // A poisoned meter only means a panic mid-reading: its state is still two numbers.
        let usage = self.usage.lock().unwrap_or_else(std::sync::PoisonError::into_inner).sample();
        let beat = WorkerBeat {
            worker_id: &self.registration.id,
            held: &held_ids,
            known: &known,
            running: i32::try_from(held_ids.len()).unwrap_or(i32::MAX),
            status,
            detail: detail.as_deref(),
            usage,
        };
        let report = self.retry.run("heartbeat", cancel, || self.store.worker_beat(&beat)).await?;
        if !report.released.is_empty() {
            let ids: Vec<String> = report.released.iter().map(Uuid::to_string).collect();
            tracing::warn!(count = ids.len(), ids = ?ids,
                "handed back lapsed jobs claimed under this worker's id that it never received; their attempts are not counted");
        }
        // A busy job is one whose row was being written (its result, usually): still ours.
        let ours: std::collections::HashSet<Uuid> = report.extended.into_iter().chain(report.busy).collect();
        let lost: Vec<_> = held.into_iter().filter(|(id, _)| !ours.contains(id)).collect();
        if !lost.is_empty() {
            // A job written back between the snapshot and the update also shows up here; its
            // entry is already gone, so marking it lost does nothing.
            self.running.lose(&lost);
        }
        match report.directive.as_deref() {
            Some("terminate") if !self.terminate.is_cancelled() => {
                tracing::warn!(worker_id = %self.registration.id, "an operator asked this worker to terminate: shutting down as on SIGTERM");
                self.terminate.cancel();
            }
            Some("quiet") if !self.quiet.is_cancelled() => {
                tracing::warn!(worker_id = %self.registration.id, running = self.running.len(),
                    "an operator asked this worker to go quiet: it claims nothing more; running jobs finish; stop it when they have");
                self.quiet.cancel();
            }
            _ => {}
        }
        self.forget_ended_abandoned_runs(cancel).await;
        if !report.registered {
            tracing::warn!(worker_id = %self.registration.id, "this worker's row is gone from the registry; registering again");
            self.retry.run("register worker", cancel, || self.store.register_worker(&self.registration)).await?;
        }
        Ok(())
    }
}
