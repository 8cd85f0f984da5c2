//! Retry policies in the OJS shape, their layered merge and their delay math.
//!
//! Everything here is pure: no clock, no database, no global randomness (jitter takes a
//! [`JitterSource`] so tests and previews are deterministic). The store calls
//! [`resolve()`] at the moment a failure is recorded, so a policy edited on the dashboard
//! applies to the next failure of jobs already in flight (DESIGN §3).
//!
//! * [`backoff`]: the five strategies and [`RetryPolicy::delay_for`].
//! * [`jitter`]: jitter modes, [`JitterSource`] and the jittered delay / band.
//! * [`non_retryable`]: `non_retryable_errors` patterns (exact, `prefix.*`, `*`).
//! * [`patch`]: [`PolicyPatch`], the partial policy with its JSON wire form.
//! * [`resolve`](mod@resolve): defaults ⊕ type ⊕ job with provenance.
//! * [`schedule`]: the planned-retries preview and the total wait.
//! * [`iso8601`]: ISO-8601 durations through jiff.

pub mod backoff;
mod duration;
pub mod iso8601;
pub mod jitter;
pub mod non_retryable;
pub mod patch;
pub mod resolve;
pub mod schedule;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use backoff::BackoffStrategy;
pub use jitter::{FixedJitter, Jitter, JitterSource};
pub use patch::PolicyPatch;
pub use resolve::{PolicySource, ResolvedPolicy, resolve};
pub use schedule::PlannedRetry;

/// What happens to a job once it cannot be retried (budget exhausted or a non-retryable
/// error). Both end in state `discarded`; only `DeadLetter` lists it in the dead-letter queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhaustion {
    /// Plain discard: the OJS default, the job is not kept for inspection.
    #[default]
    Discard,
    /// Discard and flag for the dead-letter queue, where it can be retried or deleted.
    DeadLetter,
}

impl OnExhaustion {
    /// The wire name (`"discard"` / `"dead_letter"`), also used for database text columns.
    pub fn as_str(self) -> &'static str {
        match self {
            OnExhaustion::Discard => "discard",
            OnExhaustion::DeadLetter => "dead_letter",
        }
    }
}

impl fmt::Display for OnExhaustion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnExhaustion {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "discard" => Ok(OnExhaustion::Discard),
            "dead_letter" => Ok(OnExhaustion::DeadLetter),
            other => Err(PolicyError::new(
                "on_exhaustion",
                format!("must be \"discard\" or \"dead_letter\", got {other:?}"),
            )),
        }
    }
}

/// A policy problem, always naming the offending field so the HTTP layer can answer OJS'
/// 422 `validation_error` with a message that contains the field name (conformance checks
/// `max_attempts` and `backoff_coefficient` by substring).
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
#[error("{field}: {reason}")]
pub struct PolicyError {
    /// The JSON field name (`"max_attempts"`, `"jitter"`, …); `"retry"` for the policy itself.
    pub field: String,
    /// Human-readable reason, including the offending value where that helps.
    pub reason: String,
}

impl PolicyError {
    /// Builds an error for `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        PolicyError { field: field.into(), reason: reason.into() }
    }
}

/// A complete retry policy (OJS fields plus `backoff_strategy` / `schedule`).
///
/// Built from [`RetryPolicy::default`] (the OJS defaults) and [`PolicyPatch`] layers; see
/// [`resolve()`]. Its JSON form is [`RetryPolicy::to_json`]; the serde impls use the same wire
/// form (deserializing merges the given fields over the defaults and validates).
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Total executions including the first (1 = no retry). OJS says 0 = never retry, which
    /// is the same thing, so 0 is treated like 1 everywhere.
    pub max_attempts: u32,
    /// Base delay: the first retry's delay for every strategy except `custom`.
    pub initial_interval: Duration,
    /// Growth factor for `exponential`, exponent for `polynomial`; must be ≥ 1.0.
    pub backoff_coefficient: f64,
    /// Cap on every computed delay, applied again after jitter.
    pub max_interval: Duration,
    /// How delays are randomised to avoid thundering herds.
    pub jitter: Jitter,
    /// Error types that end the job at once (exact names, `prefix.*`, or `*`).
    pub non_retryable_errors: Vec<String>,
    /// What a job becomes when it can no longer be retried.
    pub on_exhaustion: OnExhaustion,
    /// How the raw delay grows with the retry number.
    pub backoff_strategy: BackoffStrategy,
    /// Explicit delays, only used by [`BackoffStrategy::Custom`] (the last entry repeats).
    pub schedule: Vec<Duration>,
}

