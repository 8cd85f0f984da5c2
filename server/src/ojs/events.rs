//! `GET /ojs/v1/events`: job and cron events read back from the store, newest first or polled
//! with a cursor; and the same as Server-Sent Event streams of a job or a queue.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use rebound_queue::job::{validate_queue, validate_type};
use rebound_queue::store::{
    CRON_EVENT_TYPES, CronEvent, DEAD_LETTER_EVENT_TYPES, DeadLetterEvent, EVENT_TYPES, EventFilter, JobEvent, QUEUE_EVENT_TYPES, QueueEvent,
    RATE_LIMIT_EVENT_TYPES, RateLimitEvent, WORKER_EVENT_TYPES, WORKFLOW_EVENT_TYPES, WorkerEvent, WorkflowEvent, position_at, position_time,
};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::body::{parse_uuid, path_uuid};
use super::error::ApiError;
use super::query::QueryParams;
use crate::AppState;

/// An event in the CloudEvents envelope OJS uses (ojs-events.md).
fn cloud_event(id: &str, event_type: &str, source: &str, time: Timestamp, subject: &str, data: Value) -> Value {
    json!({
        "specversion": "1.0",
        "id": id,
        "type": event_type,
        "source": source,
        "time": time.to_string(),
        "subject": subject,
        "data": data,
    })
}

fn event_json(e: &JobEvent) -> Value {
    let mut data = Map::new();
    data.insert("job_id".into(), Value::String(e.job_id.to_string()));
    data.insert("job_type".into(), Value::String(e.job_type.clone()));
    data.insert("queue".into(), Value::String(e.queue.clone()));
    if let Some(a) = e.attempt {
        data.insert("attempt".into(), json!(a));
    }
    if let Some(ms) = e.duration_ms {
        data.insert("duration_ms".into(), json!(ms));
    }
    if let Some(err) = &e.error {
        data.insert("error".into(), err.clone());
        // A job's end after its last failure (ojs-events `job.discarded`) names them so.
        if matches!(e.event_type.as_str(), "job.discarded" | "job.dead_lettered") {
            data.insert("last_error".into(), err.clone());
        }
    }
    if let (Some(a), "job.discarded" | "job.dead_lettered") = (e.attempt, e.event_type.as_str()) {
        data.insert("total_attempts".into(), json!(a));
    }
    // ojs-timeouts §11: which limit ran out, how long it was and how long the run took.
    if let Some(kind) = match e.event_type.as_str() {
        "job.timeout" => Some("execution"),
        "job.stalled" => Some("stalled"),
        _ => None,
    } {
        let details = e.error.as_ref().and_then(|err| err.get("details"));
        data.insert("timeout_kind".into(), details.and_then(|d| d.get("timeout_kind")).cloned().unwrap_or_else(|| json!(kind)));
        for key in ["limit_seconds", "elapsed_seconds"] {
            if let Some(v) = details.and_then(|d| d.get(key)) {
                data.insert(key.into(), v.clone());
            }
        }
    }
    if let Some(t) = &e.trace_id {
        data.insert("trace_id".into(), Value::String(t.clone()));
    }
    if let Some(w) = &e.worker_id {
        data.insert("worker_id".into(), Value::String(w.clone()));
    }
    for (key, t) in [("next_retry_at", e.next_retry_at), ("scheduled_at", e.scheduled_at), ("visible_until", e.visible_until)] {
        if let Some(t) = t {
            data.insert(key.into(), Value::String(t.to_string()));
        }
    }
    if let Some(n) = e.max_attempts {
        data.insert("max_attempts".into(), json!(n));
    }
    if let Some(p) = e.progress_percent {
        data.insert("progress_percent".into(), json!(p));
    }
    if let Some(m) = &e.progress_message {
        data.insert("progress_message".into(), Value::String(m.clone()));
    }
    cloud_event(&e.id, &e.event_type, "ojs://rebound/jobs", e.at, &e.job_id.to_string(), Value::Object(data))
}

fn worker_event_json(e: &WorkerEvent) -> Value {
    cloud_event(&e.id, &e.event_type, "ojs://rebound/workers", e.at, &e.worker_id, e.data.clone())
}

fn rate_limit_event_json(e: &RateLimitEvent) -> Value {
    cloud_event(&e.id, &e.event_type, "ojs://rebound/rate-limits", e.at, &e.key, e.data.clone())
}

