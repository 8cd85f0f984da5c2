//! The dead-letter queue: re-drive (one, many, all matching a filter; fresh budget or one more
//! attempt; optionally staggered) and purge. Every action is audited with who and why.

use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};
use sqlx::{PgConnection, Postgres, QueryBuilder};
use uuid::Uuid;

use super::audit::{Actor, record};
use super::cancel::{BULK_LIMIT, JobSelection};
use super::notify::notify_queues;
use super::listing::{JobCount, JobFilter, SEARCH_WINDOW};
use super::lenient::StoredTime;
use super::{Store, StoreError, jobs_from_rows, millis};
use super::enqueue::check_retry_patch;
use crate::job::{Job, check_args, check_meta, check_priority, validate_queue};
use crate::policy::PolicyPatch;
use crate::storable;

/// How much retry budget a re-driven job gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedriveBudget {
    /// Attempts start again from zero: the whole policy applies anew.
    Fresh,
    /// Exactly one more execution; failing it exhausts the job again.
    OneMore,
}

/// How to re-drive.
#[derive(Clone, Debug, PartialEq)]
pub struct RedriveOptions {
    pub budget: RedriveBudget,
    /// Spread the jobs evenly over this window so a large re-drive is no thundering herd.
    pub stagger: Option<Duration>,
    pub actor: Actor,
    pub reason: Option<String>,
}

/// Re-drive targets: the same selections as other bulk actions, restricted to dead letters.
pub type RedriveTarget = JobSelection;

/// Changes made to a dead letter as it is re-driven (OJS dead-letter §6.3, "retry with
/// modifications"): route it elsewhere, tag it, give it a stricter policy, fix its input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RedriveOverride {
    pub queue: Option<String>,
    /// Merged over the job's meta, key by key.
    pub meta: Option<Value>,
    /// Merged over the job's own retry override, key by key (so `{"max_attempts": 1}` keeps
    /// the rest of it).
    pub retry: Option<PolicyPatch>,
    /// Replaces the args (a JSON array).
    pub args: Option<Value>,
    pub priority: Option<i16>,
}

impl RedriveOverride {
    /// Checks every field as an enqueue does, naming it under `override.`.
    fn check(&self) -> Result<(), StoreError> {
        fn invalid(field: &'static str) -> impl Fn(String) -> StoreError {
            move |reason| StoreError::invalid(format!("override.{field}"), reason)
        }
        if let Some(q) = &self.queue {
            validate_queue(q).map_err(|e| invalid("queue")(e.reason))?;
        }
        for (field, value, shape) in [("meta", &self.meta, check_meta as fn(&Value) -> Result<(), String>), ("args", &self.args, check_args)] {
            if let Some(v) = value {
                shape(v).map_err(invalid(field))?;
                storable::check(v, &format!("override.{field}")).map_err(|e| StoreError::invalid(e.path, e.reason))?;
            }
        }
        self.priority.map_or(Ok(()), check_priority).map_err(invalid("priority"))?;
        if let Some(patch) = &self.retry {
            check_retry_patch(patch, "override.retry").map_err(|e| StoreError::invalid(e.field, e.reason))?;
        }
        Ok(())
    }

    fn describe(&self) -> Value {
        json!({
            "queue": self.queue,
            "meta": self.meta,
            "retry": self.retry.as_ref().map(PolicyPatch::to_json),
            "args": self.args.is_some(),
            "priority": self.priority,
        })
    }
}

impl Store {
    /// Re-drives dead letters in the selection (at most 50 000 per call). Returns how many.
    ///
    /// A stagger longer than [`crate::bounds::MAX_INTERVAL`] (365 days) is refused
    /// ([`StoreError::Invalid`] naming `stagger`) before anything is read or written.
    pub async fn redrive(&self, sel: &JobSelection, opts: &RedriveOptions) -> Result<u64, StoreError> {
        if let Some(stagger) = opts.stagger {
            crate::bounds::check_interval(stagger).map_err(|reason| StoreError::invalid("stagger", reason))?;
        }
        let mut tx = self.begin().await?;
        let n = redrive_in(&mut tx, sel, opts, None, None).await?;
        tx.commit().await?;
        Ok(n)
    }

