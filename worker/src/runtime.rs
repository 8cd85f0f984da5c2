//! [`Worker`]: builds the parts, runs them, and shuts them down in order.
//!
//! Shutdown (the token passed to [`Worker::run`] fires, e.g. on SIGTERM):
//! 1. the claim loops stop and maintenance leadership is given up;
//! 2. running jobs get `shutdown_grace` to finish; their results are written as usual;
//! 3. jobs still running then are cut short and released without counting the attempt;
//! 4. the completer writes everything that is left (within `final_flush_timeout`);
//! 5. heartbeats stop and the worker deregisters.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rebound_queue::job::{JobValidationError, validate_queue};
use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::store::WorkerRegistration;
use rebound_queue::{Store, StoreError};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::claimer::Claimer;
use crate::completer::{Completer, CompleterReport};
use crate::executor::{Dispatcher, Executor, InPlaceRetries};
use crate::handler::Handler;
use crate::health::Health;
use crate::heartbeat::Heartbeat;
use crate::identity;
use crate::live_policies::LivePolicies;
use crate::maintenance::Maintenance;
use crate::notifier::Notifier;
use crate::orphans::Orphans;
use crate::outage::OutageBackoff;
use crate::panic_capture;
use crate::registry::HandlerRegistry;
use crate::running::RunningJobs;
use crate::settings::RuntimeSettings;

/// The worker was configured wrongly.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("no queues: add at least one with .queue(name, concurrency)")]
    NoQueues,
    #[error("queue {queue:?}: {reason}")]
    Queue { queue: String, reason: String },
    #[error("handler {pattern:?}: {source}")]
    Handler { pattern: String, source: JobValidationError },
}

