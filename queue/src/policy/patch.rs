//! [`PolicyPatch`]: a partial retry policy and its OJS JSON wire form.
//!
//! Per-type policies (the `retry_policies` table) and a job's `options.retry` are both
//! patches: OJS says omitted fields inherit, so a developer who only wants
//! `{"max_attempts": 10}` need not restate the rest. Parsing checks each field on its own
//! (type, range, ISO-8601); cross-field rules are checked on the merged policy by
//! [`resolve`](super::resolve()).
//!
//! Wire form (all keys optional):
//!
//! | key | JSON | notes |
//! | --- | --- | --- |
//! | `max_attempts` | integer 0 ..= [`MAX_ATTEMPTS`] | 0 behaves like 1 |
//! | `initial_interval`, `max_interval` | ISO-8601 string > 0 | `"PT1S"`, `"P1D"` = 24 h |
//! | `initial_interval_ms`, `max_interval_ms` | integer > 0 | OJS HTTP-binding alias; not with the ISO key |
//! | `backoff_coefficient` | number ≥ 1.0 | |
//! | `jitter` | see [`Jitter`] | |
//! | `non_retryable_errors` | array of patterns | see [`non_retryable`] |
//! | `on_exhaustion` | `"discard"` \| `"dead_letter"` | |
//! | `backoff_strategy` | `"constant"` \| `"linear"` \| `"exponential"` \| `"polynomial"` \| `"custom"` | |
//! | `schedule` | array of ISO-8601 strings > 0 | used by `custom` |
//!
//! A `null` value means "not set" (inherit), which lets a form clear a field. Unknown keys
//! are rejected with their name.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::jitter::json_type;
use super::{
    BackoffStrategy, Jitter, OnExhaustion, PolicyError, RetryPolicy, iso8601, non_retryable,
    validate_coefficient,
};

/// A partial policy: every field optional, merged field by field over a base.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyPatch {
    /// See [`RetryPolicy::max_attempts`].
    pub max_attempts: Option<u32>,
    /// See [`RetryPolicy::initial_interval`].
    pub initial_interval: Option<Duration>,
    /// See [`RetryPolicy::backoff_coefficient`].
    pub backoff_coefficient: Option<f64>,
    /// See [`RetryPolicy::max_interval`].
    pub max_interval: Option<Duration>,
    /// See [`RetryPolicy::jitter`].
    pub jitter: Option<Jitter>,
    /// See [`RetryPolicy::non_retryable_errors`]; replaces (does not extend) the base list.
    pub non_retryable_errors: Option<Vec<String>>,
    /// See [`RetryPolicy::on_exhaustion`].
    pub on_exhaustion: Option<OnExhaustion>,
    /// See [`RetryPolicy::backoff_strategy`].
    pub backoff_strategy: Option<BackoffStrategy>,
    /// See [`RetryPolicy::schedule`]; replaces the base list.
    pub schedule: Option<Vec<Duration>>,
}

/// The policy field names in wire order; also the order of [`ResolvedPolicy::sources`].
///
/// [`ResolvedPolicy::sources`]: super::ResolvedPolicy::sources
pub const FIELDS: [&str; 9] = [
    "max_attempts",
    "initial_interval",
    "backoff_coefficient",
    "max_interval",
    "jitter",
    "non_retryable_errors",
    "on_exhaustion",
    "backoff_strategy",
    "schedule",
];

/// The largest `max_attempts` accepted: 2147483647 (`i32::MAX`). The value is stored in
/// `jobs.max_attempts`, a Postgres `integer`; a policy saved above it failed every enqueue of
/// its type at the cast. Far beyond any real budget either way.
pub const MAX_ATTEMPTS: u32 = i32::MAX as u32;

const INITIAL_MS: &str = "initial_interval_ms";
const MAX_MS: &str = "max_interval_ms";

impl From<&RetryPolicy> for PolicyPatch {
    /// Every field set: the patch that turns any base into `policy`.
    fn from(p: &RetryPolicy) -> Self {
        PolicyPatch {
            max_attempts: Some(p.max_attempts),
            initial_interval: Some(p.initial_interval),
            backoff_coefficient: Some(p.backoff_coefficient),
            max_interval: Some(p.max_interval),
            jitter: Some(p.jitter),
            non_retryable_errors: Some(p.non_retryable_errors.clone()),
            on_exhaustion: Some(p.on_exhaustion),
            backoff_strategy: Some(p.backoff_strategy),
            schedule: Some(p.schedule.clone()),
        }
    }
}

