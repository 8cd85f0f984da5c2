//! Runs one attempt of one job and says how it ended.
//!
//! The handler's future races three things: its per-attempt timeout (job `timeout_ms`, else
//! the type's default, else the worker's), the loss of the job's lock (found by a heartbeat),
//! and the end of the shutdown grace period. A timeout or a panic is a failed attempt
//! (`rebound.timeout`, `rebound.panic`); a lost job is left alone (the database has already
//! moved on); an attempt cut short by shutdown is released without being counted.

use std::sync::Arc;
use std::time::Duration;

use rebound_queue::store::KnownRun;
use rebound_queue::{HandlerError, Job, Outcome};
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::completer::{CompleterHandle, Finished};
use crate::handler::JobContext;
use crate::panic_capture;
use crate::registry::HandlerRegistry;

/// Starts attempts of claimed jobs as tasks.
#[derive(Clone)]
pub struct Dispatcher {
    registry: Arc<HandlerRegistry>,
    completer: CompleterHandle,
    worker_id: Arc<str>,
    default_timeout: Duration,
    /// Fired when the shutdown grace period is over.
    abort: CancellationToken,
    tracker: TaskTracker,
}

impl Dispatcher {
    pub fn new(registry: Arc<HandlerRegistry>, completer: CompleterHandle, worker_id: Arc<str>, default_timeout: Duration, abort: CancellationToken, tracker: TaskTracker) -> Self {
        Dispatcher { registry, completer, worker_id, default_timeout, abort, tracker }
    }

    /// Runs `job` on its own task, holding `slot` (a unit of its queue's concurrency) until
    /// the handler is done. `lost` fires if the job stops being ours.
    pub fn dispatch(&self, job: Job, lost: CancellationToken, slot: OwnedSemaphorePermit) {
        let me = self.clone();
        self.tracker.spawn(async move {
            let finished = me.execute(Arc::new(job), lost).await;
            drop(slot);
            if let Some(f) = finished {
                me.completer.send(f);
            }
        });
    }

    /// The per-attempt timeout: the job's own, else its type's, else the worker's.
    pub fn timeout_for(&self, job: &Job) -> Duration {
        job.timeout_ms
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(ms as u64))
            .or_else(|| self.registry.lookup(&job.job_type).and_then(|r| r.timeout))
            .unwrap_or(self.default_timeout)
    }

    /// Runs the attempt; `None` when nothing is to be written (the job was lost).
    async fn execute(&self, job: Arc<Job>, lost: CancellationToken) -> Option<Finished> {
        let (id, attempt) = (job.id, job.attempt);
        let Some(registration) = self.registry.lookup(&job.job_type) else {
            tracing::warn!(job_id = %id, job_type = %job.job_type, "no handler for this job type");
            let error = HandlerError::new("rebound.unknown_type", format!("worker {} has no handler for job type {:?}", self.worker_id, job.job_type))
                .with_details(json!({ "worker_id": &*self.worker_id, "handled_types": self.registry.types() }));
            return Some(Finished::Failed { id, attempt, outcome: Outcome::Retry(error), known: known(&job) });
        };
        let timeout = self.timeout_for(&job);
        let handler = registration.handler.clone();
        let cancel = CancellationToken::new();
        let ctx = JobContext::new(job.clone(), self.worker_id.clone(), cancel.clone());
        tracing::debug!(job_id = %id, job_type = %job.job_type, attempt, "running job");

        let started = std::time::Instant::now();
        let future = match panic_capture::call(|| handler.handle(ctx)) {
            Ok(f) => f,
            Err(panic) => return Some(self.panicked(&job, panic)),
        };
        let mut future = panic_capture::catch(future);
        let ended = tokio::select! {
            biased;
            r = tokio::time::timeout(timeout, &mut future) => Some(r),
            _ = lost.cancelled() => None,
            _ = self.abort.cancelled() => {
                cancel.cancel();
                tracing::warn!(job_id = %id, attempt, "shutdown grace period over; releasing the job without counting the attempt");
                return Some(Finished::Released { id, attempt });
            }
        };
        cancel.cancel();
        drop(future);
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match ended {
            None => {
                tracing::warn!(job_id = %id, attempt, "job is no longer held by this worker (cancelled or rescued); handler stopped");
                None
            }
            Some(Ok(Ok(Ok(result)))) => {
                tracing::debug!(job_id = %id, attempt, elapsed_ms, "job completed");
                Some(Finished::Completed { id, attempt, result })
            }
            Some(Ok(Ok(Err(outcome)))) => {
                if let Some(e) = outcome.error() {
                    tracing::debug!(job_id = %id, job_type = %job.job_type, attempt, error_type = %e.error_type, message = %e.message, "handler failed");
                }
                Some(Finished::Failed { id, attempt, outcome, known: known(&job) })
            }
            Some(Ok(Err(panic))) => Some(self.panicked(&job, panic)),
            Some(Err(_elapsed)) => {
                let ms = timeout.as_millis() as u64;
                tracing::warn!(job_id = %id, job_type = %job.job_type, attempt, timeout_ms = ms, "handler timed out");
                let error = HandlerError::new("rebound.timeout", format!("attempt {attempt} ran longer than its timeout of {ms} ms"))
                    .with_details(json!({ "timeout_ms": ms, "worker_id": &*self.worker_id }));
                Some(Finished::Failed { id, attempt, outcome: Outcome::Retry(error), known: known(&job) })
            }
        }
    }

    fn panicked(&self, job: &Job, panic: panic_capture::CapturedPanic) -> Finished {
        tracing::error!(job_id = %job.id, job_type = %job.job_type, attempt = job.attempt, panic = %panic.message,
            location = panic.location.as_deref().unwrap_or("?"), "handler panicked");
        let error = HandlerError::new("rebound.panic", format!("handler panicked: {}", panic.message)).with_details(panic.details());
        Finished::Failed { id: job.id, attempt: job.attempt, outcome: Outcome::Retry(error), known: known(job) }
    }
}

/// What recording a failure of `job` needs to know of it, so the write skips reading it back.
fn known(job: &Job) -> KnownRun {
    KnownRun { job_type: job.job_type.clone(), retry: job.retry.clone() }
}
