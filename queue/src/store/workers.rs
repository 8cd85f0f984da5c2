//! The registry of worker processes and their heartbeats.

use jiff::Timestamp;
use serde::Serialize;
use sqlx::Row;
use uuid::Uuid;

use super::complete::{ORPHAN_REASON, release_ctes};
use super::{Store, StoreError, ts};

/// How a worker is doing, as it reports with every heartbeat (a `/readyz` in the database).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerStatus {
    /// Claiming and writing results normally.
    Ready,
    /// Up, but claims or result writes are failing (the detail says which).
    Degraded,
    /// Claiming nothing more (SIGTSTP, or an operator's `quiet`); running jobs finish and the
    /// process stays up until it is stopped.
    Quiet,
    /// Draining after a shutdown signal: no new claims.
    Stopping,
}

impl WorkerStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerStatus::Ready => "ready",
            WorkerStatus::Degraded => "degraded",
            WorkerStatus::Quiet => "quiet",
            WorkerStatus::Stopping => "stopping",
        }
    }

    fn parse(s: &str) -> WorkerStatus {
        match s {
            "degraded" => WorkerStatus::Degraded,
            "quiet" => WorkerStatus::Quiet,
            "stopping" => WorkerStatus::Stopping,
            _ => WorkerStatus::Ready,
        }
    }
}

/// What a worker process uses, as its heartbeat reports it (the OJS `worker.heartbeat` event's
/// `memory_mb` and `cpu_percent`). Either is `None` when it could not be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ProcessUsage {
    /// Resident memory, in MiB.
    pub memory_mb: Option<f64>,
    /// CPU time used since the previous heartbeat over the wall time since then, in percent of
    /// one core (above 100 when it used several, as `top` counts it).
    pub cpu_percent: Option<f64>,
}

impl ProcessUsage {
    /// Keeps only values a worker could report: finite and not negative.
    pub fn sane(self) -> ProcessUsage {
        let ok = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0);
        ProcessUsage { memory_mb: ok(self.memory_mb), cpu_percent: ok(self.cpu_percent) }
    }
}

/// One heartbeat of a worker process (see [`Store::worker_beat`]).
#[derive(Clone, Debug)]
pub struct WorkerBeat<'a> {
    pub worker_id: &'a str,
    /// The jobs whose locks to extend: every job the worker runs or has a result of to write.
    pub held: &'a [Uuid],
    /// Every job the worker knows it claimed and has not settled: `held`, plus any it no
    /// longer extends but must not be handed back uncounted (a result the database refused).
    pub known: &'a [Uuid],
    pub running: i32,
    pub status: WorkerStatus,
    pub detail: Option<&'a str>,
    pub usage: ProcessUsage,
}

/// What a heartbeat did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BeatReport {
    /// The held jobs whose locks were extended. A held job missing here and from `busy` is
    /// no longer ours.
    pub extended: Vec<Uuid>,
    /// Held jobs still ours whose rows another transaction was writing at that moment (almost
    /// always this worker's own result write in flight), so they were left alone rather than
    /// waited for. Their locks are extended by a later heartbeat if that write does not land.
    pub busy: Vec<Uuid>,
    /// Jobs locked under this worker that it does not know, handed back uncounted.
    pub released: Vec<Uuid>,
    /// False if the worker has no row (pruned, or deleted by hand): register again.
    pub registered: bool,
    /// What an operator asked of this worker ([`Store::request_worker_state`]): `quiet` (claim
    /// nothing more) or `terminate` (shut down gracefully).
    pub directive: Option<String>,
}

// What a heartbeat's `beat` CTE (the worker's row, updated or upserted) returns, and the CTE
// `beat_logged` that logs it as an OJS `worker.heartbeat` event (see
// migrations/…_worker_liveness_events.sql): written by the beat itself, so a lost beat
// leaves no event and a committed one always has one.
macro_rules! beat_returning {
    () => {
        "id, running, queues, concurrency, status, requested_state, memory_mb, cpu_percent"
    };
}
macro_rules! beat_logged {
    () => {
        "beat_logged AS (
    INSERT INTO worker_events (worker_id, type, data)
    SELECT id, 'worker.heartbeat', jsonb_build_object('worker_id', id, 'active_jobs', running, 'queues', to_jsonb(queues),
                                                       'concurrency', concurrency, 'status', status)
           || jsonb_strip_nulls(jsonb_build_object('memory_mb', memory_mb, 'cpu_percent', cpu_percent))
    FROM beat
)"
    };
}