impl PolicyPatch {
    /// Parses an OJS `retry` object. Every error names its field; a non-object names
    /// `"retry"`. See the module docs for the accepted form.
    pub fn from_json(v: &Value) -> Result<PolicyPatch, PolicyError> {
        let Value::Object(map) = v else {
            return Err(PolicyError::new(
                "retry",
                format!("must be a JSON object, got {}", json_type(v)),
            ));
        };
        if let Some(key) =
            map.keys().find(|k| !FIELDS.contains(&k.as_str()) && *k != INITIAL_MS && *k != MAX_MS)
        {
            return Err(PolicyError::new(key.as_str(), "unknown retry policy field"));
        }
        Ok(PolicyPatch {
            max_attempts: field(map, "max_attempts", parse_max_attempts)?,
            initial_interval: interval(map, "initial_interval", INITIAL_MS)?,
            backoff_coefficient: field(map, "backoff_coefficient", parse_coefficient)?,
            max_interval: interval(map, "max_interval", MAX_MS)?,
            jitter: field(map, "jitter", |v| {
                Jitter::from_json(v).map_err(|r| PolicyError::new("jitter", r))
            })?,
            non_retryable_errors: field(map, "non_retryable_errors", parse_patterns)?,
            on_exhaustion: field(map, "on_exhaustion", |v| enum_str(v, "on_exhaustion"))?,
            backoff_strategy: field(map, "backoff_strategy", |v| enum_str(v, "backoff_strategy"))?,
            schedule: field(map, "schedule", parse_schedule)?,
        })
    }

    /// Parses a patch read back from storage (a `retry_policies` row, a job's `retry`): as
    /// [`PolicyPatch::from_json`], except that a `max_attempts` above [`MAX_ATTEMPTS`], saved
    /// before that bound existed, reads as [`MAX_ATTEMPTS`]. Such a row must keep deciding
    /// failures as near to what was saved as storage allows, not be dropped as invalid.
    pub fn from_stored_json(v: &Value) -> Result<PolicyPatch, PolicyError> {
        let too_many = v.get("max_attempts").and_then(Value::as_f64).is_some_and(|n| n > f64::from(MAX_ATTEMPTS));
        if !too_many {
            return PolicyPatch::from_json(v);
        }
        let mut capped = v.clone();
        if let Some(map) = capped.as_object_mut() {
            map.insert("max_attempts".into(), Value::from(MAX_ATTEMPTS));
        }
        PolicyPatch::from_json(&capped)
    }

    /// Only the set fields, in wire form; `from_json(&p.to_json()) == Ok(p)` for any patch
    /// whose values are themselves valid.
    pub fn to_json(&self) -> Value {
        let mut map = Map::new();
        let mut put = |key: &str, value: Option<Value>| {
            if let Some(value) = value {
                map.insert(key.to_owned(), value);
            }
        };
        put("max_attempts", self.max_attempts.map(Value::from));
        put("initial_interval", self.initial_interval.map(|d| iso8601::format(d).into()));
        put("backoff_coefficient", self.backoff_coefficient.map(Value::from));
        put("max_interval", self.max_interval.map(|d| iso8601::format(d).into()));
        put("jitter", self.jitter.map(Jitter::to_json));
        put("non_retryable_errors", self.non_retryable_errors.as_ref().map(|v| v.clone().into()));
        put("on_exhaustion", self.on_exhaustion.map(|o| o.as_str().into()));
        put("backoff_strategy", self.backoff_strategy.map(|s| s.as_str().into()));
        put(
            "schedule",
            self.schedule
                .as_ref()
                .map(|s| s.iter().map(|d| Value::from(iso8601::format(*d))).collect()),
        );
        Value::Object(map)
    }

