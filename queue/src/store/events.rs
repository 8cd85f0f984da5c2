//! Job events, read back from what the store already records: `jobs.created_at` (enqueued),
//! `job_attempts` (failed, retrying, discarded, dead-lettered, released, snoozed) and
//! `job_transitions` (started, completed, cancelled, expired, scheduled: one row per statement,
//! queue and transition, written by a trigger; see its migrations) and `job_heartbeats`
//! (heartbeat: one row per heartbeat statement, queue and holder) and `job_progress`
//! (progress: a row per report). Events from every process
//! (server, workers) appear alike.

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{Postgres, Row};
use uuid::Uuid;

use super::{Store, StoreError, ts, ts_opt};

/// Every event type [`Store::events`] knows.
pub const EVENT_TYPES: [&str; 16] = [
    "job.enqueued",
    "job.scheduled",
    "job.started",
    "job.heartbeat",
    "job.progress",
    "job.completed",
    "job.failed",
    "job.retrying",
    "job.discarded",
    "job.dead_lettered",
    "job.expired",
    "job.released",
    "job.snoozed",
    "job.cancelled",
    "job.timeout",
    "job.stalled",
];

/// Which events. Empty lists match everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventFilter {
    /// Event types from [`EVENT_TYPES`] (or, for [`Store::cron_events`], from
    /// `CRON_EVENT_TYPES`); unknown names match nothing.
    pub types: Vec<String>,
    pub queues: Vec<String>,
    /// Job types (OJS `job_types`).
    pub job_types: Vec<String>,
    pub job_id: Option<Uuid>,
    /// Only events at or after this time.
    pub since: Option<Timestamp>,
    /// Only events after this one: an event id ([`JobEvent::id`]) or a position from
    /// [`Store::event_position`]. With it, events come oldest first; without it, newest first.
    pub after: Option<String>,
    /// Only events positioned before this time: with `after`, the settled horizon
    /// ([`Store::event_position`]) so that a cursor never passes an event still being written.
    pub until: Option<Timestamp>,
    /// At most this many (1..=10 000).
    pub limit: i64,
}

/// Something that happened to a job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobEvent {
    /// Unique and stable, and a cursor: ids sort (bytewise) in the order events are delivered
    /// to `after`, as `evt_<position in µs since the epoch, 16 digits>:<type>:<job>:<attempt>`.
    /// The position is the event's time, except for `job.enqueued`, whose position is the
    /// time in its UUIDv7 (the jobs are read in id order).
    pub id: String,
    /// One of [`EVENT_TYPES`].
    pub event_type: String,
    pub at: Timestamp,
    pub job_id: Uuid,
    pub job_type: String,
    pub queue: String,
    /// The attempt the event concerns (attempt events only).
    pub attempt: Option<i32>,
    /// How long the attempt ran (attempt events only).
    pub duration_ms: Option<i64>,
    /// `{type, code, message, retryable}` of a failed attempt; the job's `last_error` when it
    /// expired.
    pub error: Option<Value>,
    pub worker_id: Option<String>,
    /// When the retry is due (`job.retrying`).
    pub next_retry_at: Option<Timestamp>,
    /// The job's `max_attempts` (`job.retrying`).
    pub max_attempts: Option<i32>,
    /// When it is due to run (`job.scheduled`).
    pub scheduled_at: Option<Timestamp>,
    /// The new deadline of the job's lock (`job.heartbeat`).
    pub visible_until: Option<Timestamp>,
    /// 0 to 100 (`job.progress`).
    pub progress_percent: Option<f64>,
    /// What the handler said with it (`job.progress`).
    pub progress_message: Option<String>,
    /// The job's trace id, from its `meta` (`trace_id`, or a W3C `traceparent`), on every
    /// event of a traced job.
    pub trace_id: Option<String>,
}

/// How long an event is held back from cursors (`after`) at least. Events are positioned by
/// times taken before they commit: a transaction's start (`now()`), and for failures retried
/// in place the worker's clock when the attempt ended, written with the next result a moment
/// later. A cursor that ran up to the present could pass an event committed just after.
pub const EVENT_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// The position of `at`: before every event at that microsecond. Ids are compared as bytes.
pub fn position_at(at: Timestamp) -> String {
    format!("evt_{:016}:", at.as_microsecond())
}

/// The time of a position or event id (the microsecond after `evt_`).
pub fn position_time(cursor: &str) -> Result<Timestamp, StoreError> {
    let bad = || StoreError::invalid("after", format!("{cursor:?} is not an event id (evt_<16 digits>:…)"));
    let digits = cursor.strip_prefix("evt_").and_then(|r| r.get(..16)).ok_or_else(bad)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) || cursor.as_bytes().get(20) != Some(&b':') || cursor.len() > 400 {
        return Err(bad());
    }
    let micros: i64 = digits.parse().map_err(|_| bad())?;
    Timestamp::from_microsecond(micros).map_err(|_| bad())
}

// The trace id of job `j` (ojs-events §8.1: every event of a traced job carries it): its
// `meta.trace_id`, or else the trace-id part of its W3C `meta.traceparent`.
macro_rules! trace_id {
    () => {
        "COALESCE(j.meta->>'trace_id', NULLIF(split_part(j.meta->>'traceparent', '-', 2), ''))"
    };
}

// The position of a failed attempt's event (`e0`, see `events_sql!`): its finish, the events
// after `job.failed` a microsecond apart in order, a timeout's or a stall's a microsecond before.
macro_rules! attempt_event_at {
    () => {
        "(e0.at + (CASE WHEN e0.type IN ('job.timeout', 'job.stalled') THEN -1 ELSE e0.n - 1 END) * interval '1 microsecond')"
    };
}

// An event's id from its position (a timestamptz expression) and the rest of its key.
macro_rules! evid {
    ($at:expr, $($rest:literal),+) => {
        concat!("('evt_' || lpad(((extract(epoch FROM ", $at, ") * 1000000)::bigint)::text, 16, '0') || ':' || ", $($rest),+, ") COLLATE \"C\"")
    };
}

// The jobs that made transition `$state` (event `$event`) by the log, at most `limit` in the
// given order, over all queues or per asked-for queue, as (at, state, job_id, attempt,
// worker_id); for one job (`$3`), `$one_job` reads the same from its rows (the log is not
// searchable by job): a job's starts are then its executions' (in-place retries' too, which
// the log, written by claims, lacks), its scheduling, cancellations and expiries the log rows
// of its lifetime (a scheduling is its insert's, or a workflow's release of it later; the
// minutes as for heartbeats, below). Without a job (`$3` null) they look up a key no job has: compared with null,
// the planner saw a filter it could not index and planned a parallel scan, whose workers were
// started (200 ms each) although the branch never ran. Before the jobs are
// joined the id lacks its attempt: a job makes a transition once per row of the log, so that
// prefix orders it among ids alike.
macro_rules! logged {
    ($state:literal, $event:literal, $order:literal, $one_job:expr) => {
        concat!(
            "(SELECT l.at, l.state, u.job_id, u.attempt, l.worker_id
      FROM job_transitions l CROSS JOIN LATERAL unnest(l.job_ids, l.attempts) AS u(job_id, attempt)
      WHERE (cardinality($1::text[]) = 0 OR '", $event, "' = ANY($1)) AND cardinality($2::text[]) = 0 AND $3::uuid IS NULL
        AND l.state = '", $state, "' AND ($4::timestamptz IS NULL OR l.at >= $4::timestamptz)
        AND ($8::timestamptz IS NULL OR l.at < $8::timestamptz)
        AND ($7::text IS NULL OR ", evid!("l.at", "'", $event, ":' || u.job_id"), " > $7)
        AND (cardinality($6::text[]) = 0 OR EXISTS (SELECT 1 FROM jobs t WHERE t.id = u.job_id AND t.type = ANY($6)))
      ORDER BY ", $order, " LIMIT $5)
     UNION ALL
     (SELECT x.at, x.state, x.job_id, x.attempt, x.worker_id
      FROM (SELECT DISTINCT name FROM unnest($2::text[]) AS n(name)) q
      CROSS JOIN LATERAL (
          SELECT l.at, l.state, u.job_id, u.attempt, l.worker_id
          FROM job_transitions l CROSS JOIN LATERAL unnest(l.job_ids, l.attempts) AS u(job_id, attempt)
          WHERE l.queue = q.name AND l.state = '", $state, "' AND ($4::timestamptz IS NULL OR l.at >= $4::timestamptz)
            AND ($8::timestamptz IS NULL OR l.at < $8::timestamptz)
            AND ($7::text IS NULL OR ", evid!("l.at", "'", $event, ":' || u.job_id"), " > $7)
            AND (cardinality($6::text[]) = 0 OR EXISTS (SELECT 1 FROM jobs t WHERE t.id = u.job_id AND t.type = ANY($6)))
          ORDER BY ", $order, " LIMIT $5) x
      WHERE (cardinality($1::text[]) = 0 OR '", $event, "' = ANY($1)) AND $3::uuid IS NULL)
     UNION ALL
     (SELECT o.at, '", $state, "'::job_state, o.job_id, o.attempt, o.worker_id FROM (", $one_job, ") o
      WHERE (cardinality($1::text[]) = 0 OR '", $event, "' = ANY($1)) AND $3::uuid IS NOT NULL)"
        )
    };
}


// One job's rows of the log of transitions into `$state` in its lifetime (for `logged!`): from
// its creation to its last write, with minutes' slack for a write that began before another
// reached its row (as for heartbeats, below).
macro_rules! in_its_lifetime {
    ($state:literal) => {
        concat!(
            "SELECT l.at, j.id AS job_id, NULL::int AS attempt, NULL::text AS worker_id
          FROM jobs j JOIN job_transitions l ON l.state = '", $state, "' AND l.queue = j.queue
           AND l.at >= j.created_at AND l.at <= j.updated_at + interval '5 minutes'
          WHERE j.id = COALESCE($3::uuid, '00000000-0000-0000-0000-000000000000') AND j.id = ANY(l.job_ids)"
        )
    };
}

