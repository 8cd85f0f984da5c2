//! Writes what handlers ended with, in batches.
//!
//! Results arrive on a channel; a batch is written when `batch_size` wait or `flush_interval`
//! after the first one, as one `complete_batch`, one `fail_batch`, one `release` and one
//! `record_in_place` statement,
//! so throughput is bounded by Postgres rather than by round trips. Up to `flushes_in_flight`
//! batches are written at once: with one at a time, every batch would wait out the previous
//! one's commit (a WAL flush, with `synchronous_commit` on) while both Postgres and the worker
//! sit idle; a few at once overlap those waits and let Postgres flush their commits together.
//! Batches hold distinct results, and every write names the attempt and the worker, so the
//! store refuses a result for a run that is no longer current whichever batch lands first.
//! A job has one result, except one retried in place whose failures were written ahead of its
//! final result: a job's results are written in the order they came, one write at a time.
//!
//! The claim loops pause while more than `max_backlog` results are unwritten (see
//! [`ResultBacklog`]): a worker whose writes fall behind its claims would otherwise keep
//! claiming jobs it cannot finish recording, holding (and heartbeating) work that other
//! workers could run.
//!
//! A write that fails through its storage retries is not dropped: the results stay buffered
//! and are tried again after an [`OutageBackoff`] wait (one batch at a time until one gets
//! through), while heartbeats keep their jobs' locks alive. Only a result the database rejects
//! for good (not a transient error) is given up, alone, after its batch was split to isolate
//! it; its job is then rescued after the visibility timeout, so even that is delayed work, not
//! lost work.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use jiff::Timestamp;
use rebound_queue::Outcome;
use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::store::{Completion, Failure, InPlaceEnd, InPlaceRun, KnownRun, NamedRun};
use rebound_queue::{Store, StoreError};
use serde_json::Value;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::health::Health;
use crate::outage::OutageBackoff;
use crate::running::{Run, RunningJobs};
use crate::settings::CompleterSettings;

/// The end of one attempt, on its way to the database.
#[derive(Clone, Debug, PartialEq)]
pub enum Finished {
    /// `started_at` is the run's start as stored (see [`Run`]): the write is guarded by it.
    Completed { id: Uuid, attempt: i32, started_at: Option<Timestamp>, result: Option<Value> },
    Failed { id: Uuid, attempt: i32, outcome: Outcome, known: KnownRun },
    /// Handed back without counting the attempt (shutdown before the handler finished).
    Released { id: Uuid, attempt: i32, started_at: Option<Timestamp> },
    /// Failures retried in place, with the execution after them still running or completed
    /// (see [`crate::executor`]). A job may have one of these and then another result: the
    /// completer writes a job's results in the order they came, one write at a time.
    InPlace(InPlaceRun),
}

impl Finished {
    /// The job and the run it holds in the database (the one the write is guarded by).
    fn key(&self) -> (Uuid, Run) {
        match self {
            Finished::Completed { id, attempt, started_at, .. } | Finished::Released { id, attempt, started_at } => (*id, Run::new(*attempt, *started_at)),
            Finished::Failed { id, attempt, known, .. } => (*id, Run::new(*attempt, known.started_at)),
            Finished::InPlace(run) => (run.id, Run::new(run.stored_attempt, run.stored_started_at)),
        }
    }
}

/// How many results were handed to the completer and are not written (or given up) yet.
/// Shared with the claim loops, which wait on it before claiming more.
#[derive(Debug, Default)]
pub struct ResultBacklog {
    unwritten: AtomicUsize,
    shrunk: Notify,
}

impl ResultBacklog {
    pub fn len(&self) -> usize {
        self.unwritten.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn add(&self) {
        self.unwritten.fetch_add(1, Ordering::AcqRel);
    }

    fn remove(&self, n: usize) {
        if n > 0 {
            self.unwritten.fetch_sub(n, Ordering::AcqRel);
            self.shrunk.notify_waiters();
        }
    }

    /// Waits until fewer than `limit` results are unwritten; false if `cancel` fired first.
    pub async fn wait_below(&self, limit: usize, cancel: &CancellationToken) -> bool {
        loop {
            // Registered before the check, so a shrink between the check and the wait still wakes us.
            let shrunk = self.shrunk.notified();
            tokio::pin!(shrunk);
            shrunk.as_mut().enable();
            if self.len() < limit.max(1) {
                return true;
            }
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = shrunk => {}
            }
        }
    }
}