    /// `self` over `base`, field by field (list fields are replaced, not concatenated). The
    /// result is not validated; [`resolve`](super::resolve()) does that.
    pub fn apply_to(&self, base: &RetryPolicy) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.unwrap_or(base.max_attempts),
            initial_interval: self.initial_interval.unwrap_or(base.initial_interval),
            backoff_coefficient: self.backoff_coefficient.unwrap_or(base.backoff_coefficient),
            max_interval: self.max_interval.unwrap_or(base.max_interval),
            jitter: self.jitter.unwrap_or(base.jitter),
            non_retryable_errors: self
                .non_retryable_errors
                .clone()
                .unwrap_or_else(|| base.non_retryable_errors.clone()),
            on_exhaustion: self.on_exhaustion.unwrap_or(base.on_exhaustion),
            backoff_strategy: self.backoff_strategy.unwrap_or(base.backoff_strategy),
            schedule: self.schedule.clone().unwrap_or_else(|| base.schedule.clone()),
        }
    }

    /// Caps every interval at [`crate::bounds::MAX_INTERVAL`]; returns whether any was
    /// longer. For patches read back from storage, written before the bounds existed: they
    /// keep working (and displaying) with the intervals the failure path would use anyway.
    pub fn clamp_to_bounds(&mut self) -> bool {
        let clamp = |d: &mut Duration| {
            let capped = crate::bounds::clamp_interval(*d);
            std::mem::replace(d, capped) != capped
        };
        let mut changed = false;
        for d in [&mut self.initial_interval, &mut self.max_interval].into_iter().flatten() {
            changed |= clamp(d);
        }
        for d in self.schedule.iter_mut().flatten() {
            changed |= clamp(d);
        }
        changed
    }

    /// True when no field is set: the patch changes nothing (e.g. an empty `"retry": {}`).
    pub fn is_empty(&self) -> bool {
        self.set_fields().next().is_none()
    }

    /// Whether the field named `field` (one of [`FIELDS`]) is set; unknown names give false.
    pub fn is_set(&self, field: &str) -> bool {
        match field {
            "max_attempts" => self.max_attempts.is_some(),
            "initial_interval" => self.initial_interval.is_some(),
            "backoff_coefficient" => self.backoff_coefficient.is_some(),
            "max_interval" => self.max_interval.is_some(),
            "jitter" => self.jitter.is_some(),
            "non_retryable_errors" => self.non_retryable_errors.is_some(),
            "on_exhaustion" => self.on_exhaustion.is_some(),
            "backoff_strategy" => self.backoff_strategy.is_some(),
            "schedule" => self.schedule.is_some(),
            _ => false,
        }
    }

    /// The names of the set fields, in [`FIELDS`] order.
    pub fn set_fields(&self) -> impl Iterator<Item = &'static str> + '_ {
        FIELDS.into_iter().filter(|f| self.is_set(f))
    }
}

/// Reads an optional key; absent and `null` both mean "not set".
fn field<T>(
    map: &Map<String, Value>,
    key: &str,
    parse: impl FnOnce(&Value) -> Result<T, PolicyError>,
) -> Result<Option<T>, PolicyError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => parse(v).map(Some),
    }
}

fn parse_max_attempts(v: &Value) -> Result<u32, PolicyError> {
    let err = |reason: String| PolicyError::new("max_attempts", reason);
    let Value::Number(n) = v else {
        return Err(err(format!("must be an integer, got {}", json_type(v))));
    };
    let f = n.as_f64().unwrap_or(f64::NAN);
    if n.as_i64().is_some_and(|i| i < 0) || f < 0.0 {
        return Err(err(format!("must be >= 0, got {n}")));
    }
    // Integral floats such as 3.0 are accepted: JSON does not distinguish them.
    let whole = match n.as_u64() {
        Some(i) => i,
        None if f.fract() == 0.0 => f as u64, // saturating: huge values fail below
        None => return Err(err(format!("must be an integer, got {n}"))),
    };
    match u32::try_from(whole) {
        Ok(max) if max <= MAX_ATTEMPTS => Ok(max),
        _ => Err(err(format!("must be <= {MAX_ATTEMPTS}, got {n}"))),
    }
}

fn parse_coefficient(v: &Value) -> Result<f64, PolicyError> {
    let Some(c) = v.as_f64() else {
        return Err(PolicyError::new(
            "backoff_coefficient",
            format!("must be a number, got {}", json_type(v)),
        ));
    };
    validate_coefficient(c)?;
    Ok(c)
}

/// A positive ISO-8601 duration string; the error is a reason without the field name.
fn parse_duration(v: &Value) -> Result<Duration, String> {
    let Value::String(s) = v else {
        return Err(format!("must be an ISO-8601 duration string, got {}", json_type(v)));
    };
    let d = iso8601::parse(s)?;
    if d.is_zero() {
        return Err(format!("must be > 0, got {s:?}"));
    }
    Ok(d)
}

