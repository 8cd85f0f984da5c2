//! A table of hostile inputs per endpoint: each must get a 4xx with the OJS error body naming
//! the field, never a 5xx, and nothing may be written.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::common::TestServer;

const JSON: &str = "application/openjobspec+json";

/// One hostile request and what must come back.
struct Case {
    name: &'static str,
    method: &'static str,
    path: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    /// `details.field` of the error; `None` when the error is about the body as a whole.
    field: Option<&'static str>,
    /// `error.code`, when it matters.
    code: Option<&'static str>,
}

fn case(name: &'static str, method: &'static str, path: &str, body: Value, status: u16, field: &'static str) -> Case {
    Case { name, method, path: path.to_owned(), content_type: Some(JSON), body: body.to_string().into_bytes(), status, field: Some(field), code: None }
}

fn raw(name: &'static str, method: &'static str, path: &str, body: &[u8], status: u16, code: &'static str) -> Case {
    Case { name, method, path: path.to_owned(), content_type: Some(JSON), body: body.to_vec(), status, field: None, code: Some(code) }
}

fn get(name: &'static str, path: &str, status: u16, field: &'static str) -> Case {
    Case { name, method: "GET", path: path.to_owned(), content_type: None, body: Vec::new(), status, field: Some(field), code: None }
}

fn job(options: Value) -> Value {
    json!({"type": "hostile.test", "args": [], "options": options})
}