/// Where executors send results. Cheap to clone; the completer stops once every handle is
/// dropped and the buffer is written.
#[derive(Clone, Debug)]
pub struct CompleterHandle {
    tx: mpsc::UnboundedSender<Finished>,
    backlog: Arc<ResultBacklog>,
}

impl CompleterHandle {
    pub fn send(&self, finished: Finished) {
        self.backlog.add();
        // The completer outlives every handle (it only stops after they are all dropped), so
        // a send can only fail after a hard stop, when the job is left to the rescuer anyway.
        if self.tx.send(finished).is_err() {
            self.backlog.remove(1);
            tracing::warn!("completer has stopped; result left for the rescuer");
        }
    }

    /// The results sent and not yet written.
    pub fn backlog(&self) -> Arc<ResultBacklog> {
        self.backlog.clone()
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
    writer: Arc<BatchWriter>,
    running: Arc<RunningJobs>,
    health: Arc<Health>,
    settings: CompleterSettings,
    backlog: Arc<ResultBacklog>,
    report: CompleterReport,
}

impl Completer {
    pub fn new(store: Store, worker_id: String, running: Arc<RunningJobs>, health: Arc<Health>, settings: CompleterSettings, retry: StorageRetry) -> (Completer, CompleterHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        let backlog = Arc::new(ResultBacklog::default());
        let writer = Arc::new(BatchWriter { store, worker_id, retry });
        let completer = Completer { rx, writer, running, health, settings, backlog: backlog.clone(), report: CompleterReport::default() };
        (completer, CompleterHandle { tx, backlog })
    }

    /// Runs until every handle is dropped and everything is written, or until `hard_stop`
    /// (which also interrupts writes in flight and storage-retry waits).
    pub async fn run(mut self, hard_stop: CancellationToken) -> CompleterReport {
        let batch_size = self.settings.batch_size.max(1);
        let most_in_flight = self.settings.flushes_in_flight.max(1);
        let mut buffer: Vec<Finished> = Vec::new();
        let mut writes: JoinSet<BatchOutcome> = JoinSet::new();
        // What each write carries, so a write that panics still lets go of its jobs.
        let mut carried: HashMap<tokio::task::Id, Vec<(Uuid, Run)>> = HashMap::new();
        let mut order = ResultOrder::default();
        let mut open = true;
        let mut flush_at: Option<Instant> = None;
        let mut outage = OutageBackoff::like(&self.writer.retry);
        loop {
            // During an outage one batch probes the database; the rest wait for it.
            let in_outage = outage.failures() > 0;
            let limit = if in_outage { 1 } else { most_in_flight };
            let now = Instant::now();
            while !buffer.is_empty() && writes.len() < limit {
                // A partial batch goes out when it is due and nothing is being written; with a
                // write in flight it waits to fill up (or for that write to end), so a busy
                // worker writes full batches and an idle one each result within `flush_interval`.
                let due = flush_at.is_some_and(|at| at <= now) && writes.is_empty();
                let go = if in_outage { due } else { due || buffer.len() >= batch_size || !open };
                if !go {
                    break;
                }
                let batch = order.take(&mut buffer, batch_size);
                if batch.is_empty() {
                    // Everything waiting belongs to jobs with a write in flight.
                    break;
                }
                let keys: Vec<(Uuid, Run)> = batch.iter().map(Finished::key).collect();
                order.sent(&keys);
                let handle = writes.spawn(self.writer.clone().write(batch, hard_stop.clone()));
                carried.insert(handle.id(), keys);
            }
            if buffer.is_empty() {
                flush_at = None;
            } else if flush_at.is_none() {
                flush_at = Some(now + self.settings.flush_interval);
            }
            if !open && buffer.is_empty() && writes.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                _ = hard_stop.cancelled() => break,
                Some(done) = writes.join_next_with_id(), if !writes.is_empty() => {
                    self.absorb(done, &mut carried, &mut order, &mut buffer, &mut outage, &mut flush_at);
                }
                msg = self.rx.recv(), if open => match msg {
                    Some(f) => {
                        order.note(&f);
                        buffer.push(f);
                        // Take whatever else is already queued without waiting.
                        while buffer.len() < batch_size.saturating_mul(most_in_flight) {
                            match self.rx.try_recv() {
                                Ok(f) => {
                                    order.note(&f);
                                    buffer.push(f);
                                }
                                Err(_) => break,
                            }
                        }
                    }
                    None => open = false,
                },
                _ = sleep_until_opt(flush_at), if flush_at.is_some() && writes.is_empty() => {}
            }
        }
        // After a hard stop the writes in flight end promptly: the stop cancels them.
        while let Some(done) = writes.join_next_with_id().await {
            self.absorb(done, &mut carried, &mut order, &mut buffer, &mut outage, &mut flush_at);
        }
        self.report.unwritten += buffer.len() as u64;
        if !buffer.is_empty() {
            let ids: Vec<String> = buffer.iter().map(|f| f.key().0.to_string()).collect();
            tracing::error!(count = buffer.len(), ids = ?ids,
                "stopping with unwritten job results; their jobs will be rescued after the visibility timeout");
        }
        self.report
    }