/// Configures a [`Worker`].
pub struct WorkerBuilder {
    store: Store,
    queues: Vec<(String, u32)>,
    registry: HandlerRegistry,
    handler_errors: Vec<BuildError>,
    settings: RuntimeSettings,
    on_ready: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl WorkerBuilder {
    /// Works `name` with up to `concurrency` jobs at once. Setting a queue again replaces it.
    pub fn queue(mut self, name: impl Into<String>, concurrency: u32) -> Self {
        let name = name.into();
        self.queues.retain(|(q, _)| *q != name);
        self.queues.push((name, concurrency));
        self
    }

    /// Runs jobs of `pattern` (a type, or `prefix.*`) with `handler`.
    pub fn handler(self, pattern: &str, handler: impl Handler) -> Self {
        self.handler_arc(pattern, Arc::new(handler), None)
    }

    /// Like [`WorkerBuilder::handler`], for a shared handler and with the type's default
    /// per-attempt timeout (used when a job sets none).
    pub fn handler_arc(mut self, pattern: &str, handler: Arc<dyn Handler>, timeout: Option<Duration>) -> Self {
        if let Err(source) = self.registry.register(pattern, handler, timeout) {
            self.handler_errors.push(BuildError::Handler { pattern: pattern.to_string(), source });
        }
        self
    }

    /// Replaces all settings.
    pub fn settings(mut self, settings: RuntimeSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Adjusts settings in place: `.configure(|s| s.poll_interval = Duration::from_millis(100))`.
    pub fn configure(mut self, f: impl FnOnce(&mut RuntimeSettings)) -> Self {
        f(&mut self.settings);
        self
    }

    /// Called once the worker is registered and about to claim (systemd's READY=1).
    pub fn on_ready(mut self, f: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.on_ready = Some(Box::new(f));
        self
    }

    pub fn build(mut self) -> Result<Worker, BuildError> {
        if let Some(e) = self.handler_errors.pop() {
            return Err(e);
        }
        if self.queues.is_empty() {
            return Err(BuildError::NoQueues);
        }
        for (queue, concurrency) in &self.queues {
            validate_queue(queue).map_err(|e| BuildError::Queue { queue: queue.clone(), reason: e.reason })?;
            if *concurrency == 0 {
                return Err(BuildError::Queue { queue: queue.clone(), reason: "concurrency must be at least 1".into() });
            }
        }
        let id = self.settings.worker_id.clone().unwrap_or_else(identity::new_worker_id);
        Ok(Worker {
            id,
            store: self.store,
            queues: self.queues,
            registry: Arc::new(self.registry),
            settings: self.settings,
            on_ready: self.on_ready,
            quiet: CancellationToken::new(),
        })
    }
}

/// A configured worker. [`Worker::run`] runs it until its shutdown token fires.
pub struct Worker {
    id: String,
    store: Store,
    queues: Vec<(String, u32)>,
    registry: Arc<HandlerRegistry>,
    settings: RuntimeSettings,
    on_ready: Option<Box<dyn FnOnce() + Send + Sync>>,
    quiet: CancellationToken,
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunReport {
    pub claimed: u64,
    pub results: CompleterReport,
    /// Whether the grace period ran out with jobs still running.
    pub grace_expired: bool,
}

impl Worker {
    pub fn builder(store: Store) -> WorkerBuilder {
        WorkerBuilder {
            store,
            queues: Vec::new(),
            registry: HandlerRegistry::new(),
            handler_errors: Vec::new(),
            settings: RuntimeSettings::default(),
            on_ready: None,
        }
    }

    /// The id jobs are claimed under.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn settings(&self) -> &RuntimeSettings {
        &self.settings
    }

    /// Cancel it to make the worker quiet: it claims nothing more, its running jobs finish,
    /// and it stays up until shut down (SIGTSTP in the binary; an operator's `quiet` from the
    /// dashboard or the OJS admin API does the same through the heartbeat).
    pub fn quiet_token(&self) -> CancellationToken {
        self.quiet.clone()
    }

    /// Runs until `shutdown` fires, then shuts down gracefully (see the module docs). Database
    /// outages never end the run: every part waits them out.
    pub async fn run(mut self, shutdown: CancellationToken) -> RunReport {
        panic_capture::install();
        if !self.register(&shutdown).await {
            return RunReport::default();
        }
        tracing::info!(worker_id = %self.id, queues = ?self.queues, handlers = ?self.registry.types(), "worker started");
        if let Some(ready) = self.on_ready.take() {
            ready();
        }

        let s = self.settings.clone();
        let running = Arc::new(RunningJobs::new());
        let health = Arc::new(Health::default());
        let orphans = Arc::new(Orphans::new(self.store.clone(), self.id.clone(), running.clone()));
        let hard_stop = CancellationToken::new();
        let (completer, results) =
            Completer::new(self.store.clone(), self.id.clone(), running.clone(), health.clone(), s.completer.clone(), s.storage_retry.clone());
        let completer_task = tokio::spawn(completer.run(hard_stop.clone()));
        // Claims pause while the completer is this far behind.
        let backlog = results.backlog();

        let background_stop = CancellationToken::new();
        // The claim loops stop on shutdown, or earlier when the worker is made quiet.
        let claims_stop = shutdown.child_token();
        {
            let (quiet, claims_stop) = (self.quiet.clone(), claims_stop.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = quiet.cancelled() => claims_stop.cancel(),
                    _ = claims_stop.cancelled() => {}
                }
            });
        }
        let stopping = Arc::new(AtomicBool::new(false));
        let heartbeat = Heartbeat {
            store: self.store.clone(),
            registration: self.registration(),
            running: running.clone(),
            interval: s.heartbeat_interval,
            retry: s.storage_retry.clone(),
            stopping: stopping.clone(),
            health: health.clone(),
            backlog: backlog.clone(),
            orphans: orphans.clone(),
            quiet: self.quiet.clone(),
            terminate: shutdown.clone(),
            usage: std::sync::Mutex::new(crate::usage::UsageMeter::new()),
        };
        let heartbeat_task = tokio::spawn(heartbeat.run(background_stop.clone()));

        let maintenance_task = s.maintenance.clone().map(|m| tokio::spawn(Maintenance::new(self.store.clone(), m).run(shutdown.clone())));

        let abort = CancellationToken::new();
        let tracker = TaskTracker::new();
        let policies = Arc::new(LivePolicies::new());
        let in_place = InPlaceRetries { enabled: s.retry_in_place, write_after: s.in_place_write_after, policies: policies.clone(), stopping: shutdown.clone() };
        let dispatcher = Dispatcher::new(Executor {
            registry: self.registry.clone(),
            completer: results,
            worker_id: Arc::from(self.id.as_str()),
            default_timeout: s.job_timeout,
            abort: abort.clone(),
            tracker: tracker.clone(),
            in_place,
            store: self.store.clone(),
        });
        let wakes: HashMap<String, Arc<Notify>> = self.queues.iter().map(|(q, _)| (q.clone(), Arc::new(Notify::new()))).collect();
        let (listening, listened) = tokio::sync::watch::channel(0u64);
        let notifier = Notifier {
            store: self.store.clone(),
            wakes: wakes.clone(),
            wait: s.poll_interval.max(Duration::from_secs(1)),
            retry: s.claim_retry.clone(),
            policies,
            orphans: orphans.clone(),
            listening,
        };
        let notifier_task = tokio::spawn(notifier.run(shutdown.clone()));

        let mut claimers = JoinSet::new();
        for (queue, concurrency) in &self.queues {
            let slots = Arc::new(Semaphore::new(*concurrency as usize));
            let wake = wakes.get(queue).cloned().unwrap_or_default();
            let loops = s.claim_loops_for(*concurrency);
            for _ in 0..loops {
                let claimer = Claimer {
                    queue: queue.clone(),
                    slots: slots.clone(),
                    concurrency: *concurrency as usize,
                    gather: s.claim_gather,
                    batch_max: s.claim_batch_max,
                    store: self.store.clone(),
                    worker_id: self.id.clone(),
                    visibility_timeout: s.visibility_timeout,
                    poll_interval: s.poll_interval,
                    retry: s.claim_retry.clone(),
                    wake: wake.clone(),
                    listened: listened.clone(),
                    running: running.clone(),
                    dispatcher: dispatcher.clone(),
                    backlog: backlog.clone(),
                    max_backlog: s.completer.max_backlog,
                    has_siblings: loops > 1,
                    orphans: orphans.clone(),
                    health: health.clone(),
                };
                claimers.spawn(claimer.run(claims_stop.clone()));
            }
        }
        drop(dispatcher);
        let claims_ended = CancellationToken::new();
        // Aborted with this future if it is dropped, and the claim loops with it.
        let claims_task = {
            let claims_ended = claims_ended.clone();
            tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
                let mut claimed = 0;
                while let Some(c) = claimers.join_next().await {
                    claimed += c.unwrap_or(0);
                }
                claims_ended.cancel();
                claimed
            }))
        };
        let quiet_sweep = tokio::spawn(sweep_when_quiet(self.quiet.clone(), claims_ended, orphans.clone(), s.storage_retry.clone(), shutdown.clone()));

        shutdown.cancelled().await;
        stopping.store(true, Ordering::Relaxed);
        tracing::info!(running = running.len(), grace_s = s.shutdown_grace.as_secs_f64(), "shutting down: no more claims; waiting for running jobs");
        let mut report = RunReport { claimed: claims_task.await.unwrap_or(0), ..RunReport::default() };
        let _ = quiet_sweep.await;
        let _ = notifier_task.await;

        tracker.close();
        if tokio::time::timeout(s.shutdown_grace, tracker.wait()).await.is_err() {
            report.grace_expired = true;
            abort.cancel();
            tracker.wait().await;
        }
        if let Some(task) = maintenance_task {
            let _ = task.await;
        }
        // Every dispatcher (and so every result sender) is gone now: the completer drains.
        let flush_deadline = tokio::time::sleep(s.completer.final_flush_timeout);
        tokio::pin!(flush_deadline);
        let mut completer_task = completer_task;
        report.results = tokio::select! {
            r = &mut completer_task => r.unwrap_or_default(),
            _ = &mut flush_deadline => {
                tracing::error!("job results could not be written in time; giving up on them");
                hard_stop.cancel();
                completer_task.await.unwrap_or_default()
            }
        };
        // Every result is written (or given up). A claim that failed on the way out may have
        // left jobs under our id that we never received: hand them back uncounted now, rather
        // than leave them to the rescuer.
        if orphans.suspected() {
            self.final_sweep(&orphans).await;
        }
        background_stop.cancel();
        let _ = heartbeat_task.await;
        self.deregister().await;
        tracing::info!(claimed = report.claimed, completed = report.results.completed, failed = report.results.failed,
            released = report.results.released, "worker stopped");
        report
    }

    fn registration(&self) -> WorkerRegistration {
        WorkerRegistration {
            id: self.id.clone(),
            host: identity::host_name(),
            pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
            queues: self.queues.iter().map(|(q, _)| q.clone()).collect(),
            concurrency: i32::try_from(self.queues.iter().map(|(_, c)| u64::from(*c)).sum::<u64>()).unwrap_or(i32::MAX),
            version: identity::VERSION.to_string(),
        }
    }

    /// Bounded like deregistering: what cannot be handed back now is handed back by nobody but
    /// the rescuer, which counts the attempt.
    async fn final_sweep(&self, orphans: &Orphans) {
        orphans.settled().await;
        match tokio::time::timeout(Duration::from_secs(5), orphans.sweep()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not hand back jobs claimed while the connection was lost; the rescuer will"),
            Err(_) => tracing::warn!("handing back jobs claimed while the connection was lost took too long; the rescuer will"),
        }
    }

    /// Registers in `workers`, waiting out outages; false if shutdown came first.
    async fn register(&self, shutdown: &CancellationToken) -> bool {
        let registration = self.registration();
        let mut outage = OutageBackoff::like(&self.settings.storage_retry);
        loop {
            match self.settings.storage_retry.run("register worker", shutdown, || self.store.register_worker(&registration)).await {
                Ok(()) => return true,
                Err(StoreError::Cancelled) => return false,
                Err(e) => {
                    if !outage.wait_logged("registering with the database", &e, shutdown).await {
                        return false;
                    }
                }
            }
        }
    }

    async fn deregister(&self) {
        // Bounded: a worker that cannot reach the database on its way out is simply left to
        // age out of the registry (the pruner forgets silent workers).
        let give_up = CancellationToken::new();
        let timer = {
            let give_up = give_up.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                give_up.cancel();
            })
        };
        if let Err(e) = self.settings.storage_retry.run("deregister worker", &give_up, || self.store.deregister_worker(&self.id)).await {
            tracing::warn!(error = %e, "could not deregister; the worker row will age out");
        }
        timer.abort();
    }
}

