//! Writes what handlers ended with, in batches.
//!
//! Results arrive on a channel; they are flushed when `batch_size` wait or `flush_interval`
//! after the first one, as one `complete_batch`, one `fail_batch` and one `release` statement,
//! so throughput is bounded by Postgres rather than by round trips. Every write names the
//! attempt and the worker, so the store refuses a result for a run that is no longer current.
//!
//! A write that fails through its storage retries is not dropped: the results stay buffered
//! and are tried again after an [`OutageBackoff`] wait, while heartbeats keep their jobs'
//! locks alive. Only a result the database rejects for good (not a transient error) is given
//! up, alone, after its batch was split to isolate it; its job is then rescued after the
//! visibility timeout, so even that is delayed work, not lost work.

use std::sync::Arc;

use rebound_queue::Outcome;
use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::store::{Completion, Failure};
use rebound_queue::{Store, StoreError};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::outage::OutageBackoff;
use crate::running::RunningJobs;
use crate::settings::CompleterSettings;

/// The end of one attempt, on its way to the database.
#[derive(Clone, Debug, PartialEq)]
pub enum Finished {
    Completed { id: Uuid, attempt: i32, result: Option<Value> },
    Failed { id: Uuid, attempt: i32, outcome: Outcome },
    /// Handed back without counting the attempt (shutdown before the handler finished).
    Released { id: Uuid, attempt: i32 },
}

impl Finished {
    fn key(&self) -> (Uuid, i32) {
        match self {
            Finished::Completed { id, attempt, .. } | Finished::Failed { id, attempt, .. } | Finished::Released { id, attempt } => (*id, *attempt),
        }
    }
}

/// Where executors send results. Cheap to clone; the completer stops once every handle is
/// dropped and the buffer is written.
#[derive(Clone, Debug)]
pub struct CompleterHandle {
    tx: mpsc::UnboundedSender<Finished>,
}

impl CompleterHandle {
    pub fn send(&self, finished: Finished) {
        // The completer outlives every handle (it only stops after they are all dropped), so
        // a send can only fail after a hard stop, when the job is left to the rescuer anyway.
        if self.tx.send(finished).is_err() {
            tracing::warn!("completer has stopped; result left for the rescuer");
        }
    }
}

/// What the completer wrote over its life.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompleterReport {
    pub completed: u64,
    pub failed: u64,
    pub released: u64,
    /// Results the store refused because the attempt was no longer current.
    pub refused: u64,
    /// Results still unwritten at a hard stop (their jobs will be rescued).
    pub unwritten: u64,
}

/// The batching writer. Create with [`Completer::new`], run with [`Completer::run`].
pub struct Completer {
    rx: mpsc::UnboundedReceiver<Finished>,
    store: Store,
    worker_id: String,
    running: Arc<RunningJobs>,
    settings: CompleterSettings,
    retry: StorageRetry,
    report: CompleterReport,
}

impl Completer {
    pub fn new(store: Store, worker_id: String, running: Arc<RunningJobs>, settings: CompleterSettings, retry: StorageRetry) -> (Completer, CompleterHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let completer = Completer { rx, store, worker_id, running, settings, retry, report: CompleterReport::default() };
        (completer, CompleterHandle { tx })
    }

    /// Runs until every handle is dropped and everything is written, or until `hard_stop`
    /// (which also interrupts storage-retry waits).
    pub async fn run(mut self, hard_stop: CancellationToken) -> CompleterReport {
        let batch_size = self.settings.batch_size.max(1);
        let mut buffer: Vec<Finished> = Vec::new();
        let mut open = true;
        let mut flush_at: Option<Instant> = None;
        let mut outage = OutageBackoff::like(&self.retry);
        loop {
            let in_outage = outage.failures() > 0;
            tokio::select! {
                biased;
                _ = hard_stop.cancelled() => break,
                msg = self.rx.recv(), if open => match msg {
                    Some(f) => {
                        if buffer.is_empty() && !in_outage {
                            flush_at = Some(Instant::now() + self.settings.flush_interval);
                        }
                        buffer.push(f);
                        // Take whatever else is already queued without waiting.
                        while buffer.len() < batch_size.saturating_mul(8) {
                            match self.rx.try_recv() {
                                Ok(f) => buffer.push(f),
                                Err(_) => break,
                            }
                        }
                    }
                    None => open = false,
                },
                _ = sleep_until_opt(flush_at), if flush_at.is_some() => {}
            }
            let due = flush_at.is_some_and(|at| at <= Instant::now());
            let full = buffer.len() >= batch_size && !in_outage;
            let draining = !open && !in_outage;
            if !buffer.is_empty() && (due || full || draining) {
                match self.flush(&mut buffer, batch_size, &hard_stop).await {
                    Ok(()) => {
                        outage.reset();
                        flush_at = None;
                    }
                    Err(()) if hard_stop.is_cancelled() => break,
                    Err(()) => {
                        let wait = outage.next_delay();
                        tracing::error!(pending = buffer.len(), retry_in_ms = wait.as_millis() as u64,
                            "could not write job results; keeping them and trying again");
                        flush_at = Some(Instant::now() + wait);
                    }
                }
            }
            if buffer.is_empty() {
                flush_at = None;
                if !open {
                    break;
                }
            }
        }
        self.report.unwritten += buffer.len() as u64;
        if !buffer.is_empty() {
            let ids: Vec<String> = buffer.iter().map(|f| f.key().0.to_string()).collect();
            tracing::error!(count = buffer.len(), ids = ?ids,
                "stopping with unwritten job results; their jobs will be rescued after the visibility timeout");
        }
        self.report
    }

