//! What the public OJS SDKs send and read, beyond what the conformance suites check (issue 11):
//! queue stats in every shape, dead letters paged by offset, lenient heartbeats, unique jobs by
//! args/meta fields, cancel's `previous_state`, `422 unsupported`, handler response codes.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::common::TestServer;

fn id(job: &Value) -> &str {
    job["id"].as_str().unwrap_or_else(|| panic!("no id in {job}"))
}

#[tokio::test]
async fn queue_stats_answer_the_spec_shape_the_sdk_shapes_and_flat_counts() {
    let s = TestServer::new().await;
    for i in 0..3 {
        s.enqueue(json!({"type": "stats.job", "args": [i], "options": {"queue": "st"}})).await;
    }
    s.fetch("st").await;
    let r = s.get("/ojs/v1/queues/st/stats").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // The spec (and Go, which needs `queue` to be a string; Python reads `stats`).
    assert_eq!(r.body["queue"], "st");
    assert_eq!(r.body["status"], "active");
    assert_eq!((r.body["stats"]["available"].as_i64(), r.body["stats"]["active"].as_i64()), (Some(2), Some(1)));
    // The JS SDK reads flat fields.
    assert_eq!(r.body["name"], "st");
    assert_eq!((r.body["available"].as_i64(), r.body["active"].as_i64(), r.body["completed"].as_i64()), (Some(2), Some(1), Some(0)));
    assert_eq!(r.body["paused"], false);
}

/// `count` dead letters on queue `q`, oldest first.
async fn dead_letters(s: &TestServer, q: &str, count: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..count {
        ids.push(s.dead_letter(q, "boom").await);
    }
    ids
}

fn page_ids(r: &crate::common::Reply) -> Vec<String> {
    r.body["jobs"].as_array().unwrap_or_else(|| panic!("no jobs in {}", r.text)).iter().map(|j| id(j).to_owned()).collect()
}

#[tokio::test]
async fn dead_letters_page_by_offset_and_by_cursor_alike() {
    let s = TestServer::new().await;
    let mut ids = dead_letters(&s, "dlp", 7).await;
    ids.reverse(); // listings are newest first
    // Offset paging, as the Python and Go SDKs do it: each page continues where the last ended.
    let mut by_offset = Vec::new();
    for offset in [0, 3, 6] {
        let r = s.get(&format!("/ojs/v1/dead-letter?queue=dlp&limit=3&offset={offset}")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.body["pagination"]["offset"], offset);
        assert_eq!(r.body["pagination"]["total"], 7);
        by_offset.extend(page_ids(&r));
    }
    assert_eq!(by_offset, ids);
    // An offset no page led to (found by an id-only scan) gives the same answer.
    let r = s.get("/ojs/v1/dead-letter?queue=dlp&limit=2&offset=4").await;
    assert_eq!(page_ids(&r), ids[4..6].to_vec());
    let r = s.get("/ojs/v1/dead-letter?queue=dlp&offset=50").await;
    assert_eq!((r.status, page_ids(&r).len()), (StatusCode::OK, 0), "past the end: an empty page");
    // Cursor paging gives the same sequence.
    let mut by_cursor = Vec::new();
    let mut path = "/ojs/v1/dead-letter?queue=dlp&limit=3".to_owned();
    loop {
        let r = s.get(&path).await;
        by_cursor.extend(page_ids(&r));
        match r.body["pagination"]["next_cursor"].as_str() {
            Some(c) => path = format!("/ojs/v1/dead-letter?queue=dlp&limit=3&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(by_cursor, ids);
}

#[tokio::test]
async fn heartbeats_accept_active_job_ids_and_a_numeric_count() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "beat.job", "args": [], "options": {"queue": "hb"}})).await;
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["hb"], "worker_id": "js-1", "visibility_timeout_ms": 1000})).await;
    assert_eq!(r.body["jobs"][0]["id"], job["id"]);
    let before = s.db.store.job(id(&job).parse().expect("uuid")).await.expect("job").lock_expires_at.expect("locked");
    // A beat refused for any of its fields extends nothing: the claim stands as it was.
    for (field, bad) in [("state", json!(7)), ("memory_mb", json!("12 MB")), ("cpu_percent", json!(-3)), ("concurrency", json!(-1))] {
        let beat = json!({"worker_id": "js-1", "active_jobs": [job["id"]], "visibility_timeout_ms": 86_400_000, field: bad});
        let r = s.post("/ojs/v1/workers/heartbeat", beat).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some(field)), "{field} = {bad}: {}", r.text);
        let now = s.db.store.job(id(&job).parse().expect("uuid")).await.expect("job").lock_expires_at;
        assert_eq!(now, Some(before), "a refused beat ({field}) left the claim as it was");
    }
    // The JS / Go SDK shape: a count in `active_jobs`, the ids in `active_job_ids`.
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "js-1", "active_jobs": 1, "active_job_ids": [job["id"]], "visibility_timeout_ms": 60000})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!((r.body["jobs_extended"].clone(), r.body["jobs_busy"].clone()), (json!([job["id"]]), json!([])));
    let after = s.db.store.job(id(&job).parse().expect("uuid")).await.expect("job").lock_expires_at.expect("locked");
    assert!(after > before + jiff::SignedDuration::from_secs(30), "the claim was extended: {before} -> {after}");
    // The OJS shape still works, and a count alone is accepted (it extends nothing: logged).
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "py-1", "active_jobs": [job["id"]]})).await;
    assert_eq!(r.body["jobs_extended"], json!([job["id"]]));
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "go-1", "active_jobs": 2})).await;
    assert_eq!((r.status, r.body["jobs_extended"].clone()), (StatusCode::OK, json!([])));
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "go-1", "active_jobs": -1})).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("active_jobs")));
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "go-1", "active_job_ids": ["nope"]})).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("active_job_ids[0]")));
}

