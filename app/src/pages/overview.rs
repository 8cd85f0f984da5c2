//! The overview: how much work is where, how it is going, and what is failing most.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::charts::{ThroughputBucket, ThroughputChart};
use crate::error::AppError;
use crate::feedback::ErrorBox;
use crate::filters::urlencode;
use crate::refresh::use_refresh;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateCount {
    pub state: String,
    pub count: i64,
}

/// Counts for one queue or one job type.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupCounts {
    pub name: String,
    pub total: i64,
    pub waiting: i64,
    pub active: i64,
    pub retryable: i64,
    pub completed: i64,
    pub dead_letters: i64,
    pub discarded: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorTypeCount {
    pub error_type: String,
    pub signature: String,
    pub count: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OverviewData {
    pub by_state: Vec<StateCount>,
    pub dead_letters: i64,
    pub by_queue: Vec<GroupCounts>,
    pub by_type: Vec<GroupCounts>,
    pub last_hour: Vec<ThroughputBucket>,
    pub last_day: Vec<ThroughputBucket>,
    pub top_failing_types: Vec<GroupCounts>,
    pub top_errors: Vec<ErrorTypeCount>,
}

#[server(endpoint = "overview")]
pub async fn overview() -> Result<OverviewData, AppError> {
    use std::collections::BTreeMap;

    use rebound_queue::JobState;
    use rebound_queue::store::JobFilter;

    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let stats = store.stats(None).await?;
    let by_state = JobState::ALL
        .into_iter()
        .map(|s| StateCount { state: s.as_str().to_string(), count: stats.by_state(s) })
        .collect();
    let dead_letters = stats.rows.iter().filter(|r| r.dead_letter).map(|r| r.count).sum();

    let mut queues: BTreeMap<String, GroupCounts> = BTreeMap::new();
    let mut types: BTreeMap<String, GroupCounts> = BTreeMap::new();
    for row in &stats.rows {
        for (map, key) in [(&mut queues, &row.queue), (&mut types, &row.job_type)] {
            let g = map.entry(key.clone()).or_insert_with(|| GroupCounts { name: key.clone(), ..Default::default() });
            g.total += row.count;
            match row.state {
                JobState::Scheduled | JobState::Available | JobState::Pending => g.waiting += row.count,
                JobState::Active => g.active += row.count,
                JobState::Retryable => g.retryable += row.count,
                JobState::Completed => g.completed += row.count,
                JobState::Discarded if row.dead_letter => g.dead_letters += row.count,
                JobState::Discarded => g.discarded += row.count,
                JobState::Cancelled => {}
            }
        }
    }
    let by_type: Vec<GroupCounts> = types.into_values().collect();
    let mut top_failing_types: Vec<GroupCounts> =
        by_type.iter().filter(|g| g.retryable + g.dead_letters + g.discarded > 0).cloned().collect();
    top_failing_types.sort_by_key(|g| std::cmp::Reverse(g.retryable + g.dead_letters + g.discarded));
    top_failing_types.truncate(5);

    let top_errors = store
        .dead_letter_groups(&JobFilter::dead_letters(), 5)
        .await?
        .into_iter()
        .map(|g| ErrorTypeCount { error_type: g.error_type.unwrap_or_default(), signature: g.signature, count: g.count })
        .collect();

    let minute_label = |t: jiff::Timestamp| t.strftime("%H:%M").to_string();
    let hour = store.throughput(60).await?;
    let last_hour = hour
        .into_iter()
        .map(|(t, completed, failed)| ThroughputBucket { label: minute_label(t), completed, failed })
        .collect();
    // A day per minute is 1 440 bars; half-hour buckets read better.
    let day = store.throughput(24 * 60).await?;
    let last_day = day
        .chunks(30)
        .map(|chunk| ThroughputBucket {
            label: chunk.first().map(|(t, _, _)| minute_label(*t)).unwrap_or_default(),
            completed: chunk.iter().map(|(_, c, _)| c).sum(),
            failed: chunk.iter().map(|(_, _, f)| f).sum(),
        })
        .collect();

    Ok(OverviewData {
        by_state,
        dead_letters,
        by_queue: queues.into_values().collect(),
        by_type,
        last_hour,
        last_day,
        top_failing_types,
        top_errors,
    })
}

#[component]
pub fn OverviewPage() -> impl IntoView {
    let tick = use_refresh();
    let data = Resource::new(move || tick.get(), |_| overview());
    view! {
        <h1>"Overview"</h1>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(d) => view! { <OverviewBody data=d/> }.into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn OverviewBody(data: OverviewData) -> impl IntoView {
    let OverviewData { by_state, dead_letters, by_queue, by_type, last_hour, last_day, top_failing_types, top_errors } = data;
    view! {
        <section class="cards">
            {by_state
                .into_iter()
                .map(|s| {
                    let href = format!("/jobs?state={}", s.state);
                    view! {
                        <a class=format!("card state-{}", s.state) href=href>
                            <span class="card-count">{s.count}</span>
                            <span class="card-label">{s.state.clone()}</span>
                        </a>
                    }
                })
                .collect_view()}
            <a class="card state-dead" href="/dead-letters">
                <span class="card-count">{dead_letters}</span>
                <span class="card-label">"dead letters"</span>
            </a>
        </section>
        <section class="two-col">
            <div class="panel">
                <h2>"Last hour"</h2>
                <ThroughputChart buckets=last_hour caption="Executions per minute"/>
            </div>
            <div class="panel">
                <h2>"Last 24 hours"</h2>
                <ThroughputChart buckets=last_day caption="Executions per 30 minutes"/>
            </div>
        </section>
        <section class="two-col">
            <div class="panel">
                <h2>"Top failing types"</h2>
                {if top_failing_types.is_empty() {
                    view! { <p class="muted">"Nothing is failing."</p> }.into_any()
                } else {
                    view! {
                        <table>
                            <thead><tr><th>"Type"</th><th class="num">"Retrying"</th><th class="num">"Dead letters"</th><th class="num">"Discarded"</th></tr></thead>
                            <tbody>
                                {top_failing_types
                                    .into_iter()
                                    .map(|g| {
                                        let retrying = format!("/jobs?state=retryable&job_type={}", urlencode(&g.name));
                                        let dead = format!("/dead-letters?job_type={}", urlencode(&g.name));
                                        view! {
                                            <tr>
                                                <td><a href=format!("/jobs?job_type={}", urlencode(&g.name))>{g.name.clone()}</a></td>
                                                <td class="num"><a href=retrying>{g.retryable}</a></td>
                                                <td class="num"><a href=dead>{g.dead_letters}</a></td>
                                                <td class="num">{g.discarded}</td>
                                            </tr>
                                        }
                                    })
                                    .collect_view()}
                            </tbody>
                        </table>
                    }
                    .into_any()
                }}
            </div>
            <div class="panel">
                <h2>"Top dead-letter errors " <small class="muted">"(latest dead letters)"</small></h2>
                {if top_errors.is_empty() {
                    view! { <p class="muted">"No dead letters."</p> }.into_any()
                } else {
                    view! {
                        <table>
                            <thead><tr><th>"Error"</th><th class="num">"Jobs"</th></tr></thead>
                            <tbody>
                                {top_errors
                                    .into_iter()
                                    .map(|e| {
                                        let href = format!("/dead-letters?error_type={}", urlencode(&e.error_type));
                                        view! { <tr><td><a href=href><code>{e.signature}</code></a></td><td class="num">{e.count}</td></tr> }
                                    })
                                    .collect_view()}
                            </tbody>
                        </table>
                    }
                    .into_any()
                }}
            </div>
        </section>
        <section class="two-col">
            <div class="panel">
                <h2>"By queue"</h2>
                <GroupTable groups=by_queue link_key="queue"/>
            </div>
            <div class="panel">
                <h2>"By type"</h2>
                <GroupTable groups=by_type link_key="job_type"/>
            </div>
        </section>
    }
}

#[component]
fn GroupTable(groups: Vec<GroupCounts>, link_key: &'static str) -> impl IntoView {
    if groups.is_empty() {
        return view! { <p class="muted">"No jobs yet."</p> }.into_any();
    }
    view! {
        <table>
            <thead>
                <tr>
                    <th>"Name"</th><th class="num">"Waiting"</th><th class="num">"Active"</th><th class="num">"Retrying"</th>
                    <th class="num">"Completed"</th><th class="num">"Dead"</th><th class="num">"Total"</th>
                </tr>
            </thead>
            <tbody>
                {groups
                    .into_iter()
                    .map(|g| {
                        let href = format!("/jobs?{link_key}={}", urlencode(&g.name));
                        view! {
                            <tr>
                                <td><a href=href>{g.name.clone()}</a></td>
                                <td class="num">{g.waiting}</td>
                                <td class="num">{g.active}</td>
                                <td class="num">{g.retryable}</td>
                                <td class="num">{g.completed}</td>
                                <td class="num">{g.dead_letters}</td>
                                <td class="num">{g.total}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}
