//! Cron jobs: each schedule with its next run and what its last tick did; operators pause,
//! resume, or trigger one now.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::auth::{CsrfField, ReadOnlyNote, use_can_act};
use crate::error::AppError;
use crate::feedback::{ActionResult, ErrorBox};
use crate::filters::urlencode;
use crate::refresh::use_refresh;
use crate::time_text::When;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CronRow {
    pub name: String,
    pub expression: String,
    pub timezone: String,
    pub job_type: String,
    pub queue: String,
    pub overlap_policy: String,
    pub enabled: bool,
    pub description: Option<String>,
    pub next_run: Option<When>,
    pub last_run: Option<When>,
    pub last_outcome: Option<String>,
    pub last_job_id: Option<String>,
    pub run_count: i64,
}

#[server(endpoint = "cron_jobs")]
pub async fn cron_jobs() -> Result<Vec<CronRow>, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    Ok(store
        .cron_jobs(None)
        .await?
        .into_iter()
        .map(|c| CronRow {
            next_run: c.next_run_at.map(|t| When::of(t, now)),
            last_run: c.last_run_at.map(|t| When::of(t, now)),
            job_type: c.template.job_type.clone(),
            queue: c.template.queue.clone(),
            overlap_policy: c.overlap_policy.as_str().to_owned(),
            last_job_id: c.last_job_id.map(|id| id.to_string()),
            name: c.name,
            expression: c.expression,
            timezone: c.timezone,
            enabled: c.enabled,
            description: c.description,
            last_outcome: c.last_outcome,
            run_count: c.run_count,
        })
        .collect())
}

/// `action`: `pause`, `resume` or `trigger`.
#[server(endpoint = "act_on_cron")]
pub async fn act_on_cron(csrf: String, name: String, action: String) -> Result<String, AppError> {
    let actor = crate::auth::authorize_mutation(&csrf)?;
    let store = crate::state::store()?;
    match action.as_str() {
        "pause" => {
            store.set_cron_enabled(&name, false, &actor).await?;
            Ok(format!("Cron job {name} is paused: it will not fire until resumed."))
        }
        "resume" => {
            let cron = store.set_cron_enabled(&name, true, &actor).await?;
            let next = cron.next_run_at.map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()).unwrap_or_else(|| "never".into());
            Ok(format!("Cron job {name} is running again; next run {next}."))
        }
        "trigger" => {
            let (_, job) = store.trigger_cron(&name, &actor).await?;
            Ok(format!("Cron job {name} enqueued job {} now.", job.id))
        }
        other => Err(AppError::Invalid { field: "action".into(), reason: format!("unknown action {}; use pause, resume or trigger", crate::error::quoted(other)) }),
    }
}

fn when_view(w: Option<When>, none: &'static str) -> impl IntoView {
    match w {
        Some(w) => view! { <span title=w.at.clone()>{w.relative.clone()}</span><br/><small class="muted">{w.at}</small> }.into_any(),
        None => view! { <span class="muted">{none}</span> }.into_any(),
    }
}

#[component]
pub fn CronPage() -> impl IntoView {
    let tick = use_refresh();
    let act = ServerAction::<ActOnCron>::new();
    let data = Resource::new(move || (tick.get(), act.version().get()), |_| cron_jobs());
    let can_act = use_can_act();
    view! {
        <h1>"Cron jobs"</h1>
        <ReadOnlyNote/>
        <ActionResult action=act/>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(rows) if rows.is_empty() => view! {
                        <p class="muted">"No cron jobs. Register one with POST /ojs/v1/cron."</p>
                    }.into_any(),
                    Ok(rows) => view! {
                        <table class="cron">
                            <thead>
                                <tr>
                                    <th>"Name"</th><th>"Schedule"</th><th>"Job"</th><th>"Overlap"</th><th>"Status"</th>
                                    <th>"Next run"</th><th>"Last run"</th><th class="num">"Runs"</th><th></th>
                                </tr>
                            </thead>
                            <tbody>
                                {rows
                                    .into_iter()
                                    .map(|c| {
                                        let (name_toggle, name_trigger) = (c.name.clone(), c.name.clone());
                                        let outcome = c.last_outcome.clone().unwrap_or_default();
                                        view! {
                                            <tr class:paused=!c.enabled data-cron=c.name.clone()>
                                                <td>
                                                    <strong>{c.name.clone()}</strong>
                                                    {c.description.clone().map(|d| view! { <br/><small class="muted">{d}</small> })}
                                                </td>
                                                <td><code>{c.expression.clone()}</code><br/><small class="muted">{c.timezone.clone()}</small></td>
                                                <td>
                                                    <a href=format!("/jobs?job_type={}", urlencode(&c.job_type))>{c.job_type.clone()}</a>
                                                    <br/><small class="muted">"on "{c.queue.clone()}</small>
                                                </td>
                                                <td>{c.overlap_policy.clone()}</td>
                                                <td>
                                                    {if c.enabled {
                                                        view! { <span class="tag running">"active"</span> }.into_any()
                                                    } else {
                                                        view! { <span class="tag paused">"paused"</span> }.into_any()
                                                    }}
                                                </td>
                                                <td class="next-run">{when_view(c.next_run.clone(), "—")}</td>
                                                <td class="last-run">
                                                    {when_view(c.last_run.clone(), "never")}
                                                    {(!outcome.is_empty()).then(|| view! { <br/><span class=format!("tag outcome-{outcome}")>{outcome.clone()}</span> })}
                                                    {c.last_job_id.clone().map(|id| view! { " " <a href=format!("/jobs/{id}")>"job"</a> })}
                                                </td>
                                                <td class="num">{c.run_count}</td>
                                                <td class="actions">
                                                    <ActionForm action=act>
                                                        <CsrfField/>
                                                        <input type="hidden" name="name" value=name_toggle/>
                                                        <input type="hidden" name="action" value=if c.enabled { "pause" } else { "resume" }/>
                                                        <button type="submit" disabled=move || !can_act.get()>{if c.enabled { "Pause" } else { "Resume" }}</button>
                                                    </ActionForm>
                                                    <ActionForm action=act>
                                                        <CsrfField/>
                                                        <input type="hidden" name="name" value=name_trigger/>
                                                        <input type="hidden" name="action" value="trigger"/>
                                                        <button type="submit" disabled=move || !can_act.get()>"Trigger now"</button>
                                                    </ActionForm>
                                                </td>
                                            </tr>
                                        }
                                    })
                                    .collect_view()}
                            </tbody>
                        </table>
                    }
                    .into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}