#[tokio::test]
async fn unique_jobs_by_args_fields_meta_fields_and_the_sdk_aliases() {
    let s = TestServer::new().await;
    let by_id = |x: i64| json!({"type": "uniq.args", "args": [{"id": 7, "x": x}], "options": {"unique": {"keys": ["type", "args"], "args_keys": ["id"]}}});
    let first = s.enqueue(by_id(1)).await;
    let r = s.post("/ojs/v1/jobs", by_id(2)).await;
    assert_eq!((r.status, r.body["error"]["details"]["existing_job_id"].clone()), (StatusCode::CONFLICT, first["id"].clone()), "{}", r.text);
    // The JS SDK's `key`: names of args fields.
    let r = s.post("/ojs/v1/jobs", json!({"type": "uniq.args", "args": [{"id": 7, "x": 3}], "options": {"unique": {"key": ["id"]}}})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let r = s.post("/ojs/v1/jobs", json!({"type": "uniq.args", "args": [{"id": 8, "x": 1}], "options": {"unique": {"key": ["id"]}}})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // The Python SDK's `key`: dimension names.
    let py = json!({"type": "uniq.py", "args": ["a"], "options": {"unique": {"key": ["type", "queue", "args"]}}});
    s.enqueue(py.clone()).await;
    assert_eq!(s.post("/ojs/v1/jobs", py).await.status, StatusCode::CONFLICT);
    // args_keys naming a field the args lack, meta without meta_keys: refused, field named.
    let r = s.post("/ojs/v1/jobs", json!({"type": "uniq.args", "args": [{"x": 1}], "options": {"unique": {"key": ["id"]}}})).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("options.unique.args_keys[0]")), "{}", r.text);
    let r = s.post("/ojs/v1/jobs", json!({"type": "uniq.meta", "args": [], "options": {"unique": {"keys": ["meta"]}}})).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("options.unique.meta_keys")), "{}", r.text);
    let by_tenant = |trace: i64| json!({"type": "uniq.meta", "args": [], "meta": {"tenant": "acme", "trace": trace}, "options": {"unique": {"keys": ["meta"], "meta_keys": ["tenant"]}}});
    s.enqueue(by_tenant(1)).await;
    assert_eq!(s.post("/ojs/v1/jobs", by_tenant(2)).await.status, StatusCode::CONFLICT);
    // Go's `period_ms`: the key stops counting after the period (a minute, read in
    // milliseconds; its end is then brought forward rather than waited for).
    let go = json!({"type": "uniq.go", "args": [], "options": {"unique": {"keys": ["type"], "period_ms": 60_000}}});
    s.enqueue(go.clone()).await;
    assert_eq!(s.post("/ojs/v1/jobs", go.clone()).await.status, StatusCode::CONFLICT);
    let left: f64 = sqlx::query_scalar("SELECT extract(epoch FROM unique_until - now())::float8 FROM jobs WHERE type = 'uniq.go'")
        .fetch_one(s.db.store.pool())
        .await
        .expect("unique_until");
    assert!(left > 50.0 && left <= 60.0, "{left} s of the period left");
    sqlx::query("UPDATE jobs SET unique_until = now() - interval '1 millisecond' WHERE type = 'uniq.go'").execute(s.db.store.pool()).await.expect("end the period");
    assert_eq!(s.post("/ojs/v1/jobs", go).await.status, StatusCode::CREATED, "period_ms expired the key");
    let r = s.post("/ojs/v1/jobs", json!({"type": "uniq.go", "args": [], "options": {"unique": {"period_ms": 0}}})).await;
    assert_eq!(r.error_field(), Some("options.unique.period_ms"));
}

