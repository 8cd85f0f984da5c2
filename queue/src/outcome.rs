//! What a handler says happened, and [`decide`]: the pure function that turns it, the
//! attempt number and the effective policy into the job's next step.
//!
//! Keeping this pure (clock and randomness passed in) lets the store apply the decision in
//! one transaction and lets tests pin every branch exactly.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::bounds;
use crate::policy::{JitterSource, OnExhaustion, RetryPolicy};
use crate::storable::{make_storable, storable_text};

/// A handler failure as reported by a worker (OJS nack `error`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HandlerError {
    /// Dot-namespaced error type, e.g. `"http.5xx"`; matched against `non_retryable_errors`.
    pub error_type: String,
    /// Human-readable message.
    pub message: String,
    /// Free-form details. OJS clients put the error class in `details.error_class`, which
    /// is matched against `non_retryable_errors` too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
    /// `false` makes the error non-retryable whatever the policy says (OJS
    /// `error.retryable: false`).
    #[serde(default = "retryable_by_default")]
    pub retryable: bool,
}

fn retryable_by_default() -> bool {
    true
}

/// Error type of a per-attempt timeout (the worker's own, or the rescuer's backstop).
pub const TIMEOUT_ERROR: &str = "rebound.timeout";
/// Error type of an execution whose lock lapsed without a heartbeat (the rescuer's).
pub const STALLED_ERROR: &str = "rebound.stalled";

/// The OJS name (ojs-timeouts §8) of an error type Rebound records itself, where OJS has one:
/// a policy's `non_retryable_errors` may name either.
pub fn ojs_error_type(error_type: &str) -> Option<&'static str> {
    match error_type {
        TIMEOUT_ERROR => Some("timeout"),
        STALLED_ERROR => Some("stalled"),
        _ => None,
    }
}

impl HandlerError {
    /// A retryable error without details.
    pub fn new(error_type: impl Into<String>, message: impl Into<String>) -> Self {
        HandlerError {
            error_type: error_type.into(),
            message: message.into(),
            details: None,
            retryable: true,
        }
    }

    /// The same error with `details` set.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The same error marked non-retryable (`retryable: false`).
    pub fn non_retryable(mut self) -> Self {
        self.retryable = false;
        self
    }

    /// Every name this error answers to for `non_retryable_errors` matching: `error_type`,
    /// when it is a string `details.error_class` (where OJS clients put the class, e.g.
    /// `"Auth.TokenExpired"`), and for the errors Rebound records itself their OJS name
    /// ([`ojs_error_type`]: `rebound.timeout` is also `timeout`).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let class = self
            .details
            .as_ref()
            .and_then(|d| d.get("error_class"))
            .and_then(serde_json::Value::as_str);
        std::iter::once(self.error_type.as_str()).chain(class).chain(ojs_error_type(&self.error_type))
    }

    /// Makes the error storable: NULs in the type, message and details become U+FFFD (and
    /// numbers Postgres would not give back become strings), see [`crate::storable`]. Handler
    /// output is recorded, not refused: the job must not stay stuck on a failure it cannot write.
    pub fn make_storable(&mut self) {
        if let std::borrow::Cow::Owned(clean) = storable_text(&self.error_type) {
            self.error_type = clean;
        }
        if let std::borrow::Cow::Owned(clean) = storable_text(&self.message) {
            self.message = clean;
        }
        if let Some(details) = &mut self.details {
            make_storable(details);
        }
    }

    /// Whether any of [`HandlerError::names`] matches the policy's `non_retryable_errors`.
    /// (`retryable: false` is checked separately by [`decide`].)
    pub fn matches_non_retryable(&self, policy: &RetryPolicy) -> bool {
        self.names().any(|name| policy.is_non_retryable(name))
    }
}

/// What a handler run ended with (OJS handler response codes, plus `retry_after`).
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Failed; retry with normal backoff if the policy allows (the default).
    Retry(HandlerError),
    /// Give up now, no dead letter.
    Discard(HandlerError),
    /// Give up now and move to the dead-letter queue.
    DeadLetter(HandlerError),
    /// Permanent failure: terminal like `Discard`, but records a recognised failure.
    Fail(HandlerError),
    /// Snooze until `at` without spending an attempt (e.g. a rate-limited upstream said
    /// when to come back).
    RetryAfter {
        /// When to run again; a past time means "now".
        at: Timestamp,
        /// The error to record, if any.
        error: Option<HandlerError>,
    },
}

