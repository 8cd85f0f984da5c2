//! Jitter: randomising retry delays so jobs that failed together do not retry together.
//!
//! | mode | jittered delay for effective delay d | band (inclusive bounds) |
//! | --- | --- | --- |
//! | `Off` | d | [d, d] |
//! | `Ojs` (OJS `jitter: true`) | min(d × U[0.5, 1.5), max_interval) | [d/2, min(1.5d, max)] |
//! | `Full` | d × U[0, 1) | [0, d] |
//! | `Proportional(f)` | min(d × (1 − f + 2f·U), max_interval) | [d(1−f), min(d(1+f), max)] |
//!
//! Randomness comes from a [`JitterSource`] so the engine stays pure and tests are exact.
//!
//! Wire form: `true` ⇔ `Ojs`, `false` ⇔ `Off`, `"full"` ⇔ `Full`, `{"proportional": f}` ⇔
//! `Proportional(f)`; `"ojs"` and `"none"` are also accepted on input.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};

use super::RetryPolicy;
use super::duration::scale_capped;

/// How a retry delay is randomised.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Jitter {
    /// No randomness: delays are exactly the strategy's.
    Off,
    /// OJS jitter: × U[0.5, 1.5), re-capped at `max_interval`. The OJS default.
    #[default]
    Ojs,
    /// "Full jitter": U[0, d]. Spreads load best, but may retry almost at once.
    Full,
    /// d × (1 ± U·f), uniform in [d(1−f), d(1+f)], re-capped; f must be in (0, 1].
    Proportional(f64),
}

/// A uniform random source in [0, 1).
///
/// Implemented for [`fastrand::Rng`] in production; tests inject [`FixedJitter`] so jittered
/// delays are exact.
pub trait JitterSource {
    /// The next uniform value in [0, 1). Values outside are clamped, NaN counts as 0.
    fn next_unit(&mut self) -> f64;
}

impl JitterSource for fastrand::Rng {
    fn next_unit(&mut self) -> f64 {
        self.f64()
    }
}

/// A [`JitterSource`] that always returns its value: deterministic jitter for tests and for
/// previews (0.0 gives the band's low end, values near 1.0 its high end).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FixedJitter(pub f64);

impl JitterSource for FixedJitter {
    fn next_unit(&mut self) -> f64 {
        self.0
    }
}

impl Jitter {
    /// The multiplier range `[low, high]` applied to the effective delay (before re-capping).
    /// An out-of-range proportional fraction is clamped into [0, 1] so runtime math never
    /// goes negative; validation rejects such policies anyway.
    fn factor_range(self) -> (f64, f64) {
        match self {
            Jitter::Off => (1.0, 1.0),
            Jitter::Ojs => (0.5, 1.5),
            Jitter::Full => (0.0, 1.0),
            Jitter::Proportional(f) => {
                let f = if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) };
                (1.0 - f, 1.0 + f)
            }
        }
    }

    /// `Err(reason)` when a proportional fraction is outside (0, 1].
    pub(crate) fn validate(self) -> Result<(), String> {
        match self {
            Jitter::Proportional(f) if !(f > 0.0 && f <= 1.0) => {
                Err(format!("proportional fraction must be in (0, 1], got {f}"))
            }
            _ => Ok(()),
        }
    }

    /// The OJS wire form (see the module docs).
    pub fn to_json(self) -> Value {
        match self {
            Jitter::Off => Value::Bool(false),
            Jitter::Ojs => Value::Bool(true),
            Jitter::Full => json!("full"),
            Jitter::Proportional(f) => json!({ "proportional": f }),
        }
    }

    /// Parses the wire form; the error is a reason without the field name. Accepts
    /// `true`/`false`, `"ojs"`/`"full"`/`"none"` and `{"proportional": f}` with f in (0, 1].
    pub fn from_json(v: &Value) -> Result<Jitter, String> {
        let jitter = match v {
            Value::Bool(true) => Jitter::Ojs,
            Value::Bool(false) => Jitter::Off,
            Value::String(s) => match s.as_str() {
                "ojs" => Jitter::Ojs,
                "full" => Jitter::Full,
                "none" => Jitter::Off,
                other => {
                    return Err(format!(
                        "must be true, false, \"ojs\", \"full\", \"none\" or {{\"proportional\": f}}, \
                         got {other:?}"
                    ));
                }
            },
            Value::Object(map) => {
                if let Some(key) = map.keys().find(|k| k.as_str() != "proportional") {
                    return Err(format!("unknown key {key:?}; expected {{\"proportional\": f}}"));
                }
                match map.get("proportional") {
                    Some(Value::Number(n)) => {
                        Jitter::Proportional(n.as_f64().ok_or("proportional must be a number")?)
                    }
                    Some(other) => {
                        return Err(format!(
                            "proportional must be a number, got {}",
                            json_type(other)
                        ));
                    }
                    None => return Err("expected {\"proportional\": f}, got {}".to_owned()),
                }
            }
            other => {
                return Err(format!(
                    "must be a boolean, a string or {{\"proportional\": f}}, got {}",
                    json_type(other)
                ));
            }
        };
        jitter.validate()?;
        Ok(jitter)
    }
}

