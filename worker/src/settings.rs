//! The runtime's knobs, with the defaults an operator gets when they set nothing.

use std::time::Duration;

use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::store::PruneConfig;

/// Everything the runtime can be tuned with. [`RuntimeSettings::default`] is what the
/// binary uses when the config file is silent.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeSettings {
    /// Identifies this process in `locked_by`, `job_attempts.worker_id` and `workers`;
    /// generated from host, pid and a random suffix when `None`.
    pub worker_id: Option<String>,
    /// How often each claim loop looks for work when no notification arrives. Notifications
    /// make the common case immediate; polling covers lost notifications and due retries.
    pub poll_interval: Duration,
    /// How long a claim lasts without a heartbeat, for jobs that do not set their own.
    pub visibility_timeout: Duration,
    /// How often running jobs' locks are extended; never more than a third of the shortest
    /// visibility timeout among running jobs, so two heartbeats may fail before a lock lapses.
    pub heartbeat_interval: Duration,
    /// Per-attempt timeout for jobs whose type and envelope set none.
    pub job_timeout: Duration,
    /// On shutdown, how long running jobs may take to finish before they are released.
    pub shutdown_grace: Duration,
    /// Most jobs claimed by one statement.
    pub claim_batch_max: u32,
    /// When only a few slots are free, how long the claim loop waits for more (up to half a
    /// batch) before claiming, so short jobs are claimed in batches rather than one by one.
    pub claim_gather: Duration,
    pub completer: CompleterSettings,
    /// Run a failed job again at once, in the same slot, when its live policy retries it with
    /// no backoff, instead of sending it back through the queue (see [`crate::executor`]).
    pub retry_in_place: bool,
    /// When the execution after a failure retried in place is still running this long, the
    /// failure is written on its own, so it is visible (and kept) while the job runs on. A
    /// quicker execution carries it in its own write.
    pub in_place_write_after: Duration,
    /// Retry of complete / fail / release / heartbeat / registry writes (seed 000 defaults).
    pub storage_retry: StorageRetry,
    /// Retry of claims; longer waits, since the claim loop polls anyway.
    pub claim_retry: StorageRetry,
    /// `None`: this worker never runs maintenance (another process does).
    pub maintenance: Option<MaintenanceSettings>,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        RuntimeSettings {
            worker_id: None,
            poll_interval: Duration::from_secs(1),
            visibility_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            job_timeout: Duration::from_secs(30 * 60),
            shutdown_grace: Duration::from_secs(25),
            claim_batch_max: 500,
            claim_gather: Duration::from_millis(2),
            completer: CompleterSettings::default(),
            retry_in_place: true,
            in_place_write_after: Duration::from_millis(50),
            storage_retry: StorageRetry::storage_default(),
            claim_retry: StorageRetry::claim_default(),
            maintenance: Some(MaintenanceSettings::default()),
        }
    }
}

/// A queue's concurrency (handler slots) when the configuration names none: two claim
/// batches' worth (see [`RuntimeSettings::claim_loops_for`]).
///
/// A slot is cheap while idle (a permit, not a thread or a connection), and what a claim
/// costs Postgres barely depends on how many jobs it takes: each one walks the head of the
/// claimable index past the entries of jobs claimed moments ago. So short jobs run at the
/// rate of claims times their size, and the size is bounded by the free slots. Measured with
/// `rebound-bench` on two cores: 200 slots (claims of about 90) reach about 55 % of the best
/// raw-SQL loop, 1 000 slots (claims of about 400) about 70 %. Jobs that wait on I/O (HTTP
/// calls, other services) gain from the slots too. CPU-heavy handlers (an `exec` of a
/// compiler, say) want far fewer: set `concurrency` per queue to what the host can run.
pub const DEFAULT_QUEUE_CONCURRENCY: u32 = 1_000;

/// Most claim loops one queue gets, however many slots it has: past a few, more loops only
/// add connections and contention on the queue's head.
pub const MAX_CLAIM_LOOPS: u32 = 4;

impl RuntimeSettings {
    /// Claim loops for a queue of `concurrency` slots: one per `claim_batch_max` slots, so
    /// every claim can be a full batch and a queue with more slots than one batch still keeps
    /// them all busy. The slots a claim asks for stay reserved during its round trip, so two
    /// loops sharing fewer slots would only split them into claims half the size, doubling
    /// the statements for the same jobs.
    pub fn claim_loops_for(&self, concurrency: u32) -> u32 {
        concurrency.div_ceil(self.claim_batch_max.max(1)).clamp(1, MAX_CLAIM_LOOPS)
    }