/// Made quiet, the claim loops stop, and with them the sweep a claim runs first after one that
/// failed (see [`crate::orphans`]). Once they have all stopped, and a claim given up on can
/// no longer commit ([`Orphans::settled`]), this sweeps if one is due:
/// otherwise a lost claim's jobs would wait for the heartbeat, which can hand them back only
/// once their lock has lapsed, the moment the rescuer may take them and charge each an
/// attempt that never ran. Tries until it succeeds or shutdown, which sweeps on its own.
async fn sweep_when_quiet(quiet: CancellationToken, claims_ended: CancellationToken, orphans: Arc<Orphans>, retry: StorageRetry, shutdown: CancellationToken) {
    tokio::select! {
        _ = quiet.cancelled() => {}
        _ = shutdown.cancelled() => return,
    }
    tokio::select! {
        _ = claims_ended.cancelled() => {}
        _ = shutdown.cancelled() => return,
    }
    tokio::select! {
        _ = orphans.settled() => {}
        _ = shutdown.cancelled() => return,
    }
    let mut outage = OutageBackoff::like(&retry);
    while orphans.suspected() {
        match retry.run("hand back lost claims' jobs", &shutdown, || orphans.sweep()).await {
            Ok(_) => return,
            Err(StoreError::Cancelled) => return,
            Err(e) => {
                if !outage.wait_logged("handing back lost claims' jobs", &e, &shutdown).await {
                    return;
                }
            }
        }
    }
}
