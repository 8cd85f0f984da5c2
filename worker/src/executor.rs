//! Runs the attempts of a claimed job and says how they ended.
//!
//! The handler's future races three things: its per-attempt timeout (job `timeout_ms`, else
//! the type's default, else the worker's), the loss of the job's lock (found by a heartbeat),
//! and the end of the shutdown grace period. A timeout or a panic is a failed attempt
//! (`rebound.timeout`, `rebound.panic`); a lost job is left alone (the database has already
//! moved on); an attempt cut short by shutdown is released without being counted.
//!
//! **Retries in place.** When the live policy retries a failure with no backoff, the job
//! runs again at once in the same slot, under the same lock, as the next attempt, instead of
//! going back through the queue to be claimed again (it would be `available` at once anyway,
//! for any worker). The policy is read from the worker's copy ([`LivePolicies`]); without a
//! fresh copy, during shutdown, or with `retry_in_place` off, the failure goes to the
//! database as usual, which decides with the live policy. Every failure is still an attempt
//! row with its error and policy: it is written with the next execution's result when that
//! comes quickly, or on its own once that execution has run for `in_place_write_after`, so a
//! long one shows as the running attempt it is. Pausing a queue stops claims, not the
//! immediate retries of a job already running.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use rebound_queue::outcome::{NextStep, TIMEOUT_ERROR};
use rebound_queue::store::{InPlaceEnd, InPlaceRun, KnownRun, RetriedInPlace};
use rebound_queue::{HandlerError, Job, Outcome, RetryPolicy, Store};
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::completer::{CompleterHandle, Finished};
use crate::handler::JobContext;
use crate::live_policies::LivePolicies;
use crate::panic_capture;
use crate::registry::HandlerRegistry;

/// How failures are retried in place (see the module docs).
#[derive(Clone, Debug)]
pub struct InPlaceRetries {
    pub enabled: bool,
    pub write_after: Duration,
    pub policies: Arc<LivePolicies>,
    /// Fired when shutdown begins: nothing new starts after that.
    pub stopping: CancellationToken,
}

/// Starts attempts of claimed jobs as tasks. Cheap to clone: every job's task holds one.
#[derive(Clone)]
pub struct Dispatcher(Arc<Executor>);

/// What every job's task shares.
pub(crate) struct Executor {
    pub(crate) registry: Arc<HandlerRegistry>,
    pub(crate) completer: CompleterHandle,
    pub(crate) worker_id: Arc<str>,
    pub(crate) default_timeout: Duration,
    /// Fired when the shutdown grace period is over.
    pub(crate) abort: CancellationToken,
    pub(crate) tracker: TaskTracker,
    pub(crate) in_place: InPlaceRetries,
    /// For handlers' progress reports.
    pub(crate) store: Store,
}

/// Database time for a job's executions: the claim's timestamp plus what this process's
/// monotonic clock measured since, so attempt times never depend on this host's wall clock.
struct JobClock {
    claimed_at: Timestamp,
    since: Instant,
}

impl JobClock {
    fn start(job: &Job) -> Self {
        JobClock { claimed_at: job.started_at.unwrap_or_else(Timestamp::now), since: Instant::now() }
    }

    fn now(&self) -> Timestamp {
        let elapsed = SignedDuration::try_from(self.since.elapsed()).unwrap_or(SignedDuration::MAX);
        self.claimed_at.checked_add(elapsed).unwrap_or(self.claimed_at)
    }
}

impl Dispatcher {
    pub(crate) fn new(executor: Executor) -> Self {
        Dispatcher(Arc::new(executor))
    }

    /// Runs `job` on its own task, holding `slot` (a unit of its queue's concurrency) until
    /// its last execution is done. `lost` fires if the job stops being ours.
    pub fn dispatch(&self, job: Job, lost: CancellationToken, slot: OwnedSemaphorePermit) {
        let me = self.0.clone();
        // Boxed before the task is spawned: a job is large and the task's future holds it.
        let job = Arc::new(job);
        self.0.tracker.spawn(async move {
            me.run(job, lost).await;
            drop(slot);
        });
    }
}

