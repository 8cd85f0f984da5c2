//! The largest durations and the range of timestamps Rebound accepts, checked where a value
//! enters (the HTTP API, the dashboard and the worker library all go through the checks in
//! [`crate::job`], [`crate::policy`] and the store).
//!
//! Without bounds, one value poisons shared work: a visibility timeout of `i64::MAX` ms makes
//! `now() + timeout` overflow Postgres' interval type in every claim of its queue, and a retry
//! interval of ten thousand years schedules a job after year 9999, which no reader can decode.
//! The maxima are generous for real use and leave every sum of them far inside both
//! Postgres' and jiff's ranges.
//!
//! | value | bound |
//! | --- | --- |
//! | `timeout_ms`, `visibility_timeout_ms` of a job | 1 ms ..= [`MAX_TIMEOUT`] (7 days) |
//! | retry-policy intervals, custom schedule entries, unique `period`, rate-limit periods, re-drive stagger, cron `@every` intervals | ≤ [`MAX_INTERVAL`] (365 days) |
//! | `scheduled_at`, `expires_at` | [`EARLIEST_TIME`] (1970) ..= [`LATEST_TIME`] (year 9000) |
//!
//! Arithmetic on stored values saturates at the same bounds, so a row written before they
//! existed cannot break a claim, a failure or a maintenance pass either.

use std::time::Duration;

use jiff::Timestamp;

/// Longest per-attempt timeout and visibility timeout (claim lock) of a job: 7 days.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Longest interval anywhere else (retry delays and caps, custom schedules, unique periods,
/// rate-limit windows, re-drive staggers): 365 days. A retry delay computed from an older,
/// unbounded stored policy is clamped to it as well.
pub const MAX_INTERVAL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Earliest accepted `scheduled_at` / `expires_at`: the Unix epoch.
pub const EARLIEST_TIME: Timestamp = Timestamp::UNIX_EPOCH;

/// Latest accepted `scheduled_at` / `expires_at`: 9000-01-01T00:00:00Z, a millennium short of
/// the end of jiff's range, so adding any bounded interval stays representable.
pub const LATEST_TIME: Timestamp = Timestamp::constant(221_845_392_000, 0);

/// [`MAX_TIMEOUT`] in milliseconds.
pub const MAX_TIMEOUT_MS: i64 = 7 * 24 * 3600 * 1000;

/// [`MAX_INTERVAL`] in milliseconds.
pub const MAX_INTERVAL_MS: i64 = 365 * 24 * 3600 * 1000;

/// Checks a job timeout in milliseconds; the error is a reason without the field name.
pub fn check_timeout_ms(ms: i64) -> Result<(), String> {
    if ms <= 0 {
        return Err(format!("must be a positive number of milliseconds, got {ms}"));
    }
    if ms > MAX_TIMEOUT_MS {
        return Err(format!("must be at most {MAX_TIMEOUT_MS} ms (7 days), got {ms}"));
    }
    Ok(())
}

/// Checks an interval against [`MAX_INTERVAL`]; the error is a reason without the field name.
pub fn check_interval(d: Duration) -> Result<(), String> {
    if d > MAX_INTERVAL {
        return Err(format!(
            "must be at most P365D (365 days), got {}",
            crate::policy::iso8601::format(d)
        ));
    }
    Ok(())
}

/// Checks a job timestamp against [`EARLIEST_TIME`] ..= [`LATEST_TIME`].
pub fn check_time(t: Timestamp) -> Result<(), String> {
    if t < EARLIEST_TIME || t > LATEST_TIME {
        return Err(format!("must be between {EARLIEST_TIME} and {LATEST_TIME}, got {t}"));
    }
    Ok(())
}

/// `d` capped at [`MAX_INTERVAL`].
pub fn clamp_interval(d: Duration) -> Duration {
    d.min(MAX_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_agree() {
        assert_eq!(MAX_TIMEOUT.as_millis(), MAX_TIMEOUT_MS as u128);
        assert_eq!(MAX_INTERVAL.as_millis(), MAX_INTERVAL_MS as u128);
        assert_eq!(LATEST_TIME.to_string(), "9000-01-01T00:00:00Z");
        // The latest time plus the longest interval is still a time jiff and Postgres hold.
        let sum = LATEST_TIME.checked_add(jiff::SignedDuration::try_from(MAX_INTERVAL).expect("fits"));
        assert!(sum.is_ok());
    }

    #[test]
    fn checks() {
        assert!(check_timeout_ms(1).is_ok());
        assert!(check_timeout_ms(MAX_TIMEOUT_MS).is_ok());
        for bad in [0, -1, MAX_TIMEOUT_MS + 1, i64::MAX] {
            assert!(check_timeout_ms(bad).is_err(), "{bad}");
        }
        assert!(check_interval(MAX_INTERVAL).is_ok());
        assert!(check_interval(MAX_INTERVAL + Duration::from_millis(1)).is_err_and(|e| e.contains("P365D")));
        assert!(check_time(LATEST_TIME).is_ok());
        assert!(check_time(EARLIEST_TIME).is_ok());
        assert!(check_time(Timestamp::MAX).is_err());
        assert!(check_time(Timestamp::MIN).is_err());
        assert_eq!(clamp_interval(Duration::MAX), MAX_INTERVAL);
    }
}