fn workflow_event_json(e: &WorkflowEvent) -> Value {
    cloud_event(&e.id, &e.event_type, "ojs://rebound/workflows", e.at, &e.workflow_id.to_string(), e.data.clone())
}

fn dead_letter_event_json(e: &DeadLetterEvent) -> Value {
    let mut data = json!({ "queue": e.queue });
    if let Some(m) = data.as_object_mut() {
        if let Some(id) = e.job_id {
            m.insert("job_id".into(), Value::String(id.to_string()));
        }
        if let Some(t) = &e.job_type {
            m.insert("job_type".into(), Value::String(t.clone()));
        }
        match &e.actor {
            Some(actor) if e.event_type == "dead_letter.retried" => m.insert("retried_by".into(), Value::String(actor.clone())),
            Some(actor) if e.event_type == "dead_letter.replayed" => {
                m.insert("rule".into(), Value::String(actor.strip_prefix("system:replay-rule:").unwrap_or(actor).to_owned()))
            }
            Some(actor) => m.insert("deleted_by".into(), Value::String(actor.clone())),
            None => m.insert("count".into(), json!(e.count)),
        };
    }
    cloud_event(&e.id, &e.event_type, "ojs://rebound/dead-letter", e.at, &e.job_id.map_or_else(|| e.queue.clone(), |id| id.to_string()), data)
}

fn queue_event_json(e: &QueueEvent) -> Value {
    let by = if e.event_type == "queue.paused" { "paused_by" } else { "resumed_by" };
    cloud_event(&e.id, &e.event_type, "ojs://rebound/queues", e.at, &e.queue, json!({ "queue": e.queue, by: e.actor }))
}

fn cron_event_json(e: &CronEvent) -> Value {
    let mut data = json!({
        "cron_name": e.cron_name,
        "cron_expression": e.expression,
        "timezone": e.timezone,
        "scheduled_time": e.scheduled_time.to_string(),
        "actual_time": e.actual_time.to_string(),
    });
    if let Some(m) = data.as_object_mut() {
        if let Some(id) = e.job_id {
            m.insert("job_id".into(), Value::String(id.to_string()));
        }
        for (k, v) in [("job_type", &e.job_type), ("queue", &e.queue)] {
            if let Some(v) = v {
                m.insert(k.into(), Value::String(v.clone()));
            }
        }
        if e.manual {
            m.insert("manual".into(), Value::Bool(true));
        }
        if let Some(r) = e.reason {
            m.insert("reason".into(), Value::String(r.into()));
        }
        if let Some(n) = e.run_count {
            m.insert("run_count".into(), Value::from(n));
        }
        if let Some(id) = e.active_job_id {
            m.insert("active_job_id".into(), Value::String(id.to_string()));
        }
    }
    cloud_event(&e.id, e.event_type, "ojs://rebound/cron", e.actual_time, &e.cron_name, data)
}

/// The filters of an events request, checked.
struct Selection {
    /// Job events (`types`: the job event types asked for).
    job_filter: EventFilter,
    cron_types: Vec<String>,
    queue_types: Vec<String>,
    worker_types: Vec<String>,
    workflow_types: Vec<String>,
    dead_letter_types: Vec<String>,
    rate_limit_types: Vec<String>,
    jobs: bool,
    crons: bool,
    queues: bool,
    workers: bool,
    workflows: bool,
    dead_letters: bool,
    rate_limits: bool,
}

