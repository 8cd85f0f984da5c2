//! The statements behind the maintenance services: the scheduler (promote due jobs), the
//! rescuer (expired locks and per-attempt timeouts), TTL expiry, the pruner, and the
//! advisory-lock leadership that makes one process run them.

use std::time::Duration;

use serde_json::json;
use uuid::Uuid;
use sqlx::pool::PoolConnection;
use sqlx::{Postgres, QueryBuilder, Row};

use super::fail::{FailedRun, apply_failures};
use super::policies::PolicyLayers;
use super::notify::notify_queues;
use super::lanes::{LaneKeys, Order};
use super::{Store, StoreError, jobs_from_rows, millis};
use crate::job::JobState;
use crate::outcome::{HandlerError, Outcome, STALLED_ERROR, TIMEOUT_ERROR};

/// How many windows of candidates one prune call steps through when some are not old enough
/// (created before the cutoff, finished after it).
const PRUNE_WINDOWS: usize = 4;

/// What a rescue pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RescueReport {
    /// Jobs whose lock expired (worker crashed or lost its heartbeats): `rebound.stalled`.
    pub stalled: u64,
    /// Jobs that ran past their per-attempt timeout: `rebound.timeout`.
    pub timed_out: u64,
}

/// Which queues one pass of `Store::prune_finished` covers.
#[derive(Clone, Copy, Debug)]
enum PruneScope<'a> {
    /// Every queue but these (they have a retention of their own).
    Every { but: &'a [String] },
    Only(&'a str),
}

/// Retention settings for the pruner. A queue's own retention
/// ([`super::QueueRetention`]) overrides the finished-job times for that queue.
#[derive(Clone, Debug, PartialEq)]
pub struct PruneConfig {
    pub completed_after: Duration,
    /// Cancelled jobs and plain (not dead-lettered) discards.
    pub discarded_after: Duration,
    pub dead_letters_after: Duration,
    /// Dead letters kept per queue; the oldest beyond this are pruned.
    pub dead_letters_per_queue: i64,
    /// Workers whose last heartbeat is older than this are forgotten.
    pub workers_after: Duration,
    /// Audit-log entries older than this are deleted.
    pub audit_after: Duration,
    /// Cron ticks' records (which tick fired which job) older than this are deleted.
    pub cron_runs_after: Duration,
    /// Rows deleted per statement, so pruning never holds long locks.
    pub batch: i64,
}

impl Default for PruneConfig {
    fn default() -> Self {
        PruneConfig {
            completed_after: Duration::from_secs(24 * 3600),
            discarded_after: Duration::from_secs(7 * 24 * 3600),
            dead_letters_after: Duration::from_secs(180 * 24 * 3600),
            dead_letters_per_queue: 10_000,
            workers_after: Duration::from_secs(24 * 3600),
            audit_after: Duration::from_secs(365 * 24 * 3600),
            cron_runs_after: Duration::from_secs(30 * 24 * 3600),
            batch: 5_000,
        }
    }
}

/// What a prune pass deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub completed: u64,
    pub discarded: u64,
    pub dead_letters: u64,
    pub workers: u64,
    pub audit: u64,
    pub cron_runs: u64,
    /// Rows of `job_transitions` (the events' log of starts, completions, cancellations,
    /// expiries and scheduled enqueues), aged out with the completed (starts and scheduled
    /// enqueues too) or the discarded jobs' retention.
    pub transitions: u64,
    /// Rows of `job_heartbeats` (`job.heartbeat` events), aged out with the completed jobs'
    /// retention.
    pub heartbeats: u64,
    /// Rows of `job_progress` (reports of running jobs), aged out with the completed jobs'
    /// retention.
    pub progress: u64,
    /// Rows of `worker_events` (workers started and stopped), aged out with the completed
    /// jobs' retention.
    pub worker_events: u64,
    /// Rows of `dead_letter_log` (`dead_letter.*` events), aged out with the completed jobs'
    /// retention.
    pub dead_letter_events: u64,
    /// Finished workflows, aged out with the longer of the completed and discarded jobs'
    /// retentions.
    pub workflows: u64,
    /// Rows of `workflow_events` (`workflow.*` events), aged out with the completed jobs'
    /// retention.
    pub workflow_events: u64,
    /// Rows of `rate_limit_events` (`rate_limit.*` events), aged out with the completed jobs'
    /// retention.
    pub rate_limit_events: u64,
    /// Rate-limit keys no job names any more, with no override or hold in force, untouched
    /// for the completed jobs' retention.
    pub rate_limit_keys: u64,
}

