//! Backoff strategies and the un-jittered delay before retry n (DESIGN §3 table).
//!
//! | strategy | raw delay |
//! | --- | --- |
//! | constant | `initial` |
//! | linear | `initial · n` |
//! | exponential | `initial · coefficient^(n-1)` |
//! | polynomial | `initial · n^coefficient` |
//! | custom | `schedule[min(n, len) - 1]` |
//!
//! effective = min(raw, max_interval), saturating for any `u32` n: retry budgets of
//! millions with coefficients like 1e300 must not overflow or panic.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::scale_capped;
use super::{PolicyError, RetryPolicy};

/// How the raw delay grows with the retry number n (1 = the retry after the first failure).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackoffStrategy {
    /// Always `initial_interval`: polling something with a known recovery time.
    Constant,
    /// `initial_interval · n`: gentle, steady backpressure.
    Linear,
    /// `initial_interval · coefficient^(n-1)`: the OJS default.
    #[default]
    Exponential,
    /// `initial_interval · n^coefficient`: Sidekiq-style (coefficient 4), slower than
    /// exponential, for long retry budgets.
    Polynomial,
    /// The explicit `schedule`; its last entry repeats.
    Custom,
}

impl BackoffStrategy {
    /// The wire name (`"exponential"`, …), also used for database text columns.
    pub fn as_str(self) -> &'static str {
        match self {
            BackoffStrategy::Constant => "constant",
            BackoffStrategy::Linear => "linear",
            BackoffStrategy::Exponential => "exponential",
            BackoffStrategy::Polynomial => "polynomial",
            BackoffStrategy::Custom => "custom",
        }
    }
}

impl fmt::Display for BackoffStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackoffStrategy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "constant" => Ok(BackoffStrategy::Constant),
            "linear" => Ok(BackoffStrategy::Linear),
            "exponential" => Ok(BackoffStrategy::Exponential),
            "polynomial" => Ok(BackoffStrategy::Polynomial),
            "custom" => Ok(BackoffStrategy::Custom),
            other => Err(PolicyError::new(
                "backoff_strategy",
                format!(
                    "must be one of \"constant\", \"linear\", \"exponential\", \"polynomial\", \
                     \"custom\", got {other:?}"
                ),
            )),
        }
    }
}

/// `base^exp` for `exp ≥ 0`. Small integral exponents use repeated multiplication (`powi`),
/// which is exact whenever the result is representable (2^8, 3^4: the seed vectors); large
/// ones use `powf`, because repeated squaring loses ~1 bit per doubling of the exponent.
fn power(base: f64, exp: f64) -> f64 {
    if exp.fract() == 0.0 && (0.0..=64.0).contains(&exp) {
        base.powi(exp as i32)
    } else {
        base.powf(exp)
    }
}

impl RetryPolicy {
    /// Effective delay before retry `retry` (n ≥ 1; 0 is treated as 1), without jitter:
    /// the raw delay of the strategy capped at `max_interval`.
    ///
    /// Never panics or wraps, whatever the policy holds (even one that fails
    /// [`RetryPolicy::validate`]), because it also runs on policies read back from storage.
    pub fn delay_for(&self, retry: u32) -> Duration {
        let n = retry.max(1);
        let cap = self.max_interval;
        let initial = self.initial_interval;
        match self.backoff_strategy {
            BackoffStrategy::Constant => initial.min(cap),
            BackoffStrategy::Linear => initial.saturating_mul(n).min(cap),
            BackoffStrategy::Exponential => {
                scale_capped(initial, power(self.backoff_coefficient, f64::from(n - 1)), cap)
            }
            BackoffStrategy::Polynomial => {
                scale_capped(initial, power(f64::from(n), self.backoff_coefficient), cap)
            }
            BackoffStrategy::Custom => {
                let len = self.schedule.len();
                let index = usize::try_from(n).unwrap_or(usize::MAX).min(len).saturating_sub(1);
                // An empty schedule fails validation; fall back to the initial interval.
                self.schedule.get(index).copied().unwrap_or(initial).min(cap)
            }
        }
    }