#[tokio::test]
async fn cancel_answers_the_previous_state() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "c.job", "args": [], "options": {"queue": "cq"}})).await;
    let r = s.call("DELETE", &format!("/ojs/v1/jobs/{}", id(&job)), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!((r.body["job"]["state"].as_str(), r.body["job"]["previous_state"].as_str()), (Some("cancelled"), Some("available")));
    let job = s.enqueue(json!({"type": "c.job", "args": [], "options": {"queue": "cq"}})).await;
    s.fetch("cq").await;
    let r = s.call("DELETE", &format!("/ojs/v1/jobs/{}", id(&job)), None).await;
    assert_eq!(r.body["job"]["previous_state"], "active");
    let r = s.call("DELETE", &format!("/ojs/v1/jobs/{}", id(&job)), None).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "cancelling twice is a conflict");
}

#[tokio::test]
async fn unsupported_features_answer_422_unsupported() {
    let s = TestServer::new().await;
    for (method, path) in [("GET", "/ojs/v1/schemas"), ("POST", "/ojs/v1/webhooks"), ("GET", "/ojs/v1/jobs/019539a4-bbbb-7000-8000-000000000001/checkpoint")] {
        let r = s.call(method, path, Some(json!({}))).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("unsupported")), "{method} {path}: {}", r.text);
        r.assert_ojs_error(path);
    }
    // A job's own throttle, in the SDKs' shorthand or at the top level, is the key's.
    let r = s.post("/ojs/v1/jobs", json!({"type": "rl.job", "args": [], "options": {"rate_limit": {"key": "tenant-1", "max_per_second": 5}}})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = s.post("/ojs/v1/jobs", json!({"type": "rl.job", "args": [], "rate_limit": {"key": "tenant-1", "throttle": {"limit": 2, "period": "PT1S"}}})).await;
    assert_eq!((r.status, r.body["job"]["rate_limited"].as_bool()), (StatusCode::CREATED, Some(true)), "at the top level too: {}", r.text);
    let r = s.get("/ojs/v1/rate-limits/tenant-1").await;
    assert_eq!(r.body["limit"]["throttle"], json!({"limit": 2, "period": "PT1S"}), "the newest sets it: {}", r.text);
    let r = s.get("/ojs/v1/no-such-thing").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "a typo is still a 404");
    let r = s.raw("GET", "/ojs/v1/health", &[("ojs-version", "2.0")], Vec::new()).await;
    assert_eq!((r.status, r.body["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("unsupported")), "{}", r.text);
    assert_eq!(s.raw("GET", "/ojs/v1/health", &[("ojs-version", "1.0")], Vec::new()).await.status, StatusCode::OK);
}

#[tokio::test]
async fn progress_is_reported_read_back_and_an_event() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "p.job", "args": [], "options": {"queue": "pq"}})).await;
    let path = format!("/ojs/v1/jobs/{}/progress", id(&job));
    let r = s.get(&path).await;
    assert_eq!((r.status, &r.body["progress"], &r.body["updated_at"]), (StatusCode::OK, &json!(0.0), &Value::Null), "none yet: {}", r.text);
    // Not running yet: a conflict.
    let r = s.post("/ojs/v1/workers/progress", json!({"job_id": job["id"], "percentage": 10})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    s.fetch("pq").await;
    // As the SDKs send it (`reportProgress(transport, id, 40, "rows", {rows: 40})`).
    let r = s.post("/ojs/v1/workers/progress", json!({"job_id": job["id"], "percentage": 40, "message": "rows", "data": {"rows": 40}})).await;
    assert_eq!((r.status, &r.body["progress"], &r.body["worker_id"]), (StatusCode::OK, &json!(40.0), &json!("w1")), "{}", r.text);
    let r = s.post("/ojs/v1/workers/progress", json!({"job_id": job["id"], "progress": 62.5})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.get(&path).await;
    assert_eq!((&r.body["percentage"], &r.body["message"], &r.body["attempt"]), (&json!(62.5), &Value::Null, &json!(1)), "the latest: {}", r.text);
    // Bad reports are refused by field, and keep nothing.
    for (body, field) in [
        (json!({"job_id": job["id"]}), "percentage"),
        (json!({"job_id": job["id"], "percentage": 101}), "percentage"),
        (json!({"job_id": job["id"], "percentage": "50"}), "percentage"),
        (json!({"job_id": job["id"], "progress": -1}), "progress"),
        (json!({"job_id": job["id"], "percentage": 5, "message": 7}), "message"),
        (json!({"job_id": job["id"], "percentage": 5, "message": "x".repeat(1001)}), "message"),
        (json!({"job_id": job["id"], "percentage": 5, "data": "y".repeat(20_000)}), "data"),
        (json!({"job_id": "nope", "percentage": 5}), "job_id"),
        (json!({"percentage": 5}), "job_id"),
    ] {
        let r = s.post("/ojs/v1/workers/progress", body).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some(field)), "{}", r.text);
    }
    assert_eq!(s.get(&path).await.body["percentage"], json!(62.5));
    assert_eq!(s.get("/ojs/v1/jobs/019539a4-bbbb-7000-8000-000000000001/progress").await.status, StatusCode::NOT_FOUND);
    // OJS job.progress events.
    let r = s.get("/ojs/v1/events?types=job.progress").await;
    let data: Vec<&Value> = r.body["events"].as_array().expect("events").iter().map(|e| &e["data"]).collect();
    assert_eq!(data.len(), 2, "{}", r.text);
    assert_eq!((&data[0]["progress_percent"], &data[1]["progress_percent"], &data[1]["progress_message"]), (&json!(62.5), &json!(40.0), &json!("rows")));
    assert_eq!((&data[0]["worker_id"], &data[0]["attempt"], &data[0]["job_type"]), (&json!("w1"), &json!(1), &json!("p.job")));
}