    /// Re-drives one dead letter with `changes` applied first, in one transaction: a change
    /// that is refused (named under `override.`) leaves the dead letter as it was. False if
    /// `id` is not a dead letter.
    pub async fn redrive_with_override(&self, id: Uuid, changes: &RedriveOverride, opts: &RedriveOptions) -> Result<bool, StoreError> {
        changes.check()?;
        let mut tx = self.begin().await?;
        let changed = sqlx::query(
            "UPDATE jobs SET queue = COALESCE($2, queue), meta = meta || COALESCE($3, '{}'::jsonb), args = COALESCE($4, args),
                 priority = COALESCE($5, priority),
                 retry = CASE WHEN $6::jsonb IS NULL THEN retry ELSE COALESCE(retry, '{}'::jsonb) || $6 END,
                 max_attempts = COALESCE(($6::jsonb->>'max_attempts')::int, max_attempts), updated_at = now()
             WHERE id = $1 AND dead_letter",
        )
        .bind(id)
        .bind(&changes.queue)
        .bind(&changes.meta)
        .bind(&changes.args)
        .bind(changes.priority)
        .bind(changes.retry.as_ref().map(PolicyPatch::to_json))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        let n = redrive_in(&mut tx, &JobSelection::Ids(vec![id]), opts, Some(changes), None).await?;
        tx.commit().await?;
        Ok(n == 1)
    }

    /// Deletes dead letters in the selection for good, with their attempts. Returns how many.
    pub async fn purge_dead_letters(&self, sel: &JobSelection, actor: &Actor, reason: Option<&str>) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let ids: Vec<Uuid> = sel.select_ids("j.dead_letter", BULK_LIMIT).build_query_scalar().fetch_all(&mut *tx).await?;
        let deleted = sqlx::query_scalar::<_, i64>(delete_with_history!("SELECT unnest($1::uuid[])", "dead_letter", "'deleted'", "$2"))
            .bind(&ids)
            .bind(&actor.name)
            .fetch_one(&mut *tx)
            .await? as u64;
        let mut details = sel.describe();
        if let Some(o) = details.as_object_mut() {
            o.insert("affected".into(), json!(deleted));
            o.insert("reason".into(), json!(reason));
        }
        record(&mut tx, actor, "dead_letter.purge", None, details).await?;
        tx.commit().await?;
        Ok(deleted)
    }
}

/// How many times a job (aliased `j`) has been replayed by a rule, from its meta. The meta is
/// also the client's: anything but a number there counts as none, so a stray value cannot fail
/// the replayer's statements.
macro_rules! replay_count {
    () => {
        "(CASE WHEN jsonb_typeof(j.meta->'ojs.replay_count') = 'number'
               THEN LEAST(GREATEST((j.meta->>'ojs.replay_count')::numeric, 0), 1000000)::int ELSE 0 END)"
    };
}
pub(crate) use replay_count;

