//! Property tests of the retry-policy math: jitter stays in its band and under the cap in
//! every mode, nothing panics or overflows at the extremes, and the wire form round-trips.

use std::time::Duration;

use jiff::Timestamp;
use proptest::prelude::*;
use rebound_queue::outcome::{AttemptOutcome, NextStep, decide};
use rebound_queue::policy::{
    BackoffStrategy, FixedJitter, Jitter, OnExhaustion, PolicyPatch, RetryPolicy,
};
use rebound_queue::{HandlerError, Outcome};

const YEAR_NANOS: u64 = 365 * 86_400 * 1_000_000_000;

/// Durations from 1 ns up to about 100 years, spread over every magnitude.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (1u64..1_000_000_000).prop_map(Duration::from_nanos),
        (1u64..=100 * YEAR_NANOS).prop_map(Duration::from_nanos),
        (1u64..=3_153_600_000).prop_map(Duration::from_secs),
        Just(Duration::from_secs(1)),
        Just(Duration::from_secs(300)),
    ]
}

fn coefficient() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(1.0),
        Just(2.0),
        1.0f64..10.0,
        1.0f64..1e300,
        Just(1e300),
        Just(f64::MAX),
    ]
}

fn jitter() -> impl Strategy<Value = Jitter> {
    prop_oneof![
        Just(Jitter::Off),
        Just(Jitter::Ojs),
        Just(Jitter::Full),
        (1e-9f64..=1.0).prop_map(Jitter::Proportional),
        Just(Jitter::Proportional(1.0)),
    ]
}

fn strategy() -> impl Strategy<Value = BackoffStrategy> {
    prop_oneof![
        Just(BackoffStrategy::Constant),
        Just(BackoffStrategy::Linear),
        Just(BackoffStrategy::Exponential),
        Just(BackoffStrategy::Polynomial),
        Just(BackoffStrategy::Custom),
    ]
}

fn retry() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..64, any::<u32>(), Just(u32::MAX), (u32::MAX - 8)..=u32::MAX]
}

fn unit() -> impl Strategy<Value = f64> {
    prop_oneof![0.0f64..1.0, Just(0.0), Just(1.0 - f64::EPSILON)]
}

/// Valid policies over the whole range of every field.
fn policy() -> impl Strategy<Value = RetryPolicy> {
    (
        any::<u32>(),
        duration(),
        duration(),
        coefficient(),
        jitter(),
        strategy(),
        prop::collection::vec(duration(), 1..6),
        prop::bool::ANY,
    )
        .prop_map(|(max_attempts, a, b, backoff_coefficient, jitter, backoff_strategy, schedule, dl)| {
            RetryPolicy {
                max_attempts,
                initial_interval: a.min(b),
                max_interval: a.max(b),
                backoff_coefficient,
                jitter,
                backoff_strategy,
                schedule,
                on_exhaustion: if dl { OnExhaustion::DeadLetter } else { OnExhaustion::Discard },
                non_retryable_errors: vec!["fatal.*".into()],
            }
        })
}