// One statement, so a worker's row is never fresher than its jobs' locks, and a lost claim's
// jobs are handed back by the next heartbeat after their lock lapses even if the worker never
// noticed the claim fail: the rescuer, which must count the attempt, is never their only way
// back. The two updates of `jobs` touch disjoint rows (held / not known). As in
// `Store::release_orphans`, only jobs claimed since the worker's registration are handed back:
// a process reusing a crashed predecessor's id leaves that one's runs to the rescuer.
//
// The held jobs include those whose results the worker is writing at that very moment, in
// batches that lock their rows in their own order. A heartbeat that waited for those rows
// deadlocked with the result writes under load: Postgres broke the cycle only after
// `deadlock_timeout` (1 s), with both statements stalled. So it never waits: a held row
// locked by someone else is reported `busy` (still ours by this statement's snapshot) and
// extended next time if it is still active then; a job cancelled by that other write is
// noticed as lost one heartbeat later.
const BEAT: &str = concat!(
    held_ctes!("locked_by = $2", "COALESCE(visibility_timeout_ms, 30000)"),
    ", ",
    release_ctes!(
        "j.locked_by = $2 AND NOT (j.id = ANY($3)) AND j.lock_expires_at <= now()
       AND j.started_at >= COALESCE((SELECT w.started_at FROM workers w WHERE w.id = $2), '-infinity')",
        "$7",
        "j.id, j.attempt, j.started_at, j.queue"
    ),
    ", beat AS (
    UPDATE workers
    SET last_heartbeat_at = now(), running = $4, stopping = ($5 = 'stopping'), status = $5, status_detail = $6,
        status_since = CASE WHEN status = $5 THEN status_since ELSE now() END,
        memory_mb = $8, cpu_percent = $9
    WHERE id = $2
    RETURNING ", beat_returning!(), "
), ", beat_logged!(), "
SELECT 'extended' AS what, id, NULL::text AS directive FROM extended
UNION ALL SELECT 'busy', id, NULL FROM busy
UNION ALL SELECT 'released', id, NULL FROM released WHERE (SELECT count(*) FROM woken) >= 0
UNION ALL SELECT 'registered', NULL::uuid, requested_state FROM beat"
);

/// What a worker says about itself when it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRegistration {
    pub id: String,
    pub host: String,
    pub pid: i32,
    pub queues: Vec<String>,
    pub concurrency: i32,
    pub version: String,
}

/// A registered worker.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerInfo {
    pub id: String,
    pub host: String,
    pub pid: i32,
    pub queues: Vec<String>,
    pub concurrency: i32,
    pub version: String,
    pub running: i32,
    pub started_at: Timestamp,
    pub last_heartbeat_at: Timestamp,
    pub stopping: bool,
    pub status: WorkerStatus,
    pub status_detail: Option<String>,
    pub status_since: Timestamp,
    /// Seconds since the last heartbeat, by the database's clock.
    pub silent_for_secs: f64,
    /// What an operator asked of it (`quiet`, `terminate`), heard at its next heartbeat.
    pub requested_state: Option<String>,
    /// What its latest heartbeat said it uses.
    pub usage: ProcessUsage,
}

