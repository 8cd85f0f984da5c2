//! The job model: the eight OJS states, a stored [`Job`], and a [`NewJob`] to enqueue.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::policy::PolicyPatch;
use crate::{bounds, storable};

/// Where a job is in its life. Three states are terminal: `completed`, `cancelled`, `discarded`.
///
/// Dead letters are `discarded` jobs with [`Job::dead_letter`] set: they are kept for re-drive,
/// whereas plain discards may be pruned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "job_state", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Not yet due.
    Scheduled,
    /// Due and waiting for a worker.
    Available,
    /// Staged, waiting for an explicit activation (OJS `options.pending`).
    Pending,
    /// Claimed by a worker; its handler is running.
    Active,
    /// Finished successfully.
    Completed,
    /// Failed; a retry is scheduled.
    Retryable,
    /// Cancelled by a person or a client.
    Cancelled,
    /// Gave up (exhausted, non-retryable, discarded or dead-lettered by its handler, expired).
    Discarded,
}

impl JobState {
    /// Every state, in lifecycle order (useful for filters and stats).
    pub const ALL: [JobState; 8] = [
        JobState::Scheduled,
        JobState::Available,
        JobState::Pending,
        JobState::Active,
        JobState::Completed,
        JobState::Retryable,
        JobState::Cancelled,
        JobState::Discarded,
    ];

    /// `states` as a list of SQL literals, `'a', 'b'`: for conditions that must spell states
    /// out (only a literal lets the planner prove a partial index's predicate). The names come
    /// from the enum, never from input.
    pub(crate) fn sql_literals(states: &[JobState]) -> String {
        states.iter().map(|s| format!("'{}'", s.as_str())).collect::<Vec<_>>().join(", ")
    }

    /// The wire name (`"available"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Available => "available",
            JobState::Pending => "pending",
            JobState::Active => "active",
            JobState::Completed => "completed",
            JobState::Retryable => "retryable",
            JobState::Cancelled => "cancelled",
            JobState::Discarded => "discarded",
        }
    }

    /// Terminal states accept no further transition (except a dead-letter re-drive).
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Completed | JobState::Cancelled | JobState::Discarded)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name given was not one of the eight states.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("unknown job state {0:?}; expected one of scheduled, available, pending, active, completed, retryable, cancelled, discarded")]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// A job as stored.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Job {
    /// UUIDv7: ordering by id is ordering by creation.
    pub id: Uuid,
    /// Dot-namespaced job type, e.g. `email.send`.
    #[serde(rename = "type")]
    pub job_type: String,
    pub queue: String,
    /// Always a JSON array.
    pub args: Value,
    pub meta: Value,
    /// Unknown top-level envelope fields, kept verbatim for OJS clients.
    pub extra: Value,
    pub priority: i16,
    pub tags: Vec<String>,
    pub state: JobState,
    /// Executions so far (counted when claimed).
    pub attempt: i32,
    /// From the effective policy; refreshed each time a failure is recorded.
    pub max_attempts: i32,
    /// The job's own partial retry policy, as JSON (see [`PolicyPatch::from_json`]).
    pub retry: Option<Value>,
    pub timeout_ms: Option<i64>,
    pub visibility_timeout_ms: Option<i64>,
    pub unique_key: Option<String>,
    pub scheduled_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub enqueued_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub completed_at: Option<Timestamp>,
    pub cancelled_at: Option<Timestamp>,
    pub discarded_at: Option<Timestamp>,
    pub locked_by: Option<String>,
    pub lock_expires_at: Option<Timestamp>,
    pub dead_letter: bool,
    pub dead_lettered_at: Option<Timestamp>,
    pub result: Option<Value>,
    /// Mirror of the latest failed attempt, for fast listing:
    /// `{type, code, message, details, retryable, attempt, occurred_at}`.
    pub last_error: Option<Value>,
    pub retry_delay_ms: Option<i64>,
    pub updated_at: Timestamp,
    /// The rate-limit key whose limits (concurrency, rate window) the job shares (OJS
    /// `rate_limit.key`).
    pub rate_limit_key: Option<String>,
    /// `available` but waiting for a slot of its key: no claim takes it until it is admitted.
    pub rate_limited: bool,
    /// What the job does when its key's limit leaves it waiting (cleared to `wait` by an
    /// operator's retry, run-now or re-drive).
    pub on_limit: OnLimit,
}

