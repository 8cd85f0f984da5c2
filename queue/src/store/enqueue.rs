//! Enqueue: single, batch (all-or-nothing), and unique keys with reject / ignore / replace.

use std::collections::HashMap;

use serde_json::{Value, json};
use sqlx::PgConnection;
use uuid::Uuid;

use sqlx::Row;

use super::{Actor, NamedRun, Store, StoreError, copy_in, Window, job_from_row, millis, ts, ts_opt};
use crate::job::{Job, JobRateLimit, JobState, NewJob, OnConflict, UniqueSpec};
use crate::policy::{self, PolicyPatch, RetryPolicy};

/// What an enqueue did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// A new job was created.
    Created,
    /// A live job with the same unique key exists and was returned instead (`ignore`).
    Existing,
    /// A live job with the same unique key was cancelled and this one created (`replace`).
    Replaced { old: Uuid },
}

/// The job an enqueue produced or found.
#[derive(Clone, Debug, PartialEq)]
pub struct Enqueued {
    pub job: Job,
    pub outcome: EnqueueOutcome,
}

/// Validates everything that can be checked without the database.
pub(super) fn check(job: &NewJob) -> Result<Option<i32>, StoreError> {
    job.validate()?;
    match &job.retry {
        Some(patch) => {
            let max_attempts = check_retry_patch(patch, "options.retry")?;
            Ok(patch.max_attempts.map(|_| max_attempts))
        }
        None => Ok(None),
    }
}

/// A job's own retry override, checked over the defaults so a bad one is refused when it is
/// set, not discovered at the first failure. The error names the field under `prefix`.
/// Returns the max attempts it resolves to.
pub(super) fn check_retry_patch(patch: &PolicyPatch, prefix: &str) -> Result<i32, crate::policy::PolicyError> {
    let resolved = policy::resolve(&RetryPolicy::default(), None, Some(patch)).map_err(|mut e| {
        e.field = format!("{prefix}.{}", e.field);
        e
    })?;
    // `validate` holds it to MAX_ATTEMPTS already; checked all the same, as a wrap to a
    // negative budget would be stored silently.
    i32::try_from(resolved.policy.max_attempts).map_err(|_| {
        crate::policy::PolicyError::new(format!("{prefix}.max_attempts"), format!("must be <= {}, got {}", policy::patch::MAX_ATTEMPTS, resolved.policy.max_attempts))
    })
}

/// A stored policy's `max_attempts` is read by `rebound_policy_max_attempts` (see
/// migrations/…_policy_max_attempts_read.sql): a row saved before the bound (or by hand) must
/// not fail every enqueue of its type.
const INSERT_ONE: &str = "
INSERT INTO jobs (id, type, queue, args, meta, extra, priority, tags, state, max_attempts, retry,
                  timeout_ms, visibility_timeout_ms, unique_key, unique_states, unique_until,
                  scheduled_at, expires_at, enqueued_at, rate_limit_key, rate_limit_on_limit)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, s.state,
       COALESCE($9,
                (SELECT rebound_policy_max_attempts(policy) FROM retry_policies WHERE job_type = $2),
                (SELECT rebound_policy_max_attempts(policy) FROM retry_policies WHERE job_type = '*'),
                3),
       $10, $11, $12, $13, $14,
       CASE WHEN $15::bigint IS NULL THEN NULL ELSE now() + $15 * interval '1 millisecond' END,
       COALESCE($16::timestamptz, now()), $17::timestamptz,
       CASE WHEN s.state = 'available' THEN now() END, $19, $20
FROM (SELECT CASE WHEN $18 THEN 'pending'::job_state
                  WHEN $16::timestamptz > now() THEN 'scheduled'::job_state
                  ELSE 'available'::job_state END AS state) AS s
ON CONFLICT (id) DO NOTHING
RETURNING id, state, max_attempts, scheduled_at, expires_at, created_at";

