//! The seeds' tables (`shared/seeds/000`, `001`, `003`, `004`) as exact test vectors, with
//! jitter off, plus validation and end-to-end `decide` runs over them.

use std::time::Duration;

use jiff::Timestamp;
use rebound_queue::outcome::{AttemptOutcome, NextStep, decide};
use rebound_queue::policy::{
    BackoffStrategy, FixedJitter, Jitter, OnExhaustion, PolicyPatch, PolicySource, RetryPolicy,
    iso8601, resolve,
};
use rebound_queue::{HandlerError, Outcome};
use serde_json::json;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn secs(v: u64) -> Duration {
    Duration::from_secs(v)
}

fn delays(p: &RetryPolicy, retries: u32) -> Vec<Duration> {
    (1..=retries).map(|n| p.delay_for(n)).collect()
}

/// Policies in these tests come from the wire form, as they do in production.
fn policy(v: serde_json::Value) -> RetryPolicy {
    RetryPolicy::from_json(&v).expect("valid policy")
}

#[test]
fn seed_004_ojs_exponential_table() {
    let p = policy(json!({
        "initial_interval": "PT1S", "backoff_coefficient": 2.0, "max_interval": "PT5M",
        "jitter": false
    }));
    let expected: Vec<Duration> =
        [1, 2, 4, 8, 16, 32, 64, 128, 256, 300].into_iter().map(secs).collect();
    assert_eq!(delays(&p, 10), expected);
    // Retry n leads to attempt n + 1.
    let plan = RetryPolicy { max_attempts: 11, ..p.clone() }.planned_retries(0, 100);
    assert_eq!(plan.len(), 10);
    assert_eq!(plan.iter().map(|r| r.attempt).collect::<Vec<_>>(), (2..=11).collect::<Vec<_>>());
    assert_eq!(plan.iter().map(|r| r.delay).collect::<Vec<_>>(), expected);
    assert_eq!(plan[9].cumulative, secs(511 + 300));
}

#[test]
fn seed_004_non_retryable_table() {
    let p = policy(json!({"non_retryable_errors": ["validation.payload_invalid", "auth.*"]}));
    let table = [
        ("auth.token_expired", true),
        ("auth.forbidden", true),
        ("auth", false),
        ("external.auth.failure", false),
        ("validation.payload_invalid", true),
    ];
    for (error_type, non_retryable) in table {
        assert_eq!(p.is_non_retryable(error_type), non_retryable, "{error_type}");
    }
}

#[test]
fn seed_004_defaults() {
    let p = RetryPolicy::default();
    assert_eq!(p.max_attempts, 3);
    assert_eq!(p.initial_interval, secs(1));
    assert_eq!(p.backoff_coefficient, 2.0);
    assert_eq!(p.max_interval, secs(300));
    assert_eq!(p.jitter, Jitter::Ojs);
    assert!(p.non_retryable_errors.is_empty());
    assert_eq!(p.on_exhaustion, OnExhaustion::Discard);
    assert_eq!(p.backoff_strategy, BackoffStrategy::Exponential);
    assert!(p.schedule.is_empty());
    assert_eq!(p.validate(), Ok(()));
}

#[test]
fn seed_000_storage_retry_backoff() {
    let p = policy(json!({
        "initial_interval": "PT0.1S", "backoff_coefficient": 2.0, "max_interval": "PT5S",
        "jitter": false
    }));
    let expected: Vec<Duration> =
        [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000].into_iter().map(ms).collect();
    assert_eq!(delays(&p, 8), expected);
    // Its ±10 % jitter is Proportional(0.1): a 1 s backoff sleeps 900..=1100 ms.
    let p = RetryPolicy {
        initial_interval: secs(1),
        jitter: Jitter::Proportional(0.1),
        ..p
    };
    assert_eq!(p.jitter_band(1), (ms(900), ms(1_100)));
    assert_eq!(p.jittered_delay_for(1, &mut FixedJitter(0.0)), ms(900));
    assert_eq!(p.jittered_delay_for(1, &mut FixedJitter(0.5)), ms(1_000));
}