impl Job {
    /// The job's own retry override, parsed. A stored override was validated at enqueue, so a
    /// parse failure here means the row was edited by hand; it is reported, not ignored. (A
    /// `max_attempts` stored before its bound reads capped, see [`PolicyPatch::from_stored_json`].)
    pub fn retry_patch(&self) -> Result<Option<PolicyPatch>, crate::policy::PolicyError> {
        self.retry.as_ref().map(PolicyPatch::from_stored_json).transpose()
    }

    /// When the next execution is due, for jobs waiting on a retry or a schedule.
    pub fn next_run_at(&self) -> Option<Timestamp> {
        matches!(self.state, JobState::Retryable | JobState::Scheduled).then_some(self.scheduled_at)
    }
}

/// What to do when an enqueue clashes with a live job holding the same unique key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnConflict {
    /// Refuse the new job (the API answers 409).
    Reject,
    /// Keep the existing job and return it instead (idempotent enqueue).
    Ignore,
    /// Cancel the existing job and enqueue the new one.
    Replace,
    /// Like [`OnConflict::Replace`], but a `scheduled` job's time is kept: the new job runs
    /// when the one it replaces would have (OJS `replace_except_schedule`). Only `scheduled`:
    /// the spec makes it `replace` for every other state, a `retryable` job's backoff included.
    ReplaceExceptSchedule,
}

/// Uniqueness of an enqueue: the key, what to do on a clash, which states count, and for how long.
#[derive(Clone, Debug, PartialEq)]
pub struct UniqueSpec {
    /// Already computed; see [`UniqueSpec::key_from_fields`].
    pub key: String,
    pub on_conflict: OnConflict,
    /// States in which an existing job blocks the new one; empty means every non-terminal state.
    pub states: Vec<JobState>,
    /// The key stops counting this long after the existing job was enqueued.
    pub period: Option<Duration>,
}

impl UniqueSpec {
    /// The default blocking states: every state in which the job may still run.
    pub fn default_states() -> Vec<JobState> {
        JobState::ALL.into_iter().filter(|s| !s.is_terminal()).collect()
    }

    /// Builds a stable key from the named envelope fields (`type`, `queue`, `args`, `meta`),
    /// hashed so arbitrarily large args make a fixed-size, indexable key.
    pub fn key_from_fields(job: &NewJob, fields: &[String]) -> Result<String, JobValidationError> {
        let mut hasher = Sha256::new();
        let mut sorted: Vec<&str> = fields.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() {
            sorted = vec!["args", "queue", "type"];
        }
        for field in sorted {
            let part = match field {
                "type" => Value::String(job.job_type.clone()),
                "queue" => Value::String(job.queue.clone()),
                "args" => job.args.clone(),
                "meta" => job.meta.clone(),
                other => {
                    return Err(JobValidationError::new(
                        "options.unique.keys",
                        format!("unknown key {other:?}; use type, queue, args or meta"),
                    ));
                }
            };
            hasher.update(field.as_bytes());
            hasher.update([0]);
            // serde_json keeps object keys sorted (no preserve_order), so this is canonical.
            hasher.update(part.to_string().as_bytes());
            hasher.update([0]);
        }
        Ok(hex::encode(hasher.finalize()))
    }
}

/// A job to enqueue. Build with [`NewJob::new`] and set what you need.
#[derive(Clone, Debug, PartialEq)]
pub struct NewJob {
    /// Client-chosen UUIDv7; generated when absent.
    pub id: Option<Uuid>,
    pub job_type: String,
    pub queue: String,
    pub args: Value,
    pub meta: Value,
    pub extra: Value,
    pub priority: i16,
    pub tags: Vec<String>,
    pub retry: Option<PolicyPatch>,
    pub timeout_ms: Option<i64>,
    pub visibility_timeout_ms: Option<i64>,
    /// Run no earlier than this; `None` means now.
    pub scheduled_at: Option<Timestamp>,
    /// Discard without running once this passes.
    pub expires_at: Option<Timestamp>,
    pub unique: Option<UniqueSpec>,
    /// Stage in `pending` until activated.
    pub pending: bool,
    /// Share a keyed concurrency limit with every job of the same key.
    pub rate_limit: Option<JobRateLimit>,
}