impl Store {
    /// Registers (or re-registers) a worker. Its `started_at` is now: only the jobs it claims
    /// from now on can be handed back as its orphans (see [`Store::release_orphans`]), which
    /// matters when a process reuses the id of one that crashed.
    pub async fn register_worker(&self, w: &WorkerRegistration) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO workers (id, host, pid, queues, concurrency, version, started_at, last_heartbeat_at)
             VALUES ($1, $2, $3, $4, $5, $6, now(), now())
             ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues, started_at = now(),
                 concurrency = EXCLUDED.concurrency, version = EXCLUDED.version, last_heartbeat_at = now(), stopping = false,
                 status = 'ready', status_detail = NULL, status_since = now(), memory_mb = NULL, cpu_percent = NULL",
        )
        .bind(&w.id)
        .bind(&w.host)
        .bind(w.pid)
        .bind(&w.queues)
        .bind(w.concurrency)
        .bind(&w.version)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A worker process's heartbeat, in one statement: extends the locks of the jobs it holds,
    /// hands back (uncounted) the lapsed jobs locked under its id that it does not know, and
    /// records its own heartbeat and status. It never waits for a held job's row that another
    /// transaction is writing (see [`BeatReport::busy`]).
    pub async fn worker_beat(&self, beat: &WorkerBeat<'_>) -> Result<BeatReport, StoreError> {
        let usage = beat.usage.sane();
        let rows = sqlx::query(BEAT)
            .bind(beat.held)
            .bind(beat.worker_id)
            .bind(beat.known)
            .bind(beat.running)
            .bind(beat.status.as_str())
            .bind(beat.detail)
            .bind(ORPHAN_REASON)
            .bind(usage.memory_mb)
            .bind(usage.cpu_percent)
            .fetch_all(&self.pool)
            .await?;
        let mut report = BeatReport::default();
        for row in rows {
            let what: &str = row.try_get("what")?;
            match (what, row.try_get::<Option<Uuid>, _>("id")?) {
                ("extended", Some(id)) => report.extended.push(id),
                ("busy", Some(id)) => report.busy.push(id),
                ("released", Some(id)) => report.released.push(id),
                ("registered", _) => {
                    report.registered = true;
                    report.directive = row.try_get("directive")?;
                }
                _ => {}
            }
        }
        Ok(report)
    }

    /// An OJS API worker's heartbeat (`POST /ojs/v1/workers/heartbeat`): registers the worker
    /// if it is new, records its beat, how many jobs it runs and whether it is draining
    /// (`stopping`), logs the `worker.heartbeat` event, and answers what an operator asked of
    /// it ([`Store::request_worker_state`]). One statement; the job locks are extended apart
    /// ([`Store::heartbeat`]), as the protocol allows beats from any holder. `usage` is what
    /// the client said of itself, if anything.
    pub async fn ojs_worker_beat(&self, id: &str, running: i32, stopping: bool, usage: ProcessUsage) -> Result<Option<String>, StoreError> {
        let unsaid = WorkerRegistration { id: id.to_owned(), host: String::new(), pid: 0, queues: Vec::new(), concurrency: 0, version: String::new() };
        self.ojs_worker_beat_as(&unsaid, running, stopping, usage).await
    }

    /// [`Store::ojs_worker_beat`] from a client that said what it is (worker protocol §4.2:
    /// `hostname`, `pid`, `queues`, `concurrency`), for the worker list and the
    /// `worker.heartbeat` event. A field left empty or zero was not said: the row keeps what an
    /// earlier beat said, or at the first beat host `ojs-http` and pid 0. `version` is not
    /// read: an OJS client is `ojs/1.0`. The caller bounds the values.
    pub async fn ojs_worker_beat_as(&self, who: &WorkerRegistration, running: i32, stopping: bool, usage: ProcessUsage) -> Result<Option<String>, StoreError> {
        let usage = usage.sane();
        let status = if stopping { WorkerStatus::Stopping } else { WorkerStatus::Ready };
        let requested: Option<Option<String>> = sqlx::query_scalar(concat!(
            "WITH beat AS (
    INSERT INTO workers AS w (id, host, pid, version, running, stopping, status, memory_mb, cpu_percent, queues, concurrency)
    VALUES ($1, COALESCE(NULLIF($6, ''), 'ojs-http'), $7, 'ojs/1.0', $2, $3 = 'stopping', $3, $4, $5, $8, $9)
    ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = now(), running = EXCLUDED.running, stopping = EXCLUDED.stopping,
        status = EXCLUDED.status, status_detail = NULL, memory_mb = EXCLUDED.memory_mb, cpu_percent = EXCLUDED.cpu_percent,
        status_since = CASE WHEN w.status = EXCLUDED.status THEN w.status_since ELSE now() END,
        host = CASE WHEN $6 = '' THEN w.host ELSE EXCLUDED.host END,
        pid = CASE WHEN $7 = 0 THEN w.pid ELSE EXCLUDED.pid END,
        queues = CASE WHEN cardinality($8::text[]) = 0 THEN w.queues ELSE EXCLUDED.queues END,
        concurrency = CASE WHEN $9 = 0 THEN w.concurrency ELSE EXCLUDED.concurrency END
    RETURNING ",
            beat_returning!(),
            "
), ",
            beat_logged!(),
            "
SELECT requested_state FROM beat"
        ))
        .bind(&who.id)
        .bind(running)
        .bind(status.as_str())
        .bind(usage.memory_mb)
        .bind(usage.cpu_percent)
        .bind(&who.host)
        .bind(who.pid)
        .bind(&who.queues)
        .bind(who.concurrency)
        .fetch_optional(&self.pool)
        .await?;
        Ok(requested.flatten())
    }

    /// Removes a worker that stopped cleanly.
    pub async fn deregister_worker(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM workers WHERE id = $1").bind(id).execute(&self.pool).await?;
        Ok(())
    }

    /// Every registered worker, most recently heard from first.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>, StoreError> {
        let rows = sqlx::query(
            "SELECT *, EXTRACT(EPOCH FROM (now() - last_heartbeat_at))::float8 AS silent_for_secs
             FROM workers ORDER BY last_heartbeat_at DESC, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(WorkerInfo {
                    id: r.try_get("id")?,
                    host: r.try_get("host")?,
                    pid: r.try_get("pid")?,
                    queues: r.try_get("queues")?,
                    concurrency: r.try_get("concurrency")?,
                    version: r.try_get("version")?,
                    running: r.try_get("running")?,
                    started_at: ts(r, "started_at")?,
                    last_heartbeat_at: ts(r, "last_heartbeat_at")?,
                    stopping: r.try_get("stopping")?,
                    status: WorkerStatus::parse(r.try_get("status")?),
                    status_detail: r.try_get("status_detail")?,
                    status_since: ts(r, "status_since")?,
                    silent_for_secs: r.try_get("silent_for_secs")?,
                    requested_state: r.try_get("requested_state")?,
                    usage: ProcessUsage { memory_mb: r.try_get("memory_mb")?, cpu_percent: r.try_get("cpu_percent")? },
                })
            })
            .collect()
    }
}
