//! Job events, read back from what the store already records: `jobs.created_at` (enqueued),
//! `job_attempts` (failed, discarded, dead-lettered, released, snoozed), `jobs.completed_at`
//! (completed) and `jobs.cancelled_at` (cancelled). Nothing extra is written on the hot path, and events from
//! every process (server, workers) appear alike.

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
    /// Event types from [`EVENT_TYPES`]; unknown names match nothing.
    pub types: Vec<String>,
    pub queues: Vec<String>,
    pub job_id: Option<Uuid>,
    /// Only events at or after this time.
    pub since: Option<Timestamp>,
    /// At most this many (1..=1000), newest first.
    pub limit: i64,
}

/// Something that happened to a job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobEvent {
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

// Each branch takes its own newest `limit` rows through an index, so the merge stays cheap;
// a branch whose type is not asked for is cut by a one-time filter.
const EVENTS: &str = "
SELECT * FROM (
    (SELECT 'job.enqueued'::text AS type, j.created_at AS at, j.id AS job_id, j.type AS job_type, j.queue,
            NULL::int AS attempt, NULL::bigint AS duration_ms, NULL::jsonb AS error, NULL::text AS worker_id
     FROM jobs j
     WHERE (cardinality($1::text[]) = 0 OR 'job.enqueued' = ANY($1))
       AND (cardinality($2::text[]) = 0 OR j.queue = ANY($2))
       AND ($3::uuid IS NULL OR j.id = $3)
       AND ($4::timestamptz IS NULL OR j.created_at >= $4::timestamptz)
     ORDER BY j.id DESC LIMIT $5)
    UNION ALL
    (SELECT e.type, e.at, e.job_id, e.job_type, e.queue, e.attempt, e.duration_ms, e.error, e.worker_id
     FROM (
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
           AND ($3::uuid IS NULL OR a.job_id = $3)
           AND ($4::timestamptz IS NULL OR a.finished_at >= $4::timestamptz)
     ) e
     WHERE cardinality($1::text[]) = 0 OR e.type = ANY($1)
     ORDER BY e.seq DESC LIMIT $5)
    UNION ALL
    -- A completing execution is recorded in its job row (see `job_history`).
    (SELECT 'job.completed'::text, j.completed_at, j.id, j.type, j.queue, j.attempt,
            (EXTRACT(EPOCH FROM (j.completed_at - j.started_at)) * 1000)::bigint, NULL::jsonb, j.locked_by
     FROM jobs j
     WHERE (cardinality($1::text[]) = 0 OR 'job.completed' = ANY($1))
       AND j.state = 'completed'
       AND (cardinality($2::text[]) = 0 OR j.queue = ANY($2))
       AND ($3::uuid IS NULL OR j.id = $3)
       AND ($4::timestamptz IS NULL OR j.completed_at >= $4::timestamptz)
     ORDER BY j.completed_at DESC LIMIT $5)
    UNION ALL
    (SELECT 'job.cancelled'::text, j.cancelled_at, j.id, j.type, j.queue, NULL::int, NULL::bigint, NULL::jsonb, NULL::text
     FROM jobs j
     WHERE (cardinality($1::text[]) = 0 OR 'job.cancelled' = ANY($1))
       AND j.state = 'cancelled' AND j.cancelled_at IS NOT NULL
       AND (cardinality($2::text[]) = 0 OR j.queue = ANY($2))
       AND ($3::uuid IS NULL OR j.id = $3)
       AND ($4::timestamptz IS NULL OR j.cancelled_at >= $4::timestamptz)
     ORDER BY j.cancelled_at DESC LIMIT $5)
) events
ORDER BY at DESC, job_id DESC
LIMIT $5";

impl Store {
    /// Job events matching `filter`, newest first.
    pub async fn events(&self, filter: &EventFilter) -> Result<Vec<JobEvent>, StoreError> {
        let rows = sqlx::query(EVENTS)
            .bind(&filter.types)
            .bind(&filter.queues)
            .bind(filter.job_id)
            .bind(filter.since.map(|t| t.to_string()))
            .bind(filter.limit.clamp(1, 1000))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(JobEvent {
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
}
