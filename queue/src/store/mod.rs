//! The Postgres store. Every SQL statement of Rebound lives below this module.
//!
//! Transitions are guarded in SQL (`WHERE state = 'active'` and friends), so an invalid
//! transition is refused by the store with a typed error rather than silently ignored, and
//! concurrent callers cannot both win.

// Deletes the jobs whose ids the given query selects, with their attempt history, in one
// statement, and yields how many jobs went. `job_attempts` has no foreign key (its check
// would cost every execution a lookup), so every deletion of jobs goes through here.
//
// Ids are matched as `= ANY(ARRAY(...))`, never joined: with the batch size a parameter, the
// prepared statement's generic plan guessed a twentieth of the table and hashed all of `jobs`
// and all of `job_attempts` for every batch (a sequential scan of each, at 10M jobs, per
// pruner pass). An id array is always looked up by key.
// The CTEs of a heartbeat over the held jobs `$1` (those `$holder` holds): `mine`, the rows it
// locks without waiting (`SKIP LOCKED`: a row another write holds is skipped, never waited
// for); `extended`, their new lock expiry `$visibility` from now; `busy`, the held rows it
// skipped, read by snapshot: still active and held, so locked by a write not yet committed;
// and `beaten`, which logs the extensions for `job.heartbeat` events.
macro_rules! held_ctes {
    ($holder:literal, $visibility:literal) => {
        concat!(
            "WITH mine AS (
    SELECT id FROM jobs WHERE id = ANY($1) AND state = 'active' AND ", $holder, "
    FOR NO KEY UPDATE SKIP LOCKED
), extended AS (
    UPDATE jobs SET lock_expires_at = now() + LEAST(", $visibility, ", 604800000) * interval '1 millisecond'
    WHERE id = ANY(ARRAY(SELECT id FROM mine))
    RETURNING id, queue, attempt, locked_by, lock_expires_at
), beaten AS (
    -- OJS `job.heartbeat` events (see migrations/…_job_heartbeats.sql).
    INSERT INTO job_heartbeats (queue, worker_id, job_ids, attempts, visible_until)
    SELECT queue, locked_by, array_agg(id), array_agg(attempt), array_agg(lock_expires_at) FROM extended GROUP BY queue, locked_by
), busy AS (
    SELECT id FROM jobs WHERE id = ANY($1) AND state = 'active' AND ", $holder, "
      AND NOT (id = ANY(ARRAY(SELECT id FROM mine)))
)"
        )
    };
}

// Deletes the jobs `$select_ids` picks that still match `$recheck` with their attempts and
// progress reports, and logs the dead letters among them in `dead_letter_log` as `$action`
// (`'deleted'`, `'pruned'`) by `$actor` (a parameter, or NULL), one row per queue: the OJS
// `dead_letter.*` events. Returns how many jobs went. The ids are picked once, when the
// statement starts; a row another transaction rewrites meanwhile (a dead letter re-driven, a
// job claimed) is waited for and then checked against `$recheck` alone, so it must repeat
// what made the row deletable.
macro_rules! delete_with_history {
    ($select_ids:literal, $recheck:literal, $action:literal, $actor:literal) => {
        concat!(
            "WITH gone AS (DELETE FROM jobs WHERE id = ANY(ARRAY(",
            $select_ids,
            ")) AND (",
            $recheck,
            ") RETURNING id, queue, type, dead_letter),
history AS (DELETE FROM job_attempts a WHERE a.job_id = ANY(ARRAY(SELECT id FROM gone))),
reports AS (DELETE FROM job_progress p WHERE p.job_id = ANY(ARRAY(SELECT id FROM gone))),
logged AS (
    INSERT INTO dead_letter_log (action, queue, job_ids, job_types, actor)
    SELECT ",
            $action,
            ", queue, array_agg(id), array_agg(type), ",
            $actor,
            "::text FROM gone WHERE dead_letter GROUP BY queue
)
SELECT count(*) FROM gone"
        )
    };
}