impl Executor {
    /// Executes `job` until an execution ends in something other than a failure retried in
    /// place, and hands what is to be written to the completer.
    async fn run(&self, mut job: Arc<Job>, lost: CancellationToken) {
        let clock = JobClock::start(&job);
        let mut started_at = clock.claimed_at;
        // The run the database holds: results are written guarded by it.
        let mut stored_attempt = job.attempt;
        let mut stored_started_at = job.started_at;
        let mut retried: Vec<RetriedInPlace> = Vec::new();
        loop {
            // Boxed: an execution's state (the handler's future, its timeout, the races) is
            // large, and every claimed job's task would otherwise be spawned at that size.
            let mut execution = Box::pin(self.execute(job.clone(), lost.clone()));
            let finished = if retried.is_empty() {
                execution.await
            } else {
                tokio::select! {
                    f = execution.as_mut() => f,
                    _ = tokio::time::sleep(self.in_place.write_after) => {
                        // Taking a while: the failures are written now, so they show (and are
                        // kept) while this execution runs on as the job's current attempt.
                        let run = self.in_place_run(&job, (stored_attempt, stored_started_at), std::mem::take(&mut retried), started_at, InPlaceEnd::Running);
                        stored_attempt = job.attempt;
                        stored_started_at = Some(started_at);
                        self.completer.send(Finished::InPlace(run));
                        execution.await
                    }
                }
            };
            let Some(finished) = finished else { return };
            let finished_at = clock.now();
            let policy = match &finished {
                Finished::Failed { outcome, .. } => self.retry_at_once(&job, outcome, &lost),
                _ => None,
            };
            if let Some(policy) = policy
                && let Finished::Failed { outcome: Outcome::Retry(error), .. } = finished
            {
                tracing::debug!(job_id = %job.id, attempt = job.attempt, error_type = %error.error_type, "retrying in place");
                retried.push(RetriedInPlace { attempt: job.attempt, error, policy, started_at, finished_at });
                // The handler's context is gone with its execution, so this is the only
                // reference left and the job is updated in place rather than copied.
                let next = Arc::make_mut(&mut job);
                next.attempt += 1;
                next.started_at = Some(finished_at);
                started_at = finished_at;
                continue;
            }
            if retried.is_empty() {
                self.completer.send(finished);
            } else if let Finished::Completed { result, .. } = finished {
                let run = self.in_place_run(&job, (stored_attempt, stored_started_at), retried, started_at, InPlaceEnd::Completed(result));
                self.completer.send(Finished::InPlace(run));
            } else {
                // The completer writes a job's results in order: the failures first.
                self.completer.send(Finished::InPlace(self.in_place_run(&job, (stored_attempt, stored_started_at), retried, started_at, InPlaceEnd::Running)));
                self.completer.send(finished);
            }
            return;
        }
    }

    /// The policy that retries this failure at once, if it is to be retried in place.
    fn retry_at_once(&self, job: &Job, outcome: &Outcome, lost: &CancellationToken) -> Option<Arc<RetryPolicy>> {
        let p = &self.in_place;
        if !p.enabled || p.stopping.is_cancelled() || self.abort.is_cancelled() || lost.is_cancelled() {
            return None;
        }
        // Only failures the policy judges; a job with no handler here would only fail again.
        if !matches!(outcome, Outcome::Retry(_)) || self.registry.lookup(&job.job_type).is_none() {
            return None;
        }
        // A keyed job's retry goes through the store: it is a start its key's rate window must
        // count, and the upstream may have said when it takes calls again (`rate_limit_until`,
        // ojs-rate-limiting §9), which holds the key until then.
        if job.rate_limit_key.is_some() {
            return None;
        }
        let layers = p.policies.current()?;
        let (policy, decision) = layers.decide(&job.job_type, job.retry.as_ref(), job.attempt, outcome, Timestamp::now(), &mut fastrand::Rng::new());
        // The store's rule too: a sub-millisecond backoff is no backoff.
        match decision.next {
            NextStep::Retry { delay, .. } if delay.as_millis() == 0 => Some(policy),
            _ => None,
        }
    }

