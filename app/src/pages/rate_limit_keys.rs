//! Rate-limit keys on the Queues page: every key jobs share (`options.rate_limit`), how many of
//! its jobs run, hold a slot and wait, and an operator's override of its limit (stop a key
//! during an incident, or raise it for a while) with a form that works without JavaScript.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

use crate::auth::CsrfField;
use crate::error::AppError;
use crate::feedback::ErrorBox;

/// Keys shown at most; the OJS API (`GET /ojs/v1/rate-limits`) pages through all of them.
#[cfg(feature = "ssr")]
const SHOWN: i64 = 200;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyRow {
    pub key: String,
    /// "3", "none", or "0 (override until 14:05, in 20m; jobs set 3)".
    pub limit: String,
    pub overridden: bool,
    pub running: i64,
    pub admitted: i64,
    pub waiting: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyList {
    pub rows: Vec<KeyRow>,
    /// How many keys there are in all.
    pub total: usize,
}

#[server(endpoint = "rate_limit_keys")]
pub async fn rate_limit_keys() -> Result<KeyList, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    let (total, _) = store.rate_limit_key_count(None).await?;
    let total = usize::try_from(total).unwrap_or(0);
    let shown = store.rate_limit_key_names(None, SHOWN).await?;
    let rows = store
        .rate_limit_keys(&shown)
        .await?
        .into_iter()
        .map(|k| {
            let own = k.concurrency.map_or_else(|| "none".to_string(), |c| c.to_string());
            let limit = match (&k.held_until, &k.override_limit) {
                (Some(t), _) => {
                    let w = crate::time_text::When::of(*t, now);
                    format!("0 (held until {}, {}: a handler's rate_limit_until; jobs set {own})", w.at, w.relative)
                }
                (None, Some(o)) => {
                    let until = o.expires_at.map(|t| {
                        let w = crate::time_text::When::of(t, now);
                        format!(" until {}, {}", w.at, w.relative)
                    });
                    format!("{} (override{}; jobs set {own})", o.concurrency, until.unwrap_or_default())
                }
                (None, None) => own,
            };
            // The key's rate window and throttle beside its concurrency:
            // "3 · 100 per PT1M (40 this window) · 10 per PT1S, spaced evenly".
            let period = |w: &rebound_queue::store::Window| rebound_queue::policy::iso8601::format(w.period);
            let windows = [
                k.rate.map(|w| format!("{} per {} ({} this window)", w.limit, period(&w), k.rate_used)),
                k.throttle.map(|w| format!("{} per {}, spaced evenly", w.limit, period(&w))),
            ];
            let limit = windows.into_iter().flatten().fold(limit, |shown, w| if shown == "none" { w } else { format!("{shown} · {w}") });
            KeyRow { key: k.key, limit, overridden: k.override_limit.is_some(), running: k.active, admitted: k.admitted, waiting: k.waiting }
        })
        .collect();
    Ok(KeyList { rows, total })
}

/// An override as its form sends it: `concurrency` a whole number (empty: no override), `until`
/// empty for no end, or an RFC 3339 time, or `+` and an ISO-8601 duration such as `+PT1H`.
#[cfg(feature = "ssr")]
fn override_of(concurrency: &str, until: &str) -> Result<Option<rebound_queue::store::RateLimitOverride>, AppError> {
    let invalid = |field: &str, reason: String| AppError::Invalid { field: field.into(), reason };
    let concurrency = concurrency.trim();
    let until = until.trim();
    if concurrency.is_empty() {
        if !until.is_empty() {
            return Err(invalid("concurrency", "is required with an end time".into()));
        }
        return Ok(None);
    }
    let n = concurrency.parse::<u32>().map_err(|_| invalid("concurrency", format!("must be a whole number, got {}", crate::error::quoted(concurrency))))?;
    let expires_at = if until.is_empty() {
        None
    } else {
        let now = jiff::Timestamp::now();
        let parsed = match until.strip_prefix('+') {
            Some(d) => rebound_queue::policy::iso8601::parse(d).and_then(|d| {
                jiff::SignedDuration::try_from(d).ok().and_then(|d| now.checked_add(d).ok()).ok_or_else(|| "is too far ahead".to_string())
            }),
            None => until.parse::<jiff::Timestamp>().map_err(|e| e.to_string()),
        };
        Some(parsed.map_err(|r| invalid("until", format!("{} is not a time or +duration: {r}", crate::error::quoted(until))))?)
    };
    Ok(Some(rebound_queue::store::RateLimitOverride { concurrency: n, expires_at }))
}