fn selection(q: &QueryParams) -> Result<Selection, ApiError> {
    let mut types = q.list("types");
    types.extend(q.list("type"));
    let groups: [&[&str]; 7] =
        [&EVENT_TYPES, &CRON_EVENT_TYPES, &QUEUE_EVENT_TYPES, &WORKER_EVENT_TYPES, &WORKFLOW_EVENT_TYPES, &DEAD_LETTER_EVENT_TYPES, &RATE_LIMIT_EVENT_TYPES];
    if let Some(bad) = types.iter().find(|t| !groups.iter().any(|g| g.contains(t))) {
        let all: Vec<&str> = groups.iter().flat_map(|g| g.iter()).copied().collect();
        return Err(ApiError::invalid_field("types", format!("unknown event type {bad:?}; expected one of {}", all.join(", "))));
    }
    let of = |group: &[&str]| -> Vec<String> { types.iter().filter(|t| group.contains(t)).map(|t| (*t).to_owned()).collect() };
    let (job_types_asked, cron_types, queue_types, worker_types) = (of(&EVENT_TYPES), of(&CRON_EVENT_TYPES), of(&QUEUE_EVENT_TYPES), of(&WORKER_EVENT_TYPES));
    let (dead_letter_types, workflow_types, rate_limit_types) = (of(&DEAD_LETTER_EVENT_TYPES), of(&WORKFLOW_EVENT_TYPES), of(&RATE_LIMIT_EVENT_TYPES));
    let mut queues = q.list("queues");
    queues.extend(q.list("queue"));
    for queue in &queues {
        validate_queue(queue).map_err(|e| ApiError::invalid_field("queues", e.reason))?;
    }
    let mut job_types = q.list("job_types");
    job_types.extend(q.list("job_type"));
    for t in &job_types {
        validate_type(t).map_err(|e| ApiError::invalid_field("job_types", e.reason))?;
    }
    let since = match q.one("since")? {
        None => None,
        // Bounded like every time the API reads: Postgres would not read jiff's spelling of
        // a year before 1 (`-009999-…`), and the query would fail instead of the request.
        Some(s) => Some(super::envelope::parse_time(s, Timestamp::now()).map_err(|r| ApiError::invalid_field("since", r))?),
    };
    let everything = types.is_empty();
    Ok(Selection {
        jobs: everything || !job_types_asked.is_empty(),
        crons: everything || !cron_types.is_empty(),
        queues: everything || !queue_types.is_empty(),
        workers: everything || !worker_types.is_empty(),
        workflows: everything || !workflow_types.is_empty(),
        workflow_types,
        dead_letters: everything || !dead_letter_types.is_empty(),
        dead_letter_types,
        rate_limits: everything || !rate_limit_types.is_empty(),
        rate_limit_types,
        cron_types,
        queue_types,
        worker_types,
        job_filter: EventFilter {
            types: job_types_asked,
            queues: queues.into_iter().map(str::to_owned).collect(),
            job_types: job_types.into_iter().map(str::to_owned).collect(),
            job_id: q.uuid("job_id")?,
            since,
            ..EventFilter::default()
        },
    })
}

/// A cursor from a client (`after`, `Last-Event-ID`): an event id or a position.
fn cursor(field: &str, raw: &str) -> Result<String, ApiError> {
    position_time(raw).map_err(|_| ApiError::invalid_field(field, format!("{raw:?} is not an event id or cursor of this server (evt_<16 digits>:…)")))?;
    Ok(raw.to_owned())
}

/// One page of events: newest first, or oldest first after `after` (up to the settled
/// horizon, so a cursor never passes an event still being written). Also answers where an
/// `after` poll continues from and whether the page was cut short.
struct Page {
    /// (id, ends a job's stream, envelope).
    events: Vec<(String, bool, Value)>,
    cursor: String,
    has_more: bool,
}

async fn page(state: &AppState, sel: &Selection, after: Option<String>, limit: i64) -> Result<Page, ApiError> {
    let horizon = state.store.event_horizon().await?;
    // A cursor far behind reads one window at a time: failed attempts are sorted by time,
    // every one from the cursor on (seconds from weeks back at 10M jobs). Windows with nothing
    // in them are stepped over in this one request, each twice as long as the last (up to
    // MAX_EVENT_WINDOW) and for at most SKIP_BUDGET, so a cursor from last week catches up in
    // a few polls instead of a thousand empty ones.
    let mut after = after;
    let mut window = EVENT_WINDOW;
    let skipping_since = std::time::Instant::now();
    let (all, until) = loop {
        let until = match &after {
            Some(a) => Some(horizon.min(position_time(a).map_err(|_| ApiError::invalid_field("after", "not an event id"))?.saturating_add(window).unwrap_or(horizon))),
            None => None,
        };
        let all = read(state, sel, after.clone(), until, limit).await?;
        let Some(u) = until.filter(|u| all.is_empty() && *u < horizon && skipping_since.elapsed() < SKIP_BUDGET) else {
            break (all, until);
        };
        after = Some(position_at(u));
        window = window.saturating_mul(2).min(MAX_EVENT_WINDOW);
    };
    Ok(finish_page(all, after, until, horizon, limit))
}