/// The JSON type name of `v`, for "wrong type" messages.
pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

impl Serialize for Jitter {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Jitter {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(deserializer)?;
        Jitter::from_json(&v).map_err(serde::de::Error::custom)
    }
}

impl RetryPolicy {
    /// The delay before retry `retry` with jitter applied: [`RetryPolicy::delay_for`] scaled
    /// by a factor drawn from `rng`, re-capped at `max_interval`. Always inside
    /// [`RetryPolicy::jitter_band`]. `Jitter::Off` does not consume randomness.
    pub fn jittered_delay_for(&self, retry: u32, rng: &mut dyn JitterSource) -> Duration {
        let d = self.delay_for(retry);
        if self.jitter == Jitter::Off {
            return d;
        }
        let u = rng.next_unit();
        let u = if u.is_nan() { 0.0 } else { u.clamp(0.0, 1.0) };
        let (low, high) = self.jitter.factor_range();
        let (band_low, band_high) = self.band_around(d);
        scale_capped(d, low + (high - low) * u, self.max_interval).clamp(band_low, band_high)
    }

    /// Inclusive lower and upper bounds of what jitter can produce for retry `retry`, for the
    /// dashboard's planned schedule and for property tests.
    pub fn jitter_band(&self, retry: u32) -> (Duration, Duration) {
        self.band_around(self.delay_for(retry))
    }