#[tokio::test]
async fn handler_response_codes_decide_over_the_policy() {
    let s = TestServer::new().await;
    let mut outcomes = Vec::new();
    for code in ["RETRY", "DISCARD", "DEAD_LETTER", "FAIL"] {
        let job = s.enqueue(json!({"type": "codes.job", "args": [code], "options": {"queue": "codes", "retry": {"max_attempts": 5, "initial_interval": "PT1H", "max_interval": "PT2H"}}})).await;
        assert_eq!(s.fetch("codes").await["id"], job["id"]);
        let r = s.post("/ojs/v1/workers/nack", json!({"job_id": job["id"], "error": {"code": code, "type": "handler.said", "message": code}})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        outcomes.push((code, r.body["state"].as_str().unwrap_or("").to_owned(), r.body.get("dead_letter").is_some()));
    }
    assert_eq!(
        outcomes,
        [("RETRY", "retryable".into(), false), ("DISCARD", "discarded".into(), false), ("DEAD_LETTER", "discarded".into(), true), ("FAIL", "discarded".into(), false)]
    );
    let r = s.get("/ojs/v1/dead-letter?queue=codes").await;
    assert_eq!(r.body["jobs"].as_array().map(Vec::len), Some(1), "only DEAD_LETTER dead-letters");
}

#[tokio::test]
async fn clients_accepting_only_json_get_the_json_alias() {
    let s = TestServer::new().await;
    let r = s.raw("GET", "/ojs/v1/health", &[("accept", "application/json")], Vec::new()).await;
    assert_eq!(r.header("content-type"), Some("application/json"));
    for accept in [None, Some("application/openjobspec+json"), Some("*/*")] {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let r = s.raw("GET", "/ojs/v1/health", &headers, Vec::new()).await;
        assert_eq!(r.header("content-type"), Some("application/openjobspec+json"), "{accept:?}");
    }
}
