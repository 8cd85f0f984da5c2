//! Cron jobs (OJS cron): register, list, pause/resume, trigger, delete, and the pass that
//! fires due ticks.
//!
//! Firing is exactly-once per tick by construction in the database, whoever runs the pass:
//! a tick is taken by an `UPDATE … WHERE next_run_at = <the value read>` that moves
//! `next_run_at` to the following tick (a compare-and-set; a concurrent firer blocks on the row
//! and then finds the value gone), and the tick's decision is a `cron_runs` row keyed by
//! (cron, tick), written in the same transaction as the job it enqueues. Leadership only keeps
//! the other processes from doing useless work.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::audit::{Actor, record};
use super::events::EventFilter;
use super::enqueue::{check, insert_one};
use super::notify::notify_queues;
use super::{Store, StoreError, Window, ts, ts_opt};
use crate::cron_schedule::CronSchedule;
use crate::job::{Job, JobRateLimit, NewJob, OnLimit};
use crate::policy::PolicyPatch;

/// What a tick does while an earlier run of the same cron job is running (`enqueue`: has not
/// finished).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Skip the tick while an earlier run is running (the default).
    #[default]
    Skip,
    /// Enqueue anyway; runs may overlap.
    Allow,
    /// Cancel the running earlier runs, then enqueue.
    CancelPrevious,
    /// Enqueue, but hold the job (`pending`) until the earlier runs finished.
    Enqueue,
}

impl OverlapPolicy {
    pub const ALL: [OverlapPolicy; 4] = [OverlapPolicy::Skip, OverlapPolicy::Allow, OverlapPolicy::CancelPrevious, OverlapPolicy::Enqueue];

    pub fn as_str(self) -> &'static str {
        match self {
            OverlapPolicy::Skip => "skip",
            OverlapPolicy::Allow => "allow",
            OverlapPolicy::CancelPrevious => "cancel_previous",
            OverlapPolicy::Enqueue => "enqueue",
        }
    }
}

impl fmt::Display for OverlapPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OverlapPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OverlapPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("must be \"skip\", \"allow\", \"cancel_previous\" or \"enqueue\", got {s:?}"))
    }
}

/// The job a cron job enqueues on each tick, as validated at registration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CronTemplate {
    #[serde(rename = "type")]
    pub job_type: String,
    pub args: Value,
    pub meta: Value,
    pub queue: String,
    pub priority: i16,
    pub tags: Vec<String>,
    pub timeout_ms: Option<i64>,
    pub visibility_timeout_ms: Option<i64>,
    /// A partial retry policy (see [`PolicyPatch::to_json`]).
    pub retry: Option<Value>,
    /// The rate-limit key every triggered job shares, and the limits it sets. (Absent from
    /// templates stored before templates could have one.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<TemplateRateLimit>,
    /// The options as the client sent them, to echo back.
    pub options: Value,
}

/// A template's [`JobRateLimit`], as stored with the template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TemplateRateLimit {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// At most `limit` starts per `period_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<TemplateWindow>,
    /// At most `limit` starts per `period_ms`, spaced evenly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<TemplateWindow>,
    #[serde(default)]
    pub on_limit: OnLimit,
}

/// A template's rate window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateWindow {
    pub limit: u32,
    pub period_ms: u64,
}

impl From<Window> for TemplateWindow {
    fn from(w: Window) -> Self {
        TemplateWindow { limit: w.limit, period_ms: u64::try_from(w.period.as_millis()).unwrap_or(u64::MAX) }
    }
}

impl From<TemplateWindow> for Window {
    fn from(w: TemplateWindow) -> Self {
        Window { limit: w.limit, period: std::time::Duration::from_millis(w.period_ms) }
    }
}

impl From<&JobRateLimit> for TemplateRateLimit {
    fn from(r: &JobRateLimit) -> Self {
        TemplateRateLimit {
            key: r.key.clone(),
            concurrency: r.concurrency,
            window: r.rate.map(TemplateWindow::from),
            throttle: r.throttle.map(TemplateWindow::from),
            on_limit: r.on_limit,
        }
    }
}