/// A job's keyed limit (an OJS `RateLimitPolicy` with its `key`): at most `concurrency` jobs
/// of the key, in any queue, are active or about to be at once, and at most `rate.limit` of
/// them start per `rate.period`; the rest wait, `available`, and are admitted highest
/// priority first as slots free up and windows open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRateLimit {
    /// `^[a-zA-Z0-9][a-zA-Z0-9._:-]*$`, at most [`MAX_RATE_LIMIT_KEY`] bytes. Keys beginning
    /// `queue:` are refused: they name a queue's own limit, which is set on the queue.
    pub key: String,
    /// Sets the key's limit (the newest enqueue naming one wins); `None` leaves it as it is.
    /// 0 holds every job of the key.
    pub concurrency: Option<u32>,
    /// Sets the key's rate window (fixed windows, starts counted at admission; the newest
    /// enqueue naming one wins); `None` leaves it as it is. A limit of 0 holds every job.
    pub rate: Option<crate::store::Window>,
    /// Sets the key's throttle: its jobs start at least `period / limit` apart (counted at
    /// admission, as the rate window is; the newest enqueue naming one wins); `None` leaves it
    /// as it is.
    pub throttle: Option<crate::store::Window>,
    /// What this job does when its key's limit leaves it waiting.
    pub on_limit: OnLimit,
}

/// What a keyed job does when its key's limit leaves it waiting (OJS `on_limit`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnLimit {
    /// Stays `available` and is admitted when the limit allows.
    #[default]
    Wait,
    /// Moves to `scheduled` at the time the limit is expected to let it start: the end of the
    /// key's hold, of an override of 0 with an end, or of its spent rate window, whichever is
    /// latest. (When the concurrency alone holds it, no time can be named: it waits, and is
    /// admitted when a slot frees.)
    Reschedule,
    /// Is discarded (`rate_limit.dropped`, an attempt row `dropped`, `job.discarded`): for
    /// jobs whose freshness matters more than their completeness.
    Drop,
}

impl OnLimit {
    /// The OJS spelling: `wait`, `reschedule`, `drop`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnLimit::Wait => "wait",
            OnLimit::Reschedule => "reschedule",
            OnLimit::Drop => "drop",
        }
    }

    /// From the OJS spelling.
    pub fn parse(s: &str) -> Option<OnLimit> {
        [OnLimit::Wait, OnLimit::Reschedule, OnLimit::Drop].into_iter().find(|o| o.as_str() == s)
    }

    /// As stored in `jobs.rate_limit_on_limit` (`NULL` for the default).
    pub(crate) fn stored(self) -> Option<&'static str> {
        (self != OnLimit::Wait).then(|| self.as_str())
    }
}

/// The longest rate-limit key.
pub const MAX_RATE_LIMIT_KEY: usize = 255;

/// The highest keyed concurrency limit.
pub const MAX_RATE_LIMIT_CONCURRENCY: u32 = 1_000_000;

/// Checks a rate-limit key (`field` names it in the error).
pub fn validate_rate_limit_key(key: &str, field: &str) -> Result<(), JobValidationError> {
    let mut chars = key.chars();
    let ok = key.len() <= MAX_RATE_LIMIT_KEY
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'));
    if !ok {
        return Err(JobValidationError::new(
            field,
            // At most 64 characters of it back: an oversized key is not echoed whole.
            format!(
                "{:?} is not a valid rate-limit key: letters, digits, '.', '_', ':' and '-', starting with a letter or digit, at most {MAX_RATE_LIMIT_KEY} characters",
                key.chars().take(64).collect::<String>()
            ),
        ));
    }
    if key.starts_with("queue:") {
        return Err(JobValidationError::new(field, format!("{key:?} names a queue's limit, which is set on the queue (PUT /ojs/v1/admin/queues/{{name}}/rate-limit), not by its jobs")));
    }
    Ok(())
}

impl NewJob {
    /// A job of `job_type` with `args` (a JSON array) on the `default` queue.
    pub fn new(job_type: impl Into<String>, args: Value) -> Self {
        NewJob {
            id: None,
            job_type: job_type.into(),
            queue: "default".to_string(),
            args,
            meta: Value::Object(Default::default()),
            extra: Value::Object(Default::default()),
            priority: 0,
            tags: Vec::new(),
            retry: None,
            timeout_ms: None,
            visibility_timeout_ms: None,
            scheduled_at: None,
            expires_at: None,
            unique: None,
            pending: false,
            rate_limit: None,
        }
    }