// Each branch takes its own first `limit` rows in the order asked for through an index, so
// the merge stays cheap; a branch whose type is not asked for is cut by a one-time filter.
// Newest first (no cursor) each branch reads its own index order; oldest first (`after`,
// `$7`) every branch's order agrees with the ids', which the merge and the cursor use: a
// branch cut at `limit` never leaves out an event that sorts before one it returned.
//
// A failed attempt is two events, `job.failed` and what followed (`job.retrying`,
// `job.discarded`, `job.dead_lettered`), the second positioned a microsecond later so that
// ids keep them in that order; a timeout or a stall adds a third, a microsecond before both.
macro_rules! events_sql {
    ($enqueued_order:literal, $attempts_order:literal, $logged_order:literal, $progress_order:literal, $order:literal) => {
        concat!(
            "
SELECT * FROM (
    (SELECT ('evt_' || lpad((('x' || left(replace(j.id::text, '-', ''), 12))::bit(48)::bigint * 1000)::text, 16, '0')
             || ':job.enqueued:' || j.id || ':0') COLLATE \"C\" AS id,
            'job.enqueued'::text AS type, j.created_at AS at, j.id AS job_id, j.type AS job_type, j.queue,
            NULL::int AS attempt, NULL::bigint AS duration_ms, NULL::jsonb AS error, NULL::text AS worker_id,
            NULL::timestamptz AS next_retry_at, NULL::int AS max_attempts, NULL::timestamptz AS scheduled_at,
            NULL::timestamptz AS visible_until, NULL::float8 AS progress_percent, NULL::text AS progress_message,
            ", trace_id!(), " AS trace_id
     FROM jobs j
     WHERE (cardinality($1::text[]) = 0 OR 'job.enqueued' = ANY($1))
       AND (cardinality($2::text[]) = 0 OR j.queue = ANY($2))
       AND (cardinality($6::text[]) = 0 OR j.type = ANY($6))
       AND ($3::uuid IS NULL OR j.id = $3)
       -- A cursor goes by the id's time alone (see `JobEvent::id`).
       AND ($7::text IS NOT NULL OR $4::timestamptz IS NULL OR j.created_at >= $4::timestamptz)
       -- Ids are UUIDv7 (client-chosen ones too), so this bounds the walk to the jobs made
       -- since then instead of every job older than the last one that qualifies.
       AND ($4::timestamptz IS NULL OR j.id >= rebound_id_floor($4::timestamptz))
       AND ($8::timestamptz IS NULL OR j.id < rebound_id_floor($8::timestamptz))
       AND ($7::text IS NULL OR ('evt_' || lpad((('x' || left(replace(j.id::text, '-', ''), 12))::bit(48)::bigint * 1000)::text, 16, '0')
             || ':job.enqueued:' || j.id || ':0') COLLATE \"C\" > $7)
     ORDER BY ", $enqueued_order, " LIMIT $5)
    UNION ALL
    (SELECT e.id, e.type, e.at, e.job_id, e.job_type, e.queue, e.attempt, e.duration_ms, e.error, e.worker_id,
            e.next_retry_at, e.max_attempts, NULL::timestamptz, NULL::timestamptz, NULL::float8, NULL::text, e.trace_id
     FROM (SELECT ", evid!(attempt_event_at!(), "e0.type || ':' || e0.job_id || ':' || e0.attempt"), " AS id, ", attempt_event_at!(), " AS pos, e0.* FROM (
         SELECT k.type, k.n, a.finished_at AS at, a.job_id, j.type AS job_type, j.queue, a.attempt,
                (EXTRACT(EPOCH FROM (a.finished_at - a.started_at)) * 1000)::bigint AS duration_ms,
                -- `retryable`: whether the error itself allowed a retry (ojs-events `job.failed`);
                -- an exhausted budget does not make it less so.
                -- A timeout's or a stall's own event carries the details too: their OJS fields.
                CASE WHEN a.error_type IS NULL THEN NULL
                     ELSE jsonb_build_object('type', a.error_type, 'code', a.error_code, 'message', a.error_message,
                                             'retryable', a.outcome IN ('retried', 'exhausted', 'snoozed'))
                          || CASE WHEN k.type IN ('job.timeout', 'job.stalled') AND a.error_details IS NOT NULL
                                  THEN jsonb_build_object('details', a.error_details) ELSE '{}' END END AS error,
                a.worker_id, a.id AS seq, ", trace_id!(), " AS trace_id,
                CASE WHEN k.type = 'job.retrying' THEN a.next_run_at END AS next_retry_at,
                CASE WHEN k.type = 'job.retrying' THEN j.max_attempts END AS max_attempts
         FROM job_attempts a JOIN jobs j ON j.id = a.job_id LEFT JOIN policy_snapshots p ON p.id = a.policy_id
         CROSS JOIN LATERAL unnest(CASE
                    WHEN a.outcome = 'retried' THEN ARRAY['job.failed', 'job.retrying']
                    WHEN a.outcome = 'released' THEN ARRAY['job.released']
                    WHEN a.outcome = 'snoozed' THEN ARRAY['job.snoozed']
                    -- Its `job.cancelled` comes from the log of transitions, as any job's.
                    WHEN a.outcome = 'cancelled' THEN ARRAY[]::text[]
                    -- A job its key's limit dropped (`on_limit: drop`) never ran: it only ends.
                    WHEN a.outcome = 'dropped' THEN ARRAY['job.discarded']
                    WHEN a.outcome = 'dead_lettered'
                         OR (a.outcome IN ('exhausted', 'non_retryable') AND p.policy->>'on_exhaustion' = 'dead_letter')
                         THEN ARRAY['job.failed', 'job.dead_lettered']
                    ELSE ARRAY['job.failed', 'job.discarded']
                END
                -- ojs-timeouts §11: the rescuer's and the worker's timeouts and stalls are
                -- events of their own too, listed last so the others keep their ids, but
                -- positioned a microsecond before `job.failed` (see the id above): a job's
                -- stream ends at its terminal event, which must come after them.
                || CASE a.error_type WHEN 'rebound.timeout' THEN ARRAY['job.timeout'] WHEN 'rebound.stalled' THEN ARRAY['job.stalled']
                        ELSE ARRAY[]::text[] END) WITH ORDINALITY AS k(type, n)
         WHERE (cardinality($2::text[]) = 0 OR j.queue = ANY($2))
           AND (cardinality($6::text[]) = 0 OR j.type = ANY($6))
           -- Decided once: asked only for events no attempt row makes, the branch reads nothing
           -- (filtering on the computed type below would walk every attempt to find none).
           AND (cardinality($1::text[]) = 0
                OR $1 && ARRAY['job.failed', 'job.retrying', 'job.released', 'job.snoozed', 'job.dead_lettered', 'job.discarded',
                               'job.timeout', 'job.stalled'])
           AND ($3::uuid IS NULL OR a.job_id = $3)
           AND ($4::timestamptz IS NULL OR a.finished_at >= $4::timestamptz)
           -- A microsecond past the bound: an attempt finished at it has an event (its timeout's)
           -- positioned before it, which is this window's (the positions are bounded below).
           AND ($8::timestamptz IS NULL OR a.finished_at < $8::timestamptz + interval '1 microsecond')
     ) e0) e
     WHERE (cardinality($1::text[]) = 0 OR e.type = ANY($1))
       AND ($7::text IS NULL OR e.id > $7)
       AND ($8::timestamptz IS NULL OR e.pos < $8::timestamptz)
     ORDER BY ", $attempts_order, " LIMIT $5)
    UNION ALL
    -- The log's transitions (see `logged!`); the jobs are looked up by key.
    (SELECT g.id, g.type, g.at, g.job_id, g.job_type, g.queue, g.attempt, g.duration_ms, g.error, g.worker_id,
            NULL::timestamptz, NULL::int, g.scheduled_at, NULL::timestamptz, NULL::float8, NULL::text, g.trace_id
     FROM (SELECT ", evid!("f.at", "t.type || ':' || j.id || ':' || COALESCE(t.attempt, 0)"), " AS id, t.type, f.at, j.id AS job_id,
                  j.type AS job_type, j.queue, t.attempt,
                  CASE WHEN f.state = 'completed' THEN (EXTRACT(EPOCH FROM (j.completed_at - j.started_at)) * 1000)::bigint END AS duration_ms,
                  CASE WHEN f.state = 'discarded' THEN j.last_error END AS error,
                  CASE WHEN f.state = 'active' THEN f.worker_id WHEN f.state = 'completed' THEN j.locked_by END AS worker_id,
                  CASE WHEN f.state = 'scheduled' THEN j.scheduled_at END AS scheduled_at,
                  ", trace_id!(), " AS trace_id
           FROM (",
            logged!("active", "job.started", $logged_order,
                "SELECT a.started_at AS at, a.job_id, a.attempt, a.worker_id FROM job_attempts a
          WHERE a.job_id = COALESCE($3::uuid, '00000000-0000-0000-0000-000000000000') AND a.started_at IS NOT NULL
          UNION ALL
          -- The job row's execution, unless an attempt row records it already (a failure's
          -- does, with the worker the row has let go of: a UNION kept both). Matched by its
          -- start alone: a snooze, a release or an operator's retry moves the row's attempt
          -- number back, not its start, and no two executions start at once.
          SELECT j.started_at, j.id, j.attempt, j.locked_by FROM jobs j WHERE j.id = COALESCE($3::uuid, '00000000-0000-0000-0000-000000000000') AND j.started_at IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM job_attempts a WHERE a.job_id = j.id AND a.started_at = j.started_at)"),
            "
     UNION ALL
     ",
            logged!("completed", "job.completed", $logged_order,
                "SELECT j.completed_at AS at, j.id AS job_id, NULL::int AS attempt, NULL::text AS worker_id FROM jobs j WHERE j.id = COALESCE($3::uuid, '00000000-0000-0000-0000-000000000000') AND j.state = 'completed'"),
            "
     UNION ALL
     ",
            // A cancelled or expired job may be retried and run on: its cancellation or
            // expiry is then the log's, not the row's (both are rare, so the log's rows of its
            // lifetime are few).
            logged!("cancelled", "job.cancelled", $logged_order,
                in_its_lifetime!("cancelled")),
            "
     UNION ALL
     ",
            logged!("discarded", "job.expired", $logged_order,
                in_its_lifetime!("discarded")),
            "
     UNION ALL
     ",
            logged!("scheduled", "job.scheduled", $logged_order,
                in_its_lifetime!("scheduled")),
            ") f
           JOIN jobs j ON j.id = f.job_id
           CROSS JOIN LATERAL (SELECT CASE f.state WHEN 'active' THEN 'job.started' WHEN 'completed' THEN 'job.completed'
                                      WHEN 'cancelled' THEN 'job.cancelled' WHEN 'discarded' THEN 'job.expired' ELSE 'job.scheduled' END AS type,
                                      CASE f.state WHEN 'active' THEN f.attempt WHEN 'completed' THEN j.attempt END AS attempt) t
           WHERE (cardinality($2::text[]) = 0 OR j.queue = ANY($2))
             AND (cardinality($6::text[]) = 0 OR j.type = ANY($6))) g
     WHERE ($7::text IS NULL OR g.id > $7)
       AND ($4::timestamptz IS NULL OR g.at >= $4::timestamptz)
       AND ($8::timestamptz IS NULL OR g.at < $8::timestamptz))
    UNION ALL
    -- Heartbeats, from their own log (see migrations/…_job_heartbeats.sql), over every queue
    -- or the asked-for ones by time; for one job, its queue's while the job ran.
    (SELECT h.id, 'job.heartbeat'::text, h.at, h.job_id, j.type, j.queue, h.attempt, NULL::bigint, NULL::jsonb, h.worker_id,
            NULL::timestamptz, NULL::int, NULL::timestamptz, h.visible_until, NULL::float8, NULL::text, ", trace_id!(), "
     FROM ((SELECT ", evid!("l.at", "'job.heartbeat:' || u.job_id || ':' || u.attempt"), " AS id,
                   l.at, u.job_id, u.attempt, l.worker_id, u.visible_until
            FROM job_heartbeats l CROSS JOIN LATERAL unnest(l.job_ids, l.attempts, l.visible_until) AS u(job_id, attempt, visible_until)
            WHERE (cardinality($1::text[]) = 0 OR 'job.heartbeat' = ANY($1)) AND $3::uuid IS NULL
              AND (cardinality($2::text[]) = 0 OR l.queue = ANY($2))
              AND ($4::timestamptz IS NULL OR l.at >= $4::timestamptz)
              AND ($8::timestamptz IS NULL OR l.at < $8::timestamptz)
              AND ($7::text IS NULL OR ", evid!("l.at", "'job.heartbeat:' || u.job_id || ':' || u.attempt"), " > $7)
              AND (cardinality($6::text[]) = 0 OR EXISTS (SELECT 1 FROM jobs t WHERE t.id = u.job_id AND t.type = ANY($6)))
            ORDER BY ", $logged_order, " LIMIT $5)
           UNION ALL
           (SELECT ", evid!("l.at", "'job.heartbeat:' || u.job_id || ':' || u.attempt"), ",
                   l.at, u.job_id, u.attempt, l.worker_id, u.visible_until
            -- Only the beats of the job's queue while it ran: from its first start (every
            -- execution but the job row's own is an attempt row) to its last write unless it
            -- runs (heartbeats never write `updated_at`; the minutes allow for a beat that
            -- locked the row before a batch write begun earlier reached it). Bounded only by
            -- its creation, an old job's read every beat of its queue since (2.5 s for a day
            -- of one worker's).
            FROM jobs o
            CROSS JOIN LATERAL (SELECT LEAST(o.started_at, (SELECT min(a.started_at) FROM job_attempts a WHERE a.job_id = o.id)) AS first_start) s
            JOIN job_heartbeats l ON l.queue = o.queue AND l.at >= s.first_start
             AND l.at <= CASE WHEN o.state = 'active' THEN 'infinity' ELSE o.updated_at + interval '5 minutes' END
            CROSS JOIN LATERAL unnest(l.job_ids, l.attempts, l.visible_until) AS u(job_id, attempt, visible_until)
            WHERE o.id = COALESCE($3::uuid, '00000000-0000-0000-0000-000000000000') AND u.job_id = o.id
              AND (cardinality($1::text[]) = 0 OR 'job.heartbeat' = ANY($1))
              AND ($4::timestamptz IS NULL OR l.at >= $4::timestamptz)
              AND ($8::timestamptz IS NULL OR l.at < $8::timestamptz)
              AND ($7::text IS NULL OR ", evid!("l.at", "'job.heartbeat:' || u.job_id || ':' || u.attempt"), " > $7)
            ORDER BY ", $logged_order, " LIMIT $5)) h
     JOIN jobs j ON j.id = h.job_id
     WHERE (cardinality($2::text[]) = 0 OR j.queue = ANY($2))
       AND (cardinality($6::text[]) = 0 OR j.type = ANY($6)))
    UNION ALL
    -- Progress reports, a row each (see migrations/…_job_progress.sql): over every queue or
    -- the asked-for ones by time; for one job, by the job.
    (SELECT p.eid, 'job.progress'::text, p.at, p.job_id, j.type, j.queue, p.attempt, NULL::bigint, NULL::jsonb, p.worker_id,
            NULL::timestamptz, NULL::int, NULL::timestamptz, NULL::timestamptz, p.percentage, p.message, ", trace_id!(), "
     FROM (SELECT ", evid!("r.at", "'job.progress:' || r.job_id || ':' || r.attempt || ':' || r.id"), " AS eid, r.*
           FROM job_progress r
           WHERE (cardinality($1::text[]) = 0 OR 'job.progress' = ANY($1))
             AND ($3::uuid IS NULL OR r.job_id = $3)
             AND (cardinality($2::text[]) = 0 OR r.queue = ANY($2))
             AND ($4::timestamptz IS NULL OR r.at >= $4::timestamptz)
             AND ($8::timestamptz IS NULL OR r.at < $8::timestamptz)
             AND ($7::text IS NULL OR ", evid!("r.at", "'job.progress:' || r.job_id || ':' || r.attempt || ':' || r.id"), " > $7)
             AND (cardinality($6::text[]) = 0 OR EXISTS (SELECT 1 FROM jobs t WHERE t.id = r.job_id AND t.type = ANY($6)))
           ORDER BY ", $progress_order, " LIMIT $5) p
     JOIN jobs j ON j.id = p.job_id)
) events
ORDER BY ", $order, "
LIMIT $5"
        )
    };
}

const NEWEST_FIRST: &str = events_sql!("j.id DESC", "e.seq DESC, e.id DESC", "l.at DESC", "r.at DESC", "at DESC, id DESC");
// Since a time, the attempts are read through their BRIN index on `finished_at` and sorted:
// in id order, the branch walked every attempt older than the window when few were in it.
const NEWEST_SINCE: &str = events_sql!("j.id DESC", "e.at DESC, e.id DESC", "l.at DESC", "r.at DESC", "at DESC, id DESC");
const AFTER: &str = events_sql!("j.id", "e.id", "l.at, u.job_id", "r.at, eid", "id");

/// Queue event types [`Store::queue_events`] knows.
pub const QUEUE_EVENT_TYPES: [&str; 2] = ["queue.paused", "queue.resumed"];

/// A queue paused or resumed (from the audit log).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueEvent {
    /// Unique, stable, and a cursor like [`JobEvent::id`]: `evt_<µs>:<type>:<queue>:<audit entry>`.
    pub id: String,
    /// One of [`QUEUE_EVENT_TYPES`].
    pub event_type: String,
    pub at: Timestamp,
    pub queue: String,
    /// Who did it.
    pub actor: String,
}

macro_rules! queue_events_sql {
    ($order:literal) => {
        concat!(
            "SELECT * FROM (
    SELECT ", evid!("a.at", "CASE WHEN a.action = 'queue.pause' THEN 'queue.paused:' ELSE 'queue.resumed:' END || a.target || ':' || a.id"), " AS id,
           CASE WHEN a.action = 'queue.pause' THEN 'queue.paused' ELSE 'queue.resumed' END AS type, a.at, a.target AS queue, a.actor
    FROM audit_log a
    WHERE a.action IN ('queue.pause', 'queue.resume') AND a.target IS NOT NULL AND $3::uuid IS NULL AND cardinality($6::text[]) = 0
      AND (cardinality($2::text[]) = 0 OR a.target = ANY($2))
      AND ($4::timestamptz IS NULL OR a.at >= $4::timestamptz)
      AND ($8::timestamptz IS NULL OR a.at < $8::timestamptz)
) e
WHERE (cardinality($1::text[]) = 0 OR e.type = ANY($1)) AND ($7::text IS NULL OR e.id > $7)
ORDER BY ", $order, " LIMIT $5"
        )
    };
}
const QUEUE_EVENTS_NEWEST_FIRST: &str = queue_events_sql!("at DESC, id DESC");
const QUEUE_EVENTS_AFTER: &str = queue_events_sql!("id");

