//! The planned schedule of a job's remaining retries and the total wait until exhaustion,
//! for the dashboard's policy preview and the admin API.
//!
//! Retry n follows the failure of attempt n and leads to attempt n + 1; with
//! `max_attempts = M` the retries are 1 ..= M − 1.

use std::time::Duration;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use super::RetryPolicy;
use super::backoff::BackoffStrategy;
use super::duration::from_nanos_f64;

/// Retries summed one by one before [`RetryPolicy::total_delay`] switches to a closed form.
const EXACT_TERMS: u32 = 4_096;

/// One row of a planned schedule.
///
/// Serialized with millisecond integers (rounded down, saturating at `u64::MAX`), the unit
/// OJS uses for `retry_delay_ms`:
/// `{"retry":1,"attempt":2,"delay_ms":1000,"band_min_ms":500,"band_max_ms":1500,"cumulative_ms":1000}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedRetry {
    /// The retry number n (1 = after the first failure).
    pub retry: u32,
    /// The attempt this retry leads to (n + 1).
    pub attempt: u32,
    /// The un-jittered delay before it.
    pub delay: Duration,
    /// Inclusive bounds jitter can produce for it.
    pub band: (Duration, Duration),
    /// Sum of un-jittered delays of the rows so far, including this one.
    pub cumulative: Duration,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Serialize for PlannedRetry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("PlannedRetry", 6)?;
        s.serialize_field("retry", &self.retry)?;
        s.serialize_field("attempt", &self.attempt)?;
        s.serialize_field("delay_ms", &millis(self.delay))?;
        s.serialize_field("band_min_ms", &millis(self.band.0))?;
        s.serialize_field("band_max_ms", &millis(self.band.1))?;
        s.serialize_field("cumulative_ms", &millis(self.cumulative))?;
        s.end()
    }
}

impl RetryPolicy {
    /// The retries still possible after `attempts_made` executions: retry numbers
    /// `max(attempts_made, 1) ..= max_attempts − 1` (retry `attempts_made` is the one that
    /// follows a failure of the latest attempt), at most `limit` rows. `cumulative` starts
    /// from the first row returned. Rows are produced lazily, so a budget of `u32::MAX`
    /// retries costs only `limit` rows.
    pub fn planned_retries(&self, attempts_made: u32, limit: usize) -> Vec<PlannedRetry> {
        let last = self.effective_max_attempts() - 1;
        let mut cumulative = Duration::ZERO;
        (attempts_made.max(1)..=last)
            .take(limit)
            .map(|retry| {
                let delay = self.delay_for(retry);
                cumulative = cumulative.saturating_add(delay);
                PlannedRetry {
                    retry,
                    attempt: retry.saturating_add(1),
                    delay,
                    band: self.jitter_band(retry),
                    cumulative,
                }
            })
            .collect()
    }

    /// Total un-jittered wait across all retries (1 ..= max_attempts − 1), saturating: the
    /// time from the first failure to exhaustion, ignoring run time.
    ///
    /// Exact while delays grow for up to 4 096 retries, then exact again once they settle
    /// (at `max_interval`, or for constant/custom). Only a budget whose delays keep growing
    /// beyond 4 096 retries is finished with a closed form in floating point (relative error
    /// around 1e-12), so this stays O(4 096) for any `u32` budget.
    pub fn total_delay(&self) -> Duration {
        let last = self.effective_max_attempts() - 1;
        let mut total = Duration::ZERO;
        let mut n = 1;
        while n <= last {
            let delay = self.delay_for(n);
            if self.delay_settled_at(n) {
                return total.saturating_add(delay.saturating_mul(last - n + 1));
            }
            if n > EXACT_TERMS {
                return total.saturating_add(self.growing_tail_sum(n, last));
            }
            total = total.saturating_add(delay);
            n += 1;
        }
        total
    }

