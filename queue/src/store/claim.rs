//! Claiming work (`FOR UPDATE SKIP LOCKED`) and keeping claims alive with heartbeats.

use std::time::Duration;

use sqlx::Row;
use uuid::Uuid;

use super::complete::{release_ctes, release_sql};
use super::{Store, StoreError, jobs_from_rows, millis};
use crate::bounds;
use crate::job::Job;

/// How long a due unkeyed retry waits for a claim of its queue to take it straight from
/// `retryable` before the scheduler promotes it to `available` (see
/// migrations/…_retries_claimed_when_due.sql). The scheduler notifies the retry's queue when
/// it falls due, without writing it, so a worker claims it then whether busy or idle; one still
/// waiting after the window (its queue paused or at its limit, its workers busy with more
/// urgent jobs, or none listening) is promoted as before.
// A claim running while a retry is promoted misses it (the claim's snapshot saw it
// `retryable`; the promoted row no longer is), as one running while it fell due always could.
// A long window keeps that moment away from when clients fetch a retry: the OJS conformance
// suites fetch 0.2 to 2.5 s after its time. Promotion is for retries nothing claims: their
// queue paused or at its limit, more urgent work ahead of them, no worker listening.
pub const RETRY_CLAIM_WINDOW: Duration = Duration::from_secs(3);

/// A worker asking for up to `limit` jobs.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimRequest {
    pub worker_id: String,
    /// Drained in the order given: the first queue's jobs come first.
    pub queues: Vec<String>,
    pub limit: u32,
    /// How long the claim lasts without a heartbeat, unless the job sets its own.
    pub visibility_timeout: Duration,
}