    /// Takes in what one write did: settled results let go of their jobs; unwritten ones go
    /// back to the front of the buffer and start (or prolong) an outage wait.
    fn absorb(
        &mut self,
        done: Result<(tokio::task::Id, BatchOutcome), tokio::task::JoinError>,
        carried: &mut HashMap<tokio::task::Id, Vec<(Uuid, Run)>>,
        order: &mut ResultOrder,
        buffer: &mut Vec<Finished>,
        outage: &mut OutageBackoff,
        flush_at: &mut Option<Instant>,
    ) {
        let task = match &done {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        let keys = carried.remove(&task).unwrap_or_default();
        order.returned(&keys);
        let outcome = match done {
            Ok((_, outcome)) => outcome,
            Err(e) => {
                // Cannot happen short of a bug; the jobs are let go so the rescuer re-runs them
                // rather than this worker heartbeating them forever.
                tracing::error!(error = %e, count = keys.len(), "writing job results failed unexpectedly; leaving their jobs to the rescuer");
                for (id, run) in &keys {
                    order.settled(*id);
                    self.running.abandon(*id, *run);
                }
                self.report.unwritten += keys.len() as u64;
                self.backlog.remove(keys.len());
                return;
            }
        };
        let mut settled = outcome.rejected.len();
        let mut done: Vec<(Uuid, Run)> = Vec::with_capacity(outcome.settled.len());
        // Written, refused or given up: either way nothing of these jobs waits on them now.
        for (id, run) in &outcome.rejected {
            order.settled(*id);
            // They ran: their locks lapse and the rescuer counts the attempt.
            self.running.abandon(*id, *run);
        }
        for (item, _) in &outcome.settled {
            if matches!(item, Finished::InPlace(run) if run.end == InPlaceEnd::Running) {
                order.settled(item.key().0);
            }
        }
        for (item, written) in &outcome.settled {
            let (id, run_key) = item.key();
            settled += 1;
            if let Finished::InPlace(run) = item
                && run.end == InPlaceEnd::Running
            {
                if *written {
                    // The job now stands at the attempt still running; its result names it.
                    self.report.failed += run.retried.len() as u64;
                    self.running.advance(id, run_key, Run::new(run.current_attempt(), Some(run.started_at)));
                } else {
                    // No longer ours: stop the execution still running, write nothing more.
                    self.report.refused += 1;
                    self.running.lose(&[(id, run_key)]);
                }
                continue;
            }
            if *written {
                match item {
                    Finished::Completed { .. } => self.report.completed += 1,
                    Finished::Failed { .. } => self.report.failed += 1,
                    Finished::Released { .. } => self.report.released += 1,
                    Finished::InPlace(run) => {
                        self.report.failed += run.retried.len() as u64;
                        self.report.completed += 1;
                    }
                }
            } else {
                // Rescued, cancelled or already written by an earlier try whose answer was
                // lost with the connection: the attempt is no longer ours to record.
                self.report.refused += 1;
                tracing::debug!(job_id = %id, attempt = run_key.attempt, "result refused: the attempt is no longer current");
            }
            done.push((id, run_key));
        }
        self.running.release_all(&done);
        self.backlog.remove(settled);
        if outcome.unwritten.is_empty() {
            if outage.failures() > 0 {
                tracing::info!("job results are written again");
            }
            outage.reset();
            self.health.results_ok();
        } else {
            let wait = outage.next_delay();
            // Keep the order: unwritten results go back in front.
            buffer.splice(0..0, outcome.unwritten);
            let error = outcome.error.unwrap_or_default();
            tracing::error!(pending = buffer.len(), retry_in_ms = wait.as_millis() as u64, next_try_at = %crate::outage::at_after(wait),
                error = %error, "could not write job results; keeping them and trying again");
            self.health.results_failing(&error);
            *flush_at = Some(Instant::now() + wait);
        }
    }
}

/// What writing one batch came to.
#[derive(Debug, Default)]
struct BatchOutcome {
    /// Results the store took (`true`) or refused as no longer current (`false`).
    settled: Vec<(Finished, bool)>,
    /// `(id, run)` of results the database rejected for good; their jobs go to the rescuer.
    rejected: Vec<(Uuid, Run)>,
    /// Results not written for now (a transient error outlasted the storage retry).
    unwritten: Vec<Finished>,
    /// Why they were not.
    error: Option<String>,
}

impl BatchOutcome {
    fn settle(&mut self, items: Vec<Finished>, written: &[Uuid]) {
        let written: HashSet<Uuid> = written.iter().copied().collect();
        self.settled.extend(items.into_iter().map(|f| {
            let took = written.contains(&f.key().0);
            (f, took)
        }));
    }
}

/// Writes batches; shared by the writes in flight.
struct BatchWriter {
    store: Store,
    worker_id: String,
    retry: StorageRetry,
}

impl BatchWriter {
    /// Writes one batch: completions, failures and releases concurrently.
    async fn write(self: Arc<Self>, batch: Vec<Finished>, cancel: CancellationToken) -> BatchOutcome {
        let mut completions = Vec::new();
        let mut failures = Vec::new();
        let mut releases = Vec::new();
        let mut in_place = Vec::new();
        for f in batch {
            match f {
                Finished::Completed { .. } => completions.push(f),
                Finished::Failed { .. } => failures.push(f),
                Finished::Released { .. } => releases.push(f),
                Finished::InPlace(_) => in_place.push(f),
            }
        }
        // A batch holds one result per job (see `take_batch`), so the four are independent.
        let (c, f, r, p) = tokio::join!(
            self.write_completions(&completions, &cancel),
            self.write_failures(&failures, &cancel),
            self.write_releases(&releases, &cancel),
            self.write_in_place(&in_place, &cancel),
        );
        let mut out = BatchOutcome::default();
        for (outcome, items) in [(c, completions), (f, failures), (r, releases), (p, in_place)] {
            match outcome {
                Ok(written) => out.settle(items, &written),
                Err(e) if !e.is_transient() && !matches!(e, StoreError::Cancelled) => self.isolate(items, e, &cancel, &mut out).await,
                Err(e) => {
                    out.error = Some(e.to_string());
                    out.unwritten.extend(items);
                }
            }
        }
        out
    }