impl From<&TemplateRateLimit> for JobRateLimit {
    fn from(r: &TemplateRateLimit) -> Self {
        JobRateLimit {
            key: r.key.clone(),
            concurrency: r.concurrency,
            rate: r.window.map(Window::from),
            throttle: r.throttle.map(Window::from),
            on_limit: r.on_limit,
        }
    }
}

impl CronTemplate {
    /// The template of a validated job envelope; `options` is what the client sent.
    pub fn from_job(job: &NewJob, options: Value) -> CronTemplate {
        CronTemplate {
            job_type: job.job_type.clone(),
            args: job.args.clone(),
            meta: job.meta.clone(),
            queue: job.queue.clone(),
            priority: job.priority,
            tags: job.tags.clone(),
            timeout_ms: job.timeout_ms,
            visibility_timeout_ms: job.visibility_timeout_ms,
            retry: job.retry.as_ref().map(PolicyPatch::to_json),
            rate_limit: job.rate_limit.as_ref().map(TemplateRateLimit::from),
            options,
        }
    }

    /// The job of one tick, its meta naming the cron job and the tick (OJS overlap detection
    /// correlates by `cron_name`).
    fn new_job(&self, cron_name: &str, tick: Timestamp) -> Result<NewJob, StoreError> {
        let mut job = NewJob::new(self.job_type.clone(), self.args.clone()).queue(self.queue.clone());
        let mut meta = match &self.meta {
            Value::Object(m) => m.clone(),
            _ => Map::new(),
        };
        meta.insert("cron_name".into(), json!(cron_name));
        meta.insert("cron_triggered_at".into(), json!(tick.to_string()));
        job.meta = Value::Object(meta);
        job.priority = self.priority;
        job.tags = self.tags.clone();
        job.timeout_ms = self.timeout_ms;
        job.visibility_timeout_ms = self.visibility_timeout_ms;
        if let Some(r) = &self.retry {
            job.retry = Some(PolicyPatch::from_json(r)?);
        }
        // Checked with the rest of the job where it is enqueued (`check`): a hand-edited
        // template that no longer validates records a failed tick.
        job.rate_limit = self.rate_limit.as_ref().map(JobRateLimit::from);
        Ok(job)
    }
}

/// A cron job to register (or update: registration is an upsert by name).
#[derive(Clone, Debug)]
pub struct CronSpec {
    pub name: String,
    pub schedule: CronSchedule,
    pub template: CronTemplate,
    pub overlap_policy: OverlapPolicy,
    pub enabled: bool,
    pub description: Option<String>,
}

/// A registered cron job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CronJob {
    pub name: String,
    pub expression: String,
    pub timezone: String,
    pub template: CronTemplate,
    pub overlap_policy: OverlapPolicy,
    pub enabled: bool,
    pub description: Option<String>,
    /// The next time it fires; `None` while disabled.
    pub next_run_at: Option<Timestamp>,
    /// When the firing pass next looks at it: `next_run_at`, or before that the first instant
    /// after a daylight-saving gap that swallows one of its times, which is recorded as a
    /// skip (`dst_skip`) instead of firing.
    pub next_tick_at: Option<Timestamp>,
    pub last_run_at: Option<Timestamp>,
    pub last_job_id: Option<Uuid>,
    /// What the latest tick did: `enqueued`, `skipped`, `waiting`, `triggered`, `failed`.
    pub last_outcome: Option<String>,
    pub run_count: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// What one firing pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CronPass {
    /// Ticks that enqueued a job (or held one back under `enqueue`).
    pub fired: u64,
    /// Ticks skipped because an earlier run was unfinished (`skip`).
    pub skipped: u64,
    /// Jobs held back under `enqueue` that were released now.
    pub released: u64,
}

/// The skip reason of a tick whose wall-clock time a daylight-saving jump swallowed.
const DST_SKIP: &str = "dst_skip";

/// Cron event types ([`Store::cron_events`]).
pub const CRON_EVENT_TYPES: [&str; 2] = ["cron.triggered", "cron.skipped"];