#[test]
fn seed_001_fixed_exponential_custom() {
    let fixed = policy(json!({
        "backoff_strategy": "constant", "initial_interval": "PT2S", "jitter": false
    }));
    assert_eq!(delays(&fixed, 4), [secs(2); 4]);

    let exponential = policy(json!({"initial_interval": "PT1S", "jitter": false}));
    assert_eq!(delays(&exponential, 4), [secs(1), secs(2), secs(4), secs(8)]);

    let custom = policy(json!({
        "backoff_strategy": "custom", "schedule": ["PT2S", "PT4S", "PT6S", "PT8S"],
        "jitter": false
    }));
    assert_eq!(delays(&custom, 4), [secs(2), secs(4), secs(6), secs(8)]);
    // The last entry repeats.
    assert_eq!(custom.delay_for(9), secs(8));

    // attempts: 1 = no retry.
    let once = policy(json!({"max_attempts": 1}));
    assert!(once.planned_retries(0, 10).is_empty());
}

#[test]
fn seed_003_linear_thirty_seconds() {
    let p = policy(json!({
        "max_attempts": 5, "backoff_strategy": "linear", "initial_interval": "PT30S",
        "max_interval": "PT1H", "jitter": false
    }));
    assert_eq!(delays(&p, 4), [secs(30), secs(60), secs(90), secs(120)]);
    let plan = p.planned_retries(0, 100);
    let cumulative: Vec<Duration> = plan.iter().map(|r| r.cumulative).collect();
    assert_eq!(cumulative, [secs(30), secs(90), secs(180), secs(300)]);
    assert_eq!(p.total_delay(), secs(300));

    // Failures 1..=4 are retried after 30/60/90/120 s; the 5th exhausts.
    let now = Timestamp::from_second(1_700_000_000).expect("valid");
    let error = HandlerError::new("email.smtp_503", "service unavailable");
    let mut at = now;
    for (attempt, delay) in (1..=4).zip([30, 60, 90, 120]) {
        let d = decide(attempt, &p, &Outcome::Retry(error.clone()), at, &mut FixedJitter(0.3));
        assert_eq!(d.attempt_outcome, AttemptOutcome::Retried);
        let run_at = at.checked_add(secs(delay)).expect("in range");
        assert_eq!(d.next, NextStep::Retry { run_at, delay: secs(delay) });
        at = run_at;
    }
    let d = decide(5, &p, &Outcome::Retry(error), at, &mut FixedJitter(0.3));
    assert_eq!(d.attempt_outcome, AttemptOutcome::Exhausted);
    assert_eq!(d.next, NextStep::Discard);
    assert_eq!(at, now.checked_add(secs(300)).expect("in range"));
}

#[test]
fn polynomial_coefficient_four_is_sidekiq_like() {
    let p = policy(json!({
        "backoff_strategy": "polynomial", "backoff_coefficient": 4.0,
        "initial_interval": "PT1S", "max_interval": "P1D", "jitter": false
    }));
    assert_eq!(delays(&p, 5), [secs(1), secs(16), secs(81), secs(256), secs(625)]);
}

#[test]
fn ojs_payment_example_dead_letters_non_retryable() {
    let p = policy(json!({
        "max_attempts": 25, "initial_interval": "PT15S", "backoff_coefficient": 4.0,
        "max_interval": "PT1H",
        "non_retryable_errors": ["payment.card_stolen", "payment.card_expired", "validation.*"],
        "on_exhaustion": "dead_letter"
    }));
    let now = Timestamp::UNIX_EPOCH;
    let stolen = Outcome::Retry(HandlerError::new("payment.card_stolen", "stolen"));
    let d = decide(1, &p, &stolen, now, &mut FixedJitter(0.0));
    assert_eq!((d.next, d.attempt_outcome), (NextStep::DeadLetter, AttemptOutcome::NonRetryable));
    let transient = Outcome::Retry(HandlerError::new("payment.gateway_timeout", "slow"));
    let d = decide(24, &p, &transient, now, &mut FixedJitter(0.0));
    assert_eq!(d.attempt_outcome, AttemptOutcome::Retried);
    // 15 s × 4^23 is far above the cap: OJS jitter at its low end halves the capped hour.
    assert_eq!(d.next.delay(), Some(secs(1_800)));
    let d = decide(25, &p, &transient, now, &mut FixedJitter(0.0));
    assert_eq!((d.next, d.attempt_outcome), (NextStep::DeadLetter, AttemptOutcome::Exhausted));
}

