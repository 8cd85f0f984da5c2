//! Workflows (OJS chains, groups and batches): the newest first, by state, and one workflow:
//! where each of its jobs stands, what each returned, why it failed if it did, and a cancel
//! for what has not run yet.

use leptos::prelude::*;
use leptos_router::hooks::{use_params_map, use_query_map};
use serde::{Deserialize, Serialize};

use crate::auth::{CsrfField, ReadOnlyNote, use_can_act};
use crate::error::AppError;
use crate::feedback::{ActionResult, ErrorBox};
use crate::refresh::use_refresh;
use crate::time_text::When;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepView {
    /// `step 2`, `job 2` or the callback's name.
    pub label: String,
    pub job_id: String,
    pub job_type: String,
    /// The job's state, and the OJS step state it reads as (`waiting` for a job held back).
    pub state: String,
    pub waiting: bool,
    pub attempt: i32,
    pub result: Option<String>,
    pub started: Option<When>,
    pub finished: Option<When>,
    /// The id of the workflow this member is, when it is one (its row links to it).
    pub nested: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailureView {
    pub job_id: String,
    pub role: String,
    pub code: String,
    pub message: String,
    pub attempt: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkflowView {
    pub id: String,
    pub kind: String,
    pub name: Option<String>,
    pub state: String,
    pub job_count: i32,
    pub completed_count: i32,
    pub failed_count: i32,
    /// A graph's steps cancelled unrun because one upstream of them failed.
    pub skipped_count: i32,
    pub created: When,
    pub started: Option<When>,
    pub finished: Option<When>,
    pub steps: Vec<StepView>,
    pub failures: Vec<FailureView>,
    /// The workflow it is nested in.
    pub parent_id: Option<String>,
    pub can_cancel: bool,
}

/// One row of the list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkflowRow {
    pub id: String,
    pub kind: String,
    pub name: Option<String>,
    pub state: String,
    pub progress: String,
    pub created: When,
    pub finished: Option<When>,
}

/// The states the list filters by.
pub const WORKFLOW_STATES: [&str; 4] = ["running", "completed", "failed", "cancelled"];

#[server(endpoint = "list_workflows")]
pub async fn list_workflows(#[server(default)] state: String, #[server(default)] before: String) -> Result<(Vec<WorkflowRow>, Option<String>), AppError> {
    const PAGE: i64 = 50;
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let state = if state.is_empty() {
        None
    } else if WORKFLOW_STATES.contains(&state.as_str()) {
        Some(state)
    } else {
        return Err(AppError::Invalid { field: "state".into(), reason: format!("must be one of {}", WORKFLOW_STATES.join(", ")) });
    };
    let before = if before.is_empty() { None } else { Some(super::jobs::parse_uuid("before", "a page cursor (a workflow id)", &before)?) };
    let now = store.now().await?;
    let mut found = store.list_workflows(state.as_deref(), before, PAGE + 1).await?;
    let more = found.len() as i64 > PAGE;
    found.truncate(PAGE as usize);
    let next = more.then(|| found.last().map(|w| w.id.to_string())).flatten();
    let rows = found
        .into_iter()
        .map(|w| WorkflowRow {
            progress: format!(
                "{} / {} {}{}",
                w.completed_count,
                w.job_count,
                if w.kind == rebound_queue::store::WorkflowType::Chain { "steps" } else { "jobs" },
                if w.failed_count > 0 { format!(", {} failed", w.failed_count) } else { String::new() }
            ) + &if w.skipped_count > 0 { format!(", {} skipped", w.skipped_count) } else { String::new() },
            id: w.id.to_string(),
            kind: w.kind.as_str().to_string(),
            name: w.name,
            state: w.state,
            created: When::of(w.created_at, now),
            finished: w.finished_at.map(|t| When::of(t, now)),
        })
        .collect();
    Ok((rows, next))
}

#[component]
pub fn WorkflowsPage() -> impl IntoView {
    let query = use_query_map();
    let state = move || query.read().get("state").unwrap_or_default();
    let before = move || query.read().get("before").unwrap_or_default();
    let tick = use_refresh();
    let data = Resource::new(move || (state(), before(), tick.get()), |(state, before, _)| list_workflows(state, before));
    view! {
        <h1>"Workflows"</h1>
        <form method="get" action="/workflows" class="filters">
            <label>"State "
                <select name="state">
                    <option value="" selected=move || state().is_empty()>"any"</option>
                    {WORKFLOW_STATES.iter().map(|s| view! { <option value=*s selected=move || state() == *s>{*s}</option> }).collect_view()}
                </select>
            </label>
            <button type="submit">"Show"</button>
        </form>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok((rows, _)) if rows.is_empty() => view! { <p class="muted">"No workflow. Create one with " <code>"POST /ojs/v1/workflows"</code> " (a chain, a group or a batch)."</p> }.into_any(),
                    Ok((rows, next)) => view! {
                        <table class="workflows">
                            <thead><tr><th>"Workflow"</th><th>"Kind"</th><th>"State"</th><th>"Progress"</th><th>"Created"</th><th>"Finished"</th></tr></thead>
                            <tbody>
                                {rows.into_iter().map(|w| view! {
                                    <tr>
                                        <td><a href=format!("/workflows/{}", w.id)>{w.name.clone().unwrap_or_else(|| w.id.clone())}</a></td>
                                        <td>{w.kind}</td>
                                        <td><span class=format!("tag {}", w.state)>{w.state.clone()}</span></td>
                                        <td>{w.progress}</td>
                                        <td title=w.created.at.clone()>{w.created.relative.clone()}</td>
                                        <td>{w.finished.map(|t| view! { <span title=t.at>{t.relative}</span> })}</td>
                                    </tr>
                                }).collect_view()}
                            </tbody>
                        </table>
                        {next.map(|n| view! { <p><a href=format!("/workflows?state={}&before={n}", state())>"Older →"</a></p> })}
                    }
                    .into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[server(endpoint = "load_workflow")]
pub async fn load_workflow(id: String) -> Result<WorkflowView, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let id = super::jobs::parse_uuid("id", "a workflow id", &id)?;
    let wf = store.workflow(id).await?.ok_or_else(|| AppError::NotFound(format!("workflow {id}")))?;
    let now = store.now().await?;
    let chain = wf.kind == rebound_queue::store::WorkflowType::Chain;
    let steps = wf
        .members
        .iter()
        .map(|m| {
            let label = match (&m.graph, m.callback()) {
                (Some(g), _) if g.depends_on.is_empty() => g.id.clone(),
                (Some(g), _) => format!("{} (after {})", g.id, g.depends_on.join(", ")),
                (None, Some(cb)) => cb.to_string(),
                (None, None) => format!("{} {}", if chain { "step" } else { "job" }, m.step),
            };
            let mut step = StepView {
                label,
                job_id: m.job_id.to_string(),
                job_type: m.job_type.clone(),
                state: m.state.to_string(),
                waiting: m.state == rebound_queue::JobState::Pending,
                attempt: m.attempt,
                result: m.result.as_ref().map(|r| {
                    let text = r.to_string();
                    if text.len() > 200 { format!("{}…", text.chars().take(200).collect::<String>()) } else { text }
                }),
                started: m.started_at.map(|t| When::of(t, now)),
                finished: m.completed_at.map(|t| When::of(t, now)),
                nested: None,
            };
            // A nested workflow: its own state and times, not those of the job standing for it.
            if let Some(n) = &m.nested {
                step.job_type = format!("{} workflow{}", n.kind.as_str(), n.name.as_ref().map(|s| format!(" {s}")).unwrap_or_default());
                step.state = n.state.clone();
                step.waiting = n.state == "pending";
                step.result = None;
                step.started = n.started_at.map(|t| When::of(t, now));
                step.finished = n.finished_at.map(|t| When::of(t, now));
                step.nested = Some(n.id.to_string());
            }
            step
        })
        .collect();
    let text = |e: &serde_json::Value, k: &str| e.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let failures = wf
        .errors
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| FailureView {
                    job_id: text(e, "job_id"),
                    role: text(e, "role"),
                    code: text(e, "code"),
                    message: text(e, "message"),
                    attempt: e.get("attempt").and_then(|v| v.as_i64()).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(WorkflowView {
        id: wf.id.to_string(),
        kind: wf.kind.as_str().to_string(),
        name: wf.name.clone(),
        can_cancel: !wf.is_finished(),
        state: wf.state.clone(),
        job_count: wf.job_count,
        completed_count: wf.completed_count,
        failed_count: wf.failed_count,
        skipped_count: wf.skipped_count,
        created: When::of(wf.created_at, now),
        started: wf.started_at.map(|t| When::of(t, now)),
        finished: wf.finished_at.map(|t| When::of(t, now)),
        steps,
        failures,
        parent_id: wf.parent_id.map(|p| p.to_string()),
    })
}

/// Cancels the workflow: its jobs that have not started are cancelled; running ones finish.
/// Audited.
#[server(endpoint = "cancel_workflow")]
pub async fn cancel_workflow(csrf: String, id: String) -> Result<String, AppError> {
    use rebound_queue::store::WorkflowCancel;
    let actor = crate::auth::authorize_mutation(&csrf)?;
    let store = crate::state::store()?;
    let id = super::jobs::parse_uuid("id", "a workflow id", &id)?;
    match store.cancel_workflow(id, Some(&actor)).await? {
        WorkflowCancel::Cancelled(_) => Ok(format!("Workflow {id} is cancelled: its jobs that had not started will not run; running ones finish.")),
        WorkflowCancel::AlreadyFinished(wf) => Err(AppError::Conflict(format!("workflow {id} is already {}", wf.state))),
    }
}

#[component]
pub fn WorkflowPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let tick = use_refresh();
    let cancel = ServerAction::<CancelWorkflow>::new();
    let data = Resource::new(move || (id(), tick.get(), cancel.version().get()), |(id, _, _)| load_workflow(id));
    let can_act = use_can_act();
    view! {
        <ReadOnlyNote/>
        <ActionResult action=cancel/>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(w) => {
                        let title = w.name.clone().unwrap_or_else(|| format!("{} {}", w.kind, w.id));
                        let done = match w.kind.as_str() {
                            "chain" => format!("{} of {} steps completed", w.completed_count, w.job_count),
                            _ => format!("{} of {} jobs completed", w.completed_count, w.job_count),
                        };
                        let failed = (w.failed_count > 0).then(|| format!(", {} failed", w.failed_count));
                        let skipped = (w.skipped_count > 0).then(|| format!(", {} skipped (a step upstream failed)", w.skipped_count));
                        view! {
                            <h1>"Workflow " {title}</h1>
                            <p>
                                <span class=format!("tag wf-state {}", w.state)>{w.state.clone()}</span> " " {w.kind.clone()} " · " {done} {failed} {skipped}
                                " · created " <span title=w.created.at.clone()>{w.created.relative.clone()}</span>
                                {w.started.clone().map(|s| view! { " · started " <span title=s.at>{s.relative}</span> })}
                                {w.finished.clone().map(|s| view! { " · finished " <span title=s.at>{s.relative}</span> })}
                            </p>
                            <p class="mono muted">{w.id.clone()}</p>
                            {w.parent_id.clone().map(|p| view! { <p>"Nested in workflow " <a class="mono" href=format!("/workflows/{p}")>{p.clone()}</a></p> })}
                            {w.can_cancel.then(|| view! {
                                <ActionForm action=cancel>
                                    <CsrfField/>
                                    <input type="hidden" name="id" value=w.id.clone()/>
                                    <button type="submit" class="danger" title="Cancel the jobs that have not started; running ones finish" disabled=move || !can_act.get()>"Cancel workflow"</button>
                                </ActionForm>
                            })}
                            {(!w.failures.is_empty()).then(|| view! {
                                <h2>"Failures"</h2>
                                <table>
                                    <thead><tr><th>"Job"</th><th>"Role"</th><th>"Error"</th><th class="num">"Attempt"</th></tr></thead>
                                    <tbody>
                                        {w.failures.iter().map(|f| view! {
                                            <tr>
                                                <td class="mono"><a href=format!("/jobs/{}", f.job_id)>{f.job_id.clone()}</a></td>
                                                <td>{f.role.clone()}</td>
                                                <td><code>{f.code.clone()}</code> " " {f.message.clone()}</td>
                                                <td class="num">{f.attempt}</td>
                                            </tr>
                                        }).collect_view()}
                                    </tbody>
                                </table>
                            })}
                            <h2>"Jobs"</h2>
                            <table class="workflow-steps">
                                <thead><tr><th></th><th>"Job"</th><th>"Type"</th><th>"State"</th><th class="num">"Attempt"</th><th>"Started"</th><th>"Finished"</th><th>"Result"</th></tr></thead>
                                <tbody>
                                    {w.steps.iter().map(|s| {
                                        let state = if s.waiting { "waiting".to_string() } else { s.state.clone() };
                                        view! {
                                            <tr>
                                                <td>{s.label.clone()}</td>
                                                <td class="mono">{match s.nested.clone() {
                                                    Some(n) => view! { <a href=format!("/workflows/{n}")>{n.clone()}</a> }.into_any(),
                                                    None => view! { <a href=format!("/jobs/{}", s.job_id)>{s.job_id.clone()}</a> }.into_any(),
                                                }}</td>
                                                <td>{s.job_type.clone()}</td>
                                                <td><span class=format!("tag {}", s.state)>{state}</span></td>
                                                <td class="num">{s.attempt}</td>
                                                <td>{s.started.clone().map(|t| view! { <span title=t.at>{t.relative}</span> })}</td>
                                                <td>{s.finished.clone().map(|t| view! { <span title=t.at>{t.relative}</span> })}</td>
                                                <td><code>{s.result.clone()}</code></td>
                                            </tr>
                                        }
                                    }).collect_view()}
                                </tbody>
                            </table>
                        }
                        .into_any()
                    }
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}
