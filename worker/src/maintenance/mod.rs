//! Maintenance, run by one elected worker at a time (see [`leader`]). Each service is a small
//! named module with one pass ([`MaintenanceService::run_once`]) that its tests drive directly:
//!
//! * [`scheduler`]: due `scheduled` / `retryable` jobs → `available`.
//! * [`rescuer`]: expired locks → failed attempt `rebound.stalled`; elapsed per-attempt
//!   timeouts → `rebound.timeout`; the policy decides what follows.
//! * [`expirer`]: jobs whose `expires_at` passed before they ran → discarded.
//! * [`pruner`]: retention of finished jobs, dead letters and silent workers.
//! * [`cron`]: due cron ticks → jobs (exactly once per tick, whoever fires).

pub mod cron;
pub mod expirer;
pub mod leader;
pub mod pruner;
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
}

/// Runs `service` pass after pass until `stop` fires. Errors are logged and the pass is tried
/// again at the next interval: maintenance must outlive database blips like everything else.
pub async fn run_service<S: MaintenanceService>(service: S, store: Store, stop: CancellationToken) {
    loop {
        let more = tokio::select! {
            _ = stop.cancelled() => return,
            r = service.run_once(&store) => match r {
                Ok(more) => more,
                Err(e) => {
                    tracing::warn!(service = service.name(), error = %e, "maintenance pass failed; trying again later");
                    false
                }
            },
        };
        if more {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(service.interval()) => {}
        }
    }
}