/// Every asked-for event source's events after `after` (up to `until`), one more than `limit`
/// of each (which tells whether there are more), unsorted.
async fn read(state: &AppState, sel: &Selection, after: Option<String>, until: Option<Timestamp>, limit: i64) -> Result<Vec<(String, Timestamp, bool, Value)>, ApiError> {
    let filter = EventFilter {
        after,
        until,
        limit: limit + 1,
        ..sel.job_filter.clone()
    };
    let jobs = if sel.jobs { state.store.events(&filter).await? } else { Vec::new() };
    let crons = if sel.crons { state.store.cron_events(&EventFilter { types: sel.cron_types.clone(), ..filter.clone() }).await? } else { Vec::new() };
    let queues = if sel.queues { state.store.queue_events(&EventFilter { types: sel.queue_types.clone(), ..filter.clone() }).await? } else { Vec::new() };
    let workers = if sel.workers { state.store.worker_events(&EventFilter { types: sel.worker_types.clone(), ..filter.clone() }).await? } else { Vec::new() };
    let workflows = if sel.workflows { state.store.workflow_events(&EventFilter { types: sel.workflow_types.clone(), ..filter.clone() }).await? } else { Vec::new() };
    let dead_letters = if sel.dead_letters {
        state.store.dead_letter_events(&EventFilter { types: sel.dead_letter_types.clone(), ..filter.clone() }).await?
    } else {
        Vec::new()
    };
    let rate_limits = if sel.rate_limits {
        state.store.rate_limit_events(&EventFilter { types: sel.rate_limit_types.clone(), ..filter.clone() }).await?
    } else {
        Vec::new()
    };
    Ok(jobs
        .iter()
        .map(|e| (e.id.clone(), e.at, job_terminal(&e.event_type), event_json(e)))
        .chain(crons.iter().map(|e| (e.id.clone(), e.actual_time, false, cron_event_json(e))))
        .chain(queues.iter().map(|e| (e.id.clone(), e.at, false, queue_event_json(e))))
        .chain(workers.iter().map(|e| (e.id.clone(), e.at, false, worker_event_json(e))))
        .chain(workflows.iter().map(|e| (e.id.clone(), e.at, false, workflow_event_json(e))))
        .chain(dead_letters.iter().map(|e| (e.id.clone(), e.at, false, dead_letter_event_json(e))))
        .chain(rate_limits.iter().map(|e| (e.id.clone(), e.at, false, rate_limit_event_json(e))))
        .collect())
}

/// Orders, cuts and positions what [`read`] found after `after` up to `until`.
fn finish_page(mut all: Vec<(String, Timestamp, bool, Value)>, after: Option<String>, until: Option<Timestamp>, horizon: Timestamp, limit: i64) -> Page {
    if after.is_some() {
        all.sort_by(|a, b| a.0.cmp(&b.0));
    } else {
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    }
    let limit = usize::try_from(limit).unwrap_or(100);
    // More beyond this page, or beyond the window it read.
    let has_more = all.len() > limit || until.is_some_and(|u| u < horizon);
    all.truncate(limit);
    let settled = position_at(horizon);
    let cursor = match (&after, all.last()) {
        // Oldest first: on from the last one delivered, or, with none, to the end of what was
        // read (the window, at most up to the horizon).
        (Some(_), Some(last)) => last.0.clone(),
        (Some(from), None) => from.clone().max(position_at(until.unwrap_or(horizon))),
        // Newest first: a poll from the horizon misses nothing still being written (it may
        // repeat some of this page: delivery is at least once, ids deduplicate).
        (None, _) => settled,
    };
    Page { events: all.into_iter().map(|(id, _, terminal, v)| (id, terminal, v)).collect(), cursor, has_more }
}

/// Whether a job's stream ends after an event of this type.
fn job_terminal(event_type: &str) -> bool {
    matches!(event_type, "job.completed" | "job.cancelled" | "job.discarded" | "job.dead_lettered" | "job.expired")
}