// The CTEs `policies`, a failure batch's distinct effective policies (sent once each, not once
// per job, in the jsonb array parameter `$param`, numbered from 1 as `policy_index`), and
// `snapshots`, which stores each once in `policy_snapshots` keyed by the md5 of its text: an
// attempt row keeps the key of the policy that judged it.
macro_rules! policy_snapshots_sql {
    ($param:literal) => {
        concat!(
            "policies AS (
    SELECT t.ord::int AS policy_index, md5(t.p::text)::uuid AS id, t.p AS policy
    FROM unnest(",
            $param,
            "::jsonb[]) WITH ORDINALITY AS t(p, ord)
), snapshots AS (
    INSERT INTO policy_snapshots (id, policy)
    SELECT DISTINCT ON (id) id, policy FROM policies
    ON CONFLICT (id) DO NOTHING
)"
        )
    };
}

mod admin;
mod audit;
mod auth;
mod cancel;
mod claim;
mod complete;
mod copy_in;
mod cron;
mod dead_letter;
mod enqueue;
mod events;
mod fail;
mod in_place;
mod lanes;
mod lenient;
mod listing;
mod login_throttle;
mod maintenance;
mod maintenance_mode;
mod next_due;
pub use next_due::{LIMIT_MIN_WAIT, NextWaits, SCHEDULER_MIN_WAIT};
mod notify;
mod policies;
mod progress;
mod queues;
mod rate_limits;
mod replay_rules;
mod sign_in_devices;
mod sorted;
pub use sorted::{SORT_WINDOW, SortKey};
mod transaction;
mod workers;
mod workflows;

use std::time::Duration;

use jiff::Timestamp;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{ColumnIndex, PgPool, Row};
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::job::{Attempt, Job, JobState, JobValidationError, OnLimit};
use lenient::{StoredJson, StoredTime};
use crate::policy::PolicyError;

pub use admin::{BulkReport, DeadLetterStats};
pub use audit::{Actor, AuditEntry, AuditFilter};
pub use auth::{ApiToken, MAX_USERNAME_BYTES, Operator, Role, Session};
pub use login_throttle::LoginFailures;
pub use claim::{ClaimRequest, HeldJobs, RETRY_CLAIM_WINDOW, UNANSWERED_CLAIM_REASON};
pub use complete::{Completion, ORPHAN_REASON};
pub use cron::{CRON_EVENT_TYPES, CronEvent, CronJob, CronPass, CronSpec, CronTemplate, OverlapPolicy, TemplateRateLimit, TemplateWindow, validate_cron_name};
pub use cancel::{BULK_LIMIT, JobSelection};
pub use dead_letter::{DeathCursor, RedriveBudget, RedriveOptions, RedriveOverride, RedriveTarget};
pub use enqueue::{EnqueueOutcome, Enqueued};
pub use events::{
    DEAD_LETTER_EVENT_TYPES, DeadLetterEvent, EVENT_SETTLE, EVENT_TYPES, EventFilter, JobEvent, QUEUE_EVENT_TYPES, QueueEvent, RATE_LIMIT_EVENT_TYPES, RateLimitEvent, WORKER_EVENT_TYPES,
    WORKFLOW_EVENT_TYPES, WorkerEvent, WorkflowEvent, position_at, position_time,
};
pub use fail::{Failure, FailureResult, KnownRun};
pub use lanes::Order;
pub use listing::{ErrorGroup, JobCount, JobFilter, Page, SEARCH_WINDOW, Stats, StatsRow};
pub use maintenance::{LeaderRole, Leadership, PruneConfig, PruneReport, RescueReport, SnapshotSweep};
pub use in_place::{InPlaceEnd, InPlaceRun, RetriedInPlace};
pub use notify::{JobListener, NOTIFY_CHANNEL, Notification, POLICY_CHANNEL};
pub use policies::{DEFAULT_POLICY_KEY, PolicyLayers, PolicyVersion, StoredPolicy};
pub use progress::{JobProgress, MAX_PROGRESS_DATA, MAX_PROGRESS_MESSAGE, ProgressReport};
pub use maintenance_mode::Maintenance;
pub use queues::{QueueInfo, QueueRetention};
pub use replay_rules::{MAX_REPLAY_RULES, MAX_REPLAYS, REPLAY_MARGIN, ReplayReport, ReplayRule, ReplayRuleSpec, check_rule_name};
pub use rate_limits::{KeyedRateLimit, QueueRateLimit, RateLimitOverride, RateLimitState, Window};
pub use workflows::{BatchCallbacks, CALLBACKS, GraphStep, MAX_WORKFLOW_DEPTH, MAX_WORKFLOW_JOBS, NESTED_WORKFLOW_QUEUE, NestedCounts, NewWorkflow, Workflow, WorkflowCancel, WorkflowMember, WorkflowType};
pub use workers::{BeatReport, ProcessUsage, WorkerBeat, WorkerInfo, WorkerRegistration, WorkerStatus};

