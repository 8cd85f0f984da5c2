//! The jobs list: filters, keyset pagination, and bulk cancel / retry now / discard on the
//! selected rows or on everything matching the filter, with a count and a confirmation.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

use crate::auth::{CsrfField, ReadOnlyNote, use_can_act};
use crate::error::AppError;
use crate::feedback::{ActionResult, ErrorBox};
use crate::filters::{FilterForm, FilterHiddenFields, JobQuery};
use crate::refresh::use_refresh;
use crate::time_text::When;

/// Rows per page.
pub const PAGE_SIZE: i64 = 50;
/// Counting stops here: "10000+" is as useful as an exact figure and stays cheap.
pub const COUNT_CAP: i64 = 10_000;

/// One job in a listing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRow {
    pub id: String,
    pub job_type: String,
    pub queue: String,
    pub state: String,
    pub dead_letter: bool,
    pub attempt: i32,
    pub max_attempts: i32,
    pub created: When,
    /// For jobs waiting on a retry or a schedule.
    pub next_run: Option<When>,
    pub dead_lettered: Option<When>,
    pub error_type: Option<String>,
    pub error_message: Option<String>,
}

#[cfg(feature = "ssr")]
impl JobRow {
    pub fn from_job(job: &rebound_queue::Job, now: jiff::Timestamp) -> JobRow {
        let err = job.last_error.as_ref();
        let text = |k: &str| err.and_then(|e| e.get(k)).and_then(|v| v.as_str()).map(str::to_string);
        JobRow {
            id: job.id.to_string(),
            job_type: job.job_type.clone(),
            queue: job.queue.clone(),
            state: job.state.as_str().to_string(),
            dead_letter: job.dead_letter,
            attempt: job.attempt,
            max_attempts: job.max_attempts,
            created: When::of(job.created_at, now),
            next_run: job.next_run_at().map(|t| When::of(t, now)),
            dead_lettered: job.dead_lettered_at.map(|t| When::of(t, now)),
            error_type: text("type"),
            error_message: text("message").map(|m| if m.chars().count() > 160 { m.chars().take(160).collect::<String>() + "…" } else { m }),
        }
    }
}

/// A page of jobs and how many match in all (capped).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobsPageData {
    pub rows: Vec<JobRow>,
    /// The cursor of the next page.
    pub next: Option<String>,
    pub matching: i64,
    pub matching_capped: bool,
    /// A text or error-type search that had more jobs to read than one request reads: how
    /// many of the newest were searched (`matching` counts among those).
    #[serde(default)]
    pub searched_window: Option<i64>,
}

#[cfg(feature = "ssr")]
pub(crate) fn parse_id(id: &str) -> Result<uuid::Uuid, AppError> {
    parse_uuid("id", "a job id", id)
}

/// A UUID from a form or the URL for `field` (`what` it should be, for the message, which
/// quotes only the start of a wrong one).
#[cfg(feature = "ssr")]
pub(crate) fn parse_uuid(field: &str, what: &str, id: &str) -> Result<uuid::Uuid, AppError> {
    id.trim().parse().map_err(|_| AppError::Invalid { field: field.into(), reason: format!("{} is not {what}", crate::error::quoted(id)) })
}