    /// The job this becomes once stored in `state` at `created_at`: nothing has run, and every
    /// time but its creation (and its schedule, when it had none) is unset. `max_attempts`
    /// is the effective policy's, which only the store knows.
    pub fn into_job(self, id: Uuid, state: JobState, max_attempts: i32, created_at: Timestamp) -> Job {
        Job {
            id,
            job_type: self.job_type,
            queue: self.queue,
            args: self.args,
            meta: self.meta,
            extra: self.extra,
            priority: self.priority,
            tags: self.tags,
            state,
            attempt: 0,
            max_attempts,
            retry: self.retry.as_ref().map(PolicyPatch::to_json),
            timeout_ms: self.timeout_ms,
            visibility_timeout_ms: self.visibility_timeout_ms,
            unique_key: self.unique.map(|u| u.key),
            scheduled_at: self.scheduled_at.unwrap_or(created_at),
            expires_at: self.expires_at,
            created_at,
            enqueued_at: (state == JobState::Available).then_some(created_at),
            started_at: None,
            completed_at: None,
            cancelled_at: None,
            discarded_at: None,
            locked_by: None,
            lock_expires_at: None,
            dead_letter: false,
            dead_lettered_at: None,
            result: None,
            last_error: None,
            retry_delay_ms: None,
            updated_at: created_at,
            on_limit: self.rate_limit.as_ref().map_or(OnLimit::Wait, |r| r.on_limit),
            rate_limit_key: self.rate_limit.map(|r| r.key),
            rate_limited: false,
        }
    }

    /// Sets the queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Sets the job's own retry override.
    pub fn retry(mut self, patch: PolicyPatch) -> Self {
        self.retry = Some(patch);
        self
    }

    /// Shares the concurrency limit of rate-limit `key` (setting it to `concurrency`, if given;
    /// and keeps a window [`NewJob::rate_limit_window`] set for the same key).
    pub fn rate_limit(mut self, key: impl Into<String>, concurrency: Option<u32>) -> Self {
        let key = key.into();
        let kept = self.kept_rate_limit(&key);
        self.rate_limit = Some(JobRateLimit { key, concurrency, ..kept });
        self
    }

    /// The keyed limit set so far for `key` (a default one if none is, or it names another).
    fn kept_rate_limit(&mut self, key: &str) -> JobRateLimit {
        self.rate_limit.take().filter(|r| r.key == key).unwrap_or(JobRateLimit {
            key: key.to_owned(),
            concurrency: None,
            rate: None,
            throttle: None,
            on_limit: OnLimit::Wait,
        })
    }