/// The re-drive itself, inside the caller's transaction. With `replay_rule`, it is that rule's
/// automatic replay (ojs-dead-letter §7): the job's meta counts it, the event is
/// `dead_letter.replayed` and the audit action `dead_letter.replay`.
pub(crate) async fn redrive_in(
    conn: &mut PgConnection,
    sel: &JobSelection,
    opts: &RedriveOptions,
    changes: Option<&RedriveOverride>,
    replay_rule: Option<&str>,
) -> Result<u64, StoreError> {
    let ids: Vec<Uuid> = sel.select_ids("j.dead_letter", BULK_LIMIT).build_query_scalar().fetch_all(&mut *conn).await?;
    let queues: Vec<String> = sqlx::query_scalar(concat!(
        "WITH picked AS (
             SELECT id, (row_number() OVER (ORDER BY id) - 1)::float8 / GREATEST(count(*) OVER (), 1) AS frac
             FROM unnest($1::uuid[]) AS id
         ), moved AS (
             UPDATE jobs j
             SET state = CASE WHEN $3::bigint IS NULL OR p.frac = 0 THEN 'available'::job_state ELSE 'scheduled'::job_state END,
                 scheduled_at = now() + COALESCE($3::bigint, 0) * p.frac * interval '1 millisecond',
                 enqueued_at = CASE WHEN $3::bigint IS NULL OR p.frac = 0 THEN now() END,
                 attempt = CASE WHEN $2 THEN 0 ELSE j.attempt END,
                 max_attempts = CASE WHEN $2 THEN j.max_attempts ELSE j.attempt + 1 END,
                 -- One more means one more, whatever the live policy says: pin it on the job.
                 retry = CASE WHEN $2 THEN j.retry
                              ELSE COALESCE(j.retry, '{}'::jsonb) || jsonb_build_object('max_attempts', j.attempt + 1) END,
                 dead_letter = false, dead_lettered_at = NULL, error_signature = NULL, discarded_at = NULL, completed_at = NULL,
                 -- Re-driven by hand or by a rule: it waits for its key's limit (see
                 -- `retry_finished_jobs`).
                 rate_limit_on_limit = NULL,
                 meta = CASE WHEN $5::text IS NULL THEN j.meta
                             ELSE j.meta || jsonb_build_object(
                                 'ojs.replay_count', ", replay_count!(), " + 1,
                                 'ojs.last_replayed_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
                                 'ojs.replay_rule', $5::text) END,
                 updated_at = now()
             FROM picked p
             WHERE j.id = p.id
             RETURNING j.id, j.type, j.queue, j.state
         ), logged AS (
             -- OJS `dead_letter.retried` events (see migrations/…_dead_letter_events.sql).
             INSERT INTO dead_letter_log (action, queue, job_ids, job_types, actor)
             SELECT CASE WHEN $5::text IS NULL THEN 'retried' ELSE 'replayed' END, queue, array_agg(id), array_agg(type), $4
             FROM moved GROUP BY queue
         )
         SELECT DISTINCT queue FROM moved WHERE state = 'available'",
    ))
    .bind(&ids)
    .bind(opts.budget == RedriveBudget::Fresh)
    .bind(opts.stagger.map(millis))
    .bind(&opts.actor.name)
    .bind(replay_rule)
    .fetch_all(&mut *conn)
    .await?;
    notify_queues(&mut *conn, &queues).await?;
    let mut details = sel.describe();
    if let Some(o) = details.as_object_mut() {
        o.insert("affected".into(), json!(ids.len()));
        o.insert("budget".into(), json!(if opts.budget == RedriveBudget::Fresh { "fresh" } else { "one_more" }));
        o.insert("stagger_ms".into(), json!(opts.stagger.map(millis)));
        o.insert("reason".into(), json!(opts.reason));
        if let Some(changes) = changes {
            o.insert("override".into(), changes.describe());
        }
    }
    let target = match sel {
        JobSelection::Ids(ids) if ids.len() == 1 => Some(ids[0].to_string()),
        _ => None,
    };
    // A re-drive that matched nothing did nothing: the caller reports it, the log stays clean.
    if !ids.is_empty() {
        let action = if replay_rule.is_some() { "dead_letter.replay" } else { "dead_letter.redrive" };
        record(conn, &opts.actor, action, target.as_deref(), details).await?;
    }
    Ok(ids.len() as u64)
}

/// Where a listing of dead letters in order of death ([`Store::dead_letters_by_death`])
/// continues: after this one (its time of death, then its id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeathCursor {
    pub at: Timestamp,
    pub id: Uuid,
}

impl DeathCursor {
    /// The cursor as one opaque token: `<microseconds since the epoch>_<id>`.
    pub fn encode(&self) -> String {
        format!("{}_{}", self.at.as_microsecond(), self.id)
    }

    /// Reads [`DeathCursor::encode`]'s token; `None` for anything else, including a time no
    /// job can have died at (outside [`crate::bounds::check_time`]'s range, which Postgres
    /// may not even hold).
    pub fn parse(token: &str) -> Option<DeathCursor> {
        let (micros, id) = token.split_once('_')?;
        let at = Timestamp::from_microsecond(micros.parse().ok()?).ok()?;
        crate::bounds::check_time(at).ok()?;
        Some(DeathCursor { at, id: Uuid::parse_str(id).ok()? })
    }

    fn of(job: &Job) -> Option<DeathCursor> {
        Some(DeathCursor { at: job.dead_lettered_at?, id: job.id })
    }
}

/// Which way a [`death_scan`] walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deaths {
    OldestFirst,
    NewestFirst,
}

