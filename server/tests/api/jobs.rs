//! Job endpoints beyond what the level 0/1 suites check: batch, unique keys, delayed and
//! relative times, TTL, priorities, queues, events, request ids, test mode.

use std::time::Duration;

use axum::http::StatusCode;
use jiff::{SignedDuration, Timestamp};
use rebound_server::config::{ApiAuth, ServerConfig};
use rebound_server::maintenance::run_pass;
use serde_json::{Value, json};

use crate::common::TestServer;

fn ts(v: &Value) -> Timestamp {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not a timestamp: {v}"))
}

#[tokio::test]
async fn batch_enqueue_is_all_or_nothing_and_ordered() {
    let s = TestServer::new().await;
    let jobs: Vec<Value> = (0..5).map(|i| json!({"type": "batch.item", "args": [i], "options": {"queue": "bq"}})).collect();
    let r = s.post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["count"], 5);
    for i in 0..5 {
        assert_eq!(s.fetch("bq").await["args"], json!([i]), "batch jobs run in the order given");
    }
    // A duplicate id inside the batch rejects the whole batch.
    let id = "019539a4-bbbb-7000-8000-000000000001";
    let r = s
        .post("/ojs/v1/jobs/batch", json!({"jobs": [{"type": "a", "args": [], "id": id}, {"type": "b", "args": []}, {"type": "c", "args": [], "id": id}]}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.body["error"]["code"], "duplicate");
    assert_eq!(s.job_count().await, 5);
}

#[tokio::test]
async fn unique_keys_reject_ignore_replace() {
    let s = TestServer::new().await;
    let job = |on_conflict: &str| json!({"type": "uniq.job", "args": [1], "options": {"unique": {"keys": ["type", "args"], "on_conflict": on_conflict}}});
    let first = s.enqueue(job("reject")).await;
    let r = s.post("/ojs/v1/jobs", job("reject")).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.body["error"]["code"], "duplicate");
    assert_eq!(r.body["error"]["details"]["existing_job_id"], first["id"]);
    let r = s.post("/ojs/v1/jobs", job("ignore")).await;
    assert_eq!(r.status, StatusCode::OK, "ignore answers 200 with the existing job");
    assert_eq!(r.body["job"]["id"], first["id"]);
    let r = s.post("/ojs/v1/jobs", job("replace")).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_ne!(r.body["job"]["id"], first["id"]);
    let old = s.get(&format!("/ojs/v1/jobs/{}", first["id"].as_str().unwrap_or(""))).await;
    assert_eq!(old.body["job"]["state"], "cancelled");
    // Different args: no clash.
    let r = s.post("/ojs/v1/jobs", json!({"type": "uniq.job", "args": [2], "options": {"unique": {"keys": ["type", "args"]}}})).await;
    assert_eq!(r.status, StatusCode::CREATED);
}

#[tokio::test]
async fn delayed_jobs_relative_times_and_ttl() {
    let s = TestServer::new().await;
    let before = Timestamp::now();
    let job = s.enqueue(json!({"type": "later.job", "args": [], "options": {"queue": "dq", "scheduled_at": "+PT1S", "expires_at": "2099-12-31T23:59:59Z"}})).await;
    let after = Timestamp::now();
    assert_eq!(job["state"], "scheduled");
    assert_eq!(job["expires_at"], "2099-12-31T23:59:59Z", "expires_at is echoed as sent");
    let at = ts(&job["scheduled_at"]);
    let second = SignedDuration::from_secs(1);
    assert!(at >= before.checked_add(second).expect("ts") - SignedDuration::from_millis(1) && at <= after.checked_add(second).expect("ts"), "{at}");
    assert_eq!(s.fetch("dq").await, Value::Null, "not fetchable before it is due");

    // A job whose TTL passed is discarded without completed_at and never fetched.
    let expiring = s.enqueue(json!({"type": "ttl.job", "args": [], "options": {"queue": "tq", "expires_at": "+PT0.2S"}})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = run_pass(&s.db.store, &s.state.metrics).await.expect("maintenance pass");
    assert_eq!((report.promoted, report.expired), (1, 1));
    assert_eq!(s.fetch("dq").await["id"], job["id"]);
    assert_eq!(s.fetch("tq").await, Value::Null);
    let r = s.get(&format!("/ojs/v1/jobs/{}", expiring["id"].as_str().unwrap_or(""))).await;
    assert_eq!(r.body["job"]["state"], "discarded");
    assert!(r.body["job"].get("completed_at").is_none(), "{}", r.text);
}

#[tokio::test]
async fn priorities_then_fifo() {
    let s = TestServer::new().await;
    let low = s.enqueue(json!({"type": "p.job", "args": ["low"], "options": {"queue": "pq", "priority": -5}})).await;
    let high1 = s.enqueue(json!({"type": "p.job", "args": ["high1"], "options": {"queue": "pq", "priority": 50}})).await;
    let high2 = s.enqueue(json!({"type": "p.job", "args": ["high2"], "options": {"queue": "pq", "priority": 50}})).await;
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["pq"], "count": 3})).await;
    let ids: Vec<&Value> = r.body["jobs"].as_array().expect("jobs").iter().map(|j| &j["id"]).collect();
    assert_eq!(ids, [&high1["id"], &high2["id"], &low["id"]]);
}