/// Inserts one job. A keyed job (`rate_limit`) takes two statements more: `conn` must then be
/// in a transaction, or a failed insert could leave its key's limit changed.
pub(super) async fn insert_one(conn: &mut PgConnection, job: &NewJob, max_attempts: Option<i32>) -> Result<Job, StoreError> {
    record_rate_limit_keys(conn, std::iter::once(job)).await?;
    let id = job.id.unwrap_or_else(Uuid::now_v7);
    let unique = job.unique.as_ref();
    let row = sqlx::query(INSERT_ONE)
        .bind(id)
        .bind(&job.job_type)
        .bind(&job.queue)
        .bind(&job.args)
        .bind(&job.meta)
        .bind(&job.extra)
        .bind(job.priority)
        .bind(&job.tags)
        .bind(max_attempts)
        .bind(job.retry.as_ref().map(|p| p.to_json()))
        .bind(job.timeout_ms)
        .bind(job.visibility_timeout_ms)
        .bind(unique.map(|u| u.key.clone()))
        .bind(unique.map(|u| if u.states.is_empty() { UniqueSpec::default_states() } else { u.states.clone() }))
        .bind(unique.and_then(|u| u.period).map(millis))
        .bind(job.scheduled_at.map(|t| t.to_string()))
        .bind(job.expires_at.map(|t| t.to_string()))
        .bind(job.pending)
        .bind(job.rate_limit.as_ref().map(|r| r.key.as_str()))
        .bind(job.rate_limit.as_ref().and_then(|r| r.on_limit.stored()))
        .fetch_optional(&mut *conn)
        .await?;
    match row {
        // Built from what was sent, not decoded back: nothing about the stored args can fail
        // the answer of an enqueue that has already happened.
        Some(row) => {
            let mut stored = stored_job(job.clone(), id, &row)?;
            read_back_settled(conn, &mut [&mut stored]).await?;
            Ok(stored)
        }
        None => Err(StoreError::Duplicate { reason: format!("a job with id {id} already exists"), existing: Some(id) }),
    }
}

/// The stored job of an insert: what Postgres decided (state, max attempts, times at its
/// precision, from the `RETURNING` columns `state, max_attempts, scheduled_at, expires_at,
/// created_at`) and the rest moved over from the [`NewJob`], which is exactly what was stored.
/// (`enqueued_at` and `updated_at` are the statement's `now()`, as `created_at` is.)
fn stored_job(job: NewJob, id: Uuid, row: &sqlx::postgres::PgRow) -> Result<Job, StoreError> {
    let mut stored = job.into_job(id, row.try_get("state")?, row.try_get("max_attempts")?, ts(row, "created_at")?);
    stored.scheduled_at = ts(row, "scheduled_at")?;
    stored.expires_at = ts_opt(row, "expires_at")?;
    Ok(stored)
}

/// Enqueue with a unique key, inside the caller's transaction.
async fn insert_unique(conn: &mut PgConnection, job: &NewJob, spec: &UniqueSpec, max_attempts: Option<i32>) -> Result<Enqueued, StoreError> {
    // Two enqueues of the same key must not both see "no clash": serialize them on the key.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('rebound.unique.' || $1, 0))")
        .bind(&spec.key)
        .execute(&mut *conn)
        .await?;
    let states = if spec.states.is_empty() { UniqueSpec::default_states() } else { spec.states.clone() };
    let existing = sqlx::query(
        "SELECT * FROM jobs WHERE unique_key = $1 AND state = ANY($2)
           AND (unique_until IS NULL OR unique_until > now())
         ORDER BY id DESC LIMIT 1 FOR UPDATE",
    )
    .bind(&spec.key)
    .bind(&states)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(existing) = existing else {
        return Ok(Enqueued { job: insert_one(conn, job, max_attempts).await?, outcome: EnqueueOutcome::Created });
    };
    let existing = job_from_row(&existing)?;
    match spec.on_conflict {
        OnConflict::Reject => Err(StoreError::Duplicate {
            reason: format!("job {} with the same unique key is {}", existing.id, existing.state),
            existing: Some(existing.id),
        }),
        OnConflict::Ignore => Ok(Enqueued { job: existing, outcome: EnqueueOutcome::Existing }),
        OnConflict::Replace | OnConflict::ReplaceExceptSchedule => {
            sqlx::query(
                "UPDATE jobs SET state = 'cancelled', cancelled_at = now(), locked_by = NULL, lock_expires_at = NULL,
                                 updated_at = now()
                 WHERE id = $1",
            )
            .bind(existing.id)
            .execute(&mut *conn)
            .await?;
            let job = if spec.on_conflict == OnConflict::ReplaceExceptSchedule && existing.state == JobState::Scheduled {
                let mut kept = job.clone();
                kept.scheduled_at = Some(existing.scheduled_at);
                insert_one(conn, &kept, max_attempts).await?
            } else {
                insert_one(conn, job, max_attempts).await?
            };
            Ok(Enqueued { job, outcome: EnqueueOutcome::Replaced { old: existing.id } })
        }
    }
}

