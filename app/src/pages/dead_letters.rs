//! Dead letters: grouped by error signature, filtered like the jobs list, re-driven one,
//! selected or all matching a filter (fresh budget or one more attempt, optionally staggered
//! over a window), and purged with a typed confirmation.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

use super::jobs::{JobRowsTable, JobsPageData, count_text, list_jobs, window_note};
use crate::auth::{CsrfField, ReadOnlyNote, use_can_act};
use crate::error::AppError;
use crate::feedback::{ActionResult, ErrorBox};
use crate::filters::{FilterForm, FilterHiddenFields, JobQuery, urlencode};
use crate::refresh::use_refresh;
use crate::time_text::When;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorGroupRow {
    pub error_type: Option<String>,
    pub signature: String,
    pub example: Option<String>,
    pub count: i64,
    pub latest: Option<When>,
}

/// The largest error groups of the matching dead letters (exact counts: the store keeps each
/// dead letter's signature in an index, so grouping 100 000 of them stays cheap).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorGroups {
    pub rows: Vec<ErrorGroupRow>,
}

/// The stagger windows offered, in seconds.
pub const STAGGER_CHOICES: [(&str, &str); 5] = [("", "all at once"), ("60", "over 1 minute"), ("600", "over 10 minutes"), ("3600", "over 1 hour"), ("21600", "over 6 hours")];

#[server(endpoint = "dead_letter_groups")]
pub async fn dead_letter_groups(#[server(default)] query: JobQuery) -> Result<ErrorGroups, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    let filter = query.to_filter(now)?;
    let rows = store
        .dead_letter_groups(&filter, 20)
        .await?
        .into_iter()
        .map(|g| ErrorGroupRow {
            error_type: g.error_type,
            signature: g.signature,
            example: g.example_message,
            count: g.count,
            latest: g.latest.map(|t| When::of(t, now)),
        })
        .collect();
    Ok(ErrorGroups { rows })
}

/// How to re-drive: the `how[...]` fields of the re-drive form.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveHow {
    /// `fresh` (the default) or `one_more`.
    #[serde(default)]
    pub budget: String,
    /// Seconds to spread the jobs over; empty for all at once.
    #[serde(default)]
    pub stagger: String,
    /// Recorded in the audit log.
    #[serde(default)]
    pub reason: String,
}

#[server(endpoint = "redrive_dead_letters")]
pub async fn redrive_dead_letters(
    csrf: String,
    scope: String,
    #[server(default)] ids: Vec<String>,
    #[server(default)] filter: JobQuery,
    /// A row's own Re-drive button: just that job, whatever `scope` says.
    #[server(default)] one: String,
    #[server(default)] how: RedriveHow,
) -> Result<String, AppError> {
    use rebound_queue::store::{RedriveBudget, RedriveOptions};

    let actor = crate::auth::authorize_mutation(&csrf)?;
    let store = crate::state::store()?;
    let sel = if one.is_empty() {
        super::jobs::selection(&store, &scope, &ids, &filter, true).await?
    } else {
        super::jobs::selection(&store, "selected", &[one], &filter, true).await?
    };
    let RedriveHow { budget, stagger, reason } = how;
    let budget = match budget.as_str() {
        "" | "fresh" => RedriveBudget::Fresh,
        "one_more" => RedriveBudget::OneMore,
        other => return Err(AppError::Invalid { field: "budget".into(), reason: format!("{} is not fresh or one_more", crate::error::quoted(other)) }),
    };
    // A week is far more than any real spread, and keeps every planned run in range.
    const MAX_STAGGER_SECS: u64 = 7 * 24 * 3600;
    let stagger = match stagger.trim() {
        "" | "0" => None,
        s => {
            let secs = s.parse::<u64>().map_err(|_| AppError::Invalid { field: "stagger".into(), reason: "must be a number of seconds".into() })?;
            if secs > MAX_STAGGER_SECS {
                return Err(AppError::Invalid { field: "stagger".into(), reason: format!("at most {MAX_STAGGER_SECS} seconds (a week)") });
            }
            Some(std::time::Duration::from_secs(secs))
        }
    };
    let reason = Some(reason.trim().to_string()).filter(|r| !r.is_empty());
    let n = store.redrive(&sel, &RedriveOptions { budget, stagger, actor, reason }).await?;
    if n == 0 {
        return Err(AppError::Conflict("nothing was re-driven: no dead letter matched (someone may have re-driven them already)".into()));
    }
    let spread = stagger.map(|s| format!(", spread over {}", crate::time_text::duration_text(s.as_millis() as u64))).unwrap_or_default();
    Ok(format!("Re-drove {n} dead letter{}{spread}.", if n == 1 { "" } else { "s" }))
}

