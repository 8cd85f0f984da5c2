//! A claim loop of one queue: claims as many jobs as it has free slots, in one statement,
//! and hands them to the dispatcher. A queue may have several loops sharing its slots, so one
//! claims while another's round trip is still on its way.
//!
//! It waits for the completer to keep up (see [`ResultBacklog`]), for a free slot, then for
//! work: a notification for its queue, or the poll interval (notifications can be lost across
//! reconnects, and retries become due without one). A full batch means more may be waiting,
//! so it claims again at once and wakes a sibling loop that may be idle. Claims go through
//! the claim retry; when that gives up, the loop backs off and tries again until shutdown:
//! a database outage delays work, it never stops the worker. Shutdown ends the waits at
//! once but never abandons a claim in flight (its jobs would be stranded until rescued).
//! A claim that failed may have committed with its answer lost: its jobs are handed back,
//! uncounted, before the next claim (see [`crate::orphans`]).

use std::sync::Arc;
use std::time::Duration;

use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::store::{ClaimRequest, NamedRun};
use rebound_queue::{Job, Store, StoreError};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::completer::ResultBacklog;
use crate::health::Health;
use crate::orphans::{ClaimPermit, Orphans};
use crate::executor::Dispatcher;
use crate::outage::OutageBackoff;
use crate::running::{Run, RunningJobs};

/// One queue's claim loop.
pub struct Claimer {
    pub queue: String,
    /// One permit per unit of the queue's concurrency.
    pub slots: Arc<Semaphore>,
    /// The queue's concurrency (the number of permits `slots` started with).
    pub concurrency: usize,
    /// How long to wait for more slots to free up before claiming for just a few.
    pub gather: Duration,
    pub batch_max: u32,
    pub store: Store,
    pub worker_id: String,
    pub visibility_timeout: Duration,
    pub poll_interval: Duration,
    pub retry: StorageRetry,
    /// Notified when jobs become available in this queue.
    pub wake: Arc<Notify>,
    /// Moves each time the notification listener gets (back) onto the database (see
    /// [`crate::notifier::Notifier::listening`]).
    pub listened: watch::Receiver<u64>,
    pub running: Arc<RunningJobs>,
    pub dispatcher: Dispatcher,
    /// Results not yet written; no claims while it holds `max_backlog` or more.
    pub backlog: Arc<ResultBacklog>,
    pub max_backlog: usize,
    /// Whether other loops claim for the same queue (and may need waking).
    pub has_siblings: bool,
    /// Shared by the worker's claim loops: keeps claims and orphan sweeps apart.
    pub orphans: Arc<Orphans>,
    pub health: Arc<Health>,
}

