//! The job filter shared by the jobs list, the dead-letter page and their bulk actions. It
//! lives in the URL's query string (so a filtered view can be bookmarked, shared and works
//! without JavaScript) and travels to server functions as hidden `filter[...]` form fields.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

/// A job filter as typed into the form; empty strings mean "any".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobQuery {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub queue: String,
    #[serde(default)]
    pub job_type: String,
    /// Exact, or a prefix ending in `.*`.
    #[serde(default)]
    pub error_type: String,
    /// Substring of the args or of the last error's message.
    #[serde(default)]
    pub text: String,
    /// `1h`, `24h`, `7d` or empty: only jobs created within that window.
    #[serde(default)]
    pub since: String,
    /// The same windows for when a job was dead-lettered (the dead-letter page's "Died"):
    /// after a fix, the jobs that failed since.
    #[serde(default)]
    pub died: String,
    /// The order: empty for the newest created first, `oldest` for the oldest; on the jobs
    /// page `priority` for the highest priority first, then the longest due (for available
    /// jobs, the order claims take them in) and `scheduled` for the soonest scheduled first;
    /// on the dead-letter page `died` for the most recently dead-lettered first. Not a
    /// condition: bulk actions ignore it.
    #[serde(default)]
    pub sort: String,
}

/// The time windows offered for `since`.
pub const SINCE_CHOICES: [(&str, &str); 4] = [("", "any time"), ("1h", "last hour"), ("24h", "last 24 hours"), ("7d", "last 7 days")];

/// The job states offered for `state`.
pub const STATES: [&str; 8] = ["scheduled", "available", "pending", "active", "completed", "retryable", "cancelled", "discarded"];

impl JobQuery {
    /// The filter in the current URL.
    pub fn from_url() -> Memo<JobQuery> {
        let q = use_query_map();
        Memo::new(move |_| {
            q.with(|q| {
                let get = |k: &str| q.get(k).map(|v| v.trim().to_string()).unwrap_or_default();
                JobQuery {
                    state: get("state"),
                    queue: get("queue"),
                    job_type: get("job_type"),
                    error_type: get("error_type"),
                    text: get("text"),
                    since: get("since"),
                    died: get("died"),
                    sort: get("sort"),
                }
            })
        })
    }

    /// The filter as URL query pairs (empty fields left out), e.g. for links.
    pub fn to_query_string(&self) -> String {
        let pairs = [
            ("state", &self.state),
            ("queue", &self.queue),
            ("job_type", &self.job_type),
            ("error_type", &self.error_type),
            ("text", &self.text),
            ("since", &self.since),
            ("died", &self.died),
            ("sort", &self.sort),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty());
        query_pairs(pairs.map(|(k, v)| (k, v.as_str())))
    }

    pub fn is_empty(&self) -> bool {
        self == &JobQuery::default()
    }
}