#[server(endpoint = "purge_dead_letters")]
pub async fn purge_dead_letters(csrf: String, #[server(default)] filter: JobQuery, #[server(default)] confirmation: String) -> Result<String, AppError> {
    let actor = crate::auth::authorize_mutation(&csrf)?;
    if confirmation.trim() != "purge" {
        return Err(AppError::Invalid { field: "confirmation".into(), reason: "type the word purge to confirm deleting these dead letters for good".into() });
    }
    let store = crate::state::store()?;
    let sel = super::jobs::selection(&store, "filter", &[], &filter, true).await?;
    let n = store.purge_dead_letters(&sel, &actor, Some("purged from the dashboard")).await?;
    Ok(format!("Purged {n} dead letter{}.", if n == 1 { "" } else { "s" }))
}

#[component]
pub fn DeadLettersPage() -> impl IntoView {
    let query = JobQuery::from_url();
    let q = use_query_map();
    let after = Memo::new(move |_| q.with(|q| q.get("after").unwrap_or_default()));
    let tick = use_refresh();
    let redrive = ServerAction::<RedriveDeadLetters>::new();
    let purge = ServerAction::<PurgeDeadLetters>::new();
    let changes = move || (tick.get(), redrive.version().get(), purge.version().get());
    let groups = Resource::new(move || (query.get(), changes()), |(q, _)| dead_letter_groups(q));
    let page = Resource::new(move || (query.get(), after.get(), changes()), |(q, after, _)| list_jobs(q, after, true));
    view! {
        <h1>"Dead letters"</h1>
        <p class="lead">"To replay dead letters automatically some time after their death, set up " <a href="/dead-letters/replay-rules">"Replay rules"</a> "."</p>
        <FilterForm action="/dead-letters" query=query show_state=false/>
        <ActionResult action=redrive/>
        <ActionResult action=purge/>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match groups.await {
                    Ok(g) => view! { <GroupsPanel groups=g query=query.get_untracked()/> }.into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
            {move || Suspend::new(async move {
                match page.await {
                    Ok(d) => view! { <DeadLetterList data=d query=query.get_untracked() after=after.get_untracked() redrive=redrive purge=purge/> }.into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn GroupsPanel(groups: ErrorGroups, query: JobQuery) -> impl IntoView {
    let ErrorGroups { rows: groups } = groups;
    if groups.is_empty() {
        return ().into_any();
    }
    view! {
        <section class="panel">
            <h2>
                "By error signature "
            </h2>
            <table class="groups">
                <thead><tr><th>"Signature"</th><th>"Example"</th><th class="num">"Jobs"</th><th>"Latest"</th><th></th></tr></thead>
                <tbody>
                    {groups
                        .into_iter()
                        .map(|g| {
                            let narrowed = JobQuery { error_type: g.error_type.clone().unwrap_or_default(), ..query.clone() };
                            // A type longer than a filter takes (workers name their own) gets no link.
                            let linkable = g.error_type.as_ref().is_some_and(|t| t.chars().count() <= crate::filters::MAX_ERROR_TYPE_CHARS);
                            let href = format!("/dead-letters?{}", narrowed.to_query_string());
                            view! {
                                <tr>
                                    <td><code>{g.signature.clone()}</code></td>
                                    <td class="error-message">{g.example.clone().unwrap_or_default()}</td>
                                    <td class="num">{g.count}</td>
                                    <td>{g.latest.map(|w| w.relative).unwrap_or_default()}</td>
                                    <td>{linkable.then(|| view! { <a href=href>"Show these"</a> })}</td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </tbody>
            </table>
        </section>
    }
    .into_any()
}

#[component]
fn DeadLetterList(
    data: JobsPageData,
    query: JobQuery,
    after: String,
    redrive: ServerAction<RedriveDeadLetters>,
    purge: ServerAction<PurgeDeadLetters>,
) -> impl IntoView {
    let can_act = use_can_act();
    let matching = count_text(data.matching, data.matching_capped);
    let qs = query.to_query_string();
    let next_href = data.next.as_ref().map(|n| if qs.is_empty() { format!("/dead-letters?after={n}") } else { format!("/dead-letters?{qs}&after={n}") });
    let first_href = (!after.is_empty()).then(|| if qs.is_empty() { "/dead-letters".to_string() } else { format!("/dead-letters?{qs}") });
    let note = window_note(&data);
    if data.rows.is_empty() && after.is_empty() && data.next.is_none() {
        return view! { <p class="muted empty">"No dead letters match. Jobs land here when they exhaust their retries with on_exhaustion = dead_letter."</p> }.into_any();
    }
    let purge_query = query.clone();
    // A search counts only its window; the purge deletes every match (see all_matching_text).
    let purge_count = super::jobs::acted_on_text(&matching, data.searched_window);
    let filter_note = if query.is_empty() { "every dead letter".to_string() } else { "the dead letters matching this filter".to_string() };
    view! {
        <ReadOnlyNote/>
        <ActionForm action=redrive>
            <CsrfField/>
            <FilterHiddenFields query=query.clone()/>
            <div class="bulk-bar">
                <span class="count"><strong>{matching.clone()}</strong> " dead letters"</span>
                {note.map(|n| view! { <span class="muted search-window">{n}</span> })}
                <fieldset class="inline">
                    <legend>"Re-drive"</legend>
                    <label><input type="radio" name="scope" value="selected" checked/> "ticked rows"</label>
                    <label><input type="radio" name="scope" value="filter"/> {super::jobs::all_matching_text(&matching, data.searched_window)}</label>
                </fieldset>
                <fieldset class="inline">
                    <legend>"with"</legend>
                    <label><input type="radio" name="how[budget]" value="fresh" checked/> "a fresh budget"</label>
                    <label><input type="radio" name="how[budget]" value="one_more"/> "one more attempt"</label>
                </fieldset>
                <label>
                    "Stagger "
                    <select name="how[stagger]">
                        {super::dead_letters::STAGGER_CHOICES.into_iter().map(|(v, l)| view! { <option value=v>{l}</option> }).collect_view()}
                    </select>
                </label>
                <label>"Reason " <input name="how[reason]" placeholder="optional, for the audit log"/></label>
                <button type="submit" class="primary" disabled=move || !can_act.get()>"Re-drive"</button>
            </div>
            <JobRowsTable rows=data.rows selectable=true row_button="Re-drive"/>
        </ActionForm>
        <nav class="pager">
            {first_href.map(|h| view! { <a href=h>"← First page"</a> })}
            {next_href.map(|h| view! { <a href=h class="next">"Next page →"</a> })}
        </nav>
        <section class="panel danger-zone">
            <h2>"Purge"</h2>
            <p>"Deletes " {filter_note} " (" {purge_count} ") and their attempts for good. This cannot be undone."</p>
            <ActionForm action=purge>
                <CsrfField/>
                <FilterHiddenFields query=purge_query/>
                <label>"Type " <code>"purge"</code> " to confirm " <input name="confirmation" autocomplete="off" required/></label>
                <button type="submit" class="danger" disabled=move || !can_act.get()>"Purge dead letters"</button>
            </ActionForm>
        </section>
    }
    .into_any()
}

/// A link to the dead letters with one error type, for other pages.
pub fn error_type_href(error_type: &str) -> String {
    format!("/dead-letters?error_type={}", urlencode(error_type))
}