impl Claimer {
    /// Claims until `shutdown` fires; returns how many jobs it claimed.
    pub async fn run(self, shutdown: CancellationToken) -> u64 {
        let mut claimed_total = 0u64;
        let mut listened = self.listened.clone();
        let mut outage = OutageBackoff::like(&self.retry);
        let batch_max = self.batch_max.max(1) as usize;
        loop {
            if !self.backlog.wait_below(self.max_backlog, &shutdown).await {
                break;
            }
            // A free slot first: claiming work we cannot start would only hold its lock.
            let first = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                p = self.slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let mut slots = vec![first];
            self.take_free_slots(&mut slots, batch_max);
            // Short jobs free their slots moments apart. Claiming at the first free slot would
            // mean many one-job claims, each a transaction of its own; waiting a moment for
            // half a batch keeps claims large while adding at most `gather` of latency.
            let target = (self.concurrency.min(batch_max) / 2).max(1);
            if slots.len() < target && !self.gather.is_zero() {
                let deadline = tokio::time::Instant::now() + self.gather;
                while slots.len() < target {
                    match tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await {
                        Ok(Ok(p)) => slots.push(p),
                        _ => break,
                    }
                }
                self.take_free_slots(&mut slots, batch_max);
            }
            let wanted = slots.len();
            // A reconnect from here on ends an outage wait after this claim at once.
            listened.borrow_and_update();
            let request = ClaimRequest {
                worker_id: self.worker_id.clone(),
                queues: vec![self.queue.clone()],
                limit: wanted as u32,
                visibility_timeout: self.visibility_timeout,
            };
            let (jobs, permit) = match self.claim_through_retries(&request, &shutdown).await {
                Ok(claimed) => {
                    if outage.failures() > 0 {
                        tracing::info!(queue = %self.queue, "claims work again");
                    }
                    outage.reset();
                    self.health.claims_ok();
                    claimed
                }
                Err(StoreError::Cancelled) => break,
                Err(e) => {
                    drop(slots);
                    self.health.claims_failing(&e);
                    // The listener getting back onto the database ends the wait: claims resume
                    // when it is back, not up to a whole backoff (10 s) later. A notification
                    // for the queue does not: claims failing for any other reason (a broken
                    // trigger, a revoked grant) would then be retried as fast as jobs arrive.
                    let what = format!("claiming from queue {}", self.queue);
                    let waited = tokio::select! {
                        w = outage.wait_logged(&what, &e, &shutdown) => w,
                        r = listened.changed() => r.is_ok() && !shutdown.is_cancelled(),
                    };
                    if !waited {
                        break;
                    }
                    continue;
                }
            };
            let got = jobs.len();
            claimed_total += got as u64;
            // The claim asked for at most one job per slot, so every job gets one.
            for (job, slot) in jobs.into_iter().zip(slots.drain(..)) {
                // Held before its task starts, so the first heartbeat already covers it.
                let visibility = job.visibility_timeout_ms.filter(|ms| *ms > 0).map(|ms| Duration::from_millis(ms as u64)).unwrap_or(self.visibility_timeout);
                let lost = self.running.hold(job.id, Run::new(job.attempt, job.started_at), visibility);
                self.dispatcher.dispatch(job, lost, slot);
            }
            // Every claimed job is held now: a sweep may run.
            drop(permit);
            drop(slots);
            if got == wanted && self.has_siblings {
                // More is probably waiting; a sibling asleep since the queue last ran dry
                // would otherwise sleep through it until its next poll.
                self.wake.notify_one();
            }
            if got < wanted {
                // The queue is drained (or paused): wait for news.
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(self.poll_interval) => {}
                }
            }
        }
        tracing::debug!(queue = %self.queue, claimed = claimed_total, "claim loop stopped");
        claimed_total
    }

    /// Adds free slots to `slots` without waiting, up to `max` in all.
    fn take_free_slots(&self, slots: &mut Vec<OwnedSemaphorePermit>, max: usize) {
        while slots.len() < max {
            match self.slots.clone().try_acquire_owned() {
                Ok(p) => slots.push(p),
                Err(_) => break,
            }
        }
    }

    /// Claims through transient errors with the claim retry's attempts and waits, like
    /// [`StorageRetry::run`] but for two differences. Shutdown interrupts the waits, never a
    /// claim in flight: a claim that committed moved jobs to `active` under our name, and
    /// dropping its answer would strand them. And a failed claim may have committed with its
    /// answer lost, so the next try first hands back whatever we hold unknowingly (see
    /// [`crate::orphans`]). The permit that comes with the jobs keeps sweeps out until the
    /// caller holds them.
    async fn claim_through_retries(&self, request: &ClaimRequest, shutdown: &CancellationToken) -> Result<(Vec<Job>, ClaimPermit<'_>), StoreError> {
        let policy = self.retry.as_policy();
        let mut rng = fastrand::Rng::new();
        let mut attempt: u32 = 1;
        loop {
            if shutdown.is_cancelled() {
                return Err(StoreError::Cancelled);
            }
            let claim = async {
                if self.orphans.suspected() {
                    self.orphans.sweep().await?;
                }
                let permit = self.orphans.claim_permit().await;
                match self.store.claim(request).await {
                    Ok(jobs) => Ok((jobs, permit)),
                    Err(e) => {
                        self.orphans.suspect();
                        Err(e)
                    }
                }
            };
            tokio::pin!(claim);
            let result = tokio::select! {
                biased;
                r = &mut claim => r,
                _ = shutdown.cancelled() => {
                    // Let the statement finish (bounded: with the database down it may be
                    // waiting for a connection, and then it has claimed nothing), then hand
                    // back whatever it claimed without counting the attempt.
                    match tokio::time::timeout(IN_FLIGHT_CLAIM_GRACE, claim).await {
                        Ok(Ok((jobs, _permit))) => self.hand_back(&jobs).await,
                        // The claim failed and said so (it suspected orphans itself).
                        Ok(Err(_)) => {}
                        // Dropped unanswered: it may still commit under our name until
                        // Postgres notices its connection closed. The sweep after the claim
                        // loops stop waits that out, then hands back whatever it took.
                        Err(_) => self.orphans.abandoned(),
                    }
                    return Err(StoreError::Cancelled);
                }
            };
            match result {
                Ok(claimed) => return Ok(claimed),
                Err(e) if e.is_transient() && attempt < policy.max_attempts => {
                    let wait = policy.jittered_delay_for(attempt, &mut rng);
                    tracing::warn!(queue = %self.queue, attempt, wait_ms = wait.as_millis() as u64,
                        next_try_at = %crate::outage::at_after(wait), error = %e, "transient error claiming jobs; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Err(StoreError::Cancelled),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Releases jobs claimed as shutdown began.
    async fn hand_back(&self, jobs: &[Job]) {
        if jobs.is_empty() {
            return;
        }
        let runs: Vec<(Uuid, NamedRun)> = jobs.iter().map(|j| (j.id, NamedRun::of(j))).collect();
        let give_up = CancellationToken::new();
        let timer = {
            let give_up = give_up.clone();
            tokio::spawn(async move {
                tokio::time::sleep(IN_FLIGHT_CLAIM_GRACE).await;
                give_up.cancel();
            })
        };
        let reason = "worker shutting down before the job started; the attempt is not counted";
        match self.retry.run("release", &give_up, || self.store.release(&runs, Some(&self.worker_id), reason)).await {
            Ok(released) => tracing::info!(queue = %self.queue, count = released.len(), "handed back jobs claimed as shutdown began"),
            Err(e) => {
                // They are still ours and never ran: the final sweep tries again, so that the
                // rescuer does not charge them an attempt.
                self.orphans.suspect();
                tracing::warn!(queue = %self.queue, error = %e, "could not hand back jobs claimed as shutdown began; the final sweep will try again");
            }
        }
        timer.abort();
    }
}

/// How long a claim already in flight at shutdown may take to finish, and its jobs to be
/// handed back.
const IN_FLIGHT_CLAIM_GRACE: Duration = Duration::from_secs(5);