impl Default for RetryPolicy {
    /// The OJS defaults: 3 attempts, PT1S × 2.0 capped at PT5M, OJS jitter, discard.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_interval: Duration::from_secs(1),
            backoff_coefficient: 2.0,
            max_interval: Duration::from_secs(5 * 60),
            jitter: Jitter::Ojs,
            non_retryable_errors: Vec::new(),
            on_exhaustion: OnExhaustion::Discard,
            backoff_strategy: BackoffStrategy::Exponential,
            schedule: Vec::new(),
        }
    }
}

impl RetryPolicy {
    /// `max_attempts` as actually enforced: OJS' 0 ("never retry") behaves like 1.
    pub fn effective_max_attempts(&self) -> u32 {
        self.max_attempts.max(1)
    }

    /// Checks every field and the cross-field rules; the first problem found is returned,
    /// naming its field. Run on every merged policy, because each layer alone may be fine
    /// while their combination is not (e.g. a job's `initial_interval` above the type's
    /// `max_interval`).
    pub fn validate(&self) -> Result<(), PolicyError> {
        // A policy built in code (the worker library, a re-drive override) skips the JSON
        // parser's bound, and `jobs.max_attempts` holds no more than this.
        if self.max_attempts > patch::MAX_ATTEMPTS {
            return Err(PolicyError::new("max_attempts", format!("must be <= {}, got {}", patch::MAX_ATTEMPTS, self.max_attempts)));
        }
        // Bounds first: an interval beyond them is the problem, whatever it is compared with.
        for (field, d) in [("initial_interval", self.initial_interval), ("max_interval", self.max_interval)] {
            crate::bounds::check_interval(d).map_err(|reason| PolicyError::new(field, reason))?;
        }
        for (i, d) in self.schedule.iter().enumerate() {
            crate::bounds::check_interval(*d).map_err(|reason| PolicyError::new("schedule", format!("entry {i}: {reason}")))?;
        }
        if self.initial_interval.is_zero() {
            return Err(PolicyError::new("initial_interval", "must be > 0, got PT0S"));
        }
        validate_coefficient(self.backoff_coefficient)?;
        if self.max_interval.is_zero() {
            return Err(PolicyError::new("max_interval", "must be > 0, got PT0S"));
        }
        if self.max_interval < self.initial_interval {
            return Err(PolicyError::new(
                "max_interval",
                format!(
                    "must be >= initial_interval ({}), got {}",
                    iso8601::format(self.initial_interval),
                    iso8601::format(self.max_interval)
                ),
            ));
        }
        self.jitter.validate().map_err(|reason| PolicyError::new("jitter", reason))?;
        for (i, pattern) in self.non_retryable_errors.iter().enumerate() {
            non_retryable::validate_pattern(pattern).map_err(|reason| {
                PolicyError::new("non_retryable_errors", format!("entry {i} ({pattern:?}): {reason}"))
            })?;
        }
        for (i, d) in self.schedule.iter().enumerate() {
            if d.is_zero() {
                return Err(PolicyError::new("schedule", format!("entry {i}: must be > 0, got PT0S")));
            }
        }
        if self.backoff_strategy == BackoffStrategy::Custom && self.schedule.is_empty() {
            return Err(PolicyError::new(
                "schedule",
                "must not be empty when backoff_strategy is \"custom\"",
            ));
        }
        Ok(())
    }

    /// The full wire form: every field, durations as ISO-8601 strings (`"PT1S"`), jitter in
    /// its OJS form (`true` / `false` / `"full"` / `{"proportional": f}`). Feeding it back
    /// through [`RetryPolicy::from_json`] gives the same policy.
    pub fn to_json(&self) -> serde_json::Value {
        PolicyPatch::from(self).to_json()
    }

    /// Parses a (possibly partial) OJS `retry` object over the OJS defaults and validates the
    /// result; what the HTTP layer needs for a job's `options.retry` without a type layer.
    pub fn from_json(v: &serde_json::Value) -> Result<RetryPolicy, PolicyError> {
        let policy = PolicyPatch::from_json(v)?.apply_to(&RetryPolicy::default());
        policy.validate()?;
        Ok(policy)
    }
}

/// Shared by [`RetryPolicy::validate`] and the JSON parser so both word it the same way.
pub(crate) fn validate_coefficient(c: f64) -> Result<(), PolicyError> {
    if !c.is_finite() {
        return Err(PolicyError::new("backoff_coefficient", format!("must be a finite number, got {c}")));
    }
    if c < 1.0 {
        return Err(PolicyError::new("backoff_coefficient", format!("must be >= 1.0, got {c}")));
    }
    Ok(())
}

impl Serialize for RetryPolicy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RetryPolicy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(deserializer)?;
        RetryPolicy::from_json(&v).map_err(serde::de::Error::custom)
    }
}