/// Worker event types [`Store::worker_events`] knows.
pub const WORKER_EVENT_TYPES: [&str; 4] = ["worker.started", "worker.heartbeat", "worker.quiet", "worker.stopped"];

/// A worker registered, beat, went quiet or went away (logged by triggers on `workers` and by
/// the heartbeat statements; see migrations/…_worker_events.sql and …_worker_liveness_events.sql).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerEvent {
    /// Unique, stable, and a cursor like [`JobEvent::id`]: `evt_<µs>:<type>:<worker>:<n>`.
    pub id: String,
    /// One of [`WORKER_EVENT_TYPES`].
    pub event_type: String,
    pub at: Timestamp,
    pub worker_id: String,
    /// The event's OJS data, always with `worker_id`: `queues`, `concurrency` (started);
    /// `active_jobs`, `queues`, `concurrency`, `status` (heartbeat); `active_jobs`, `reason`
    /// (`quiet` or `shutdown`) (quiet); `reason` (`shutdown` or `heartbeat_timeout`),
    /// `uptime_ms`, `active_jobs` (stopped).
    pub data: Value,
}

// The events logged in `$table` (`worker_events`, `workflow_events`: id, at, type, data and the
// subject's id in the column `$subject`), in `$order`. None for a filter naming queues, a job or
// job types: workers and workflows are none of those.
macro_rules! subject_events_sql {
    ($table:literal, $subject:literal, $order:literal) => {
        concat!(
            "SELECT * FROM (
    SELECT ", evid!("w.at", "w.type || ':' || w.", $subject, " || ':' || w.id"), " AS id, w.type, w.at, w.", $subject, " AS subject, w.data
    FROM ", $table, " w
    WHERE $3::uuid IS NULL AND cardinality($6::text[]) = 0 AND cardinality($2::text[]) = 0
      AND (cardinality($1::text[]) = 0 OR w.type = ANY($1))
      AND ($4::timestamptz IS NULL OR w.at >= $4::timestamptz)
      AND ($8::timestamptz IS NULL OR w.at < $8::timestamptz)
) e
WHERE ($7::text IS NULL OR e.id > $7)
ORDER BY ", $order, " LIMIT $5"
        )
    };
}
const WORKER_EVENTS_NEWEST_FIRST: &str = subject_events_sql!("worker_events", "worker_id", "at DESC, id DESC");
const WORKER_EVENTS_AFTER: &str = subject_events_sql!("worker_events", "worker_id", "id");

/// Workflow event types [`Store::workflow_events`] knows.
pub const WORKFLOW_EVENT_TYPES: [&str; 4] = ["workflow.started", "workflow.step_completed", "workflow.completed", "workflow.failed"];

/// A workflow started, finished a step, completed or failed (logged by the statements that
/// did it; see migrations/…_workflows.sql).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkflowEvent {
    /// Unique, stable, and a cursor like [`JobEvent::id`].
    pub id: String,
    /// One of [`WORKFLOW_EVENT_TYPES`].
    pub event_type: String,
    pub at: Timestamp,
    pub workflow_id: Uuid,
    /// The event's OJS data, always with `workflow_id` and `workflow_name`: `total_steps`
    /// (started, completed), `step_id`, `step_type`, `duration_ms`, `steps_remaining`
    /// (step_completed), `duration_ms` (completed), `failed_step_id`, `failed_step_type`,
    /// `error` (failed).
    pub data: Value,
}

