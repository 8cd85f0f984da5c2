//! The jobs this worker holds: claimed and not yet written back.
//!
//! A job stays here from its claim until the completer has written its result (not merely
//! until its handler returned), so heartbeats keep the lock of a job whose completion is
//! waiting out a database restart, and the rescuer never re-runs finished work.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use jiff::Timestamp;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// One run of a held job, as the database stores it: the attempt number and when the run
/// started. Attempt numbers repeat (a snooze or a hand-back gives one back, and this worker
/// may claim the job again before it hears the answer to the write that gave it back); the
/// start does not, so a stale result cannot settle the newer run's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub attempt: i32,
    pub started_at: Option<Timestamp>,
}

impl Run {
    pub fn new(attempt: i32, started_at: Option<Timestamp>) -> Self {
        Run { attempt, started_at }
    }
}

/// One held job.
#[derive(Debug)]
struct Held {
    run: Run,
    visibility: Duration,
    /// Fired when the job turns out to be no longer ours, so its handler stops.
    lost: CancellationToken,
}

/// The held jobs, keyed by id. Every operation names the run, so a stale actor (a result of
/// attempt 2 arriving after the job was claimed again as attempt 3, or as attempt 2 again after
/// a snooze) cannot touch the newer one.
#[derive(Debug, Default)]
pub struct RunningJobs {
    jobs: Mutex<HashMap<Uuid, Held>>,
    /// Jobs that ran here but whose result the database refused for good: no longer held
    /// (their locks lapse and the rescuer counts the attempt, since they did run), but known,
    /// so they are never handed back uncounted as if they had never started.
    abandoned: Mutex<HashSet<Uuid>>,
}

