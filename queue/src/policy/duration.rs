//! Scaling a [`Duration`] by a floating-point factor, saturating instead of panicking.
//!
//! Backoff and jitter multiply durations by `f64` factors that may be huge (coefficient
//! 1e300, retry 4 294 967 295) or not finite; `Duration::mul_f64` panics on overflow, so
//! all such arithmetic goes through here. Results are rounded to the nearest nanosecond,
//! which makes exact factors (powers of two, small integers) give exact delays.

use std::time::Duration;

const NANOS_PER_SEC: f64 = 1e9;

/// `d × factor`, rounded to the nearest nanosecond, clamped to `[0, cap]`.
///
/// A zero `d` gives zero whatever the factor (so `0 × ∞` is not NaN); a NaN product or
/// one at or above `cap` gives `cap` (an invalid policy should wait longest rather than
/// hammer), a non-positive product gives zero.
pub(crate) fn scale_capped(d: Duration, factor: f64, cap: Duration) -> Duration {
    if d.is_zero() {
        return Duration::ZERO;
    }
    if factor == 1.0 {
        // Exact even where d's nanoseconds do not fit an f64 mantissa.
        return d.min(cap);
    }
    let product = d.as_nanos() as f64 * factor;
    if product.is_nan() || product >= cap.as_nanos() as f64 {
        return cap;
    }
    if product <= 0.0 {
        return Duration::ZERO;
    }
    from_nanos_f64(product).min(cap)
}

/// A non-negative nanosecond count as a `Duration`, rounded, saturating at `Duration::MAX`
/// (NaN and negatives give zero).
pub(crate) fn from_nanos_f64(nanos: f64) -> Duration {
    if nanos.is_nan() || nanos <= 0.0 {
        return Duration::ZERO;
    }
    let nanos = nanos.round();
    // 2^64: below it a u64 nanosecond count is exact and cheap.
    if nanos < 18_446_744_073_709_551_616.0 {
        return Duration::from_nanos(nanos as u64);
    }
    let secs = (nanos / NANOS_PER_SEC).floor();
    if secs >= u64::MAX as f64 {
        return Duration::MAX;
    }
    let whole = secs as u64;
    // `as` saturates and the `min` keeps Duration::new from carrying into the seconds.
    let sub = ((nanos - whole as f64 * NANOS_PER_SEC).max(0.0) as u64).min(999_999_999);
    Duration::new(whole, sub as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_for_exact_factors() {
        let cap = Duration::MAX;
        assert_eq!(scale_capped(Duration::from_secs(1), 256.0, cap), Duration::from_secs(256));
        assert_eq!(scale_capped(Duration::from_millis(100), 32.0, cap), Duration::from_millis(3200));
        assert_eq!(scale_capped(Duration::from_secs(1), 0.5, cap), Duration::from_millis(500));
    }

    #[test]
    fn saturates_and_clamps() {
        let cap = Duration::from_secs(300);
        assert_eq!(scale_capped(Duration::from_secs(1), f64::INFINITY, cap), cap);
        assert_eq!(scale_capped(Duration::from_secs(1), f64::NAN, cap), cap);
        assert_eq!(scale_capped(Duration::ZERO, f64::INFINITY, cap), Duration::ZERO);
        assert_eq!(scale_capped(Duration::from_secs(1), -3.0, cap), Duration::ZERO);
        assert_eq!(scale_capped(Duration::MAX, 1e300, Duration::MAX), Duration::MAX);
        assert_eq!(from_nanos_f64(f64::INFINITY), Duration::MAX);
        assert_eq!(from_nanos_f64(f64::NAN), Duration::ZERO);
        assert_eq!(from_nanos_f64(-1.0), Duration::ZERO);
        let big = from_nanos_f64(1e25);
        assert_eq!(big.as_secs(), 10_000_000_000_000_000);
    }
}
