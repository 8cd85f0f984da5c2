//! The cron service: fires due cron ticks ([`Store::fire_due_crons`]) once a second, the
//! finest grain a cron expression has (and the most often OJS lets cron be evaluated).
//!
//! It runs on the maintenance leader like the other services, but leadership is not what makes
//! a tick fire exactly once: the store takes each tick with a compare-and-set, so a leader
//! change mid-pass (or a server running the same pass) cannot fire one twice.

use std::time::Duration;

use rebound_queue::{Store, StoreError};

use super::MaintenanceService;

/// How often due ticks are looked for.
pub const CRON_INTERVAL: Duration = Duration::from_secs(1);

pub struct CronFirer {
    pub interval: Duration,
    /// Cron jobs fired per pass.
    pub batch: i64,
}

impl MaintenanceService for CronFirer {
    fn name(&self) -> &'static str {
        "cron"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self, store: &Store) -> Result<bool, StoreError> {
        let pass = store.fire_due_crons(self.batch).await?;
        if pass.fired + pass.skipped + pass.released > 0 {
            tracing::debug!(fired = pass.fired, skipped = pass.skipped, released = pass.released, "cron pass");
        }
        Ok((pass.fired + pass.skipped) as i64 >= self.batch)
    }
}