    /// `stored`: the run the database holds (attempt, start), which the write is guarded by.
    fn in_place_run(&self, job: &Job, stored: (i32, Option<Timestamp>), retried: Vec<RetriedInPlace>, started_at: Timestamp, end: InPlaceEnd) -> InPlaceRun {
        let (stored_attempt, stored_started_at) = stored;
        InPlaceRun { id: job.id, stored_attempt, stored_started_at, worker_id: self.worker_id.to_string(), retried, started_at, end }
    }

    fn timeout_for(&self, job: &Job) -> Duration {
        job.timeout_ms
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(ms.min(rebound_queue::bounds::MAX_TIMEOUT_MS) as u64))
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
        let ctx = JobContext::new(job.clone(), self.worker_id.clone(), cancel.clone(), Some(self.store.clone()));
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
                return Some(Finished::Released { id, attempt, started_at: job.started_at });
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
            Some(Ok(Ok(Ok(mut result)))) => {
                tracing::debug!(job_id = %id, attempt, elapsed_ms, "job completed");
                // Handler output is stored whatever it holds: NULs become U+FFFD (see
                // rebound_queue::storable), rather than the write failing for good.
                if let Some(r) = &mut result {
                    rebound_queue::storable::make_storable(r);
                }
                Some(Finished::Completed { id, attempt, started_at: job.started_at, result })
            }
            Some(Ok(Ok(Err(mut outcome)))) => {
                outcome.make_storable();
                if let Some(e) = outcome.error() {
                    tracing::debug!(job_id = %id, job_type = %job.job_type, attempt, error_type = %e.error_type, message = %e.message, "handler failed");
                }
                Some(Finished::Failed { id, attempt, outcome, known: known(&job) })
            }
            Some(Ok(Err(panic))) => Some(self.panicked(&job, panic)),
            Some(Err(_elapsed)) => {
                let ms = timeout.as_millis() as u64;
                tracing::warn!(job_id = %id, job_type = %job.job_type, attempt, timeout_ms = ms, "handler timed out");
                let error = HandlerError::new(TIMEOUT_ERROR, format!("attempt {attempt} ran longer than its timeout of {ms} ms")).with_details(json!({
                    "timeout_ms": ms, "worker_id": &*self.worker_id,
                    // The OJS shape of a timeout error (ojs-timeouts §8).
                    "timeout_kind": "execution", "limit_ms": ms, "limit_seconds": ms as f64 / 1000.0, "elapsed_seconds": elapsed_ms as f64 / 1000.0,
                }));
                Some(Finished::Failed { id, attempt, outcome: Outcome::Retry(error), known: known(&job) })
            }
        }
    }

    fn panicked(&self, job: &Job, panic: panic_capture::CapturedPanic) -> Finished {
        tracing::error!(job_id = %job.id, job_type = %job.job_type, attempt = job.attempt, panic = %panic.message,
            location = panic.location.as_deref().unwrap_or("?"), "handler panicked");
        let mut error = HandlerError::new("rebound.panic", format!("handler panicked: {}", panic.message)).with_details(panic.details());
        error.make_storable();
        Finished::Failed { id: job.id, attempt: job.attempt, outcome: Outcome::Retry(error), known: known(job) }
    }
}

/// What recording a failure of `job` needs to know of it, so the write skips reading it back.
fn known(job: &Job) -> KnownRun {
    KnownRun { job_type: job.job_type.clone(), retry: job.retry.clone(), started_at: job.started_at }
}