/// `k=v&k=v…`, each value percent-encoded (see [`urlencode`]).
pub fn query_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    pairs.into_iter().map(|(k, v)| format!("{k}={}", urlencode(v))).collect::<Vec<_>>().join("&")
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The longest `text` a search takes, in characters. Each is matched row by row (`ILIKE
/// '%…%'` over the args and the error message of up to `SEARCH_WINDOW` jobs, each pattern
/// lowercased per row), so a long one would hold a connection for seconds; nobody searches
/// for more.
pub const MAX_TEXT_CHARS: usize = 200;

/// The longest `error_type` filter, in characters (an error type is a short dotted name).
pub const MAX_ERROR_TYPE_CHARS: usize = 255;

#[cfg(feature = "ssr")]
impl JobQuery {
    /// The sort key and direction of the orders by when jobs run (`priority`, `scheduled`);
    /// `None` for the orders by creation or death.
    pub fn run_order(&self) -> Option<(rebound_queue::store::SortKey, bool)> {
        use rebound_queue::store::SortKey;
        match self.sort.as_str() {
            "priority" => Some((SortKey::Priority, true)),
            "scheduled" => Some((SortKey::ScheduledAt, false)),
            _ => None,
        }
    }

    /// The store filter, relative to `now` for `since`. Unknown states, queue names and types
    /// that no job can have, a `text` longer than [`MAX_TEXT_CHARS`] or an `error_type` longer
    /// than [`MAX_ERROR_TYPE_CHARS`] are input errors naming the field (checked here, before
    /// any of it reaches the database).
    pub fn to_filter(&self, now: jiff::Timestamp) -> Result<rebound_queue::store::JobFilter, crate::error::AppError> {
        use crate::error::{AppError, quoted, requoted};
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        let too_long = |field: &str, value: &str, max: usize| {
            let n = value.chars().count();
            (n > max).then(|| AppError::Invalid { field: field.into(), reason: format!("must be at most {max} characters (this one has {n})") })
        };
        let states = if self.state.is_empty() {
            Vec::new()
        } else {
            vec![self.state.parse().map_err(|e: rebound_queue::job::UnknownState| AppError::Invalid {
                field: "state".into(),
                reason: requoted(e.to_string(), &self.state),
            })?]
        };
        if !self.queue.is_empty() {
            crate::error::check_queue(&self.queue)?;
        }
        if !self.job_type.is_empty() {
            rebound_queue::job::validate_type_filter(&self.job_type)
                .map_err(|v| AppError::Invalid { field: "job_type".into(), reason: requoted(v.reason, &self.job_type) })?;
        }
        if let Some(e) = too_long("error_type", &self.error_type, MAX_ERROR_TYPE_CHARS) {
            return Err(e);
        }
        if let Some(e) = too_long("text", &self.text, MAX_TEXT_CHARS) {
            return Err(e);
        }
        if !matches!(self.sort.as_str(), "" | "oldest" | "died" | "priority" | "scheduled") {
            return Err(AppError::Invalid { field: "sort".into(), reason: format!("{} is not an order this page offers", quoted(&self.sort)) });
        }
        let window_start = |field: &str, value: &str| {
            let secs = match value {
                "" => return Ok(None),
                "1h" => 3_600,
                "24h" => 86_400,
                "7d" => 7 * 86_400,
                other => return Err(AppError::Invalid { field: field.into(), reason: format!("{} is not 1h, 24h or 7d", quoted(other)) }),
            };
            Ok(now.checked_sub(jiff::SignedDuration::from_secs(secs)).ok())
        };
        Ok(rebound_queue::store::JobFilter {
            states,
            queue: non_empty(&self.queue),
            job_type: non_empty(&self.job_type),
            error_type: non_empty(&self.error_type),
            text: non_empty(&self.text),
            dead_letter: None,
            created_after: window_start("since", &self.since)?,
            created_before: None,
            dead_after: window_start("died", &self.died)?,
            dead_before: None,
        })
    }
}

/// The filter form: a plain GET form, so filtering works without JavaScript and the result is
/// a URL. `show_state` is off on the dead-letter page, where every job is discarded; that
/// page offers "Died" (when the job was dead-lettered) instead.
#[component]
pub fn FilterForm(action: &'static str, query: Memo<JobQuery>, show_state: bool) -> impl IntoView {
    let q = move || query.get();
    view! {
        <form class="filters" method="get" action=action>
            {show_state
                .then(|| {
                    view! {
                        <label>
                            "State"
                            <select name="state">
                                <option value="" selected=move || q().state.is_empty()>"any"</option>
                                {STATES
                                    .into_iter()
                                    .map(|s| view! { <option value=s selected=move || q().state == s>{s}</option> })
                                    .collect_view()}
                            </select>
                        </label>
                    }
                })}
            <label>"Queue" <input name="queue" placeholder="any" value=move || q().queue/></label>
            <label>"Type" <input name="job_type" placeholder="any" value=move || q().job_type/></label>
            <label>"Error type" <input name="error_type" placeholder="e.g. http.5xx or http.*" value=move || q().error_type/></label>
            <label>"Text" <input name="text" type="search" placeholder="in args or error message" value=move || q().text/></label>
            <WindowSelect label="Created" name="since" current=Signal::derive(move || q().since)/>
            {(!show_state).then(|| view! { <WindowSelect label="Died" name="died" current=Signal::derive(move || q().died)/> })}
            <label>
                "Order"
                <select name="sort">
                    <option value="" selected=move || q().sort.is_empty()>"newest created"</option>
                    <option value="oldest" selected=move || q().sort == "oldest">"oldest created"</option>
                    {show_state.then(|| view! {
                        <option value="priority" selected=move || q().sort == "priority">"highest priority"</option>
                        <option value="scheduled" selected=move || q().sort == "scheduled">"soonest scheduled"</option>
                    })}
                    {(!show_state).then(|| view! {
                        <option value="died" selected=move || q().sort == "died">"most recently died"</option>
                    })}
                </select>
            </label>
            <button type="submit">"Filter"</button>
            <a class="button-link" href=action>"Clear"</a>
        </form>
    }
}

/// A choice among [`SINCE_CHOICES`] (when jobs were created, or died), `current` selected.
#[component]
fn WindowSelect(label: &'static str, name: &'static str, current: Signal<String>) -> impl IntoView {
    view! {
        <label>
            {label}
            <select name=name>
                {SINCE_CHOICES
                    .into_iter()
                    .map(|(v, text)| view! { <option value=v selected=move || current.get() == v>{text}</option> })
                    .collect_view()}
            </select>
        </label>
    }
}

/// The filter as hidden `filter[...]` fields, so a bulk action acts on exactly the listed view.
#[component]
pub fn FilterHiddenFields(query: JobQuery) -> impl IntoView {
    view! {
        <input type="hidden" name="filter[state]" value=query.state/>
        <input type="hidden" name="filter[queue]" value=query.queue/>
        <input type="hidden" name="filter[job_type]" value=query.job_type/>
        <input type="hidden" name="filter[error_type]" value=query.error_type/>
        <input type="hidden" name="filter[text]" value=query.text/>
        <input type="hidden" name="filter[since]" value=query.since/>
        <input type="hidden" name="filter[died]" value=query.died/>
    }
}
