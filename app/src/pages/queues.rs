//! Queues: depth by state, paused or not, and pause/resume; below them the rate-limit keys
//! jobs share (see [`super::rate_limit_keys`]).

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
    /// The queue's rate limit as set (see [`RateLimitForm`]).
    pub limit: RateLimitForm,
    /// An operator's override of its concurrency, while it lasts: "0 at once until 15:20:00
    /// UTC, in 28m".
    pub override_note: Option<String>,
}

/// A queue's rate limit as the form shows and sends it: empty fields are "no limit".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RateLimitForm {
    pub concurrency: String,
    pub rate_limit: String,
    pub rate_period: String,
    pub throttle_limit: String,
    pub throttle_period: String,
}

impl RateLimitForm {
    /// "5 active · 100 per PT1M · 2 per PT1S (spaced)", or `None` without limits.
    pub fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.concurrency.is_empty() {
            parts.push(format!("{} active", self.concurrency));
        }
        if !self.rate_limit.is_empty() {
            parts.push(format!("{} per {}", self.rate_limit, self.rate_period));
        }
        if !self.throttle_limit.is_empty() {
            parts.push(format!("{} per {} (spaced)", self.throttle_limit, self.throttle_period));
        }
        (!parts.is_empty()).then(|| parts.join(" · "))
    }

    /// The Queues page with these values in `queue`'s form (see [`RateLimitForm::typed`]).
    #[cfg(feature = "ssr")]
    fn back_url(&self, queue: &str) -> String {
        let fields = crate::filters::query_pairs([
            ("typed_limit", queue),
            ("concurrency", &self.concurrency),
            ("rate_limit", &self.rate_limit),
            ("rate_period", &self.rate_period),
            ("throttle_limit", &self.throttle_limit),
            ("throttle_period", &self.throttle_period),
        ]);
        format!("/queues?{fields}")
    }

    /// What was typed into `queue`'s form, carried in the page's URL when a save without
    /// JavaScript was refused (`?typed_limit=<queue>&concurrency=…`).
    fn typed(queue: &str) -> Option<RateLimitForm> {
        let q = leptos_router::hooks::use_query_map();
        q.with_untracked(|q| {
            let text = |k: &str| q.get(k).unwrap_or_default();
            (q.get("typed_limit").as_deref() == Some(queue)).then(|| RateLimitForm {
                concurrency: text("concurrency"),
                rate_limit: text("rate_limit"),
                rate_period: text("rate_period"),
                throttle_limit: text("throttle_limit"),
                throttle_period: text("throttle_period"),
            })
        })
    }
}

#[server(endpoint = "queues")]
pub async fn queues() -> Result<Vec<QueueRow>, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    let limits = store.rate_limit_states(None).await?;
    let override_of = |name: &str| {
        let o = limits.iter().find(|l| l.queue == name).and_then(|l| l.override_limit)?;
        let until = o.expires_at.map(|t| {
            let w = crate::time_text::When::of(t, now);
            format!(" until {}, {}", w.at, w.relative)
        });
        Some(format!("{} at once{}", o.concurrency, until.unwrap_or_else(|| ", until cleared".into())))
    };
    let form_of = |name: &str| {
        let Some(l) = limits.iter().find(|l| l.queue == name).map(|l| l.limit) else { return RateLimitForm::default() };
        let period = |d: std::time::Duration| rebound_queue::policy::iso8601::format(d);
        RateLimitForm {
            concurrency: l.concurrency.map(|c| c.to_string()).unwrap_or_default(),
            rate_limit: l.rate.map(|w| w.limit.to_string()).unwrap_or_default(),
            rate_period: l.rate.map(|w| period(w.period)).unwrap_or_default(),
            throttle_limit: l.throttle.map(|w| w.limit.to_string()).unwrap_or_default(),
            throttle_period: l.throttle.map(|w| period(w.period)).unwrap_or_default(),
        }
    };
    Ok(store
        .queues()
        .await?
        .into_iter()
        .map(|q| QueueRow {
            limit: form_of(&q.name),
            override_note: override_of(&q.name),
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
    crate::error::check_queue(&queue)?;
    let pause = match paused.as_str() {
        "true" => true,
        "false" => false,
        other => return Err(AppError::Invalid { field: "paused".into(), reason: format!("{} is not \"true\" or \"false\"", crate::error::quoted(other)) }),
    };
    let store = crate::state::store()?;
    store.set_queue_paused(&queue, pause, &actor).await?;
    Ok(if pause {
        format!("Queue {queue} is paused: jobs are accepted but none are claimed.")
    } else {
        format!("Queue {queue} is running again.")
    })
}

/// Sets (or, with every field empty, removes) a queue's rate limit. It applies to the next
/// claim of every worker and API fetch.
#[server(endpoint = "set_queue_rate_limit")]
pub async fn set_queue_rate_limit(csrf: String, queue: String, limit: RateLimitForm) -> Result<String, AppError> {
    use rebound_queue::store::{QueueRateLimit, Window};
    let actor = crate::auth::authorize_mutation(&csrf)?;
    // Without JavaScript, refused values come back to the Queues page, in this queue's form.
    let back = |e: AppError| crate::feedback::back_with_typed_values::<SetQueueRateLimit>(&limit.back_url(&queue), e);
    crate::error::check_queue(&queue).map_err(back)?;
    let invalid = |field: &str, reason: String| back(AppError::Invalid { field: field.into(), reason });
    let number = |field: &str, raw: &str| -> Result<Option<u32>, AppError> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Ok(None);
        }
        raw.parse::<u32>().map(Some).map_err(|_| invalid(field, format!("must be a whole number, got {}", crate::error::quoted(raw))))
    };
    let window = |limit_field: &str, period_field: &str, limit: &str, period: &str| -> Result<Option<Window>, AppError> {
        let Some(limit) = number(limit_field, limit)? else { return Ok(None) };
        let period = period.trim();
        if period.is_empty() {
            return Err(invalid(period_field, "is required with a limit (an ISO-8601 duration such as PT1M)".into()));
        }
        let period = rebound_queue::policy::iso8601::parse(period).map_err(|r| invalid(period_field, crate::error::requoted(r, period)))?;
        Ok(Some(Window { limit, period }))
    };
    let parsed = QueueRateLimit {
        concurrency: number("concurrency", &limit.concurrency)?,
        rate: window("rate_limit", "rate_period", &limit.rate_limit, &limit.rate_period)?,
        throttle: window("throttle_limit", "throttle_period", &limit.throttle_limit, &limit.throttle_period)?,
    };
    let store = crate::state::store()?;
    let saved = store.set_queue_rate_limit(&queue, Some(&parsed), &actor).await.map_err(|e| back(e.into()))?;
    Ok(match saved {
        Some(l) => format!("Queue {queue} is now limited to {}; it applies to the next claim.", l.to_json()),
        None => format!("Queue {queue} has no rate limit now."),
    })
}

