//! Queues: depth by state, paused or not, and pause/resume.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::auth::{CsrfField, ReadOnlyNote, use_can_act};
use crate::error::AppError;
use crate::feedback::{ActionResult, ErrorBox};
use crate::filters::urlencode;
use crate::refresh::use_refresh;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueRow {
    pub name: String,
    pub paused: bool,
    /// "since 14:05 by alice"
    pub paused_note: Option<String>,
    pub scheduled: i64,
    pub available: i64,
    pub pending: i64,
    pub active: i64,
    pub retryable: i64,
    pub completed: i64,
    pub cancelled: i64,
    pub discarded: i64,
    pub dead_letters: i64,
}

#[server(endpoint = "queues")]
pub async fn queues() -> Result<Vec<QueueRow>, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    Ok(store
        .queues()
        .await?
        .into_iter()
        .map(|q| QueueRow {
            paused_note: q.paused.then(|| {
                let since = q.paused_at.map(|t| crate::time_text::When::of(t, now).relative).unwrap_or_default();
                format!("paused {since} by {}", q.paused_by.clone().unwrap_or_else(|| "?".into()))
            }),
            name: q.name,
            paused: q.paused,
            scheduled: q.scheduled,
            available: q.available,
            pending: q.pending,
            active: q.active,
            retryable: q.retryable,
            completed: q.completed,
            cancelled: q.cancelled,
            discarded: q.discarded,
            dead_letters: q.dead_letters,
        })
        .collect())
}

/// Pauses (`paused = "true"`) or resumes a queue.
#[server(endpoint = "set_queue_paused")]
pub async fn set_queue_paused(csrf: String, queue: String, paused: String) -> Result<String, AppError> {
    let actor = crate::auth::authorize_mutation(&csrf)?;
    let store = crate::state::store()?;
    let pause = paused == "true";
    store.set_queue_paused(&queue, pause, &actor).await?;
    Ok(if pause {
        format!("Queue {queue} is paused: jobs are accepted but none are claimed.")
    } else {
        format!("Queue {queue} is running again.")
    })
}

#[component]
pub fn QueuesPage() -> impl IntoView {
    let tick = use_refresh();
    let toggle = ServerAction::<SetQueuePaused>::new();
    let data = Resource::new(move || (tick.get(), toggle.version().get()), |_| queues());
    let can_act = use_can_act();
    view! {
        <h1>"Queues"</h1>
        <ReadOnlyNote/>
        <ActionResult action=toggle/>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(rows) if rows.is_empty() => view! { <p class="muted">"No queues yet: they appear with their first job."</p> }.into_any(),
                    Ok(rows) => view! {
                        <table class="queues">
                            <thead>
                                <tr>
                                    <th>"Queue"</th><th>"Status"</th>
                                    <th class="num">"Scheduled"</th><th class="num">"Available"</th><th class="num">"Pending"</th>
                                    <th class="num">"Active"</th><th class="num">"Retrying"</th><th class="num">"Completed"</th>
                                    <th class="num">"Cancelled"</th><th class="num">"Discarded"</th><th class="num">"Dead letters"</th><th></th>
                                </tr>
                            </thead>
                            <tbody>
                                {rows
                                    .into_iter()
                                    .map(|q| {
                                        let jobs = |state: &str| format!("/jobs?queue={}&state={state}", urlencode(&q.name));
                                        let dead = format!("/dead-letters?queue={}", urlencode(&q.name));
                                        view! {
                                            <tr class:paused=q.paused>
                                                <td><a href=format!("/jobs?queue={}", urlencode(&q.name))>{q.name.clone()}</a></td>
                                                <td>
                                                    {if q.paused {
                                                        view! { <span class="tag paused" title=q.paused_note.clone().unwrap_or_default()>"paused"</span> }.into_any()
                                                    } else {
                                                        view! { <span class="tag running">"running"</span> }.into_any()
                                                    }}
                                                </td>
                                                <td class="num"><a href=jobs("scheduled")>{q.scheduled}</a></td>
                                                <td class="num"><a href=jobs("available")>{q.available}</a></td>
                                                <td class="num">{q.pending}</td>
                                                <td class="num"><a href=jobs("active")>{q.active}</a></td>
                                                <td class="num"><a href=jobs("retryable")>{q.retryable}</a></td>
                                                <td class="num">{q.completed}</td>
                                                <td class="num">{q.cancelled}</td>
                                                <td class="num">{q.discarded}</td>
                                                <td class="num"><a href=dead>{q.dead_letters}</a></td>
                                                <td>
                                                    <ActionForm action=toggle>
                                                        <CsrfField/>
                                                        <input type="hidden" name="queue" value=q.name.clone()/>
                                                        <input type="hidden" name="paused" value=if q.paused { "false" } else { "true" }/>
                                                        <button type="submit" disabled=move || !can_act.get()>{if q.paused { "Resume" } else { "Pause" }}</button>
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
