//! Workers: who is running, where, on which queues, how busy, and whether they still beat.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::auth::{CsrfField, ReadOnlyNote, use_can_act};
use crate::error::AppError;
use crate::feedback::{ActionResult, ErrorBox};
use crate::refresh::use_refresh;
use crate::time_text::When;

/// A worker silent for longer than this is marked stale: its heartbeats (every few seconds)
/// stopped, so it probably died without deregistering.
pub const STALE_AFTER_SECS: f64 = 60.0;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerRow {
    pub id: String,
    pub host: String,
    pub pid: i32,
    pub queues: Vec<String>,
    pub concurrency: i32,
    pub running: i32,
    pub version: String,
    pub started: When,
    pub last_heartbeat: When,
    pub silent_for: String,
    pub stale: bool,
    pub stopping: bool,
    /// The worker said it claims nothing more (SIGTSTP, or it heard an operator's `quiet`).
    pub quiet: bool,
    /// What the worker last said is failing (claims, result writes), if anything.
    pub degraded: Option<String>,
    /// What an operator asked of it: `quiet` or `terminate`.
    pub requested: Option<String>,
    /// Resident memory and CPU share as its latest heartbeat said ("—" where it did not).
    pub memory: String,
    pub cpu: String,
}

#[server(endpoint = "workers")]
pub async fn workers() -> Result<Vec<WorkerRow>, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    Ok(store
        .workers()
        .await?
        .into_iter()
        .map(|w| WorkerRow {
            memory: w.usage.memory_mb.map_or_else(|| "—".to_string(), |m| format!("{m:.1} MiB")),
            cpu: w.usage.cpu_percent.map_or_else(|| "—".to_string(), |c| format!("{c:.1} %")),
            stale: w.silent_for_secs > STALE_AFTER_SECS,
            silent_for: crate::time_text::duration_text((w.silent_for_secs.max(0.0) * 1_000.0) as u64 / 1_000 * 1_000),
            id: w.id,
            host: w.host,
            pid: w.pid,
            queues: w.queues,
            concurrency: w.concurrency,
            running: w.running,
            version: w.version,
            started: When::of(w.started_at, now),
            last_heartbeat: When::of(w.last_heartbeat_at, now),
            stopping: w.stopping,
            quiet: w.status == rebound_queue::store::WorkerStatus::Quiet,
            degraded: (w.status == rebound_queue::store::WorkerStatus::Degraded)
                .then(|| w.status_detail.unwrap_or_else(|| "degraded".to_string())),
            requested: w.requested_state,
        })
        .collect())
}

/// Asks a worker to go quiet (claim nothing more; running jobs finish) or to terminate (shut
/// down gracefully, as on SIGTERM). It hears it at its next heartbeat. Audited.
#[server(endpoint = "request_worker_state")]
pub async fn request_worker_state(csrf: String, worker: String, state: String) -> Result<String, AppError> {
    let actor = crate::auth::authorize_mutation(&csrf)?;
    if worker.is_empty() || worker.len() > 200 || worker.chars().any(char::is_control) {
        return Err(AppError::Invalid { field: "worker".into(), reason: "must be a worker id from this page".into() });
    }
    let store = crate::state::store()?;
    // The store refuses any state but quiet and terminate.
    if !store.request_worker_state(&worker, &state, &actor).await? {
        return Err(AppError::NotFound(format!("worker {worker}")));
    }
    Ok(if state == "quiet" {
        format!("Worker {worker} will claim nothing more from its next heartbeat; its running jobs finish. Stop it when they have.")
    } else {
        format!("Worker {worker} will shut down at its next heartbeat, letting its running jobs finish first.")
    })
}

#[component]
pub fn WorkersPage() -> impl IntoView {
    let tick = use_refresh();
    let ask = ServerAction::<RequestWorkerState>::new();
    let data = Resource::new(move || (tick.get(), ask.version().get()), |_| workers());
    let can_act = use_can_act();
    view! {
        <h1>"Workers"</h1>
        <ReadOnlyNote/>
        <ActionResult action=ask/>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(rows) if rows.is_empty() => view! { <p class="muted">"No worker is registered. Start one with " <code>"rebound-worker"</code> "."</p> }.into_any(),
                    Ok(rows) => view! {
                        <table class="workers">
                            <thead>
                                <tr>
                                    <th>"Worker"</th><th>"Host"</th><th class="num">"PID"</th><th>"Queues"</th>
                                    <th class="num">"Running / slots"</th><th class="num" title="Resident memory and CPU (percent of one core since the previous heartbeat), as the worker last reported">"Memory"</th><th class="num">"CPU"</th><th>"Started"</th><th>"Last heartbeat"</th><th>"Status"</th><th></th>
                                </tr>
                            </thead>
                            <tbody>
                                {rows
                                    .into_iter()
                                    .map(|w| {
                                        let status = if w.stale {
                                            view! { <span class="tag stale" title="no heartbeat for over a minute">"stale"</span> }.into_any()
                                        } else if w.stopping {
                                            view! { <span class="tag stopping">"stopping"</span> }.into_any()
                                        } else if w.quiet {
                                            view! { <span class="tag stopping" title="it claims nothing more; its running jobs finish">"quiet"</span> }.into_any()
                                        } else if let Some(asked) = w.requested.clone() {
                                            let (tag, title) = if asked == "quiet" {
                                                ("quiet", "an operator asked it to claim nothing more")
                                            } else {
                                                ("terminating", "an operator asked it to shut down")
                                            };
                                            view! { <span class="tag stopping" title=title>{tag}</span> }.into_any()
                                        } else if let Some(why) = w.degraded.clone() {
                                            view! { <span class="tag degraded" title=why.clone()>"degraded"</span> " " <small class="muted">{why}</small> }.into_any()
                                        } else {
                                            view! { <span class="tag running">"live"</span> }.into_any()
                                        };
                                        view! {
                                            <tr class:stale=w.stale>
                                                <td class="mono">{w.id.clone()} <small class="muted">" v" {w.version.clone()}</small></td>
                                                <td>{w.host.clone()}</td>
                                                <td class="num">{w.pid}</td>
                                                <td>{w.queues.join(", ")}</td>
                                                <td class="num">{w.running} " / " {w.concurrency}</td>
                                                <td class="num">{w.memory.clone()}</td>
                                                <td class="num">{w.cpu.clone()}</td>
                                                <td title=w.started.at.clone()>{w.started.relative.clone()}</td>
                                                <td title=w.last_heartbeat.at.clone()>{w.silent_for.clone()} " ago"</td>
                                                <td>{status}</td>
                                                <td class="actions">
                                                    {(!w.stale && !w.stopping).then(|| {
                                                        let asked = w.requested.clone().unwrap_or_default();
                                                        let ask_for = move |worker: String, state: &'static str, label: &'static str, title: &'static str| {
                                                            view! {
                                                                <ActionForm action=ask>
                                                                    <CsrfField/>
                                                                    <input type="hidden" name="worker" value=worker/>
                                                                    <input type="hidden" name="state" value=state/>
                                                                    <button type="submit" title=title disabled=move || !can_act.get()>{label}</button>
                                                                </ActionForm>
                                                            }
                                                        };
                                                        let quiet = asked.is_empty().then(|| ask_for(w.id.clone(), "quiet", "Quiet", "Claim nothing more; running jobs finish"));
                                                        let stop = (asked != "terminate").then(|| ask_for(w.id.clone(), "terminate", "Stop", "Shut down gracefully, as on SIGTERM"));
                                                        view! { {quiet} {stop} }
                                                    })}
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