    /// A batch was rejected for good: write its results one by one so one bad result cannot
    /// hold back the others.
    async fn isolate(&self, items: Vec<Finished>, error: StoreError, cancel: &CancellationToken, out: &mut BatchOutcome) {
        if items.len() == 1 {
            let (id, run) = items[0].key();
            tracing::error!(job_id = %id, attempt = run.attempt, error = %error,
                "the database rejected this job's result; leaving the job to the rescuer");
            out.rejected.push((id, run));
            return;
        }
        for item in items {
            let single = std::slice::from_ref(&item);
            let outcome = match &item {
                Finished::Completed { .. } => self.write_completions(single, cancel).await,
                Finished::Failed { .. } => self.write_failures(single, cancel).await,
                Finished::Released { .. } => self.write_releases(single, cancel).await,
                Finished::InPlace(_) => self.write_in_place(single, cancel).await,
            };
            match outcome {
                Ok(written) => out.settle(vec![item], &written),
                Err(e) if e.is_transient() || matches!(e, StoreError::Cancelled) => {
                    out.error = Some(e.to_string());
                    out.unwritten.push(item);
                }
                Err(e) => {
                    let (id, run) = item.key();
                    tracing::error!(job_id = %id, attempt = run.attempt, error = %e,
                        "the database rejected this job's result; leaving the job to the rescuer");
                    out.rejected.push((id, run));
                }
            }
        }
    }