/// `?types=job.completed,job.failed,cron.triggered&queues=q1,q2&job_types=email.send&job_id=&since=&after=&limit=`:
/// job events, cron events (`cron.triggered`, `cron.skipped`), queue events
/// (`queue.paused`, `queue.resumed`), worker, workflow, dead-letter and rate-limit events. Newest first; with `after`
/// (an event id or a `cursor` from an earlier answer) oldest first from there, for polling
/// (OJS events §6.4): the answer's `cursor` is where the next poll continues and `has_more`
/// says whether this page was cut at `limit`.
///
/// `cursor` is accepted for `after` (ojs-http-binding §17), and the answer carries the
/// binding's `pagination` too: `has_more` and, when there is more, `next_cursor` (the same as
/// `cursor`). It has no `total`: counting every event that matches would read the whole history.
pub async fn list(State(state): State<AppState>, q: QueryParams) -> Result<Json<Value>, ApiError> {
    q.only(&["types", "type", "queues", "queue", "job_types", "job_type", "job_id", "since", "after", "cursor", "limit"])?;
    let sel = selection(&q)?;
    let after = match (q.one("after")?, q.one("cursor")?) {
        (Some(_), Some(_)) => return Err(ApiError::invalid_field("cursor", "give after or cursor, not both")),
        (Some(a), None) => Some(cursor("after", a)?),
        (None, Some(c)) => Some(cursor("cursor", c)?),
        (None, None) => None,
    };
    let limit = q.i64_in("limit", 1, 1000)?.unwrap_or(100);
    let page = page(&state, &sel, after, limit).await?;
    let mut pagination = json!({ "has_more": page.has_more, "limit": limit });
    if let (true, Some(p)) = (page.has_more, pagination.as_object_mut()) {
        p.insert("next_cursor".into(), Value::String(page.cursor.clone()));
    }
    Ok(Json(json!({
        "events": page.events.into_iter().map(|(_, _, v)| v).collect::<Vec<_>>(),
        "cursor": page.cursor,
        "has_more": page.has_more,
        "pagination": pagination,
    })))
}

/// The time in a UUIDv7 (its first 48 bits, milliseconds since the epoch).
fn id_time(id: &Uuid) -> Option<Timestamp> {
    let bytes = id.as_bytes();
    let millis = bytes[..6].iter().fold(0i64, |acc, b| (acc << 8) | i64::from(*b));
    Timestamp::from_millisecond(millis).ok()
}

/// The most history one page after a cursor reads; `has_more` says when there is more.
const EVENT_WINDOW: jiff::SignedDuration = jiff::SignedDuration::from_secs(600);

/// The longest window read after empty ones: six hours, so a burst after a long quiet spell
/// costs one read of at most six hours of failed attempts (they are sorted; the other kinds
/// are read in order up to the limit), not one over the whole spell. At 10M jobs an empty
/// window costs about 10 ms, so one poll steps over about six days.
const MAX_EVENT_WINDOW: jiff::SignedDuration = jiff::SignedDuration::from_secs(6 * 3600);

/// How long one request steps over empty windows before it answers with the cursor moved on.
const SKIP_BUDGET: Duration = Duration::from_millis(250);

/// How often an open stream looks for new events while they come.
const STREAM_POLL: Duration = Duration::from_millis(500);

/// How many empty polls in a row a stream makes at [`STREAM_POLL`] before it slows down: a
/// couple of seconds, so a job's next step or a burst's tail still arrives promptly.
const QUIET_POLLS: u32 = 4;

/// The slowest a quiet stream polls: an idle stream costs a sixth of a busy one, and an event
/// after a quiet spell arrives at most this much later than it would have.
const MAX_STREAM_POLL: Duration = Duration::from_secs(3);

/// The reconnection delay a stream asks EventSource clients for (SSE `retry:`, sent first):
/// short, since a stream ends at its lifetime or the server's and a reconnection with
/// `Last-Event-ID` resumes where it ended.
const STREAM_RETRY: Duration = Duration::from_secs(1);

/// `Retry-After` of a stream refused because every place is taken. Refusals cost no database
/// work, so clients may come back soon; places free as streams end or reach their lifetime.
const STREAMS_FULL_RETRY_SECS: u64 = 5;

/// How long a stream waits before its next poll after `quiet` empty polls in a row:
/// [`STREAM_POLL`] at first, then twice as long each time up to [`MAX_STREAM_POLL`].
fn poll_delay(quiet: u32) -> Duration {
    let doublings = quiet.saturating_sub(QUIET_POLLS).min(16);
    STREAM_POLL.saturating_mul(1 << doublings).min(MAX_STREAM_POLL)
}