#[server(endpoint = "list_jobs")]
pub async fn list_jobs(#[server(default)] query: JobQuery, #[server(default)] after: String, #[server(default)] dead_letters_only: bool) -> Result<JobsPageData, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let now = store.now().await?;
    let mut filter = query.to_filter(now)?;
    if dead_letters_only {
        filter.dead_letter = Some(true);
    }
    if dead_letters_only && query.sort == "died" {
        use rebound_queue::store::DeathCursor;
        let after = if after.is_empty() {
            None
        } else {
            Some(DeathCursor::parse(&after).ok_or_else(|| AppError::Invalid { field: "after".into(), reason: "is not a page cursor of this order".into() })?)
        };
        let (items, next, counted) = store.dead_letters_by_death_counted(&filter, after, PAGE_SIZE, COUNT_CAP).await?;
        return Ok(JobsPageData {
            rows: items.iter().map(|j| JobRow::from_job(j, now)).collect(),
            next: next.map(|c| c.encode()),
            matching: counted.n,
            matching_capped: counted.capped,
            searched_window: counted.windowed.then_some(rebound_queue::store::SEARCH_WINDOW),
        });
    }
    if let Some((key, descending)) = query.run_order() {
        // In the order jobs run: pages by position (the listing's first 10 000 jobs).
        use rebound_queue::store::SORT_WINDOW;
        let offset = if after.is_empty() {
            0
        } else {
            after
                .parse::<i64>()
                .ok()
                .filter(|o| (1..SORT_WINDOW).contains(o))
                .ok_or_else(|| AppError::Invalid { field: "after".into(), reason: "is not a page cursor of this order".into() })?
        };
        let (items, more) = store.list_jobs_sorted(&filter, key, descending, offset, PAGE_SIZE).await?;
        // A sorted listing ends at its window: no link to a page it would refuse.
        let reached = offset + items.len() as i64;
        let next = (more && reached < SORT_WINDOW).then(|| reached.to_string());
        let counted = store.count_jobs_bounded(&filter, COUNT_CAP).await?;
        return Ok(JobsPageData {
            rows: items.iter().map(|j| JobRow::from_job(j, now)).collect(),
            next,
            matching: counted.n,
            matching_capped: counted.capped,
            searched_window: None,
        });
    }
    let after = if after.is_empty() { None } else { Some(parse_uuid("after", "a page cursor (a job id)", &after)?) };
    let (page, counted) = if query.sort == "oldest" {
        if filter.is_search() {
            return Err(AppError::Invalid { field: "sort".into(), reason: "a search (text, error type, died) lists its matches newest first".into() });
        }
        let page = store.list_jobs_ordered(&filter, after, PAGE_SIZE, rebound_queue::store::Order::OldestFirst).await?;
        (page, store.count_jobs_bounded(&filter, COUNT_CAP).await?)
    } else {
        store.list_jobs_counted(&filter, after, PAGE_SIZE, COUNT_CAP).await?
    };
    Ok(JobsPageData {
        rows: page.items.iter().map(|j| JobRow::from_job(j, now)).collect(),
        next: page.next.map(|id| id.to_string()),
        matching: counted.n,
        matching_capped: counted.capped,
        searched_window: counted.windowed.then_some(rebound_queue::store::SEARCH_WINDOW),
    })
}

/// Which jobs a bulk form acts on.
#[cfg(feature = "ssr")]
pub(crate) async fn selection(
    store: &rebound_queue::Store,
    scope: &str,
    ids: &[String],
    filter: &JobQuery,
    dead_letters_only: bool,
) -> Result<rebound_queue::store::JobSelection, AppError> {
    use rebound_queue::store::JobSelection;
    match scope {
        "selected" => {
            if ids.is_empty() {
                return Err(AppError::Invalid { field: "ids".into(), reason: "tick at least one row, or choose all matching the filter".into() });
            }
            Ok(JobSelection::Ids(ids.iter().map(|id| parse_id(id)).collect::<Result<_, _>>()?))
        }
        "filter" => {
            let mut f = filter.to_filter(store.now().await?)?;
            if dead_letters_only {
                f.dead_letter = Some(true);
            }
            Ok(JobSelection::Filter(f))
        }
        other => Err(AppError::Invalid { field: "scope".into(), reason: format!("{} is not \"selected\" or \"filter\"", crate::error::quoted(other)) }),
    }
}

/// Bulk cancel / retry now / discard.
#[server(endpoint = "bulk_jobs")]
pub async fn bulk_jobs(
    csrf: String,
    action: String,
    scope: String,
    #[server(default)] ids: Vec<String>,
    #[server(default)] filter: JobQuery,
    #[server(default)] confirm: String,
) -> Result<String, AppError> {
    let actor = crate::auth::authorize_mutation(&csrf)?;
    if confirm != "yes" {
        return Err(AppError::Invalid { field: "confirm".into(), reason: "tick the confirmation box to apply a bulk action".into() });
    }
    let store = crate::state::store()?;
    let sel = selection(&store, &scope, &ids, &filter, false).await?;
    let (n, verb) = match action.as_str() {
        "cancel" => (store.cancel_jobs(&sel, &actor).await?, "Cancelled"),
        "retry_now" => (store.retry_jobs_now(&sel, &actor).await?, "Made available now"),
        "discard" => (store.discard_jobs(&sel, &actor).await?, "Discarded"),
        other => return Err(AppError::Invalid { field: "action".into(), reason: format!("unknown bulk action {}", crate::error::quoted(other)) }),
    };
    Ok(format!("{verb} {n} job{}.", if n == 1 { "" } else { "s" }))
}