impl Store {
    /// Enqueues one job. With a unique key, a clash is resolved by the key's `on_conflict`.
    pub async fn enqueue(&self, job: NewJob) -> Result<Enqueued, StoreError> {
        let max_attempts = check(&job)?;
        match &job.unique {
            None if job.rate_limit.is_some() => {
                let mut tx = self.begin().await?;
                let job = insert_one(&mut tx, &job, max_attempts).await?;
                tx.commit().await?;
                Ok(Enqueued { job, outcome: EnqueueOutcome::Created })
            }
            None => {
                let mut conn = self.pool.acquire().await?;
                let job = insert_one(&mut conn, &job, max_attempts).await?;
                Ok(Enqueued { job, outcome: EnqueueOutcome::Created })
            }
            Some(spec) => {
                let mut tx = self.begin().await?;
                let out = insert_unique(&mut tx, &job, spec, max_attempts).await?;
                tx.commit().await?;
                Ok(out)
            }
        }
    }

    /// Enqueues many jobs atomically: one invalid or duplicate job and nothing is enqueued.
    /// Equal-priority jobs run in the order given: their generated ids ascend, and claims
    /// take equally due jobs in id order.
    pub async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<Enqueued>, StoreError> {
        let mut checked = Vec::with_capacity(jobs.len());
        for (i, job) in jobs.iter().enumerate() {
            checked.push(check(job).map_err(|e| prefix_index(e, i))?);
        }
        if copy_in::copyable(&jobs) {
            let mut tx = self.begin().await?;
            return match copy_in::copy_many(&mut tx, jobs, &checked).await {
                Ok(out) => {
                    tx.commit().await?;
                    Ok(out)
                }
                // The server refused the batch (a duplicate id, most often: a batch sent again
                // after its answer was lost) and the session is back in step: rolled back, its
                // connection goes back to the pool instead of being closed for a reconnect.
                Err(e) => {
                    if matches!(&e, StoreError::Duplicate { .. } | StoreError::Database(sqlx::Error::Database(_)))
                        && let Err(lost) = tx.rollback().await
                    {
                        // The connection is closed instead; the refusal is still the answer.
                        tracing::debug!(error = %lost, "rolling back a refused batch enqueue failed");
                    }
                    Err(e)
                }
            };
        }
        if jobs.iter().all(|j| j.unique.is_none() && j.rate_limit.is_none()) {
            // One statement is atomic on its own: no BEGIN and COMMIT round trips.
            let mut conn = self.pool.acquire().await?;
            return insert_many(&mut conn, jobs, &checked, &[]).await;
        }
        if jobs.iter().all(|j| j.unique.is_none()) {
            let mut tx = self.begin().await?;
            let out = insert_many(&mut tx, jobs, &checked, &[]).await?;
            tx.commit().await?;
            return Ok(out);
        }
        let mut tx = self.begin().await?;
        // Every key the batch names, locked once in key order before the first insert: each
        // insert would otherwise lock its own in the batch's order, which two batches naming
        // the same keys in turn could hold crosswise.
        record_rate_limit_keys(&mut tx, jobs.iter()).await?;
        let out = {
            let mut out = Vec::with_capacity(jobs.len());
            for (i, (job, max)) in jobs.iter().zip(&checked).enumerate() {
                let e = match &job.unique {
                    Some(spec) => insert_unique(&mut tx, job, spec, *max).await,
                    None => insert_one(&mut tx, job, *max).await.map(|job| Enqueued { job, outcome: EnqueueOutcome::Created }),
                };
                out.push(e.map_err(|e| prefix_index(e, i))?);
            }
            out
        };
        tx.commit().await?;
        Ok(out)
    }

