//! Job events, read back from what the store already records: `jobs.created_at` (enqueued),
//! `job_attempts` (failed, discarded, dead-lettered, released, snoozed) and `job_finishes`
//! (completed, cancelled: one row per statement and queue, written by a trigger; see its
//! migration). Events from every process (server, workers) appear alike.

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;
use uuid::Uuid;

use super::{Store, StoreError, ts};

/// Every event type [`Store::events`] knows.
pub const EVENT_TYPES: [&str; 8] = [
    "job.enqueued",
    "job.completed",
    "job.failed",
    "job.discarded",
    "job.dead_lettered",
    "job.released",
    "job.snoozed",
    "job.cancelled",
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
    /// `{type, code, message}` of a failed attempt.
    pub error: Option<Value>,
    pub worker_id: Option<String>,
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

// An event's id from its position (a timestamptz expression) and the rest of its key.
macro_rules! evid {
    ($at:literal, $($rest:literal),+) => {
        concat!("('evt_' || lpad(((extract(epoch FROM ", $at, ") * 1000000)::bigint)::text, 16, '0') || ':' || ", $($rest),+, ") COLLATE \"C\"")
    };
}

// The jobs that became `$state` (event `$event`, at `$at` on the job row), at most `limit`
// in the given order: from `job_finishes` by time, over all queues or per asked-for queue;
// or, for one job, from its row. Before the jobs are joined the id lacks its attempt: a job
// finishes once per row of the log, so that prefix orders it among ids alike.
macro_rules! finished {
    ($state:literal, $event:literal, $at:literal, $order:literal) => {
        concat!(
            "(SELECT l.at, l.state, u.job_id FROM job_finishes l CROSS JOIN LATERAL unnest(l.job_ids) AS u(job_id)
      WHERE (cardinality($1::text[]) = 0 OR '", $event, "' = ANY($1)) AND cardinality($2::text[]) = 0 AND $3::uuid IS NULL
        AND l.state = '", $state, "' AND ($4::timestamptz IS NULL OR l.at >= $4::timestamptz)
        AND ($8::timestamptz IS NULL OR l.at < $8::timestamptz)
        AND ($7::text IS NULL OR ", evid!("l.at", "'", $event, ":' || u.job_id"), " > $7)
        AND (cardinality($6::text[]) = 0 OR EXISTS (SELECT 1 FROM jobs t WHERE t.id = u.job_id AND t.type = ANY($6)))
      ORDER BY ", $order, " LIMIT $5)
     UNION ALL
     (SELECT x.at, x.state, x.job_id
      FROM (SELECT DISTINCT name FROM unnest($2::text[]) AS n(name)) q
      CROSS JOIN LATERAL (
          SELECT l.at, l.state, u.job_id FROM job_finishes l CROSS JOIN LATERAL unnest(l.job_ids) AS u(job_id)
          WHERE l.queue = q.name AND l.state = '", $state, "' AND ($4::timestamptz IS NULL OR l.at >= $4::timestamptz)
            AND ($8::timestamptz IS NULL OR l.at < $8::timestamptz)
            AND ($7::text IS NULL OR ", evid!("l.at", "'", $event, ":' || u.job_id"), " > $7)
            AND (cardinality($6::text[]) = 0 OR EXISTS (SELECT 1 FROM jobs t WHERE t.id = u.job_id AND t.type = ANY($6)))
          ORDER BY ", $order, " LIMIT $5) x
      WHERE (cardinality($1::text[]) = 0 OR '", $event, "' = ANY($1)) AND $3::uuid IS NULL)
     UNION ALL
     (SELECT j.", $at, ", j.state, j.id FROM jobs j
      WHERE (cardinality($1::text[]) = 0 OR '", $event, "' = ANY($1)) AND j.id = $3::uuid
        AND j.state = '", $state, "' AND j.", $at, " IS NOT NULL
        AND (cardinality($2::text[]) = 0 OR j.queue = ANY($2))
        AND (cardinality($6::text[]) = 0 OR j.type = ANY($6))
        AND ($4::timestamptz IS NULL OR j.", $at, " >= $4::timestamptz)
        AND ($8::timestamptz IS NULL OR j.", $at, " < $8::timestamptz))"
        )
    };
}

