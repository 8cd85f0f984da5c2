//! The handler API: what a job type's code implements, and what it is given.
//!
//! A handler returns `Ok(result)` when the job is done (the optional JSON result is stored on
//! the job) or `Err(outcome)` to say how it failed: [`Outcome::Retry`] (the policy decides
//! whether and when), [`Outcome::Discard`], [`Outcome::DeadLetter`], [`Outcome::Fail`], or
//! [`Outcome::RetryAfter`] to snooze until a given time without spending an attempt. Every
//! failure carries a [`HandlerError`] with a dot-namespaced error type that policies match
//! (`non_retryable_errors`), a message, and optional details.
//!
//! The trait returns a boxed future rather than using `async fn` so handlers can be stored
//! as `Arc<dyn Handler>`; [`handler_fn`] turns an async closure into one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rebound_queue::store::{ProgressReport, StoreError};
use rebound_queue::{HandlerError, Job, Outcome, Store};
use serde_json::Value;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use uuid::Uuid;

/// What a handler run ends with: done (with an optional result) or a failure outcome.
pub type HandlerResult = Result<Option<Value>, Outcome>;

/// The future a [`Handler`] returns.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = HandlerResult> + Send + 'a>>;

/// Code that runs jobs of one or more types.
///
/// The future may be dropped before it finishes: when the attempt times out, when the job's
/// lock was lost (cancelled by an operator, rescued), or when the worker shuts down and the
/// grace period ends. Handlers that start work outside the future (threads, child processes)
/// should stop it when [`JobContext::cancelled`] fires.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, job: JobContext) -> HandlerFuture<'_>;
}

/// A job as its handler sees it.
#[derive(Clone, Debug)]
pub struct JobContext {
    job: Arc<Job>,
    worker_id: Arc<str>,
    cancel: CancellationToken,
    /// Where progress reports go (none in handler unit tests).
    store: Option<Store>,
}

impl JobContext {
    pub(crate) fn new(job: Arc<Job>, worker_id: Arc<str>, cancel: CancellationToken, store: Option<Store>) -> Self {
        JobContext { job, worker_id, cancel, store }
    }

    /// Reports how far this execution has got (`percentage` from 0 to 100, and what to show
    /// with it): kept with the job (its dashboard page, `GET /ojs/v1/jobs/{id}/progress`) and
    /// emitted as a `job.progress` event. One write, not retried: a report lost to a database
    /// blip is only missing, the job is unaffected, and the error says why. Refused
    /// ([`StoreError::Conflict`]) once the job is no longer this worker's, and for a
    /// percentage out of range or an over-long message ([`StoreError::Invalid`]).
    pub async fn progress(&self, percentage: f64, message: Option<&str>) -> Result<(), StoreError> {
        let report = ProgressReport {
            job_id: self.job.id,
            // Not the attempt: one retried in place runs before its failure is written.
            attempt: None,
            worker_id: Some(self.worker_id.to_string()),
            percentage,
            message: message.map(str::to_owned),
            data: None,
        };
        match &self.store {
            Some(store) => store.report_progress(&report).await.map(drop),
            None => report.validate(),
        }
    }

    /// The whole stored job (envelope, options, attempt count, …).
    pub fn job(&self) -> &Job {
        &self.job
    }

    pub fn id(&self) -> Uuid {
        self.job.id
    }

    pub fn job_type(&self) -> &str {
        &self.job.job_type
    }

    pub fn queue(&self) -> &str {
        &self.job.queue
    }

    /// The job's arguments: always a JSON array.
    pub fn args(&self) -> &Value {
        &self.job.args
    }

    /// This execution's number, 1-based.
    pub fn attempt(&self) -> i32 {
        self.job.attempt
    }

    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Fires when the attempt is abandoned (timeout, lost lock, shutdown).
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The n-th argument, if present.
    pub fn arg(&self, n: usize) -> Option<&Value> {
        self.job.args.get(n)
    }

    /// The workflow this job belongs to, if any (OJS workflows: a chain's step, a group's or
    /// batch's job, a batch's callback).
    pub fn workflow_id(&self) -> Option<Uuid> {
        self.job.extra.get("workflow_id").and_then(Value::as_str).and_then(|s| s.parse().ok())
    }

    /// The results of the workflow's jobs before this one, by index: every earlier step of a
    /// chain, or every job of a batch for its callbacks (`null` where one failed). Empty for a
    /// chain's first step, a group's jobs, a graph's steps (see [`Self::upstream_result`]) and
    /// jobs outside workflows.
    pub fn parent_results(&self) -> &[Value] {
        self.job.extra.get("parent_results").and_then(Value::as_array).map_or(&[], Vec::as_slice)
    }

    /// In a graph workflow, the result of the step with id `step_id`, if it is upstream of
    /// this one (a dependency, or a dependency's, and so on): a graph's step is given every
    /// upstream result by step id.
    pub fn upstream_result(&self, step_id: &str) -> Option<&Value> {
        self.job.extra.get("parent_results").and_then(Value::as_object).and_then(|m| m.get(step_id))
    }
}

/// A [`Handler`] made of an async closure; see [`handler_fn`].
pub struct HandlerFn<F>(F);

impl<F, Fut> Handler for HandlerFn<F>
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    fn handle(&self, job: JobContext) -> HandlerFuture<'_> {
        Box::pin((self.0)(job))
    }
}

/// Wraps an async closure as a handler:
/// `handler_fn(|job| async move { Ok(Some(json!({"sent": true}))) })`.
pub fn handler_fn<F, Fut>(f: F) -> HandlerFn<F>
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    HandlerFn(f)
}

/// A retryable failure of `error_type` (the policy decides whether and when it runs again).
pub fn retry(error_type: impl Into<String>, message: impl Into<String>) -> Outcome {
    Outcome::Retry(HandlerError::new(error_type, message))
}

/// A failure that ends the job at once by its policy's `on_exhaustion` (discard or dead
/// letter), whatever its `non_retryable_errors` say.
pub fn non_retryable(error_type: impl Into<String>, message: impl Into<String>) -> Outcome {
    Outcome::Retry(HandlerError::new(error_type, message).non_retryable())
}

/// A job context for handler unit tests: an active job of `job_type` at `attempt`.
#[cfg(test)]
pub(crate) fn test_context(job_type: &str, args: Value, attempt: i32) -> JobContext {
    let mut job = rebound_queue::NewJob::new(job_type, args).into_job(Uuid::now_v7(), rebound_queue::JobState::Active, 3, jiff::Timestamp::now());
    job.attempt = attempt;
    JobContext::new(Arc::new(job), Arc::from("test-worker"), CancellationToken::new(), None)
}