impl Outcome {
    /// The error carried by the outcome, if any (to store in the job's `errors[]`).
    pub fn error(&self) -> Option<&HandlerError> {
        match self {
            Outcome::Retry(e) | Outcome::Discard(e) | Outcome::DeadLetter(e) | Outcome::Fail(e) => {
                Some(e)
            }
            Outcome::RetryAfter { error, .. } => error.as_ref(),
        }
    }

    /// [`HandlerError::make_storable`] on the carried error.
    pub fn make_storable(&mut self) {
        match self {
            Outcome::Retry(e) | Outcome::Discard(e) | Outcome::DeadLetter(e) | Outcome::Fail(e) => e.make_storable(),
            Outcome::RetryAfter { error, .. } => {
                if let Some(e) = error {
                    e.make_storable();
                }
            }
        }
    }
}

/// The job's next step after a handler run ended without success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextStep {
    /// Job → `retryable`, due at `run_at`.
    Retry {
        /// When the retry becomes due (`now + delay`).
        run_at: Timestamp,
        /// The jittered delay.
        delay: Duration,
    },
    /// Job → `scheduled` at `run_at`. The attempt is not counted: the store decrements
    /// `attempt`.
    Snooze {
        /// When the job becomes due again (`max(at, now)`).
        run_at: Timestamp,
        /// `run_at − now`.
        delay: Duration,
    },
    /// Job → `discarded`, not in the dead-letter queue.
    Discard,
    /// Job → `discarded` with the dead-letter flag.
    DeadLetter,
}

impl NextStep {
    /// When the job runs again, for `Retry` and `Snooze`.
    pub fn run_at(&self) -> Option<Timestamp> {
        match self {
            NextStep::Retry { run_at, .. } | NextStep::Snooze { run_at, .. } => Some(*run_at),
            NextStep::Discard | NextStep::DeadLetter => None,
        }
    }

    /// The wait before it runs again, for `Retry` and `Snooze` (OJS `retry_delay_ms`).
    pub fn delay(&self) -> Option<Duration> {
        match self {
            NextStep::Retry { delay, .. } | NextStep::Snooze { delay, .. } => Some(*delay),
            NextStep::Discard | NextStep::DeadLetter => None,
        }
    }

    /// True when the job ends here (`Discard` or `DeadLetter`).
    pub fn is_terminal(&self) -> bool {
        matches!(self, NextStep::Discard | NextStep::DeadLetter)
    }
}

/// Why the attempt ended as it did; stored with the attempt for the dashboard and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Will be retried after a backoff delay.
    Retried,
    /// Snoozed by `retry_after`; not counted.
    Snoozed,
    /// The handler asked to discard.
    Discarded,
    /// The handler asked for the dead-letter queue.
    DeadLettered,
    /// The handler reported a permanent failure.
    Failed,
    /// The attempt budget is spent.
    Exhausted,
    /// The error is non-retryable (`retryable: false` or a `non_retryable_errors` match).
    NonRetryable,
}

impl AttemptOutcome {
    /// Every variant, in declaration order.
    pub const ALL: [AttemptOutcome; 7] = [
        AttemptOutcome::Retried,
        AttemptOutcome::Snoozed,
        AttemptOutcome::Discarded,
        AttemptOutcome::DeadLettered,
        AttemptOutcome::Failed,
        AttemptOutcome::Exhausted,
        AttemptOutcome::NonRetryable,
    ];

    /// The snake_case name, also used in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Retried => "retried",
            AttemptOutcome::Snoozed => "snoozed",
            AttemptOutcome::Discarded => "discarded",
            AttemptOutcome::DeadLettered => "dead_lettered",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Exhausted => "exhausted",
            AttemptOutcome::NonRetryable => "non_retryable",
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An attempt-outcome name that is not one of [`AttemptOutcome::as_str`]'s.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("unknown attempt outcome {0:?}")]
pub struct UnknownAttemptOutcome(pub String);

impl FromStr for AttemptOutcome {
    type Err = UnknownAttemptOutcome;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AttemptOutcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| UnknownAttemptOutcome(s.to_owned()))
    }
}