#[component]
pub fn JobsPage() -> impl IntoView {
    let query = JobQuery::from_url();
    let q = use_query_map();
    let after = Memo::new(move |_| q.with(|q| q.get("after").unwrap_or_default()));
    let tick = use_refresh();
    let bulk = ServerAction::<BulkJobs>::new();
    let data = Resource::new(
        move || (query.get(), after.get(), tick.get(), bulk.version().get()),
        |(query, after, _, _)| list_jobs(query, after, false),
    );
    view! {
        <h1>"Jobs"</h1>
        <FilterForm action="/jobs" query=query show_state=true/>
        <ActionResult action=bulk/>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(d) => view! { <JobsTable data=d query=query.get_untracked() after=after.get_untracked() bulk=bulk/> }.into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}

/// "1 234" or "10000+".
pub fn count_text(n: i64, capped: bool) -> String {
    if capped { format!("{n}+") } else { n.to_string() }
}

/// What "all matching" acts on, in words: the count, or for a search (whose count covers only
/// its window) the count and that older matches are included too. A bulk action selects every
/// match, up to its limit, not just the counted window: the label must not promise fewer.
pub fn all_matching_text(matching: &str, searched_window: Option<i64>) -> String {
    match searched_window {
        None => format!("all {matching} matching"),
        Some(_) => format!("all matching: {}", acted_on_text(matching, searched_window)),
    }
}

/// How many a bulk action on "all matching" acts on: the count, or for a search the count of
/// its window and that older matches are included.
pub fn acted_on_text(matching: &str, searched_window: Option<i64>) -> String {
    match searched_window {
        None => matching.to_string(),
        Some(w) => format!("{matching} among the newest {}, and older ones too", crate::time_text::thousands(w)),
    }
}

/// Said under a search's count: a text or error-type search reads a bounded window of the
/// newest jobs per page, so its count covers that window, and Older searches further back.
pub fn window_note(data: &JobsPageData) -> Option<String> {
    data.searched_window.map(|w| {
        format!(
            "counted among the newest {} jobs matching the other filters; Older searches further back, or narrow by time, type or queue",
            crate::time_text::thousands(w)
        )
    })
}

#[component]
fn JobsTable(data: JobsPageData, query: JobQuery, after: String, bulk: ServerAction<BulkJobs>) -> impl IntoView {
    let can_act = use_can_act();
    let matching = count_text(data.matching, data.matching_capped);
    let next_href = data.next.as_ref().map(|n| {
        let qs = query.to_query_string();
        if qs.is_empty() { format!("/jobs?after={n}") } else { format!("/jobs?{qs}&after={n}") }
    });
    let first_href = (!after.is_empty()).then(|| {
        let qs = query.to_query_string();
        if qs.is_empty() { "/jobs".to_string() } else { format!("/jobs?{qs}") }
    });
    let empty = data.rows.is_empty();
    view! {
        <ActionForm action=bulk>
            <CsrfField/>
            <FilterHiddenFields query=query.clone()/>
            <div class="bulk-bar">
                <span class="count"><strong>{matching.clone()}</strong> " matching jobs"</span>
                {window_note(&data).map(|n| view! { <span class="muted search-window">{n}</span> })}
                <fieldset class="inline">
                    <legend>"Apply to"</legend>
                    <label><input type="radio" name="scope" value="selected" checked/> "ticked rows"</label>
                    <label><input type="radio" name="scope" value="filter"/> {all_matching_text(&matching, data.searched_window)}</label>
                </fieldset>
                <label class="confirm"><input type="checkbox" name="confirm" value="yes"/> "Yes, I am sure"</label>
                <button type="submit" name="action" value="retry_now" disabled=move || !can_act.get()>"Retry now"</button>
                <button type="submit" name="action" value="cancel" disabled=move || !can_act.get()>"Cancel"</button>
                <button type="submit" name="action" value="discard" class="danger" disabled=move || !can_act.get()>"Discard"</button>
            </div>
            <ReadOnlyNote/>
            {if empty {
                view! { <p class="muted empty">"No jobs match this filter."</p> }.into_any()
            } else {
                view! { <JobRowsTable rows=data.rows selectable=true/> }.into_any()
            }}
        </ActionForm>
        <nav class="pager">
            {first_href.map(|h| view! { <a href=h>"← First page"</a> })}
            {next_href.map(|h| view! { <a href=h class="next">"Next page →"</a> })}
        </nav>
    }
}

/// The table of job rows; with `selectable`, each row has an `ids[]` checkbox.
#[component]
pub fn JobRowsTable(
    rows: Vec<JobRow>,
    selectable: bool,
    /// A submit button per row named `one` (the enclosing form acts on that row alone).
    #[prop(optional)]
    row_button: Option<&'static str>,
) -> impl IntoView {
    let can_act = crate::auth::use_can_act();
    view! {
        <table class="jobs">
            <thead>
                <tr>
                    {selectable.then(|| view! { <th class="select"><span class="sr-only">"Select"</span></th> })}
                    <th>"Job"</th>
                    <th>"Type"</th>
                    <th>"Queue"</th>
                    <th>"State"</th>
                    <th class="num">"Attempt"</th>
                    <th>"Next run / created"</th>
                    <th>"Last error"</th>
                    {row_button.map(|_| view! { <th><span class="sr-only">"Action"</span></th> })}
                </tr>
            </thead>
            <tbody>
                {rows
                    .into_iter()
                    .map(|r| {
                        let href = format!("/jobs/{}", r.id);
                        let short = r.id.chars().rev().take(8).collect::<String>().chars().rev().collect::<String>();
                        let state_label = if r.dead_letter { "dead letter".to_string() } else { r.state.clone() };
                        let state_class = if r.dead_letter { "state state-dead".to_string() } else { format!("state state-{}", r.state) };
                        let time = match (&r.next_run, &r.dead_lettered) {
                            (Some(n), _) => view! { <span title=n.at.clone()>"next " {n.relative.clone()}</span> }.into_any(),
                            (None, Some(d)) => view! { <span title=d.at.clone()>"dead " {d.relative.clone()}</span> }.into_any(),
                            _ => view! { <span title=r.created.at.clone()>"created " {r.created.relative.clone()}</span> }.into_any(),
                        };
                        view! {
                            <tr>
                                {selectable.then(|| view! { <td class="select"><input type="checkbox" name="ids[]" value=r.id.clone() aria-label=format!("Select job {}", r.id)/></td> })}
                                <td><a href=href class="mono" title=r.id.clone()>{"…"}{short}</a></td>
                                <td>{r.job_type.clone()}</td>
                                <td>{r.queue.clone()}</td>
                                <td><span class=state_class>{state_label}</span></td>
                                <td class="num">{r.attempt} "/" {r.max_attempts}</td>
                                <td>{time}</td>
                                <td class="error-cell">
                                    {r.error_type.clone().map(|t| view! { <code class="error-type">{t}</code> " " })}
                                    <span class="error-message">{r.error_message.clone().unwrap_or_default()}</span>
                                </td>
                                {row_button.map(|label| view! {
                                    <td><button type="submit" name="one" value=r.id.clone() class="small" disabled=move || !can_act.get()>{label}</button></td>
                                })}
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
}

#[cfg(test)]
mod tests {
    use super::all_matching_text;

    #[test]
    fn all_matching_says_when_it_reaches_past_the_counted_window() {
        assert_eq!(all_matching_text("12", None), "all 12 matching");
        let searched = all_matching_text("3", Some(5_000));
        assert!(searched.contains("3 among the newest 5") && searched.ends_with("and older ones too"), "{searched}");
    }
}