// A retention delete of `$table`'s rows older than `$1` ms by its `at`, `$2` at most, oldest
// first (by its index on `at`); ids matched as an array (see delete_with_history).
macro_rules! aged_by_at {
    ($table:literal) => {
        concat!(
            "DELETE FROM ", $table, " WHERE id = ANY(ARRAY(
                 SELECT id FROM ", $table, " WHERE at < now() - $1 * interval '1 millisecond' ORDER BY at LIMIT $2))"
        )
    };
}

// A rate-limit key `k` the pruner may delete, `$1` ms being the retention: untouched for that
// long, nothing in force on it (a handler's hold, an override, an open rate or throttle window), and no
// job naming it.
macro_rules! prunable_key {
    () => {
        "k.updated_at < now() - $1 * interval '1 millisecond'
         AND (k.held_until IS NULL OR k.held_until <= now())
         AND (k.override_concurrency IS NULL OR k.override_expires_at <= now())
         AND (k.rate_window_start IS NULL OR k.rate_window_start + k.rate_period_ms * interval '1 millisecond' <= now())
         AND (k.throttle_window_start IS NULL OR k.throttle_window_start + rebound_rate_limit_spacing(k) <= now())
         AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.rate_limit_key = k.key)"
    };
}

/// A policy-snapshot sweep between its halves ([`Store::begin_snapshot_sweep`] and
/// [`Store::finish_snapshot_sweep`]): the snapshots no attempt referred to, and the highest
/// attempt id that look covered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotSweep {
    /// Every attempt up to this id was committed, and looked at, when the candidates were found.
    pub watermark: i64,
    /// The snapshots no attempt referred to then.
    pub candidates: Vec<Uuid>,
}

/// What a leadership elects a process to do. Each is its own advisory lock, so one process
/// holding one does not keep the other from being taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderRole {
    /// The scheduler, rescuer, expirer, cron, count folding and replay rules: workers and the
    /// server campaign for it (a server with no worker keeps jobs moving on its own).
    Maintenance,
    /// Retention (the pruner). Workers campaign for it, and a server only when told to prune
    /// (`--prune`, for a deployment with no Rebound worker): what is kept is configured where
    /// the pruner runs. Apart from `Maintenance`, since a server that took that lead first
    /// must not leave nothing pruned.
    Pruning,
}

impl LeaderRole {
    fn lock_key(self) -> i64 {
        match self {
            LeaderRole::Maintenance => 0x0072_6562_6f75_6e64, // "rebound"
            LeaderRole::Pruning => 0x7072_756e_6572_0000,     // "pruner"
        }
    }
}

/// Leadership held through a session-level advisory lock on a dedicated connection. If the
/// process dies, Postgres closes the session and the lock passes to another process.
pub struct Leadership {
    conn: PoolConnection<Postgres>,
    role: LeaderRole,
}

impl Leadership {
    /// Is the lock still ours? False once the connection is gone (the lock went with it).
    pub async fn still_held(&mut self) -> bool {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
                            AND ((classid::bigint << 32) | objid::bigint) = $1)",
        )
        .bind(self.role.lock_key())
        .fetch_one(&mut *self.conn)
        .await
        .unwrap_or(false)
    }

    /// Gives leadership up at once (on shutdown). Dropping a `Leadership` also ends it: its
    /// connection is closed, and the lock goes with the session.
    pub async fn release(mut self) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_advisory_unlock($1)").bind(self.role.lock_key()).execute(&mut *self.conn).await?;
        Ok(())
    }
}

impl Store {
    /// Tries to become the maintenance leader; `None` if another process is.
    pub async fn try_lead(&self) -> Result<Option<Leadership>, StoreError> {
        self.try_lead_as(LeaderRole::Maintenance).await
    }