/// A cron tick that enqueued a job (`cron.triggered`) or was skipped by the overlap policy
/// (`cron.skipped`), read back from the ticks' records.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CronEvent {
    /// Unique, stable, and a cursor like [`crate::store::JobEvent::id`]:
    /// `evt_<fired, µs>:<type>:<cron name>:<tick, µs>`.
    pub id: String,
    /// One of [`CRON_EVENT_TYPES`].
    pub event_type: &'static str,
    pub cron_name: String,
    /// `None` once the cron job was deleted.
    pub expression: Option<String>,
    pub timezone: Option<String>,
    /// The tick (for a manual trigger, when it was triggered).
    pub scheduled_time: Timestamp,
    pub actual_time: Timestamp,
    pub job_id: Option<Uuid>,
    pub job_type: Option<String>,
    pub queue: Option<String>,
    /// Triggered by an operator rather than the schedule.
    pub manual: bool,
    /// Why a tick was skipped: `overlap_skip` (an earlier run was still running) or
    /// `dst_skip` (a daylight-saving jump swallowed its time).
    pub reason: Option<&'static str>,
    /// For a trigger, which run of its cron job it was (its `run_count` then). `None` for
    /// runs recorded before this was kept.
    pub run_count: Option<i64>,
    /// For a skip, the earlier run's job that was still running.
    pub active_job_id: Option<Uuid>,
}

/// Cron job names are `[a-z0-9][a-z0-9.-]*`, at most 255 characters (OJS).
pub fn validate_cron_name(name: &str) -> Result<(), StoreError> {
    let mut chars = name.chars();
    let ok = name.len() <= 255 && matches!(chars.next(), Some('a'..='z' | '0'..='9')) && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::invalid("name", format!("{name:?} is not a valid cron job name: lowercase letters, digits, '.' and '-', starting with a letter or digit, at most 255 characters")))
    }
}

fn cron_from_row(r: &PgRow) -> Result<CronJob, StoreError> {
    let policy: String = r.try_get("overlap_policy")?;
    let template: Value = r.try_get("template")?;
    let expression: String = r.try_get("expression")?;
    let timezone: String = r.try_get("timezone")?;
    let next_tick_at = ts_opt(r, "next_run_at")?;
    // A schedule that no longer parses is reported by the firing pass; here its tick stands.
    let next_run_at = next_tick_at.map(|tick| match CronSchedule::stored(&expression, &timezone) {
        Ok(schedule) if schedule.skips_at(tick) => schedule.next_after(tick).unwrap_or(tick),
        _ => tick,
    });
    Ok(CronJob {
        name: r.try_get("name")?,
        expression,
        timezone,
        template: serde_json::from_value(template).map_err(|e| StoreError::invalid("template", format!("stored cron template does not parse: {e}")))?,
        overlap_policy: policy.parse().map_err(|e: String| StoreError::invalid("overlap_policy", e))?,
        enabled: r.try_get("enabled")?,
        description: r.try_get("description")?,
        next_run_at,
        next_tick_at,
        last_run_at: ts_opt(r, "last_run_at")?,
        last_job_id: r.try_get("last_job_id")?,
        last_outcome: r.try_get("last_outcome")?,
        run_count: r.try_get("run_count")?,
        created_at: ts(r, "created_at")?,
        updated_at: ts(r, "updated_at")?,
    })
}

