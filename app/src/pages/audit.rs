//! The audit log: who did what, when, to which target, with the details; filterable and
//! paginated by entry id.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

use crate::error::AppError;
use crate::feedback::ErrorBox;
use crate::filters::urlencode;
use crate::refresh::use_refresh;
use crate::time_text::When;

#[cfg(feature = "ssr")]
const PAGE: i64 = 50;

/// The longest `actor`, `action` or `target` the filter takes, in characters: longer than any
/// name the log holds (job types, cron names and queue names stop at 255 or less).
pub const MAX_FILTER_CHARS: usize = 255;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditQuery {
    #[serde(default)]
    pub actor: String,
    /// A prefix: `job.` finds every job action.
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub target: String,
    #[serde(default)]
    pub before: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditRow {
    pub id: i64,
    pub at: When,
    pub actor: String,
    pub action: String,
    pub target: Option<String>,
    /// A link when the target is a job.
    pub target_href: Option<String>,
    pub details: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditPageData {
    pub rows: Vec<AuditRow>,
    pub older: Option<i64>,
}

#[server(endpoint = "audit_log")]
pub async fn audit_log(query: AuditQuery) -> Result<AuditPageData, AppError> {
    use rebound_queue::store::AuditFilter;

    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    let non_empty = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_string());
    for (field, value) in [("actor", &query.actor), ("action", &query.action), ("target", &query.target)] {
        let n = value.trim().chars().count();
        if n > MAX_FILTER_CHARS {
            return Err(AppError::Invalid { field: field.into(), reason: format!("must be at most {MAX_FILTER_CHARS} characters (this one has {n})") });
        }
    }
    let before = match non_empty(&query.before) {
        Some(b) => Some(b.parse::<i64>().map_err(|_| AppError::Invalid { field: "before".into(), reason: format!("{} is not an entry id", crate::error::quoted(&b)) })?),
        None => None,
    };
    let entries = store
        .audit_log(&AuditFilter {
            actor: non_empty(&query.actor),
            // A prefix, taken literally: `_` and `%` are characters of an action, not wildcards.
            action: non_empty(&query.action),
            target: non_empty(&query.target),
            before,
            limit: PAGE,
        })
        .await?;
    let older = (entries.len() as i64 == PAGE).then(|| entries.last().map(|e| e.id)).flatten();
    let rows = entries
        .into_iter()
        .map(|e| AuditRow {
            target_href: e.target.as_ref().filter(|t| t.parse::<uuid::Uuid>().is_ok()).map(|t| format!("/jobs/{t}")).or_else(|| {
                e.target
                    .as_ref()
                    .filter(|_| e.action.starts_with("policy."))
                    .map(|t| format!("/policies/edit?type={}", urlencode(t)))
            }),
            id: e.id,
            at: When::of(e.at, now),
            actor: e.actor,
            action: e.action,
            target: e.target,
            details: if e.details.as_object().is_some_and(|o| o.is_empty()) { String::new() } else { e.details.to_string() },
        })
        .collect();
    Ok(AuditPageData { rows, older })
}

#[component]
pub fn AuditPage() -> impl IntoView {
    let q = use_query_map();
    let query = Memo::new(move |_| {
        q.with(|q| {
            let get = |k: &str| q.get(k).unwrap_or_default();
            AuditQuery { actor: get("actor"), action: get("action"), target: get("target"), before: get("before") }
        })
    });
    let tick = use_refresh();
    let data = Resource::new(move || (query.get(), tick.get()), |(q, _)| audit_log(q));
    view! {
        <h1>"Audit log"</h1>
        <form class="filters" method="get" action="/audit">
            <label>"Who" <input name="actor" placeholder="any" value=move || query.get().actor/></label>
            <label>"Action" <input name="action" placeholder="e.g. dead_letter. or policy." value=move || query.get().action/></label>
            <label>"Target" <input name="target" placeholder="job id, type, queue…" value=move || query.get().target/></label>
            <button type="submit">"Filter"</button>
            <a class="button-link" href="/audit">"Clear"</a>
        </form>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(d) => {
                        let q = query.get_untracked();
                        let older = d.older.map(|id| {
                            format!(
                                "/audit?actor={}&action={}&target={}&before={id}",
                                urlencode(&q.actor),
                                urlencode(&q.action),
                                urlencode(&q.target)
                            )
                        });
                        view! {
                            {if d.rows.is_empty() {
                                view! { <p class="muted">"No entries."</p> }.into_any()
                            } else {
                                view! {
                                    <table class="audit">
                                        <thead><tr><th>"When"</th><th>"Who"</th><th>"What"</th><th>"Target"</th><th>"Details"</th></tr></thead>
                                        <tbody>
                                            {d.rows
                                                .into_iter()
                                                .map(|r| {
                                                    let target = match (r.target.clone(), r.target_href.clone()) {
                                                        (Some(t), Some(h)) => view! { <a href=h class="mono">{t}</a> }.into_any(),
                                                        (Some(t), None) => view! { <span class="mono">{t}</span> }.into_any(),
                                                        _ => view! { "–" }.into_any(),
                                                    };
                                                    view! {
                                                        <tr>
                                                            <td title=r.at.relative.clone()>{r.at.at.clone()}</td>
                                                            <td>{r.actor.clone()}</td>
                                                            <td><code>{r.action.clone()}</code></td>
                                                            <td>{target}</td>
                                                            <td class="details"><code>{r.details.clone()}</code></td>
                                                        </tr>
                                                    }
                                                })
                                                .collect_view()}
                                        </tbody>
                                    </table>
                                }
                                .into_any()
                            }}
                            <nav class="pager">
                                {(!q.before.is_empty()).then(|| view! { <a href="/audit">"← Newest"</a> })}
                                {older.map(|h| view! { <a href=h class="next">"Older →"</a> })}
                            </nav>
                        }
                        .into_any()
                    }
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}