    async fn write_completions(&self, items: &[Finished], cancel: &CancellationToken) -> Result<Vec<Uuid>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let batch: Vec<Completion> = items
            .iter()
            .filter_map(|f| match f {
                Finished::Completed { id, attempt, started_at, result } => Some(Completion {
                    id: *id,
                    attempt: Some(*attempt),
                    worker_id: Some(self.worker_id.clone()),
                    started_at: *started_at,
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
        let batch: Vec<(Failure, KnownRun)> = items
            .iter()
            .filter_map(|f| match f {
                Finished::Failed { id, attempt, outcome, known } => Some((
                    Failure { id: *id, attempt: Some(*attempt), worker_id: Some(self.worker_id.clone()), outcome: outcome.clone(), error_code: None },
                    known.clone(),
                )),
                _ => None,
            })
            .collect();
        self.retry.run("fail", cancel, || self.store.fail_batch_known(&batch)).await
    }

    async fn write_in_place(&self, items: &[Finished], cancel: &CancellationToken) -> Result<Vec<Uuid>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let runs: Vec<&InPlaceRun> = items
            .iter()
            .filter_map(|f| match f {
                Finished::InPlace(run) => Some(run),
                _ => None,
            })
            .collect();
        self.retry.run("record retries in place", cancel, || self.store.record_in_place(&runs)).await
    }

    async fn write_releases(&self, items: &[Finished], cancel: &CancellationToken) -> Result<Vec<Uuid>, StoreError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let runs: Vec<(Uuid, NamedRun)> = items
            .iter()
            .map(|f| {
                let (id, run) = f.key();
                (id, NamedRun { attempt: Some(run.attempt), started_at: run.started_at })
            })
            .collect();
        let worker = self.worker_id.as_str();
        let released = self
            .retry
            .run("release", cancel, || self.store.release(&runs, Some(worker), "worker shutting down; the attempt is not counted"))
            .await?;
        Ok(released.into_iter().map(|j| j.id).collect())
    }
}

/// Keeps a job's results in order. A job retried in place may send its failures (with the
/// execution after them still running) and then another result; that result must not be
/// written beside or before them. Every other job has a single result, so while no such
/// failures are unwritten, batches are taken straight from the front of the buffer.
#[derive(Debug, Default)]
struct ResultOrder {
    /// Jobs whose failures retried in place are unwritten.
    pending: HashSet<Uuid>,
    /// Those of them in a write in flight.
    in_flight: HashSet<Uuid>,
}

impl ResultOrder {
    fn note(&mut self, f: &Finished) {
        if let Finished::InPlace(run) = f
            && run.end == InPlaceEnd::Running
        {
            self.pending.insert(run.id);
        }
    }

    fn take(&self, buffer: &mut Vec<Finished>, batch_size: usize) -> Vec<Finished> {
        if self.pending.is_empty() {
            let take = buffer.len().min(batch_size);
            return buffer.drain(..take).collect();
        }
        take_batch(buffer, batch_size, &self.in_flight)
    }

    fn sent(&mut self, keys: &[(Uuid, Run)]) {
        if !self.pending.is_empty() {
            self.in_flight.extend(keys.iter().map(|(id, _)| *id).filter(|id| self.pending.contains(id)));
        }
    }

    /// A write came back (whatever it did).
    fn returned(&mut self, keys: &[(Uuid, Run)]) {
        if !self.in_flight.is_empty() {
            for (id, _) in keys {
                self.in_flight.remove(id);
            }
        }
    }