// `$job` is `$3::uuid IS NULL` (every run) or `r.job_id = $3` (the run that enqueued one job,
// through its index): one statement for both, `$3 IS NULL OR r.job_id = $3`, walked every run
// newest first for a job no cron made (150 ms for a month of a cron ticking every second).
macro_rules! cron_events_sql {
    ($order:literal, $job:literal) => {
        concat!(
            "SELECT * FROM (
    SELECT ('evt_' || lpad(((extract(epoch FROM r.fired_at) * 1000000)::bigint)::text, 16, '0')
            || CASE WHEN r.outcome = 'skipped' THEN ':cron.skipped:' ELSE ':cron.triggered:' END
            || r.cron_name || ':' || ((extract(epoch FROM r.scheduled_for) * 1000000)::bigint)) COLLATE \"C\" AS id,
           r.cron_name, r.scheduled_for, r.fired_at, r.outcome, r.skip_reason, r.job_id, r.run_number, r.active_job_id, c.expression, c.timezone,
           j.type AS job_type, COALESCE(j.queue, c.template->>'queue') AS queue
    FROM cron_runs r
    LEFT JOIN cron_jobs c ON c.name = r.cron_name
    LEFT JOIN jobs j ON j.id = r.job_id
    WHERE r.outcome = ANY($1)
      AND (cardinality($2::text[]) = 0 OR COALESCE(j.queue, c.template->>'queue') = ANY($2))
      AND (cardinality($6::text[]) = 0 OR COALESCE(j.type, c.template->>'type') = ANY($6))
      AND ", $job, "
      AND ($4::timestamptz IS NULL OR r.fired_at >= $4::timestamptz)
      AND ($8::timestamptz IS NULL OR r.fired_at < $8::timestamptz)
) e
WHERE $7::text IS NULL OR e.id > $7
ORDER BY ", $order, " LIMIT $5"
        )
    };
}
const CRON_EVENTS_NEWEST_FIRST: &str = cron_events_sql!("fired_at DESC", "$3::uuid IS NULL");
const CRON_EVENTS_AFTER: &str = cron_events_sql!("id", "$3::uuid IS NULL");
const CRON_EVENTS_OF_JOB_NEWEST_FIRST: &str = cron_events_sql!("fired_at DESC", "r.job_id = $3");
const CRON_EVENTS_OF_JOB_AFTER: &str = cron_events_sql!("id", "r.job_id = $3");

