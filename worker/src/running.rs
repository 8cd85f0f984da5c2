//! The jobs this worker holds: claimed and not yet written back.
//!
//! A job stays here from its claim until the completer has written its result (not merely
//! until its handler returned), so heartbeats keep the lock of a job whose completion is
//! waiting out a database restart, and the rescuer never re-runs finished work.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// One held job.
#[derive(Debug)]
struct Held {
    attempt: i32,
    visibility: Duration,
    /// Fired when the job turns out to be no longer ours, so its handler stops.
    lost: CancellationToken,
}

/// The held jobs, keyed by id. Every operation names the attempt, so a stale actor (a result
/// of attempt 2 arriving after the job was claimed again as attempt 3) cannot touch the newer one.
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

    /// Starts holding a claimed job; the token fires if the job is lost.
    pub fn hold(&self, id: Uuid, attempt: i32, visibility: Duration) -> CancellationToken {
        let lost = CancellationToken::new();
        self.lock().insert(id, Held { attempt, visibility, lost: lost.clone() });
        lost
    }

    /// Stops holding a job whose result was written (or refused).
    pub fn release(&self, id: Uuid, attempt: i32) {
        self.release_all(&[(id, attempt)]);
    }

    /// [`RunningJobs::release`] for a batch's jobs, under one lock.
    pub fn release_all(&self, settled: &[(Uuid, i32)]) {
        let mut jobs = self.lock();
        for (id, attempt) in settled {
            if jobs.get(id).is_some_and(|h| h.attempt == *attempt) {
                jobs.remove(id);
            }
        }
    }

    /// The job now holds `to` in the database (its failures retried in place were written
    /// while it ran on): later results and heartbeats name that attempt.
    pub fn advance(&self, id: Uuid, from: i32, to: i32) {
        if let Some(held) = self.lock().get_mut(&id).filter(|h| h.attempt == from) {
            held.attempt = to;
        }
    }

    /// Marks jobs as lost (the database says they are no longer ours): their handlers are
    /// told to stop and nothing more is written for them.
    pub fn lose(&self, lost: &[(Uuid, i32)]) {
        let mut jobs = self.lock();
        for (id, attempt) in lost {
            if jobs.get(id).is_some_and(|h| h.attempt == *attempt)
                && let Some(held) = jobs.remove(id)
            {
                held.lost.cancel();
            }
        }
    }

    /// Stops holding a job that ran but whose result cannot be written (see `abandoned`).
    pub fn abandon(&self, id: Uuid, attempt: i32) {
        let mut jobs = self.lock();
        if jobs.get(&id).is_some_and(|h| h.attempt == attempt) {
            jobs.remove(&id);
            self.abandoned.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
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

    /// `(id, attempt)` of every held job.
    pub fn snapshot(&self) -> Vec<(Uuid, i32)> {
        self.lock().iter().map(|(id, h)| (*id, h.attempt)).collect()
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
        let lost3 = running.hold(id, 3, Duration::from_secs(30));
        running.release(id, 2);
        running.lose(&[(id, 2)]);
        assert!(running.contains(id));
        assert!(!lost3.is_cancelled());
        running.advance(id, 2, 4);
        assert_eq!(running.snapshot(), vec![(id, 3)], "only the attempt held advances");
        running.advance(id, 3, 4);
        running.lose(&[(id, 3)]);
        assert!(!lost3.is_cancelled());
        running.lose(&[(id, 4)]);
        assert!(lost3.is_cancelled());
        assert!(running.is_empty());
    }

    #[test]
    fn shortest_visibility_and_release() {
        let running = RunningJobs::new();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        running.hold(a, 1, Duration::from_secs(30));
        running.hold(b, 1, Duration::from_secs(2));
        assert_eq!(running.shortest_visibility(), Some(Duration::from_secs(2)));
        running.release(b, 1);
        assert_eq!(running.shortest_visibility(), Some(Duration::from_secs(30)));
        assert_eq!(running.snapshot(), vec![(a, 1)]);
        assert_eq!(running.len(), 1);
    }
}