const WORKFLOW_EVENTS_NEWEST_FIRST: &str = subject_events_sql!("workflow_events", "workflow_id", "at DESC, id DESC");
const WORKFLOW_EVENTS_AFTER: &str = subject_events_sql!("workflow_events", "workflow_id", "id");

/// Rate-limit event types [`Store::rate_limit_events`] knows (ojs-rate-limiting §11.1).
pub const RATE_LIMIT_EVENT_TYPES: [&str; 4] = ["rate_limit.exceeded", "rate_limit.released", "rate_limit.dynamic_adjusted", "rate_limit.dropped"];

/// A statement left jobs of a rate-limit key waiting for a slot (`rate_limit.exceeded`: one per
/// statement and key), a waiting job was admitted (`rate_limit.released`: one per job), or a
/// handler's failure held the key (`rate_limit.dynamic_adjusted`), logged by the statements
/// that did it (see migrations/…_keyed_rate_limits.sql).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RateLimitEvent {
    /// Unique, stable, and a cursor like [`JobEvent::id`].
    pub id: String,
    /// One of [`RATE_LIMIT_EVENT_TYPES`].
    pub event_type: String,
    pub at: Timestamp,
    pub key: String,
    /// The event's OJS data, always with `key` and `strategy` (`concurrency`): `limit`,
    /// `current` (the slots held) and `parked` (how many jobs were left waiting) when
    /// exceeded; `job_id`, `queue` and `job_type` when released; `until` and `reason` (the
    /// error type) when dynamically adjusted.
    pub data: Value,
}

const RATE_LIMIT_EVENTS_NEWEST_FIRST: &str = subject_events_sql!("rate_limit_events", "key", "at DESC, id DESC");
const RATE_LIMIT_EVENTS_AFTER: &str = subject_events_sql!("rate_limit_events", "key", "id");

/// Dead-letter event types [`Store::dead_letter_events`] knows (the OJS dead-letter
/// extension's; a job entering the queue is [`EVENT_TYPES`]' `job.dead_lettered`).
pub const DEAD_LETTER_EVENT_TYPES: [&str; 4] = ["dead_letter.retried", "dead_letter.replayed", "dead_letter.deleted", "dead_letter.pruned"];

/// A dead letter re-driven or deleted by an operator or replayed by a rule (one event per
/// job), or the retention policy pruning a queue's (one event per pass and queue), from
/// `dead_letter_log`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeadLetterEvent {
    /// Unique, stable, and a cursor like [`JobEvent::id`].
    pub id: String,
    /// One of [`DEAD_LETTER_EVENT_TYPES`].
    pub event_type: String,
    pub at: Timestamp,
    pub queue: String,
    /// The job (retried, replayed, deleted); none for `dead_letter.pruned`.
    pub job_id: Option<Uuid>,
    pub job_type: Option<String>,
    /// Who did it (retried, deleted), or `system:replay-rule:<name>` (replayed).
    pub actor: Option<String>,
    /// How many jobs: 1, or how many a prune removed.
    pub count: i64,
}

macro_rules! dead_letter_events_sql {
    ($order:literal) => {
        concat!(
            "SELECT * FROM (
    SELECT ", evid!("l.at", "'dead_letter.' || l.action || ':' || u.job_id || ':' || l.id"), " AS id, 'dead_letter.' || l.action AS type,
           l.at, l.queue, u.job_id, u.job_type, l.actor, 1::bigint AS count
    FROM dead_letter_log l CROSS JOIN LATERAL unnest(l.job_ids, l.job_types) AS u(job_id, job_type)
    WHERE l.action IN ('retried', 'replayed', 'deleted')
      AND ($3::uuid IS NULL OR u.job_id = $3)
      AND (cardinality($6::text[]) = 0 OR u.job_type = ANY($6))
      AND (cardinality($2::text[]) = 0 OR l.queue = ANY($2))
      AND ($4::timestamptz IS NULL OR l.at >= $4::timestamptz)
      AND ($8::timestamptz IS NULL OR l.at < $8::timestamptz)
    UNION ALL
    SELECT ", evid!("l.at", "'dead_letter.pruned:' || l.queue || ':' || l.id"), ", 'dead_letter.pruned', l.at, l.queue, NULL::uuid, NULL::text, NULL::text,
           cardinality(l.job_ids)::bigint
    FROM dead_letter_log l
    WHERE l.action = 'pruned'
      AND ($3::uuid IS NULL OR $3 = ANY(l.job_ids))
      AND (cardinality($6::text[]) = 0 OR l.job_types && $6)
      AND (cardinality($2::text[]) = 0 OR l.queue = ANY($2))
      AND ($4::timestamptz IS NULL OR l.at >= $4::timestamptz)
      AND ($8::timestamptz IS NULL OR l.at < $8::timestamptz)
) e
WHERE (cardinality($1::text[]) = 0 OR e.type = ANY($1)) AND ($7::text IS NULL OR e.id > $7)
ORDER BY ", $order, " LIMIT $5"
        )
    };
}
const DEAD_LETTER_EVENTS_NEWEST_FIRST: &str = dead_letter_events_sql!("at DESC, id DESC");
const DEAD_LETTER_EVENTS_AFTER: &str = dead_letter_events_sql!("id");

/// Where a cursor's reading starts: the later of `since` and the cursor's time.
fn reading_from(filter: &EventFilter) -> Result<Option<Timestamp>, StoreError> {
    Ok(match &filter.after {
        Some(after) => {
            let from = position_time(after)?;
            Some(filter.since.map_or(from, |s| s.max(from)))
        }
        None => filter.since,
    })
}

/// An events query with `filter` bound as every events query reads it: `$1` the types (or
/// cron outcomes), `$2` queues, `$3` job id, `$4` where reading starts, `$5` limit, `$6` job
/// types, `$7` the cursor, `$8` the horizon.
pub(crate) fn bind_filter<'q>(sql: &'static str, types: Vec<&'q str>, filter: &'q EventFilter) -> Result<Query<'q, Postgres, PgArguments>, StoreError> {
    let since = reading_from(filter)?;
    Ok(sqlx::query(sql)
        .bind(types)
        .bind(&filter.queues)
        .bind(filter.job_id)
        // Typed, not text: text's cast to timestamptz depends on the session's time zone, so
        // Postgres would not fold `$4 IS NULL OR at >= $4` and no index would bound the read
        // (every branch walked its whole index: seconds at 10M jobs).
        .bind(since.map(jiff_sqlx::Timestamp::from))
        .bind(filter.limit.clamp(1, 10_000))
        .bind(&filter.job_types)
        .bind(filter.after.as_deref())
        .bind(filter.until.map(jiff_sqlx::Timestamp::from)))
}