/// `initial_interval` / `max_interval`, or their `_ms` alias (never both).
fn interval(map: &Map<String, Value>, key: &str, ms_key: &str) -> Result<Option<Duration>, PolicyError> {
    let iso = field(map, key, |v| parse_duration(v).map_err(|r| PolicyError::new(key, r)))?;
    let ms = field(map, ms_key, |v| match v.as_u64() {
        Some(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(PolicyError::new(ms_key, format!("must be a positive integer, got {v}"))),
    })?;
    match (iso, ms) {
        (Some(_), Some(_)) => Err(PolicyError::new(key, format!("give either {key} or {ms_key}, not both"))),
        (iso, ms) => Ok(iso.or(ms)),
    }
}

fn parse_patterns(v: &Value) -> Result<Vec<String>, PolicyError> {
    let err = |reason: String| PolicyError::new("non_retryable_errors", reason);
    let Value::Array(items) = v else {
        return Err(err(format!("must be an array of strings, got {}", json_type(v))));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::String(s) = item else {
                return Err(err(format!("entry {i}: must be a string, got {}", json_type(item))));
            };
            non_retryable::validate_pattern(s).map_err(|r| err(format!("entry {i} ({s:?}): {r}")))?;
            Ok(s.clone())
        })
        .collect()
}

fn parse_schedule(v: &Value) -> Result<Vec<Duration>, PolicyError> {
    let err = |reason: String| PolicyError::new("schedule", reason);
    let Value::Array(items) = v else {
        return Err(err(format!("must be an array of ISO-8601 durations, got {}", json_type(v))));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| parse_duration(item).map_err(|r| err(format!("entry {i}: {r}"))))
        .collect()
}

/// A string enum parsed by its `FromStr` (whose error already names the field).
fn enum_str<T: std::str::FromStr<Err = PolicyError>>(v: &Value, field: &str) -> Result<T, PolicyError> {
    match v {
        Value::String(s) => s.parse(),
        other => Err(PolicyError::new(field, format!("must be a string, got {}", json_type(other)))),
    }
}