    /// Moves a `pending` job to `available` (OJS activate). A job standing for a nested
    /// workflow is not one to run: it is refused as a job not pending. With an `actor`, the
    /// activation is audited (`job.activate`) by the same statement.
    pub async fn activate(&self, id: Uuid, actor: Option<&Actor>) -> Result<Job, StoreError> {
        // The queue is notified by the same statement: notified separately, a failed notify
        // would report a failure for an activation that happened, and the job, no longer
        // pending, could not be activated again.
        let row = sqlx::query(
            "WITH activated AS (
                 UPDATE jobs SET state = CASE WHEN scheduled_at > now() THEN 'scheduled'::job_state ELSE 'available'::job_state END,
                                 enqueued_at = CASE WHEN scheduled_at > now() THEN NULL ELSE now() END, updated_at = now()
                 WHERE id = $1 AND state = 'pending'
                   AND NOT EXISTS (SELECT 1 FROM workflows c WHERE c.parent_job = jobs.id) RETURNING *
             ), woken AS (
                 SELECT pg_notify('rebound_jobs', queue) FROM activated WHERE state = 'available'
             ), audited AS (
                 INSERT INTO audit_log (actor, action, target, details)
                 SELECT $2, 'job.activate', id::text, jsonb_build_object('state', state) FROM activated WHERE $2::text IS NOT NULL
             )
             -- Referencing `woken` is what makes Postgres run it (`audited`, a write, always runs).
             SELECT * FROM activated WHERE (SELECT count(*) FROM woken) >= 0",
        )
        .bind(id)
        .bind(actor.map(|a| a.name.as_str()))
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => Ok(job_from_row(&row)?),
            None => Err(self.refusal(id, "activate", None, NamedRun::default()).await),
        }
    }
}

fn prefix_index(e: StoreError, i: usize) -> StoreError {
    match e {
        StoreError::Duplicate { reason, existing } => StoreError::Duplicate { reason: format!("jobs[{i}]: {reason}"), existing },
        other => other.map_field(|f| format!("jobs[{i}].{f}")),
    }
}

