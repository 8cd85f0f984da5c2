//! The replayer: dead letters re-driven by the operators' replay rules (ojs-dead-letter §7)
//! once they have been dead long enough.

use std::time::Duration;

use rebound_queue::{Store, StoreError};

use super::MaintenanceService;

/// The pause between passes. A rule's delay is at least a minute (`REPLAY_MARGIN`), so a
/// replay lands at most this much after it is due.
pub const REPLAY_INTERVAL: Duration = Duration::from_secs(5);

pub struct Replayer {
    pub interval: Duration,
}

impl MaintenanceService for Replayer {
    fn name(&self) -> &'static str {
        "replayer"
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn run_once(&self, store: &Store) -> Result<bool, StoreError> {
        let report = store.replay_due().await?;
        if report.replayed > 0 {
            tracing::info!(replayed = report.replayed, "replayed dead letters by their replay rules");
        }
        Ok(report.more)
    }
}