// Each branch takes its own first `limit` rows in the order asked for through an index, so
// the merge stays cheap; a branch whose type is not asked for is cut by a one-time filter.
// Newest first (no cursor) each branch reads its own index order; oldest first (`after`,
// `$7`) every branch's order agrees with the ids', which the merge and the cursor use: a
// branch cut at `limit` never leaves out an event that sorts before one it returned.
macro_rules! events_sql {
    ($enqueued_order:literal, $attempts_order:literal, $finished_order:literal, $order:literal) => {
        concat!(
            "
SELECT * FROM (
    (SELECT ('evt_' || lpad((('x' || left(replace(j.id::text, '-', ''), 12))::bit(48)::bigint * 1000)::text, 16, '0')
             || ':job.enqueued:' || j.id || ':0') COLLATE \"C\" AS id,
            'job.enqueued'::text AS type, j.created_at AS at, j.id AS job_id, j.type AS job_type, j.queue,
            NULL::int AS attempt, NULL::bigint AS duration_ms, NULL::jsonb AS error, NULL::text AS worker_id
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
    (SELECT e.id, e.type, e.at, e.job_id, e.job_type, e.queue, e.attempt, e.duration_ms, e.error, e.worker_id
     FROM (SELECT ", evid!("e0.at", "e0.type || ':' || e0.job_id || ':' || e0.attempt"), " AS id, e0.* FROM (
         SELECT CASE
                    WHEN a.outcome = 'retried' THEN 'job.failed'
                    WHEN a.outcome = 'released' THEN 'job.released'
                    WHEN a.outcome = 'snoozed' THEN 'job.snoozed'
                    WHEN a.outcome = 'dead_lettered'
                         OR (a.outcome IN ('exhausted', 'non_retryable') AND p.policy->>'on_exhaustion' = 'dead_letter')
                         THEN 'job.dead_lettered'
                    ELSE 'job.discarded'
                END AS type,
                a.finished_at AS at, a.job_id, j.type AS job_type, j.queue, a.attempt,
                (EXTRACT(EPOCH FROM (a.finished_at - a.started_at)) * 1000)::bigint AS duration_ms,
                CASE WHEN a.error_type IS NULL THEN NULL
                     ELSE jsonb_build_object('type', a.error_type, 'code', a.error_code, 'message', a.error_message) END AS error,
                a.worker_id, a.id AS seq
         FROM job_attempts a JOIN jobs j ON j.id = a.job_id LEFT JOIN policy_snapshots p ON p.id = a.policy_id
         WHERE (cardinality($2::text[]) = 0 OR j.queue = ANY($2))
           AND (cardinality($6::text[]) = 0 OR j.type = ANY($6))
           -- Decided once: asked only for events no attempt row makes, the branch reads nothing
           -- (filtering on the computed type below would walk every attempt to find none).
           AND (cardinality($1::text[]) = 0
                OR $1 && ARRAY['job.failed', 'job.released', 'job.snoozed', 'job.dead_lettered', 'job.discarded'])
           AND ($3::uuid IS NULL OR a.job_id = $3)
           AND ($4::timestamptz IS NULL OR a.finished_at >= $4::timestamptz)
           AND ($8::timestamptz IS NULL OR a.finished_at < $8::timestamptz)
     ) e0) e
     WHERE (cardinality($1::text[]) = 0 OR e.type = ANY($1))
       AND ($7::text IS NULL OR e.id > $7)
     ORDER BY ", $attempts_order, " LIMIT $5)
    UNION ALL
    -- Completions and cancellations (see `finished!`); the jobs are looked up by key.
    (SELECT ", evid!("f.at", "CASE WHEN f.state = 'completed' THEN 'job.completed:' ELSE 'job.cancelled:' END || j.id || ':' || CASE WHEN f.state = 'completed' THEN j.attempt ELSE 0 END"), ",
            CASE WHEN f.state = 'completed' THEN 'job.completed' ELSE 'job.cancelled' END, f.at, j.id, j.type, j.queue,
            CASE WHEN f.state = 'completed' THEN j.attempt END,
            CASE WHEN f.state = 'completed' THEN (EXTRACT(EPOCH FROM (j.completed_at - j.started_at)) * 1000)::bigint END,
            NULL::jsonb,
            CASE WHEN f.state = 'completed' THEN j.locked_by END
     FROM (",
            finished!("completed", "job.completed", "completed_at", $finished_order),
            "
     UNION ALL
     ",
            finished!("cancelled", "job.cancelled", "cancelled_at", $finished_order),
            ") f JOIN jobs j ON j.id = f.job_id)
) events
ORDER BY ", $order, "
LIMIT $5"
        )
    };
}

const NEWEST_FIRST: &str = events_sql!("j.id DESC", "e.seq DESC", "l.at DESC", "at DESC, job_id DESC");
const AFTER: &str = events_sql!("j.id", "e.id", "l.at, u.job_id", "id");

impl Store {
    /// Job events matching `filter`: newest first, or with [`EventFilter::after`] oldest first
    /// from there.
    pub async fn events(&self, filter: &EventFilter) -> Result<Vec<JobEvent>, StoreError> {
        let since = match &filter.after {
            Some(after) => {
                let from = position_time(after)?;
                Some(filter.since.map_or(from, |s| s.max(from)))
            }
            None => filter.since,
        };
        let rows = sqlx::query(if filter.after.is_some() { AFTER } else { NEWEST_FIRST })
            .bind(&filter.types)
            .bind(&filter.queues)
            .bind(filter.job_id)
            .bind(since.map(|t| t.to_string()))
            .bind(filter.limit.clamp(1, 10_000))
            .bind(&filter.job_types)
            .bind(filter.after.as_deref())
            .bind(filter.until.map(|t| t.to_string()))
            .fetch_all(&self.pool)
            .await?;
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
    use crate::store::{ClaimRequest, Completion, Failure};
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
        s.complete(&Completion { id: a.id, attempt: None, worker_id: None, result: None }).await.unwrap();
        s.claim(&claim("q2")).await.unwrap();
        let failure = Failure { id: b.id, attempt: None, worker_id: None, outcome: Outcome::Retry(HandlerError::new("x.y", "boom")), error_code: Some("E1".into()) };
        s.fail(&failure).await.unwrap();

        let all = s.events(&filter(&[], &[])).await.unwrap();
        let kinds: Vec<&str> = all.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(kinds.len(), 4, "{kinds:?}");
        assert!(kinds.contains(&"job.completed") && kinds.contains(&"job.failed"));
        let done = s.events(&filter(&["job.completed"], &["q1"])).await.unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].job_id, done[0].attempt), (a.id, Some(1)));
        assert!(done[0].duration_ms.is_some());
        let failed = s.events(&filter(&["job.failed"], &[])).await.unwrap();
        assert_eq!(failed[0].error.as_ref().and_then(|e| e.get("code")).and_then(|c| c.as_str()), Some("E1"));
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
        let done: Vec<Completion> = q1.iter().map(|id| Completion { id: *id, attempt: Some(1), worker_id: Some("w".into()), result: None }).collect();
        assert_eq!(s.complete_batch(&done).await.unwrap().len(), 3);
        s.claim(&claim("q2", 1)).await.unwrap();
        s.complete(&Completion { id: q2.id, attempt: None, worker_id: None, result: None }).await.unwrap();
        s.cancel(gone.id, None).await.unwrap();
        let rows: Vec<(String, String, i32)> = sqlx::query_as("SELECT queue, state::text, cardinality(job_ids) FROM job_finishes ORDER BY id")
            .fetch_all(s.pool())
            .await
            .unwrap();
        assert_eq!(rows, vec![("q1".into(), "completed".into(), 3), ("q2".into(), "completed".into(), 1), ("q2".into(), "cancelled".into(), 1)]);
        // Editing a finished job is no new finish.
        sqlx::query("UPDATE jobs SET result = '{}' WHERE state IN ('completed', 'cancelled')").execute(s.pool()).await.unwrap();
        let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM job_finishes").fetch_one(s.pool()).await.unwrap();
        assert_eq!(logged, 3);

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
        let since: String = sqlx::query_scalar("SELECT to_char(max(at) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM job_finishes")
            .fetch_one(s.pool())
            .await
            .unwrap();
        let recent = s.events(&EventFilter { since: Some(since.parse().unwrap()), ..filter(&["job.completed", "job.cancelled"], &[]) }).await.unwrap();
        assert_eq!(recent.iter().map(|e| e.job_id).collect::<Vec<_>>(), vec![gone.id]);

        // The pruner ages the log out with the jobs.
        sqlx::query("UPDATE job_finishes SET at = at - interval '2 days' WHERE state = 'completed'").execute(s.pool()).await.unwrap();
        let report = s.prune(&crate::store::PruneConfig::default()).await.unwrap();
        assert_eq!(report.finishes, 2);
        assert!(s.events(&filter(&["job.completed"], &[])).await.unwrap().is_empty());
        assert_eq!(s.events(&filter(&["job.cancelled"], &[])).await.unwrap().len(), 1);
        // Cancellations go with the discarded jobs' retention (a week by default).
        sqlx::query("UPDATE job_finishes SET at = at - interval '8 days' WHERE state = 'cancelled'").execute(s.pool()).await.unwrap();
        assert_eq!(s.prune(&crate::store::PruneConfig::default()).await.unwrap().finishes, 1);
        assert!(s.events(&filter(&["job.cancelled"], &[])).await.unwrap().is_empty());
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
        let done: Vec<Completion> = jobs[..3].iter().map(|id| Completion { id: *id, attempt: Some(1), worker_id: Some("w".into()), result: None }).collect();
        s.complete_batch(&done).await.unwrap();
        let failure = Failure { id: jobs[3], attempt: None, worker_id: None, outcome: Outcome::Retry(HandlerError::new("x.y", "boom")), error_code: None };
        s.fail(&failure).await.unwrap();
        s.cancel(jobs[3], None).await.unwrap();

        let start = position_at(Timestamp::UNIX_EPOCH);
        let until = Some(Timestamp::now() + jiff::SignedDuration::from_secs(3600));
        let from = |after: &str, limit: i64| EventFilter { after: Some(after.to_owned()), until, limit, ..Default::default() };
        let all = s.events(&from(&start, 100)).await.unwrap();
        let ids: Vec<&str> = all.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids.len(), 4 + 3 + 1 + 1, "{ids:?}");
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
        assert_eq!(kinds, ["job.enqueued", "job.failed", "job.cancelled"]);
        let newest_other = EventFilter { job_types: vec!["ev.other".into()], limit: 100, ..Default::default() };
        assert_eq!(s.events(&newest_other).await.unwrap().len(), 3);
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

}