fn table() -> Vec<Case> {
    let jobs = "/ojs/v1/jobs";
    let batch = "/ojs/v1/jobs/batch";
    let fetch = "/ojs/v1/workers/fetch";
    let ack = "/ojs/v1/workers/ack";
    let nack = "/ojs/v1/workers/nack";
    let beat = "/ojs/v1/workers/heartbeat";
    let progress = "/ojs/v1/workers/progress";
    let policy = "/ojs/v1/admin/policies/email.send";
    let preview = "/ojs/v1/admin/policies/preview";
    let some_id = "019539a4-0000-7000-8000-000000000000";
    let nested = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    let mut deep_job = br#"{"type":"a","args":"#.to_vec();
    deep_job.extend_from_slice(nested.as_bytes());
    deep_job.push(b'}');

    vec![
        // POST /ojs/v1/jobs: the body itself.
        raw("malformed JSON", "POST", jobs, b"{ invalid json }", 400, "invalid_payload"),
        raw("empty body", "POST", jobs, b"", 400, "invalid_payload"),
        raw("whitespace body", "POST", jobs, b"  \n ", 400, "invalid_payload"),
        raw("truncated JSON", "POST", jobs, br#"{"type": "a", "args": ["#, 400, "invalid_payload"),
        raw("nesting beyond the parser's limit", "POST", jobs, &deep_job, 400, "invalid_payload"),
        raw("invalid UTF-8", "POST", jobs, b"{\"type\": \"\xff\xfe\", \"args\": []}", 400, "invalid_payload"),
        case("array body", "POST", jobs, json!([1, 2]), 400, "body"),
        case("string body", "POST", jobs, json!("job"), 400, "body"),
        // ojs-http-binding §4.1: a 400, not HTTP's usual 415.
        Case { content_type: Some("text/plain"), field: Some("Content-Type"), ..case("wrong content type", "POST", jobs, json!({"type": "a", "args": []}), 400, "Content-Type") },
        // POST /ojs/v1/jobs: fields.
        case("missing type", "POST", jobs, json!({"args": []}), 400, "type"),
        case("type of the wrong type", "POST", jobs, json!({"type": 5, "args": []}), 400, "type"),
        case("malformed type", "POST", jobs, json!({"type": "Email Send!", "args": []}), 400, "type"),
        case("missing args", "POST", jobs, json!({"type": "a"}), 400, "args"),
        case("args not an array", "POST", jobs, json!({"type": "a", "args": {"x": 1}}), 400, "args"),
        case("meta not an object", "POST", jobs, json!({"type": "a", "args": [], "meta": [1]}), 400, "meta"),
        case("uppercase id", "POST", jobs, json!({"type": "a", "args": [], "id": "019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F"}), 400, "id"),
        case("UUIDv4 id", "POST", jobs, json!({"type": "a", "args": [], "id": "550e8400-e29b-41d4-a716-446655440000"}), 400, "id"),
        case("options not an object", "POST", jobs, json!({"type": "a", "args": [], "options": "fast"}), 400, "options"),
        case("priority too high", "POST", jobs, job(json!({"priority": 101})), 400, "options.priority"),
        case("priority huge", "POST", jobs, job(json!({"priority": 99_999_999_999_i64})), 400, "options.priority"),
        case("priority a string", "POST", jobs, job(json!({"priority": "high"})), 400, "options.priority"),
        case("priority fractional", "POST", jobs, job(json!({"priority": 1.5})), 400, "options.priority"),
        case("queue malformed", "POST", jobs, job(json!({"queue": "Bad Queue"})), 400, "options.queue"),
        case("queue too long", "POST", jobs, job(json!({"queue": "q".repeat(129)})), 400, "options.queue"),
        case("negative timeout", "POST", jobs, job(json!({"timeout_ms": -5})), 400, "options.timeout_ms"),
        case("visibility timeout a string", "POST", jobs, job(json!({"visibility_timeout_ms": "30s"})), 400, "options.visibility_timeout_ms"),
        case("delay_until not a time", "POST", jobs, job(json!({"delay_until": "tomorrow"})), 400, "options.delay_until"),
        case("scheduled_at without offset", "POST", jobs, job(json!({"scheduled_at": "2030-01-01T00:00:00"})), 400, "options.scheduled_at"),
        case("relative time in months", "POST", jobs, job(json!({"scheduled_at": "+P1M"})), 400, "options.scheduled_at"),
        case("relative time negative", "POST", jobs, job(json!({"expires_at": "+-PT1S"})), 400, "options.expires_at"),
        case("expires_at a number", "POST", jobs, job(json!({"expires_at": 12})), 400, "options.expires_at"),
        case("tags with a number", "POST", jobs, job(json!({"tags": ["ok", 1]})), 400, "options.tags[1]"),
        case("pending not a boolean", "POST", jobs, job(json!({"pending": "yes"})), 400, "options.pending"),
        case("negative max_attempts", "POST", jobs, job(json!({"retry": {"max_attempts": -1}})), 422, "options.retry.max_attempts"),
        case("coefficient below one", "POST", jobs, job(json!({"retry": {"backoff_coefficient": 0.5}})), 422, "options.retry.backoff_coefficient"),
        case("duration not ISO-8601", "POST", jobs, job(json!({"retry": {"initial_interval": "1s"}})), 422, "options.retry.initial_interval"),
        case("zero duration", "POST", jobs, job(json!({"retry": {"max_interval": "PT0S"}})), 422, "options.retry.max_interval"),
        case("unknown retry field", "POST", jobs, job(json!({"retry": {"maxAttempts": 3}})), 422, "options.retry.maxAttempts"),
        case("retry not an object", "POST", jobs, job(json!({"retry": 3})), 422, "options.retry"),
        case("initial above max interval", "POST", jobs, job(json!({"retry": {"initial_interval": "PT10M", "max_interval": "PT1M"}})), 422, "options.retry.max_interval"),
        case("unknown unique state", "POST", jobs, job(json!({"unique": {"states": ["done"]}})), 400, "options.unique.states[0]"),
        case("unique period not ISO", "POST", jobs, job(json!({"unique": {"period": "1h"}})), 400, "options.unique.period"),
        case("unique key unknown", "POST", jobs, job(json!({"unique": {"keys": ["args", "color"]}})), 400, "options.unique.keys"),
        case("unique on_conflict unknown", "POST", jobs, job(json!({"unique": {"on_conflict": "merge"}})), 400, "options.unique.on_conflict"),
        // POST /ojs/v1/jobs/batch: one bad job rejects them all.
        case("batch without jobs", "POST", batch, json!({}), 400, "jobs"),
        case("batch jobs not an array", "POST", batch, json!({"jobs": {}}), 400, "jobs"),
        case("empty batch", "POST", batch, json!({"jobs": []}), 400, "jobs"),
        case("batch item not an object", "POST", batch, json!({"jobs": [1]}), 400, "jobs[0]"),
        case("second batch job invalid", "POST", batch, json!({"jobs": [{"type": "a", "args": []}, {"type": "B!", "args": []}]}), 400, "jobs[1].type"),
        case("second batch job bad policy", "POST", batch, json!({"jobs": [{"type": "a", "args": []}, job(json!({"retry": {"max_attempts": -2}}))]}), 422, "jobs[1].options.retry.max_attempts"),
        // Workers.
        case("fetch without queues", "POST", fetch, json!({"worker_id": "w"}), 400, "queues"),
        case("fetch queues a string", "POST", fetch, json!({"queues": "default"}), 400, "queues"),
        case("fetch no queues", "POST", fetch, json!({"queues": []}), 400, "queues"),
        case("fetch queue a number", "POST", fetch, json!({"queues": [1]}), 400, "queues[0]"),
        case("fetch queue malformed", "POST", fetch, json!({"queues": ["default", "Bad Q"]}), 400, "queues[1]"),
        case("fetch count zero", "POST", fetch, json!({"queues": ["default"], "count": 0}), 400, "count"),
        case("fetch count huge", "POST", fetch, json!({"queues": ["default"], "count": 1_000_000}), 400, "count"),
        case("fetch count a string", "POST", fetch, json!({"queues": ["default"], "count": "1"}), 400, "count"),
        case("fetch visibility zero", "POST", fetch, json!({"queues": ["default"], "visibility_timeout_ms": 0}), 400, "visibility_timeout_ms"),
        case("fetch empty worker id", "POST", fetch, json!({"queues": ["default"], "worker_id": ""}), 400, "worker_id"),
        case("ack without job id", "POST", ack, json!({}), 400, "job_id"),
        case("ack job id not a UUID", "POST", ack, json!({"job_id": "job-1"}), 400, "job_id"),
        case("ack job id a number", "POST", ack, json!({"job_id": 7}), 400, "job_id"),
        case("nack without error", "POST", nack, json!({"job_id": some_id}), 400, "error"),
        case("nack error not an object", "POST", nack, json!({"job_id": some_id, "error": "boom"}), 400, "error"),
        case("nack error without message", "POST", nack, json!({"job_id": some_id, "error": {"code": "x"}}), 400, "error.message"),
        case("nack error without code", "POST", nack, json!({"job_id": some_id, "error": {"message": "x"}}), 400, "error.code"),
        case("nack details not an object", "POST", nack, json!({"job_id": some_id, "error": {"code": "x", "message": "m", "details": "d"}}), 400, "error.details"),
        case("nack retryable not a boolean", "POST", nack, json!({"job_id": some_id, "error": {"code": "x", "message": "m", "retryable": "no"}}), 400, "error.retryable"),
        case("nack requeue not a boolean", "POST", nack, json!({"job_id": some_id, "requeue": "yes"}), 400, "requeue"),
        case("ack attempt zero", "POST", ack, json!({"job_id": some_id, "attempt": 0}), 400, "attempt"),
        case("ack attempt past an int4", "POST", ack, json!({"job_id": some_id, "attempt": 2_147_483_648i64}), 400, "attempt"),
        case("ack attempt a string", "POST", ack, json!({"job_id": some_id, "attempt": "1"}), 400, "attempt"),
        case("ack started_at not a time", "POST", ack, json!({"job_id": some_id, "started_at": "yesterday"}), 400, "started_at"),
        case("ack started_at without an offset", "POST", ack, json!({"job_id": some_id, "started_at": "2026-11-27T08:00:00"}), 400, "started_at"),
        // Well formed, at times no run started at, which Postgres cannot compare with (a 500).
        case("ack started_at before any run", "POST", ack, json!({"job_id": some_id, "started_at": "-005000-01-01T00:00:00Z"}), 400, "started_at"),
        case("requeue nack started_at past year 9000", "POST", nack, json!({"job_id": some_id, "requeue": true, "started_at": "9999-01-01T00:00:00Z"}), 400, "started_at"),
        case("nack started_at a number", "POST", nack, json!({"job_id": some_id, "started_at": 17, "error": {"code": "x", "message": "m"}}), 400, "started_at"),
        case("requeue nack attempt negative", "POST", nack, json!({"job_id": some_id, "requeue": true, "attempt": -1}), 400, "attempt"),
        case("heartbeat without worker", "POST", beat, json!({"active_jobs": []}), 400, "worker_id"),
        case("heartbeat job a number", "POST", beat, json!({"worker_id": "w", "active_jobs": [1]}), 400, "active_jobs[0]"),
        case("heartbeat job not a UUID", "POST", beat, json!({"worker_id": "w", "active_jobs": ["x"]}), 400, "active_jobs[0]"),
        case("heartbeat negative visibility", "POST", beat, json!({"worker_id": "w", "visibility_timeout_ms": -1}), 400, "visibility_timeout_ms"),
        case("progress without a job", "POST", progress, json!({"percentage": 5}), 400, "job_id"),
        case("progress job not a UUID", "POST", progress, json!({"job_id": "x", "percentage": 5}), 400, "job_id"),
        case("progress a string", "POST", progress, json!({"job_id": some_id, "percentage": "5"}), 400, "percentage"),
        case("progress above 100", "POST", progress, json!({"job_id": some_id, "progress": 1e300}), 400, "progress"),
        case("progress message an object", "POST", progress, json!({"job_id": some_id, "percentage": 5, "message": {}}), 400, "message"),
        // Job paths and listings.
        get("job id not a UUID", "/ojs/v1/jobs/not-a-uuid", 400, "id"),
        // A path segment that is not UTF-8 is refused by the framework, which names it.
        get("job id not UTF-8", "/ojs/v1/jobs/%FF", 400, "id"),
        get("queue name not UTF-8", "/ojs/v1/queues/%C3%28/stats", 400, "name"),
        Case { method: "PUT", ..get("rate-limit key not UTF-8", "/ojs/v1/rate-limits/%FF", 400, "key") },
        Case { method: "DELETE", ..get("cancel id not a UUID", "/ojs/v1/jobs/42", 400, "id") },
        get("dead-letter limit zero", "/ojs/v1/dead-letter?limit=0", 400, "limit"),
        get("dead-letter limit not a number", "/ojs/v1/dead-letter?limit=ten", 400, "limit"),
        get("dead-letter negative offset", "/ojs/v1/dead-letter?offset=-1", 400, "offset"),
        get("dead-letter offset and cursor", "/ojs/v1/dead-letter?offset=20&cursor=019539a4-bbbb-7000-8000-000000000001", 400, "offset"),
        get("dead-letter cursor not an id", "/ojs/v1/dead-letter?cursor=abc", 400, "cursor"),
        // Offsets no page served led to, deeper than a scan may go (each was a scan of the
        // whole listing, on every request).
        get("dead-letter offset past any scan", "/ojs/v1/dead-letter?offset=2147483647", 400, "offset"),
        get("admin jobs page past any scan", "/ojs/v1/admin/jobs?page=10002&per_page=100", 400, "page"),
        get("admin dead letters page past any scan", "/ojs/v1/admin/dead-letter?page=1000000&per_page=100", 400, "page"),
        get("rate limits offset past any scan", "/ojs/v1/rate-limits?offset=2147483647", 400, "offset"),
        get("rate limits page past any scan", "/ojs/v1/rate-limits?page=100002&per_page=1", 400, "page"),
        get("dead-letter queue malformed", "/ojs/v1/dead-letter?queue=Bad%20Q", 400, "queue"),
        get("dead-letter unknown filter", "/ojs/v1/dead-letter?state=discarded", 400, "state"),
        get("dead-letter repeated limit", "/ojs/v1/dead-letter?limit=1&limit=2", 400, "limit"),
        get("unknown event type", "/ojs/v1/events?types=job.completed,job.exploded", 400, "types"),
        get("events since not a time", "/ojs/v1/events?since=yesterday", 400, "since"),
        get("events limit too high", "/ojs/v1/events?limit=5000", 400, "limit"),
        get("events queue malformed", "/ojs/v1/events?queues=BAD", 400, "queues"),
        get("events job id not a UUID", "/ojs/v1/events?job_id=1", 400, "job_id"),
        get("queue stats of a malformed name", "/ojs/v1/queues/Bad%20Queue/stats", 400, "name"),
        Case { method: "POST", ..get("pause a malformed queue", "/ojs/v1/queues/-x/pause", 400, "name") },
        // Retry policies.
        case("policy max_attempts negative", "PUT", policy, json!({"max_attempts": -1}), 422, "max_attempts"),
        case("policy max_attempts fractional", "PUT", policy, json!({"max_attempts": 2.5}), 422, "max_attempts"),
        case("policy duration not ISO", "PUT", policy, json!({"initial_interval": "soon"}), 422, "initial_interval"),
        case("policy jitter unknown", "PUT", policy, json!({"jitter": "maybe"}), 422, "jitter"),
        case("policy on_exhaustion unknown", "PUT", policy, json!({"on_exhaustion": "explode"}), 422, "on_exhaustion"),
        case("policy custom without schedule", "PUT", policy, json!({"backoff_strategy": "custom"}), 422, "schedule"),
        case("policy pattern malformed", "PUT", policy, json!({"non_retryable_errors": ["a.*.b"]}), 422, "non_retryable_errors"),
        case("policy interval inverted", "PUT", policy, json!({"initial_interval": "PT10M", "max_interval": "PT1M"}), 422, "max_interval"),
        case("policy unknown field", "PUT", policy, json!({"retries": 3}), 422, "retries"),
        case("policy body an array", "PUT", policy, json!([]), 400, "body"),
        raw("policy body malformed", "PUT", policy, b"{max_attempts: 3}", 400, "invalid_payload"),
        case("policy for a malformed type", "PUT", "/ojs/v1/admin/policies/Bad%20Type", json!({"max_attempts": 3}), 400, "type"),
        Case {
            path: format!("{policy}?note={}", "n".repeat(501)),
            ..case("policy note too long", "PUT", policy, json!({"max_attempts": 3}), 400, "note")
        },
        case("preview without policy", "POST", preview, json!({}), 400, "policy"),
        case("preview invalid policy", "POST", preview, json!({"policy": {"max_attempts": -1}}), 422, "policy.max_attempts"),
        case("preview policy not an object", "POST", preview, json!({"policy": 3}), 422, "policy"),
        case("preview limit zero", "POST", preview, json!({"policy": {}, "limit": 0}), 400, "limit"),
        case("preview malformed type", "POST", preview, json!({"policy": {}, "job_type": "Bad!"}), 400, "job_type"),
        case("preview unknown field", "POST", preview, json!({"policy": {}, "dry": true}), 400, "dry"),
        // Values past the bounds (rebound_queue::bounds): each once poisoned a queue or the
        // maintenance pass, or left a row no reader could decode.
        case("visibility timeout i64::MAX", "POST", jobs, job(json!({"visibility_timeout_ms": i64::MAX})), 400, "options.visibility_timeout_ms"),
        case("timeout i64::MAX", "POST", jobs, job(json!({"timeout_ms": i64::MAX})), 400, "options.timeout_ms"),
        case("timeout over 7 days", "POST", jobs, job(json!({"timeout_ms": 7 * 86_400_000_i64 + 1})), 400, "options.timeout_ms"),
        case("top-level visibility i64::MAX", "POST", jobs, json!({"type": "a", "args": [], "visibility_timeout_ms": i64::MAX}), 400, "visibility_timeout_ms"),
        case("batch job timeout i64::MAX", "POST", batch, json!({"jobs": [{"type": "a", "args": []}, job(json!({"timeout_ms": i64::MAX}))]}), 400, "jobs[1].options.timeout_ms"),
        case("retry initial interval of 10 000 years", "POST", jobs, job(json!({"retry": {"initial_interval": "PT87600000H"}})), 422, "options.retry.initial_interval"),
        case("retry max interval of 10 000 years", "POST", jobs, job(json!({"retry": {"max_interval": "PT87600000H"}})), 422, "options.retry.max_interval"),
        case("retry interval in ms past a year", "POST", jobs, job(json!({"retry": {"max_interval_ms": 31_536_000_001_i64}})), 422, "options.retry.max_interval"),
        case("retry schedule entry of 10 000 years", "POST", jobs, job(json!({"retry": {"backoff_strategy": "custom", "schedule": ["PT1S", "PT87600000H"]}})), 422, "options.retry.schedule"),
        case("scheduled_at in year 9999", "POST", jobs, job(json!({"scheduled_at": "9999-12-31T00:00:00Z"})), 400, "options.scheduled_at"),
        case("delay_until 10 000 years ahead", "POST", jobs, job(json!({"delay_until": "+PT87600000H"})), 400, "options.delay_until"),
        case("expires_at before 1970", "POST", jobs, job(json!({"expires_at": "0001-01-01T00:00:00Z"})), 400, "options.expires_at"),
        case("unique period of ten years", "POST", jobs, job(json!({"unique": {"period": "P3650D"}})), 400, "options.unique.period"),
        case("unique period_ms i64::MAX", "POST", jobs, job(json!({"unique": {"period_ms": i64::MAX}})), 400, "options.unique.period_ms"),
        raw_field("args number jsonb cannot give back", "POST", jobs, br#"{"type": "a", "args": [1.7976931348623157e+308]}"#, 400, "args[0]"),
        raw_field("nested args number jsonb cannot give back", "POST", jobs, br#"{"type": "a", "args": [{"n": [-1.7976931348623157e+308]}]}"#, 400, "args[0].n[0]"),
        raw_field("ack result number jsonb cannot give back", "POST", ack, br#"{"job_id": "019539a4-0000-7000-8000-000000000000", "result": {"x": 1.7976931348623157e+308}}"#, 400, "result.x"),
        case("policy interval of 10 000 years", "PUT", policy, json!({"initial_interval": "PT87600000H"}), 422, "initial_interval"),
        case("policy max interval of 10 000 years", "PUT", policy, json!({"max_interval": "PT87600000H"}), 422, "max_interval"),
        case("preview interval of 10 000 years", "POST", preview, json!({"policy": {"max_interval": "PT87600000H"}}), 422, "policy.max_interval"),
        case("rate-limit period of ten years", "PUT", "/ojs/v1/admin/queues/default/rate-limit", json!({"rate": {"limit": 5, "period": "P3650D"}}), 400, "rate.period"),
        case("rate_limit not an object", "POST", jobs, job(json!({"rate_limit": "tenant"})), 400, "options.rate_limit"),
        case("rate_limit key of 300 characters", "POST", jobs, job(json!({"rate_limit": {"key": "k".repeat(300)}})), 400, "options.rate_limit.key"),
        case("rate_limit concurrency below zero", "POST", jobs, job(json!({"rate_limit": {"key": "k", "concurrency": -1}})), 400, "options.rate_limit.concurrency"),
        case("rate_limit concurrency past i32", "POST", jobs, job(json!({"rate_limit": {"key": "k", "concurrency": 4294967296i64}})), 400, "options.rate_limit.concurrency"),
        case("rate_limit rate period not a duration", "POST", jobs, job(json!({"rate_limit": {"key": "k", "rate": {"limit": 5, "period": "soon"}}})), 400, "options.rate_limit.rate.period"),
        case("rate_limit rate without a period", "POST", jobs, job(json!({"rate_limit": {"key": "k", "rate": {"limit": 5}}})), 400, "options.rate_limit.rate.period"),
        case("rate_limit rate period of 400 days", "POST", jobs, job(json!({"rate_limit": {"key": "k", "rate": {"limit": 5, "period": "P400D"}}})), 400, "options.rate_limit.rate.period"),
        case("rate_limit rate limit below zero", "POST", jobs, job(json!({"rate_limit": {"key": "k", "rate": {"limit": -1, "period": "PT1S"}}})), 400, "options.rate_limit.rate.limit"),
        case("rate_limit on_limit unknown", "POST", jobs, job(json!({"rate_limit": {"key": "k", "on_limit": "explode"}})), 400, "options.rate_limit.on_limit"),
        case("rate_limit on_limit not a string", "POST", jobs, job(json!({"rate_limit": {"key": "k", "on_limit": 1}})), 400, "options.rate_limit.on_limit"),
        case("rate_limit rate limit past the most", "POST", jobs, job(json!({"rate_limit": {"key": "k", "rate": {"limit": 2000000, "period": "PT1S"}}})), 400, "options.rate_limit.rate.limit"),
        case("rate-limit override ending in year 99999", "PUT", "/ojs/v1/rate-limits/tenant:x", json!({"concurrency": 1, "expires_at": "+PT876000000H"}), 400, "expires_at"),
        case("rate-limit override ending before 1970", "PUT", "/ojs/v1/rate-limits/tenant:x", json!({"concurrency": 1, "expires_at": "1900-01-01T00:00:00Z"}), 400, "expires_at"),
        get("events since before year 1", "/ojs/v1/events?since=-009999-01-01T00:00:00Z", 400, "since"),
        get("dead-letter filter before 1970", "/ojs/v1/admin/dead-letter?since=1900-01-01T00:00:00Z", 400, "since"),
        get("listing filter after year 9000", "/ojs/v1/admin/jobs?since=9999-01-01T00:00:00Z", 400, "since"),
        // NUL characters: Postgres stores none, in text or jsonb.
        case("NUL in args", "POST", jobs, json!({"type": "a", "args": ["a\u{0}b"]}), 400, "args[0]"),
        case("NUL in nested args", "POST", jobs, json!({"type": "a", "args": [{"name": "x\u{0}"}]}), 400, "args[0].name"),
        case("NUL in a meta value", "POST", jobs, json!({"type": "a", "args": [], "meta": {"trace": "\u{0}"}}), 400, "meta.trace"),
        case("NUL in a meta key", "POST", jobs, json!({"type": "a", "args": [], "meta": {"k\u{0}": 1}}), 400, "meta[\"k\\u0000\"]"),
        case("NUL in a tag", "POST", jobs, job(json!({"tags": ["ok", "t\u{0}"]})), 400, "options.tags[1]"),
        case("NUL in an extension field", "POST", jobs, json!({"type": "a", "args": [], "x_trace": "\u{0}"}), 400, "x_trace"),
        case("NUL in an extension option", "POST", jobs, job(json!({"metadata": {"note": "\u{0}"}})), 400, "options.metadata.note"),
        case("NUL in the type", "POST", jobs, json!({"type": "a\u{0}", "args": []}), 400, "type"),
        case("NUL in the queue", "POST", jobs, job(json!({"queue": "q\u{0}"})), 400, "options.queue"),
        case("NUL in a batch job", "POST", batch, json!({"jobs": [{"type": "a", "args": []}, {"type": "a", "args": ["\u{0}"]}]}), 400, "jobs[1].args[0]"),
        case("NUL in the fetch worker id", "POST", fetch, json!({"queues": ["default"], "worker_id": "w\u{0}"}), 400, "worker_id"),
        case("NUL in an ack result", "POST", ack, json!({"job_id": some_id, "result": {"out": "\u{0}"}}), 400, "result.out"),
        case("NUL in an ack worker id", "POST", ack, json!({"job_id": some_id, "worker_id": "\u{0}"}), 400, "worker_id"),
        case("NUL in a nack message", "POST", nack, json!({"job_id": some_id, "error": {"code": "x", "message": "m\u{0}"}}), 400, "error.message"),
        case("NUL in nack details", "POST", nack, json!({"job_id": some_id, "error": {"code": "x", "message": "m", "details": {"trace": ["\u{0}"]}}}), 400, "error.details.trace[0]"),
        case("NUL in a nack code", "POST", nack, json!({"job_id": some_id, "error": {"code": "x\u{0}", "message": "m"}}), 400, "error.code"),
        case("NUL in the heartbeat worker id", "POST", beat, json!({"worker_id": "w\u{0}", "active_jobs": []}), 400, "worker_id"),
        case("NUL in a progress message", "POST", progress, json!({"job_id": some_id, "percentage": 5, "message": "a\u{0}b"}), 400, "message"),
        case("NUL in the heartbeat state", "POST", beat, json!({"worker_id": "w", "state": "\u{0}"}), 400, "state"),
        case("NUL in a cron name", "POST", "/ojs/v1/cron", json!({"name": "c\u{0}", "expression": "* * * * *", "job_template": {"type": "a", "args": []}}), 400, "name"),
        case("NUL in cron job args", "POST", "/ojs/v1/cron", json!({"name": "c", "expression": "* * * * *", "job_template": {"type": "a", "args": ["\u{0}"]}}), 400, "job_template.args[0]"),
        case("NUL in a policy pattern", "PUT", policy, json!({"non_retryable_errors": ["a\u{0}"]}), 400, "non_retryable_errors[0]"),
        case("NUL in a queue config body", "PUT", "/ojs/v1/admin/queues/default/config", json!({"paused": "\u{0}"}), 400, "paused"),
        case("NUL in a bulk filter", "POST", "/ojs/v1/admin/jobs/bulk/cancel", json!({"filter": {"queue": "\u{0}"}}), 400, "filter.queue"),
        case("NUL in a dead-letter retry filter", "POST", "/ojs/v1/dead-letter/retry", json!({"queue": "\u{0}"}), 400, "queue"),
        get("NUL in a path", "/ojs/v1/admin/workers/w%00", 400, "path"),
        Case { method: "POST", ..get("NUL in a cron path", "/ojs/v1/cron/c%00/pause", 400, "path") },
        get("NUL in a query parameter", "/ojs/v1/dead-letter?queue=a%00", 400, "queue"),
        Case {
            path: format!("{policy}?note=a%00"),
            ..case("NUL in a policy note", "PUT", policy, json!({"max_attempts": 3}), 400, "note")
        },
    ]
}

fn raw_field(name: &'static str, method: &'static str, path: &str, body: &[u8], status: u16, field: &'static str) -> Case {
    Case { name, method, path: path.to_owned(), content_type: Some(JSON), body: body.to_vec(), status, field: Some(field), code: None }
}

#[tokio::test]
async fn hostile_inputs_get_4xx_naming_the_field_and_write_nothing() {
    let server = TestServer::new().await;
    let mut failures = Vec::new();
    for c in table() {
        let headers: Vec<(&str, &str)> = c.content_type.map(|ct| ("content-type", ct)).into_iter().collect();
        let r = server.raw(c.method, &c.path, &headers, c.body.clone()).await;
        let context = format!("{} ({} {})", c.name, c.method, c.path);
        if r.status.as_u16() != c.status {
            failures.push(format!("{context}: status {} (expected {}): {}", r.status, c.status, r.text));
            continue;
        }
        r.assert_ojs_error(&context);
        if let Some(field) = c.field
            && r.error_field() != Some(field)
        {
            failures.push(format!("{context}: field {:?} (expected {field:?}): {}", r.error_field(), r.text));
        }
        if let Some(code) = c.code
            && r.body["error"]["code"] != code
        {
            failures.push(format!("{context}: code {} (expected {code})", r.body["error"]["code"]));
        }
        if let Some(field) = c.field
            && let Some(message) = r.body["error"]["message"].as_str()
        {
            let last = field.rsplit('.').next().unwrap_or(field);
            let last = last.split('[').next().unwrap_or(last);
            if !message.contains(last) {
                failures.push(format!("{context}: message {message:?} does not name {last:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} hostile cases misbehaved:\n{}", failures.len(), failures.join("\n"));

    // Nothing was written by any of them.
    assert_eq!(server.job_count().await, 0, "a rejected request wrote a job");
    assert!(server.db.store.policies().await.expect("policies").is_empty(), "a rejected request saved a policy");
    assert!(server.db.store.queues().await.expect("queues").is_empty(), "a rejected request created a queue");
    assert!(server.db.store.cron_jobs(None).await.expect("crons").is_empty(), "a rejected request registered a cron job");
}

/// The bounds hold for the store's own callers too (the dashboard, the worker library): a
/// re-drive staggered over 5 000 000 000 000 s or a rate-limit window of ten years is refused
/// naming the field, and nothing changes.
#[tokio::test]
async fn store_callers_get_the_same_bounds() {
    use rebound_queue::StoreError;
    use rebound_queue::store::{Actor, JobSelection, QueueRateLimit, RedriveBudget, RedriveOptions, Window};

    let server = TestServer::new().await;
    let id: uuid::Uuid = server.dead_letter("dlq", "boom").await.parse().expect("id");
    let opts = RedriveOptions {
        budget: RedriveBudget::Fresh,
        stagger: Some(std::time::Duration::from_secs(5_000_000_000_000)),
        actor: Actor::new("test"),
        reason: None,
    };
    let refused = server.db.store.redrive(&JobSelection::Ids(vec![id]), &opts).await;
    assert!(matches!(&refused, Err(StoreError::Invalid { field, .. }) if field == "stagger"), "{refused:?}");
    let job = server.db.store.job(id).await.expect("job");
    assert!(job.dead_letter, "the refused re-drive changed the job: {job:?}");

    let limit = QueueRateLimit {
        rate: Some(Window { limit: 5, period: std::time::Duration::from_secs(10 * 365 * 86_400) }),
        ..QueueRateLimit::default()
    };
    let refused = server.db.store.set_queue_rate_limit("dlq", Some(&limit), &Actor::new("test")).await;
    assert!(matches!(&refused, Err(StoreError::Invalid { field, .. }) if field == "rate.period"), "{refused:?}");

    // A job enqueued through the library is held to the API's bounds.
    let mut job = rebound_queue::NewJob::new("lib.job", json!([]));
    job.visibility_timeout_ms = Some(i64::MAX);
    let refused = server.db.store.enqueue(job).await;
    assert!(matches!(&refused, Err(StoreError::InvalidJob(e)) if e.field == "options.visibility_timeout_ms"), "{refused:?}");
}

#[tokio::test]
async fn oversized_bodies_get_413_with_the_ojs_body() {
    let server = TestServer::new().await;
    let limit = server.state.config.max_body_bytes;
    let big = json!({"type": "a", "args": ["x".repeat(limit)]}).to_string().into_bytes();
    let r = server.raw("POST", "/ojs/v1/jobs", &[("content-type", JSON)], big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text);
    r.assert_ojs_error("oversized body");
    assert_eq!(r.body["error"]["type"], "payload_too_large");
    assert_eq!(server.job_count().await, 0);

    // A declared length over the limit is refused before the body is read, in the same shape.
    let declared = (limit + 1).to_string();
    let big = json!({"type": "a", "args": ["x".repeat(limit)]}).to_string().into_bytes();
    let r = server.raw("POST", "/ojs/v1/jobs", &[("content-type", JSON), ("content-length", &declared)], big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text);
    r.assert_ojs_error("oversized body with a Content-Length");

    // Anything up to the limit is accepted (OJS requires envelopes of at least 1 MiB).
    let near_limit = json!({"type": "a", "args": ["x".repeat(limit - 64)]}).to_string().into_bytes();
    assert!(near_limit.len() <= limit && near_limit.len() > 2 * 1024 * 1024);
    let r = server.raw("POST", "/ojs/v1/jobs", &[("content-type", JSON)], near_limit).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text.chars().take(300).collect::<String>());
}

#[tokio::test]
async fn unknown_routes_and_methods_get_ojs_errors() {
    let server = TestServer::new().await;
    let r = server.get("/ojs/v1/nothing-here").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    r.assert_ojs_error("unknown route");
    assert!(r.body["error"]["message"].as_str().is_some_and(|m| m.contains("/ojs/v1/nothing-here")), "{}", r.text);
    let r = server.call("PATCH", "/ojs/v1/jobs", Some(json!({}))).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    r.assert_ojs_error("wrong method");
    // The test-only reset does not exist outside test mode.
    let r = server.post("/ojs/v1/admin/reset", json!({})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    r.assert_ojs_error("reset outside test mode");
}

#[tokio::test]
async fn state_conflicts_and_missing_jobs() {
    let server = TestServer::new().await;
    let missing = "019539a4-0000-7000-8000-000000000001";
    for (method, path, body) in [
        ("POST", "/ojs/v1/workers/ack".to_owned(), Some(json!({"job_id": missing}))),
        ("POST", "/ojs/v1/workers/nack".to_owned(), Some(json!({"job_id": missing, "error": {"code": "x", "message": "m"}}))),
        ("DELETE", format!("/ojs/v1/jobs/{missing}"), None),
        ("POST", format!("/ojs/v1/dead-letter/{missing}/retry"), Some(json!({}))),
        ("DELETE", format!("/ojs/v1/dead-letter/{missing}"), None),
        ("POST", format!("/ojs/v1/jobs/{missing}/activate"), Some(json!({}))),
        ("POST", "/ojs/v1/workers/progress".to_owned(), Some(json!({"job_id": missing, "percentage": 5}))),
        ("GET", format!("/ojs/v1/jobs/{missing}/progress"), None),
        ("GET", "/ojs/v1/admin/policies/never.saved".to_owned(), None),
        ("DELETE", "/ojs/v1/admin/policies/never.saved".to_owned(), None),
    ] {
        let r = server.call(method, &path, body).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{method} {path}: {}", r.text);
        r.assert_ojs_error(&path);
        assert_eq!(r.body["error"]["code"], "not_found");
    }
    // A job that is not a dead letter cannot be re-driven or purged as one.
    let job = server.enqueue(json!({"type": "a", "args": []})).await;
    let id = job["id"].as_str().expect("id");
    let r = server.post(&format!("/ojs/v1/dead-letter/{id}/retry"), json!({})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let r = server.call("DELETE", &format!("/ojs/v1/dead-letter/{id}"), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(server.job_count().await, 1);
    // Activating a job that is not pending is a conflict.
    let r = server.post(&format!("/ojs/v1/jobs/{id}/activate"), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.body["error"]["code"], "conflict");
    assert_eq!(r.body["error"]["details"]["current_state"], "available");
    // A pending job is activated, and that is audited (the refused one was not).
    let pending = server.enqueue(json!({"type": "a", "args": [], "options": {"pending": true}})).await;
    let pending_id = pending["id"].as_str().expect("id");
    let r = server.post(&format!("/ojs/v1/jobs/{pending_id}/activate"), json!({})).await;
    assert_eq!((r.status, r.body["job"]["state"].as_str()), (StatusCode::OK, Some("available")), "{}", r.text);
    let audit = server.db.store.audit_log(&Default::default()).await.expect("audit");
    let activations: Vec<_> = audit.iter().filter(|e| e.action == "job.activate").map(|e| e.target.as_deref()).collect();
    assert_eq!(activations, vec![Some(pending_id)]);
}

/// Rows an older version (or a hand edit) may have stored beyond today's bounds: a timeout of
/// `i64::MAX` ms, times past jiff's year 9999 and `infinity`. Fetching their queue, listing,
/// reading and cancelling them, and the maintenance pass must all still work.
#[tokio::test]
async fn rows_stored_beyond_the_bounds_are_still_served() {
    let server = TestServer::new().await;
    let pool = server.db.store.pool();
    let insert = |sql: &'static str| async move { sqlx::query(sql).execute(pool).await.expect(sql) };
    // Due now, with timeouts that once overflowed `now() + timeout` in every claim and pass.
    insert(
        "INSERT INTO jobs (id, type, queue, args, state, enqueued_at, timeout_ms, visibility_timeout_ms)
         VALUES ('019539a4-0000-7000-8000-0000000000a1', 'old.job', 'poison', '[1]', 'available', now(), 9223372036854775807, 9223372036854775807)",
    )
    .await;
    // Waiting until after year 9999, and forever.
    insert(
        "INSERT INTO jobs (id, type, queue, args, state, scheduled_at, expires_at)
         VALUES ('019539a4-0000-7000-8000-0000000000a2', 'old.job', 'poison', '[]', 'scheduled', '20000-01-01T00:00:00Z', 'infinity')",
    )
    .await;
    insert(
        "INSERT INTO jobs (id, type, queue, args, state, scheduled_at, retry_delay_ms)
         VALUES ('019539a4-0000-7000-8000-0000000000a3', 'old.job', 'poison', '[]', 'retryable', 'infinity', 9223372036854775807)",
    )
    .await;

    let fetched = server.fetch("poison").await;
    assert_eq!(fetched["id"], "019539a4-0000-7000-8000-0000000000a1", "the due job is claimed");
    let lock: Option<i64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM lock_expires_at - now())::bigint FROM jobs WHERE id = '019539a4-0000-7000-8000-0000000000a1'",
    )
    .fetch_one(pool)
    .await
    .expect("lock");
    assert!(lock.is_some_and(|s| s <= 7 * 86_400), "the claim's lock is clamped to 7 days: {lock:?}");

    // The maintenance pass (rescuer included) still runs with that job active.
    rebound_server::maintenance::run_pass(&server.db.store, &server.state.metrics).await.expect("maintenance pass");
    server.db.store.rescue_expired(100).await.expect("rescue");

    let far = server.get("/ojs/v1/jobs/019539a4-0000-7000-8000-0000000000a2").await;
    assert_eq!(far.status, StatusCode::OK, "{}", far.text);
    assert!(far.body["job"]["scheduled_at"].as_str().is_some_and(|t| t.starts_with("9999-")), "saturated: {}", far.text);
    let list = server.get("/ojs/v1/admin/jobs?queue=poison").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert_eq!(list.body["items"].as_array().map(Vec::len), Some(3), "{}", list.text);
    let page = server.db.store.list_jobs(&Default::default(), None, 50).await.expect("store listing");
    assert_eq!(page.items.len(), 3);
    for id in ["019539a4-0000-7000-8000-0000000000a2", "019539a4-0000-7000-8000-0000000000a3"] {
        let r = server.call("DELETE", &format!("/ojs/v1/jobs/{id}"), None).await;
        assert_eq!(r.status, StatusCode::OK, "cancel {id}: {}", r.text);
    }
    // A number `jsonb` gives back in a form serde_json cannot read as a float: the row (written
    // before the check at the edge) is served with that number as a string.
    insert(
        "INSERT INTO jobs (id, type, queue, args, meta, state, enqueued_at)
         VALUES ('019539a4-0000-7000-8000-0000000000a4', 'old.job', 'numbers', '[1.7976931348623157e+308, 2]', '{\"n\": -1.7976931348623157e+308}', 'available', now())",
    )
    .await;
    let numbers = server.get("/ojs/v1/jobs/019539a4-0000-7000-8000-0000000000a4").await;
    assert_eq!(numbers.status, StatusCode::OK, "{}", numbers.text);
    assert_eq!(numbers.body["job"]["args"][1], 2, "{}", numbers.text);
    assert!(numbers.body["job"]["args"][0].as_str().is_some_and(|s| s.starts_with("17976931348623157")), "{}", numbers.text);
    assert_eq!(server.fetch("numbers").await["id"], "019539a4-0000-7000-8000-0000000000a4");

    // The claimed job can still fail and be retried: its delay is bounded.
    let r = server.post("/ojs/v1/workers/nack", json!({"job_id": fetched["id"], "error": {"code": "x", "message": "m"}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

/// A retry policy stored before the bounds existed (ten thousand years between attempts) is
/// clamped when a failure is recorded: the job is due within a year, and stays readable.
#[tokio::test]
async fn a_stored_unbounded_policy_schedules_within_a_year() {
    let server = TestServer::new().await;
    sqlx::query(
        "INSERT INTO retry_policies (job_type, policy, version, updated_at, updated_by)
         VALUES ('old.job', '{\"initial_interval\": \"PT87600000H\", \"max_interval\": \"PT87600000H\", \"jitter\": false}', 1, now(), 'old')",
    )
    .execute(server.db.store.pool())
    .await
    .expect("insert policy");
    let job = server.enqueue(json!({"type": "old.job", "args": [], "options": {"queue": "oldq"}})).await;
    assert_eq!(server.fetch("oldq").await["id"], job["id"]);
    let r = server.post("/ojs/v1/workers/nack", json!({"job_id": job["id"], "error": {"code": "x", "message": "m"}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["state"], "retryable", "{}", r.text);
    let next: jiff::Timestamp = r.body["next_attempt_at"].as_str().expect("next_attempt_at").parse().expect("time");
    let limit = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(366 * 24);
    assert!(next < limit, "due within a year: {next}");
    let got = server.get(&format!("/ojs/v1/jobs/{}", job["id"].as_str().expect("id"))).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.text);
    // The retry spec's name for the same time (§10), in the nack's answer and on the job.
    assert_eq!(r.body["next_retry_at"], r.body["next_attempt_at"], "{}", r.text);
    assert_eq!(got.body["job"]["next_retry_at"], r.body["next_attempt_at"], "{}", got.text);
}

#[tokio::test]
async fn bodies_in_flight_share_a_budget_and_past_it_a_request_waits_then_gets_503() {
    use rebound_server::config::{ApiAuth, ServerConfig};
    use std::time::Duration;
    let s = TestServer::with_config(ServerConfig {
        api_auth: ApiAuth::None,
        max_body_bytes_in_flight: 256 * 1024,
        // A request waits for room up to half of it, 1 s.
        request_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    })
    .await;
    assert_eq!(s.state.body_budget_units, 256);
    // Other requests' bodies hold the whole budget.
    let held = s.state.body_budget.clone().acquire_many_owned(256).await.expect("the budget");
    // Small bodies (an ack, a heartbeat) take no share and never wait.
    let r = s.post("/ojs/v1/jobs", json!({"type": "budget.small", "args": [1], "queue": "budget"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // A large one (an enqueue carrying 100 KB of args) waits for its share.
    let job = json!({"type": "budget.test", "args": ["x".repeat(100_000)], "queue": "budget"});
    let r = s.post("/ojs/v1/jobs", job.clone()).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_eq!((r.body["error"]["code"].as_str(), r.body["error"]["retryable"].as_bool()), (Some("server_busy"), Some(true)), "{}", r.text);
    // Nothing was done, and a request without a body does not wait.
    assert_eq!(s.get("/ojs/v1/queues/budget/stats").await.status, StatusCode::OK);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE type = 'budget.test'").fetch_one(s.db.store.pool()).await.expect("count");
    assert_eq!(n, 0);
    // Once the budget frees up, a waiting request goes ahead.
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(held);
    });
    let r = s.post("/ojs/v1/jobs", job).await;
    release.await.expect("released");
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // The budget is all back.
    assert_eq!(s.state.body_budget.available_permits(), 256);
}

#[tokio::test]
async fn a_write_from_another_site_s_page_is_refused_and_lands_nothing() {
    // No authentication (as on loopback), so only the check stands between a page a developer
    // visits and the API it can reach.
    let s = TestServer::new().await;
    let job = json!({"type": "hostile.cross", "args": []}).to_string().into_bytes();
    for headers in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("origin", "https://evil.example"), ("host", "127.0.0.1:3000")],
        vec![("origin", "null"), ("host", "127.0.0.1:3000")],
    ] {
        // A page's fetch of a Blob body carries no Content-Type at all.
        for content_type in [None, Some(JSON)] {
            let mut sent = headers.clone();
            sent.extend(content_type.map(|ct| ("content-type", ct)));
            let r = s.raw("POST", "/ojs/v1/jobs", &sent, job.clone()).await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{sent:?}: {}", r.text);
            r.assert_ojs_error("cross-site");
            assert_eq!(r.body["error"]["code"], "forbidden");
        }
    }
    assert_eq!(s.job_count().await, 0, "nothing enqueued");
    // Reads are not refused (a page cannot read the answer), nor are programs and same-origin
    // pages, which send no such header or say so.
    assert_eq!(s.raw("GET", "/ojs/v1/queues", &[("sec-fetch-site", "cross-site")], Vec::new()).await.status, StatusCode::OK);
    for headers in [vec![], vec![("sec-fetch-site", "same-origin")], vec![("origin", "http://127.0.0.1:3000"), ("host", "127.0.0.1:3000")]] {
        let mut sent = headers.clone();
        sent.push(("content-type", JSON));
        let r = s.raw("POST", "/ojs/v1/jobs", &sent, job.clone()).await;
        assert_eq!(r.status, StatusCode::CREATED, "{headers:?}: {}", r.text);
    }
    assert_eq!(s.job_count().await, 3);
}