/// What [`decide`] concluded.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The job's next step.
    pub next: NextStep,
    /// Why, for the attempt record.
    pub attempt_outcome: AttemptOutcome,
}

/// Decides the job's next step.
///
/// * `attempt`: the attempt that just ran, 1-based and already counted.
/// * `policy`: the effective policy, resolved now (so live edits apply).
///
/// Handler codes win over the policy: `Discard` → discard, `Fail` → discard (failed),
/// `DeadLetter` → dead letter, `RetryAfter` → snooze to `max(at, now)` without counting the
/// attempt. A `Retry` ends by `on_exhaustion` when the error is non-retryable (`retryable:
/// false` or a pattern match on its type or class) or when `attempt ≥ max(max_attempts, 1)`;
/// otherwise it is retried after `jittered_delay_for(attempt)`, at `now + delay` (clamped
/// to `Timestamp::MAX`).
pub fn decide(
    attempt: u32,
    policy: &RetryPolicy,
    outcome: &Outcome,
    now: Timestamp,
    rng: &mut dyn JitterSource,
) -> Decision {
    let (next, attempt_outcome) = match outcome {
        Outcome::Discard(_) => (NextStep::Discard, AttemptOutcome::Discarded),
        Outcome::Fail(_) => (NextStep::Discard, AttemptOutcome::Failed),
        Outcome::DeadLetter(_) => (NextStep::DeadLetter, AttemptOutcome::DeadLettered),
        Outcome::RetryAfter { at, .. } => {
            // Never later than the longest interval: a far-future date from a handler (or a
            // receiver's `Retry-After`) must not park the job beyond what readers can decode.
            let latest = now.saturating_add(bounds::MAX_INTERVAL).unwrap_or(now);
            let run_at = (*at).max(now).min(latest);
            // run_at ≥ now, so the difference is non-negative and fits.
            let delay = Duration::try_from(run_at.duration_since(now)).unwrap_or(Duration::ZERO);
            (NextStep::Snooze { run_at, delay }, AttemptOutcome::Snoozed)
        }
        Outcome::Retry(error) => {
            if !error.retryable || error.matches_non_retryable(policy) {
                (give_up(policy), AttemptOutcome::NonRetryable)
            } else if attempt >= policy.effective_max_attempts() {
                (give_up(policy), AttemptOutcome::Exhausted)
            } else {
                // Clamped: a policy stored before bounds existed may still say more.
                let delay = bounds::clamp_interval(policy.jittered_delay_for(attempt, rng));
                let run_at = now.saturating_add(delay).unwrap_or(Timestamp::MAX);
                (NextStep::Retry { run_at, delay }, AttemptOutcome::Retried)
            }
        }
    };
    Decision { next, attempt_outcome }
}

