//! Workers: who is running, where, on which queues, how busy, and whether they still beat.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::AppError;
use crate::feedback::ErrorBox;
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
    /// What the worker last said is failing (claims, result writes), if anything.
    pub degraded: Option<String>,
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
            degraded: (w.status == rebound_queue::store::WorkerStatus::Degraded)
                .then(|| w.status_detail.unwrap_or_else(|| "degraded".to_string())),
        })
        .collect())
}

#[component]
pub fn WorkersPage() -> impl IntoView {
    let tick = use_refresh();
    let data = Resource::new(move || tick.get(), |_| workers());
    view! {
        <h1>"Workers"</h1>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(rows) if rows.is_empty() => view! { <p class="muted">"No worker is registered. Start one with " <code>"rebound-worker"</code> "."</p> }.into_any(),
                    Ok(rows) => view! {
                        <table class="workers">
                            <thead>
                                <tr>
                                    <th>"Worker"</th><th>"Host"</th><th class="num">"PID"</th><th>"Queues"</th>
                                    <th class="num">"Running / slots"</th><th>"Started"</th><th>"Last heartbeat"</th><th>"Status"</th>
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
                                                <td title=w.started.at.clone()>{w.started.relative.clone()}</td>
                                                <td title=w.last_heartbeat.at.clone()>{w.silent_for.clone()} " ago"</td>
                                                <td>{status}</td>
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