    /// What the job does when its key's limit leaves it waiting (a [`NewJob::rate_limit`] or
    /// [`NewJob::rate_limit_window`] must name the key; without one this does nothing).
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        if let Some(r) = self.rate_limit.as_mut() {
            r.on_limit = on_limit;
        }
        self
    }

    /// Shares the rate window of rate-limit `key`, setting it to at most `limit` starts per
    /// `period` (and keeps a concurrency [`NewJob::rate_limit`] set for the same key).
    pub fn rate_limit_window(mut self, key: impl Into<String>, limit: u32, period: std::time::Duration) -> Self {
        let key = key.into();
        let kept = self.kept_rate_limit(&key);
        self.rate_limit = Some(JobRateLimit { key, rate: Some(crate::store::Window { limit, period }), ..kept });
        self
    }

    /// Shares the throttle of rate-limit `key`, setting it to at most `limit` starts per
    /// `period`, spaced evenly (at least `period / limit` apart), keeping whatever else is set
    /// for the same key.
    pub fn rate_limit_throttle(mut self, key: impl Into<String>, limit: u32, period: std::time::Duration) -> Self {
        let key = key.into();
        let kept = self.kept_rate_limit(&key);
        self.rate_limit = Some(JobRateLimit { key, throttle: Some(crate::store::Window { limit, period }), ..kept });
        self
    }

    /// Checks the envelope the way OJS does; the error names the offending field.
    pub fn validate(&self) -> Result<(), JobValidationError> {
        validate_type(&self.job_type)?;
        validate_queue(&self.queue)?;
        check_args(&self.args).map_err(|r| JobValidationError::new("args", r))?;
        check_meta(&self.meta).map_err(|r| JobValidationError::new("meta", r))?;
        check_priority(self.priority).map_err(|r| JobValidationError::new("options.priority", r))?;
        if let Some(id) = self.id
            && id.get_version_num() != 7
        {
            return Err(JobValidationError::new("id", "must be a UUIDv7"));
        }
        for (field, v) in [
            ("options.timeout_ms", self.timeout_ms),
            ("options.visibility_timeout_ms", self.visibility_timeout_ms),
        ] {
            if let Some(ms) = v {
                bounds::check_timeout_ms(ms).map_err(|reason| JobValidationError::new(field, reason))?;
            }
        }
        for (field, v) in [("options.scheduled_at", self.scheduled_at), ("options.expires_at", self.expires_at)] {
            if let Some(t) = v {
                bounds::check_time(t).map_err(|reason| JobValidationError::new(field, reason))?;
            }
        }
        if let Some(period) = self.unique.as_ref().and_then(|u| u.period) {
            bounds::check_interval(period).map_err(|reason| JobValidationError::new("options.unique.period", reason))?;
        }
        if let Some(limit) = &self.rate_limit {
            validate_rate_limit_key(&limit.key, "options.rate_limit.key")?;
            if limit.concurrency.is_some_and(|c| c > MAX_RATE_LIMIT_CONCURRENCY) {
                return Err(JobValidationError::new("options.rate_limit.concurrency", format!("must be at most {MAX_RATE_LIMIT_CONCURRENCY}")));
            }
            if let Some(w) = &limit.rate {
                if w.limit > MAX_RATE_LIMIT_CONCURRENCY {
                    return Err(JobValidationError::new("options.rate_limit.rate.limit", format!("must be at most {MAX_RATE_LIMIT_CONCURRENCY}")));
                }
                w.check_period().map_err(|reason| JobValidationError::new("options.rate_limit.rate.period", reason))?;
            }
            if let Some(w) = &limit.throttle {
                if w.limit > MAX_RATE_LIMIT_CONCURRENCY {
                    return Err(JobValidationError::new("options.rate_limit.throttle.limit", format!("must be at most {MAX_RATE_LIMIT_CONCURRENCY}")));
                }
                w.check_throttle().map_err(|(field, reason)| JobValidationError::new(format!("options.rate_limit.throttle.{field}"), reason))?;
            }
        }
        self.check_storable()
    }

    /// Refuses text and numbers Postgres could not store or give back (see [`storable`]).
    fn check_storable(&self) -> Result<(), JobValidationError> {
        let unstorable = |e: storable::Unstorable| JobValidationError::new(e.path, e.reason);
        storable::check(&self.args, "args").map_err(unstorable)?;
        storable::check(&self.meta, "meta").map_err(unstorable)?;
        // Extension fields sit at the top level of the envelope (and under `options`).
        storable::check(&self.extra, "").map_err(unstorable)?;
        for (i, tag) in self.tags.iter().enumerate() {
            storable::check_text(tag, &format!("options.tags[{i}]")).map_err(unstorable)?;
        }
        Ok(())
    }
}

/// Job types are dot-separated segments of `[a-z][a-z0-9_-]*` (OJS; hyphens allowed as the
/// conformance suites require).
pub fn validate_type(t: &str) -> Result<(), JobValidationError> {
    let ok = !t.is_empty()
        && t.len() <= 255
        && t.split('.').all(|seg| {
            let mut chars = seg.chars();
            matches!(chars.next(), Some('a'..='z'))
                && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
        });
    if ok {
        Ok(())
    } else {
        Err(JobValidationError::new(
            "type",
            format!("{t:?} is not a valid job type: use dot-separated lowercase segments such as \"email.send\""),
        ))
    }
}

/// Checks a job-type filter: a job type, or a type's prefix followed by `.*` (`email.*`
/// matches `email.send` and `email.digest.weekly`; see [`crate::store::JobFilter::job_type`]).
pub fn validate_type_filter(t: &str) -> Result<(), JobValidationError> {
    match t.strip_suffix(".*") {
        Some(prefix) => validate_type(prefix).map_err(|_| {
            JobValidationError::new("type", format!("{t:?} is not a job type or a prefix of one: use a type such as \"email.send\", or \"email.*\" for every type under email"))
        }),
        None => validate_type(t),
    }
}

/// Queue names are `[a-z0-9][a-z0-9.-]*`, at most 128 characters.
/// Args are a JSON array. The reason, for the caller to put under its own field name.
pub fn check_args(args: &Value) -> Result<(), String> {
    if args.is_array() { Ok(()) } else { Err("must be a JSON array".into()) }
}