impl Serialize for PolicyPatch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for PolicyPatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(deserializer)?;
        PolicyPatch::from_json(&v).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn err_of(v: Value) -> PolicyError {
        PolicyPatch::from_json(&v).expect_err("should be rejected")
    }

    #[test]
    fn parses_a_full_ojs_object() {
        let v = json!({
            "max_attempts": 25,
            "initial_interval": "PT15S",
            "backoff_coefficient": 4.0,
            "max_interval": "PT1H",
            "jitter": {"proportional": 0.1},
            "non_retryable_errors": ["payment.card_stolen", "validation.*"],
            "on_exhaustion": "dead_letter",
            "backoff_strategy": "polynomial",
            "schedule": ["PT1S", "PT0.5S", "P1D"]
        });
        let p = PolicyPatch::from_json(&v).expect("valid");
        assert_eq!(
            p,
            PolicyPatch {
                max_attempts: Some(25),
                initial_interval: Some(Duration::from_secs(15)),
                backoff_coefficient: Some(4.0),
                max_interval: Some(Duration::from_secs(3_600)),
                jitter: Some(Jitter::Proportional(0.1)),
                non_retryable_errors: Some(vec!["payment.card_stolen".into(), "validation.*".into()]),
                on_exhaustion: Some(OnExhaustion::DeadLetter),
                backoff_strategy: Some(BackoffStrategy::Polynomial),
                schedule: Some(vec![
                    Duration::from_secs(1),
                    Duration::from_millis(500),
                    Duration::from_secs(86_400)
                ]),
            }
        );
        assert_eq!(PolicyPatch::from_json(&p.to_json()), Ok(p.clone()));
        assert_eq!(p.set_fields().count(), FIELDS.len());
    }

    #[test]
    fn partial_patches_round_trip_with_only_set_fields() {
        let p = PolicyPatch::from_json(&json!({"max_attempts": 10, "jitter": false})).expect("valid");
        assert_eq!(p.to_json(), json!({"max_attempts": 10, "jitter": false}));
        assert_eq!(p.set_fields().collect::<Vec<_>>(), ["max_attempts", "jitter"]);
        let empty = PolicyPatch::from_json(&json!({})).expect("valid");
        assert!(empty.is_empty());
        assert!(!p.is_empty());
        assert_eq!(empty.to_json(), json!({}));
        // null = not set.
        let nulls = PolicyPatch::from_json(&json!({"max_attempts": null, "jitter": null}));
        assert_eq!(nulls, Ok(PolicyPatch::default()));
        // serde goes through the same wire form.
        assert_eq!(serde_json::to_value(&p).ok(), Some(p.to_json()));
        assert_eq!(serde_json::from_value::<PolicyPatch>(p.to_json()).ok(), Some(p));
    }

    #[test]
    fn full_policy_round_trips() {
        let policy = RetryPolicy::default();
        let wire = policy.to_json();
        assert_eq!(
            wire,
            json!({
                "max_attempts": 3, "initial_interval": "PT1S", "backoff_coefficient": 2.0,
                "max_interval": "PT5M", "jitter": true, "non_retryable_errors": [],
                "on_exhaustion": "discard", "backoff_strategy": "exponential", "schedule": []
            })
        );
        assert_eq!(RetryPolicy::from_json(&wire), Ok(policy.clone()));
        let custom = RetryPolicy {
            backoff_strategy: BackoffStrategy::Custom,
            schedule: vec![Duration::from_secs(2), Duration::from_millis(4_500)],
            jitter: Jitter::Full,
            non_retryable_errors: vec!["*".into()],
            max_attempts: 0,
            ..RetryPolicy::default()
        };
        assert_eq!(RetryPolicy::from_json(&custom.to_json()), Ok(custom.clone()));
        assert_eq!(serde_json::from_value::<RetryPolicy>(custom.to_json()).ok(), Some(custom.clone()));
        assert_eq!(serde_json::to_value(&custom).ok(), Some(custom.to_json()));
        // A partial object fills in the OJS defaults.
        let partial = RetryPolicy::from_json(&json!({"max_attempts": 10})).expect("valid");
        assert_eq!(partial, RetryPolicy { max_attempts: 10, ..RetryPolicy::default() });
    }

    #[test]
    fn apply_to_is_field_by_field() {
        let base = RetryPolicy {
            non_retryable_errors: vec!["a.*".into()],
            schedule: vec![Duration::from_secs(9)],
            ..RetryPolicy::default()
        };
        let p = PolicyPatch {
            max_interval: Some(Duration::from_secs(60)),
            non_retryable_errors: Some(vec!["b".into()]),
            ..PolicyPatch::default()
        };
        let merged = p.apply_to(&base);
        assert_eq!(merged.max_interval, Duration::from_secs(60));
        assert_eq!(merged.non_retryable_errors, ["b"]);
        assert_eq!(merged.schedule, base.schedule);
        assert_eq!(merged.max_attempts, base.max_attempts);
        assert_eq!(PolicyPatch::default().apply_to(&base), base);
        assert_eq!(PolicyPatch::from(&base).apply_to(&RetryPolicy::default()), base);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"max_attempts": -1}), "max_attempts", "must be >= 0, got -1"),
            (json!({"max_attempts": 2.5}), "max_attempts", "must be an integer, got 2.5"),
            (json!({"max_attempts": "3"}), "max_attempts", "must be an integer, got string"),
            (json!({"max_attempts": 5_000_000_000u64}), "max_attempts", "must be <= 2147483647, got 5000000000"),
            // jobs.max_attempts is an `integer`: anything above i32::MAX cannot be stored.
            (json!({"max_attempts": 2_147_483_648u64}), "max_attempts", "must be <= 2147483647, got 2147483648"),
            (json!({"max_attempts": 4_294_967_295u64}), "max_attempts", "must be <= 2147483647, got 4294967295"),
            (json!({"max_attempts": 3e9}), "max_attempts", "must be <= 2147483647, got 3000000000.0"),
            (json!({"backoff_coefficient": 0.5}), "backoff_coefficient", "must be >= 1.0, got 0.5"),
            (json!({"backoff_coefficient": true}), "backoff_coefficient", "must be a number, got boolean"),
            (json!({"initial_interval": "PT0S"}), "initial_interval", "must be > 0, got \"PT0S\""),
            (json!({"max_interval": 5}), "max_interval", "must be an ISO-8601 duration string, got number"),
            (json!({"on_exhaustion": "explode"}), "on_exhaustion", "must be \"discard\" or \"dead_letter\", got \"explode\""),
            (json!({"on_exhaustion": 1}), "on_exhaustion", "must be a string, got number"),
            (json!({"non_retryable_errors": "auth.*"}), "non_retryable_errors", "must be an array of strings, got string"),
            (json!({"non_retryable_errors": ["ok", 3]}), "non_retryable_errors", "entry 1: must be a string, got number"),
            (json!({"schedule": ["PT1S", "PT0S"]}), "schedule", "entry 1: must be > 0, got \"PT0S\""),
            (json!({"maxAttempts": 3}), "maxAttempts", "unknown retry policy field"),
            (json!([1]), "retry", "must be a JSON object, got array"),
            (json!("PT1S"), "retry", "must be a JSON object, got string"),
        ];
        for (v, field, reason) in cases {
            let e = err_of(v.clone());
            assert_eq!((e.field.as_str(), e.reason.as_str()), (field, reason), "{v}");
        }
        assert_eq!(err_of(json!({"max_attempts": -1})).to_string(), "max_attempts: must be >= 0, got -1");
        assert_eq!(err_of(json!({"backoff_strategy": "fixed"})).field, "backoff_strategy");
        assert_eq!(err_of(json!({"jitter": "maybe"})).field, "jitter");
        assert_eq!(err_of(json!({"jitter": {"proportional": 2}})).field, "jitter");
        for bad in ["a.*.b", "auth*", ""] {
            let e = err_of(json!({ "non_retryable_errors": [bad] }));
            assert_eq!(e.field, "non_retryable_errors", "{bad:?}");
        }
        assert_eq!(PolicyPatch::from_json(&json!({"max_attempts": 3.0})).map(|p| p.max_attempts), Ok(Some(3)));
        assert_eq!(PolicyPatch::from_json(&json!({"max_attempts": 0})).map(|p| p.max_attempts), Ok(Some(0)));
        assert_eq!(PolicyPatch::from_json(&json!({"max_attempts": 2_147_483_647})).map(|p| p.max_attempts), Ok(Some(MAX_ATTEMPTS)));
    }

    #[test]
    fn policies_built_in_code_are_held_to_the_same_bound() {
        let over = RetryPolicy { max_attempts: MAX_ATTEMPTS + 1, ..RetryPolicy::default() };
        assert_eq!(over.validate().map_err(|e| e.field), Err("max_attempts".to_string()));
        assert_eq!(RetryPolicy { max_attempts: MAX_ATTEMPTS, ..RetryPolicy::default() }.validate(), Ok(()));
        let patch = PolicyPatch { max_attempts: Some(u32::MAX), ..PolicyPatch::default() };
        let e = crate::policy::resolve(&RetryPolicy::default(), None, Some(&patch)).expect_err("refused");
        assert_eq!(e.field, "max_attempts");
    }

    #[test]
    fn stored_max_attempts_beyond_the_bound_read_as_the_bound() {
        let stored = json!({"max_attempts": 4_294_967_295u64, "jitter": false});
        assert_eq!(err_of(stored.clone()).field, "max_attempts");
        let p = PolicyPatch::from_stored_json(&stored).expect("capped");
        assert_eq!((p.max_attempts, p.jitter), (Some(MAX_ATTEMPTS), Some(Jitter::Off)));
        assert_eq!(PolicyPatch::from_stored_json(&json!({"max_attempts": 7})).map(|p| p.max_attempts), Ok(Some(7)));
        // Anything else wrong is still an error.
        assert_eq!(PolicyPatch::from_stored_json(&json!({"max_attempts": -1})).map_err(|e| e.field), Err("max_attempts".to_string()));
    }

    #[test]
    fn durations_must_be_iso_8601_and_positive() {
        for ok in [("PT1S", 1_000), ("PT0.5S", 500), ("P1D", 86_400_000), ("PT1H30M", 5_400_000)] {
            let p = PolicyPatch::from_json(&json!({ "initial_interval": ok.0 })).expect(ok.0);
            assert_eq!(p.initial_interval, Some(Duration::from_millis(ok.1)));
        }
        for bad in ["1s", "", "-PT1S", "PT0S", "P1M", "soon"] {
            let e = err_of(json!({ "initial_interval": bad }));
            assert_eq!(e.field, "initial_interval", "{bad:?}");
            let e = err_of(json!({ "max_interval": bad }));
            assert_eq!(e.field, "max_interval", "{bad:?}");
        }
    }

    #[test]
    fn millisecond_aliases() {
        let p = PolicyPatch::from_json(&json!({"initial_interval_ms": 250, "max_interval_ms": 60_000}))
            .expect("valid");
        assert_eq!(p.initial_interval, Some(Duration::from_millis(250)));
        assert_eq!(p.max_interval, Some(Duration::from_secs(60)));
        assert_eq!(p.to_json(), json!({"initial_interval": "PT0.25S", "max_interval": "PT1M"}));
        assert_eq!(err_of(json!({"initial_interval_ms": 0})).field, "initial_interval_ms");
        assert_eq!(err_of(json!({"initial_interval_ms": -5})).field, "initial_interval_ms");
        let both = err_of(json!({"initial_interval": "PT1S", "initial_interval_ms": 1000}));
        assert_eq!(both.field, "initial_interval");
    }
}