    /// Tries to take the leadership of `role`; `None` if another process holds it.
    pub async fn try_lead_as(&self, role: LeaderRole) -> Result<Option<Leadership>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        // A session lock lives as long as its connection: one that went back to the pool still
        // holding it would keep this process leading, silently, through a pooled connection.
        // The leader's connection is therefore closed when leadership ends, never pooled; and
        // closed too if this future is dropped with the lock's answer in flight.
        conn.close_on_drop();
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(role.lock_key()).fetch_one(&mut *conn).await?;
        Ok(got.then(|| Leadership { conn, role }))
    }

    /// Scheduler: moves due `scheduled` and `retryable` jobs to `available`, at most `limit`;
    /// none in maintenance mode. A retry without a rate-limit key is left for
    /// [`RETRY_CLAIM_WINDOW`](super::RETRY_CLAIM_WINDOW) after it falls due, for a claim to
    /// take as it is: its queue is notified meanwhile, unwritten.
    pub async fn promote_due(&self, limit: i64) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let queues: Vec<(String, bool)> = sqlx::query_as(
            "WITH due AS (
                 SELECT id FROM jobs WHERE state IN ('scheduled', 'retryable') AND scheduled_at <= now()
                   AND (state = 'scheduled' OR rate_limit_key IS NOT NULL OR scheduled_at <= now() - $2 * interval '1 millisecond')
                   -- Held in maintenance mode: nothing is handed out, so nothing is made ready.
                   AND NOT EXISTS (SELECT 1 FROM maintenance)
                 ORDER BY scheduled_at LIMIT $1 FOR UPDATE SKIP LOCKED
             ), moved AS (
                 -- An id array, not a join: with the limit a parameter, the generic plan of a
                 -- join hashed the whole table for every pass (97 ms per 1 000 jobs at 100k
                 -- rows, forced generic). See delete_with_history.
                 UPDATE jobs j SET state = 'available', enqueued_at = now(), updated_at = now()
                 WHERE j.id = ANY(ARRAY(SELECT id FROM due)) RETURNING j.queue
             )
             SELECT queue, true FROM moved
             UNION ALL
             -- Queues with a retry inside its window: told, so that an idle worker claims it
             -- now, not when it is promoted. (A pass runs when a job falls due, see
             -- `next_waits`; a retry is told of at most a few times.)
             SELECT DISTINCT queue, false FROM jobs
             WHERE state = 'retryable' AND rate_limit_key IS NULL
               AND scheduled_at <= now() AND scheduled_at > now() - $2 * interval '1 millisecond'
               AND NOT EXISTS (SELECT 1 FROM maintenance)",
        )
        .bind(limit)
        .bind(super::millis(super::RETRY_CLAIM_WINDOW))
        .fetch_all(&mut *tx)
        .await?;
        let moved = queues.iter().filter(|(_, promoted)| *promoted).count() as u64;
        let mut distinct: Vec<String> = queues.into_iter().map(|(queue, _)| queue).collect();
        distinct.sort();
        distinct.dedup();
        notify_queues(&mut *tx, &distinct).await?;
        tx.commit().await?;
        Ok(moved)
    }

    /// Rescuer: active jobs whose lock lapsed (`rebound.stalled`, re-run at once) or whose
    /// per-attempt timeout passed (`rebound.timeout`, normal backoff) become failed attempts,
    /// and their policy decides what follows. At most `limit` per call.
    ///
    /// A lapsed lock means the worker crashed, was killed, or could not reach the database for
    /// a whole visibility timeout (not counting a database restart: see the statement). The
    /// attempt is counted: the rescuer cannot tell whether the job started, and a job that
    /// kills its worker must spend its budget rather than crash workers forever. Jobs that
    /// provably never started are the ones a live worker claimed without receiving them; it
    /// hands those back itself, uncounted ([`Store::release_orphans`], [`Store::worker_beat`]).
    pub async fn rescue_expired(&self, limit: i64) -> Result<RescueReport, StoreError> {
        self.rescue(limit, None).await
    }

    /// [`Store::rescue_expired`] for the jobs of one worker only.
    pub(crate) async fn rescue(&self, limit: i64, worker: Option<&str>) -> Result<RescueReport, StoreError> {
        let mut tx = self.begin().await?;
        let rows = sqlx::query(
            // Timed out or stalled, and for how long it ran, on the database's clock, the one
            // that chose the job: by this host's, a job chosen for its timeout could be taken
            // for a stalled one and re-run at once while its holder still runs it.
            "SELECT *, (timeout_ms IS NOT NULL AND started_at + LEAST(timeout_ms, 604800000) * interval '1 millisecond' < now()) AS rescued_for_timeout,
                    GREATEST(extract(epoch FROM now() - started_at), 0)::float8 AS rescued_after_s
             FROM jobs
             WHERE state = 'active'
               -- Nobody could extend a lock or deliver a result while the database was down.
               -- After a restart, neither a lock nor a timeout lapses sooner than one visibility
               -- timeout after it, so the workers still running their jobs, or holding results
               -- they could not write, get to say so first.
               -- LEAST: bounds::MAX_TIMEOUT_MS; a larger stored timeout would overflow the
               -- interval and fail every maintenance pass.
               AND pg_postmaster_start_time() + LEAST(COALESCE(visibility_timeout_ms, 30000), 604800000) * interval '1 millisecond' < now()
               AND (lock_expires_at < now()
                    -- A worker enforces the timeout itself; this is the backstop for one that
                    -- does not (an OJS client that keeps beating), so it applies at the deadline.
                    OR (timeout_ms IS NOT NULL AND started_at + LEAST(timeout_ms, 604800000) * interval '1 millisecond' < now()))
               AND ($2::text IS NULL OR locked_by = $2)
             ORDER BY lock_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(limit)
        .bind(worker)
        .fetch_all(&mut *tx)
        .await?;
        let mut report = RescueReport::default();
        let judged: Vec<(bool, Option<f64>)> = rows
            .iter()
            .map(|r| Ok((r.try_get::<Option<bool>, _>("rescued_for_timeout")?.unwrap_or(false), r.try_get::<Option<f64>, _>("rescued_after_s")?)))
            .collect::<Result<_, sqlx::Error>>()?;
        let runs: Vec<FailedRun> = jobs_from_rows(&rows)?
            .into_iter()
            .zip(judged)
            .map(|(job, (timed_out, elapsed_seconds))| {
                // The OJS shape of a timeout error (ojs-timeouts §8), which its `job.timeout` or
                // `job.stalled` event repeats.
                let details = |kind: &str, limit_ms: i64| {
                    Some(json!({"worker_id": job.locked_by, "timeout_kind": kind, "limit_ms": limit_ms,
                                "limit_seconds": limit_ms as f64 / 1000.0, "elapsed_seconds": elapsed_seconds}))
                };
                let error = if timed_out {
                    report.timed_out += 1;
                    let limit_ms = job.timeout_ms.unwrap_or(0);
                    HandlerError {
                        error_type: TIMEOUT_ERROR.into(),
                        message: format!("attempt {} ran longer than its timeout of {limit_ms} ms", job.attempt),
                        details: details("execution", limit_ms),
                        retryable: true,
                    }
                } else {
                    report.stalled += 1;
                    let limit_ms = job.visibility_timeout_ms.unwrap_or(30_000);
                    HandlerError {
                        error_type: STALLED_ERROR.into(),
                        message: format!(
                            "attempt {} stopped heartbeating (worker {} crashed or lost the database); its lock expired",
                            job.attempt,
                            job.locked_by.as_deref().unwrap_or("unknown")
                        ),
                        details: details("stalled", limit_ms),
                        retryable: true,
                    }
                };
                FailedRun {
                    worker_id: job.locked_by.clone(),
                    error_code: Some(error.error_type.clone()),
                    outcome: Outcome::Retry(error),
                    immediate: !timed_out,
                    job,
                }
            })
            .collect();
        let mut types: Vec<String> = runs.iter().map(|r| r.job.job_type.clone()).collect();
        types.sort();
        types.dedup();
        let layers = PolicyLayers::load(&mut tx, &types).await?;
        apply_failures(&mut tx, runs, &layers).await?;
        tx.commit().await?;
        Ok(report)
    }

    /// Discards jobs whose `expires_at` passed before they ran (no `completed_at`: they never
    /// ran to an end). Returns how many.
    pub async fn expire_due(&self, limit: i64) -> Result<u64, StoreError> {
        let n = sqlx::query(
            "WITH expired AS (
                 SELECT id FROM jobs
                 WHERE expires_at <= now() AND state IN ('scheduled', 'available', 'retryable', 'pending')
                 LIMIT $1 FOR UPDATE SKIP LOCKED
             )
             UPDATE jobs j SET state = 'discarded', discarded_at = now(), updated_at = now(),
                 last_error = jsonb_build_object('type', 'rebound.expired', 'code', 'rebound.expired',
                     'message', 'the job expired before it ran', 'retryable', false, 'attempt', j.attempt,
                     'occurred_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))
             WHERE j.id = ANY(ARRAY(SELECT id FROM expired))",
        )
        .bind(limit)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n)
    }

    /// Deletes, with their history, up to `batch` jobs in `states`, not dead letters (they
    /// have rules of their own), whose `finished` column is older than `after`. Oldest first,
    /// no further than the jobs created before the cutoff (a job cannot finish before it was
    /// created, and ids are UUIDv7). The candidates are read from the listing index's lanes in
    /// id order (their rows read only to leave out a running workflow's); the finish time is
    /// checked on the candidates' rows, so a
    /// window of candidates that were created long ago but finished recently is stepped over,
    /// a few windows per call. A finished member of an unfinished workflow is kept until its
    /// workflow finishes (its result is owed to the steps after it). Returns how many went.
    async fn prune_finished(&self, states: &[JobState], finished: &'static str, after: Duration, batch: i64, scope: PruneScope<'_>) -> Result<u64, StoreError> {
        let after = millis(after);
        let (only, but): (Option<&str>, &[String]) = match scope {
            PruneScope::Every { but } => (None, but),
            PruneScope::Only(queue) => (Some(queue), &[]),
        };
        let source = self.source_for(LaneKeys { states, queue: only, dead_letter: Some(false), ..Default::default() }).await?.without_queues(but);
        let listed = JobState::sql_literals(states);
        let mut deleted = 0u64;
        let mut after_id: Option<Uuid> = None;
        for _ in 0..PRUNE_WINDOWS {
            let mut qb = QueryBuilder::<Postgres>::new("WITH candidates AS MATERIALIZED (");
            source.push_ids(&mut qb, Order::OldestFirst, batch, |qb, in_lane| {
                if !in_lane {
                    qb.push(format_args!(" AND j.state IN ({listed}) AND NOT j.dead_letter"));
                    if let Some(q) = only {
                        qb.push(" AND j.queue = ").push_bind(q.to_owned());
                    }
                    if !but.is_empty() {
                        qb.push(" AND NOT (j.queue = ANY(").push_bind(but.to_vec()).push("))");
                    }
                }
                qb.push(" AND j.id < rebound_id_floor(now() - ").push_bind(after).push(" * interval '1 millisecond')");
                // A member of a workflow still running is kept: its later steps and callbacks
                // read its result from its row when they are released. Left out of the
                // candidates, not skipped by the delete: kept rows taking the windows' places
                // would stop every pass behind a large workflow that runs for days. (The
                // delete, in the same statement, sees the same workflows.)
                qb.push(" AND (j.workflow_id IS NULL OR NOT EXISTS (SELECT 1 FROM workflows w WHERE w.id = j.workflow_id AND w.finished_at IS NULL))");
                if let Some(id) = after_id {
                    qb.push(" AND j.id > ").push_bind(id);
                }
            });
            qb.push(format_args!(
                "), gone AS (
                     DELETE FROM jobs x
                     WHERE x.id = ANY(ARRAY(SELECT id FROM candidates)) AND x.state IN ({listed}) AND NOT x.dead_letter AND x.{finished} < now() - "
            ))
            .push_bind(after)
            .push(
                " * interval '1 millisecond' RETURNING x.id
                 ), history AS (DELETE FROM job_attempts a WHERE a.job_id = ANY(ARRAY(SELECT id FROM gone)))
                 SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM candidates),
                        (SELECT id FROM candidates ORDER BY id DESC LIMIT 1)",
            );
            let (gone, seen, last): (i64, i64, Option<Uuid>) = qb.build_query_as().fetch_one(&self.pool).await?;
            deleted += gone as u64;
            if seen < batch || deleted >= batch as u64 {
                break;
            }
            after_id = last;
        }
        Ok(deleted)
    }

    /// Pruner: one bounded pass of retention. Call again while it keeps deleting.
    pub async fn prune(&self, cfg: &PruneConfig) -> Result<PruneReport, StoreError> {
        // Queues with a retention of their own are pruned by it, one by one, and left out of
        // the pass over the rest.
        let own = self.queue_retentions().await?;
        let mut pruned = [0u64; 2];
        for (i, (states, finished, after)) in [
            (&[JobState::Completed][..], "completed_at", cfg.completed_after),
            (&[JobState::Cancelled, JobState::Discarded][..], "updated_at", cfg.discarded_after),
        ]
        .into_iter()
        .enumerate()
        {
            let kept: Vec<(&str, Duration)> =
                own.iter().filter_map(|(q, r)| (if i == 0 { r.completed } else { r.discarded }).map(|d| (q.as_str(), d))).collect();
            let names: Vec<String> = kept.iter().map(|(q, _)| (*q).to_owned()).collect();
            // One batch across them all, as without queues of their own: a pass stays bounded.
            pruned[i] += self.prune_finished(states, finished, after, cfg.batch, PruneScope::Every { but: &names }).await?;
            for (q, d) in kept {
                let left = cfg.batch - i64::try_from(pruned[i]).unwrap_or(i64::MAX);
                if left <= 0 {
                    break;
                }
                pruned[i] += self.prune_finished(states, finished, d, left, PruneScope::Only(q)).await?;
            }
        }
        let [completed, discarded] = pruned;
        // Dead letters queue by queue (the queues that have any, from the counters), by the
        // (queue, dead_lettered_at) index.
        let old_dead = sqlx::query_scalar::<_, i64>(delete_with_history!(
            "SELECT x.id FROM (SELECT DISTINCT queue FROM job_count_totals WHERE dead_letter) q
             CROSS JOIN LATERAL (
                 SELECT id FROM jobs
                 WHERE dead_letter AND queue = q.queue AND dead_lettered_at < now() - $1 * interval '1 millisecond'
                 ORDER BY dead_lettered_at LIMIT $2) x
             LIMIT $2",
            // A dead letter re-driven (by hand or a replay rule) while this waited is no longer
            // one, or died again since: it stays.
            "dead_letter AND dead_lettered_at < now() - $1 * interval '1 millisecond'",
            "'pruned'",
            "NULL"
        ))
        .bind(millis(cfg.dead_letters_after))
        .bind(cfg.batch)
        .fetch_one(&self.pool)
        .await? as u64;
        // Only queues over their cap, by the counters; of each, what lies beyond its newest
        // `cap` dead letters.
        let over_cap = sqlx::query_scalar::<_, i64>(delete_with_history!(
            "SELECT x.id FROM (SELECT queue FROM job_count_totals WHERE dead_letter GROUP BY queue HAVING sum(n) > $1) q
             CROSS JOIN LATERAL (
                 SELECT id FROM jobs WHERE dead_letter AND queue = q.queue
                 ORDER BY dead_lettered_at DESC, id DESC OFFSET $1 LIMIT $2) x
             LIMIT $2",
            // A dead letter re-driven (by hand or a replay rule) while this waited is no longer
            // one, or has died again since, the newest of its queue: it stays.
            "dead_letter AND dead_lettered_at < statement_timestamp()",
            "'pruned'",
            "NULL"
        ))
        .bind(cfg.dead_letters_per_queue)
        .bind(cfg.batch)
        .fetch_one(&self.pool)
        .await? as u64;
        let workers = sqlx::query("DELETE FROM workers WHERE last_heartbeat_at < now() - $1 * interval '1 millisecond'")
            .bind(millis(cfg.workers_after))
            .execute(&self.pool)
            .await?
            .rows_affected();
        let audit = self.delete_aged(aged_by_at!("audit_log"), cfg.audit_after, cfg.batch).await?;
        // The charts show a day; two are kept.
        sqlx::query("DELETE FROM job_throughput WHERE minute < now() - interval '2 days'").execute(&self.pool).await?;
        let cron_runs = self.delete_aged(
            // Each cron keeps its latest run (the Cron page's last outcome) and any run whose
            // job has not finished (one waiting to enqueue, say: overlap checks and the release
            // of waiting runs find those jobs through their runs), however old. A waiting run's
            // outcome stays `waiting` once its job ran, so it goes when that job has finished.
            // Rows are matched by their tuple ids: matched by
            // their composite key (`IN`), the generic plan hashed the batch and read the whole
            // table to probe it (3 000 000 runs: 420 ms a pass, against 30 ms). A run updated
            // meanwhile has moved and is left to the next pass.
            "DELETE FROM cron_runs WHERE ctid = ANY(ARRAY(
                 SELECT x.ctid FROM cron_runs x
                 WHERE x.fired_at < now() - $1 * interval '1 millisecond'
                   AND x.scheduled_for < (SELECT max(y.scheduled_for) FROM cron_runs y WHERE y.cron_name = x.cron_name)
                   AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = x.job_id AND j.state NOT IN ('completed', 'cancelled', 'discarded'))
                 ORDER BY x.fired_at LIMIT $2))",
            cfg.cron_runs_after,
            cfg.batch,
        )
        .await?;
        // By (state, at), each state with its jobs' retention; ids matched as an array (see
        // delete_with_history).
        let transitions = sqlx::query(
            "DELETE FROM job_transitions WHERE id = ANY(ARRAY(
                 SELECT x.id FROM unnest(ARRAY['active', 'scheduled', 'completed', 'cancelled', 'discarded']::job_state[]) AS s(state)
                 CROSS JOIN LATERAL (
                     SELECT id FROM job_transitions
                     WHERE state = s.state
                       AND at < now() - CASE WHEN s.state IN ('cancelled', 'discarded') THEN $2 ELSE $1 END * interval '1 millisecond'
                     ORDER BY at LIMIT $3) x))",
        )
        .bind(millis(cfg.completed_after))
        .bind(millis(cfg.discarded_after))
        .bind(cfg.batch)
        .execute(&self.pool)
        .await?
        .rows_affected();
        let heartbeats = self.delete_aged(aged_by_at!("job_heartbeats"), cfg.completed_after, cfg.batch).await?;
        let progress = self.delete_aged(aged_by_at!("job_progress"), cfg.completed_after, cfg.batch).await?;
        let worker_events = self.delete_aged(aged_by_at!("worker_events"), cfg.completed_after, cfg.batch).await?;
        let dead_letter_events = self.delete_aged(aged_by_at!("dead_letter_log"), cfg.completed_after, cfg.batch).await?;
        let workflow_events = self.delete_aged(aged_by_at!("workflow_events"), cfg.completed_after, cfg.batch).await?;
        let rate_limit_events = self.delete_aged(aged_by_at!("rate_limit_events"), cfg.completed_after, cfg.batch).await?;
        let rate_limit_keys = self.prune_rate_limit_keys(cfg.completed_after, cfg.batch).await?;
        // A finished workflow is kept as long as its failed jobs are (the longer retention):
        // its page explains them. Nested ones go with the outermost (the foreign key cascades).
        let workflows = self
            .delete_aged(
                "DELETE FROM workflows WHERE id = ANY(ARRAY(
                     SELECT id FROM workflows WHERE finished_at < now() - $1 * interval '1 millisecond' AND parent_id IS NULL
                     ORDER BY finished_at LIMIT $2))",
                cfg.completed_after.max(cfg.discarded_after),
                cfg.batch,
            )
            .await?;
        Ok(PruneReport {
            completed,
            discarded,
            dead_letters: old_dead + over_cap,
            workers,
            audit,
            cron_runs,
            transitions,
            heartbeats,
            progress,
            worker_events,
            dead_letter_events,
            workflows,
            workflow_events,
            rate_limit_events,
            rate_limit_keys,
        })
    }

    /// Deletes up to `batch` rate-limit keys no job names, with no override, hold or rate
    /// window in force, untouched for `after`. A key's row outlives every job that names it, so
    /// a job coming back (re-driven, retried) finds its limit, and outlives its window, so a
    /// new job of the key does not find a fresh one early.
    async fn prune_rate_limit_keys(&self, after: Duration, batch: i64) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        // Locked in key order, as every other writer of these rows locks them; a key another
        // transaction holds is in use and passed over. An enqueue naming a key takes its row
        // before inserting its jobs and holds it to its commit, so once a key is locked here,
        // the second statement's fresh snapshot sees every job named under it so far (and the
        // age its upsert gave it), though the candidates were read before they were visible.
        let candidates: Vec<String> = sqlx::query_scalar(concat!(
            "SELECT key FROM rate_limit_keys WHERE key = ANY(ARRAY(
                 SELECT k.key FROM rate_limit_keys k WHERE ",
            prunable_key!(),
            " ORDER BY k.updated_at LIMIT $2))
             ORDER BY key FOR UPDATE SKIP LOCKED"
        ))
        .bind(millis(after))
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
        let n = if candidates.is_empty() {
            0
        } else {
            sqlx::query(concat!("DELETE FROM rate_limit_keys k WHERE k.key = ANY($2) AND ", prunable_key!()))
                .bind(millis(after))
                .bind(&candidates)
                .execute(&mut *tx)
                .await?
                .rows_affected()
        };
        tx.commit().await?;
        Ok(n)
    }

    /// Runs a retention delete whose `$1` is the age (ms) past which rows go and `$2` the
    /// batch; returns the rows deleted.
    async fn delete_aged(&self, sql: &'static str, age: Duration, batch: i64) -> Result<u64, StoreError> {
        Ok(sqlx::query(sql).bind(millis(age)).bind(batch).execute(&self.pool).await?.rows_affected())
    }

    /// Deletes the policy snapshots no attempt refers to any more (their jobs were pruned):
    /// [`Store::begin_snapshot_sweep`], then [`Store::finish_snapshot_sweep`]. Returns the
    /// snapshots deleted.
    pub async fn prune_policy_snapshots(&self) -> Result<u64, StoreError> {
        let sweep = self.begin_snapshot_sweep().await?;
        self.finish_snapshot_sweep(sweep).await
    }

    /// The first half of a snapshot sweep: the snapshots no attempt refers to now. This is
    /// one scan of the whole attempt history, so it runs without a lock that would hold up
    /// failures being recorded meanwhile (the pruner sweeps daily).
    ///
    /// The fail path reuses an existing snapshot without writing it, so a failure may point at
    /// a candidate while the scan runs. Every attempt that names a snapshot is written by a
    /// statement that also writes `policy_snapshots`, which takes that table's row-exclusive
    /// lock: a moment's share-row-exclusive lock before the scan waits out every such writer
    /// in flight. Attempts up to the id read then are all committed and seen by the scan;
    /// anything written afterwards has a higher id, and the second half looks at just those.
    pub async fn begin_snapshot_sweep(&self) -> Result<SnapshotSweep, StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query("SET LOCAL lock_timeout = '2s'").execute(&mut *tx).await?;
        sqlx::query("LOCK TABLE policy_snapshots IN SHARE ROW EXCLUSIVE MODE").execute(&mut *tx).await?;
        let watermark: i64 = sqlx::query_scalar("SELECT COALESCE(max(id), 0) FROM job_attempts").fetch_one(&mut *tx).await?;
        tx.commit().await?;
        let candidates: Vec<Uuid> =
            sqlx::query_scalar("SELECT p.id FROM policy_snapshots p WHERE NOT EXISTS (SELECT 1 FROM job_attempts a WHERE a.policy_id = p.id)")
                .fetch_all(&self.pool)
                .await?;
        Ok(SnapshotSweep { watermark, candidates })
    }

    /// The second half of a snapshot sweep: deletes the candidates that no attempt written
    /// since the first half refers to either. Under the table's lock, so no failure pointing
    /// at a candidate is in flight, but the look is only at the attempts past the sweep's
    /// watermark (a range of the primary key): the lock is held for moments, not a scan.
    pub async fn finish_snapshot_sweep(&self, sweep: SnapshotSweep) -> Result<u64, StoreError> {
        if sweep.candidates.is_empty() {
            return Ok(0);
        }
        let mut tx = self.begin().await?;
        sqlx::query("SET LOCAL lock_timeout = '2s'").execute(&mut *tx).await?;
        sqlx::query("LOCK TABLE policy_snapshots IN SHARE ROW EXCLUSIVE MODE").execute(&mut *tx).await?;
        let n = sqlx::query(
            "WITH recent AS MATERIALIZED (
                 SELECT DISTINCT policy_id FROM job_attempts WHERE id > $2 AND policy_id IS NOT NULL
             )
             DELETE FROM policy_snapshots p WHERE p.id = ANY($1) AND NOT EXISTS (SELECT 1 FROM recent r WHERE r.policy_id = p.id)",
        )
        .bind(&sweep.candidates)
        .bind(sweep.watermark)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    /// Folds the job-count deltas that writers appended into the counters (see the
    /// `job_counts` migration). Readers add unfolded deltas themselves, so this only keeps
    /// reads short; it never changes a count anyone sees. Returns the delta rows folded.
    pub async fn fold_job_counts(&self) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let n: i64 = sqlx::query_scalar(
            "WITH taken AS (
                 DELETE FROM job_count_deltas RETURNING queue, type, state, dead_letter, signature, n, at
             ), per_minute AS (
                 INSERT INTO job_throughput AS t (minute, completed)
                 SELECT date_trunc('minute', at), sum(n)::bigint FROM taken WHERE state = 'completed' AND n > 0 GROUP BY 1
                 ON CONFLICT (minute) DO UPDATE SET completed = t.completed + EXCLUDED.completed
             ), folded AS (
                 INSERT INTO job_counts AS c (queue, type, state, dead_letter, signature, n)
                 SELECT queue, type, state, dead_letter, signature, sum(n)::bigint FROM taken GROUP BY 1, 2, 3, 4, 5
                 ON CONFLICT (queue, type, state, dead_letter, signature) DO UPDATE SET n = c.n + EXCLUDED.n
             )
             SELECT count(*) FROM taken",
        )
        .fetch_one(&mut *tx)
        .await?;
        // Keys that dropped to zero (a queue drained and pruned) would otherwise pile up.
        if n > 0 {
            sqlx::query("DELETE FROM job_counts WHERE n = 0").execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(n as u64)
    }
}
