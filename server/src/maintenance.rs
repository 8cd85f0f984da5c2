//! The maintenance loop the server runs while it holds leadership: TTL expiry, the rescuer
//! (expired claims and per-attempt timeouts), the scheduler (due scheduled/retryable jobs
//! become available), cron (due ticks enqueue their jobs, exactly once per tick) and the
//! dead-letter replay rules. Workers
//! run the same services under the same advisory lock, so exactly one process does it at a time; without a worker, the server alone keeps delayed jobs and
//! crashed claims moving. Pruning has a lock of its own (`LeaderRole::Pruning`), so this
//! loop leading does not stop the workers' pruner; the server campaigns for it only when told
//! to prune (`--prune`, for a deployment without Rebound's worker), with [`run_pruning`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_queue::retention::RetentionPass;
use rebound_queue::store::{CronPass, LeaderRole, Leadership, PruneConfig, ReplayReport, RescueReport};
use rebound_queue::{Store, StoreError};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Rows each service handles per pass; a backlog drains over consecutive passes.
const BATCH: i64 = 1000;
/// How often a non-leader tries to take over.
const FOLLOWER_RETRY: Duration = Duration::from_secs(1);
/// How often the leader checks it still holds the lock (its connection may have been lost).
const LEADERSHIP_CHECK: Duration = Duration::from_secs(5);

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    pub expired: u64,
    pub rescued: RescueReport,
    pub promoted: u64,
    pub cron: CronPass,
    /// Dead letters replayed by their rules.
    pub replay: ReplayReport,
}

/// One pass of every service. Expiry runs first so an expired job is not promoted, and the
/// rescuer before the scheduler so a rescued job due at once is not left for the next pass.
pub async fn run_pass(store: &Store, metrics: &Metrics) -> Result<PassReport, StoreError> {
    let expired = store.expire_due(BATCH).await?;
    let rescued = store.rescue_expired(BATCH).await?;
    let promoted = store.promote_due(BATCH).await?;
    store.settle_rate_limits(BATCH).await?;
    let cron = store.fire_due_crons(BATCH).await?;
    // An OJS deployment may have no Rebound worker at all: its replay rules still apply. A
    // failed replay pass is tried again next time; the folding below must not wait for it.
    let replay = store.replay_due().await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "maintenance: the replay rules' pass failed; trying again next pass");
        ReplayReport::default()
    });
    // The server leads when no worker runs maintenance: it keeps the count deltas short too.
    store.fold_job_counts().await?;
    metrics.maintenance(promoted, &rescued, expired);
    if expired + rescued.stalled + rescued.timed_out + promoted > 0 {
        tracing::debug!(expired, stalled = rescued.stalled, timed_out = rescued.timed_out, promoted, "maintenance pass");
    }
    Ok(PassReport { expired, rescued, promoted, cron, replay })
}

/// How long the leader sleeps after a pass: not at all while a backlog drains, until the next
/// scheduled job is due if that comes before the next tick, else one tick (jobs scheduled
/// by other processes are noticed within a tick).
async fn next_wait(store: &Store, report: &PassReport, interval: Duration) -> Duration {
    let backlog = report.promoted >= BATCH as u64 || report.expired >= BATCH as u64
        || report.rescued.stalled + report.rescued.timed_out >= BATCH as u64 || report.replay.more;
    if backlog {
        return Duration::ZERO;
    }
    // This pass is every service's, not the scheduler's alone: a throttle's spacing under
    // SCHEDULER_MIN_WAIT is not worth running all of them that often (a worker's scheduler,
    // which does only the scheduler's work, keeps it).
    store.scheduler_wait(interval).await.max(rebound_queue::store::SCHEDULER_MIN_WAIT.min(interval))
}

/// What a leader does each turn; returns how long to wait before the next.
trait Turn {
    fn take(&mut self) -> impl Future<Output = Duration> + Send;
}

struct MaintenanceTurn {
    store: Store,
    metrics: Arc<Metrics>,
    interval: Duration,
}

impl Turn for MaintenanceTurn {
    async fn take(&mut self) -> Duration {
        match run_pass(&self.store, &self.metrics).await {
            Ok(report) => next_wait(&self.store, &report, self.interval).await,
            Err(e) => {
                tracing::warn!(error = %e, "maintenance pass failed; retrying next tick");
                self.interval
            }
        }
    }
}

/// How often the pruning leader runs retention, as a worker's pruner does by default.
const PRUNE_INTERVAL: Duration = Duration::from_secs(60);

struct PruningTurn {
    store: Store,
    pass: RetentionPass,
}

impl Turn for PruningTurn {
    async fn take(&mut self) -> Duration {
        match self.pass.run(&self.store).await {
            // A full batch: more has aged out than one pass deletes.
            Ok(true) => Duration::ZERO,
            Ok(false) => PRUNE_INTERVAL,
            Err(e) => {
                tracing::warn!(error = %e, "pruning pass failed; trying again later");
                PRUNE_INTERVAL
            }
        }
    }
}

/// Runs until `shutdown` is cancelled: tries to lead, and while leading runs a pass every
/// `interval`. Leadership is released on shutdown so a worker takes over at once.
pub async fn run(store: Store, metrics: Arc<Metrics>, interval: Duration, shutdown: CancellationToken) {
    let turn = MaintenanceTurn { store: store.clone(), metrics, interval };
    lead_while_elected(store, LeaderRole::Maintenance, turn, shutdown).await
}

/// Retention (`--prune`), until `shutdown` is cancelled: campaigns for the pruning leadership
/// (workers campaign for it too: whoever holds it keeps it), and while leading prunes a
/// batch of everything aged out every minute, or at once while a backlog drains.
pub async fn run_pruning(store: Store, retention: PruneConfig, shutdown: CancellationToken) {
    let turn = PruningTurn { store: store.clone(), pass: RetentionPass::new(retention) };
    lead_while_elected(store, LeaderRole::Pruning, turn, shutdown).await
}

async fn lead_while_elected(store: Store, role: LeaderRole, mut turn: impl Turn, shutdown: CancellationToken) {
    let what = match role {
        LeaderRole::Maintenance => "maintenance (scheduler, rescuer, TTL expiry, cron)",
        LeaderRole::Pruning => "pruning (retention)",
    };
    let mut leadership: Option<Leadership> = None;
    let mut checked_at = Instant::now();
    loop {
        if leadership.is_none() {
            match store.try_lead_as(role).await {
                Ok(Some(l)) => {
                    tracing::info!("this server now runs {what}");
                    leadership = Some(l);
                    checked_at = Instant::now();
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "{what}: cannot try for leadership"),
            }
        }
        let mut wait = FOLLOWER_RETRY;
        if let Some(lead) = leadership.as_mut() {
            if checked_at.elapsed() >= LEADERSHIP_CHECK {
                checked_at = Instant::now();
                if !lead.still_held().await {
                    tracing::warn!("{what}: leadership lost (database connection closed); will try again");
                    leadership = None;
                    continue;
                }
            }
            wait = turn.take().await;
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    if let Some(lead) = leadership
        && let Err(e) = lead.release().await
    {
        tracing::warn!(error = %e, "could not release {what} leadership; it ends with the connection");
    }
}