    /// Writes the buffer in chunks. On failure the unwritten results stay in `buffer`.
    async fn flush(&mut self, buffer: &mut Vec<Finished>, batch_size: usize, cancel: &CancellationToken) -> Result<(), ()> {
        while !buffer.is_empty() {
            let take = buffer.len().min(batch_size);
            let chunk: Vec<Finished> = buffer.drain(..take).collect();
            if let Err(unwritten) = self.write(chunk, cancel).await {
                // Keep the order: unwritten results go back in front.
                buffer.splice(0..0, unwritten);
                return Err(());
            }
        }
        Ok(())
    }

    /// Writes one chunk: completions, failures and releases concurrently. Returns the results
    /// that could not be written for now.
    async fn write(&mut self, chunk: Vec<Finished>, cancel: &CancellationToken) -> Result<(), Vec<Finished>> {
        let mut completions = Vec::new();
        let mut failures = Vec::new();
        let mut releases = Vec::new();
        for f in chunk {
            match f {
                Finished::Completed { .. } => completions.push(f),
                Finished::Failed { .. } => failures.push(f),
                Finished::Released { .. } => releases.push(f),
            }
        }
        let (c, f, r) = tokio::join!(
            self.write_completions(&completions, cancel),
            self.write_failures(&failures, cancel),
            self.write_releases(&releases, cancel),
        );
        let mut unwritten = Vec::new();
        for (outcome, items) in [(c, completions), (f, failures), (r, releases)] {
            match outcome {
                Ok(written) => self.settle(&items, &written),
                Err(e) if !e.is_transient() && !matches!(e, StoreError::Cancelled) => {
                    unwritten.extend(self.isolate(items, e, cancel).await);
                }
                Err(_) => unwritten.extend(items),
            }
        }
        if unwritten.is_empty() { Ok(()) } else { Err(unwritten) }
    }

    /// A batch was rejected for good: write its results one by one so one bad result cannot
    /// hold back the others. Returns those still unwritten for a transient reason.
    async fn isolate(&mut self, items: Vec<Finished>, error: StoreError, cancel: &CancellationToken) -> Vec<Finished> {
        if items.len() == 1 {
            let (id, attempt) = items[0].key();
            tracing::error!(job_id = %id, attempt, error = %error,
                "the database rejected this job's result; leaving the job to the rescuer");
            self.running.release(id, attempt);
            return Vec::new();
        }
        let mut unwritten = Vec::new();
        for item in items {
            let single = std::slice::from_ref(&item);
            let outcome = match &item {
                Finished::Completed { .. } => self.write_completions(single, cancel).await,
                Finished::Failed { .. } => self.write_failures(single, cancel).await,
                Finished::Released { .. } => self.write_releases(single, cancel).await,
            };
            match outcome {
                Ok(written) => self.settle(single, &written),
                Err(e) if e.is_transient() || matches!(e, StoreError::Cancelled) => unwritten.push(item),
                Err(e) => {
                    let (id, attempt) = item.key();
                    tracing::error!(job_id = %id, attempt, error = %e,
                        "the database rejected this job's result; leaving the job to the rescuer");
                    self.running.release(id, attempt);
                }
            }
        }
        unwritten
    }

    /// Results the store accepted or refused as stale: either way the job is no longer held.
    fn settle(&mut self, items: &[Finished], written: &[Uuid]) {
        for item in items {
            let (id, attempt) = item.key();
            if written.contains(&id) {
                match item {
                    Finished::Completed { .. } => self.report.completed += 1,
                    Finished::Failed { .. } => self.report.failed += 1,
                    Finished::Released { .. } => self.report.released += 1,
                }
            } else {
                // Rescued, cancelled or already written by an earlier try whose answer was
                // lost with the connection: the attempt is no longer ours to record.
                self.report.refused += 1;
                tracing::debug!(job_id = %id, attempt, "result refused: the attempt is no longer current");
            }
            self.running.release(id, attempt);
        }
    }

    async fn write_completions(&self, items: &[Finished], cancel: &CancellationToken) -> Result<Vec<Uuid>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let batch: Vec<Completion> = items
            .iter()
            .filter_map(|f| match f {
                Finished::Completed { id, attempt, result } => Some(Completion {
                    id: *id,
                    attempt: Some(*attempt),
                    worker_id: Some(self.worker_id.clone()),
                    result: result.clone(),
                }),
                _ => None,
            })
            .collect();
        self.retry.run("complete", cancel, || self.store.complete_batch(&batch)).await
    }

    async fn write_failures(&self, items: &[Finished], cancel: &CancellationToken) -> Result<Vec<Uuid>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let batch: Vec<Failure> = items
            .iter()
            .filter_map(|f| match f {
                Finished::Failed { id, attempt, outcome } => Some(Failure {
                    id: *id,
                    attempt: Some(*attempt),
                    worker_id: Some(self.worker_id.clone()),
                    outcome: outcome.clone(),
                    error_code: None,
                }),
                _ => None,
            })
            .collect();
        let results = self.retry.run("fail", cancel, || self.store.fail_batch(&batch)).await?;
        for r in &results {
            tracing::debug!(job_id = %r.job.id, job_type = %r.job.job_type, attempt = r.job.attempt,
                outcome = %r.decision.attempt_outcome, state = %r.job.state, "job attempt failed");
        }
        Ok(results.into_iter().map(|r| r.job.id).collect())
    }

    async fn write_releases(&self, items: &[Finished], cancel: &CancellationToken) -> Result<Vec<Uuid>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = items.iter().map(|f| f.key().0).collect();
        let worker = self.worker_id.as_str();
        let released = self
            .retry
            .run("release", cancel, || self.store.release(&ids, Some(worker), "worker shutting down; the attempt is not counted"))
            .await?;
        Ok(released.into_iter().map(|j| j.id).collect())
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