impl Store {
    /// Job events matching `filter`: newest first, or with [`EventFilter::after`] oldest first
    /// from there.
    pub async fn events(&self, filter: &EventFilter) -> Result<Vec<JobEvent>, StoreError> {
        if !filter.job_types.is_empty() && !self.any_job_of_types(&filter.job_types).await? {
            return Ok(Vec::new());
        }
        let sql = match (&filter.after, filter.since) {
            (Some(_), _) => AFTER,
            (None, Some(_)) => NEWEST_SINCE,
            (None, None) => NEWEST_FIRST,
        };
        let rows = bind_filter(sql, filter.types.iter().map(String::as_str).collect(), filter)?.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(JobEvent {
                    id: r.try_get("id")?,
                    event_type: r.try_get("type")?,
                    at: ts(r, "at")?,
                    job_id: r.try_get("job_id")?,
                    job_type: r.try_get("job_type")?,
                    queue: r.try_get("queue")?,
                    attempt: r.try_get("attempt")?,
                    duration_ms: r.try_get("duration_ms")?,
                    error: r.try_get("error")?,
                    worker_id: r.try_get("worker_id")?,
                    next_retry_at: ts_opt(r, "next_retry_at")?,
                    max_attempts: r.try_get("max_attempts")?,
                    scheduled_at: ts_opt(r, "scheduled_at")?,
                    visible_until: ts_opt(r, "visible_until")?,
                    progress_percent: r.try_get("progress_percent")?,
                    progress_message: r.try_get("progress_message")?,
                    trace_id: r.try_get("trace_id")?,
                })
            })
            .collect()
    }

    /// Whether any job of these types exists, by the counters: a filter on types no job has
    /// would otherwise walk every branch's whole history to find nothing.
    async fn any_job_of_types(&self, types: &[String]) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM job_count_totals WHERE type = ANY($1))").bind(types).fetch_one(&self.pool).await?)
    }

    /// Queue events (`filter.types` from [`QUEUE_EVENT_TYPES`]) matching `filter` like
    /// [`Store::events`]. None for a filter naming a job or job types: they have neither.
    pub async fn queue_events(&self, filter: &EventFilter) -> Result<Vec<QueueEvent>, StoreError> {
        if filter.job_id.is_some() || !filter.job_types.is_empty() {
            return Ok(Vec::new());
        }
        let sql = if filter.after.is_some() { QUEUE_EVENTS_AFTER } else { QUEUE_EVENTS_NEWEST_FIRST };
        let rows = bind_filter(sql, filter.types.iter().map(String::as_str).collect(), filter)?.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(QueueEvent {
                    id: r.try_get("id")?,
                    event_type: r.try_get("type")?,
                    at: ts(r, "at")?,
                    queue: r.try_get("queue")?,
                    actor: r.try_get("actor")?,
                })
            })
            .collect()
    }

    /// Worker events (`filter.types` from [`WORKER_EVENT_TYPES`]) matching `filter` like
    /// [`Store::events`]. None for a filter naming queues, a job or job types: workers are
    /// none of those.
    pub async fn worker_events(&self, filter: &EventFilter) -> Result<Vec<WorkerEvent>, StoreError> {
        self.subject_events(WORKER_EVENTS_AFTER, WORKER_EVENTS_NEWEST_FIRST, filter, |id, event_type, at, worker_id, data| WorkerEvent {
            id,
            event_type,
            at,
            worker_id,
            data,
        })
        .await
    }

    /// Workflow events (`filter.types` from [`WORKFLOW_EVENT_TYPES`]) matching `filter` like
    /// [`Store::events`]. None for a filter naming queues, a job or job types.
    pub async fn workflow_events(&self, filter: &EventFilter) -> Result<Vec<WorkflowEvent>, StoreError> {
        self.subject_events(WORKFLOW_EVENTS_AFTER, WORKFLOW_EVENTS_NEWEST_FIRST, filter, |id, event_type, at, workflow_id, data| WorkflowEvent {
            id,
            event_type,
            at,
            workflow_id,
            data,
        })
        .await
    }

    /// Rate-limit events (`filter.types` from [`RATE_LIMIT_EVENT_TYPES`]) matching `filter`
    /// like [`Store::events`]. None for a filter naming queues, a job or job types.
    pub async fn rate_limit_events(&self, filter: &EventFilter) -> Result<Vec<RateLimitEvent>, StoreError> {
        self.subject_events(RATE_LIMIT_EVENTS_AFTER, RATE_LIMIT_EVENTS_NEWEST_FIRST, filter, |id, event_type, at, key, data| RateLimitEvent {
            id,
            event_type,
            at,
            key,
            data,
        })
        .await
    }

    /// The events of a log read by `subject_events_sql!` (its `after` and newest-first
    /// statements), each row made into an event by `make(id, type, at, subject, data)`.
    async fn subject_events<S, E>(
        &self,
        after: &'static str,
        newest_first: &'static str,
        filter: &EventFilter,
        make: fn(String, String, Timestamp, S, Value) -> E,
    ) -> Result<Vec<E>, StoreError>
    where
        S: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
    {
        let sql = if filter.after.is_some() { after } else { newest_first };
        let rows = bind_filter(sql, filter.types.iter().map(String::as_str).collect(), filter)?.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| Ok(make(r.try_get("id")?, r.try_get("type")?, ts(r, "at")?, r.try_get("subject")?, r.try_get("data")?)))
            .collect()
    }

    /// Dead-letter events (`filter.types` from [`DEAD_LETTER_EVENT_TYPES`]) matching `filter`
    /// like [`Store::events`]. A prune's event matches a job or job type it removed.
    pub async fn dead_letter_events(&self, filter: &EventFilter) -> Result<Vec<DeadLetterEvent>, StoreError> {
        let sql = if filter.after.is_some() { DEAD_LETTER_EVENTS_AFTER } else { DEAD_LETTER_EVENTS_NEWEST_FIRST };
        let rows = bind_filter(sql, filter.types.iter().map(String::as_str).collect(), filter)?.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetterEvent {
                    id: r.try_get("id")?,
                    event_type: r.try_get("type")?,
                    at: ts(r, "at")?,
                    queue: r.try_get("queue")?,
                    job_id: r.try_get("job_id")?,
                    job_type: r.try_get("job_type")?,
                    actor: r.try_get("actor")?,
                    count: r.try_get("count")?,
                })
            })
            .collect()
    }

    /// The settled horizon: events positioned before it are final, so a cursor may pass them.
    /// It is [`EVENT_SETTLE`] ago, or earlier while a transaction that began before then is
    /// still open in this database (it may yet commit events positioned at its start).
    pub async fn event_horizon(&self) -> Result<Timestamp, StoreError> {
        let horizon: String = sqlx::query_scalar(
            "SELECT to_char(LEAST(now() - $1 * interval '1 millisecond', min(xact_start)) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
             FROM pg_stat_activity
             WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .bind(i64::try_from(EVENT_SETTLE.as_millis()).unwrap_or(1000))
        .fetch_one(&self.pool)
        .await?;
        horizon.parse().map_err(|e| StoreError::invalid("horizon", format!("{horizon:?}: {e}")))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::NewJob;
    use crate::outcome::{HandlerError, Outcome};
    use crate::store::{ClaimRequest, Completion, Failure, NamedRun};
    use crate::testing::TestDb;

    fn filter(types: &[&str], queues: &[&str]) -> EventFilter {
        EventFilter { types: types.iter().map(|s| s.to_string()).collect(), queues: queues.iter().map(|s| s.to_string()).collect(), limit: 100, ..Default::default() }
    }

    #[tokio::test]
    async fn events_come_from_jobs_and_attempts() {
        let db = TestDb::new().await;
        let s = &db.store;
        let a = s.enqueue(NewJob::new("ev.a", serde_json::json!([])).queue("q1")).await.unwrap().job;
        let b = s.enqueue(NewJob::new("ev.b", serde_json::json!([])).queue("q2")).await.unwrap().job;
        let claim = |q: &str| ClaimRequest { worker_id: "w".into(), queues: vec![q.into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        s.claim(&claim("q1")).await.unwrap();
        s.complete(&Completion { id: a.id, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap();
        s.claim(&claim("q2")).await.unwrap();
        let failure = Failure { id: b.id, attempt: None, worker_id: None, outcome: Outcome::Retry(HandlerError::new("x.y", "boom")), error_code: Some("E1".into()) };
        s.fail(&failure).await.unwrap();

        let all = s.events(&filter(&[], &[])).await.unwrap();
        let kinds: Vec<&str> = all.iter().map(|e| e.event_type.as_str()).collect();
        let mut sorted = kinds.clone();
        sorted.sort();
        assert_eq!(sorted, ["job.completed", "job.enqueued", "job.enqueued", "job.failed", "job.retrying", "job.started", "job.started"]);
        let done = s.events(&filter(&["job.completed"], &["q1"])).await.unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].job_id, done[0].attempt), (a.id, Some(1)));
        assert!(done[0].duration_ms.is_some());
        let failed = s.events(&filter(&["job.failed"], &[])).await.unwrap();
        assert_eq!(failed[0].error.as_ref().and_then(|e| e.get("code")).and_then(|c| c.as_str()), Some("E1"));
        let retrying = s.events(&filter(&["job.retrying"], &[])).await.unwrap();
        assert_eq!((retrying.len(), retrying[0].max_attempts), (1, Some(3)));
        assert!(retrying[0].next_retry_at.is_some_and(|t| t > retrying[0].at));
        let started = s.events(&filter(&["job.started"], &["q1"])).await.unwrap();
        assert_eq!(started.iter().map(|e| (e.job_id, e.attempt, e.worker_id.as_deref())).collect::<Vec<_>>(), vec![(a.id, Some(1), Some("w"))]);
        assert!(s.events(&filter(&["job.completed"], &["q2"])).await.unwrap().is_empty());
        let one_job = EventFilter { job_id: Some(b.id), ..filter(&[], &[]) };
        assert!(s.events(&one_job).await.unwrap().iter().all(|e| e.job_id == b.id));
        let future = EventFilter { since: Some(Timestamp::now() + jiff::SignedDuration::from_secs(3600)), ..filter(&[], &[]) };
        assert!(s.events(&future).await.unwrap().is_empty());
        let limited = EventFilter { limit: 1, ..filter(&[], &[]) };
        assert_eq!(s.events(&limited).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn completions_and_cancellations_are_read_from_the_log_of_finishes() {
        let db = TestDb::new().await;
        let s = &db.store;
        let claim = |q: &str, n: u32| ClaimRequest { worker_id: "w".into(), queues: vec![q.into()], limit: n, visibility_timeout: Duration::from_secs(60) };
        let q1: Vec<Uuid> = s.enqueue_batch((0..3).map(|i| NewJob::new("ev.a", serde_json::json!([i])).queue("q1")).collect()).await.unwrap().into_iter().map(|e| e.job.id).collect();
        let q2 = s.enqueue(NewJob::new("ev.b", serde_json::json!([])).queue("q2")).await.unwrap().job;
        let gone = s.enqueue(NewJob::new("ev.c", serde_json::json!([])).queue("q2")).await.unwrap().job;
        s.claim(&claim("q1", 3)).await.unwrap();
        // One statement completes the three: one row of the log.
        let done: Vec<Completion> = q1.iter().map(|id| Completion { id: *id, attempt: Some(1), worker_id: Some("w".into()), started_at: None, result: None }).collect();
        assert_eq!(s.complete_batch(&done).await.unwrap().len(), 3);
        s.claim(&claim("q2", 1)).await.unwrap();
        s.complete(&Completion { id: q2.id, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap();
        s.cancel(gone.id, None).await.unwrap();
        let rows: Vec<(String, String, i32)> = sqlx::query_as("SELECT queue, state::text, cardinality(job_ids) FROM job_transitions ORDER BY id")
            .fetch_all(s.pool())
            .await
            .unwrap();
        let row = |q: &str, state: &str, n: i32| (q.to_owned(), state.to_owned(), n);
        assert_eq!(rows, vec![row("q1", "active", 3), row("q1", "completed", 3), row("q2", "active", 1), row("q2", "completed", 1), row("q2", "cancelled", 1)]);
        // Editing a finished job is no new finish.
        sqlx::query("UPDATE jobs SET result = '{}' WHERE state IN ('completed', 'cancelled')").execute(s.pool()).await.unwrap();
        let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM job_transitions").fetch_one(s.pool()).await.unwrap();
        assert_eq!(logged, 5);

        let completed = s.events(&filter(&["job.completed"], &[])).await.unwrap();
        assert_eq!(completed.len(), 4);
        assert!(completed.iter().all(|e| e.attempt == Some(1) && e.duration_ms.is_some()));
        assert_eq!(completed[0].job_id, q2.id, "newest first");
        let in_q1 = s.events(&filter(&["job.completed"], &["q1", "q1", "nowhere"])).await.unwrap();
        let mut ids: Vec<Uuid> = in_q1.iter().map(|e| e.job_id).collect();
        ids.sort();
        assert_eq!(ids, q1, "each job once, however often its queue is named");
        assert_eq!(in_q1[0].worker_id.as_deref(), Some("w"));
        let cancelled = s.events(&filter(&["job.cancelled"], &["q2"])).await.unwrap();
        assert_eq!(cancelled.iter().map(|e| (e.job_id, e.attempt)).collect::<Vec<_>>(), vec![(gone.id, None)]);
        let limited = EventFilter { limit: 2, ..filter(&["job.completed", "job.cancelled"], &[]) };
        assert_eq!(s.events(&limited).await.unwrap().len(), 2);
        let one_job = EventFilter { job_id: Some(q1[1]), ..filter(&["job.completed"], &[]) };
        assert_eq!(s.events(&one_job).await.unwrap().iter().map(|e| e.job_id).collect::<Vec<_>>(), vec![q1[1]]);
        let since: String = sqlx::query_scalar("SELECT to_char(max(at) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM job_transitions WHERE state <> 'active'")
            .fetch_one(s.pool())
            .await
            .unwrap();
        let recent = s.events(&EventFilter { since: Some(since.parse().unwrap()), ..filter(&["job.completed", "job.cancelled"], &[]) }).await.unwrap();
        assert_eq!(recent.iter().map(|e| e.job_id).collect::<Vec<_>>(), vec![gone.id]);

        // The pruner ages the log out with the jobs.
        sqlx::query("UPDATE job_transitions SET at = at - interval '2 days' WHERE state IN ('completed', 'active')").execute(s.pool()).await.unwrap();
        let report = s.prune(&crate::store::PruneConfig::default()).await.unwrap();
        assert_eq!(report.transitions, 4, "two completions and two claims, with the completed jobs' retention");
        assert!(s.events(&filter(&["job.completed"], &[])).await.unwrap().is_empty());
        assert!(s.events(&filter(&["job.started"], &[])).await.unwrap().is_empty());
        assert_eq!(s.events(&filter(&["job.cancelled"], &[])).await.unwrap().len(), 1);
        // Cancellations go with the discarded jobs' retention (a week by default).
        sqlx::query("UPDATE job_transitions SET at = at - interval '8 days' WHERE state = 'cancelled'").execute(s.pool()).await.unwrap();
        assert_eq!(s.prune(&crate::store::PruneConfig::default()).await.unwrap().transitions, 1);
        assert!(s.events(&filter(&["job.cancelled"], &[])).await.unwrap().is_empty());
    }

    /// A window ending exactly at an attempt's finish holds that attempt's timeout event
    /// (positioned a microsecond before it) and not its `job.failed`; the next window, from
    /// the first's end, holds the rest: a cursor walking windows misses neither.
    #[tokio::test]
    async fn a_window_ending_at_an_attempt_s_finish_keeps_the_timeout_before_it() {
        let db = TestDb::new().await;
        let s = &db.store;
        let mut job = NewJob::new("ev.slow", serde_json::json!([]));
        job.timeout_ms = Some(1_000);
        let id = s.enqueue(job).await.unwrap().job.id;
        let claim = ClaimRequest { worker_id: "w".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        s.claim(&claim).await.unwrap();
        sqlx::query("UPDATE jobs SET started_at = now() - interval '3 seconds' WHERE id = $1").bind(id).execute(s.pool()).await.unwrap();
        assert_eq!(s.rescue_expired(10).await.unwrap().timed_out, 1);
        let finished: jiff_sqlx::Timestamp = sqlx::query_scalar("SELECT finished_at FROM job_attempts WHERE job_id = $1").bind(id).fetch_one(s.pool()).await.unwrap();
        let finished = finished.to_jiff();
        let window = |after: String, until: Option<Timestamp>| EventFilter { after: Some(after), until, job_id: Some(id), limit: 100, ..Default::default() };
        let first = s.events(&window(position_at(Timestamp::UNIX_EPOCH), Some(finished))).await.unwrap();
        let kinds = |events: &[JobEvent]| events.iter().map(|e| e.event_type.clone()).filter(|t| t != "job.enqueued" && t != "job.started").collect::<Vec<_>>();
        assert_eq!(kinds(&first), ["job.timeout"], "{first:?}");
        let rest = s.events(&window(position_at(finished), None)).await.unwrap();
        assert_eq!(kinds(&rest), ["job.failed", "job.retrying"], "{rest:?}");
    }

    #[tokio::test]
    async fn a_cursor_walks_every_event_once_in_id_order() {
        let db = TestDb::new().await;
        let s = &db.store;
        let claim = |n: u32| ClaimRequest { worker_id: "w".into(), queues: vec!["q1".into()], limit: n, visibility_timeout: Duration::from_secs(60) };
        let jobs: Vec<Uuid> = s
            .enqueue_batch((0..4).map(|i| NewJob::new(if i == 3 { "ev.other" } else { "ev.a" }, serde_json::json!([i])).queue("q1")).collect())
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.job.id)
            .collect();
        s.claim(&claim(4)).await.unwrap();
        // Three completions in one statement (one row of the log, cut by pages of two), a failure.
        let done: Vec<Completion> = jobs[..3].iter().map(|id| Completion { id: *id, attempt: Some(1), worker_id: Some("w".into()), started_at: None, result: None }).collect();
        s.complete_batch(&done).await.unwrap();
        let failure = Failure { id: jobs[3], attempt: None, worker_id: None, outcome: Outcome::Retry(HandlerError::new("x.y", "boom")), error_code: None };
        s.fail(&failure).await.unwrap();
        s.cancel(jobs[3], None).await.unwrap();

        let start = position_at(Timestamp::UNIX_EPOCH);
        let until = Some(Timestamp::now() + jiff::SignedDuration::from_secs(3600));
        let from = |after: &str, limit: i64| EventFilter { after: Some(after.to_owned()), until, limit, ..Default::default() };
        let all = s.events(&from(&start, 100)).await.unwrap();
        let ids: Vec<&str> = all.iter().map(|e| e.id.as_str()).collect();
        // Enqueued, started (one claim of four), completed, failed and retrying, cancelled.
        assert_eq!(ids.len(), 4 + 4 + 3 + 2 + 1, "{ids:?}");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first, ids ascending: {ids:?}");
        assert_eq!(all[0].event_type, "job.enqueued");
        assert_eq!(all.last().map(|e| e.event_type.as_str()), Some("job.cancelled"));
        for e in &all {
            let off = position_time(&e.id).unwrap().duration_since(e.at).abs();
            assert!(off < jiff::SignedDuration::from_secs(1), "an id starts with its event's time: {} at {}", e.id, e.at);
        }
        let mut newest: Vec<String> = s.events(&EventFilter { limit: 100, ..Default::default() }).await.unwrap().into_iter().map(|e| e.id).collect();
        newest.sort();
        assert_eq!(newest, ids, "the same events, the same ids, either way");

        // Pages of two from the start, each after the last id of the one before, walk the
        // same events once each; so do pages after any event's id.
        let mut walked = Vec::new();
        let mut cursor = start.clone();
        loop {
            let page = s.events(&from(&cursor, 2)).await.unwrap();
            let Some(last) = page.last() else { break };
            cursor = last.id.clone();
            walked.extend(page.into_iter().map(|e| e.id));
        }
        assert_eq!(walked, ids);
        let rest: Vec<String> = s.events(&from(ids[4], 100)).await.unwrap().into_iter().map(|e| e.id).collect();
        assert_eq!(rest, ids[5..]);

        let other = EventFilter { job_types: vec!["ev.other".into()], ..from(&start, 100) };
        let kinds: Vec<String> = s.events(&other).await.unwrap().into_iter().map(|e| e.event_type).collect();
        assert_eq!(kinds, ["job.enqueued", "job.started", "job.failed", "job.retrying", "job.cancelled"]);
        let newest_other = EventFilter { job_types: vec!["ev.other".into()], limit: 100, ..Default::default() };
        assert_eq!(s.events(&newest_other).await.unwrap().len(), 5);
        let completed_a = EventFilter { types: vec!["job.completed".into()], job_types: vec!["ev.a".into()], ..from(&start, 100) };
        assert_eq!(s.events(&completed_a).await.unwrap().len(), 3);
        // Nothing at or after `until` is delivered.
        let early = EventFilter { until: Some(all[0].at - jiff::SignedDuration::from_secs(60)), ..from(&start, 100) };
        assert!(s.events(&early).await.unwrap().is_empty());
        assert!(matches!(s.events(&from("evt_12:x", 10)).await, Err(StoreError::Invalid { .. })));
    }

    #[tokio::test]
    async fn the_horizon_waits_for_a_transaction_still_open() {
        let db = TestDb::new().await;
        let s = &db.store;
        let h = s.event_horizon().await.unwrap();
        let now = Timestamp::now();
        assert!(h <= now - EVENT_SETTLE && h > now - EVENT_SETTLE - jiff::SignedDuration::from_secs(5), "{h} against {now}");
        // A writer whose transaction began a while ago may still commit events from then.
        use sqlx::Connection;
        let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let mut tx = other.begin().await.unwrap();
        let began: String = sqlx::query_scalar("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')").fetch_one(&mut *tx).await.unwrap();
        let began: Timestamp = began.parse().unwrap();
        tokio::time::sleep(EVENT_SETTLE + Duration::from_millis(500)).await;
        assert!(s.event_horizon().await.unwrap() <= began);
        tx.rollback().await.unwrap();
        assert!(s.event_horizon().await.unwrap() > began);
    }

    #[tokio::test]
    async fn schedules_expiries_and_queue_pauses_are_events_too() {
        let db = TestDb::new().await;
        let s = &db.store;
        let later = Timestamp::now() + jiff::SignedDuration::from_secs(3600);
        let scheduled = s.enqueue(NewJob { scheduled_at: Some(later), ..NewJob::new("ev.later", serde_json::json!([])).queue("q3") }).await.unwrap().job;
        let expiring = s.enqueue(NewJob::new("ev.ttl", serde_json::json!([])).queue("q3")).await.unwrap().job;
        sqlx::query("UPDATE jobs SET expires_at = now() - interval '1 second' WHERE id = $1").bind(expiring.id).execute(s.pool()).await.unwrap();
        assert_eq!(s.expire_due(10).await.unwrap(), 1);
        let actor = crate::store::Actor::new("ops@example.com");
        s.set_queue_paused("q3", true, &actor).await.unwrap();
        s.set_queue_paused("q3", false, &actor).await.unwrap();

        let start = position_at(Timestamp::UNIX_EPOCH);
        let until = Some(Timestamp::now() + jiff::SignedDuration::from_secs(60));
        let all = EventFilter { after: Some(start), until, queues: vec!["q3".into()], limit: 100, ..Default::default() };
        let jobs = s.events(&all).await.unwrap();
        let kinds: Vec<(&str, Uuid)> = jobs.iter().map(|e| (e.event_type.as_str(), e.job_id)).collect();
        assert_eq!(kinds, [("job.enqueued", scheduled.id), ("job.scheduled", scheduled.id), ("job.enqueued", expiring.id), ("job.expired", expiring.id)]);
        assert_eq!(jobs[1].scheduled_at.map(|t| t.as_second()), Some(later.as_second()));
        assert_eq!(jobs[3].error.as_ref().and_then(|e| e.get("type")).and_then(Value::as_str), Some("rebound.expired"));
        for e in &jobs[1..] {
            let one = s.events(&EventFilter { job_id: Some(e.job_id), types: vec![e.event_type.clone()], limit: 10, ..Default::default() }).await.unwrap();
            assert_eq!(one.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), [e.id.as_str()], "a job's own read finds the same event");
        }
        let paused = s.queue_events(&all).await.unwrap();
        let seen: Vec<(&str, &str, &str)> = paused.iter().map(|e| (e.event_type.as_str(), e.queue.as_str(), e.actor.as_str())).collect();
        assert_eq!(seen, [("queue.paused", "q3", "ops@example.com"), ("queue.resumed", "q3", "ops@example.com")]);
        assert!(paused[0].id < paused[1].id);
        let resumed = EventFilter { types: vec!["queue.resumed".into()], after: Some(paused[0].id.clone()), ..all.clone() };
        assert_eq!(s.queue_events(&resumed).await.unwrap().len(), 1);
        assert!(s.queue_events(&EventFilter { queues: vec!["elsewhere".into()], ..all.clone() }).await.unwrap().is_empty());
        assert!(s.queue_events(&EventFilter { job_types: vec!["ev.ttl".into()], ..all }).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn workers_coming_and_going_are_events() {
        use crate::store::WorkerRegistration;
        let db = TestDb::new().await;
        let s = &db.store;
        let reg = |id: &str| WorkerRegistration { id: id.into(), host: "h1".into(), pid: 7, queues: vec!["q1".into(), "q2".into()], concurrency: 10, version: "t".into() };
        s.register_worker(&reg("w1")).await.unwrap();
        s.register_worker(&reg("w1")).await.unwrap();
        s.register_worker(&reg("w2")).await.unwrap();
        s.deregister_worker("w1").await.unwrap();
        // w2 went silent long ago and is removed (by an operator or the pruner).
        sqlx::query("UPDATE workers SET last_heartbeat_at = now() - interval '2 days' WHERE id = 'w2'").execute(s.pool()).await.unwrap();
        assert_eq!(s.prune(&crate::store::PruneConfig::default()).await.unwrap().workers, 1);

        let until = Some(Timestamp::now() + jiff::SignedDuration::from_secs(60));
        let all = EventFilter { after: Some(position_at(Timestamp::UNIX_EPOCH)), until, limit: 100, ..Default::default() };
        let seen = s.worker_events(&all).await.unwrap();
        let kinds: Vec<(&str, &str)> = seen.iter().map(|e| (e.event_type.as_str(), e.worker_id.as_str())).collect();
        assert_eq!(kinds, [("worker.started", "w1"), ("worker.started", "w2"), ("worker.stopped", "w1"), ("worker.stopped", "w2")], "registering again is no new start");
        assert_eq!((&seen[0].data["queues"], &seen[0].data["concurrency"]), (&serde_json::json!(["q1", "q2"]), &serde_json::json!(10)));
        assert_eq!((seen[2].data["reason"].as_str(), seen[3].data["reason"].as_str()), (Some("shutdown"), Some("heartbeat_timeout")));
        assert!(seen[2].data["uptime_ms"].as_i64().is_some_and(|ms| ms >= 0));
        assert!(seen.windows(2).all(|w| w[0].id < w[1].id));
        let stopped = s.worker_events(&EventFilter { types: vec!["worker.stopped".into()], limit: 10, ..Default::default() }).await.unwrap();
        assert_eq!(stopped.iter().map(|e| e.worker_id.as_str()).collect::<Vec<_>>(), ["w2", "w1"], "newest first");
        assert_eq!(s.worker_events(&EventFilter { after: Some(seen[1].id.clone()), ..all.clone() }).await.unwrap().len(), 2);
        assert!(s.worker_events(&EventFilter { queues: vec!["q1".into()], ..all.clone() }).await.unwrap().is_empty(), "not queue events");
        sqlx::query("UPDATE worker_events SET at = at - interval '2 days'").execute(s.pool()).await.unwrap();
        assert_eq!(s.prune(&crate::store::PruneConfig::default()).await.unwrap().worker_events, 4);
        assert!(s.worker_events(&all).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn worker_heartbeats_and_quiet_spells_are_events() {
        use crate::store::{ProcessUsage, WorkerBeat, WorkerRegistration, WorkerStatus};
        let db = TestDb::new().await;
        let s = &db.store;
        let reg = WorkerRegistration { id: "w1".into(), host: "h1".into(), pid: 7, queues: vec!["q1".into()], concurrency: 4, version: "t".into() };
        s.register_worker(&reg).await.unwrap();
        // The first beat says what the process uses; the others cannot read it (or say nonsense).
        let beat = |status| {
            let usage = match status {
                WorkerStatus::Ready => ProcessUsage { memory_mb: Some(42.5), cpu_percent: Some(3.2) },
                WorkerStatus::Quiet => ProcessUsage { memory_mb: Some(f64::NAN), cpu_percent: Some(-1.0) },
                _ => ProcessUsage::default(),
            };
            WorkerBeat { worker_id: "w1", held: &[], known: &[], running: 2, status, detail: None, usage }
        };
        for status in [WorkerStatus::Ready, WorkerStatus::Quiet, WorkerStatus::Stopping] {
            s.worker_beat(&beat(status)).await.unwrap();
        }
        // Registering again (a restart under the same id) is no beat; its drain is a new spell.
        s.register_worker(&reg).await.unwrap();
        s.worker_beat(&beat(WorkerStatus::Degraded)).await.unwrap();
        s.worker_beat(&beat(WorkerStatus::Stopping)).await.unwrap();
        // An OJS client: its first beat registers it; saying it drains is its quiet spell.
        let client = ProcessUsage { memory_mb: Some(128.0), cpu_percent: None };
        assert_eq!(s.ojs_worker_beat("ojs-1", 3, false, client).await.unwrap(), None);
        assert!(s.request_worker_state("ojs-1", "quiet", &crate::store::Actor::new("ops")).await.unwrap());
        assert_eq!(s.ojs_worker_beat("ojs-1", 1, true, client).await.unwrap().as_deref(), Some("quiet"), "the operator's request is the answer");
        s.ojs_worker_beat("ojs-1", 0, true, client).await.unwrap();

        let until = Some(Timestamp::now() + jiff::SignedDuration::from_secs(60));
        let all = EventFilter { after: Some(position_at(Timestamp::UNIX_EPOCH)), until, limit: 100, ..Default::default() };
        let seen = s.worker_events(&all).await.unwrap();
        let kinds: Vec<(&str, &str, Option<&str>)> =
            seen.iter().map(|e| (e.event_type.as_str(), e.worker_id.as_str(), e.data["status"].as_str().or(e.data["reason"].as_str()))).collect();
        assert_eq!(
            kinds,
            [
                ("worker.started", "w1", None),
                ("worker.heartbeat", "w1", Some("ready")),
                ("worker.heartbeat", "w1", Some("quiet")),
                ("worker.quiet", "w1", Some("quiet")),
                ("worker.heartbeat", "w1", Some("stopping")),
                ("worker.heartbeat", "w1", Some("degraded")),
                ("worker.heartbeat", "w1", Some("stopping")),
                ("worker.quiet", "w1", Some("shutdown")),
                // Same statement, same time: events of one moment are ordered by type.
                ("worker.heartbeat", "ojs-1", Some("ready")),
                ("worker.started", "ojs-1", None),
                ("worker.heartbeat", "ojs-1", Some("stopping")),
                ("worker.quiet", "ojs-1", Some("shutdown")),
                ("worker.heartbeat", "ojs-1", Some("stopping")),
            ]
        );
        assert_eq!((&seen[1].data["active_jobs"], &seen[1].data["queues"], &seen[1].data["concurrency"]), (&serde_json::json!(2), &serde_json::json!(["q1"]), &serde_json::json!(4)));
        assert_eq!((&seen[3].data["active_jobs"], &seen[3].data["worker_id"]), (&serde_json::json!(2), &serde_json::json!("w1")));
        assert_eq!(seen[8].data["active_jobs"], serde_json::json!(3));
        // Usage is in a beat's event when the beat said it, and only what it could say.
        assert_eq!((&seen[1].data["memory_mb"], &seen[1].data["cpu_percent"]), (&serde_json::json!(42.5), &serde_json::json!(3.2)));
        for quiet_or_unknown in [&seen[2], &seen[4]] {
            let data = quiet_or_unknown.data.as_object().unwrap();
            assert!(!data.contains_key("memory_mb") && !data.contains_key("cpu_percent"), "{data:?}");
        }
        assert_eq!(seen[8].data["memory_mb"].as_f64(), Some(128.0));
        assert!(seen[8].data.get("cpu_percent").is_none());
        let ojs = s.workers().await.unwrap().into_iter().find(|w| w.id == "ojs-1").unwrap();
        assert_eq!((ojs.status, ojs.stopping, ojs.running), (WorkerStatus::Stopping, true, 0));
        assert_eq!(ojs.usage, client);
        // The registry keeps what the latest beat said: w1's last said nothing.
        let w1 = s.workers().await.unwrap().into_iter().find(|w| w.id == "w1").unwrap();
        assert_eq!(w1.usage, ProcessUsage::default());
        let quiet = s.worker_events(&EventFilter { types: vec!["worker.quiet".into()], limit: 10, ..Default::default() }).await.unwrap();
        assert_eq!(quiet.len(), 3);
    }

    /// An operator's retry of a finished job that did not succeed.
    async fn retry_by_hand(s: &Store, id: Uuid) {
        let ops = crate::store::Actor::new("ops@example.com");
        let report = s.retry_finished_jobs(&crate::store::JobSelection::Ids(vec![id]), &ops).await.unwrap();
        assert_eq!(report.succeeded, 1, "{report:?}");
    }

    #[tokio::test]
    async fn one_job_s_events_are_the_stream_s_events_of_that_job() {
        let db = TestDb::new().await;
        let s = &db.store;
        let claim = |q: &str| ClaimRequest { worker_id: "w9".into(), queues: vec![q.into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        // Failed by its worker, completed by its worker, cancelled while it ran.
        let failed = s.enqueue(NewJob::new("ev.one", serde_json::json!([])).queue("one1")).await.unwrap().job;
        s.claim(&claim("one1")).await.unwrap();
        let failure = Failure { id: failed.id, attempt: Some(1), worker_id: Some("w9".into()), outcome: Outcome::Retry(HandlerError::new("x.y", "boom")), error_code: None };
        s.fail(&failure).await.unwrap();
        let done = s.enqueue(NewJob::new("ev.one", serde_json::json!([])).queue("one2")).await.unwrap().job;
        s.claim(&claim("one2")).await.unwrap();
        s.complete(&Completion { id: done.id, attempt: Some(1), worker_id: Some("w9".into()), started_at: None, result: None }).await.unwrap();
        let cut = s.enqueue(NewJob::new("ev.one", serde_json::json!([])).queue("one3")).await.unwrap().job;
        s.claim(&claim("one3")).await.unwrap();
        s.cancel(cut.id, None).await.unwrap();
        // Dead-lettered after a beat; scheduled for later.
        let dead = s.enqueue(NewJob::new("ev.one", serde_json::json!([])).queue("one4")).await.unwrap().job;
        s.claim(&claim("one4")).await.unwrap();
        s.heartbeat(Some("w9"), &[dead.id], None).await.unwrap();
        let failure = Failure { id: dead.id, attempt: Some(1), worker_id: Some("w9".into()), outcome: Outcome::DeadLetter(HandlerError::new("x.y", "gone")), error_code: None };
        s.fail(&failure).await.unwrap();
        let later = NewJob { scheduled_at: Some(Timestamp::now() + jiff::SignedDuration::from_secs(3600)), ..NewJob::new("ev.one", serde_json::json!([])).queue("one5") };
        let later = s.enqueue(later).await.unwrap().job;
        // Snoozed, released by its worker, and cancelled while it ran then retried: each moves
        // the job row's attempt number back and keeps its start.
        let snoozed = s.enqueue(NewJob::new("ev.one", serde_json::json!([])).queue("one6")).await.unwrap().job;
        s.claim(&claim("one6")).await.unwrap();
        let snooze = Outcome::RetryAfter { at: Timestamp::now() + jiff::SignedDuration::from_secs(3600), error: None };
        s.fail(&Failure { id: snoozed.id, attempt: Some(1), worker_id: Some("w9".into()), outcome: snooze, error_code: None }).await.unwrap();
        let released = s.enqueue(NewJob::new("ev.one", serde_json::json!([])).queue("one7")).await.unwrap().job;
        s.claim(&claim("one7")).await.unwrap();
        s.release(&[(released.id, NamedRun::default())], Some("w9"), "shutting down").await.unwrap();
        let retried = s.enqueue(NewJob::new("ev.one", serde_json::json!([])).queue("one8")).await.unwrap().job;
        s.claim(&claim("one8")).await.unwrap();
        s.cancel(retried.id, None).await.unwrap();
        retry_by_hand(s, retried.id).await;

        let until = Some(Timestamp::now() + jiff::SignedDuration::from_secs(60));
        let all = EventFilter { after: Some(position_at(Timestamp::UNIX_EPOCH)), until, limit: 100, ..Default::default() };
        let stream = s.events(&all).await.unwrap();
        for id in [failed.id, done.id, cut.id, dead.id, later.id, snoozed.id, released.id, retried.id] {
            let theirs: Vec<(&str, &str)> = stream.iter().filter(|e| e.job_id == id).map(|e| (e.event_type.as_str(), e.id.as_str())).collect();
            let own = s.events(&EventFilter { job_id: Some(id), ..all.clone() }).await.unwrap();
            let own: Vec<(&str, &str)> = own.iter().map(|e| (e.event_type.as_str(), e.id.as_str())).collect();
            assert_eq!(own, theirs, "job {id}");
        }
        let kinds = |id| stream.iter().filter(move |e| e.job_id == id).map(|e| e.event_type.as_str()).collect::<Vec<_>>();
        assert_eq!(kinds(dead.id), ["job.enqueued", "job.started", "job.heartbeat", "job.failed", "job.dead_lettered"]);
        assert_eq!(kinds(later.id), ["job.enqueued", "job.scheduled"]);
    }

    #[tokio::test]
    async fn a_finished_job_s_heartbeats_are_found_through_every_attempt() {
        let db = TestDb::new().await;
        let s = &db.store;
        let job = s.enqueue(NewJob::new("ev.retried", serde_json::json!([])).queue("hb3")).await.unwrap().job;
        let claim = ClaimRequest { worker_id: "w1".into(), queues: vec!["hb3".into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        // A beat in the first attempt, which failed; one in the second, which completed; and
        // one of another job of the queue after both.
        s.claim(&claim).await.unwrap();
        assert_eq!(s.heartbeat(None, &[job.id], None).await.unwrap().extended, vec![job.id]);
        let failure = Failure { id: job.id, attempt: None, worker_id: None, outcome: Outcome::Retry(HandlerError::new("x.y", "boom")), error_code: None };
        s.fail(&failure).await.unwrap();
        sqlx::query("UPDATE jobs SET state = 'available', scheduled_at = now() WHERE id = $1").bind(job.id).execute(s.pool()).await.unwrap();
        assert_eq!(s.claim(&claim).await.unwrap().len(), 1);
        assert_eq!(s.heartbeat(None, &[job.id], None).await.unwrap().extended, vec![job.id]);
        s.complete(&Completion { id: job.id, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap();
        let later = s.enqueue(NewJob::new("ev.retried", serde_json::json!([])).queue("hb3")).await.unwrap().job;
        s.claim(&claim).await.unwrap();
        s.heartbeat(None, &[later.id], None).await.unwrap();

        let beats = |id| EventFilter { job_id: Some(id), types: vec!["job.heartbeat".into()], limit: 10, ..Default::default() };
        let of_job = s.events(&beats(job.id)).await.unwrap();
        let mut attempts: Vec<Option<i32>> = of_job.iter().map(|e| e.attempt).collect();
        attempts.sort();
        assert_eq!(attempts, [Some(1), Some(2)], "both attempts' beats, the first before the job's last start: {of_job:?}");
        assert_eq!(s.events(&beats(later.id)).await.unwrap().len(), 1, "a job still running: its beats up to now");

        // An execution cancelled while it ran is an attempt row of its own; retried by an
        // operator and run again, the job still has that execution's beat.
        let cut = s.enqueue(NewJob::new("ev.retried", serde_json::json!([])).queue("hb4")).await.unwrap().job;
        let claim = ClaimRequest { queues: vec!["hb4".into()], ..claim };
        s.claim(&claim).await.unwrap();
        s.heartbeat(None, &[cut.id], None).await.unwrap();
        s.cancel(cut.id, None).await.unwrap();
        retry_by_hand(s, cut.id).await;
        s.claim(&claim).await.unwrap();
        s.complete(&Completion { id: cut.id, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap();
        assert_eq!(s.events(&beats(cut.id)).await.unwrap().len(), 1, "the cancelled execution's beat");
        let history: Vec<(i32, String, Option<String>)> = s.attempts(cut.id).await.unwrap().into_iter().map(|a| (a.attempt, a.outcome, a.worker_id)).collect();
        assert_eq!(history, [(1, "cancelled".to_string(), Some("w1".to_string())), (1, "completed".to_string(), Some("w1".to_string()))]);
    }

    #[tokio::test]
    async fn every_lock_extension_is_a_heartbeat_event() {
        use crate::store::{WorkerBeat, WorkerRegistration, WorkerStatus};
        let db = TestDb::new().await;
        let s = &db.store;
        let a = s.enqueue(NewJob::new("ev.long", serde_json::json!([])).queue("hb1")).await.unwrap().job;
        let b = s.enqueue(NewJob::new("ev.other", serde_json::json!([])).queue("hb2")).await.unwrap().job;
        let idle = s.enqueue(NewJob::new("ev.long", serde_json::json!([])).queue("hb1")).await.unwrap().job;
        let claim = |w: &str, q: &str| ClaimRequest { worker_id: w.into(), queues: vec![q.into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        s.claim(&claim("w1", "hb1")).await.unwrap();
        s.claim(&claim("w2", "hb2")).await.unwrap();
        // The worker's own heartbeat, then an OJS one with its own visibility timeout for both
        // jobs (any holder), then one for a job nobody holds: that extends nothing.
        let reg = WorkerRegistration { id: "w1".into(), host: "h".into(), pid: 1, queues: vec!["hb1".into()], concurrency: 1, version: "t".into() };
        s.register_worker(&reg).await.unwrap();
        let beat = WorkerBeat { worker_id: "w1", held: &[a.id], known: &[a.id], running: 1, status: WorkerStatus::Ready, detail: None, usage: Default::default() };
        assert_eq!(s.worker_beat(&beat).await.unwrap().extended, vec![a.id]);
        let held = s.heartbeat(None, &[a.id, b.id], Some(Duration::from_secs(600))).await.unwrap();
        assert_eq!(held.extended.len(), 2);
        assert!(s.heartbeat(None, &[idle.id], None).await.unwrap().extended.is_empty());

        let until = Some(Timestamp::now() + jiff::SignedDuration::from_secs(60));
        let beats = EventFilter { types: vec!["job.heartbeat".into()], after: Some(position_at(Timestamp::UNIX_EPOCH)), until, limit: 100, ..Default::default() };
        let all = s.events(&beats).await.unwrap();
        let seen: Vec<(Uuid, Option<i32>, Option<&str>, &str)> =
            all.iter().map(|e| (e.job_id, e.attempt, e.worker_id.as_deref(), e.queue.as_str())).collect();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0], (a.id, Some(1), Some("w1"), "hb1"));
        assert!(seen[1..].contains(&(a.id, Some(1), Some("w1"), "hb1")) && seen[1..].contains(&(b.id, Some(1), Some("w2"), "hb2")), "{seen:?}");
        assert!(all.windows(2).all(|w| w[0].id < w[1].id));
        // Each event carries the deadline its extension set: the job's lock as it stands after
        // the last one, ten minutes on.
        let lock = s.job(b.id).await.unwrap().lock_expires_at.unwrap();
        let last_b = all.iter().rfind(|e| e.job_id == b.id).unwrap();
        assert_eq!(last_b.visible_until, Some(lock));
        assert!(lock > last_b.at + jiff::SignedDuration::from_secs(590));
        let first = all[0].visible_until.unwrap();
        assert!(first > all[0].at + jiff::SignedDuration::from_secs(55) && first < all[0].at + jiff::SignedDuration::from_secs(65), "the job's own timeout: {first}");

        // By queue, by job type, by job (cursor or newest first), and not when not asked for.
        let in_hb2 = s.events(&EventFilter { queues: vec!["hb2".into()], ..beats.clone() }).await.unwrap();
        assert_eq!(in_hb2.iter().map(|e| e.job_id).collect::<Vec<_>>(), vec![b.id]);
        let long = s.events(&EventFilter { job_types: vec!["ev.long".into()], ..beats.clone() }).await.unwrap();
        assert_eq!(long.iter().map(|e| e.job_id).collect::<Vec<_>>(), vec![a.id, a.id]);
        let of_a = s.events(&EventFilter { job_id: Some(a.id), ..beats.clone() }).await.unwrap();
        assert_eq!(of_a.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), all.iter().filter(|e| e.job_id == a.id).map(|e| e.id.as_str()).collect::<Vec<_>>());
        let newest_of_a = s.events(&EventFilter { job_id: Some(a.id), types: vec!["job.heartbeat".into()], limit: 1, ..Default::default() }).await.unwrap();
        assert_eq!(newest_of_a.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), [of_a[1].id.as_str()]);
        let rest = s.events(&EventFilter { after: Some(all[0].id.clone()), ..beats.clone() }).await.unwrap();
        assert_eq!(rest.len(), 2);
        let started = s.events(&EventFilter { types: vec!["job.started".into()], ..beats.clone() }).await.unwrap();
        assert!(started.iter().all(|e| e.event_type == "job.started") && started.len() == 2);

        // The pruner ages the log out with the completed jobs' retention.
        sqlx::query("UPDATE job_heartbeats SET at = at - interval '2 days'").execute(s.pool()).await.unwrap();
        assert_eq!(s.prune(&crate::store::PruneConfig::default()).await.unwrap().heartbeats, 3, "one row per statement, queue and holder");
        assert!(s.events(&beats).await.unwrap().is_empty());
    }
}
