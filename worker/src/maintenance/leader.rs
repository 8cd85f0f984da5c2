//! Leader election for maintenance: a Postgres session-level advisory lock
//! ([`Store::try_lead`]). Whoever holds it runs the services; the others try again every
//! `leader_retry`. When the leader dies its session ends, the lock goes with it, and a
//! follower takes over at its next try. The leader checks every `leader_check` that it still
//! holds the lock (a database restart ends the session too) and steps down if not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rebound_queue::Store;
use rebound_queue::store::Leadership;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::cron::{CRON_INTERVAL, CronFirer};
use super::expirer::Expirer;
use super::counts::{CountFolder, FOLD_INTERVAL};
use super::pruner::Pruner;
use super::replayer::{REPLAY_INTERVAL, Replayer};
use super::rescuer::Rescuer;
use super::scheduler::Scheduler;
use super::run_service;
use crate::settings::MaintenanceSettings;

/// The election loop and the services it runs while leading.
pub struct Maintenance {
    pub store: Store,
    pub settings: MaintenanceSettings,
    /// True while this process leads (for tests and status).
    pub is_leader: Arc<AtomicBool>,
}

impl Maintenance {
    pub fn new(store: Store, settings: MaintenanceSettings) -> Self {
        Maintenance { store, settings, is_leader: Arc::new(AtomicBool::new(false)) }
    }

    /// Campaigns and leads until `shutdown`; leadership is given up on the way out.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let attempt = tokio::select! {
                _ = shutdown.cancelled() => return,
                l = self.store.try_lead() => l,
            };
            match attempt {
                Ok(Some(leadership)) => self.lead(leadership, &shutdown).await,
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "could not campaign for maintenance leadership"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.settings.leader_retry) => {}
            }
        }
    }

    async fn lead(&self, mut leadership: Leadership, shutdown: &CancellationToken) {
        tracing::info!("became the maintenance leader");
        self.is_leader.store(true, Ordering::SeqCst);
        let stop = shutdown.child_token();
        let mut services = self.spawn_services(&stop);
        let still_held = loop {
            tokio::select! {
                _ = shutdown.cancelled() => break true,
                _ = tokio::time::sleep(self.settings.leader_check) => {}
            }
            if !leadership.still_held().await {
                break false;
            }
        };
        stop.cancel();
        while services.join_next().await.is_some() {}
        self.is_leader.store(false, Ordering::SeqCst);
        if still_held {
            if let Err(e) = leadership.release().await {
                tracing::debug!(error = %e, "could not release maintenance leadership; it ends with the connection");
            }
            tracing::info!("gave up maintenance leadership");
        } else {
            // Unlock in case the session survived the failed check, so the connection does
            // not go back to the pool still holding the lock.
            let _ = leadership.release().await;
            tracing::warn!("lost maintenance leadership (database connection lost?); campaigning again");
        }
    }

    fn spawn_services(&self, stop: &CancellationToken) -> JoinSet<()> {
        let s = &self.settings;
        let mut set = JoinSet::new();
        set.spawn(run_service(Scheduler { interval: s.scheduler_interval, batch: s.batch }, self.store.clone(), stop.clone()));
        set.spawn(run_service(Rescuer { interval: s.rescuer_interval, batch: s.batch }, self.store.clone(), stop.clone()));
        set.spawn(run_service(Expirer { interval: s.expirer_interval, batch: s.batch }, self.store.clone(), stop.clone()));
        set.spawn(run_service(CronFirer { interval: CRON_INTERVAL, batch: s.batch }, self.store.clone(), stop.clone()));
        set.spawn(run_service(CountFolder { interval: FOLD_INTERVAL }, self.store.clone(), stop.clone()));
        set.spawn(run_service(Replayer { interval: REPLAY_INTERVAL }, self.store.clone(), stop.clone()));
        if let Some(p) = &s.pruner {
            set.spawn(run_service(Pruner::new(p.interval, p.retention.clone()), self.store.clone(), stop.clone()));
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_queue::testing::TestDb;
    use std::time::Duration;

    fn quick() -> MaintenanceSettings {
        MaintenanceSettings {
            leader_retry: Duration::from_millis(50),
            leader_check: Duration::from_millis(50),
            ..MaintenanceSettings::default()
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..200 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting until {what}");
    }

    #[tokio::test]
    async fn one_leader_at_a_time_and_a_follower_takes_over() {
        let db = TestDb::new().await;
        let other = Store::connect(&db.url, 4).await.unwrap();
        let first = Maintenance::new(db.store.clone(), quick());
        let second = Maintenance::new(other, quick());
        let (first_leads, second_leads) = (first.is_leader.clone(), second.is_leader.clone());
        let (stop_first, stop_second) = (CancellationToken::new(), CancellationToken::new());
        let first_task = tokio::spawn(first.run(stop_first.clone()));
        until("the first leads", || first_leads.load(Ordering::SeqCst)).await;
        let second_task = tokio::spawn(second.run(stop_second.clone()));
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            assert!(!second_leads.load(Ordering::SeqCst), "two leaders at once");
        }
        stop_first.cancel();
        first_task.await.unwrap();
        assert!(!first_leads.load(Ordering::SeqCst));
        until("the second takes over", || second_leads.load(Ordering::SeqCst)).await;
        stop_second.cancel();
        second_task.await.unwrap();
    }
}