impl RunningJobs {
    pub fn new() -> Self {
        RunningJobs::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Held>> {
        // A panic while holding this lock cannot leave the map half-updated (every critical
        // section is a single insert/remove), so a poisoned lock is still consistent.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts holding a claimed job; the token fires if the job is lost. A run of the same job
    /// still held here is over: the database handed the job out again (an operator cancelled
    /// and retried it, or it was rescued while this worker was cut off, and this worker's
    /// claim took it before a heartbeat told it so), so its handler is told to stop, as for a
    /// job lost, rather than running on beside the new run.
    pub fn hold(&self, id: Uuid, run: Run, visibility: Duration) -> CancellationToken {
        let lost = CancellationToken::new();
        let earlier = self.lock().insert(id, Held { run, visibility, lost: lost.clone() });
        if let Some(earlier) = earlier {
            if !earlier.lost.is_cancelled() {
                // Also seen, harmlessly, when a snooze's or hand-back's answer is still on its
                // way: that run's handler has returned already.
                tracing::info!(job_id = %id, attempt = earlier.run.attempt, "claimed again while an earlier run of it was still held here; that run, if still going, is stopped");
            }
            earlier.lost.cancel();
        }
        // Claimed again, its abandoned run is over (rescued): known now by the new one.
        self.abandoned.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        lost
    }

    /// Stops holding a job whose result was written (or refused).
    pub fn release(&self, id: Uuid, run: Run) {
        self.release_all(&[(id, run)]);
    }

    /// [`RunningJobs::release`] for a batch's jobs, under one lock.
    pub fn release_all(&self, settled: &[(Uuid, Run)]) {
        let mut jobs = self.lock();
        for (id, run) in settled {
            if jobs.get(id).is_some_and(|h| h.run == *run) {
                jobs.remove(id);
            }
        }
    }

    /// The job now holds `to` in the database (its failures retried in place were written
    /// while it ran on): later results and heartbeats name that attempt.
    pub fn advance(&self, id: Uuid, from: Run, to: Run) {
        if let Some(held) = self.lock().get_mut(&id).filter(|h| h.run == from) {
            held.run = to;
        }
    }

    /// Marks jobs as lost (the database says they are no longer ours): their handlers are
    /// told to stop and nothing more is written for them.
    pub fn lose(&self, lost: &[(Uuid, Run)]) {
        let mut jobs = self.lock();
        for (id, run) in lost {
            if jobs.get(id).is_some_and(|h| h.run == *run)
                && let Some(held) = jobs.remove(id)
            {
                held.lost.cancel();
            }
        }
    }

    /// Stops holding a job that ran but whose result cannot be written (see `abandoned`).
    pub fn abandon(&self, id: Uuid, run: Run) {
        let mut jobs = self.lock();
        if jobs.get(&id).is_some_and(|h| h.run == run) {
            jobs.remove(&id);
            self.abandoned.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
        }
    }

    /// The ids of the abandoned runs' jobs.
    pub fn abandoned(&self) -> Vec<Uuid> {
        self.abandoned.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect()
    }

    /// Forgets the abandoned jobs among `read` that are not in `still_locked` (the jobs of
    /// `read` the database still shows locked under this worker's id); ids abandoned since
    /// `read` was taken are kept.
    pub fn forget_abandoned(&self, read: &[Uuid], still_locked: &[Uuid]) {
        let mut abandoned = self.abandoned.lock().unwrap_or_else(|p| p.into_inner());
        for id in read.iter().filter(|id| !still_locked.contains(id)) {
            abandoned.remove(id);
        }
    }

    /// Every job this worker claimed and has not settled: the held ones and the abandoned ones.
    /// A job locked under this worker's id and not among these was claimed by an answer that
    /// never arrived.
    pub fn known(&self) -> Vec<Uuid> {
        let held: Vec<Uuid> = self.lock().keys().copied().collect();
        let abandoned = self.abandoned.lock().unwrap_or_else(|p| p.into_inner());
        held.into_iter().chain(abandoned.iter().copied()).collect()
    }

    /// `(id, run)` of every held job.
    pub fn snapshot(&self) -> Vec<(Uuid, Run)> {
        self.lock().iter().map(|(id, h)| (*id, h.run)).collect()
    }

    /// The shortest visibility timeout among held jobs.
    pub fn shortest_visibility(&self) -> Option<Duration> {
        self.lock().values().map(|h| h.visibility).min()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    pub fn contains(&self, id: Uuid) -> bool {
        self.lock().contains_key(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_attempts_cannot_touch_newer_ones() {
        let running = RunningJobs::new();
        let id = Uuid::now_v7();
        let at = |attempt| Run::new(attempt, None);
        let lost3 = running.hold(id, at(3), Duration::from_secs(30));
        running.release(id, at(2));
        running.lose(&[(id, at(2))]);
        assert!(running.contains(id));
        assert!(!lost3.is_cancelled());
        running.advance(id, at(2), at(4));
        assert_eq!(running.snapshot(), vec![(id, at(3))], "only the attempt held advances");
        running.advance(id, at(3), at(4));
        running.lose(&[(id, at(3))]);
        assert!(!lost3.is_cancelled());
        running.lose(&[(id, at(4))]);
        assert!(lost3.is_cancelled());
        assert!(running.is_empty());
    }

    #[test]
    fn a_stale_result_of_the_same_attempt_number_cannot_settle_a_new_claim() {
        // Snoozed at attempt 2 (the number given back) and claimed again as attempt 2 before
        // the snooze's answer arrived: settling the old run must leave the new one held.
        let running = RunningJobs::new();
        let id = Uuid::now_v7();
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let old = Run::new(2, Some(t0));
        let new = Run::new(2, Some(t0 + jiff::SignedDuration::from_millis(120)));
        running.hold(id, old, Duration::from_secs(30));
        let lost = running.hold(id, new, Duration::from_secs(30));
        running.release(id, old);
        running.lose(&[(id, old)]);
        running.abandon(id, old);
        assert!(running.contains(id), "the new claim is still held");
        assert!(!lost.is_cancelled());
        running.release(id, new);
        assert!(running.is_empty());
    }

    #[test]
    fn a_run_still_held_when_its_job_is_claimed_again_is_stopped() {
        // Cancelled and retried by an operator (or rescued while this worker was cut off) and
        // claimed by this worker again before a heartbeat said the first run was lost.
        let running = RunningJobs::new();
        let id = Uuid::now_v7();
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let first = running.hold(id, Run::new(1, Some(t0)), Duration::from_secs(30));
        let second = running.hold(id, Run::new(2, Some(t0 + jiff::SignedDuration::from_secs(3))), Duration::from_secs(30));
        assert!(first.is_cancelled(), "the earlier run's handler is told to stop");
        assert!(!second.is_cancelled());
        // Settling the earlier run, whatever its writer says, leaves the new one alone.
        running.lose(&[(id, Run::new(1, Some(t0)))]);
        assert!(!second.is_cancelled() && running.contains(id));
    }

    #[test]
    fn an_abandoned_run_is_known_until_the_job_is_claimed_again() {
        let running = RunningJobs::new();
        let id = Uuid::now_v7();
        let first = Run::new(1, None);
        running.hold(id, first, Duration::from_secs(30));
        running.abandon(id, first);
        assert!(!running.contains(id), "no longer held");
        assert_eq!(running.known(), vec![id], "but known, so never handed back uncounted");
        running.hold(id, Run::new(2, None), Duration::from_secs(30));
        running.release(id, Run::new(2, None));
        assert!(running.known().is_empty(), "the abandoned run ended when the job was claimed again");
    }

    #[test]
    fn abandoned_runs_are_forgotten_once_no_longer_locked_here() {
        let running = RunningJobs::new();
        let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let first = Run::new(1, None);
        for id in [a, b] {
            running.hold(id, first, Duration::from_secs(30));
            running.abandon(id, first);
        }
        let read = running.abandoned();
        // Abandoned after the read: not judged by it.
        running.hold(c, first, Duration::from_secs(30));
        running.abandon(c, first);
        running.forget_abandoned(&read, &[b]);
        let mut known = running.known();
        known.sort();
        let mut expected = vec![b, c];
        expected.sort();
        assert_eq!(known, expected, "a, rescued, is forgotten; b is still locked here; c was not read");
    }

    #[test]
    fn shortest_visibility_and_release() {
        let running = RunningJobs::new();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let first = Run::new(1, None);
        running.hold(a, first, Duration::from_secs(30));
        running.hold(b, first, Duration::from_secs(2));
        assert_eq!(running.shortest_visibility(), Some(Duration::from_secs(2)));
        running.release(b, first);
        assert_eq!(running.shortest_visibility(), Some(Duration::from_secs(30)));
        assert_eq!(running.snapshot(), vec![(a, first)]);
        assert_eq!(running.len(), 1);
    }
}