/// What a stream follows.
enum Channel {
    /// One job, from its first event; the stream ends after a terminal one.
    Job(Uuid),
    /// Every job of a queue, from now.
    Queue(String),
}

/// `GET /ojs/v1/events/stream?channel=job:<id>|queue:<name>` (the channel the OJS SDKs'
/// `subscribe` asks for), with the list's filters (`types`, `job_types`, …) as well.
pub async fn stream(State(state): State<AppState>, q: QueryParams, headers: HeaderMap) -> Result<Response, ApiError> {
    q.only(&["channel", "types", "type", "job_types", "job_type"])?;
    let raw = q.one("channel")?.ok_or_else(|| ApiError::invalid_field("channel", "required: job:<id> or queue:<name>"))?;
    let channel = match raw.split_once(':') {
        Some(("job", id)) => Channel::Job(parse_uuid(id).map_err(|r| ApiError::invalid_field("channel", r))?),
        Some(("queue", name)) => {
            validate_queue(name).map_err(|e| ApiError::invalid_field("channel", e.reason))?;
            Channel::Queue(name.to_owned())
        }
        _ => return Err(ApiError::invalid_field("channel", format!("{raw:?}: expected job:<id> or queue:<name>"))),
    };
    open_stream(state, channel, selection(&q)?, &headers).await
}

/// `GET /ojs/v1/jobs/{id}/events`: the job's events as Server-Sent Events, from its first;
/// the stream ends after the job finishes (completed, cancelled, discarded, dead-lettered).
pub async fn job_stream(State(state): State<AppState>, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    let id = path_uuid(&id)?;
    open_stream(state, Channel::Job(id), selection(&QueryParams::default())?, &headers).await
}

/// `GET /ojs/v1/queues/{name}/events`: the queue's job events as Server-Sent Events, from now.
pub async fn queue_stream(State(state): State<AppState>, Path(name): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    validate_queue(&name).map_err(|e| ApiError::invalid_field("name", e.reason))?;
    open_stream(state, Channel::Queue(name), selection(&QueryParams::default())?, &headers).await
}