#[test]
fn validation_names_the_field() {
    let base = RetryPolicy::default();
    let cases: Vec<(RetryPolicy, &str)> = vec![
        (RetryPolicy { initial_interval: Duration::ZERO, ..base.clone() }, "initial_interval"),
        (RetryPolicy { max_interval: Duration::ZERO, ..base.clone() }, "max_interval"),
        (RetryPolicy { max_interval: ms(500), ..base.clone() }, "max_interval"),
        (RetryPolicy { backoff_coefficient: 0.99, ..base.clone() }, "backoff_coefficient"),
        (RetryPolicy { backoff_coefficient: f64::NAN, ..base.clone() }, "backoff_coefficient"),
        (RetryPolicy { backoff_coefficient: f64::INFINITY, ..base.clone() }, "backoff_coefficient"),
        (RetryPolicy { jitter: Jitter::Proportional(0.0), ..base.clone() }, "jitter"),
        (RetryPolicy { jitter: Jitter::Proportional(1.01), ..base.clone() }, "jitter"),
        (RetryPolicy { backoff_strategy: BackoffStrategy::Custom, ..base.clone() }, "schedule"),
        (RetryPolicy { schedule: vec![secs(1), Duration::ZERO], ..base.clone() }, "schedule"),
        (RetryPolicy { non_retryable_errors: vec![String::new()], ..base.clone() }, "non_retryable_errors"),
        (RetryPolicy { non_retryable_errors: vec!["a.*.b".into()], ..base.clone() }, "non_retryable_errors"),
        (RetryPolicy { non_retryable_errors: vec!["auth*".into()], ..base.clone() }, "non_retryable_errors"),
    ];
    for (p, field) in cases {
        let e = p.validate().expect_err(field);
        assert_eq!(e.field, field, "{e}");
        assert!(e.to_string().starts_with(&format!("{field}: ")), "{e}");
    }
    let ok = [
        RetryPolicy { max_attempts: 0, ..base.clone() },
        RetryPolicy { jitter: Jitter::Proportional(1.0), ..base.clone() },
        RetryPolicy { max_interval: secs(1), backoff_coefficient: 1.0, ..base.clone() },
        RetryPolicy { non_retryable_errors: vec!["*".into(), "auth.*".into()], ..base.clone() },
    ];
    for p in ok {
        assert_eq!(p.validate(), Ok(()), "{p:?}");
    }
}

#[test]
fn layered_resolution_end_to_end() {
    let defaults = RetryPolicy::default();
    let type_patch = PolicyPatch::from_json(&json!({
        "backoff_strategy": "linear", "initial_interval": "PT30S", "max_interval": "PT1H"
    }))
    .expect("valid");
    let job_patch = PolicyPatch::from_json(&json!({"max_attempts": 5, "jitter": false})).expect("valid");
    let r = resolve(&defaults, Some(&type_patch), Some(&job_patch)).expect("valid");
    assert_eq!(delays(&r.policy, 4), [secs(30), secs(60), secs(90), secs(120)]);
    let sources: Vec<(&str, PolicySource)> = r.sources.clone();
    assert_eq!(
        sources,
        [
            ("max_attempts", PolicySource::Job),
            ("initial_interval", PolicySource::Type),
            ("backoff_coefficient", PolicySource::Default),
            ("max_interval", PolicySource::Type),
            ("jitter", PolicySource::Job),
            ("non_retryable_errors", PolicySource::Default),
            ("on_exhaustion", PolicySource::Default),
            ("backoff_strategy", PolicySource::Type),
            ("schedule", PolicySource::Default),
        ]
    );
    // A job override that clashes with the type's cap is caught after merging.
    let clash = PolicyPatch::from_json(&json!({"initial_interval": "PT2H"})).expect("valid alone");
    let e = resolve(&defaults, Some(&type_patch), Some(&clash)).expect_err("clash");
    assert_eq!(e.field, "max_interval");
}

#[test]
fn iso8601_forms() {
    assert_eq!(iso8601::parse("PT1S"), Ok(secs(1)));
    assert_eq!(iso8601::parse("PT0.5S"), Ok(ms(500)));
    assert_eq!(iso8601::parse("P1D"), Ok(secs(86_400)));
    assert_eq!(iso8601::parse("PT1H30M"), Ok(secs(5_400)));
    for bad in ["1s", "", "-PT1S"] {
        assert!(iso8601::parse(bad).is_err(), "{bad:?}");
    }
    // PT0S parses, but no policy duration may be zero.
    assert_eq!(iso8601::parse("PT0S"), Ok(Duration::ZERO));
    let e = PolicyPatch::from_json(&json!({"initial_interval": "PT0S"})).expect_err("zero");
    assert_eq!(e.field, "initial_interval");
    assert_eq!(iso8601::format(secs(1)), "PT1S");
    assert_eq!(iso8601::format(secs(300)), "PT5M");
    assert_eq!(iso8601::format(ms(500)), "PT0.5S");
    assert_eq!(iso8601::format(secs(5_400)), "PT1H30M");
}