    /// Database connections the runtime can use at once with these queues' concurrencies:
    /// every claim loop, every write in flight (a completion, a failure (two reads at once,
    /// then the write on one of them) and a release), plus heartbeats, the two leaderships
    /// (maintenance and pruning) and the maintenance services.
    pub fn connections_needed(&self, concurrencies: impl IntoIterator<Item = u32>) -> u32 {
        let claims: u32 = concurrencies.into_iter().map(|c| self.claim_loops_for(c)).sum();
        let writes = u32::try_from(self.completer.flushes_in_flight.max(1).saturating_mul(4)).unwrap_or(u32::MAX);
        claims.saturating_add(writes).saturating_add(7)
    }

    /// Both retry scopes set to a single attempt (`--disable-retry`). Outages are still
    /// ridden out: the loops back off and try again, they only stop retrying within one call.
    pub fn disable_storage_retry(&mut self) {
        self.storage_retry = StorageRetry::disabled();
        self.claim_retry = StorageRetry { max_attempts: 1, ..StorageRetry::claim_default() };
    }
}

/// How results are batched on their way to Postgres.
#[derive(Clone, Debug, PartialEq)]
pub struct CompleterSettings {
    /// Flush as soon as this many results wait.
    pub batch_size: usize,
    /// Flush this long after the first waiting result at the latest.
    pub flush_interval: Duration,
    /// Batches written at once. Each write waits for its commit to reach disk; overlapping a
    /// few keeps Postgres busy meanwhile (and lets it flush their commits together).
    pub flushes_in_flight: usize,
    /// The claim loops wait while this many results are unwritten, so a worker whose writes
    /// fall behind stops taking jobs that other workers could run.
    pub max_backlog: usize,
    /// On shutdown, how long the last results may take to reach the database before the
    /// worker gives up on them (their jobs are then rescued after the visibility timeout).
    pub final_flush_timeout: Duration,
}

impl Default for CompleterSettings {
    fn default() -> Self {
        CompleterSettings {
            batch_size: 500,
            flush_interval: Duration::from_millis(2),
            flushes_in_flight: 3,
            max_backlog: 2_000,
            final_flush_timeout: Duration::from_secs(15),
        }
    }
}

/// The maintenance services and the leader election in front of them.
#[derive(Clone, Debug, PartialEq)]
pub struct MaintenanceSettings {
    /// How often a follower tries to become leader; bounds the take-over time after the
    /// leader dies.
    pub leader_retry: Duration,
    /// How often the leader checks it still holds the lock.
    pub leader_check: Duration,
    /// Scheduler: due `scheduled` / `retryable` jobs → `available`.
    pub scheduler_interval: Duration,
    /// Rescuer: expired locks → `rebound.stalled`, elapsed timeouts → `rebound.timeout`.
    pub rescuer_interval: Duration,
    /// Expirer: jobs whose `expires_at` passed before they ran → discarded.
    pub expirer_interval: Duration,
    /// Rows handled per statement by the scheduler, rescuer and expirer.
    pub batch: i64,
    /// `None` disables pruning.
    pub pruner: Option<PrunerSettings>,
}

impl Default for MaintenanceSettings {
    fn default() -> Self {
        MaintenanceSettings {
            leader_retry: Duration::from_secs(5),
            leader_check: Duration::from_secs(5),
            scheduler_interval: Duration::from_secs(1),
            rescuer_interval: Duration::from_secs(5),
            expirer_interval: Duration::from_secs(5),
            batch: 1_000,
            pruner: Some(PrunerSettings::default()),
        }
    }
}

/// Retention, applied by the pruner.
#[derive(Clone, Debug, PartialEq)]
pub struct PrunerSettings {
    pub interval: Duration,
    pub retention: PruneConfig,
}

impl Default for PrunerSettings {
    fn default() -> Self {
        PrunerSettings { interval: Duration::from_secs(60), retention: PruneConfig::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_loops_follow_the_slots_and_connections_cover_them() {
        let s = RuntimeSettings::default();
        assert_eq!(s.claim_batch_max, 500);
        let loops: Vec<u32> = [1, 500, 501, 1_000, 10_000].into_iter().map(|c| s.claim_loops_for(c)).collect();
        assert_eq!(loops, vec![1, 1, 2, 2, MAX_CLAIM_LOOPS]);
        assert_eq!(s.claim_loops_for(DEFAULT_QUEUE_CONCURRENCY), 2, "the default is two claim batches");
        // Two queues' loops (2 + 1), four connections per write in flight, seven for the rest.
        let writes = 4 * s.completer.flushes_in_flight as u32;
        assert_eq!(s.connections_needed([1_000, 10]), 3 + writes + 7);
    }
}
