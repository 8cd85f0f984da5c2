//! Maintenance, run by one elected worker at a time (see [`leader`]). Each service is a small
//! named module with one pass ([`MaintenanceService::run_once`]) that its tests drive directly:
//!
//! * [`scheduler`]: due `scheduled` / `retryable` jobs → `available`.
//! * [`rescuer`]: expired locks → failed attempt `rebound.stalled`; elapsed per-attempt
//!   timeouts → `rebound.timeout`; the policy decides what follows.
//! * [`expirer`]: jobs whose `expires_at` passed before they ran → discarded.
//! * [`pruner`]: retention of finished jobs, dead letters and silent workers.
//! * [`cron`]: due cron ticks → jobs (exactly once per tick, whoever fires).
//! * [`replayer`]: dead letters re-driven by the operators' replay rules.

pub mod counts;
pub mod cron;
pub mod expirer;
pub mod leader;
pub mod pruner;
pub mod replayer;
pub mod rescuer;
pub mod scheduler;

use std::future::Future;
use std::time::Duration;

use rebound_queue::{Store, StoreError};
use tokio_util::sync::CancellationToken;

pub use leader::Maintenance;

/// One maintenance concern.
pub trait MaintenanceService: Send + Sync + 'static {
    /// For logs.
    fn name(&self) -> &'static str;
    /// The pause between passes.
    fn interval(&self) -> Duration;
    /// One bounded pass. `Ok(true)` when it hit its batch limit, so more may be waiting and
    /// the next pass should start at once.
    fn run_once(&self, store: &Store) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// How long to wait after a pass that left no backlog: the interval, unless the service
    /// knows its next work is due sooner.
    fn next_wait(&self, _store: &Store) -> impl Future<Output = Duration> + Send {
        std::future::ready(self.interval())
    }
}

/// How long a pass under way when `stop` fires may still take. Passes hold transactions, and
/// a transaction is not something to abandon mid-flight; but stepping down (the leader lost
/// its lock, or the worker is shutting down) must not wait on a database that is not answering
/// either. Past this, the pass is dropped: its transaction's connection is closed, not reused,
/// so Postgres rolls it back (see `rebound_queue::store`'s transactions).
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs `service` pass after pass until `stop` fires. Errors are logged and the pass is tried
/// again at the next interval: maintenance must outlive database blips like everything else.
/// `stop` is looked at between passes; a pass under way finishes first (within [`STOP_GRACE`]).
pub async fn run_service<S: MaintenanceService>(service: S, store: Store, stop: CancellationToken) {
    loop {
        if stop.is_cancelled() {
            return;
        }
        let pass = service.run_once(&store);
        tokio::pin!(pass);
        let result = tokio::select! {
            r = &mut pass => r,
            _ = stop.cancelled() => match tokio::time::timeout(STOP_GRACE, &mut pass).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!(service = service.name(), "a maintenance pass did not finish in time after stop; abandoned (rolled back)");
                    return;
                }
            },
        };
        let (more, failed) = match result {
            Ok(more) => (more, false),
            Err(e) => {
                tracing::warn!(service = service.name(), error = %e, "maintenance pass failed; trying again later");
                (false, true)
            }
        };
        if stop.is_cancelled() {
            return;
        }
        if more {
            tokio::task::yield_now().await;
            continue;
        }
        // After a failure, the interval: the work the service would wake for is what failed,
        // so it may be due already and stay due (an override the pass could not clear),
        // which would retry the failing pass as fast as its shortest wait.
        // A read, so abandoning it on stop leaves nothing half done.
        let wait = if failed {
            service.interval()
        } else {
            tokio::select! {
                _ = stop.cancelled() => return,
                wait = service.next_wait(&store) => wait,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use rebound_queue::testing::TestDb;

    use super::*;

    /// A pass that takes a while, as a pass on a slow database does.
    struct Slow {
        started: Arc<AtomicU32>,
        finished: Arc<AtomicU32>,
    }

    impl MaintenanceService for Slow {
        fn name(&self) -> &'static str {
            "slow"
        }

        fn interval(&self) -> Duration {
            Duration::from_millis(10)
        }

        async fn run_once(&self, store: &Store) -> Result<bool, StoreError> {
            self.started.fetch_add(1, Ordering::SeqCst);
            // A transaction that a cancelled future would leave mid-way.
            sqlx::query("SELECT pg_sleep(0.3)").execute(store.pool()).await?;
            self.finished.fetch_add(1, Ordering::SeqCst);
            Ok(false)
        }
    }

    #[tokio::test]
    async fn stopping_lets_the_pass_under_way_finish_and_starts_no_other() {
        let db = TestDb::new().await;
        let (started, finished) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let stop = CancellationToken::new();
        let task = tokio::spawn(run_service(Slow { started: started.clone(), finished: finished.clone() }, db.store.clone(), stop.clone()));
        while started.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops within the grace").expect("no panic");
        assert_eq!((started.load(Ordering::SeqCst), finished.load(Ordering::SeqCst)), (1, 1), "the pass ran to its end, and no other began");
    }
}
