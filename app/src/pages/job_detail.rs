//! One job: its envelope, args and result, every attempt with its error, the effective retry
//! policy with where each field came from, the backoff schedule (past delays as they happened
//! and the planned ones with their jitter band), and the actions an operator can take.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use serde::{Deserialize, Serialize};

use crate::auth::{CsrfField, ReadOnlyNote, use_can_act};
use crate::charts::{DelayBar, DelayChart};
use crate::error::AppError;
use crate::feedback::{ActionResult, ErrorBox};
use crate::refresh::use_refresh;
use crate::time_text::{When, duration_text};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptView {
    pub attempt: i32,
    pub worker: Option<String>,
    pub started: Option<When>,
    pub finished: When,
    pub duration: Option<String>,
    pub outcome: String,
    pub error_type: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub error_details: Option<String>,
    pub delay: Option<String>,
    pub next_run: Option<When>,
}

/// One field of the effective policy and the layer it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyFieldView {
    pub name: String,
    pub value: String,
    /// `default`, `type` or `job`.
    pub source: String,
}

/// A retry still to come.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedView {
    pub retry: u32,
    /// The attempt it leads to.
    pub attempt: u32,
    pub delay_ms: u64,
    pub band_min_ms: u64,
    pub band_max_ms: u64,
    /// When it runs: exact for the retry already scheduled, else estimated assuming each
    /// attempt fails at once.
    pub at: When,
    pub earliest: When,
    pub latest: When,
    /// This retry is already scheduled (its delay is fixed).
    pub scheduled: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleView {
    pub planned: Vec<PlannedView>,
    /// What happens at the end, e.g. "exhausted ≈ 14:09 (after attempt 5), then dead-lettered".
    pub exhaustion: Option<String>,
    pub exhaustion_at: Option<When>,
    /// Why there is no plan (finished job, invalid policy, …).
    pub note: Option<String>,
    pub bars: Vec<DelayBar>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobDetail {
    pub id: String,
    pub job_type: String,
    pub queue: String,
    pub state: String,
    pub dead_letter: bool,
    pub attempt: i32,
    pub max_attempts: i32,
    /// Label/value rows of the envelope.
    pub envelope: Vec<(String, String)>,
    pub args: String,
    pub meta: String,
    pub result: Option<String>,
    pub last_error: Option<String>,
    pub retry_override: Option<String>,
    pub attempts: Vec<AttemptView>,
    pub policy: Vec<PolicyFieldView>,
    pub policy_error: Option<String>,
    pub schedule: ScheduleView,
    pub can_retry_now: bool,
    pub can_cancel: bool,
    pub can_discard: bool,
    pub can_redrive: bool,
    /// The workflow the job belongs to, if any.
    pub workflow: Option<String>,
}

#[server(endpoint = "load_job")]
pub async fn load_job(id: String) -> Result<JobDetail, AppError> {
    crate::auth::signed_in()?;
    let store = crate::state::store()?;
    let id = super::jobs::parse_id(&id)?;
    let job = store.job(id).await?;
    let attempts = store.attempts(id).await?;
    let now = store.now().await?;
    let resolved = match job.retry_patch() {
        Ok(patch) => store.effective_policy(&job.job_type, patch.as_ref()).await.map_err(AppError::from),
        Err(e) => Err(AppError::from(e)),
    };
    let mut detail = detail::build(&job, &attempts, resolved, now);
    if let Some(p) = store.latest_progress(id).await? {
        let at = When::of(p.at, now);
        let message = p.message.map(|m| format!(": {m}")).unwrap_or_default();
        detail.envelope.push(("Progress".into(), format!("{}%{message} (attempt {}, {} ({}))", p.percentage, p.attempt, at.at, at.relative)));
    }
    Ok(detail)
}

/// Retry now, cancel, discard or re-drive one job.
#[server(endpoint = "act_on_job")]
pub async fn act_on_job(csrf: String, id: String, action: String, #[server(default)] budget: String) -> Result<String, AppError> {
    use rebound_queue::store::{JobSelection, RedriveBudget, RedriveOptions};

    let actor = crate::auth::authorize_mutation(&csrf)?;
    let store = crate::state::store()?;
    let id = super::jobs::parse_id(&id)?;
    let sel = JobSelection::Ids(vec![id]);
    let touched = match action.as_str() {
        "retry_now" => store.retry_jobs_now(&sel, &actor).await?,
        "cancel" => store.cancel(id, Some(&actor)).await.map(|_| 1)?,
        "discard" => store.discard_jobs(&sel, &actor).await?,
        "redrive" => {
            let budget = if budget == "one_more" { RedriveBudget::OneMore } else { RedriveBudget::Fresh };
            store.redrive(&sel, &RedriveOptions { budget, stagger: None, actor, reason: None }).await?
        }
        other => return Err(AppError::Invalid { field: "action".into(), reason: format!("unknown action {}", crate::error::quoted(other)) }),
    };
    if touched == 0 {
        let state = store.job(id).await?.state;
        return Err(AppError::Conflict(format!("nothing done: the job is {state} now, which does not allow that")));
    }
    Ok(match action.as_str() {
        "retry_now" => "The job is available and will run as soon as a worker is free.".into(),
        "cancel" => "The job is cancelled.".into(),
        "discard" => "The job is discarded.".into(),
        _ => "The job was re-driven: it is available again.".into(),
    })
}

#[cfg(feature = "ssr")]
mod detail {
    use jiff::Timestamp;
    use rebound_queue::job::Attempt;
    use rebound_queue::policy::ResolvedPolicy;
    use rebound_queue::{Job, JobState};
    use rebound_queue::job::OnLimit;

    use super::*;

    fn pretty(v: &serde_json::Value) -> String {
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    }

    fn add_ms(t: Timestamp, ms: u64) -> Timestamp {
        let ms = i64::try_from(ms).unwrap_or(i64::MAX);
        t.checked_add(jiff::SignedDuration::from_millis(ms)).unwrap_or(Timestamp::MAX)
    }

    pub(super) fn build(job: &Job, attempts: &[Attempt], resolved: Result<ResolvedPolicy, AppError>, now: Timestamp) -> JobDetail {
        let w = |t: Timestamp| When::of(t, now);
        let opt = |t: Option<Timestamp>| t.map(|t| format!("{} ({})", w(t).at, w(t).relative));
        let mut envelope = vec![
            ("ID".to_string(), job.id.to_string()),
            ("Type".into(), job.job_type.clone()),
            ("Queue".into(), job.queue.clone()),
            ("State".into(), if job.dead_letter { "discarded (dead letter)".into() } else { job.state.to_string() }),
            ("Attempts".into(), format!("{} of {}", job.attempt, job.max_attempts)),
            ("Priority".into(), job.priority.to_string()),
            ("Created".into(), opt(Some(job.created_at)).unwrap_or_default()),
        ];
        let optional = [
            ("Scheduled / next run", job.next_run_at().or(Some(job.scheduled_at)).filter(|_| !job.state.is_terminal())),
            ("Enqueued", job.enqueued_at),
            ("Started", job.started_at),
            ("Completed", job.completed_at.filter(|_| job.state == JobState::Completed)),
            ("Cancelled", job.cancelled_at),
            ("Discarded", job.discarded_at),
            ("Dead-lettered", job.dead_lettered_at),
            ("Expires", job.expires_at),
            ("Lock expires", job.lock_expires_at),
        ];
        envelope.extend(optional.into_iter().filter_map(|(k, v)| opt(v).map(|v| (k.to_string(), v))));
        if let Some(w) = &job.locked_by {
            envelope.push(("Worker".into(), w.clone()));
        }
        if !job.tags.is_empty() {
            envelope.push(("Tags".into(), job.tags.join(", ")));
        }
        if let Some(ms) = job.timeout_ms {
            envelope.push(("Timeout".into(), duration_text(ms.max(0) as u64)));
        }
        if let Some(k) = &job.unique_key {
            envelope.push(("Unique key".into(), k.clone()));
        }
        if let Some(k) = &job.rate_limit_key {
            // Available but not picked up: say why, or an operator looks for a missing worker.
            let waiting = job.rate_limited && job.state == JobState::Available;
            envelope.push(("Rate-limit key".into(), if waiting { format!("{k} (waiting for a free slot or the key's next rate window)") } else { k.clone() }));
            let held = match job.on_limit {
                OnLimit::Wait => "wait for the key",
                OnLimit::Reschedule => "reschedule to when the key lets it start",
                OnLimit::Drop => "drop (discard without running)",
            };
            envelope.push(("When held by its key".into(), held.to_owned()));
        }

        let attempt_views = attempts
            .iter()
            .map(|a| AttemptView {
                attempt: a.attempt,
                worker: a.worker_id.clone(),
                started: a.started_at.map(w),
                finished: w(a.finished_at),
                duration: a.started_at.map(|s| duration_text((a.finished_at.as_millisecond() - s.as_millisecond()).max(0) as u64)),
                outcome: a.outcome.clone(),
                error_type: a.error_type.clone(),
                error_code: a.error_code.clone(),
                error_message: a.error_message.clone(),
                error_details: a.error_details.as_ref().filter(|d| !d.is_null()).map(pretty),
                delay: a.delay_ms.map(|d| duration_text(d.max(0) as u64)),
                next_run: a.next_run_at.map(w),
            })
            .collect();

        let (policy, policy_error, schedule) = match resolved {
            Ok(r) => {
                let wire = r.policy.to_json();
                let fields = r
                    .sources
                    .iter()
                    .map(|(name, source)| PolicyFieldView {
                        name: name.to_string(),
                        value: wire.get(*name).map(|v| v.to_string()).unwrap_or_default(),
                        source: source.as_str().to_string(),
                    })
                    .collect();
                (fields, None, schedule(job, attempts, &r.policy, now))
            }
            Err(e) => (
                Vec::new(),
                Some(e.to_string()),
                ScheduleView { planned: vec![], exhaustion: None, exhaustion_at: None, note: Some("No plan: the policy is invalid.".into()), bars: vec![] },
            ),
        };

        JobDetail {
            id: job.id.to_string(),
            job_type: job.job_type.clone(),
            queue: job.queue.clone(),
            state: job.state.to_string(),
            dead_letter: job.dead_letter,
            attempt: job.attempt,
            max_attempts: job.max_attempts,
            envelope,
            args: pretty(&job.args),
            meta: pretty(&job.meta),
            result: job.result.as_ref().map(pretty),
            last_error: job.last_error.as_ref().map(pretty),
            retry_override: job.retry.as_ref().map(pretty),
            attempts: attempt_views,
            policy,
            policy_error,
            schedule,
            can_retry_now: matches!(job.state, JobState::Scheduled | JobState::Retryable),
            can_cancel: !job.state.is_terminal(),
            workflow: job.extra.get("workflow_id").and_then(|v| v.as_str()).map(str::to_owned),
            can_discard: matches!(job.state, JobState::Scheduled | JobState::Available | JobState::Pending | JobState::Retryable),
            can_redrive: job.dead_letter,
        }
    }

    /// The planned retries from where the job is now. Estimated times assume each attempt
    /// fails as soon as it starts (run time is unknown), so they are the earliest plausible.
    pub(super) fn schedule(job: &Job, attempts: &[Attempt], policy: &rebound_queue::RetryPolicy, now: Timestamp) -> ScheduleView {
        let past_bars: Vec<DelayBar> = attempts
            .iter()
            .filter_map(|a| {
                a.delay_ms.map(|d| {
                    let d = d.max(0) as u64;
                    DelayBar { label: format!("#{}", a.attempt), delay_ms: d, band_min_ms: d, band_max_ms: d, past: true }
                })
            })
            .collect();
        let made = job.attempt.max(0) as u32;
        // (retries to plan from, when the next execution starts, is retry `made` already scheduled)
        let (from, start, first_scheduled) = match job.state {
            JobState::Retryable => (made, job.scheduled_at, true),
            JobState::Active => (made, now, false),
            JobState::Scheduled | JobState::Available | JobState::Pending => (made + 1, job.scheduled_at.max(now), false),
            JobState::Completed | JobState::Cancelled | JobState::Discarded => {
                let note = if job.dead_letter {
                    "The job is a dead letter: nothing is planned until it is re-driven."
                } else {
                    "The job has finished: nothing is planned."
                };
                return ScheduleView { planned: vec![], exhaustion: None, exhaustion_at: None, note: Some(note.into()), bars: past_bars };
            }
        };
        let plan = policy.planned_retries(from, 200);
        let actual_delay = job.retry_delay_ms.or_else(|| attempts.last().and_then(|a| a.delay_ms)).map(|d| d.max(0) as u64);
        let mut planned = Vec::with_capacity(plan.len());
        // Run time of the attempt whose failure triggers the next retry.
        let (mut t, mut lo, mut hi) = (start, start, start);
        let mut bars = past_bars;
        for (i, row) in plan.iter().enumerate() {
            let (delay, band_min, band_max) = (
                u64::try_from(row.delay.as_millis()).unwrap_or(u64::MAX),
                u64::try_from(row.band.0.as_millis()).unwrap_or(u64::MAX),
                u64::try_from(row.band.1.as_millis()).unwrap_or(u64::MAX),
            );
            let scheduled = first_scheduled && i == 0;
            // The retry already scheduled keeps the delay chosen when it failed (jitter and
            // the policy of that moment included), whatever the policy says now.
            let (delay, band_min, band_max) = match (scheduled, actual_delay) {
                (true, Some(d)) => (d, d, d),
                _ => (delay, band_min, band_max),
            };
            if !scheduled {
                t = add_ms(t, delay);
                lo = add_ms(lo, band_min);
                hi = add_ms(hi, band_max);
            }
            planned.push(PlannedView {
                retry: row.retry,
                attempt: row.attempt,
                delay_ms: delay,
                band_min_ms: band_min,
                band_max_ms: band_max,
                at: When::of(t, now),
                earliest: When::of(lo, now),
                latest: When::of(hi, now),
                scheduled,
            });
            if !scheduled {
                bars.push(DelayBar { label: format!("#{}", row.retry), delay_ms: delay, band_min_ms: band_min, band_max_ms: band_max, past: false });
            }
        }
        let last_attempt = policy.effective_max_attempts();
        let then = match policy.on_exhaustion {
            rebound_queue::policy::OnExhaustion::DeadLetter => "moves to the dead letters",
            rebound_queue::policy::OnExhaustion::Discard => "is discarded",
        };
        let exhaustion = format!("If attempt {last_attempt} fails too, the job is exhausted and {then}.");
        ScheduleView {
            planned,
            exhaustion: Some(exhaustion),
            exhaustion_at: Some(When::of(t, now)),
            note: None,
            bars,
        }
    }
}

#[component]
pub fn JobDetailPage() -> impl IntoView {
    let params = use_params_map();
    let id = Memo::new(move |_| params.with(|p| p.get("id").unwrap_or_default()));
    let tick = use_refresh();
    let act = ServerAction::<ActOnJob>::new();
    let data = Resource::new(move || (id.get(), tick.get(), act.version().get()), |(id, _, _)| load_job(id));
    view! {
        <p class="crumbs"><a href="/jobs">"Jobs"</a> " / job"</p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(d) => view! { <JobDetailBody d=d act=act/> }.into_any(),
                    Err(e) => view! { <ErrorBox error=e/> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn JobDetailBody(d: JobDetail, act: ServerAction<ActOnJob>) -> impl IntoView {
    let can_act = use_can_act();
    let state_class = if d.dead_letter { "state state-dead".to_string() } else { format!("state state-{}", d.state) };
    let state_label = if d.dead_letter { "dead letter".to_string() } else { d.state.clone() };
    let id = d.id.clone();
    let has_actions = d.can_retry_now || d.can_cancel || d.can_discard || d.can_redrive;
    view! {
        <h1 class="job-title">
            {d.job_type.clone()} " " <span class=state_class>{state_label}</span>
            <small class="mono">{d.id.clone()}</small>
        </h1>
        <ActionResult action=act/>
        {has_actions
            .then(|| {
                view! {
                    <section class="panel actions">
                        <h2>"Actions"</h2>
                        <ReadOnlyNote/>
                        <ActionForm action=act>
                            <CsrfField/>
                            <input type="hidden" name="id" value=id.clone()/>
                            {d.can_redrive
                                .then(|| {
                                    view! {
                                        <fieldset class="inline">
                                            <legend>"Re-drive with"</legend>
                                            <label><input type="radio" name="budget" value="fresh" checked/> "a fresh attempt budget"</label>
                                            <label><input type="radio" name="budget" value="one_more"/> "one more attempt"</label>
                                        </fieldset>
                                        <button type="submit" name="action" value="redrive" class="primary" disabled=move || !can_act.get()>"Re-drive"</button>
                                    }
                                })}
                            {d.can_retry_now.then(|| view! { <button type="submit" name="action" value="retry_now" class="primary" disabled=move || !can_act.get()>"Retry now"</button> })}
                            {d.can_cancel.then(|| view! { <button type="submit" name="action" value="cancel" disabled=move || !can_act.get()>"Cancel"</button> })}
                            {d.can_discard.then(|| view! { <button type="submit" name="action" value="discard" class="danger" disabled=move || !can_act.get()>"Discard"</button> })}
                        </ActionForm>
                    </section>
                }
            })}
        <section class="two-col">
            <div class="panel">
                <h2>"Envelope"</h2>
                <dl class="envelope">
                    {d.envelope.into_iter().map(|(k, v)| view! { <dt>{k}</dt><dd>{v}</dd> }).collect_view()}
                    {d.workflow.map(|w| view! { <dt>"Workflow"</dt><dd><a class="mono" href=format!("/workflows/{w}")>{w.clone()}</a></dd> })}
                </dl>
            </div>
            <div class="panel">
                <h2>"Args"</h2>
                <pre class="json">{d.args}</pre>
                <h2>"Meta"</h2>
                <pre class="json">{d.meta}</pre>
                {d.result.map(|r| view! { <h2>"Result"</h2><pre class="json">{r}</pre> })}
                {d.last_error.map(|e| view! { <h2>"Last error"</h2><pre class="json error-json">{e}</pre> })}
            </div>
        </section>
        <section class="panel">
            <h2>"Attempts"</h2>
            <AttemptTimeline attempts=d.attempts/>
        </section>
        <section class="two-col">
            <div class="panel">
                <h2>"Effective retry policy"</h2>
                {d.policy_error.map(|e| view! { <div class="alert error">{e}</div> })}
                <table class="policy-fields">
                    <thead><tr><th>"Field"</th><th>"Value"</th><th>"From"</th></tr></thead>
                    <tbody>
                        {d.policy
                            .into_iter()
                            .map(|f| {
                                view! {
                                    <tr>
                                        <td>{f.name}</td>
                                        <td><code>{f.value}</code></td>
                                        <td><span class=format!("source source-{}", f.source)>{f.source.clone()}</span></td>
                                    </tr>
                                }
                            })
                            .collect_view()}
                    </tbody>
                </table>
                <p class="muted">
                    "Defaults come from the built-in policy and the " <a href="/policies/edit?type=*">"* policy"</a> "; "
                    <a href=format!("/policies/edit?type={}", crate::filters::urlencode(&d.job_type))>"edit the " {d.job_type.clone()} " policy"</a> "."
                </p>
                {d.retry_override.map(|r| view! { <h3>"The job's own override"</h3><pre class="json">{r}</pre> })}
            </div>
            <div class="panel">
                <h2>"Backoff schedule"</h2>
                <BackoffSchedule s=d.schedule/>
            </div>
        </section>
    }
}

#[component]
fn AttemptTimeline(attempts: Vec<AttemptView>) -> impl IntoView {
    if attempts.is_empty() {
        return view! { <p class="muted">"Not run yet."</p> }.into_any();
    }
    view! {
        <table class="attempts">
            <thead>
                <tr>
                    <th class="num">"#"</th><th>"Worker"</th><th>"Started"</th><th>"Duration"</th><th>"Outcome"</th>
                    <th>"Error"</th><th>"Delay → next run"</th>
                </tr>
            </thead>
            <tbody>
                {attempts
                    .into_iter()
                    .map(|a| {
                        let started = a.started.clone().unwrap_or_else(|| a.finished.clone());
                        view! {
                            <tr>
                                // A row of a job that never ran (dropped by its rate-limit key)
                                // has no attempt to number.
                                <td class="num">{if a.attempt > 0 { a.attempt.to_string() } else { "–".to_owned() }}</td>
                                <td class="mono">{a.worker.unwrap_or_else(|| "–".into())}</td>
                                <td title=started.at.clone()>{started.at.clone()}</td>
                                <td>{a.duration.unwrap_or_else(|| "–".into())}</td>
                                <td><span class=format!("outcome outcome-{}", a.outcome)>{a.outcome.clone()}</span></td>
                                <td class="error-cell">
                                    {a.error_code.filter(|c| Some(c) != a.error_type.as_ref()).map(|c| view! { <code class="error-code" title="error code">{c}</code> " " })}
                                    {a.error_type.map(|t| view! { <code class="error-type">{t}</code> " " })}
                                    <span class="error-message">{a.error_message.unwrap_or_default()}</span>
                                    {a.error_details.map(|d| view! { <details><summary>"details"</summary><pre class="json">{d}</pre></details> })}
                                </td>
                                <td>
                                    {match (a.delay, a.next_run) {
                                        (Some(d), Some(n)) => view! { {d} " → " <span title=n.at.clone()>{n.at.clone()}</span> }.into_any(),
                                        (Some(d), None) => view! { {d} }.into_any(),
                                        _ => view! { "–" }.into_any(),
                                    }}
                                </td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

#[component]
fn BackoffSchedule(s: ScheduleView) -> impl IntoView {
    let has_bars = !s.bars.is_empty();
    let has_plan = !s.planned.is_empty();
    view! {
        <DelayChart bars=s.bars/>
        {has_bars
            .then(|| {
                view! {
                    <p class="legend">
                        <span class="swatch past"></span> "past delay (as it happened) "
                        <span class="swatch planned"></span> "planned delay, whisker = jitter band"
                    </p>
                }
            })}
        {s.note.map(|n| view! { <p class="note">{n}</p> })}
        {(!s.planned.is_empty())
            .then(|| {
                view! {
                    <table class="schedule">
                        <thead>
                            <tr><th class="num">"Retry"</th><th class="num">"→ attempt"</th><th>"Delay"</th><th>"Jitter band"</th><th>"Runs at (estimate)"</th><th>"Window"</th></tr>
                        </thead>
                        <tbody>
                            {s.planned
                                .into_iter()
                                .map(|p| {
                                    view! {
                                        <tr class:scheduled=p.scheduled>
                                            <td class="num">{p.retry}</td>
                                            <td class="num">{p.attempt}</td>
                                            <td>{duration_text(p.delay_ms)}</td>
                                            <td>
                                                {if p.band_min_ms == p.band_max_ms {
                                                    "none".to_string()
                                                } else {
                                                    format!("{} – {}", duration_text(p.band_min_ms), duration_text(p.band_max_ms))
                                                }}
                                            </td>
                                            <td>
                                                {p.at.at.clone()} " "
                                                <span class="muted">"(" {p.at.relative.clone()} ")"</span>
                                                {p.scheduled.then(|| view! { " " <span class="tag">"scheduled"</span> })}
                                            </td>
                                            <td class="muted">
                                                {if p.earliest.at == p.latest.at {
                                                    "exact (no jitter)".to_string()
                                                } else {
                                                    format!("{} – {}", p.earliest.at, p.latest.at)
                                                }}
                                            </td>
                                        </tr>
                                    }
                                })
                                .collect_view()}
                        </tbody>
                    </table>
                }
            })}
        {s.exhaustion.map(|e| {
            let at = s.exhaustion_at.map(|w| format!(" Earliest: {} ({}).", w.at, w.relative)).unwrap_or_default();
            view! { <p class="exhaustion">{e} {at}</p> }
        })}
        {has_plan.then(|| view! { <p class="muted">"Estimates assume each attempt fails as soon as it starts; a policy edit applies from the next failure."</p> })}
    }
}
