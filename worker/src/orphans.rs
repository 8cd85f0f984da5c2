//! Jobs claimed by answers that never arrived.
//!
//! A claim is one autocommit statement. If the connection breaks after Postgres committed it
//! but before the worker read the rows (a restart at the wrong moment), the jobs are `active`
//! under this worker's id and the worker knows nothing of them. They never started, so they
//! must not cost an attempt, and they must not wait for the rescuer, which has to assume a
//! lapsed job ran and count it.
//!
//! So after any claim that failed (the worker cannot know whether it committed), the next
//! claim is preceded by a sweep: every job locked under this worker's id that it does not
//! know (see [`RunningJobs::known`]) is handed back uncounted, with a `released` row
//! ([`Store::release_orphans`]). A sweep must not run while another claim of this worker is
//! between its commit and the moment its jobs are held, or it would hand those back too:
//! claims hold the gate shared from the statement until their jobs are held, sweeps hold it
//! exclusively. The heartbeat is a second path for the same jobs once their lock lapses
//! ([`Store::worker_beat`]), in case no claim comes (shutdown, say); it holds the gate
//! exclusively too, from its snapshot of the known jobs until its statement is answered. A
//! snapshot taken earlier goes stale while the statement waits out an outage: the jobs claimed
//! meanwhile, run, and not yet written would look unknown and be handed back to run again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rebound_queue::store::CLIENT_CHECK_INTERVAL;
use rebound_queue::{Store, StoreError};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use tokio::time::Instant;

use crate::running::RunningJobs;

/// Claims and sweeps of one worker process.
#[derive(Debug)]
pub struct Orphans {
    store: Store,
    worker_id: String,
    running: Arc<RunningJobs>,
    gate: RwLock<()>,
    suspected: AtomicBool,
    /// When a claim was last given up on unanswered (see [`Orphans::abandoned`]).
    abandoned_at: Mutex<Option<Instant>>,
}

/// Held by a claim from before its statement until its jobs are held.
pub type ClaimPermit<'a> = RwLockReadGuard<'a, ()>;

impl Orphans {
    pub fn new(store: Store, worker_id: String, running: Arc<RunningJobs>) -> Self {
        Orphans { store, worker_id, running, gate: RwLock::new(()), suspected: AtomicBool::new(false), abandoned_at: Mutex::new(None) }
    }

    /// Waits until no sweep runs, and keeps sweeps out until the permit is dropped.
    pub async fn claim_permit(&self) -> ClaimPermit<'_> {
        self.gate.read().await
    }

    /// A claim failed: it may have committed with its answer lost.
    pub fn suspect(&self) {
        self.suspected.store(true, Ordering::SeqCst);
    }

    /// A claim was given up on before its answer came (the worker stopping or going quiet).
    /// Its connection is closed, so Postgres ends the statement within its client check
    /// interval if it is still running, but it may commit until then: a sweep meant to find
    /// what it took waits that out first ([`Orphans::settled`]).
    pub fn abandoned(&self) {
        *self.abandoned_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.suspect();
    }

    /// Waits until no claim given up on can still commit: twice the client check interval
    /// after the last one (once to be noticed, once for margin).
    pub async fn settled(&self) {
        let at = *self.abandoned_at.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = at {
            tokio::time::sleep_until(at + CLIENT_CHECK_INTERVAL * 2).await;
        }
    }

    /// Whether a sweep is due.
    pub fn suspected(&self) -> bool {
        self.suspected.load(Ordering::SeqCst)
    }

    /// Waits until no claim of this worker is in flight, and keeps new ones out until the guard
    /// is dropped: what [`RunningJobs::known`] says then stays true of the database (jobs only
    /// leave it, by being written) for as long as the guard is held, however long a statement
    /// waits for its connection. The heartbeat holds it while it hands back lapsed orphans.
    pub async fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().await
    }

    /// Hands back every job locked under this worker's id that it does not know, waiting until
    /// no claim of this worker is in flight. Returns how many. On error the sweep stays due.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        let _exclusive = self.exclusive().await;
        // Cleared before the read: a claim failing from here on cannot be in flight (we hold
        // the gate), so nothing is missed. A sweep dropped before its answer (shutdown) leaves
        // it due again, so the final sweep still runs.
        self.suspected.store(false, Ordering::SeqCst);
        let mut unanswered = DueAgainUnlessAnswered { orphans: self, answered: false };
        let known = self.running.known();
        let result = self.store.release_orphans(&self.worker_id, &known).await;
        unanswered.answered = true;
        match result {
            Ok(released) => {
                if !released.is_empty() {
                    let ids: Vec<String> = released.iter().map(|j| j.id.to_string()).collect();
                    tracing::warn!(count = released.len(), ids = ?ids,
                        "handed back jobs whose claim committed while its answer was lost; their attempts are not counted");
                }
                Ok(released.len())
            }
            Err(e) => {
                self.suspect();
                Err(e)
            }
        }
    }
}

/// Marks a sweep due again if dropped before its statement was answered.
struct DueAgainUnlessAnswered<'a> {
    orphans: &'a Orphans,
    answered: bool,
}

impl Drop for DueAgainUnlessAnswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.orphans.suspect();
        }
    }
}