#[tokio::test]
async fn queues_pause_resume_and_stats() {
    let s = TestServer::new().await;
    let r = s.post("/ojs/v1/queues/paused-q/pause", json!({})).await;
    assert_eq!((r.status, &r.body["queue"]["paused"]), (StatusCode::OK, &json!(true)), "{}", r.text);
    let job = s.enqueue(json!({"type": "q.job", "args": [], "options": {"queue": "paused-q"}})).await;
    assert_eq!(s.fetch("paused-q").await, Value::Null, "a paused queue accepts jobs but hands none out");
    let r = s.get("/ojs/v1/queues/paused-q/stats").await;
    assert_eq!(r.body["stats"]["available"], 1);
    assert_eq!(r.body["status"], "paused");
    let r = s.post("/ojs/v1/queues/paused-q/resume", json!({})).await;
    assert_eq!(r.body["queue"]["paused"], false);
    assert_eq!(s.fetch("paused-q").await["id"], job["id"]);
    let r = s.get("/ojs/v1/queues/paused-q/stats").await;
    assert_eq!((r.body["stats"]["available"].as_i64(), r.body["stats"]["active"].as_i64()), (Some(0), Some(1)));
    let r = s.get("/ojs/v1/queues").await;
    assert_eq!(r.body["queues"][0]["name"], "paused-q");
    let audit = s.db.store.audit_log(&Default::default()).await.expect("audit");
    assert!(audit.iter().any(|e| e.action == "queue.pause"));
}

#[tokio::test]
async fn events_record_what_happened() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "ev.job", "args": [], "options": {"queue": "eq", "retry": {"max_attempts": 2, "initial_interval": "PT1H", "max_interval": "PT2H"}}})).await;
    s.fetch("eq").await;
    s.post("/ojs/v1/workers/nack", json!({"job_id": job["id"], "error": {"code": "e1", "message": "first"}})).await;
    let r = s.get("/ojs/v1/events?queues=eq").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let types: Vec<&str> = r.body["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types, ["job.failed", "job.enqueued"], "newest first");
    assert_eq!(r.body["events"][0]["data"]["error"]["code"], "e1");
    let r = s.get("/ojs/v1/events?types=job.completed&queues=eq").await;
    assert_eq!(r.body["events"], json!([]));
    let r = s.get("/ojs/v1/events?queues=other").await;
    assert_eq!(r.body["events"], json!([]));
}

#[tokio::test]
async fn headers_request_ids_and_location() {
    let s = TestServer::new().await;
    let r = s
        .raw("POST", "/ojs/v1/jobs", &[("content-type", "application/json"), ("x-request-id", "client-42")], br#"{"type":"h.job","args":[]}"#.to_vec())
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.header("x-request-id"), Some("client-42"));
    assert_eq!(r.header("content-type"), Some("application/openjobspec+json"));
    assert_eq!(r.header("ojs-version"), Some("1.0"));
    let id = r.body["job"]["id"].as_str().expect("id");
    assert_eq!(r.header("location"), Some(format!("/ojs/v1/jobs/{id}").as_str()));
    let r = s.raw("GET", "/ojs/v1/jobs/019539a4-0000-7000-8000-000000000009", &[("x-request-id", "client-43")], Vec::new()).await;
    assert_eq!(r.body["error"]["request_id"], "client-43");
    let r = s.get("/ojs/v1/jobs/019539a4-0000-7000-8000-000000000009").await;
    let generated = r.header("x-request-id").expect("a request id is generated");
    assert!(generated.starts_with("req_"));
    assert_eq!(r.body["error"]["request_id"], generated);
}

#[tokio::test]
async fn test_mode_reset_and_heartbeat_directives() {
    let s = TestServer::with_config(ServerConfig { api_auth: ApiAuth::None, test_mode: true, ..ServerConfig::default() }).await;
    let quiet = s.enqueue(json!({"type": "t.job", "args": [], "options": {"queue": "tm", "metadata": {"test_directive": "quiet"}}})).await;
    assert_eq!(quiet["options"]["metadata"]["test_directive"], "quiet", "unmodelled options are kept");
    s.fetch("tm").await;
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w1", "active_jobs": [quiet["id"]]})).await;
    assert_eq!(r.body["state"], "quiet", "{}", r.text);
    assert_eq!(r.body["jobs_extended"], json!([quiet["id"]]));
    let r = s.post("/ojs/v1/admin/reset", json!({})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(s.job_count().await, 0);

    // Outside test mode the same metadata changes nothing.
    let prod = TestServer::new().await;
    let job = prod.enqueue(json!({"type": "t.job", "args": [], "options": {"queue": "tm", "metadata": {"test_directive": "terminate"}}})).await;
    prod.fetch("tm").await;
    let r = prod.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w1", "active_jobs": [job["id"]]})).await;
    assert_eq!(r.body["state"], "running");
    let workers = prod.db.store.workers().await.expect("workers");
    assert_eq!(workers.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(), ["w1"], "heartbeats register the worker");
}

#[tokio::test]
async fn nack_requeue_does_not_count_the_attempt() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "r.job", "args": [], "options": {"queue": "rq"}})).await;
    assert_eq!(s.fetch("rq").await["attempt"], 1);
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": job["id"], "requeue": true, "error": {"code": "cancelled", "message": "shutting down"}})).await;
    assert_eq!((r.body["state"].as_str(), r.body["attempt"].as_i64()), (Some("available"), Some(0)), "{}", r.text);
    assert_eq!(s.fetch("rq").await["attempt"], 1);
}

#[tokio::test]
async fn expired_claims_are_rescued_and_rerun() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "v.job", "args": [], "options": {"queue": "vq"}})).await;
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["vq"], "visibility_timeout_ms": 1})).await;
    assert_eq!(r.body["jobs"][0]["id"], job["id"]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let report = run_pass(&s.db.store, &s.state.metrics).await.expect("pass");
    assert_eq!(report.rescued.stalled, 1);
    let r = s.get(&format!("/ojs/v1/jobs/{}", job["id"].as_str().unwrap_or(""))).await;
    assert_eq!(r.body["job"]["state"], "available");
    assert_eq!(r.body["job"]["errors"][0]["type"], "rebound.stalled");
}
