//! Leader election for maintenance: Postgres session-level advisory locks
//! ([`Store::try_lead_as`]), one for the pruner and one for every other service. Whoever holds
//! one runs its services; the others try again every
//! `leader_retry`. When the leader dies its session ends, the lock goes with it, and a
//! follower takes over at its next try. The leader checks every `leader_check` that it still
//! holds the lock (a database restart ends the session too) and steps down if not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rebound_queue::Store;
use rebound_queue::store::{LeaderRole, Leadership};
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

/// The election loops and the services each runs while leading.
pub struct Maintenance {
    pub store: Store,
    pub settings: MaintenanceSettings,
    /// True while this process leads maintenance (for tests and status).
    pub is_leader: Arc<AtomicBool>,
    /// True while this process leads pruning.
    pub is_pruning_leader: Arc<AtomicBool>,
}

impl Maintenance {
    pub fn new(store: Store, settings: MaintenanceSettings) -> Self {
        Maintenance { store, settings, is_leader: Arc::new(AtomicBool::new(false)), is_pruning_leader: Arc::new(AtomicBool::new(false)) }
    }

    /// Campaigns and leads until `shutdown`; leadership is given up on the way out. Pruning
    /// is a leadership of its own, which a server seeks only when told to prune: a server that leads the rest
    /// (it campaigns too, and may have started first) does not stop retention.
    pub async fn run(self, shutdown: CancellationToken) {
        let maintenance = self.campaign(LeaderRole::Maintenance, &shutdown);
        if self.settings.pruner.is_some() {
            tokio::join!(maintenance, self.campaign(LeaderRole::Pruning, &shutdown));
        } else {
            maintenance.await;
        }
    }

    async fn campaign(&self, role: LeaderRole, shutdown: &CancellationToken) {
        loop {
            let attempt = tokio::select! {
                _ = shutdown.cancelled() => return,
                l = self.store.try_lead_as(role) => l,
            };
            match attempt {
                Ok(Some(leadership)) => self.lead(role, leadership, shutdown).await,
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, ?role, "could not campaign for leadership"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.settings.leader_retry) => {}
            }
        }
    }

    async fn lead(&self, role: LeaderRole, mut leadership: Leadership, shutdown: &CancellationToken) {
        let (flag, what) = match role {
            LeaderRole::Maintenance => (&self.is_leader, "maintenance"),
            LeaderRole::Pruning => (&self.is_pruning_leader, "pruning"),
        };
        tracing::info!("became the {what} leader");
        flag.store(true, Ordering::SeqCst);
        let stop = shutdown.child_token();
        let mut services = self.spawn_services(role, &stop);
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
        flag.store(false, Ordering::SeqCst);
        if still_held {
            if let Err(e) = leadership.release().await {
                tracing::debug!(error = %e, "could not release {what} leadership; it ends with the connection");
            }
            tracing::info!("gave up {what} leadership");
        } else {
            // Unlock in case the session survived the failed check, so the connection does
            // not go back to the pool still holding the lock.
            let _ = leadership.release().await;
            tracing::warn!("lost {what} leadership (database connection lost?); campaigning again");
        }
    }

    fn spawn_services(&self, role: LeaderRole, stop: &CancellationToken) -> JoinSet<()> {
        let s = &self.settings;
        let mut set = JoinSet::new();
        match role {
            LeaderRole::Maintenance => {
                set.spawn(run_service(Scheduler { interval: s.scheduler_interval, batch: s.batch }, self.store.clone(), stop.clone()));
                set.spawn(run_service(Rescuer { interval: s.rescuer_interval, batch: s.batch }, self.store.clone(), stop.clone()));
                set.spawn(run_service(Expirer { interval: s.expirer_interval, batch: s.batch }, self.store.clone(), stop.clone()));
                set.spawn(run_service(CronFirer { interval: CRON_INTERVAL, batch: s.batch }, self.store.clone(), stop.clone()));
                set.spawn(run_service(CountFolder { interval: FOLD_INTERVAL }, self.store.clone(), stop.clone()));
                set.spawn(run_service(Replayer { interval: REPLAY_INTERVAL }, self.store.clone(), stop.clone()));
            }
            LeaderRole::Pruning => {
                if let Some(p) = &s.pruner {
                    set.spawn(run_service(Pruner::new(p.interval, p.retention.clone()), self.store.clone(), stop.clone()));
                }
            }
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

    /// A server took the maintenance lead first (it campaigns for it too, and prunes only
    /// with `--prune`): a worker still leads pruning, and finished jobs still age out.
    #[tokio::test]
    async fn a_worker_prunes_while_another_process_leads_maintenance() {
        use crate::settings::PrunerSettings;
        use rebound_queue::store::{ClaimRequest, Completion, PruneConfig};
        use rebound_queue::NewJob;

        let db = TestDb::new().await;
        let server = Store::connect(&db.url, 2).await.unwrap();
        let server_lead = server.try_lead().await.unwrap().expect("the server leads maintenance");
        let job = db.store.enqueue(NewJob::new("prune.lead", serde_json::json!([]))).await.unwrap().job;
        let claim = ClaimRequest { worker_id: "w".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        assert_eq!(db.store.claim(&claim).await.unwrap().len(), 1);
        db.store.complete(&Completion { id: job.id, attempt: Some(1), worker_id: None, started_at: None, result: None }).await.unwrap();

        let retention = PruneConfig { completed_after: Duration::ZERO, ..PruneConfig::default() };
        let settings = MaintenanceSettings { pruner: Some(PrunerSettings { interval: Duration::from_millis(50), retention }), ..quick() };
        let worker = Maintenance::new(db.store.clone(), settings);
        let (leads, prunes) = (worker.is_leader.clone(), worker.is_pruning_leader.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(worker.run(stop.clone()));
        until("the worker leads pruning", || prunes.load(Ordering::SeqCst)).await;
        let mut gone = false;
        for _ in 0..200 {
            if db.store.job(job.id).await.is_err() {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(gone, "the completed job was pruned");
        assert!(!leads.load(Ordering::SeqCst), "the server still leads maintenance");
        stop.cancel();
        task.await.unwrap();
        assert!(!prunes.load(Ordering::SeqCst), "pruning leadership given up on shutdown");
        server_lead.release().await.unwrap();
    }
}
