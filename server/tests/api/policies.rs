//! The admin retry-policy API: put / get / versions / delete / preview and validation, and a
//! policy edit applying to the next failure of a job already in flight.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::common::TestServer;

#[tokio::test]
async fn put_get_versions_delete() {
    let s = TestServer::new().await;
    let r = s.call("PUT", "/ojs/v1/admin/policies/email.send", Some(json!({"max_attempts": 5, "initial_interval": "PT2S"}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["policy"]["version"], 1);
    assert_eq!(r.body["policy"]["policy"], json!({"max_attempts": 5, "initial_interval": "PT2S"}));
    assert_eq!(r.body["effective"]["policy"]["max_attempts"], 5);
    assert_eq!(r.body["effective"]["sources"]["max_attempts"], "type");
    assert_eq!(r.body["effective"]["sources"]["backoff_coefficient"], "default");
    assert_eq!(r.body["policy"]["updated_by"], "api:anonymous");

    let r = s.call("PUT", "/ojs/v1/admin/policies/email.send?note=raise%20budget", Some(json!({"max_attempts": 7}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["policy"]["version"], 2);
    // A saved policy replaces the previous version whole: initial_interval is back to the default.
    assert_eq!(r.body["effective"]["policy"]["initial_interval"], "PT1S");

    // The global default layer applies under every type.
    let r = s.call("PUT", "/ojs/v1/admin/policies/*", Some(json!({"max_attempts": 10, "on_exhaustion": "dead_letter"}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.get("/ojs/v1/admin/policies/email.send").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["effective"]["policy"]["max_attempts"], 7);
    assert_eq!(r.body["effective"]["policy"]["on_exhaustion"], "dead_letter");
    assert_eq!(r.body["effective"]["sources"]["on_exhaustion"], "default");

    let r = s.get("/ojs/v1/admin/policies").await;
    let keys: Vec<&str> = r.body["policies"].as_array().expect("list").iter().filter_map(|p| p["job_type"].as_str()).collect();
    assert_eq!(keys, ["*", "email.send"]);
    assert_eq!(r.body["builtin_defaults"]["max_attempts"], 3);

    let r = s.get("/ojs/v1/admin/policies/email.send/versions").await;
    let versions = r.body["versions"].as_array().expect("versions");
    assert_eq!(versions.iter().map(|v| v["version"].as_i64().unwrap_or(0)).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(versions[0]["note"], "raise budget");

    let r = s.call("DELETE", "/ojs/v1/admin/policies/email.send", None).await;
    assert_eq!((r.status, r.body["deleted"].as_bool()), (StatusCode::OK, Some(true)), "{}", r.text);
    assert_eq!(s.get("/ojs/v1/admin/policies/email.send").await.status, StatusCode::NOT_FOUND);
    let r = s.get("/ojs/v1/admin/policies/email.send/versions").await;
    assert_eq!(r.body["versions"][0]["version"], 3);
    assert_eq!(r.body["versions"][0]["policy"], Value::Null, "a deletion is recorded as a version");

    // Every change is audited under the API caller.
    let audit = s.db.store.audit_log(&Default::default()).await.expect("audit");
    assert!(audit.iter().any(|e| e.action == "policy.delete" && e.actor == "api:anonymous"));
}

#[tokio::test]
async fn invalid_policies_are_refused_whole() {
    let s = TestServer::new().await;
    let ok = s.call("PUT", "/ojs/v1/admin/policies/report.build", Some(json!({"max_attempts": 4}))).await;
    assert_eq!(ok.status, StatusCode::OK);
    for (body, field) in [
        (json!({"max_attempts": 9, "backoff_coefficient": 0.1}), "backoff_coefficient"),
        (json!({"max_attempts": 9, "initial_interval": "PT1H", "max_interval": "PT1M"}), "max_interval"),
        (json!({"backoff_strategy": "custom", "schedule": []}), "schedule"),
    ] {
        let r = s.call("PUT", "/ojs/v1/admin/policies/report.build", Some(body.clone())).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {}", r.text);
        r.assert_ojs_error("invalid policy");
        assert_eq!(r.body["error"]["type"], "validation_error");
        assert_eq!(r.error_field(), Some(field));
        assert!(r.body["error"]["message"].as_str().is_some_and(|m| m.contains(field)));
    }
    // The saved policy and its history are untouched.
    let r = s.get("/ojs/v1/admin/policies/report.build").await;
    assert_eq!(r.body["policy"]["version"], 1);
    assert_eq!(r.body["policy"]["policy"], json!({"max_attempts": 4}));
    assert_eq!(s.get("/ojs/v1/admin/policies/report.build/versions").await.body["versions"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn preview_plans_the_schedule() {
    let s = TestServer::new().await;
    s.call("PUT", "/ojs/v1/admin/policies/*", Some(json!({"on_exhaustion": "dead_letter"}))).await;
    let r = s
        .post(
            "/ojs/v1/admin/policies/preview",
            json!({"job_type": "email.send", "policy": {"max_attempts": 4, "initial_interval": "PT1S", "backoff_coefficient": 2.0, "jitter": false}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let rows = r.body["planned_retries"].as_array().expect("rows");
    let field = |k: &str| rows.iter().map(|row| row[k].as_i64().unwrap_or(-1)).collect::<Vec<_>>();
    assert_eq!(field("retry"), [1, 2, 3]);
    assert_eq!(field("attempt"), [2, 3, 4]);
    assert_eq!(field("delay_ms"), [1000, 2000, 4000]);
    assert_eq!(field("cumulative_ms"), [1000, 3000, 7000]);
    assert_eq!(field("band_min_ms"), field("delay_ms"), "no jitter: the band is the delay");
    assert_eq!(r.body["total_delay_ms"], 7000);
    assert_eq!(r.body["total_delay"], "PT7S");
    assert_eq!(r.body["max_attempts"], 4);
    assert_eq!(r.body["policy"]["on_exhaustion"], "dead_letter", "the global default layer is under the preview");
    assert_eq!(r.body["sources"]["on_exhaustion"], "default");
    assert_eq!(r.body["sources"]["max_attempts"], "type");

    // With OJS jitter the band is ×[0.5, 1.5]; the preview writes nothing.
    let r = s.post("/ojs/v1/admin/policies/preview", json!({"policy": {"max_attempts": 2, "jitter": true}, "limit": 1})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["planned_retries"][0]["band_min_ms"], 500);
    assert_eq!(r.body["planned_retries"][0]["band_max_ms"], 1500);
    assert_eq!(s.db.store.policies().await.expect("policies").len(), 1);

    // Previewing the global default itself.
    let r = s.post("/ojs/v1/admin/policies/preview", json!({"job_type": "*", "policy": {"max_attempts": 1}})).await;
    assert_eq!(r.body["planned_retries"], json!([]));
    assert_eq!(r.body["total_delay_ms"], 0);
    assert_eq!(r.body["policy"]["on_exhaustion"], "discard", "the previewed `*` replaces the saved one");
}

#[tokio::test]
async fn a_policy_edit_applies_to_the_next_failure_of_a_job_in_flight() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "live.edit", "args": [], "options": {"queue": "live"}})).await;
    assert_eq!(job["max_attempts"], 3);
    let fetched = s.fetch("live").await;
    assert_eq!(fetched["id"], job["id"]);
    let r = s.call("PUT", "/ojs/v1/admin/policies/live.edit", Some(json!({"max_attempts": 1, "on_exhaustion": "dead_letter"}))).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": job["id"], "error": {"code": "handler_error", "message": "boom"}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["state"], "discarded", "the live policy (1 attempt) decided, not the one at enqueue");
    assert_eq!(r.body["max_attempts"], 1);
    let dlq = s.get("/ojs/v1/dead-letter?queue=live").await;
    assert_eq!(dlq.body["jobs"][0]["id"], job["id"]);
}