/// Streams the channel's events from `Last-Event-ID` if the client resumes, else from the
/// channel's start, polling through the same pages as the list (so a stream never passes an
/// event still being written, and a resumed one repeats none): every [`STREAM_POLL`], slower
/// while nothing happens ([`poll_delay`]). Holds one of the server's stream places
/// (`max_event_streams`) until the client goes; ends after `event_stream_lifetime` or when the
/// server shuts down, first telling the client where to resume.
async fn open_stream(state: AppState, channel: Channel, mut sel: Selection, headers: &HeaderMap) -> Result<Response, ApiError> {
    // Taken before any database work, so refusals cost none; held by the stream itself, so a
    // client hanging up (the body dropped) frees it.
    let Ok(place) = state.event_streams.clone().try_acquire_owned() else {
        return Ok(streams_full(state.config.max_event_streams));
    };
    let resume = match headers.get("last-event-id") {
        Some(v) => Some(cursor("Last-Event-ID", v.to_str().map_err(|_| ApiError::invalid_field("Last-Event-ID", "not text"))?)?),
        None => None,
    };
    let from = match &channel {
        Channel::Job(id) => {
            let job = state.store.get_job(*id).await?.ok_or_else(|| ApiError::not_found("job", id))?;
            sel.job_filter.job_id = Some(*id);
            (sel.crons, sel.queues, sel.workers, sel.dead_letters, sel.rate_limits) = (false, false, false, false, false);
            // From its first event: its enqueue, positioned by its creation or by the time in
            // its id (client-chosen ids may be older), whichever is earlier.
            let made = id_time(id).map_or(job.created_at, |t| t.min(job.created_at));
            resume.unwrap_or_else(|| position_at(made.saturating_sub(jiff::SignedDuration::from_secs(1)).unwrap_or(made)))
        }
        Channel::Queue(name) => {
            sel.job_filter.queues = vec![name.clone()];
            match resume {
                Some(r) => r,
                None => position_at(state.store.event_horizon().await?),
            }
        }
    };
    let ends_at_terminal = matches!(channel, Channel::Job(_));
    let shutdown = state.shutdown.clone();
    let now = tokio::time::Instant::now();
    // Capped at a century: a longer lifetime could overflow the clock, and is none anyway.
    let ends_at = now + state.config.event_stream_lifetime.min(Duration::from_secs(100 * 365 * 86_400));
    struct Tail {
        state: AppState,
        sel: Selection,
        cursor: String,
        /// Where a client resuming now would continue from: the last id it was sent.
        told: String,
        pending: std::collections::VecDeque<(String, bool, Value)>,
        /// When to read next: now when the last page said there is more.
        next_poll: tokio::time::Instant,
        /// Polls in a row that found nothing.
        quiet: u32,
        ends_at: tokio::time::Instant,
        done: bool,
        _place: tokio::sync::OwnedSemaphorePermit,
    }
    let tail = Tail { state, sel, told: from.clone(), cursor: from, pending: Default::default(), next_poll: now, quiet: 0, ends_at, done: false, _place: place };
    let events = futures::stream::unfold(tail, move |mut t| {
        let shutdown = shutdown.clone();
        async move {
            loop {
                if let Some((id, terminal, v)) = t.pending.pop_front() {
                    if ends_at_terminal && terminal {
                        t.pending.clear();
                        t.done = true;
                    }
                    let kind = v.get("type").and_then(Value::as_str).unwrap_or("message").to_owned();
                    let event = Event::default().id(&id).event(kind).data(v.to_string());
                    t.told = id;
                    return Some((Ok::<Event, Infallible>(event), t));
                }
                if t.done {
                    return None;
                }
                let now = tokio::time::Instant::now();
                if now >= t.ends_at || shutdown.is_cancelled() {
                    t.done = true;
                    // The cursor may be past the last event sent (quiet windows read through).
                    // An event with only an id sets the client's Last-Event-ID and dispatches
                    // nothing, so the resumed stream does not read that stretch again, and a
                    // queue's stream that was sent nothing resumes here rather than from the
                    // reconnection's now, missing nothing in between.
                    if t.cursor != t.told {
                        let event = Event::default().id(&t.cursor);
                        return Some((Ok(event), t));
                    }
                    return None;
                }
                if now < t.next_poll {
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep_until(t.next_poll.min(t.ends_at)) => {}
                    }
                    continue;
                }
                match page(&t.state, &t.sel, Some(t.cursor.clone()), 100).await {
                    Ok(p) => {
                        t.quiet = if p.events.is_empty() { t.quiet.saturating_add(1) } else { 0 };
                        t.next_poll = if p.has_more { now } else { tokio::time::Instant::now() + poll_delay(t.quiet) };
                        t.cursor = p.cursor;
                        t.pending.extend(p.events);
                    }
                    // The database is away: the stream waits for it rather than ending, and asks
                    // less often the longer it stays away.
                    Err(e) => {
                        tracing::warn!(error = ?e, "event stream: reading events failed; trying again");
                        t.quiet = t.quiet.saturating_add(1);
                        t.next_poll = tokio::time::Instant::now() + poll_delay(t.quiet);
                    }
                }
            }
        }
    });
    let hello = futures::stream::once(async { Ok::<Event, Infallible>(Event::default().retry(STREAM_RETRY)) });
    Ok(Sse::new(futures::StreamExt::chain(hello, events)).keep_alive(KeepAlive::default()).into_response())
}

/// `429`: every stream place is taken.
fn streams_full(limit: usize) -> Response {
    let err = ApiError::rate_limited(
        format!("event streams are at their limit: {limit} open at once on this server"),
        "retry later, or poll GET /ojs/v1/events with after= instead of streaming",
    )
    .detail("limit", limit)
    .detail("retry_after_seconds", STREAMS_FULL_RETRY_SECS);
    let mut res = err.into_response();
    res.headers_mut().insert(RETRY_AFTER, HeaderValue::from(STREAMS_FULL_RETRY_SECS));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_streams_poll_less_often_up_to_a_ceiling() {
        let schedule: Vec<u64> = (0..10).map(|quiet| poll_delay(quiet).as_millis() as u64).collect();
        // As often as ever for a few quiet polls, then doubling, then at most MAX_STREAM_POLL.
        assert_eq!(schedule, [500_u64, 500, 500, 500, 500, 1000, 2000, 3000, 3000, 3000]);
        assert_eq!(poll_delay(u32::MAX), MAX_STREAM_POLL, "no overflow however long a stream stays quiet");
        // An event resets the count, so the next poll is as soon as today's.
        assert_eq!(poll_delay(0), STREAM_POLL);
    }
}