/// [`policy()`] with every interval capped at the accepted maximum (rebound_queue::bounds) and
/// `max_attempts` at `MAX_ATTEMPTS`: what validation accepts. The math is tested over the whole range, since it also runs on
/// policies stored before the bounds existed.
fn policy_within_bounds() -> impl Strategy<Value = RetryPolicy> {
    policy().prop_map(|mut p| {
        let cap = rebound_queue::bounds::clamp_interval;
        p.initial_interval = cap(p.initial_interval);
        p.max_interval = cap(p.max_interval);
        p.schedule = p.schedule.into_iter().map(cap).collect();
        p.max_attempts = p.max_attempts.min(rebound_queue::policy::patch::MAX_ATTEMPTS);
        p
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn generated_policies_are_valid(p in policy_within_bounds()) {
        prop_assert_eq!(p.validate(), Ok(()));
    }

    #[test]
    fn intervals_past_the_bounds_are_refused(p in policy()) {
        let too_long = p.max_interval > rebound_queue::bounds::MAX_INTERVAL
            || p.schedule.iter().any(|d| *d > rebound_queue::bounds::MAX_INTERVAL)
            || p.max_attempts > rebound_queue::policy::patch::MAX_ATTEMPTS;
        prop_assert_eq!(p.validate().is_err(), too_long);
    }

    #[test]
    fn delay_is_capped(p in policy(), n in retry()) {
        prop_assert!(p.delay_for(n) <= p.max_interval);
    }

    #[test]
    fn jitter_stays_in_band_and_under_cap(p in policy(), n in retry(), u in unit()) {
        let (lo, hi) = p.jitter_band(n);
        let d = p.delay_for(n);
        let j = p.jittered_delay_for(n, &mut FixedJitter(u));
        prop_assert!(lo <= hi);
        prop_assert!(lo <= j && j <= hi, "{:?} not in {:?}..={:?}", j, lo, hi);
        prop_assert!(hi <= p.max_interval);
        // The band always contains the un-jittered delay.
        prop_assert!(lo <= d && d <= hi);
    }

    #[test]
    fn jitter_with_a_real_rng(p in policy(), n in retry(), seed in any::<u64>()) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (lo, hi) = p.jitter_band(n);
        for _ in 0..8 {
            let j = p.jittered_delay_for(n, &mut rng);
            prop_assert!(lo <= j && j <= hi && j <= p.max_interval);
        }
    }

    #[test]
    fn off_jitter_is_exact(p in policy(), n in retry(), u in unit()) {
        let p = RetryPolicy { jitter: Jitter::Off, ..p };
        prop_assert_eq!(p.jittered_delay_for(n, &mut FixedJitter(u)), p.delay_for(n));
    }

    #[test]
    fn monotone_strategies_never_shrink(p in policy(), n in 1u32..u32::MAX) {
        // Custom schedules may go down on purpose; check the formula strategies.
        let p = if p.backoff_strategy == BackoffStrategy::Custom {
            RetryPolicy { backoff_strategy: BackoffStrategy::Exponential, ..p }
        } else {
            p
        };
        prop_assert!(p.delay_for(n) <= p.delay_for(n + 1));
    }

    #[test]
    fn total_and_plan_do_not_panic(p in policy(), made in retry(), limit in 0usize..50) {
        let total = p.total_delay();
        let plan = p.planned_retries(made, limit);
        prop_assert!(plan.len() <= limit);
        if let Some(last) = plan.last() {
            prop_assert!(last.cumulative <= total || made > 1);
        }
        for (i, row) in plan.iter().enumerate() {
            prop_assert_eq!(row.attempt, row.retry.saturating_add(1));
            prop_assert!(row.retry < p.max_attempts.max(1));
            prop_assert_eq!(row.delay, p.delay_for(row.retry));
            if i > 0 {
                prop_assert!(row.cumulative >= plan[i - 1].cumulative);
            }
        }
    }

    #[test]
    fn plan_from_scratch_sums_to_total(p in policy()) {
        let p = RetryPolicy { max_attempts: p.max_attempts % 200, ..p };
        let plan = p.planned_retries(0, usize::MAX);
        prop_assert_eq!(plan.len() as u32, p.max_attempts.max(1) - 1);
        let last = plan.last().map_or(Duration::ZERO, |r| r.cumulative);
        prop_assert_eq!(last, p.total_delay());
    }

    #[test]
    fn wire_form_round_trips(p in policy_within_bounds()) {
        let wire = p.to_json();
        let back = RetryPolicy::from_json(&wire);
        // Durations round-trip to the nanosecond, floats exactly.
        prop_assert_eq!(back, Ok(p.clone()));
        let patch = PolicyPatch::from(&p);
        prop_assert_eq!(PolicyPatch::from_json(&patch.to_json()), Ok(patch));
    }

    #[test]
    fn decide_never_panics_and_respects_the_budget(
        p in policy(),
        attempt in retry(),
        u in unit(),
        secs in 0i64..=253_402_300_799, // up to 9999-12-31
    ) {
        let now = Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH);
        let outcome = Outcome::Retry(HandlerError::new("http.5xx", "boom"));
        let d = decide(attempt, &p, &outcome, now, &mut FixedJitter(u));
        if attempt >= p.max_attempts.max(1) {
            prop_assert_eq!(d.attempt_outcome, AttemptOutcome::Exhausted);
            prop_assert!(d.next.is_terminal());
        } else {
            prop_assert_eq!(d.attempt_outcome, AttemptOutcome::Retried);
            let NextStep::Retry { run_at, delay } = d.next else {
                return Err(TestCaseError::fail("expected a retry"));
            };
            prop_assert!(delay <= p.max_interval);
            prop_assert!(run_at >= now);
            let expected = now.checked_add(delay).unwrap_or(Timestamp::MAX);
            prop_assert_eq!(run_at, expected);
        }
        let fatal = Outcome::Retry(HandlerError::new("fatal.disk", "gone"));
        let d = decide(attempt, &p, &fatal, now, &mut FixedJitter(u));
        prop_assert_eq!(d.attempt_outcome, AttemptOutcome::NonRetryable);
    }
}
