//! Values that passed the field checks but poisoned shared work afterwards: a `max_attempts`
//! beyond `jobs.max_attempts`' integer, JSON nested too deep to read back once a workflow
//! wraps it, a search paged to a far offset, a heartbeat listing ids without bound.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::common::TestServer;

/// `1` inside `levels` arrays.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |v, _| json!([v]))
}

fn assert_refused(r: &crate::common::Reply, field_prefix: &str, context: &str) {
    assert!(r.status.is_client_error(), "{context}: status {}: {}", r.status, r.text);
    r.assert_ojs_error(context);
    assert!(r.error_field().is_some_and(|f| f.starts_with(field_prefix)), "{context}: field {:?}, expected {field_prefix}…", r.error_field());
}

#[tokio::test]
async fn max_attempts_beyond_the_integer_column_is_refused_everywhere() {
    let s = TestServer::new().await;
    let r = s.call("PUT", "/ojs/v1/admin/policies/email.send", Some(json!({"max_attempts": 3_000_000_000_u64}))).await;
    assert_refused(&r, "max_attempts", "policy");
    assert!(r.body["error"]["message"].as_str().is_some_and(|m| m.contains("2147483647")), "{}", r.text);
    let r = s.post("/ojs/v1/jobs", json!({"type": "email.send", "args": [], "options": {"retry": {"max_attempts": 4_294_967_295_u64}}})).await;
    assert_refused(&r, "options.retry.max_attempts", "job override");
    let r = s.post("/ojs/v1/admin/policies/preview", json!({"policy": {"max_attempts": 2_147_483_648_u64}})).await;
    assert_refused(&r, "policy.max_attempts", "preview");
    assert_eq!(s.job_count().await, 0);
    assert!(s.db.store.policies().await.expect("policies").is_empty());

    // A dead letter re-driven with a stricter policy: the override once reached the cast.
    let id = s.dead_letter("dlq", "boom").await;
    let r = s.post(&format!("/ojs/v1/dead-letter/{id}/retry"), json!({"override": {"retry": {"max_attempts": 3_000_000_000_u64}}})).await;
    assert_refused(&r, "override.retry.max_attempts", "dead-letter override");
    let job = s.db.store.job(id.parse().expect("id")).await.expect("job");
    assert!(job.dead_letter, "the refused re-drive changed the job");

    // At the bound it is accepted, and a policy stored beyond it (before the bound, or by
    // hand) no longer fails the enqueues of its type.
    let r = s.call("PUT", "/ojs/v1/admin/policies/email.send", Some(json!({"max_attempts": 2_147_483_647}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    sqlx::query("INSERT INTO retry_policies (job_type, policy, version, updated_at, updated_by) VALUES ('old.type', '{\"max_attempts\": 3000000000}', 1, now(), 'old')")
        .execute(s.db.store.pool())
        .await
        .expect("insert policy");
    let job = s.enqueue(json!({"type": "old.type", "args": []})).await;
    assert_eq!(job["max_attempts"], 2_147_483_647, "{job}");
    let r = s.post("/ojs/v1/jobs/batch", json!({"jobs": [{"type": "old.type", "args": [1]}, {"type": "old.type", "args": [2]}]})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
}

#[tokio::test]
async fn a_chain_step_result_too_deep_to_read_back_is_refused_not_stored() {
    let s = TestServer::new().await;
    let r = s
        .post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "steps": [
                {"type": "deep.first", "args": [], "options": {"queue": "deepq"}},
                {"type": "deep.second", "args": [], "options": {"queue": "deepq"}},
            ]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let first = s.fetch("deepq").await;
    assert_eq!(first["type"], "deep.first");

    // Readable as a body (127 levels with it), but the next step's `extra.parent_results`
    // would hold it two levels further down: that row could never be fetched.
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": first["id"], "result": nested(126)})).await;
    assert_refused(&r, "result[0]", "deep result");
    assert!(r.body["error"]["message"].as_str().is_some_and(|m| m.contains("nested more than 64 levels")), "{}", r.text);
    // Nothing moved on: fetching still works, and a storable result completes the step.
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["deepq"], "worker_id": "w1"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": first["id"], "result": nested(60)})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let second = s.fetch("deepq").await;
    assert_eq!(second["type"], "deep.second", "the next step is fetched and decoded");
}

#[tokio::test]
async fn stored_input_nested_too_deep_is_refused_naming_the_field() {
    let s = TestServer::new().await;
    let r = s.post("/ojs/v1/jobs", json!({"type": "a", "args": [nested(100)]})).await;
    assert_refused(&r, "args[0]", "args");
    let r = s.post("/ojs/v1/jobs", json!({"type": "a", "args": [], "meta": {"k": nested(100)}})).await;
    assert_refused(&r, "meta.k", "meta");
    let r = s.post("/ojs/v1/jobs/batch", json!({"jobs": [{"type": "a", "args": []}, {"type": "a", "args": [nested(100)]}]})).await;
    assert_refused(&r, "jobs[1].args[0]", "batch args");
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": "019539a4-0000-7000-8000-000000000000", "error": {"code": "x", "message": "m", "details": {"d": nested(100)}}})).await;
    assert_refused(&r, "error.details.d", "nack details");
    assert_eq!(s.job_count().await, 0);
    // Deep, but within the bound.
    s.enqueue(json!({"type": "a", "args": [nested(60)]})).await;
}

#[tokio::test]
async fn admin_dead_letter_searches_do_not_skip_to_far_pages() {
    let s = TestServer::new().await;
    s.dead_letter("dlq", "boom").await;
    let r = s.get("/ojs/v1/admin/dead-letter?error_type=nomatch&page=1000000&per_page=100").await;
    assert_refused(&r, "page", "far page of a search");
    let r = s.get("/ojs/v1/admin/dead-letter?error_type=boom&page=2").await;
    assert_refused(&r, "page", "second page of a search");
    let r = s.get("/ojs/v1/admin/dead-letter?error_type=boom").await;
    assert_eq!(r.status, StatusCode::OK, "the first page of a search is served: {}", r.text);
    // Page by page from the first, a search goes on: each page starts where the last ended.
    let second = s.dead_letter("dlq", "boom").await;
    let r = s.get("/ojs/v1/admin/dead-letter?error_type=boom&per_page=1").await;
    assert_eq!((r.status, r.body["items"].as_array().map(Vec::len)), (StatusCode::OK, Some(1)), "{}", r.text);
    assert_eq!(r.body["items"][0]["id"].as_str(), Some(second.as_str()), "newest first: {}", r.text);
    let r = s.get("/ojs/v1/admin/dead-letter?error_type=boom&per_page=1&page=2").await;
    assert_eq!((r.status, r.body["items"].as_array().map(Vec::len)), (StatusCode::OK, Some(1)), "the next page follows the one served: {}", r.text);
    assert_ne!(r.body["items"][0]["id"].as_str(), Some(second.as_str()));
    // Without a search, any page is a keyset walk.
    let r = s.get("/ojs/v1/admin/dead-letter?page=3").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let long = "e".repeat(201);
    let r = s.get(&format!("/ojs/v1/admin/dead-letter?error_type={long}")).await;
    assert_refused(&r, "error_type", "long error_type");
    let r = s.post("/ojs/v1/admin/jobs/bulk/cancel", json!({"filter": {"error_type": long}, "confirm": true})).await;
    assert_refused(&r, "filter.error_type", "bulk filter");
    let r = s.call("DELETE", "/ojs/v1/admin/dead-letter", Some(json!({"error_type": long, "confirm": true}))).await;
    assert_refused(&r, "error_type", "purge filter");
    assert_eq!(s.job_count().await, 2, "nothing was purged");
}

#[tokio::test]
async fn a_heartbeat_lists_at_most_ten_thousand_jobs_across_both_keys() {
    let s = TestServer::new().await;
    let ids = |from: u128| (0..6_000u128).map(|i| uuid::Uuid::from_u128(from + i).to_string()).collect::<Vec<_>>();
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w", "active_jobs": ids(0), "active_job_ids": ids(6_000)})).await;
    assert_refused(&r, "active_job_ids", "both lists over the bound together");
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w", "active_jobs": ids(0), "active_job_ids": ids(0)[..4_000].to_vec()})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}