    /// True when `delay_for(m) == delay_for(n)` for every m ≥ n: the delay has settled (at
    /// the cap, or for good). Lets sums over huge retry budgets stop iterating early.
    pub(crate) fn delay_settled_at(&self, n: u32) -> bool {
        let n = n.max(1);
        match self.backoff_strategy {
            BackoffStrategy::Constant => true,
            BackoffStrategy::Custom => usize::try_from(n).map_or(true, |n| n >= self.schedule.len()),
            BackoffStrategy::Linear => self.delay_for(n) == self.max_interval,
            BackoffStrategy::Exponential => {
                let c = self.backoff_coefficient;
                c == 1.0 || (c > 1.0 && self.delay_for(n) == self.max_interval)
            }
            BackoffStrategy::Polynomial => {
                let c = self.backoff_coefficient;
                c == 0.0 || (c > 0.0 && self.delay_for(n) == self.max_interval)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|s| Duration::from_secs(*s)).collect()
    }

    fn delays(p: &RetryPolicy, n: u32) -> Vec<Duration> {
        (1..=n).map(|i| p.delay_for(i)).collect()
    }

    #[test]
    fn retry_zero_is_retry_one() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay_for(0), p.delay_for(1));
    }

    #[test]
    fn each_strategy() {
        let base = RetryPolicy { max_interval: Duration::from_secs(3_600), ..RetryPolicy::default() };
        let constant = RetryPolicy { backoff_strategy: BackoffStrategy::Constant, ..base.clone() };
        assert_eq!(delays(&constant, 3), secs(&[1, 1, 1]));
        let linear = RetryPolicy { backoff_strategy: BackoffStrategy::Linear, ..base.clone() };
        assert_eq!(delays(&linear, 4), secs(&[1, 2, 3, 4]));
        let exp = RetryPolicy { backoff_coefficient: 3.0, ..base.clone() };
        assert_eq!(delays(&exp, 4), secs(&[1, 3, 9, 27]));
        let poly = RetryPolicy {
            backoff_strategy: BackoffStrategy::Polynomial,
            backoff_coefficient: 2.0,
            ..base.clone()
        };
        assert_eq!(delays(&poly, 4), secs(&[1, 4, 9, 16]));
        let custom = RetryPolicy {
            backoff_strategy: BackoffStrategy::Custom,
            schedule: secs(&[5, 7000, 3]),
            ..base.clone()
        };
        assert_eq!(delays(&custom, 5), secs(&[5, 3_600, 3, 3, 3]));
    }

    #[test]
    fn fractional_coefficient() {
        let p = RetryPolicy {
            backoff_coefficient: 1.5,
            max_interval: Duration::from_secs(3_600),
            ..RetryPolicy::default()
        };
        assert_eq!(p.delay_for(2), Duration::from_millis(1_500));
        assert_eq!(p.delay_for(3), Duration::from_millis(2_250));
    }

    #[test]
    fn extremes_saturate_to_cap() {
        let cap = Duration::from_secs(10 * 365 * 86_400);
        for strategy in [
            BackoffStrategy::Constant,
            BackoffStrategy::Linear,
            BackoffStrategy::Exponential,
            BackoffStrategy::Polynomial,
        ] {
            let p = RetryPolicy {
                backoff_strategy: strategy,
                backoff_coefficient: 1e300,
                initial_interval: Duration::from_secs(365 * 86_400),
                max_interval: cap,
                ..RetryPolicy::default()
            };
            assert!(p.delay_for(u32::MAX) <= cap);
            assert!(p.delay_settled_at(u32::MAX));
        }
    }

    #[test]
    fn invalid_policies_do_not_panic() {
        let weird = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -2.0, 0.0, 0.5];
        for c in weird {
            for strategy in [BackoffStrategy::Exponential, BackoffStrategy::Polynomial] {
                let p = RetryPolicy {
                    backoff_strategy: strategy,
                    backoff_coefficient: c,
                    ..RetryPolicy::default()
                };
                for n in [0, 1, 2, 3, 1_000, u32::MAX] {
                    assert!(p.delay_for(n) <= p.max_interval);
                    let _ = p.delay_settled_at(n);
                }
            }
        }
        let empty_custom =
            RetryPolicy { backoff_strategy: BackoffStrategy::Custom, ..RetryPolicy::default() };
        assert_eq!(empty_custom.delay_for(7), Duration::from_secs(1));
        let zero = RetryPolicy {
            initial_interval: Duration::ZERO,
            max_interval: Duration::ZERO,
            ..RetryPolicy::default()
        };
        assert_eq!(zero.delay_for(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn wire_names() {
        for s in [
            BackoffStrategy::Constant,
            BackoffStrategy::Linear,
            BackoffStrategy::Exponential,
            BackoffStrategy::Polynomial,
            BackoffStrategy::Custom,
        ] {
            assert_eq!(s.as_str().parse::<BackoffStrategy>(), Ok(s));
            assert_eq!(serde_json::to_value(s).ok(), Some(serde_json::json!(s.as_str())));
        }
        assert!("fixed".parse::<BackoffStrategy>().is_err_and(|e| e.field == "backoff_strategy"));
    }
}
