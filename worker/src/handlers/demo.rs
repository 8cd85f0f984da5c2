//! The `demo.*` handlers, so a newcomer running the README command sees jobs succeed, retry,
//! dead-letter and take their time without writing any code:
//!
//! | type | does | args (first element, all optional) |
//! | --- | --- | --- |
//! | `demo.succeed` | completes at once, echoing its args | anything |
//! | `demo.noop` | completes at once with no result (what benchmarks run) | anything |
//! | `demo.flaky` | fails transiently (`demo.transient`) with a probability, or its first n attempts | `{"failure_rate": 0.5}`, `{"fail_attempts": 1}` |
//! | `demo.fail` | always fails with `demo.invalid_input` | `{"reason": "…"}` |
//! | `demo.slow` | sleeps, then completes | `{"ms": 3000}` |
//!
//! `demo.fail`'s error is retryable as far as the handler is concerned: it is the retry policy
//! (`non_retryable_errors: ["demo.invalid_input"]`) that sends it straight to the dead
//! letters, which is the point of the demonstration. [`seed_policies`] installs such policies
//! when none exist.

use std::time::Duration;

use rebound_queue::policy::OnExhaustion;
use rebound_queue::store::Actor;
use rebound_queue::{HandlerError, Outcome, PolicyPatch, Store, StoreError};
use serde_json::{Value, json};

use crate::handler::{Handler, HandlerFuture, HandlerResult, JobContext};

/// Which demonstration a `demo` handler gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemoBehaviour {
    Succeed,
    Noop,
    Flaky,
    Fail,
    Slow,
}

impl DemoBehaviour {
    pub const ALL: [DemoBehaviour; 5] = [DemoBehaviour::Succeed, DemoBehaviour::Noop, DemoBehaviour::Flaky, DemoBehaviour::Fail, DemoBehaviour::Slow];
    pub const NAMES: &'static str = "succeed, noop, flaky, fail or slow";

    pub fn name(self) -> &'static str {
        match self {
            DemoBehaviour::Succeed => "succeed",
            DemoBehaviour::Noop => "noop",
            DemoBehaviour::Flaky => "flaky",
            DemoBehaviour::Fail => "fail",
            DemoBehaviour::Slow => "slow",
        }
    }

    pub fn parse(s: &str) -> Option<DemoBehaviour> {
        DemoBehaviour::ALL.into_iter().find(|b| b.name() == s)
    }

    /// The behaviour a job type names by its last segment (`demo.flaky` → flaky).
    pub fn for_type(job_type: &str) -> Option<DemoBehaviour> {
        job_type.rsplit('.').next().and_then(DemoBehaviour::parse)
    }

    /// The job type the README uses for it.
    pub fn job_type(self) -> String {
        format!("demo.{}", self.name())
    }
}

pub struct DemoHandler {
    behaviour: DemoBehaviour,
}

impl DemoHandler {
    pub fn new(behaviour: DemoBehaviour) -> Self {
        DemoHandler { behaviour }
    }

    async fn run(&self, job: JobContext) -> HandlerResult {
        let options = job.arg(0).cloned().unwrap_or(Value::Null);
        match self.behaviour {
            DemoBehaviour::Succeed => Ok(Some(json!({ "echo": job.args() }))),
            DemoBehaviour::Noop => Ok(None),
            DemoBehaviour::Flaky => {
                if let Some(n) = options.get("fail_attempts").and_then(Value::as_i64) {
                    return if i64::from(job.attempt()) <= n {
                        Err(Outcome::Retry(HandlerError::new("demo.transient", format!("attempt {} of the first {n} fails by request", job.attempt()))))
                    } else {
                        Ok(Some(json!({ "survived_attempt": job.attempt() })))
                    };
                }
                let rate = options.get("failure_rate").and_then(Value::as_f64).or_else(|| options.as_f64()).unwrap_or(0.5).clamp(0.0, 1.0);
                if fastrand::f64() < rate {
                    Err(Outcome::Retry(
                        HandlerError::new("demo.transient", format!("simulated transient failure (failure rate {rate})"))
                            .with_details(json!({ "failure_rate": rate, "attempt": job.attempt() })),
                    ))
                } else {
                    Ok(Some(json!({ "survived_attempt": job.attempt() })))
                }
            }
            DemoBehaviour::Fail => {
                let reason = options.get("reason").and_then(Value::as_str).unwrap_or("the input can never be processed");
                Err(Outcome::Retry(
                    HandlerError::new("demo.invalid_input", format!("rejected: {reason}")).with_details(json!({ "args": job.args() })),
                ))
            }
            DemoBehaviour::Slow => {
                let ms = options.get("ms").and_then(Value::as_u64).or_else(|| options.as_u64()).unwrap_or(3_000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(Some(json!({ "slept_ms": ms })))
            }
        }
    }
}

impl Handler for DemoHandler {
    fn handle(&self, job: JobContext) -> HandlerFuture<'_> {
        Box::pin(self.run(job))
    }
}