// One statement per queue keeps each claim on the partial index in claim order
// (priority, then FIFO); a single statement over several queues would have to sort them all.
//
// The picked ids are matched with `= ANY(ARRAY(...))` rather than joined from a CTE: with
// the limit unknown, a join's generic plan guesses thousands of rows and hashes the whole
// table, so Postgres re-plans every claim instead; an id array is always looked up by key,
// so the prepared statement's generic plan is good for every limit.
//
// The queue's row is read (and locked) only if the queue is paused or rate-limited, so an
// unlimited queue pays one index probe, as for the pause check alone. A limited queue's
// claimers queue up on its row: `room` is what its limits still admit (a fixed window of
// `rate_max` starts, one of `throttle_max`, and `concurrency_limit` active jobs counted after
// the lock, see `rebound_active_jobs`; an operator's override, while it lasts, in place of
// the last), and the windows are advanced by what was claimed, all in this one statement. See migrations/…_queue_rate_limits.sql. In maintenance mode (one
// row in `maintenance`) every claim gets nothing. A job waiting for a slot of its rate-limit
// key (`rate_limited`) is not in the claimable set at all (see …_keyed_rate_limits.sql).
const CLAIM: &str = "
WITH q AS MATERIALIZED (
    SELECT name, paused,
           CASE WHEN override_concurrency IS NOT NULL AND (override_expires_at IS NULL OR override_expires_at > now())
                THEN override_concurrency ELSE concurrency_limit END AS concurrency_limit,
           rate_max, throttle_max,
           CASE WHEN rate_window_start > now() - LEAST(rate_period_ms, 31536000000) * interval '1 millisecond' THEN rate_window_start ELSE now() END AS rate_start,
           CASE WHEN rate_window_start > now() - LEAST(rate_period_ms, 31536000000) * interval '1 millisecond' THEN rate_window_used ELSE 0 END AS rate_used,
           CASE WHEN throttle_window_start > now() - LEAST(throttle_period_ms, 31536000000) * interval '1 millisecond' THEN throttle_window_start ELSE now() END AS throttle_start,
           CASE WHEN throttle_window_start > now() - LEAST(throttle_period_ms, 31536000000) * interval '1 millisecond' THEN throttle_window_used ELSE 0 END AS throttle_used
    FROM queues
    WHERE name = $1 AND (paused OR rate_max IS NOT NULL OR throttle_max IS NOT NULL OR concurrency_limit IS NOT NULL OR override_concurrency IS NOT NULL)
    FOR UPDATE
), room AS MATERIALIZED (
    SELECT CASE WHEN q.paused THEN 0 ELSE GREATEST(0, LEAST(
               $2::bigint,
               COALESCE(q.rate_max - q.rate_used, $2::bigint),
               COALESCE(q.throttle_max - q.throttle_used, $2::bigint),
               COALESCE(q.concurrency_limit - rebound_active_jobs(q.name), $2::bigint)))
           END AS n
    FROM q
), lim AS MATERIALIZED (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM maintenance) THEN 0 ELSE COALESCE((SELECT n FROM room), $2::bigint) END AS n
), retried AS MATERIALIZED (
    -- Due retries, claimed without a promotion (see …_retries_claimed_when_due.sql): those at
    -- least as urgent as the queue's most urgent available job, in claim order. The due set is
    -- what fell due within the scheduler's window (later ones it promotes), so it is sorted
    -- here, not walked in an index's order. An idle queue's retries cost an empty probe of
    -- `jobs_retry_due`, and the priority probe runs only if one is due.
    SELECT id FROM jobs
    WHERE state = 'retryable' AND rate_limit_key IS NULL AND queue = $1 AND scheduled_at <= now()
      AND (expires_at IS NULL OR expires_at > now())
      AND priority >= COALESCE((
          SELECT priority FROM jobs
          WHERE state = 'available' AND NOT rate_limited AND queue = $1
            AND (expires_at IS NULL OR expires_at > now())
          ORDER BY priority DESC, scheduled_at, id LIMIT 1), priority)
    ORDER BY priority DESC, scheduled_at, id
    LIMIT (SELECT n FROM lim)
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs j
    SET state = 'active', attempt = j.attempt + 1, started_at = now(), locked_by = $3,
        -- A retry claimed straight from `retryable` was ready when it fell due, as a promoted
        -- one is when promoted.
        enqueued_at = CASE WHEN j.state = 'retryable' THEN j.scheduled_at ELSE j.enqueued_at END,
        -- LEAST: a timeout stored before bounds::MAX_TIMEOUT_MS (7 days) existed must not
        -- overflow the interval and fail every claim of the queue.
        lock_expires_at = now() + LEAST(COALESCE(j.visibility_timeout_ms, $4), 604800000) * interval '1 millisecond',
        -- Remembered so heartbeats extend by the same amount.
        visibility_timeout_ms = COALESCE(j.visibility_timeout_ms, $4),
        updated_at = now()
    WHERE j.id = ANY(ARRAY(SELECT id FROM retried) || ARRAY(
        SELECT id FROM jobs
        WHERE state = 'available' AND NOT rate_limited AND queue = $1
          AND (expires_at IS NULL OR expires_at > now())
        ORDER BY priority DESC, scheduled_at, id
        LIMIT (SELECT n FROM lim) - (SELECT count(*) FROM retried)
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING j.*
), counted AS (
    UPDATE queues s
    SET rate_window_start = q.rate_start, rate_window_used = q.rate_used + (SELECT count(*) FROM claimed),
        throttle_window_start = q.throttle_start, throttle_window_used = q.throttle_used + (SELECT count(*) FROM claimed)
    FROM q
    WHERE s.name = q.name AND NOT q.paused AND (q.rate_max IS NOT NULL OR q.throttle_max IS NOT NULL)
)
SELECT * FROM claimed";

/// [`CLAIM`] that also names its transaction (`claim_xid`), for [`Store::claim_in_one`]: read
/// from the claim's own answer, it costs no round trip of its own (the update has an id
/// already), and a claim whose answer never came cannot have committed.
static CLAIM_NAMING_TX: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| CLAIM.replace("SELECT * FROM claimed", "SELECT *, pg_current_xact_id()::text AS claim_xid FROM claimed"));

impl Store {
    /// Claims up to `limit` available jobs, moving them to `active` with `attempt + 1` and a
    /// lock that expires after the visibility timeout. Two claimers never get the same job.
    /// Due retries without a rate-limit key are taken first, as they are (no promotion), if
    /// at least as urgent as the queue's most urgent available job (see
    /// [`RETRY_CLAIM_WINDOW`]). Jobs come back in claim order: queue order, then priority
    /// (high first), then FIFO.
    ///
    /// One queue is one statement. Several queues are claimed as [`Store::claim_in_one`] claims
    /// them, all or nothing: claimed one statement each, a later queue's claim whose answer was
    /// lost could have committed jobs that nobody knows of, while the earlier queues' jobs
    /// were returned as if nothing had happened.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Job>, StoreError> {
        let queue = match req.queues.as_slice() {
            _ if req.limit == 0 => return Ok(Vec::new()),
            [] => return Ok(Vec::new()),
            [queue] => queue,
            _ => return self.claim_in_one(req).await,
        };
        let vis = millis(req.visibility_timeout).clamp(1, bounds::MAX_TIMEOUT_MS);
        // A caller that gives up on the claim (a worker stopping) leaves nothing to commit later.
        let mut conn = self.for_answer().await?;
        let rows = sqlx::query(CLAIM).bind(queue).bind(i64::from(req.limit)).bind(&req.worker_id).bind(vis).fetch_all(&mut *conn).await;
        conn.done();
        let mut jobs = jobs_from_rows(&rows?)?;
        in_claim_order(&mut jobs);
        Ok(jobs)
    }

    /// [`Store::claim`] for a caller with nothing of its own to find lost claims by: the OJS
    /// API's fetch, whose client knows only the jobs in the answer. (The worker binary finds
    /// them by what it holds, see [`Store::release_orphans`].)
    ///
    /// The queues are claimed in one transaction, all or nothing, whose id each claim's answer
    /// carries. If the `COMMIT` then goes unanswered (the connection lost with it on the wire),
    /// the transaction may have committed: its jobs would sit active under the caller's name,
    /// which never saw them, until the rescuer charged each an attempt that never ran. (A claim
    /// whose own answer was lost never got its `COMMIT`: rolled back, nothing to find.)
    /// So a task of its own waits until the database can say how the transaction ended and,
    /// if it committed, hands back the jobs it claimed that are still as it left them,
    /// uncounted, with a `released` attempt row ([`UNANSWERED_CLAIM_REASON`]). The error is
    /// returned at once.
    pub async fn claim_in_one(&self, req: &ClaimRequest) -> Result<Vec<Job>, StoreError> {
        let mut tx = self.begin().await?;
        if req.queues.len() > 1 {
            // Each claim locks its queue's row if the queue is paused or limited, and here
            // holds it to the commit: taken in name order first, so that two fetches listing
            // the same queues in different orders cannot deadlock.
            sqlx::query(
                "SELECT name FROM queues WHERE name = ANY($1)
                   AND (paused OR rate_max IS NOT NULL OR throttle_max IS NOT NULL OR concurrency_limit IS NOT NULL OR override_concurrency IS NOT NULL)
                 ORDER BY name FOR UPDATE",
            )
            .bind(&req.queues)
            .execute(&mut *tx)
            .await?;
        }
        let vis = millis(req.visibility_timeout).clamp(1, bounds::MAX_TIMEOUT_MS);
        let mut claimed: Vec<Job> = Vec::new();
        let mut xid: Option<String> = None;
        for queue in &req.queues {
            let want = req.limit as usize - claimed.len();
            if want == 0 {
                break;
            }
            // An error drops the transaction, whose connection is then closed: rolled back.
            let rows = sqlx::query(CLAIM_NAMING_TX.as_str()).bind(queue).bind(want as i64).bind(&req.worker_id).bind(vis).fetch_all(&mut *tx).await?;
            if let Some(row) = rows.first() {
                xid = Some(row.try_get("claim_xid")?);
            }
            let mut jobs = jobs_from_rows(&rows)?;
            in_claim_order(&mut jobs);
            claimed.extend(jobs);
        }
        match tx.commit().await {
            Ok(()) => Ok(claimed),
            Err(e) => {
                // Nothing claimed, nothing to find.
                if let Some(xid) = xid {
                    self.background.spawn(hand_back_if_committed(self.clone(), xid, req.worker_id.clone()));
                }
                Err(e)
            }
        }
    }

    /// Extends the locks of the given active jobs held by `worker_id` (any holder when `None`,
    /// as the OJS heartbeat does not require the worker id to match). A job missing from both
    /// lists of the answer is no longer held (rescued, cancelled, finished). Like the worker's
    /// own heartbeat ([`Store::worker_beat`]) it never waits for a row another transaction is
    /// writing: an OJS worker acknowledges jobs in requests of its own while it beats, and a
    /// heartbeat that locked many rows in its own order could deadlock with a batch write.
    pub async fn heartbeat(&self, worker_id: Option<&str>, job_ids: &[Uuid], visibility: Option<Duration>) -> Result<HeldJobs, StoreError> {
        let mut held = HeldJobs::default();
        if job_ids.is_empty() {
            return Ok(held);
        }
        let rows: Vec<(bool, Uuid)> = sqlx::query_as(HEARTBEAT)
            .bind(job_ids)
            .bind(worker_id)
            .bind(visibility.map(millis))
            .fetch_all(&self.pool)
            .await?;
        for (extended, id) in rows {
            if extended { held.extended.push(id) } else { held.busy.push(id) }
        }
        Ok(held)
    }
}

