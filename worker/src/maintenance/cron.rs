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

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_queue::NewJob;
    use rebound_queue::cron_schedule::CronSchedule;
    use rebound_queue::store::{Actor, CronSpec, CronTemplate, OverlapPolicy};
    use rebound_queue::testing::TestDb;

    /// The service wakes just after the next tick, never a fixed interval after its pass: a
    /// fixed pause drifts by each pass's length until a per-second tick fires a second late
    /// and the next is skipped.
    #[tokio::test]
    async fn the_wait_ends_just_after_the_next_tick() {
        let db = TestDb::new().await;
        let firer = CronFirer { interval: CRON_INTERVAL, batch: 10 };
        assert_eq!(firer.next_wait(&db.store).await, CRON_INTERVAL, "no cron job: one interval");
        let spec = CronSpec {
            name: "tick".into(),
            schedule: CronSchedule::new("* * * * * *", "UTC").expect("schedule"),
            template: CronTemplate::from_job(&NewJob::new("cron.tick", serde_json::json!([])), serde_json::json!({})),
            overlap_policy: OverlapPolicy::Allow,
            enabled: true,
            description: None,
        };
        db.store.register_cron(&spec, &Actor::new("test")).await.expect("register");
        // The next tick 400 ms out by the database's clock: however long the call takes, the
        // time it reads until then is at most 400 ms.
        sqlx::query("UPDATE cron_jobs SET next_run_at = now() + interval '400 milliseconds'").execute(db.store.pool()).await.expect("move the tick");
        let wait = firer.next_wait(&db.store).await;
        assert!(wait <= Duration::from_millis(400) + PAST_THE_TICK, "waited {wait:?} for a tick 400 ms away");
    }
}