/// The policy a demo type gets when it has none, so the demo shows dead letters.
pub fn demo_policy(behaviour: DemoBehaviour) -> Option<PolicyPatch> {
    match behaviour {
        DemoBehaviour::Fail => Some(PolicyPatch {
            non_retryable_errors: Some(vec!["demo.invalid_input".to_string()]),
            on_exhaustion: Some(OnExhaustion::DeadLetter),
            ..PolicyPatch::default()
        }),
        DemoBehaviour::Flaky => Some(PolicyPatch {
            max_attempts: Some(4),
            initial_interval: Some(Duration::from_secs(2)),
            on_exhaustion: Some(OnExhaustion::DeadLetter),
            ..PolicyPatch::default()
        }),
        DemoBehaviour::Succeed | DemoBehaviour::Noop | DemoBehaviour::Slow => None,
    }
}

/// Saves the demo policies of `types` that have no policy yet (an operator's edits win).
/// Returns the types seeded.
pub async fn seed_policies(store: &Store, types: &[(String, DemoBehaviour)]) -> Result<Vec<String>, StoreError> {
    let mut seeded = Vec::new();
    for (job_type, behaviour) in types {
        let Some(patch) = demo_policy(*behaviour) else { continue };
        if store.policy(job_type).await?.is_some() {
            continue;
        }
        store.put_policy(job_type, &patch, &Actor::system("rebound-worker"), Some("demo handler default")).await?;
        seeded.push(job_type.clone());
    }
    Ok(seeded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::test_context;

    async fn run(b: DemoBehaviour, args: Value) -> HandlerResult {
        DemoHandler::new(b).handle(test_context(&b.job_type(), args, 1)).await
    }

    #[tokio::test]
    async fn behaviours() {
        assert_eq!(run(DemoBehaviour::Succeed, json!([1])).await.unwrap(), Some(json!({"echo": [1]})));
        assert_eq!(run(DemoBehaviour::Noop, json!([1])).await.unwrap(), None);
        assert!(run(DemoBehaviour::Flaky, json!([{"failure_rate": 0.0}])).await.is_ok());
        assert!(run(DemoBehaviour::Flaky, json!([{"fail_attempts": 1}])).await.is_err(), "attempt 1 of 1 failing");
        assert!(run(DemoBehaviour::Flaky, json!([{"fail_attempts": 0}])).await.is_ok());
        match run(DemoBehaviour::Flaky, json!([{"failure_rate": 1.0}])).await {
            Err(Outcome::Retry(e)) => assert_eq!(e.error_type, "demo.transient"),
            other => panic!("{other:?}"),
        }
        match run(DemoBehaviour::Fail, json!([{"reason": "no such customer"}])).await {
            Err(Outcome::Retry(e)) => {
                assert_eq!(e.error_type, "demo.invalid_input");
                assert!(e.retryable, "the policy, not the handler, makes it non-retryable");
                assert_eq!(e.message, "rejected: no such customer");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(run(DemoBehaviour::Slow, json!([{"ms": 5}])).await.unwrap(), Some(json!({"slept_ms": 5})));
    }

    #[test]
    fn names() {
        assert_eq!(DemoBehaviour::for_type("demo.flaky"), Some(DemoBehaviour::Flaky));
        assert_eq!(DemoBehaviour::for_type("demo.nope"), None);
        for b in DemoBehaviour::ALL {
            assert_eq!(DemoBehaviour::parse(b.name()), Some(b));
        }
    }

    #[tokio::test]
    async fn seeding_respects_existing_policies() {
        let db = rebound_queue::testing::TestDb::new().await;
        let mine = PolicyPatch { max_attempts: Some(9), ..PolicyPatch::default() };
        db.store.put_policy("demo.flaky", &mine, &Actor::new("ops"), None).await.unwrap();
        let types = vec![
            ("demo.fail".to_string(), DemoBehaviour::Fail),
            ("demo.flaky".to_string(), DemoBehaviour::Flaky),
            ("demo.succeed".to_string(), DemoBehaviour::Succeed),
        ];
        assert_eq!(seed_policies(&db.store, &types).await.unwrap(), vec!["demo.fail".to_string()]);
        let fail = db.store.effective_policy("demo.fail", None).await.unwrap();
        assert!(fail.policy.is_non_retryable("demo.invalid_input"));
        assert_eq!(db.store.effective_policy("demo.flaky", None).await.unwrap().policy.max_attempts, 9);
        assert!(seed_policies(&db.store, &types).await.unwrap().is_empty());
    }
}