    /// The job's failures are written, refused or given up: nothing waits on them now.
    fn settled(&mut self, id: Uuid) {
        if !self.pending.is_empty() {
            self.pending.remove(&id);
        }
    }
}

/// Takes up to `batch_size` results from the front of `buffer`, in order, at most one per
/// job and none of a job with a write in flight; the others keep their places.
fn take_batch(buffer: &mut Vec<Finished>, batch_size: usize, in_flight: &HashSet<Uuid>) -> Vec<Finished> {
    let mut batch = Vec::with_capacity(buffer.len().min(batch_size));
    let mut taken: HashSet<Uuid> = HashSet::with_capacity(batch.capacity());
    let mut kept = Vec::new();
    for f in buffer.drain(..) {
        let id = f.key().0;
        if batch.len() < batch_size && !in_flight.contains(&id) && taken.insert(id) {
            batch.push(f);
        } else {
            kept.push(f);
        }
    }
    *buffer = kept;
    // In id order, the order an operator's bulk action locks rows in: the two then never wait
    // on each other in a cycle (each statement of the batch takes its rows in array order).
    batch.sort_by_key(|f| f.key().0);
    batch
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rebound_queue::HandlerError;
    use rebound_queue::store::RetriedInPlace;

    use super::*;

    #[test]
    fn a_result_after_failures_retried_in_place_waits_until_they_are_written() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let now = jiff::Timestamp::now();
        let failures = Finished::InPlace(InPlaceRun {
            id: a,
            stored_attempt: 1,
            stored_started_at: Some(now),
            worker_id: "w".into(),
            retried: vec![RetriedInPlace {
                attempt: 1,
                error: HandlerError::new("x.y", "boom"),
                policy: Arc::default(),
                started_at: now,
                finished_at: now,
            }],
            started_at: now,
            end: InPlaceEnd::Running,
        });
        let then = Finished::Released { id: a, attempt: 2, started_at: Some(now) };
        let other = Finished::Completed { id: b, attempt: 1, started_at: Some(now), result: None };
        let mut order = ResultOrder::default();
        let mut buffer = vec![failures.clone(), other.clone(), then.clone()];
        for f in &buffer {
            order.note(f);
        }
        let first = order.take(&mut buffer, 10);
        assert_eq!(first, vec![failures.clone(), other], "one result per job and batch");
        let keys: Vec<_> = first.iter().map(Finished::key).collect();
        order.sent(&keys);
        assert!(order.take(&mut buffer, 10).is_empty(), "not while the failures are being written");
        order.returned(&keys);
        order.settled(a);
        assert_eq!(order.take(&mut buffer, 10), vec![then]);
        assert!(order.pending.is_empty() && order.in_flight.is_empty());

        // Without such failures, batches come straight off the front.
        let mut plain: Vec<Finished> = (1..=3).map(|n| Finished::Completed { id: Uuid::now_v7(), attempt: n, started_at: None, result: None }).collect();
        let expected = plain[..2].to_vec();
        assert_eq!(order.take(&mut plain, 2), expected);
        assert_eq!(plain.len(), 1);
    }

    #[tokio::test]
    async fn a_claim_waits_until_the_backlog_is_below_the_limit_or_shutdown() {
        let backlog = Arc::new(ResultBacklog::default());
        for _ in 0..3 {
            backlog.add();
        }
        let stop = CancellationToken::new();
        let waiting = {
            let (backlog, stop) = (backlog.clone(), stop.clone());
            tokio::spawn(async move { backlog.wait_below(2, &stop).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished(), "3 unwritten is not below 2");
        backlog.remove(1);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished(), "2 unwritten is not below 2");
        backlog.remove(1);
        assert!(tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap());
        assert_eq!(backlog.len(), 1);

        let blocked = {
            let (backlog, stop) = (backlog.clone(), stop.clone());
            tokio::spawn(async move { backlog.wait_below(1, &stop).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        stop.cancel();
        assert!(!tokio::time::timeout(Duration::from_secs(5), blocked).await.unwrap().unwrap(), "shutdown ends the wait");
    }
}