/// Meta is a JSON object.
pub fn check_meta(meta: &Value) -> Result<(), String> {
    if meta.is_object() { Ok(()) } else { Err("must be a JSON object".into()) }
}

/// Priorities run from -100 to 100.
pub fn check_priority(priority: i16) -> Result<(), String> {
    if (-100..=100).contains(&priority) { Ok(()) } else { Err(format!("must be between -100 and 100, got {priority}")) }
}

pub fn validate_queue(q: &str) -> Result<(), JobValidationError> {
    let mut chars = q.chars();
    let ok = q.len() <= 128
        && matches!(chars.next(), Some('a'..='z' | '0'..='9'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '.' | '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err(JobValidationError::new(
            "options.queue",
            format!("{q:?} is not a valid queue name: lowercase letters, digits, '.', '-' and '_', starting with a letter or digit, at most 128 characters"),
        ))
    }
}

/// An envelope field is invalid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct JobValidationError {
    /// The field, as an OJS client names it (`type`, `options.queue`, …).
    pub field: String,
    pub reason: String,
}

impl JobValidationError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        JobValidationError { field: field.into(), reason: reason.into() }
    }
}

/// One execution of a job: a `job_attempts` row, or for the execution that completed the
/// job, the job row itself (see the `job_history` view).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Attempt {
    /// The `job_attempts` row; `None` for the completing execution.
    pub id: Option<i64>,
    pub job_id: Uuid,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
    /// `completed`, `retried`, `snoozed`, `discarded`, `dead_lettered`, `failed`,
    /// `exhausted`, `non_retryable`, `released`, `cancelled` (cancelled while it ran),
    /// `dropped` (its key's limit reached, `on_limit: drop`: it never ran).
    pub outcome: String,
    pub error_type: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub error_details: Option<Value>,
    pub delay_ms: Option<i64>,
    pub next_run_at: Option<Timestamp>,
    /// The effective policy the decision used.
    pub policy: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn job_types_follow_the_ojs_pattern() {
        for ok in ["email.send", "dlq.test.list-first", "a", "a1_b.c-d"] {
            assert!(validate_type(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Email.Send", "email send", "1email.send", "email@send!", "a..b", "a."] {
            let e = validate_type(bad).unwrap_err();
            assert_eq!(e.field, "type", "{bad}");
        }
    }

    #[test]
    fn queue_names_follow_the_ojs_pattern() {
        assert!(validate_queue("default").is_ok());
        assert!(validate_queue("visibility-test").is_ok());
        assert!(validate_queue("q.1").is_ok());
        assert!(validate_queue("Bad Queue").is_err());
        assert!(validate_queue(&"a".repeat(129)).is_err());
        assert!(validate_queue("").is_err());
    }

    #[test]
    fn validation_names_the_field() {
        let mut j = NewJob::new("a.b", json!({}));
        assert_eq!(j.validate().unwrap_err().field, "args");
        j.args = json!([]);
        j.priority = 101;
        assert_eq!(j.validate().unwrap_err().field, "options.priority");
        j.priority = -100;
        assert!(j.validate().is_ok());
        j.id = Some(Uuid::from_u128(0x0190_0000_0000_4000_8000_0000_0000_0001));
        assert_eq!(j.validate().unwrap_err().field, "id");
    }

    #[test]
    fn states_round_trip_their_names() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), s);
        }
        assert!("done".parse::<JobState>().is_err());
        assert!(JobState::Discarded.is_terminal());
        assert!(!JobState::Retryable.is_terminal());
    }

    #[test]
    fn unique_keys_ignore_field_order_and_differ_by_content() {
        let a = NewJob::new("t", json!([1, {"b": 2, "a": 1}]));
        let b = NewJob::new("t", json!([1, {"a": 1, "b": 2}]));
        let c = NewJob::new("t", json!([2]));
        let keys = vec!["args".to_string(), "type".to_string()];
        let rev = vec!["type".to_string(), "args".to_string()];
        let ka = UniqueSpec::key_from_fields(&a, &keys).unwrap();
        assert_eq!(ka, UniqueSpec::key_from_fields(&b, &rev).unwrap());
        assert_ne!(ka, UniqueSpec::key_from_fields(&c, &keys).unwrap());
        assert!(UniqueSpec::key_from_fields(&a, &["nope".to_string()]).is_err());
    }
}