/// The answer to [`Store::heartbeat`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldJobs {
    /// Jobs whose locks were extended.
    pub extended: Vec<Uuid>,
    /// Jobs still active and held whose rows another transaction was writing at that moment
    /// (almost always their own result): left alone rather than waited for, still held.
    pub busy: Vec<Uuid>,
}

const HEARTBEAT: &str = concat!(
    held_ctes!("($2::text IS NULL OR locked_by = $2)", "COALESCE($3, visibility_timeout_ms, 30000)"),
    "
SELECT true, id FROM extended
UNION ALL
SELECT false, id FROM busy"
);

/// A queue's claimed jobs in the order its claim picked them (priority, then FIFO): the
/// update returns them in whatever order it wrote them.
fn in_claim_order(jobs: &mut [Job]) {
    jobs.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.scheduled_at.cmp(&b.scheduled_at)).then(a.id.cmp(&b.id)));
}

/// Why a claim's jobs went back: its transaction committed with its answer lost
/// ([`Store::claim_in_one`]).
pub const UNANSWERED_CLAIM_REASON: &str = "the claim committed but its answer was lost: never delivered";

/// After a [`Store::claim_in_one`] whose end went unanswered: once the database says how
/// transaction `xid` ended, hands back, if it committed, the jobs it claimed for `worker_id`
/// that nothing has touched since (their row version is still the claim's). Tries for about
/// a minute with growing waits (the database may be restarting), then gives up, logging it:
/// the jobs are then charged when their locks lapse.
async fn hand_back_if_committed(store: Store, xid: String, worker_id: String) {
    let mut wait = Duration::from_millis(50);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match settle_claim(&store, &xid, &worker_id).await {
            Ok(Some(released)) => {
                if released > 0 {
                    tracing::warn!(worker = worker_id, count = released, "a claim committed but its answer was lost; its jobs were handed back uncounted");
                }
                return;
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(worker = worker_id, error = %e, "looking up an unanswered claim failed; trying again"),
        }
        if tokio::time::Instant::now() + wait > deadline {
            tracing::error!(worker = worker_id, xid, "could not learn whether an unanswered claim committed; any jobs it claimed are charged when their locks lapse");
            return;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

/// One look at transaction `xid`: `None` while it is still running, else how many of its
/// jobs were handed back (none if it did not commit).
async fn settle_claim(store: &Store, xid: &str, worker_id: &str) -> Result<Option<usize>, StoreError> {
    let status: Option<String> = sqlx::query_scalar("SELECT pg_xact_status($1::xid8)").bind(xid).fetch_one(&store.pool).await?;
    match status.as_deref() {
        Some("in progress") => Ok(None),
        Some("committed") => {
            // A row the claim wrote and nothing rewrote since (a heartbeat or a result from a
            // caller that did see it would have) still carries the claim's transaction id. One
            // statement, so a row rewritten while it waits for it (rescued, then claimed again
            // by a fetch that was answered) is checked again and left to its new holder.
            let released = sqlx::query(release_sql!("j.locked_by = $2 AND j.xmin = xid($1::xid8)"))
                .bind(xid)
                .bind(worker_id)
                .bind(UNANSWERED_CLAIM_REASON)
                .fetch_all(&store.pool)
                .await?;
            Ok(Some(released.len()))
        }
        // Aborted, or so old its status is gone: nothing of it stands.
        _ => Ok(Some(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fetch_claim_names_its_transaction() {
        assert!(CLAIM_NAMING_TX.contains("pg_current_xact_id()::text AS claim_xid FROM claimed"), "the claim's last line changed: {}", &CLAIM[CLAIM.len() - 40..]);
    }
}