/// Records the limits of the rate-limit keys `jobs` name, before they are inserted (the
/// insert's trigger admits them against these). Per key, the last job that names a
/// concurrency sets it, and likewise its rate window and its throttle; a key none sets keeps
/// what it had (none: no limit). In key order, so that two batches naming the same keys lock
/// them alike.
async fn record_rate_limit_keys<'a>(conn: &mut PgConnection, jobs: impl Iterator<Item = &'a NewJob>) -> Result<(), StoreError> {
    let whole = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let named: Vec<_> = jobs.filter_map(|j| j.rate_limit.as_ref()).collect();
    let keys: Vec<&str> = named.iter().map(|l| l.key.as_str()).collect();
    let limits: Vec<Option<i32>> = named.iter().map(|l| l.concurrency.map(whole)).collect();
    let windows = |pick: fn(&JobRateLimit) -> Option<Window>| -> (Vec<Option<i32>>, Vec<Option<i64>>) {
        named.iter().map(|l| pick(l).map_or((None, None), |w| (Some(whole(w.limit)), Some(millis(w.period).max(1))))).unzip()
    };
    let (rates, periods) = windows(|l| l.rate);
    let (throttles, throttle_periods) = windows(|l| l.throttle);
    if keys.is_empty() {
        return Ok(());
    }
    // Per key, the newest job naming a concurrency sets it, and the newest naming a rate or a
    // throttle sets that (the window's count goes on; a new period applies from the window's
    // start).
    sqlx::query(
        "INSERT INTO rate_limit_keys (key, concurrency, rate_max, rate_period_ms, throttle_max, throttle_period_ms)
         SELECT key,
                (array_agg(concurrency ORDER BY n DESC) FILTER (WHERE concurrency IS NOT NULL))[1],
                (array_agg(rate_max ORDER BY n DESC) FILTER (WHERE rate_max IS NOT NULL))[1],
                (array_agg(rate_period_ms ORDER BY n DESC) FILTER (WHERE rate_max IS NOT NULL))[1],
                (array_agg(throttle_max ORDER BY n DESC) FILTER (WHERE throttle_max IS NOT NULL))[1],
                (array_agg(throttle_period_ms ORDER BY n DESC) FILTER (WHERE throttle_max IS NOT NULL))[1]
         FROM unnest($1::text[], $2::int4[], $3::int4[], $4::int8[], $5::int4[], $6::int8[])
              WITH ORDINALITY AS t(key, concurrency, rate_max, rate_period_ms, throttle_max, throttle_period_ms, n)
         GROUP BY key ORDER BY key
         ON CONFLICT (key) DO UPDATE
         SET concurrency = COALESCE(EXCLUDED.concurrency, rate_limit_keys.concurrency),
             rate_max = COALESCE(EXCLUDED.rate_max, rate_limit_keys.rate_max),
             rate_period_ms = COALESCE(EXCLUDED.rate_period_ms, rate_limit_keys.rate_period_ms),
             throttle_max = COALESCE(EXCLUDED.throttle_max, rate_limit_keys.throttle_max),
             throttle_period_ms = COALESCE(EXCLUDED.throttle_period_ms, rate_limit_keys.throttle_period_ms),
             updated_at = now()",
    )
    .bind(&keys)
    .bind(&limits)
    .bind(&rates)
    .bind(&periods)
    .bind(&throttles)
    .bind(&throttle_periods)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Reads back what the rate-limit trigger settled for the keyed jobs of `stored`: those their
/// insert left waiting for a slot, and those its `on_limit` dropped or rescheduled (the
/// trigger decides that after the rows are written, so the insert's own answer cannot say).
async fn read_back_settled(conn: &mut PgConnection, stored: &mut [&mut Job]) -> Result<(), StoreError> {
    let ids: Vec<Uuid> = stored.iter().filter(|j| j.rate_limit_key.is_some()).map(|j| j.id).collect();
    if ids.is_empty() {
        return Ok(());
    }
    let rows = sqlx::query("SELECT id, rate_limited, state, scheduled_at, discarded_at, completed_at, last_error FROM jobs WHERE id = ANY($1)")
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
    let mut by_id: HashMap<Uuid, &mut Job> = stored.iter_mut().map(|j| (j.id, &mut **j)).collect();
    for row in &rows {
        let id: Uuid = row.try_get("id")?;
        if let Some(job) = by_id.get_mut(&id) {
            job.state = row.try_get("state")?;
            job.rate_limited = row.try_get::<bool, _>("rate_limited")? && job.state == JobState::Available;
            job.scheduled_at = ts(row, "scheduled_at")?;
            job.discarded_at = ts_opt(row, "discarded_at")?;
            job.completed_at = ts_opt(row, "completed_at")?;
            job.last_error = row.try_get("last_error")?;
        }
    }
    Ok(())
}

/// The batch fast path: one INSERT over arrays.
///
/// Only what Postgres decides comes back (state, defaults and timestamps, the latter at the
/// database's precision); the rest of each [`Job`] is moved over from its [`NewJob`], which
/// is exactly what was stored. Decoding every stored row back would cost the caller more than
/// the insert itself. A plain INSERT (no `ON CONFLICT`) spares each row a speculative
/// insertion; a duplicate id fails the statement, and so the whole batch, as it must.
///
/// `members` places each job in a workflow (its id and the job's step), or is empty.
pub(super) async fn insert_many(
    conn: &mut PgConnection,
    jobs: Vec<NewJob>,
    max_attempts: &[Option<i32>],
    members: &[(Uuid, i32)],
) -> Result<Vec<Enqueued>, StoreError> {
    let n = jobs.len();
    record_rate_limit_keys(conn, jobs.iter()).await?;
    let ids: Vec<Uuid> = jobs.iter().map(|job| job.id.unwrap_or_else(Uuid::now_v7)).collect();
    let retries: Vec<Option<Value>> = jobs.iter().map(|job| job.retry.as_ref().map(|p| p.to_json())).collect();
    let rows = {
        let mut types = Vec::with_capacity(n);
        let mut queues = Vec::with_capacity(n);
        let mut args = Vec::with_capacity(n);
        let mut metas: Vec<Option<&Value>> = Vec::with_capacity(n);
        let mut extras: Vec<Option<&Value>> = Vec::with_capacity(n);
        let mut priorities: Vec<Option<i16>> = Vec::with_capacity(n);
        let mut tags: Vec<Option<Value>> = Vec::with_capacity(n);
        let mut timeouts = Vec::with_capacity(n);
        let mut visibilities = Vec::with_capacity(n);
        let mut scheduled: Vec<Option<String>> = Vec::with_capacity(n);
        let mut expires: Vec<Option<String>> = Vec::with_capacity(n);
        let mut pendings: Vec<Option<bool>> = Vec::with_capacity(n);
        let mut keys: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut on_limits: Vec<Option<&str>> = Vec::with_capacity(n);
        // The usual empty meta, extra and tags go as NULL: nothing to encode or parse.
        let unless_empty = |v: &Value| -> bool { !v.as_object().is_some_and(|o| o.is_empty()) };
        for job in &jobs {
            types.push(job.job_type.as_str());
            queues.push(job.queue.as_str());
            args.push(&job.args);
            metas.push(Some(&job.meta).filter(|v| unless_empty(v)));
            extras.push(Some(&job.extra).filter(|v| unless_empty(v)));
            priorities.push((job.priority != 0).then_some(job.priority));
            tags.push((!job.tags.is_empty()).then(|| json!(job.tags)));
            timeouts.push(job.timeout_ms);
            visibilities.push(job.visibility_timeout_ms);
            scheduled.push(job.scheduled_at.map(|t| t.to_string()));
            expires.push(job.expires_at.map(|t| t.to_string()));
            pendings.push(job.pending.then_some(true));
            keys.push(job.rate_limit.as_ref().map(|r| r.key.as_str()));
            on_limits.push(job.rate_limit.as_ref().and_then(|r| r.on_limit.stored()));
        }
        // A column no job of the batch sets goes as an empty array: `unnest` pads it with
        // NULLs (the defaults below) instead of Postgres parsing a thousand NULLs per column.
        let (metas, extras, priorities, tags) = (sparse(metas), sparse(extras), sparse(priorities), sparse(tags));
        let (timeouts, visibilities, scheduled, expires) = (sparse(timeouts), sparse(visibilities), sparse(scheduled), sparse(expires));
        let (pendings, max_attempts, keys, on_limits) = (sparse(pendings), sparse(max_attempts.to_vec()), sparse(keys), sparse(on_limits));
        let retries = sparse(retries.iter().map(Option::as_ref).collect());
        let workflow_ids: Vec<Uuid> = members.iter().map(|m| m.0).collect();
        let workflow_steps: Vec<i32> = members.iter().map(|m| m.1).collect();
        sqlx::query(
            "WITH input AS (
               SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[], $6::jsonb[], $7::int2[],
                                    $8::jsonb[], $9::int4[], $10::jsonb[], $11::int8[], $12::int8[], $13::timestamptz[],
                                    $14::timestamptz[], $15::bool[], $16::uuid[], $17::int4[], $18::text[], $19::text[])
                      AS t(id, type, queue, args, meta, extra, priority, tags, max_attempts, retry,
                           timeout_ms, visibility_timeout_ms, scheduled_at, expires_at, pending, workflow_id, workflow_step,
                           rate_limit_key, rate_limit_on_limit)
             ), layers AS (
               -- Read as in INSERT_ONE: a stored policy must never fail an enqueue.
               SELECT job_type, rebound_policy_max_attempts(policy) AS max_attempts FROM retry_policies
             )
             INSERT INTO jobs (id, type, queue, args, meta, extra, priority, tags, state, max_attempts, retry,
                               timeout_ms, visibility_timeout_ms, scheduled_at, expires_at, enqueued_at, workflow_id, workflow_step,
                               rate_limit_key, rate_limit_on_limit)
             SELECT i.id, i.type, i.queue, i.args, COALESCE(i.meta, '{}'), COALESCE(i.extra, '{}'), COALESCE(i.priority, 0),
                    CASE WHEN i.tags IS NULL THEN '{}'::text[] ELSE ARRAY(SELECT jsonb_array_elements_text(i.tags)) END,
                    s.state,
                    COALESCE(i.max_attempts, (SELECT l.max_attempts FROM layers l WHERE l.job_type = i.type),
                             (SELECT l.max_attempts FROM layers l WHERE l.job_type = '*'), 3),
                    i.retry, i.timeout_ms, i.visibility_timeout_ms, COALESCE(i.scheduled_at, now()), i.expires_at,
                    CASE WHEN s.state = 'available' THEN now() END, i.workflow_id, i.workflow_step, i.rate_limit_key,
                    i.rate_limit_on_limit
             FROM input i
             CROSS JOIN LATERAL (SELECT CASE WHEN i.pending IS TRUE THEN 'pending'::job_state
                                             WHEN i.scheduled_at > now() THEN 'scheduled'::job_state
                                             ELSE 'available'::job_state END AS state) s
             RETURNING id, state, max_attempts, scheduled_at, expires_at, created_at",
        )
        .bind(&ids)
        .bind(&types)
        .bind(&queues)
        .bind(&args)
        .bind(&metas)
        .bind(&extras)
        .bind(&priorities)
        .bind(&tags)
        .bind(&max_attempts)
        .bind(&retries)
        .bind(&timeouts)
        .bind(&visibilities)
        .bind(&scheduled)
        .bind(&expires)
        .bind(&pendings)
        .bind(&workflow_ids)
        .bind(&workflow_steps)
        .bind(&keys)
        .bind(&on_limits)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| duplicate_in_batch(e, &ids))?
    };
    // RETURNING order is not guaranteed; give the jobs back in the order they were given.
    let mut stored: std::collections::HashMap<Uuid, &sqlx::postgres::PgRow> = std::collections::HashMap::with_capacity(n);
    for row in &rows {
        stored.insert(row.try_get("id")?, row);
    }
    let mut out = Vec::with_capacity(n);
    for (job, id) in jobs.into_iter().zip(ids) {
        let row = stored.get(&id).ok_or_else(|| StoreError::Missing { what: format!("inserted job {id}") })?;
        out.push(Enqueued { job: stored_job(job, id, row)?, outcome: EnqueueOutcome::Created });
    }
    read_back_settled(conn, &mut out.iter_mut().map(|e| &mut e.job).collect::<Vec<_>>()).await?;
    Ok(out)
}