/// The migrations, embedded so both binaries can migrate on start.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Something the store refused or could not do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("job {0} not found")]
    NotFound(Uuid),
    #[error("{what} not found")]
    Missing { what: String },
    /// The job exists but is not in a state that allows the action.
    #[error("cannot {action} job {id}: it is {state}")]
    Conflict { id: Uuid, state: JobState, action: &'static str },
    /// The job is active, but held by another worker than the one that asked.
    #[error("cannot {action} job {id}: worker {worker} does not hold it")]
    NotHeld { id: Uuid, action: &'static str, worker: String },
    /// The job is active, but in another run than the one the caller named (it was handed
    /// back or rescued and claimed again since): the caller's result belongs to a run that
    /// has ended.
    #[error("cannot {action} job {id}: the run named has ended; the job is active in attempt {attempt}, started {}", .started_at.as_deref().unwrap_or("at an unknown time"))]
    RunEnded { id: Uuid, action: &'static str, attempt: i32, started_at: Option<String> },
    /// A job with this id, or a live job with this unique key, already exists.
    #[error("duplicate: {reason}")]
    Duplicate { reason: String, existing: Option<Uuid> },
    #[error(transparent)]
    InvalidJob(#[from] JobValidationError),
    #[error("invalid retry policy: {0}")]
    InvalidPolicy(#[from] PolicyError),
    #[error("invalid input: {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// The operation was abandoned because the caller is shutting down.
    #[error("cancelled")]
    Cancelled,
    #[error("database: {}", describe_sqlx(.0))]
    Database(#[from] sqlx::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl StoreError {
    /// Could the same operation succeed if tried again shortly? Lost connections, serialization
    /// failures, deadlocks, lock timeouts and server shutdowns are; everything else is not.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Database(e) => is_transient_sqlx(e),
            _ => false,
        }
    }

    /// Whether the statement gave up waiting for a lock: it waited past the connection's
    /// `lock_timeout` (see [`Store::connect_lazy_bounded`]), or asked for one with `NOWAIT`.
    /// Postgres rolled back the transaction it was in. Transient too: the same request may
    /// pass once whoever holds the lock lets go.
    pub fn is_lock_timeout(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03"))
    }

    /// Whether the statement may have run, and a transaction committed, although this error is
    /// all its caller heard: the connection was lost while the request was out (as opposed to
    /// a pool that found no connection, so nothing was sent, or an error the server answered,
    /// after which it had rolled back).
    pub fn may_have_landed(&self) -> bool {
        use std::io::ErrorKind;
        match self {
            StoreError::Database(e) => match e {
                // A connection that broke under a request; a refused or unreachable one (sqlx
                // returns those from the pool as they are) never carried it.
                sqlx::Error::Io(io) => {
                    matches!(io.kind(), ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe | ErrorKind::TimedOut)
                }
                sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
                // A backend ended by the server (a restart, pg_terminate_backend) may have been
                // ending a commit: one waiting for a synchronous standby has committed locally.
                sqlx::Error::Database(db) => db.code().is_some_and(|c| c.starts_with("08") || c == "57P01" || c == "57P02"),
                _ => false,
            },
            _ => false,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        StoreError::Invalid { field: field.into(), reason: reason.into() }
    }

    /// The same error with the field it names rewritten (`max_attempts` → `jobs[2].max_attempts`
    /// for a job of a batch); errors that name no field are returned as they are.
    pub fn map_field(self, rename: impl FnOnce(&str) -> String) -> Self {
        match self {
            StoreError::InvalidJob(mut v) => {
                v.field = rename(&v.field);
                StoreError::InvalidJob(v)
            }
            StoreError::InvalidPolicy(mut p) => {
                p.field = rename(&p.field);
                StoreError::InvalidPolicy(p)
            }
            StoreError::Invalid { field, reason } => StoreError::Invalid { field: rename(&field), reason },
            other => other,
        }
    }
}

/// sqlx's text, except where it hides what an operator needs to know.
fn describe_sqlx(e: &sqlx::Error) -> String {
    match e {
        // sqlx keeps retrying a refused connection until the acquire timeout, then reports
        // only that it timed out.
        sqlx::Error::PoolTimedOut => {
            "no connection within the acquire timeout: the database is down or unreachable, or every pooled connection is busy".to_string()
        }
        other => other.to_string(),
    }
}

fn is_transient_sqlx(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => true,
        sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            code.starts_with("08") // connection exception
                || matches!(
                    code.as_str(),
                    "40001" // serialization_failure
                    | "40P01" // deadlock_detected
                    | "55P03" // lock_not_available
                    | "57P01" // admin_shutdown
                    | "57P02" // crash_shutdown
                    | "57P03" // cannot_connect_now
                    | "53300" // too_many_connections
                    | "57014" // query_canceled (statement timeout)
                    // read_only_sql_transaction: a failover's demoted primary; pooled connections
                    // to it are replaced as they fail or age out (sqlx's idle and lifetime limits)
                    | "25006"
                    | "53100" // disk_full: held until an operator frees space, not failed for good
                )
        }
        _ => false,
    }
}

/// The Postgres store: a connection pool and the operations on it.
#[derive(Clone, Debug)]
pub struct Store {
    pool: PgPool,
    /// Work the store started on its own behalf that outlives the call that began it (the
    /// hand-back of an unanswered fetch), so a process stopping can let it finish
    /// ([`Store::settle_background`]).
    background: TaskTracker,
}

impl Store {
    /// Connects with a pool of up to `max_connections`.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        let pool = pool_options(max_connections).connect_with(connect_options(url)?).await?;
        Ok(Store { pool, background: TaskTracker::new() })
    }

    /// Like [`Store::connect`] but does not connect until first use, so a process can start
    /// while the database is still down and ride it out with storage retry.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        Ok(Store::lazy_with(connect_options(url)?, max_connections))
    }

    /// Like [`Store::connect_lazy`], and a statement on these connections that waits longer
    /// than `lock_timeout` for a lock (a row, a table) gives up (SQLSTATE 55P03, see
    /// [`StoreError::is_lock_timeout`]). For a process that answers requests: a statement
    /// stuck behind a lock somebody holds (an operator's open `psql` transaction, say) would
    /// otherwise keep its connection until the lock went, and requests repeated against it
    /// would take every connection the pool has. It overrides a `lock_timeout` set for the
    /// database or role.
    pub fn connect_lazy_bounded(url: &str, max_connections: u32, lock_timeout: Duration) -> Result<Store, StoreError> {
        let options = connect_options(url)?.options([("lock_timeout", format!("{}", lock_timeout.as_millis().max(1)))]);
        Ok(Store::lazy_with(options, max_connections))
    }

    fn lazy_with(options: PgConnectOptions, max_connections: u32) -> Store {
        Store { pool: pool_options(max_connections).connect_lazy_with(options), background: TaskTracker::new() }
    }

    /// Wraps an existing pool.
    pub fn from_pool(pool: PgPool) -> Store {
        Store { pool, background: TaskTracker::new() }
    }

    /// Waits up to `grace` for the work this store (and its clones) started in the background
    /// to finish; true if it all did. A process calls it on its way out, after its last
    /// requests: an unanswered fetch's hand-back cut off by the exit would leave its jobs to
    /// be charged an attempt when their locks lapse. Work started afterwards is still tracked.
    pub async fn settle_background(&self, grace: Duration) -> bool {
        self.background.close();
        let settled = tokio::time::timeout(grace, self.background.wait()).await.is_ok();
        self.background.reopen();
        settled
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// The migrations this build has that the database has not applied, oldest first, as
    /// `"<version> <description>"`: a binary newer than its database's schema, whose statements
    /// would fail. Empty when they are in step (or the database is ahead).
    pub async fn pending_migrations(&self) -> Result<Vec<String>, StoreError> {
        let tracked: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(&self.pool).await?;
        let applied: Vec<i64> =
            if tracked { sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success").fetch_all(&self.pool).await? } else { Vec::new() };
        Ok(MIGRATOR.iter().filter(|m| !m.migration_type.is_down_migration() && !applied.contains(&m.version)).map(|m| format!("{} {}", m.version, m.description)).collect())
    }

    /// What to tell an operator when [`Store::pending_migrations`] is not empty, for `binary`
    /// ("server", "worker").
    pub fn schema_behind(pending: &[String], binary: &str) -> String {
        format!(
            "the database's schema is {} migration(s) behind this {binary} (next: {}): run `rebound-server migrate`, or start the {binary} with --migrate",
            pending.len(),
            pending.first().map(String::as_str).unwrap_or("?")
        )
    }

    /// For a binary started while its database may still be down: asks every `retry` until
    /// the database answers, then returns [`Store::schema_behind`]'s message for `binary` if
    /// the schema is behind it, `None` if it is in step or `stop` fires first.
    pub async fn schema_behind_once_up(&self, binary: &str, retry: Duration, stop: &tokio_util::sync::CancellationToken) -> Option<String> {
        loop {
            if let Ok(pending) = self.pending_migrations().await {
                return (!pending.is_empty()).then(|| Store::schema_behind(&pending, binary));
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = tokio::time::sleep(retry) => {}
            }
        }
    }

    /// A job by id.
    pub async fn get_job(&self, id: Uuid) -> Result<Option<Job>, StoreError> {
        let row = sqlx::query("SELECT * FROM jobs WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(job_from_row).transpose().map_err(Into::into)
    }

    /// A job by id, or [`StoreError::NotFound`].
    pub async fn job(&self, id: Uuid) -> Result<Job, StoreError> {
        self.get_job(id).await?.ok_or(StoreError::NotFound(id))
    }

    /// Every execution of a job, oldest first (the completing one, kept in the job row, last).
    pub async fn attempts(&self, job_id: Uuid) -> Result<Vec<Attempt>, StoreError> {
        let rows = sqlx::query("SELECT * FROM job_history WHERE job_id = $1 ORDER BY id NULLS LAST")
            .bind(job_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(attempt_from_row).collect::<Result<_, _>>().map_err(Into::into)
    }

    /// Executions of many jobs at once, grouped by job id (for API listings without N+1 queries).
    pub async fn attempts_for(&self, job_ids: &[Uuid]) -> Result<Vec<Attempt>, StoreError> {
        let rows = sqlx::query("SELECT * FROM job_history WHERE job_id = ANY($1) ORDER BY job_id, id NULLS LAST")
            .bind(job_ids)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(attempt_from_row).collect::<Result<_, _>>().map_err(Into::into)
    }

    /// The database's clock. Decisions about due times use it, not the host's.
    pub async fn now(&self) -> Result<Timestamp, StoreError> {
        let row = sqlx::query("SELECT now() AS now").fetch_one(&self.pool).await?;
        ts(&row, "now")
    }

    /// Wipes every job, attempt, policy, queue setting, maintenance mode and audit entry. Used by the OJS
    /// conformance runner's reset endpoint, which exists only in the server's `--test-mode`.
    pub async fn reset_all(&self) -> Result<(), StoreError> {
        sqlx::query("TRUNCATE jobs, job_attempts, policy_snapshots, retry_policies, retry_policy_versions, queues, audit_log, workers, worker_events, cron_jobs, cron_runs, maintenance")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Why a write for `worker` (if named) of job `id` was refused: the job is gone
    /// ([`StoreError::NotFound`]), it is held by another worker, or it is not in a state the
    /// action applies to.
    pub(crate) async fn refusal(&self, id: Uuid, action: &'static str, worker: Option<&str>, run: NamedRun) -> StoreError {
        match self.get_job(id).await {
            Ok(Some(job)) if job.state == JobState::Active && worker.is_some_and(|w| job.locked_by.as_deref() != Some(w)) => {
                StoreError::NotHeld { id, action, worker: worker.unwrap_or_default().to_owned() }
            }
            Ok(Some(job)) if job.state == JobState::Active && !run.matches(job.attempt, job.started_at) => StoreError::RunEnded {
                id,
                action,
                attempt: job.attempt,
                started_at: job.started_at.map(|t| t.to_string()),
            },
            Ok(Some(job)) => StoreError::Conflict { id, state: job.state, action },
            Ok(None) => StoreError::NotFound(id),
            Err(e) => e,
        }
    }
}

/// The run of an active job that a result names: its attempt number and when it started, as
/// the claim that handed it out said. Attempt numbers repeat (a release or a snooze gives one
/// back), so the start is what tells a run from the next claim of the same attempt; a result
/// sent again after its first answer was lost must not land on that next claim. Unset parts
/// are not checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamedRun {
    pub attempt: Option<i32>,
    pub started_at: Option<jiff::Timestamp>,
}

impl NamedRun {
    /// The run `job` stands at, as its claim (or its last write) left it.
    pub fn of(job: &Job) -> NamedRun {
        NamedRun { attempt: Some(job.attempt), started_at: job.started_at }
    }

    /// Whether a job at `attempt`, started at `started_at`, is this run. Compared in
    /// microseconds, as Postgres stores times.
    pub fn matches(&self, attempt: i32, started_at: Option<jiff::Timestamp>) -> bool {
        self.attempt.is_none_or(|a| a == attempt)
            && self.started_at.is_none_or(|s| started_at.map(|t| t.as_microsecond()) == Some(s.as_microsecond()))
    }

    /// The start as the write statements take it: microseconds since the epoch.
    pub(crate) fn started_us(&self) -> Option<i64> {
        self.started_at.map(|t| t.as_microsecond())
    }
}

/// How long Postgres lets a session sit idle inside a transaction before ending it. Rebound
/// never leaves a transaction idle for more than a round trip; a session idle in one for
/// longer has been abandoned (see [`transaction`]) and holds row locks nobody else can take.
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a session running a statement checks that its client is still connected.
pub const CLIENT_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Connection settings every Rebound process uses. `application_name` defaults to the
/// program's name so operators can tell workers from servers in `pg_stat_activity`; a URL
/// that sets its own wins.
///
/// JIT compilation is off: every statement Rebound runs is bounded by an index and takes
/// milliseconds, but at 10M jobs the planner's estimates for some (a dead-letter search over
/// its window, say) pass `jit_above_cost`, and compiling then took 20 ms of a 6 ms query,
/// putting those dashboard pages over their 100 ms budget.
///
/// Parallel plans are off too. Postgres picked them for the same bounded searches, and a page
/// runs its list and its counts side by side: on 2 cores, two statements with two workers each
/// made the dead-letter searches at 10M jobs take 55–70 ms per request against 31–38 ms
/// without workers (alternating runs of the same server; other pages unchanged).
pub fn connect_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    let mut options: PgConnectOptions = url.parse()?;
    if options.get_application_name().is_none() {
        let program = std::env::current_exe().ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        options = options.application_name(program.as_deref().unwrap_or("rebound"));
    }
    let idle_ms = IDLE_IN_TRANSACTION_TIMEOUT.as_millis();
    Ok(options.options([
        ("idle_in_transaction_session_timeout", format!("{idle_ms}")),
        ("jit", "off".to_string()),
        ("max_parallel_workers_per_gather", "0".to_string()),
        // A statement abandoned while it waits for a lock (a maintenance pass cut off at its
        // stop grace, a request whose process died) would otherwise keep waiting, holding the
        // locks it took, until it got the one it wanted: Postgres only reads the closed
        // socket then, and the idle-in-transaction limit does not apply to a waiting session.
        // Checked every few seconds, it ends with its client. (Postgres 14 or later, Linux.)
        ("client_connection_check_interval", format!("{}", CLIENT_CHECK_INTERVAL.as_millis())),
    ]))
}

fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new().max_connections(max_connections).acquire_timeout(Duration::from_secs(10))
}

/// Reads a non-null timestamptz column.
pub(crate) fn ts(row: &PgRow, col: &str) -> Result<Timestamp, StoreError> {
    Ok(row.try_get::<StoredTime, _>(col)?.0)
}

/// Reads a nullable timestamptz column.
pub(crate) fn ts_opt(row: &PgRow, col: &str) -> Result<Option<Timestamp>, sqlx::Error> {
    Ok(row.try_get::<Option<StoredTime>, _>(col)?.map(|t| t.0))
}

/// Milliseconds for binding into SQL as an interval multiplier, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn job_from_row(row: &PgRow) -> Result<Job, sqlx::Error> {
    JobColumns::locate(row)?.job(row)
}

/// Where each of a job's columns sits in a result. Found once per result: looking every column
/// up by name in every row hashes 31 names per job, which shows up when a worker claims and
/// decodes thousands of jobs a second.
struct JobColumns {
    id: usize,
    job_type: usize,
    queue: usize,
    args: usize,
    meta: usize,
    extra: usize,
    priority: usize,
    tags: usize,
    state: usize,
    attempt: usize,
    max_attempts: usize,
    retry: usize,
    timeout_ms: usize,
    visibility_timeout_ms: usize,
    unique_key: usize,
    scheduled_at: usize,
    expires_at: usize,
    created_at: usize,
    enqueued_at: usize,
    started_at: usize,
    completed_at: usize,
    cancelled_at: usize,
    discarded_at: usize,
    locked_by: usize,
    lock_expires_at: usize,
    dead_letter: usize,
    dead_lettered_at: usize,
    result: usize,
    last_error: usize,
    retry_delay_ms: usize,
    updated_at: usize,
    // Located leniently: a result that leaves them out reads an unkeyed job.
    rate_limit_key: Option<usize>,
    rate_limited: Option<usize>,
    on_limit: Option<usize>,
}

impl JobColumns {
    fn locate(row: &PgRow) -> Result<JobColumns, sqlx::Error> {
        Ok(JobColumns {
            id: "id".index(row)?,
            job_type: "type".index(row)?,
            queue: "queue".index(row)?,
            args: "args".index(row)?,
            meta: "meta".index(row)?,
            extra: "extra".index(row)?,
            priority: "priority".index(row)?,
            tags: "tags".index(row)?,
            state: "state".index(row)?,
            attempt: "attempt".index(row)?,
            max_attempts: "max_attempts".index(row)?,
            retry: "retry".index(row)?,
            timeout_ms: "timeout_ms".index(row)?,
            visibility_timeout_ms: "visibility_timeout_ms".index(row)?,
            unique_key: "unique_key".index(row)?,
            scheduled_at: "scheduled_at".index(row)?,
            expires_at: "expires_at".index(row)?,
            created_at: "created_at".index(row)?,
            enqueued_at: "enqueued_at".index(row)?,
            started_at: "started_at".index(row)?,
            completed_at: "completed_at".index(row)?,
            cancelled_at: "cancelled_at".index(row)?,
            discarded_at: "discarded_at".index(row)?,
            locked_by: "locked_by".index(row)?,
            lock_expires_at: "lock_expires_at".index(row)?,
            dead_letter: "dead_letter".index(row)?,
            dead_lettered_at: "dead_lettered_at".index(row)?,
            result: "result".index(row)?,
            last_error: "last_error".index(row)?,
            retry_delay_ms: "retry_delay_ms".index(row)?,
            updated_at: "updated_at".index(row)?,
            rate_limit_key: "rate_limit_key".index(row).ok(),
            rate_limited: "rate_limited".index(row).ok(),
            on_limit: "rate_limit_on_limit".index(row).ok(),
        })
    }

    fn job(&self, row: &PgRow) -> Result<Job, sqlx::Error> {
        Ok(Job {
            id: row.try_get(self.id)?,
            job_type: row.try_get(self.job_type)?,
            queue: row.try_get(self.queue)?,
            args: row.try_get::<StoredJson, _>(self.args)?.0,
            meta: row.try_get::<StoredJson, _>(self.meta)?.0,
            extra: row.try_get::<StoredJson, _>(self.extra)?.0,
            priority: row.try_get(self.priority)?,
            tags: row.try_get(self.tags)?,
            state: row.try_get(self.state)?,
            attempt: row.try_get(self.attempt)?,
            max_attempts: row.try_get(self.max_attempts)?,
            retry: row.try_get::<Option<StoredJson>, _>(self.retry)?.map(|j| j.0),
            timeout_ms: row.try_get(self.timeout_ms)?,
            visibility_timeout_ms: row.try_get(self.visibility_timeout_ms)?,
            unique_key: row.try_get(self.unique_key)?,
            scheduled_at: row.try_get::<StoredTime, _>(self.scheduled_at)?.0,
            expires_at: row.try_get::<Option<StoredTime>, _>(self.expires_at)?.map(|t| t.0),
            created_at: row.try_get::<StoredTime, _>(self.created_at)?.0,
            enqueued_at: row.try_get::<Option<StoredTime>, _>(self.enqueued_at)?.map(|t| t.0),
            started_at: row.try_get::<Option<StoredTime>, _>(self.started_at)?.map(|t| t.0),
            completed_at: row.try_get::<Option<StoredTime>, _>(self.completed_at)?.map(|t| t.0),
            cancelled_at: row.try_get::<Option<StoredTime>, _>(self.cancelled_at)?.map(|t| t.0),
            discarded_at: row.try_get::<Option<StoredTime>, _>(self.discarded_at)?.map(|t| t.0),
            locked_by: row.try_get(self.locked_by)?,
            lock_expires_at: row.try_get::<Option<StoredTime>, _>(self.lock_expires_at)?.map(|t| t.0),
            dead_letter: row.try_get(self.dead_letter)?,
            dead_lettered_at: row.try_get::<Option<StoredTime>, _>(self.dead_lettered_at)?.map(|t| t.0),
            result: row.try_get::<Option<StoredJson>, _>(self.result)?.map(|j| j.0),
            last_error: row.try_get::<Option<StoredJson>, _>(self.last_error)?.map(|j| j.0),
            retry_delay_ms: row.try_get(self.retry_delay_ms)?,
            updated_at: row.try_get::<StoredTime, _>(self.updated_at)?.0,
            rate_limit_key: match self.rate_limit_key {
                Some(i) => row.try_get(i)?,
                None => None,
            },
            rate_limited: match self.rate_limited {
                Some(i) => row.try_get(i)?,
                None => false,
            },
            // A value this version does not know (a later one's) reads as the default.
            on_limit: match self.on_limit {
                Some(i) => row.try_get::<Option<&str>, _>(i)?.and_then(OnLimit::parse).unwrap_or_default(),
                None => OnLimit::Wait,
            },
        })
    }
}

pub(crate) fn attempt_from_row(row: &PgRow) -> Result<Attempt, sqlx::Error> {
    Ok(Attempt {
        id: row.try_get("id")?,
        job_id: row.try_get("job_id")?,
        attempt: row.try_get("attempt")?,
        worker_id: row.try_get("worker_id")?,
        started_at: ts_opt(row, "started_at")?,
        finished_at: row.try_get::<StoredTime, _>("finished_at")?.0,
        outcome: row.try_get("outcome")?,
        error_type: row.try_get("error_type")?,
        error_code: row.try_get("error_code")?,
        error_message: row.try_get("error_message")?,
        error_details: row.try_get::<Option<StoredJson>, _>("error_details")?.map(|j| j.0),
        delay_ms: row.try_get("delay_ms")?,
        next_run_at: ts_opt(row, "next_run_at")?,
        policy: row.try_get::<Option<StoredJson>, _>("policy")?.map(|j| j.0),
    })
}

pub(crate) fn jobs_from_rows(rows: &[PgRow]) -> Result<Vec<Job>, StoreError> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let columns = JobColumns::locate(first)?;
    rows.iter().map(|row| columns.job(row)).collect::<Result<_, _>>().map_err(Into::into)
}