/// Maintenance mode as the Queues page shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaintenanceNote {
    pub reason: Option<String>,
    pub since: crate::time_text::When,
    pub by: String,
    pub estimated_end: Option<crate::time_text::When>,
}

#[server(endpoint = "maintenance_state")]
pub async fn maintenance_state() -> Result<Option<MaintenanceNote>, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    Ok(store.maintenance().await?.map(|m| MaintenanceNote {
        reason: m.reason,
        since: crate::time_text::When::of(m.enabled_at, now),
        by: m.enabled_by,
        estimated_end: m.estimated_end.map(|t| crate::time_text::When::of(t, now)),
    }))
}

/// Turns maintenance mode on (`enabled = "true"`, with an optional reason) or off. While it is
/// on no queue hands out jobs, due jobs wait and cron ticks wait; enqueues are kept.
#[server(endpoint = "set_maintenance")]
pub async fn set_maintenance(csrf: String, enabled: String, reason: Option<String>) -> Result<String, AppError> {
    let actor = crate::auth::authorize_mutation(&csrf)?;
    let store = crate::state::store()?;
    match enabled.as_str() {
        "true" => {
            let reason = reason.map(|r| r.trim().to_string()).filter(|r| !r.is_empty());
            store.enable_maintenance(reason.as_deref(), None, &actor).await?;
            Ok("Maintenance mode is on: no queue hands out jobs, and due jobs and cron ticks wait. New jobs are still accepted.".into())
        }
        "false" => {
            store.disable_maintenance(&actor).await?;
            Ok("Maintenance mode is off: the queues run again.".into())
        }
        other => Err(AppError::Invalid { field: "enabled".into(), reason: format!("{} is not \"true\" or \"false\"", crate::error::quoted(other)) }),
    }
}