/// `column`, or nothing when no row has a value (see `insert_many`).
fn sparse<T>(column: Vec<Option<T>>) -> Vec<Option<T>> {
    if column.iter().all(Option::is_none) { Vec::new() } else { column }
}

/// A batch insert that hit an existing id (or the same id twice) is a typed duplicate naming
/// the offending job; any other error passes through.
pub(super) fn duplicate_in_batch(e: sqlx::Error, ids: &[Uuid]) -> StoreError {
    let dup = match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => db
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .and_then(|pg| pg.detail())
            // "Key (id)=(0190…) already exists."
            .and_then(|d| d.split_once("=(")?.1.split_once(')').map(|(id, _)| id.parse::<Uuid>().ok()))
            .flatten(),
        _ => return e.into(),
    };
    let Some(dup) = dup else {
        return StoreError::Duplicate { reason: "a job with one of these ids already exists".into(), existing: None };
    };
    // The second of two equal ids in the batch is the one that clashed; otherwise the only one.
    let mut at = ids.iter().enumerate().filter(|(_, id)| **id == dup).map(|(i, _)| i);
    let first = at.next().unwrap_or(0);
    let i = at.next().unwrap_or(first);
    StoreError::Duplicate { reason: format!("jobs[{i}]: a job with id {dup} already exists"), existing: Some(dup) }
}