/// The ids and times of death of at most `limit` dead letters (of `queue` only, if given, by
/// its own index), walking `way` from just past `past`, among those that died at or after
/// `from` and before `until`: one range read of an index of dead letters by time of death.
pub(crate) fn death_scan(
    queue: Option<&str>,
    way: Deaths,
    past: Option<DeathCursor>,
    from: Option<Timestamp>,
    until: Option<Timestamp>,
    limit: i64,
) -> QueryBuilder<Postgres> {
    let mut scan = QueryBuilder::<Postgres>::new("SELECT j.id, j.dead_lettered_at FROM jobs j WHERE j.dead_letter");
    if let Some(q) = queue {
        scan.push(" AND j.queue = ").push_bind(q.to_owned());
    }
    if let Some(c) = past {
        let cmp = if way == Deaths::OldestFirst { ">" } else { "<" };
        scan.push(format!(" AND (j.dead_lettered_at, j.id) {cmp} ("));
        scan.push_bind(jiff_sqlx::Timestamp::from(c.at)).push(", ").push_bind(c.id).push(")");
    }
    if let Some(t) = from {
        scan.push(" AND j.dead_lettered_at >= ").push_bind(jiff_sqlx::Timestamp::from(t));
    }
    if let Some(t) = until {
        scan.push(" AND j.dead_lettered_at < ").push_bind(jiff_sqlx::Timestamp::from(t));
    }
    let order = if way == Deaths::OldestFirst { "ASC" } else { "DESC" };
    scan.push(format!(" ORDER BY j.dead_lettered_at {order}, j.id {order} LIMIT ")).push_bind(limit);
    scan
}

/// A [`death_scan`]'s answer.
pub(crate) async fn run_death_scan<'c, E: sqlx::PgExecutor<'c>>(mut scan: QueryBuilder<Postgres>, conn: E) -> Result<Vec<DeathCursor>, StoreError> {
    let rows: Vec<(Uuid, StoredTime)> = scan.build_query_as().fetch_all(conn).await?;
    Ok(rows.into_iter().map(|(id, at)| DeathCursor { at: at.0, id }).collect())
}

impl Store {
    /// A page of [`Store::dead_letters_by_death`] and the count of
    /// [`Store::count_jobs_bounded`], read side by side on two connections, for a page that
    /// shows both.
    pub async fn dead_letters_by_death_counted(
        &self,
        filter: &JobFilter,
        after: Option<DeathCursor>,
        limit: i64,
        cap: i64,
    ) -> Result<(Vec<Job>, Option<DeathCursor>, JobCount), StoreError> {
        let ((items, next), count) = futures::try_join!(self.dead_letters_by_death(filter, after, limit), self.count_jobs_bounded(filter, cap))?;
        Ok((items, next, count))
    }

    /// Dead letters matching `filter`, most recently dead first, `limit` (1..=500) at a time
    /// after `after`; with the cursor of the next page, if any. Read along the index of dead
    /// letters by time of death (of the filter's queue, if it names one), bounded by the
    /// filter's times of death. Any other condition is checked row by row, as a search: within
    /// a window of the next [`SEARCH_WINDOW`] dead letters, and a page the window ran out
    /// under continues after it.
    pub async fn dead_letters_by_death(&self, filter: &JobFilter, after: Option<DeathCursor>, limit: i64) -> Result<(Vec<Job>, Option<DeathCursor>), StoreError> {
        let limit = limit.clamp(1, 500);
        let residual = JobFilter { queue: None, dead_letter: None, dead_after: None, dead_before: None, ..filter.clone() };
        let search = residual != JobFilter::default();
        let window = if search { SEARCH_WINDOW } else { limit + 1 };
        let scan = death_scan(filter.queue.as_deref(), Deaths::NewestFirst, after, filter.dead_after, filter.dead_before, window);
        let seen = run_death_scan(scan, &self.pool).await?;
        // Without a search the page is the window's first `limit`, and whether more follow is
        // the window's to say: a row among them re-driven between the two reads leaves the
        // page one short, not the listing ended.
        let page_of_window = if search { &seen[..] } else { &seen[..seen.len().min(limit as usize)] };
        let ids: Vec<Uuid> = page_of_window.iter().map(|c| c.id).collect();
        let mut rows = QueryBuilder::<Postgres>::new("SELECT * FROM jobs j WHERE j.id = ANY(");
        rows.push_bind(ids).push(")");
        if search {
            residual.push_conditions(&mut rows);
        }
        let mut items = jobs_from_rows(&rows.build().fetch_all(&self.pool).await?)?;
        // A row re-driven between the two reads is no dead letter any more.
        items.retain(|j| j.dead_letter && j.dead_lettered_at.is_some());
        items.sort_by_key(|j| std::cmp::Reverse((j.dead_lettered_at, j.id)));
        let next = if !search {
            (seen.len() as i64 > limit).then(|| seen[limit as usize - 1])
        } else if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().and_then(DeathCursor::of)
        } else if seen.len() as i64 >= window {
            // The window ran out before the page filled: the search goes on after it.
            seen.last().copied()
        } else {
            None
        };
        Ok((items, next))
    }
}