    /// Sum of `delay_for(n)` for n in `from ..= last` when delays are still growing at
    /// `from` (linear, exponential, polynomial): closed form up to the retry where the cap
    /// is reached (found by bisection), plus `max_interval` for each retry after it.
    fn growing_tail_sum(&self, from: u32, last: u32) -> Duration {
        let cap = self.max_interval;
        // First n in from..=last with delay_for(n) == cap, or last + 1 if none.
        // `last` is at most u32::MAX − 1 (max_attempts − 1), so `last + 1` fits.
        let (mut lo, mut hi) = (from, last.saturating_add(1));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.delay_for(mid) >= cap {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let first_capped = lo;
        let growing = self.raw_sum_nanos(from, first_capped.saturating_sub(1));
        let capped_count = if first_capped <= last { last - first_capped + 1 } else { 0 };
        from_nanos_f64(growing).saturating_add(cap.saturating_mul(capped_count))
    }

    /// Σ raw delay (nanoseconds, f64) for n in `a ..= b` (0 if b < a), by closed form.
    fn raw_sum_nanos(&self, a: u32, b: u32) -> f64 {
        if b < a {
            return 0.0;
        }
        let initial = self.initial_interval.as_nanos() as f64;
        let (a, b) = (f64::from(a), f64::from(b));
        let c = self.backoff_coefficient;
        match self.backoff_strategy {
            BackoffStrategy::Linear => initial * (a + b) * (b - a + 1.0) / 2.0,
            BackoffStrategy::Exponential if c != 1.0 => {
                // initial · c^(a−1) · (c^(b−a+1) − 1) / (c − 1)
                initial * c.powf(a - 1.0) * (c.powf(b - a + 1.0) - 1.0) / (c - 1.0)
            }
            BackoffStrategy::Polynomial => {
                // Euler–Maclaurin: ∫ₐᵇ xᶜ dx + (aᶜ + bᶜ)/2 + c/12 · (bᶜ⁻¹ − aᶜ⁻¹).
                let integral = (b.powf(c + 1.0) - a.powf(c + 1.0)) / (c + 1.0);
                let ends = (a.powf(c) + b.powf(c)) / 2.0;
                let correction = c / 12.0 * (b.powf(c - 1.0) - a.powf(c - 1.0));
                initial * (integral + ends + correction)
            }
            // Constant, custom and coefficient-1 exponential settle at once and never get here.
            _ => initial * (b - a + 1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Jitter;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn default_policy_plan() {
        let p = RetryPolicy::default();
        let plan = p.planned_retries(0, 100);
        assert_eq!(plan.len(), 2);
        assert_eq!(
            plan[0],
            PlannedRetry {
                retry: 1,
                attempt: 2,
                delay: secs(1),
                band: (Duration::from_millis(500), Duration::from_millis(1_500)),
                cumulative: secs(1),
            }
        );
        assert_eq!(plan[1].retry, 2);
        assert_eq!(plan[1].attempt, 3);
        assert_eq!(plan[1].delay, secs(2));
        assert_eq!(plan[1].cumulative, secs(3));
        assert_eq!(p.total_delay(), secs(3));
        assert_eq!(
            serde_json::to_value(plan[0]).ok(),
            Some(serde_json::json!({
                "retry": 1, "attempt": 2, "delay_ms": 1000,
                "band_min_ms": 500, "band_max_ms": 1500, "cumulative_ms": 1000
            }))
        );
    }

    #[test]
    fn plan_after_some_attempts_and_limit() {
        let p = RetryPolicy { max_attempts: 6, jitter: Jitter::Off, ..RetryPolicy::default() };
        let plan = p.planned_retries(3, 100);
        let retries: Vec<u32> = plan.iter().map(|r| r.retry).collect();
        assert_eq!(retries, [3, 4, 5]);
        assert_eq!(plan.iter().map(|r| r.delay).collect::<Vec<_>>(), [secs(4), secs(8), secs(16)]);
        assert_eq!(plan[2].cumulative, secs(28));
        assert_eq!(plan[0].band, (secs(4), secs(4)));
        assert_eq!(p.planned_retries(3, 1).len(), 1);
        assert!(p.planned_retries(6, 100).is_empty());
        assert!(p.planned_retries(u32::MAX, 100).is_empty());
        assert_eq!(p.planned_retries(1, 100).len(), 5);
        assert_eq!(p.planned_retries(0, 100), p.planned_retries(1, 100));
    }

    #[test]
    fn single_attempt_has_no_retries() {
        for max_attempts in [0, 1] {
            let p = RetryPolicy { max_attempts, ..RetryPolicy::default() };
            assert!(p.planned_retries(0, 10).is_empty());
            assert_eq!(p.total_delay(), Duration::ZERO);
        }
    }

    #[test]
    fn total_delay_matches_the_plan() {
        let p = RetryPolicy { max_attempts: 12, ..RetryPolicy::default() };
        let plan = p.planned_retries(0, usize::MAX);
        assert_eq!(plan.len(), 11);
        // 1+2+…+256 = 511, then 300 twice.
        assert_eq!(p.total_delay(), secs(511 + 600));
        assert_eq!(plan.last().map(|r| r.cumulative), Some(p.total_delay()));
    }

    #[test]
    fn huge_budgets_are_fast_and_saturate() {
        let p = RetryPolicy { max_attempts: u32::MAX, ..RetryPolicy::default() };
        assert_eq!(p.total_delay(), secs(511) + secs(300) * (u32::MAX - 1 - 9));
        assert_eq!(p.planned_retries(0, 3).len(), 3);

        let linear = RetryPolicy {
            max_attempts: u32::MAX,
            backoff_strategy: BackoffStrategy::Linear,
            initial_interval: Duration::from_nanos(1),
            max_interval: Duration::MAX,
            ..RetryPolicy::default()
        };
        // Σ n for n in 1..=u32::MAX−1 nanoseconds, never capped: the closed-form tail.
        let n = u128::from(u32::MAX - 1);
        let exact = n * (n + 1) / 2;
        let got = linear.total_delay().as_nanos();
        let diff = got.abs_diff(exact);
        assert!(diff * 1_000_000_000 < exact, "{got} vs {exact}");

        let poly = RetryPolicy {
            max_attempts: u32::MAX,
            backoff_strategy: BackoffStrategy::Polynomial,
            backoff_coefficient: 1e300,
            initial_interval: secs(365 * 86_400),
            max_interval: Duration::MAX,
            ..RetryPolicy::default()
        };
        assert_eq!(poly.total_delay(), Duration::MAX);
    }

    #[test]
    fn closed_forms_agree_with_iteration() {
        let cases = [
            (BackoffStrategy::Linear, 1.0),
            (BackoffStrategy::Exponential, 1.0005),
            (BackoffStrategy::Polynomial, 1.5),
            (BackoffStrategy::Polynomial, 4.0),
        ];
        for (strategy, c) in cases {
            let p = RetryPolicy {
                max_attempts: 9_001,
                backoff_strategy: strategy,
                backoff_coefficient: c,
                initial_interval: Duration::from_millis(1),
                max_interval: Duration::from_secs(86_400 * 365 * 1_000),
                ..RetryPolicy::default()
            };
            let iterated: u128 = (1..9_001).map(|n| p.delay_for(n).as_nanos()).sum();
            let closed = p.total_delay().as_nanos();
            let diff = closed.abs_diff(iterated);
            assert!(diff * 1_000_000_000 <= iterated, "{strategy:?} {c}: {closed} vs {iterated}");
        }
    }
}
