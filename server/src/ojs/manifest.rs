//! Discovery: the conformance manifest and the OJS health check.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::response::OwnBody;
use crate::AppState;
use crate::config::ApiAuth;

/// `GET /ojs/manifest`. The suites read `specversion`, the spec prose `ojs_version`: both.
///
/// It declares what is implemented and nothing more: conformance level 3 (core, reliability,
/// scheduling with cron, workflows nested three levels deep and dependency graphs), the
/// level-4 features Rebound has as capabilities, and each extension with what of it is
/// covered (`extension_details`).
pub async fn manifest(State(state): State<AppState>) -> Json<Value> {
    let mut extensions = vec![
        "urn:ojs:ext:admin-api",
        "urn:ojs:ext:dead-letter",
        "urn:ojs:ext:graceful-shutdown",
        "urn:ojs:ext:rate-limiting",
        "rebound:retry-policies",
        "rebound:events",
    ];
    if state.config.api_auth == ApiAuth::Token {
        extensions.push("auth:bearer");
    }
    Json(json!({
        "specversion": "1.0",
        "ojs_version": "1.0",
        "implementation": {
            "name": "rebound",
            "version": env!("CARGO_PKG_VERSION"),
            "language": "rust",
        },
        "conformance_level": 3,
        "protocols": ["http"],
        "backend": "postgres",
        "capabilities": {
            "batch_enqueue": true,
            "cron_jobs": true,
            "dead_letter": true,
            "delayed_jobs": true,
            "job_ttl": true,
            "priority_queues": true,
            "rate_limiting": true,
            "schema_validation": false,
            // ojs-unique-jobs §8.3. Enqueues of one key are serialized by a transaction-scoped
            // advisory lock on it, and the check and the insert run in that transaction.
            "unique_jobs": {
                "strength": "strong",
                "mechanism": "PostgreSQL: a per-key transaction-scoped advisory lock around the check and the insert",
                "on_conflict": ["reject", "ignore", "replace", "replace_except_schedule"],
            },
            "workflows": true,
            "pause_resume": true,
            "queue_stats": true,
        },
        "extensions": extensions,
        "extension_details": {
            "admin-api": {
                "implemented": ["queues", "queue detail", "pause/resume", "purge", "queue config (rate_limit; concurrency: the queue's concurrency limit across every worker; retention of its completed and discarded jobs)", "jobs (page/per_page, sort=created_at newest or oldest first, type exact or prefix.*)",
                                "job detail", "cancel", "retry", "bulk retry/cancel/delete", "workers", "quiet", "deregister stale",
                                "stats", "stats history (1m/5m/1h, all queues)", "dead letters", "system config", "maintenance mode"],
                "not_implemented": ["job sort by scheduled_at or priority (400: no index serves them over every filter at 10M jobs; sort=created_at with order=desc or asc is)"],
            },
            "dead-letter": {
                "implemented": ["list (offset or cursor), newest-created first or with sort=dead_lettered_at most recently dead-lettered first (by cursor)", "search by queue, type (exact or prefix.*), error_type (exact or prefix.*), q (args or message text), dead_since/dead_before (when it was dead-lettered; also in bulk retry and purge filters); a search pages by cursor", "get", "retry", "retry with override (queue, meta, retry, args, priority)", "bulk retry", "delete", "purge", "stats", "retention (worker pruner)",
                                "automatic replay rules (§7: GET /ojs/v1/dead-letter/replay-rules, GET|PUT|DELETE /ojs/v1/dead-letter/replay-rules/{name}; applied by the maintenance leader (a worker's replayer, or the server's pass when no worker runs), no sooner than a minute after death; max_replays counts a job's replays by every rule, in meta ojs.replay_count / ojs.last_replayed_at / ojs.replay_rule)"],
                "implemented_events": ["dead_letter.retried, dead_letter.deleted (per job, with who did it)", "dead_letter.replayed (per job, with the rule)", "dead_letter.pruned (per pass and queue, with the count)",
                                       "a job entering the queue is job.dead_lettered"],
                "not_implemented": ["dead_letter.added under that name (it is job.dead_lettered)"],
            },
            "graceful-shutdown": {
                "implemented": ["worker SIGTERM/SIGINT: stop claiming, drain within shutdown_grace, heartbeats during drain",
                                "heartbeat state quiet/terminate: no new jobs for that worker", "admin quiet directive",
                                "Rebound's worker: SIGTSTP and an operator's quiet stop its claims, an operator's terminate stops it", "ShutdownError nacks are retried"],
                "not_implemented": ["failing unfinished jobs with ShutdownError (Rebound's worker hands them back unfailed)"],
                "notes": "the worker's default shutdown_grace is 25s (the extension's default is 30s)",
            },
            "rate-limiting": {
                "implemented": ["queue-level concurrency, rate (fixed windows) and throttle, enforced in the claim statement",
                                "per-job keyed concurrency (options.rate_limit {key, concurrency}; RL-001..RL-004): a keyed job entering available takes a slot of its key if one is free, else waits, still available, out of the claimable set; each statement that frees a slot admits the key's next waiting job (highest priority first) in the same transaction, under the key's row lock (a waiting job another transaction held at that moment is admitted by the maintenance sweep); the newest enqueue naming a concurrency sets the key's limit",
                                "per-key rate windows (options.rate_limit.rate {limit, period}; RL-R001): at most limit jobs of the key admitted, so started, per period, fixed windows counted under the key's row lock as jobs are admitted (a window that begins counts the admitted jobs not yet claimed; every retry, re-drive or hand-back counts again; a job parked before any claim gives its count back); a job arriving while others wait joins the line by priority; on_limit drop discards a job its key's limit would leave waiting (rate_limit.dropped: key, job_id, job_type, queue; job.discarded), reschedule moves it to scheduled at the end of the key's hold, of an override of 0 with an end, or of its spent rate window, whichever is latest (held by the concurrency alone, it waits: no end can be named); not for a workflow's jobs; the jobs a window leaves waiting are admitted when it ends (the scheduler wakes then); the newest enqueue naming a rate sets it",
                                "per-key throttles (options.rate_limit.throttle {limit, period} or max_per_second n; RL-R002): the key's jobs admitted at least period/limit apart (an admitted job starts when claimed), a fixed window of one start counted as the rate window is; waiting jobs are admitted in line order as each spacing ends (a worker's scheduler wakes at the end, down to a millisecond; a server leading maintenance, at most every 20 ms); on_limit reschedule spreads the jobs it moves one spacing (and a tenth, at most 50 ms) apart, after those it moved before that are still to come; admitted jobs no worker has claimed count in the window after theirs but begin none; the newest enqueue naming a throttle sets it",
                                "GET /rate-limits (queue and keyed limits by key), GET/PUT /rate-limits/queue:<name>, GET /rate-limits/{key} (RL-005: concurrency limit/active/admitted/available, rate limit/period/current_count/window_resets_at, throttle limit/period/next_allowed_at, waiting_count, override, held_until)",
                                "PUT /rate-limits/{key}: an operator's override of a keyed limit ({concurrency, expires_at}; {} removes it; a lowered limit holds back admitted jobs not yet claimed)",
                                "PUT /rate-limits/queue:<name> with expires_at: an operator's override of the queue's concurrency ({concurrency, expires_at}, 0 stops the queue), in force over its limits as set until then (a null expires_at: until removed; a null concurrency and expires_at remove it; shown in the admin queue's configuration.concurrency_override); its end wakes the queue's workers",
                                "PUT /admin/queues/{name}/rate-limit",
                                "rate_limit.exceeded (per statement and key that left jobs waiting: key, strategy, limit, current, parked) and rate_limit.released (per admitted job: key, strategy, job_id, queue, job_type) (RL-006)",
                                "API request limits (§10.4): a bucket per API token (or client address without API authentication) per server process, X-RateLimit-Limit/-Remaining/-Reset on every authenticated answer, 429 rate_limited with a decimal Retry-After past it (--api-rate-limit, --api-rate-burst)",
                                "a cron template's rate_limit, shared by every job it makes",
                                "dynamic limits (RL-R003): a nack whose error carries rate_limit_until (or a Rust handler's error details with it, or a 429 with Retry-After answered to the worker's http handler) holds the job's key until then, at most a day: nothing admitted, admitted jobs not yet claimed held back; rate_limit.dynamic_adjusted (key, until, reason)"],
                "not_implemented": ["a rate or throttle in an override (422 unsupported: a key's windows are its jobs', a queue's are set without expires_at)"]
            },
            "events": {
                "implemented": ["job.enqueued, job.scheduled, job.started, job.heartbeat (worker and API heartbeats, with visible_until), job.progress, job.completed, job.failed, job.retrying, job.discarded, job.expired, job.cancelled",
                                "rebound's job.dead_lettered, job.released, job.snoozed; queue.paused, queue.resumed; cron.triggered, cron.skipped",
                                "ojs-timeouts' job.timeout and job.stalled (timeout_kind, limit_seconds, elapsed_seconds), just before the attempt's job.failed",
                                "the job's trace_id (meta.trace_id or traceparent) on every event of a traced job",
                                "workflow.started, workflow.step_completed, workflow.completed, workflow.failed",
                                "worker.started, worker.heartbeat (every worker and API heartbeat: active_jobs, queues, concurrency, status, and memory_mb and cpu_percent when the worker said them; an API heartbeat's hostname, pid, queues and concurrency are kept for the worker list), worker.quiet (SIGTSTP, an operator's quiet, or draining after SIGTERM: reason quiet or shutdown), worker.stopped (reason shutdown or heartbeat_timeout, uptime_ms, active_jobs)",
                                "GET /events: filters types, queues, job_types, job_id, since; newest first, or polled oldest first with after, cursor and has_more",
                                "Server-Sent Events: /events/stream?channel=job:<id>|queue:<name>, /jobs/{id}/events (ends when the job finishes), /queues/{name}/events, Last-Event-ID resume"],
                "not_implemented": ["WebSocket and gRPC subscriptions", "webhooks"],
                "notes": "events are read back from what the store records; a cursor passes an event only once it is settled (a second old, and no transaction that could still write an earlier one is open)",
            },
            "workflows": {
                "implemented": ["chain (each step given every earlier result as parent_results, an array by index), group, batch with on_complete / on_success / on_failure (fired exactly once, given every job's result)",
                                "POST /workflows (the spec's shape, and the HTTP binding's steps with id and depends_on: read as a chain, group or batch when they describe one, else as an acyclic graph), GET /workflows/{id} with every step's state, result and depends_on, DELETE /workflows/{id}",
                                "graphs: a step starts once every step it depends on has completed, given every upstream result by step id as parent_results; cycles and unknown ids are refused at creation",
                                "failure propagation: a chain stops at a step that failed for good and cancels the rest; a graph's failed step skips (cancels) what is downstream of it while other branches go on; failed_step_index, failed_job_ids, skipped_count, errors"],
                "implemented_events": ["workflow.started", "workflow.step_completed", "workflow.completed", "workflow.failed"],
                "max_nesting_depth": rebound_queue::store::MAX_WORKFLOW_DEPTH,
                "notes": "a nested workflow (a chain's step or a group's or batch's job given as a workflow) is tracked on its own and stands in its parent as a job finished by its end; deeper nesting is refused at creation",
            },
            "cron": {
                "implemented": ["5/6-field expressions, names, L W #, @yearly…@hourly", "@every <duration> (1 s to 365 days), anchored to its registration", "IANA time zones", "overlap skip/allow/cancel_previous/enqueue",
                                "register (upsert)/list/get/delete/PATCH enabled", "pause/resume/trigger", "exactly-once ticks across processes"],
                "implemented_events": ["cron.triggered", "cron.skipped (overlap_skip, dst_skip)"],
                "not_implemented": ["cron.skipped with reason disabled: a paused cron job has no next_run_at, so no tick of it is evaluated or skipped"],
            },
        },
        "endpoints": {
            "base_url": "/ojs/v1",
            "manifest": "/ojs/manifest",
            "health": "/ojs/v1/health",
        },
    }))
}

/// `GET /ojs/v1/health`: 200 `ok` when the database answers, else 503 `degraded`.
pub async fn health(State(state): State<AppState>) -> Response {
    let uptime = state.started_at.elapsed().as_secs();
    // It needs no token: one look at the database a second answers every caller (see `health`).
    match state.probes.ping(&state.store).await {
        Ok(latency) => Json(json!({
            "status": "ok",
            "version": "1.0",
            "uptime_seconds": uptime,
            "backend": {
                "type": "postgres",
                "status": "connected",
                "latency_ms": u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            },
        }))
        .into_response(),
        Err(()) => {
            let body = json!({
                "status": "degraded",
                "version": "1.0",
                "uptime_seconds": uptime,
                "backend": { "type": "postgres", "status": "disconnected", "error": "the database does not answer" },
            });
            let mut res = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
            res.extensions_mut().insert(OwnBody);
            res
        }
    }
}
