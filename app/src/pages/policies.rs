//! Retry policies at a glance: the default (`*`) and one row per job type, with the effective
//! values each type's jobs get and the total wait until exhaustion.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::AppError;
use crate::feedback::ErrorBox;
use crate::filters::urlencode;
use crate::time_text::When;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyRow {
    pub job_type: String,
    /// Whether this type has a saved policy (else it runs on the defaults).
    pub saved: bool,
    pub version: Option<i32>,
    pub updated: Option<When>,
    pub updated_by: Option<String>,
    /// Field names the saved policy sets.
    pub overrides: Vec<String>,
    pub max_attempts: u32,
    pub strategy: String,
    pub initial_interval: String,
    pub backoff_coefficient: f64,
    pub max_interval: String,
    pub jitter: String,
    pub on_exhaustion: String,
    pub total_wait: String,
    pub error: Option<String>,
}

#[server(endpoint = "policies_overview")]
pub async fn policies_overview() -> Result<Vec<PolicyRow>, AppError> {
    use std::collections::BTreeSet;

    use rebound_queue::policy::iso8601;
    use rebound_queue::store::DEFAULT_POLICY_KEY;

    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    let saved = store.policies().await?;
    let mut types: BTreeSet<String> = store.stats(None).await?.rows.into_iter().map(|r| r.job_type).collect();
    types.extend(saved.iter().map(|p| p.job_type.clone()).filter(|t| t != DEFAULT_POLICY_KEY));
    let mut rows = Vec::new();
    for job_type in std::iter::once(DEFAULT_POLICY_KEY.to_string()).chain(types) {
        let stored = saved.iter().find(|p| p.job_type == job_type);
        // The `*` layer is part of the defaults, so resolving any type name without a row of
        // its own gives the default policy; an invalid `*` shows as an error.
        let probe = if job_type == DEFAULT_POLICY_KEY { "rebound.default-probe" } else { job_type.as_str() };
        let resolved = store.effective_policy(probe, None).await;
        let overrides = stored
            .and_then(|p| p.policy.as_object().map(|o| o.keys().cloned().collect()))
            .unwrap_or_default();
        let (policy, error) = match resolved {
            Ok(r) => (r.policy, None),
            Err(e) => (rebound_queue::RetryPolicy::default(), Some(e.to_string())),
        };
        rows.push(PolicyRow {
            saved: stored.is_some(),
            version: stored.map(|p| p.version),
            updated: stored.map(|p| When::of(p.updated_at, now)),
            updated_by: stored.and_then(|p| p.updated_by.clone()),
            overrides,
            max_attempts: policy.effective_max_attempts(),
            strategy: policy.backoff_strategy.to_string(),
            initial_interval: iso8601::format(policy.initial_interval),
            backoff_coefficient: policy.backoff_coefficient,
            max_interval: iso8601::format(policy.max_interval),
            jitter: policy.jitter.to_json().to_string(),
            on_exhaustion: policy.on_exhaustion.to_string(),
            total_wait: crate::time_text::duration_text(u64::try_from(policy.total_delay().as_millis()).unwrap_or(u64::MAX)),
            error,
            job_type,
        });
    }
    Ok(rows)
}

#[component]
pub fn PoliciesPage() -> impl IntoView {
    let data = Resource::new(|| (), |_| policies_overview());
    view! {
        <h1>"Retry policies"</h1>
        <p class="lead">
            "A job's effective policy is the built-in defaults, overlaid by the " <strong>"*"</strong>
            " policy, then its type's policy, then the job's own override. Edits apply at each job's next failure."
        </p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(rows) => view! {
                        <table class="policies">
                            <thead>
                                <tr>
                                    <th>"Type"</th><th class="num">"Attempts"</th><th>"Backoff"</th><th>"Max interval"</th>
                                    <th>"Jitter"</th><th>"On exhaustion"</th><th>"Total wait"</th><th>"Saved"</th><th></th>
                                </tr>
                            </thead>
                            <tbody>
                                {rows
                                    .into_iter()
                                    .map(|r| {
                                        let href = format!("/policies/edit?type={}", urlencode(&r.job_type));
                                        let is_default = r.job_type == "*";
                                        let over = |f: &str| r.overrides.iter().any(|o| o == f || o == &format!("{f}_ms"));
                                        let cell = |f: &str| if over(f) { "overridden" } else { "" };
                                        let backoff = format!("{} from {} ×{}", r.strategy, r.initial_interval, r.backoff_coefficient);
                                        let backoff_class = if over("backoff_strategy") || over("initial_interval") || over("backoff_coefficient") { "overridden" } else { "" };
                                        view! {
                                            <tr>
                                                <td>
                                                    <a href=href.clone()>{if is_default { "* (default for every type)".to_string() } else { r.job_type.clone() }}</a>
                                                    {r.error.clone().map(|e| view! { <div class="alert error">{e}</div> })}
                                                </td>
                                                <td class=format!("num {}", cell("max_attempts"))>{r.max_attempts}</td>
                                                <td class=backoff_class>{backoff}</td>
                                                <td class=cell("max_interval")>{r.max_interval.clone()}</td>
                                                <td class=cell("jitter")><code>{r.jitter.clone()}</code></td>
                                                <td class=cell("on_exhaustion")>{r.on_exhaustion.clone()}</td>
                                                <td>{r.total_wait.clone()}</td>
                                                <td>
                                                    {match (r.version, r.updated.clone()) {
                                                        (Some(v), Some(u)) => view! {
                                                            <span title=u.at.clone()>"v" {v} " · " {u.relative.clone()} " by " {r.updated_by.clone().unwrap_or_default()}</span>
                                                        }
                                                        .into_any(),
                                                        _ => view! { <span class="muted">"defaults"</span> }.into_any(),
                                                    }}
                                                </td>
                                                <td><a class="button-link" href=href>"Edit"</a></td>
                                            </tr>
                                        }
                                    })
                                    .collect_view()}
                            </tbody>
                        </table>
                        <p class="muted">"Highlighted cells are set by the type's own policy. To add a policy for a type without jobs yet, open "
                            <code>"/policies/edit?type=NAME"</code> "."</p>
                    }
                    .into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}