    /// The band around effective delay `d` (≤ max_interval). It always contains `d`
    /// itself: above 2^53 ns (~104 days) `d × factor` is rounded in f64 and could otherwise
    /// land a nanosecond on the wrong side.
    fn band_around(&self, d: Duration) -> (Duration, Duration) {
        let (low, high) = self.jitter.factor_range();
        let high = scale_capped(d, high, self.max_interval).max(d);
        let low = scale_capped(d, low, self.max_interval).min(d);
        (low, high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(jitter: Jitter) -> RetryPolicy {
        RetryPolicy { jitter, ..RetryPolicy::default() }
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn off_is_exact() {
        let p = policy(Jitter::Off);
        assert_eq!(p.jittered_delay_for(3, &mut FixedJitter(0.9)), ms(4_000));
        assert_eq!(p.jitter_band(3), (ms(4_000), ms(4_000)));
    }

    #[test]
    fn ojs_multiplies_by_half_to_one_and_a_half() {
        let p = policy(Jitter::Ojs);
        assert_eq!(p.jittered_delay_for(3, &mut FixedJitter(0.0)), ms(2_000));
        assert_eq!(p.jittered_delay_for(3, &mut FixedJitter(0.5)), ms(4_000));
        assert_eq!(p.jittered_delay_for(3, &mut FixedJitter(0.75)), ms(5_000));
        assert_eq!(p.jitter_band(3), (ms(2_000), ms(6_000)));
        // At the cap, the upper half is cut back to max_interval.
        assert_eq!(p.jittered_delay_for(20, &mut FixedJitter(0.9)), ms(300_000));
        assert_eq!(p.jittered_delay_for(20, &mut FixedJitter(0.0)), ms(150_000));
        assert_eq!(p.jitter_band(20), (ms(150_000), ms(300_000)));
    }

    #[test]
    fn full_is_zero_to_d() {
        let p = policy(Jitter::Full);
        assert_eq!(p.jittered_delay_for(2, &mut FixedJitter(0.0)), Duration::ZERO);
        assert_eq!(p.jittered_delay_for(2, &mut FixedJitter(0.25)), ms(500));
        assert_eq!(p.jitter_band(2), (Duration::ZERO, ms(2_000)));
    }

    #[test]
    fn proportional_is_d_plus_minus_f() {
        let p = policy(Jitter::Proportional(0.5));
        assert_eq!(p.jittered_delay_for(3, &mut FixedJitter(0.0)), ms(2_000));
        assert_eq!(p.jittered_delay_for(3, &mut FixedJitter(0.5)), ms(4_000));
        assert_eq!(p.jittered_delay_for(3, &mut FixedJitter(0.75)), ms(5_000));
        assert_eq!(p.jitter_band(3), (ms(2_000), ms(6_000)));
        assert_eq!(p.jitter_band(20), (ms(150_000), ms(300_000)));
    }

    #[test]
    fn misbehaving_sources_stay_in_band() {
        for jitter in [Jitter::Ojs, Jitter::Full, Jitter::Proportional(0.3), Jitter::Proportional(7.0)] {
            let p = policy(jitter);
            for u in [f64::NAN, -1.0, 1.0, 2.0, f64::INFINITY] {
                let (lo, hi) = p.jitter_band(4);
                let d = p.jittered_delay_for(4, &mut FixedJitter(u));
                assert!(lo <= d && d <= hi, "{jitter:?} u={u}: {d:?} not in {lo:?}..={hi:?}");
            }
        }
    }

    #[test]
    fn fastrand_is_a_source() {
        let mut rng = fastrand::Rng::with_seed(7);
        let p = policy(Jitter::Ojs);
        let (lo, hi) = p.jitter_band(5);
        for _ in 0..1_000 {
            let d = p.jittered_delay_for(5, &mut rng);
            assert!(lo <= d && d <= hi);
        }
    }

    #[test]
    fn wire_form() {
        let cases = [
            (Jitter::Ojs, json!(true)),
            (Jitter::Off, json!(false)),
            (Jitter::Full, json!("full")),
            (Jitter::Proportional(0.1), json!({"proportional": 0.1})),
        ];
        for (jitter, wire) in cases {
            assert_eq!(jitter.to_json(), wire);
            assert_eq!(Jitter::from_json(&wire), Ok(jitter));
            assert_eq!(serde_json::to_value(jitter).ok(), Some(wire.clone()));
            assert_eq!(serde_json::from_value::<Jitter>(wire).ok(), Some(jitter));
        }
        assert_eq!(Jitter::from_json(&json!("ojs")), Ok(Jitter::Ojs));
        assert_eq!(Jitter::from_json(&json!("none")), Ok(Jitter::Off));
        for bad in [
            json!("yes"),
            json!(1),
            json!(null),
            json!({"proportional": 0}),
            json!({"proportional": 1.5}),
            json!({"proportional": "0.1"}),
            json!({"proportional": 0.1, "x": 1}),
            json!({}),
        ] {
            assert!(Jitter::from_json(&bad).is_err(), "{bad} should be rejected");
        }
    }
}
