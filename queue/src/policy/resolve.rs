//! The effective policy of a job: built-in defaults ⊕ per-type policy ⊕ the job's override.
//!
//! Resolution happens when a failure is recorded, so a dashboard edit to a type's policy
//! applies to the next failure of jobs already in flight. The result carries, for each
//! field, the layer it came from, so the dashboard can show why a job retries as it does.

use serde::{Deserialize, Serialize};

use super::patch::FIELDS;
use super::{PolicyError, PolicyPatch, RetryPolicy};

/// Which layer a field of the effective policy came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicySource {
    /// The built-in (OJS) defaults.
    Default,
    /// The job type's policy (`retry_policies` table).
    Type,
    /// The job's own `options.retry`.
    Job,
}

impl PolicySource {
    /// `"default"`, `"type"` or `"job"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicySource::Default => "default",
            PolicySource::Type => "type",
            PolicySource::Job => "job",
        }
    }
}

/// A validated effective policy with the provenance of each field.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedPolicy {
    /// The merged, validated policy.
    pub policy: RetryPolicy,
    /// One entry per field, in [`FIELDS`] order: `(field name, layer it came from)`.
    pub sources: Vec<(&'static str, PolicySource)>,
}

impl ResolvedPolicy {
    /// The layer `field` came from; `None` for an unknown field name.
    pub fn source_of(&self, field: &str) -> Option<PolicySource> {
        self.sources.iter().find(|(f, _)| *f == field).map(|(_, s)| *s)
    }

    /// `{"field": "default" | "type" | "job", …}` for the dashboard and the admin API.
    pub fn sources_json(&self) -> serde_json::Value {
        self.sources
            .iter()
            .map(|(f, s)| ((*f).to_owned(), serde_json::Value::from(s.as_str())))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

/// Merges `defaults ⊕ type_patch ⊕ job_patch` field by field (later layers win) and
/// validates the result, because layers that are each fine can combine into an invalid
/// policy (a job's `initial_interval` above the type's `max_interval`, a `custom` strategy
/// from one layer without a `schedule` from any).
pub fn resolve(
    defaults: &RetryPolicy,
    type_patch: Option<&PolicyPatch>,
    job_patch: Option<&PolicyPatch>,
) -> Result<ResolvedPolicy, PolicyError> {
    let mut policy = defaults.clone();
    let mut sources: Vec<(&'static str, PolicySource)> =
        FIELDS.iter().map(|f| (*f, PolicySource::Default)).collect();
    for (patch, layer) in [(type_patch, PolicySource::Type), (job_patch, PolicySource::Job)] {
        let Some(patch) = patch else { continue };
        policy = patch.apply_to(&policy);
        for (field, source) in &mut sources {
            if patch.is_set(field) {
                *source = layer;
            }
        }
    }
    policy.validate()?;
    Ok(ResolvedPolicy { policy, sources })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::policy::{BackoffStrategy, Jitter, OnExhaustion};

    fn patch(v: serde_json::Value) -> PolicyPatch {
        match PolicyPatch::from_json(&v) {
            Ok(p) => p,
            Err(e) => panic!("{v}: {e}"),
        }
    }

    #[test]
    fn merges_field_by_field_with_provenance() {
        let defaults = RetryPolicy::default();
        let type_patch = patch(json!({"max_attempts": 10, "max_interval": "PT1H", "jitter": false}));
        let job_patch = patch(json!({"max_attempts": 4, "on_exhaustion": "dead_letter"}));
        let r = resolve(&defaults, Some(&type_patch), Some(&job_patch)).expect("valid");
        assert_eq!(
            r.policy,
            RetryPolicy {
                max_attempts: 4,
                max_interval: Duration::from_secs(3_600),
                jitter: Jitter::Off,
                on_exhaustion: OnExhaustion::DeadLetter,
                ..RetryPolicy::default()
            }
        );
        assert_eq!(r.source_of("max_attempts"), Some(PolicySource::Job));
        assert_eq!(r.source_of("max_interval"), Some(PolicySource::Type));
        assert_eq!(r.source_of("jitter"), Some(PolicySource::Type));
        assert_eq!(r.source_of("on_exhaustion"), Some(PolicySource::Job));
        assert_eq!(r.source_of("initial_interval"), Some(PolicySource::Default));
        assert_eq!(r.source_of("nope"), None);
        assert_eq!(r.sources.len(), FIELDS.len());
        assert_eq!(r.sources_json()["max_attempts"], json!("job"));
        assert_eq!(r.sources_json()["schedule"], json!("default"));
    }

    #[test]
    fn no_layers_is_the_defaults() {
        let r = resolve(&RetryPolicy::default(), None, None).expect("valid");
        assert_eq!(r.policy, RetryPolicy::default());
        assert!(r.sources.iter().all(|(_, s)| *s == PolicySource::Default));
        let empty = PolicyPatch::default();
        let r = resolve(&RetryPolicy::default(), Some(&empty), Some(&empty)).expect("valid");
        assert!(r.sources.iter().all(|(_, s)| *s == PolicySource::Default));
    }

    #[test]
    fn validates_the_merged_result() {
        let defaults = RetryPolicy::default();
        // Each layer alone is fine; together max_interval < initial_interval.
        let type_patch = patch(json!({"max_interval": "PT10S"}));
        let job_patch = patch(json!({"initial_interval": "PT30S"}));
        assert!(resolve(&defaults, Some(&type_patch), None).is_ok());
        assert!(resolve(&defaults, None, Some(&job_patch)).is_ok());
        let err = resolve(&defaults, Some(&type_patch), Some(&job_patch)).expect_err("invalid");
        assert_eq!(err.field, "max_interval");
        assert_eq!(err.reason, "must be >= initial_interval (PT30S), got PT10S");

        let custom = patch(json!({"backoff_strategy": "custom"}));
        let err = resolve(&defaults, Some(&custom), None).expect_err("empty schedule");
        assert_eq!(err.field, "schedule");
        let schedule = patch(json!({"schedule": ["PT2S", "PT4S"]}));
        let r = resolve(&defaults, Some(&custom), Some(&schedule)).expect("valid");
        assert_eq!(r.policy.backoff_strategy, BackoffStrategy::Custom);
        assert_eq!(r.source_of("schedule"), Some(PolicySource::Job));

        let bad_defaults = RetryPolicy {
            non_retryable_errors: vec!["auth*".into()],
            ..RetryPolicy::default()
        };
        let err = resolve(&bad_defaults, None, None).expect_err("bad pattern");
        assert_eq!(err.field, "non_retryable_errors");
        // ... unless a later layer replaces the list.
        let fix = patch(json!({"non_retryable_errors": ["auth.*"]}));
        assert!(resolve(&bad_defaults, None, Some(&fix)).is_ok());
    }
}