/// The maintenance switch: on with a reason, or off.
#[component]
fn MaintenanceSwitch(action: ServerAction<SetMaintenance>, can_act: Signal<bool>) -> impl IntoView {
    let tick = use_refresh();
    let state = Resource::new(move || (tick.get(), action.version().get()), |_| maintenance_state());
    view! {
        <ActionResult action=action/>
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                match state.await {
                    Ok(Some(m)) => view! {
                        <div class="banner maintenance" role="status">
                            <strong>"Maintenance mode is on"</strong>
                            " since " <span title=m.since.at.clone()>{m.since.relative.clone()}</span> " by " {m.by.clone()}
                            {m.reason.clone().map(|r| view! { ": " <em>{r}</em> })}
                            {m.estimated_end.clone().map(|e| view! { " (expected to end " <span title=e.at.clone()>{e.relative.clone()}</span> ")" })}
                            ". No queue hands out jobs; due jobs and cron ticks wait; new jobs are accepted."
                            <ActionForm action=action>
                                <CsrfField/>
                                <input type="hidden" name="enabled" value="false"/>
                                <button type="submit" disabled=move || !can_act.get()>"Turn maintenance off"</button>
                            </ActionForm>
                        </div>
                    }
                    .into_any(),
                    Ok(None) => view! {
                        <details class="maintenance">
                            <summary>"Maintenance mode"</summary>
                            <p class="muted">"Holds every queue at once (for a database migration, say): running jobs finish, nothing new starts, due jobs and cron ticks wait, new jobs are accepted."</p>
                            <ActionForm action=action>
                                <CsrfField/>
                                <input type="hidden" name="enabled" value="true"/>
                                <label>"Reason " <input type="text" name="reason" maxlength="1000" placeholder="Database migration"/></label>
                                " "
                                <button type="submit" disabled=move || !can_act.get()>"Turn maintenance on"</button>
                            </ActionForm>
                        </details>
                    }
                    .into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
pub fn QueuesPage() -> impl IntoView {
    let tick = use_refresh();
    let toggle = ServerAction::<SetQueuePaused>::new();
    let set_limit = ServerAction::<SetQueueRateLimit>::new();
    // Overrides of queues (in their rows) and of keys (in the keys' table) alike.
    let set_override = ServerAction::<super::rate_limit_keys::SetRateLimitOverride>::new();
    let data = Resource::new(move || (tick.get(), toggle.version().get(), set_limit.version().get(), set_override.version().get()), |_| queues());
    let can_act = use_can_act();
    let maintenance = ServerAction::<SetMaintenance>::new();
    view! {
        <h1>"Queues"</h1>
        <ReadOnlyNote/>
        <MaintenanceSwitch action=maintenance can_act=can_act/>
        <ActionResult action=toggle/>
        <ActionResult action=set_limit/>
        <ActionResult action=set_override/>
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
                                    <th class="num">"Cancelled"</th><th class="num">"Discarded"</th><th class="num">"Dead letters"</th>
                                    <th>"Rate limit"</th><th></th>
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
                                                <td class="rate-limit">
                                                    <RateLimitEditor queue=q.name.clone() limit=q.limit.clone() override_note=q.override_note.clone() action=set_limit set_override=set_override can_act=can_act/>
                                                </td>
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
        <super::rate_limit_keys::RateLimitKeys tick=tick set=set_override can_act=can_act/>
    }
}

/// A queue's limit and, folded away, the forms to change it and to override its concurrency
/// for a while (plain `<details>`: no JS needed).
#[component]
fn RateLimitEditor(
    queue: String,
    limit: RateLimitForm,
    override_note: Option<String>,
    action: ServerAction<SetQueueRateLimit>,
    set_override: ServerAction<super::rate_limit_keys::SetRateLimitOverride>,
    can_act: Signal<bool>,
) -> impl IntoView {
    let summary = limit.summary();
    let overridden = override_note.is_some();
    let partition = format!("queue:{queue}");
    // A refused save comes back open, with what was typed.
    let typed = RateLimitForm::typed(&queue).filter(|_| crate::feedback::refused_for_values(action));
    let editing = typed.is_some();
    let limit = typed.unwrap_or(limit);
    let overriding = overridden || super::rate_limit_keys::typed_override(&partition, set_override).is_some();
    let field = move |name: &'static str, label: &'static str, value: String, hint: &'static str| {
        view! {
            <label>
                {label}
                <input type="text" name=format!("limit[{name}]") value=value placeholder=hint size="6"/>
            </label>
        }
    };
    view! {
        {match summary {
            Some(s) => view! { <span class="limit-summary">{s}</span> }.into_any(),
            None => view! { <span class="muted limit-summary">"none"</span> }.into_any(),
        }}
        {override_note.map(|n| view! { <div class="limit-override">"Override: " {n}</div> })}
        <details class="limit-edit" open=editing>
            <summary>"Edit"</summary>
            <ActionForm action=action>
                <CsrfField/>
                <input type="hidden" name="queue" value=queue/>
                {field("concurrency", "Active at most ", limit.concurrency, "—")}
                <br/>
                {field("rate_limit", "Starts ", limit.rate_limit, "—")}
                {field("rate_period", " per ", limit.rate_period, "PT1M")}
                <br/>
                {field("throttle_limit", "Spaced: ", limit.throttle_limit, "—")}
                {field("throttle_period", " per ", limit.throttle_period, "PT1S")}
                <br/>
                <small class="muted">"Empty fields mean no limit. Applies to every worker at its next claim."</small>
                <br/>
                <button type="submit" disabled=move || !can_act.get()>"Save limit"</button>
            </ActionForm>
        </details>
        <details class="limit-edit override-edit" open=overriding>
            <summary>"Override"</summary>
            <small class="muted">"Active at most this many until a time (0 stops the queue); its limit above applies again after."</small>
            <super::rate_limit_keys::OverrideForms key=partition overridden=overridden action=set_override can_act=can_act/>
        </details>
    }
}
