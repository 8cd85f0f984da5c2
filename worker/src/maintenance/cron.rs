//! The cron service: fires due cron ticks ([`Store::fire_due_crons`]) just after each falls
//! due, and looks at least once a second, the finest grain a cron expression has (and the
//! most often OJS lets cron be evaluated).
//!
//! It runs on the maintenance leader like the other services, but leadership is not what makes
//! a tick fire exactly once: the store takes each tick with a compare-and-set, so a leader
//! change mid-pass (or a server running the same pass) cannot fire one twice.

use std::time::Duration;

use rebound_queue::{Store, StoreError};

use super::MaintenanceService;

/// How often due ticks are looked for.
pub const CRON_INTERVAL: Duration = Duration::from_secs(1);

/// How long after a tick's time the pass that fires it starts, so that the tick is due by
/// the database's clock when the pass reads it.
const PAST_THE_TICK: Duration = Duration::from_millis(5);

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

    /// Until just after the next tick, at most the interval. A fixed pause after each pass
    /// drifts by the pass's length: a pass of a per-second cron job that drifted past a whole
    /// second would fire its tick a second late and skip the next (missed ticks fire once).
    async fn next_wait(&self, store: &Store) -> Duration {
        match store.time_until_next_cron_tick().await {
            Ok(Some(until)) => (until + PAST_THE_TICK).min(self.interval),
            Ok(None) => self.interval,
            Err(e) => {
                tracing::debug!(error = %e, "cron: cannot read when the next tick is due; waiting one interval");
                self.interval
            }
        }
    }

    async fn run_once(&self, store: &Store) -> Result<bool, StoreError> {
        let pass = store.fire_due_crons(self.batch).await?;
        if pass.fired + pass.skipped + pass.released > 0 {
            tracing::debug!(fired = pass.fired, skipped = pass.skipped, released = pass.released, "cron pass");
        }
        Ok((pass.fired + pass.skipped) as i64 >= self.batch)
    }
}