fn give_up(policy: &RetryPolicy) -> NextStep {
    match policy.on_exhaustion {
        OnExhaustion::Discard => NextStep::Discard,
        OnExhaustion::DeadLetter => NextStep::DeadLetter,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::policy::{FixedJitter, Jitter};

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_000).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn exact(max_attempts: u32) -> RetryPolicy {
        RetryPolicy { max_attempts, jitter: Jitter::Off, ..RetryPolicy::default() }
    }

    fn run(attempt: u32, policy: &RetryPolicy, outcome: &Outcome) -> Decision {
        decide(attempt, policy, outcome, now(), &mut FixedJitter(0.5))
    }

    fn err() -> HandlerError {
        HandlerError::new("http.5xx", "upstream said 503")
    }

    fn retry_at(secs: i64, delay: u64) -> NextStep {
        NextStep::Retry {
            run_at: Timestamp::from_second(1_700_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH),
            delay: Duration::from_secs(delay),
        }
    }

    #[test]
    fn retry_until_exhausted() {
        let p = exact(4);
        let d1 = run(1, &p, &Outcome::Retry(err()));
        assert_eq!(d1, Decision { next: retry_at(1, 1), attempt_outcome: AttemptOutcome::Retried });
        assert_eq!(run(2, &p, &Outcome::Retry(err())).next, retry_at(2, 2));
        assert_eq!(run(3, &p, &Outcome::Retry(err())).next, retry_at(4, 4));
        let d4 = run(4, &p, &Outcome::Retry(err()));
        assert_eq!(d4, Decision { next: NextStep::Discard, attempt_outcome: AttemptOutcome::Exhausted });
        // Beyond the budget (e.g. max_attempts lowered by a live edit) also exhausts.
        assert_eq!(run(9, &p, &Outcome::Retry(err())).attempt_outcome, AttemptOutcome::Exhausted);
    }

    #[test]
    fn exhaustion_goes_by_on_exhaustion() {
        let p = RetryPolicy { on_exhaustion: OnExhaustion::DeadLetter, ..exact(2) };
        assert_eq!(run(1, &p, &Outcome::Retry(err())).attempt_outcome, AttemptOutcome::Retried);
        let d = run(2, &p, &Outcome::Retry(err()));
        assert_eq!(d.next, NextStep::DeadLetter);
        assert_eq!(d.attempt_outcome, AttemptOutcome::Exhausted);
    }

    #[test]
    fn zero_and_one_max_attempts_never_retry() {
        for max_attempts in [0, 1] {
            let d = run(1, &exact(max_attempts), &Outcome::Retry(err()));
            assert_eq!(d.next, NextStep::Discard);
            assert_eq!(d.attempt_outcome, AttemptOutcome::Exhausted);
        }
    }

    #[test]
    fn handler_codes_win() {
        let p = RetryPolicy { on_exhaustion: OnExhaustion::DeadLetter, ..exact(10) };
        let d = run(1, &p, &Outcome::Discard(err()));
        assert_eq!((d.next, d.attempt_outcome), (NextStep::Discard, AttemptOutcome::Discarded));
        let d = run(1, &p, &Outcome::Fail(err()));
        assert_eq!((d.next, d.attempt_outcome), (NextStep::Discard, AttemptOutcome::Failed));
        let d = run(1, &exact(10), &Outcome::DeadLetter(err()));
        assert_eq!((d.next, d.attempt_outcome), (NextStep::DeadLetter, AttemptOutcome::DeadLettered));
    }

    #[test]
    fn retryable_false_ends_at_once() {
        let d = run(1, &exact(10), &Outcome::Retry(err().non_retryable()));
        assert_eq!((d.next, d.attempt_outcome), (NextStep::Discard, AttemptOutcome::NonRetryable));
        let p = RetryPolicy { on_exhaustion: OnExhaustion::DeadLetter, ..exact(10) };
        let d = run(1, &p, &Outcome::Retry(err().non_retryable()));
        assert_eq!((d.next, d.attempt_outcome), (NextStep::DeadLetter, AttemptOutcome::NonRetryable));
    }

    #[test]
    fn non_retryable_by_type_and_by_class() {
        let p = RetryPolicy {
            non_retryable_errors: vec!["auth.*".into(), "FatalError".into(), "Auth.*".into()],
            ..exact(10)
        };
        let by_type = HandlerError::new("auth.token_expired", "expired");
        assert_eq!(run(1, &p, &Outcome::Retry(by_type)).attempt_outcome, AttemptOutcome::NonRetryable);
        let by_class = err().with_details(json!({"error_class": "FatalError"}));
        assert!(by_class.matches_non_retryable(&p));
        assert_eq!(run(1, &p, &Outcome::Retry(by_class)).attempt_outcome, AttemptOutcome::NonRetryable);
        let by_prefix_class = err().with_details(json!({"error_class": "Auth.TokenExpired"}));
        assert!(by_prefix_class.matches_non_retryable(&p));
        for retryable in [
            HandlerError::new("auth", "bare prefix"),
            HandlerError::new("external.auth.failure", "not under auth."),
            err().with_details(json!({"error_class": "TransientError"})),
            err().with_details(json!({"error_class": 42})),
            err().with_details(json!("FatalError")),
        ] {
            assert!(!retryable.matches_non_retryable(&p), "{retryable:?}");
            assert_eq!(run(1, &p, &Outcome::Retry(retryable)).attempt_outcome, AttemptOutcome::Retried);
        }
    }

    #[test]
    fn rebound_s_own_errors_answer_to_their_ojs_names() {
        let p = RetryPolicy { non_retryable_errors: vec!["timeout".into()], ..exact(10) };
        assert!(HandlerError::new(TIMEOUT_ERROR, "too long").matches_non_retryable(&p));
        assert!(!HandlerError::new(STALLED_ERROR, "lost").matches_non_retryable(&p));
        assert!(!HandlerError::new("http.timeout", "a handler's own").matches_non_retryable(&p));
        let p = RetryPolicy { non_retryable_errors: vec!["stalled".into()], ..exact(10) };
        assert!(HandlerError::new(STALLED_ERROR, "lost").matches_non_retryable(&p));
    }

    #[test]
    fn snooze_is_not_counted_and_never_in_the_past() {
        let at = Timestamp::from_second(1_700_000_090).unwrap_or(Timestamp::UNIX_EPOCH);
        // Even at the last attempt: snoozing does not spend the budget.
        let d = run(3, &exact(3), &Outcome::RetryAfter { at, error: None });
        assert_eq!(d.attempt_outcome, AttemptOutcome::Snoozed);
        assert_eq!(d.next, NextStep::Snooze { run_at: at, delay: Duration::from_secs(90) });
        let past = Timestamp::from_second(1_600_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let d = run(1, &exact(3), &Outcome::RetryAfter { at: past, error: Some(err()) });
        assert_eq!(d.next, NextStep::Snooze { run_at: now(), delay: Duration::ZERO });
    }

    #[test]
    fn run_at_is_now_plus_jittered_delay_and_saturates() {
        let p = RetryPolicy { max_attempts: 5, ..RetryPolicy::default() };
        let d = decide(3, &p, &Outcome::Retry(err()), now(), &mut FixedJitter(0.0));
        assert_eq!(d.next, retry_at(2, 2)); // 4 s × 0.5
        let d = decide(3, &p, &Outcome::Retry(err()), now(), &mut FixedJitter(0.75));
        assert_eq!(d.next, retry_at(5, 5)); // 4 s × 1.25
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..100 {
            let d = decide(3, &p, &Outcome::Retry(err()), now(), &mut rng);
            let (lo, hi) = p.jitter_band(3);
            let delay = d.next.delay().unwrap_or_default();
            assert!(lo <= delay && delay <= hi);
            assert_eq!(d.next.run_at(), now().checked_add(delay).ok());
        }
        let far = RetryPolicy {
            initial_interval: Duration::MAX,
            max_interval: Duration::MAX,
            ..exact(5)
        };
        // A policy beyond the bounds (stored by an older version) is clamped to the longest
        // interval, so the job stays where every reader can decode it.
        let d = decide(1, &far, &Outcome::Retry(err()), now(), &mut FixedJitter(0.0));
        assert_eq!(d.next.delay(), Some(bounds::MAX_INTERVAL));
        assert_eq!(d.next.run_at(), now().checked_add(bounds::MAX_INTERVAL).ok());
        let d = decide(1, &far, &Outcome::RetryAfter { at: Timestamp::MAX, error: None }, now(), &mut FixedJitter(0.0));
        assert_eq!(d.next.run_at(), now().checked_add(bounds::MAX_INTERVAL).ok());
    }

    #[test]
    fn accessors() {
        assert_eq!(Outcome::Fail(err()).error(), Some(&err()));
        assert_eq!(Outcome::RetryAfter { at: now(), error: None }.error(), None);
        assert_eq!(NextStep::Discard.run_at(), None);
        assert_eq!(NextStep::DeadLetter.delay(), None);
        assert!(NextStep::DeadLetter.is_terminal());
        assert!(!retry_at(1, 1).is_terminal());
        for o in AttemptOutcome::ALL {
            assert_eq!(o.as_str().parse::<AttemptOutcome>(), Ok(o));
            assert_eq!(serde_json::to_value(o).ok(), Some(json!(o.as_str())));
        }
        assert!("exploded".parse::<AttemptOutcome>().is_err());
    }

    #[test]
    fn handler_error_serde() {
        let e: HandlerError =
            serde_json::from_value(json!({"error_type": "x.y", "message": "m"})).unwrap_or_else(|_| err());
        assert_eq!(e, HandlerError::new("x.y", "m"));
        let v = serde_json::to_value(err().non_retryable()).unwrap_or_default();
        assert_eq!(v, json!({"error_type": "http.5xx", "message": "upstream said 503", "retryable": false}));
    }
}