impl Store {
    /// Cron events (`filter.types` from [`CRON_EVENT_TYPES`]) matching `filter` like
    /// [`Store::events`]: newest first, or oldest first after a cursor. Their ids sort among
    /// the job events' ([`crate::store::JobEvent::id`]).
    pub async fn cron_events(&self, filter: &EventFilter) -> Result<Vec<CronEvent>, StoreError> {
        let want = |t: &str| filter.types.is_empty() || filter.types.iter().any(|x| x == t);
        let mut outcomes: Vec<&str> = Vec::new();
        if want("cron.triggered") {
            outcomes.extend(["enqueued", "waiting", "triggered"]);
        }
        if want("cron.skipped") {
            outcomes.push("skipped");
        }
        if outcomes.is_empty() {
            return Ok(Vec::new());
        }
        let sql = match (filter.job_id.is_some(), filter.after.is_some()) {
            (false, true) => CRON_EVENTS_AFTER,
            (false, false) => CRON_EVENTS_NEWEST_FIRST,
            (true, true) => CRON_EVENTS_OF_JOB_AFTER,
            (true, false) => CRON_EVENTS_OF_JOB_NEWEST_FIRST,
        };
        let rows = super::events::bind_filter(sql, outcomes, filter)?.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                let outcome: String = r.try_get("outcome")?;
                let skipped = outcome == "skipped";
                let skip_reason: Option<String> = r.try_get("skip_reason")?;
                Ok(CronEvent {
                    id: r.try_get("id")?,
                    event_type: if skipped { "cron.skipped" } else { "cron.triggered" },
                    cron_name: r.try_get("cron_name")?,
                    expression: r.try_get("expression")?,
                    timezone: r.try_get("timezone")?,
                    scheduled_time: ts(r, "scheduled_for")?,
                    actual_time: ts(r, "fired_at")?,
                    job_id: r.try_get("job_id")?,
                    job_type: r.try_get("job_type")?,
                    queue: r.try_get("queue")?,
                    manual: outcome == "triggered",
                    reason: skipped.then_some(if skip_reason.as_deref() == Some(DST_SKIP) { DST_SKIP } else { "overlap_skip" }),
                    run_count: r.try_get("run_number")?,
                    active_job_id: r.try_get("active_job_id")?,
                })
            })
            .collect()
    }

    /// Registers a cron job, or updates the one of that name (OJS upsert). Returns it and
    /// whether it was new. Audited.
    ///
    /// A new cron job's next run is computed from now, and so is an updated one's when its
    /// expression, time zone or enabled flag changed. Otherwise the stored next run is kept:
    /// applications re-register every cron job at each deploy, and recomputing from now would
    /// push an `@every 24h` job back a day each time, and drop a tick that fell due while the
    /// server was down instead of catching it up once.
    pub async fn register_cron(&self, spec: &CronSpec, actor: &Actor) -> Result<(CronJob, bool), StoreError> {
        validate_cron_name(&spec.name)?;
        check(&spec.template.new_job(&spec.name, Timestamp::UNIX_EPOCH)?)?;
        let now = self.now().await?;
        // An enabled schedule without a next run would be listed as active and never fire.
        let next = match spec.enabled {
            true => Some(spec.schedule.next_tick_after(now).ok_or_else(|| {
                StoreError::invalid("cron", format!("{:?} has no run after {now}; an enabled cron job must fire", spec.schedule.expression()))
            })?),
            false => None,
        };
        let template = serde_json::to_value(&spec.template).map_err(|e| StoreError::invalid("template", e.to_string()))?;
        let mut tx = self.begin().await?;
        let row = sqlx::query(
            "INSERT INTO cron_jobs (name, expression, timezone, template, overlap_policy, enabled, description, next_run_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8::timestamptz)
             ON CONFLICT (name) DO UPDATE SET expression = EXCLUDED.expression, timezone = EXCLUDED.timezone,
                 template = EXCLUDED.template, overlap_policy = EXCLUDED.overlap_policy, enabled = EXCLUDED.enabled,
                 description = EXCLUDED.description, updated_at = now(),
                 next_run_at = CASE
                     WHEN cron_jobs.expression = EXCLUDED.expression AND cron_jobs.timezone = EXCLUDED.timezone
                          AND cron_jobs.enabled = EXCLUDED.enabled
                     THEN COALESCE(cron_jobs.next_run_at, EXCLUDED.next_run_at)
                     ELSE EXCLUDED.next_run_at END
             RETURNING *, (xmax = 0) AS inserted",
        )
        .bind(&spec.name)
        .bind(spec.schedule.expression())
        .bind(spec.schedule.timezone())
        .bind(&template)
        .bind(spec.overlap_policy.as_str())
        .bind(spec.enabled)
        .bind(&spec.description)
        .bind(next.map(|t| t.to_string()))
        .fetch_one(&mut *tx)
        .await?;
        let inserted: bool = row.try_get("inserted")?;
        let details = json!({"expression": spec.schedule.expression(), "timezone": spec.schedule.timezone(), "type": spec.template.job_type, "enabled": spec.enabled});
        record(&mut tx, actor, if inserted { "cron.register" } else { "cron.update" }, Some(&spec.name), details).await?;
        tx.commit().await?;
        Ok((cron_from_row(&row)?, inserted))
    }

    /// Every cron job by name, optionally only the enabled (`Some(true)`) or disabled ones.
    pub async fn cron_jobs(&self, enabled: Option<bool>) -> Result<Vec<CronJob>, StoreError> {
        let rows = sqlx::query("SELECT * FROM cron_jobs WHERE $1::boolean IS NULL OR enabled = $1 ORDER BY name")
            .bind(enabled)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(cron_from_row).collect()
    }

    /// One cron job.
    pub async fn cron_job(&self, name: &str) -> Result<Option<CronJob>, StoreError> {
        let row = sqlx::query("SELECT * FROM cron_jobs WHERE name = $1").bind(name).fetch_optional(&self.pool).await?;
        row.as_ref().map(cron_from_row).transpose()
    }

    /// Unregisters a cron job (jobs it already enqueued are left alone). Returns what was
    /// deleted, `None` if there was no such cron job. Audited.
    pub async fn delete_cron(&self, name: &str, actor: &Actor) -> Result<Option<CronJob>, StoreError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("DELETE FROM cron_jobs WHERE name = $1 RETURNING *").bind(name).fetch_optional(&mut *tx).await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(None);
        };
        sqlx::query("DELETE FROM cron_runs WHERE cron_name = $1").bind(name).execute(&mut *tx).await?;
        record(&mut tx, actor, "cron.delete", Some(name), json!({})).await?;
        tx.commit().await?;
        Ok(Some(cron_from_row(&row)?))
    }

    /// Pauses (`false`) or resumes a cron job. A paused one has no next run; resuming
    /// schedules the next tick from now (missed ticks are not made up). Audited.
    pub async fn set_cron_enabled(&self, name: &str, enabled: bool, actor: &Actor) -> Result<CronJob, StoreError> {
        let cron = self.cron_job(name).await?.ok_or_else(|| StoreError::Missing { what: format!("cron job {name}") })?;
        let next = if enabled {
            let schedule = CronSchedule::stored(&cron.expression, &cron.timezone).map_err(|e| StoreError::invalid(e.field, e.reason))?;
            schedule.next_tick_after(self.now().await?)
        } else {
            None
        };
        let mut tx = self.begin().await?;
        let row = sqlx::query(
            "UPDATE cron_jobs SET enabled = $2, next_run_at = $3::timestamptz, updated_at = now() WHERE name = $1 RETURNING *",
        )
        .bind(name)
        .bind(enabled)
        .bind(next.map(|t| t.to_string()))
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::Missing { what: format!("cron job {name}") })?;
        record(&mut tx, actor, if enabled { "cron.resume" } else { "cron.pause" }, Some(name), json!({})).await?;
        tx.commit().await?;
        cron_from_row(&row)
    }

    /// Enqueues a cron job's job now, outside its schedule and whatever its overlap policy
    /// (an operator asked for it). The schedule is unchanged. Audited.
    pub async fn trigger_cron(&self, name: &str, actor: &Actor) -> Result<(CronJob, Job), StoreError> {
        let cron = self.cron_job(name).await?.ok_or_else(|| StoreError::Missing { what: format!("cron job {name}") })?;
        let now = self.now().await?;
        let new_job = cron.template.new_job(name, now)?;
        let max_attempts = check(&new_job)?;
        let mut tx = self.begin().await?;
        let job = insert_one(&mut tx, &new_job, max_attempts).await?;
        let row = sqlx::query(
            "UPDATE cron_jobs SET last_run_at = now(), last_job_id = $2, last_outcome = 'triggered', run_count = run_count + 1, updated_at = now()
             WHERE name = $1 RETURNING *",
        )
        .bind(name)
        .bind(job.id)
        .fetch_one(&mut *tx)
        .await?;
        let run_count: i64 = row.try_get("run_count")?;
        sqlx::query(
            "INSERT INTO cron_runs (cron_name, scheduled_for, outcome, job_id, run_number) VALUES ($1, $2::timestamptz, 'triggered', $3, $4)
             ON CONFLICT DO NOTHING",
        )
        .bind(name)
        .bind(now.to_string())
        .bind(job.id)
        .bind(run_count)
        .execute(&mut *tx)
        .await?;
        record(&mut tx, actor, "cron.trigger", Some(name), json!({"job_id": job.id})).await?;
        tx.commit().await?;
        Ok((cron_from_row(&row)?, job))
    }

    /// Fires every due tick (at most `limit` cron jobs per pass; a cron job whose ticks were
    /// missed fires once and moves on to its next future tick), and releases jobs held back by
    /// the `enqueue` overlap policy whose predecessors finished. Safe to run from any number of
    /// processes at once: each tick is taken by exactly one.
    pub async fn fire_due_crons(&self, limit: i64) -> Result<CronPass, StoreError> {
        let mut pass = CronPass { released: self.release_waiting_cron_jobs().await?, ..CronPass::default() };
        // In maintenance mode ticks wait; when it ends, a missed tick fires once, as after downtime.
        let due = sqlx::query(
            "SELECT *, now() AS db_now FROM cron_jobs WHERE enabled AND next_run_at <= now() AND NOT EXISTS (SELECT 1 FROM maintenance)
             ORDER BY next_run_at LIMIT $1",
        )
            .bind(limit.max(1))
            .fetch_all(&self.pool)
            .await?;
        for row in &due {
            let cron = cron_from_row(row)?;
            let now = ts(row, "db_now")?;
            match self.fire_tick(&cron, now).await {
                Ok(Some("skipped")) => pass.skipped += 1,
                Ok(Some(_)) => pass.fired += 1,
                Ok(None) => {}
                Err(e) => tracing::warn!(cron = cron.name, error = %e, "cron tick failed; it is tried again on the next pass"),
            }
        }
        // The runs' history ages out with the pruner (`cron_runs_after`, each cron keeping its
        // latest run and those whose jobs have not finished), in batches, not here.
        Ok(pass)
    }

    /// Time until the earliest enabled cron job's next tick, by the database's clock. `None`
    /// when no tick is scheduled, or when one is already due: a pass has just run and left it
    /// (maintenance mode holds it, or firing it failed), so waking early would not fire it.
    pub async fn time_until_next_cron_tick(&self) -> Result<Option<Duration>, StoreError> {
        let seconds: Option<f64> =
            sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM min(next_run_at) - now())::float8 FROM cron_jobs WHERE enabled").fetch_one(&self.pool).await?;
        Ok(seconds.filter(|s| *s > 0.0).and_then(|s| Duration::try_from_secs_f64(s).ok()))
    }

    /// Takes and decides one tick of `cron`, read as due at `now`. `None` when another firer
    /// took the tick first (or the cron job changed meanwhile).
    async fn fire_tick(&self, cron: &CronJob, now: Timestamp) -> Result<Option<&'static str>, StoreError> {
        let Some(tick) = cron.next_tick_at else { return Ok(None) };
        let schedule = CronSchedule::stored(&cron.expression, &cron.timezone).map_err(|e| StoreError::invalid(e.field, e.reason))?;
        // Catch-up fires once: the next tick is the first one after now, not after the missed one.
        // A daylight-saving skip fires nothing, so the run after it is not a catch-up to fold
        // away: it is the tick after the skip, fired on the next pass if it is due already.
        let dst_skip = schedule.skips_at(tick);
        let next = if dst_skip { schedule.next_tick_after(tick) } else { schedule.tick_after(tick, now) };
        let mut tx = self.begin().await?;
        let taken = sqlx::query(
            "UPDATE cron_jobs SET next_run_at = $3::timestamptz, updated_at = now()
             WHERE name = $1 AND enabled AND next_run_at = $2::timestamptz",
        )
        .bind(&cron.name)
        .bind(tick.to_string())
        .bind(next.map(|t| t.to_string()))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if taken == 0 {
            // Another process fired this tick.
            tx.rollback().await?;
            return Ok(None);
        }
        let claimed = sqlx::query("INSERT INTO cron_runs (cron_name, scheduled_for, outcome) VALUES ($1, $2::timestamptz, 'deciding') ON CONFLICT DO NOTHING")
            .bind(&cron.name)
            .bind(tick.to_string())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if claimed == 0 {
            // Decided before (the cron job was put back onto a tick it already fired): the
            // tick stays consumed and the schedule moves on.
            tx.commit().await?;
            return Ok(None);
        }
        // What overlaps (OJS §6): for skip and cancel_previous, an earlier run that is running
        // (`active`); for enqueue, one that has not finished (waiting ones would run alongside).
        let running_only = cron.overlap_policy != OverlapPolicy::Enqueue;
        let unfinished: Vec<Uuid> = sqlx::query_scalar(
            "SELECT j.id FROM cron_runs r JOIN jobs j ON j.id = r.job_id
             WHERE r.cron_name = $1 AND j.state NOT IN ('completed', 'cancelled', 'discarded')
               AND (NOT $2 OR j.state = 'active')
             ORDER BY r.scheduled_for DESC LIMIT 100",
        )
        .bind(&cron.name)
        .bind(running_only)
        .fetch_all(&mut *tx)
        .await?;
        let (outcome, job) = match cron.overlap_policy {
            _ if dst_skip => ("skipped", None),
            OverlapPolicy::Skip if !unfinished.is_empty() => ("skipped", None),
            policy => {
                if policy == OverlapPolicy::CancelPrevious && !unfinished.is_empty() {
                    sqlx::query(
                        "UPDATE jobs SET state = 'cancelled', cancelled_at = now(), locked_by = NULL, lock_expires_at = NULL, updated_at = now()
                         WHERE id = ANY($1) AND state NOT IN ('completed', 'cancelled', 'discarded')",
                    )
                    .bind(&unfinished)
                    .execute(&mut *tx)
                    .await?;
                }
                let hold = policy == OverlapPolicy::Enqueue && !unfinished.is_empty();
                if hold && unfinished.len() >= 2 {
                    tracing::warn!(cron = cron.name, queued = unfinished.len() + 1, "cron job with overlap policy \"enqueue\" is piling up runs");
                }
                let mut new_job = cron.template.new_job(&cron.name, tick)?;
                new_job.pending = hold;
                let job = enqueue_tick(&mut tx, &cron.name, &new_job).await?;
                (if hold { "waiting" } else { "enqueued" }, job)
            }
        };
        let job_id = job.as_ref().map(|j| j.id);
        let recorded = if job.is_none() && outcome != "skipped" { "failed" } else { outcome };
        // run_count and last_run_at count triggers (OJS §2.2), so a skipped or failed tick
        // leaves them alone, though it took the tick above.
        let run_count: i64 = sqlx::query_scalar(
            "UPDATE cron_jobs SET last_job_id = COALESCE($2, last_job_id), last_outcome = $3,
                 last_run_at = CASE WHEN $2::uuid IS NULL THEN last_run_at ELSE now() END,
                 run_count = run_count + CASE WHEN $2::uuid IS NULL THEN 0 ELSE 1 END
             WHERE name = $1 RETURNING run_count",
        )
        .bind(&cron.name)
        .bind(job_id)
        .bind(recorded)
        .fetch_one(&mut *tx)
        .await?;
        // The run's number for its `cron.triggered` event; for a skip, the run in the way
        // (the newest, if several are).
        sqlx::query(
            "UPDATE cron_runs SET outcome = $3, job_id = $4, run_number = CASE WHEN $4::uuid IS NULL THEN NULL ELSE $5 END, active_job_id = $6,
                 skip_reason = $7
             WHERE cron_name = $1 AND scheduled_for = $2::timestamptz",
        )
        .bind(&cron.name)
        .bind(tick.to_string())
        .bind(recorded)
        .bind(job_id)
        .bind(run_count)
        .bind(if outcome == "skipped" && !dst_skip { unfinished.first().copied() } else { None })
        .bind(match (outcome, dst_skip) {
            (_, true) => Some(DST_SKIP),
            ("skipped", false) => Some("overlap_skip"),
            _ => None,
        })
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        if dst_skip {
            tracing::info!(cron = cron.name, %tick, timezone = cron.timezone, "cron tick skipped: a daylight-saving jump swallowed its time");
        } else if outcome == "skipped" {
            tracing::debug!(cron = cron.name, %tick, "cron tick skipped: the previous run is still running (overlap policy \"skip\")");
        }
        Ok(Some(outcome))
    }

    /// Releases, per cron job, the oldest job held back under `enqueue` once no earlier run of
    /// that cron job is waiting or running.
    async fn release_waiting_cron_jobs(&self) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let queues: Vec<String> = sqlx::query_scalar(
            "WITH waiting AS (
                 SELECT DISTINCT ON (r.cron_name) r.cron_name, r.job_id
                 FROM cron_runs r JOIN jobs j ON j.id = r.job_id
                 WHERE r.outcome = 'waiting' AND j.state = 'pending'
                 ORDER BY r.cron_name, r.scheduled_for
             ), free AS (
                 SELECT w.job_id FROM waiting w
                 WHERE NOT EXISTS (
                     SELECT 1 FROM cron_runs r2 JOIN jobs a ON a.id = r2.job_id
                     WHERE r2.cron_name = w.cron_name AND a.state IN ('scheduled', 'available', 'active', 'retryable'))
             )
             UPDATE jobs SET state = 'available', enqueued_at = now(), updated_at = now()
             FROM free WHERE jobs.id = free.job_id AND jobs.state = 'pending'
             RETURNING jobs.queue",
        )
        .fetch_all(&mut *tx)
        .await?;
        let released = queues.len() as u64;
        let mut distinct = queues;
        distinct.sort();
        distinct.dedup();
        notify_queues(&mut *tx, &distinct).await?;
        tx.commit().await?;
        Ok(released)
    }
}

/// Enqueues a tick's job inside the firing transaction. A template that no longer validates
/// (a hand edit) is logged and the tick recorded as `failed` rather than retried forever.
async fn enqueue_tick(conn: &mut PgConnection, cron: &str, job: &NewJob) -> Result<Option<Job>, StoreError> {
    let max_attempts = match check(job) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(cron, error = %e, "cron job's template is invalid; tick not enqueued");
            return Ok(None);
        }
    };
    Ok(Some(insert_one(conn, job, max_attempts).await?))
}