/// Overrides the concurrency of a key, or of a queue when `key` is `queue:<name>` (over the
/// queue's own limit, which stays as set), until `until` (see [`override_of`]); with
/// `concurrency` empty removes the override.
#[server(endpoint = "set_rate_limit_override")]
pub async fn set_rate_limit_override(csrf: String, key: String, concurrency: String, until: String) -> Result<String, AppError> {
    let actor = crate::auth::authorize_mutation(&csrf)?;
    // Without JavaScript, refused values come back to the Queues page, in this key's form.
    let back = |e: AppError| {
        let url = format!("/queues?{}", crate::filters::query_pairs([("typed_override", key.as_str()), ("concurrency", &concurrency), ("until", &until)]));
        crate::feedback::back_with_typed_values::<SetRateLimitOverride>(&url, e)
    };
    let limit = override_of(&concurrency, &until).map_err(back)?;
    let store = crate::state::store()?;
    // The store names the end `expires_at`, as the API does; this form calls it `until`.
    let until_field = |e: rebound_queue::StoreError| match AppError::from(e) {
        AppError::Invalid { field, reason } if field == "expires_at" => back(AppError::Invalid { field: "until".into(), reason }),
        other => back(other),
    };
    if let Some(queue) = key.strip_prefix("queue:") {
        crate::error::check_queue(queue).map_err(back)?;
        let saved = store.override_queue_concurrency(queue, limit.as_ref(), &actor).await.map_err(until_field)?;
        return Ok(match (limit, saved.and_then(|s| s.concurrency_in_force())) {
            (Some(o), _) => format!("Queue {queue} now runs at most {} at once{}; its own limit applies again after.", o.concurrency, o.expires_at.map(|t| format!(" until {t}")).unwrap_or_default()),
            (None, Some(c)) => format!("Queue {queue}'s override is removed: its own limit of {c} at once applies."),
            (None, None) => format!("Queue {queue}'s override is removed: it has no concurrency limit now."),
        });
    }
    let saved = store.override_rate_limit(&key, limit.as_ref(), &actor).await.map_err(until_field)?;
    Ok(match saved.in_force {
        Some(l) => format!("Key {} now admits {l} at once ({} running, {} waiting).", saved.key, saved.active, saved.waiting),
        None => format!("Key {} has no limit now: its waiting jobs are admitted.", saved.key),
    })
}

/// What was typed into `key`'s override form, carried in the page's URL when a save without
/// JavaScript was refused (`?typed_override=<key>&concurrency=…&until=…`; see
/// [`crate::feedback::refused_for_values`]).
pub fn typed_override(key: &str, action: ServerAction<SetRateLimitOverride>) -> Option<(String, String)> {
    if !crate::feedback::refused_for_values(action) {
        return None;
    }
    let q = use_query_map();
    q.with_untracked(|q| {
        (q.get("typed_override").as_deref() == Some(key)).then(|| (q.get("concurrency").unwrap_or_default(), q.get("until").unwrap_or_default()))
    })
}

/// The form that overrides `key` (a rate-limit key, or `queue:<name>`), and the one that
/// clears it when `overridden`: plain forms, no JavaScript needed.
#[component]
pub fn OverrideForms(key: String, overridden: bool, action: ServerAction<SetRateLimitOverride>, can_act: Signal<bool>) -> impl IntoView {
    let clear_key = key.clone();
    let (concurrency, until) = typed_override(&key, action).unwrap_or_default();
    view! {
        <ActionForm action=action>
            <CsrfField/>
            <input type="hidden" name="key" value=key/>
            <label>"At most " <input type="text" name="concurrency" size="4" placeholder="—" value=concurrency/></label>
            <label>" until " <input type="text" name="until" size="10" placeholder="+PT1H" value=until/></label>
            <button type="submit" disabled=move || !can_act.get()>"Override"</button>
        </ActionForm>
        {overridden.then(move || view! {
            <ActionForm action=action>
                <CsrfField/>
                <input type="hidden" name="key" value=clear_key/>
                <input type="hidden" name="concurrency" value=""/>
                <input type="hidden" name="until" value=""/>
                <button type="submit" disabled=move || !can_act.get()>"Clear override"</button>
            </ActionForm>
        })}
    }
}

/// The keys' table, under the queues.
#[component]
pub fn RateLimitKeys(tick: Signal<u64>, set: ServerAction<SetRateLimitOverride>, can_act: Signal<bool>) -> impl IntoView {
    let data = Resource::new(move || (tick.get(), set.version().get()), |_| rate_limit_keys());
    view! {
        <h2>"Rate-limit keys"</h2>
        <p class="muted">"Jobs that name a key share its limit across queues; the rest wait, available, until a slot frees."</p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(list) if list.rows.is_empty() => view! { <p class="muted">"No job has named a rate-limit key."</p> }.into_any(),
                    Ok(list) => {
                        let more = (list.total > list.rows.len()).then(|| format!("The first {} of {} keys; GET /ojs/v1/rate-limits lists them all.", list.rows.len(), list.total));
                        view! {
                            <table class="rate-limit-keys">
                                <thead>
                                    <tr><th>"Key"</th><th>"Limit"</th><th class="num">"Running"</th><th class="num">"Admitted"</th><th class="num">"Waiting"</th><th>"Override"</th></tr>
                                </thead>
                                <tbody>
                                    {list.rows.into_iter().map(|k| {
                                        view! {
                                        <tr class:overridden=k.overridden>
                                            <td>{k.key.clone()}</td>
                                            <td>{k.limit.clone()}</td>
                                            <td class="num">{k.running}</td>
                                            <td class="num">{k.admitted}</td>
                                            <td class="num">{k.waiting}</td>
                                            <td><OverrideForms key=k.key.clone() overridden=k.overridden action=set can_act=can_act/></td>
                                        </tr>
                                    }}).collect_view()}
                                </tbody>
                            </table>
                            {more.map(|m| view! { <p class="muted">{m}</p> })}
                        }
                        .into_any()
                    }
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}
