//! `/metrics` counts what passes through the API and reads queue depth from the store.

use axum::http::StatusCode;
use serde_json::json;

use crate::common::TestServer;

#[tokio::test]
async fn counters_follow_enqueue_ack_and_nack() {
    let s = TestServer::new().await;
    let retry_once = json!({"max_attempts": 2, "initial_interval": "PT1H", "max_interval": "PT2H"});
    for i in 0..3 {
        s.enqueue(json!({"type": "metrics.job", "args": [i], "options": {"queue": "mq", "retry": if i == 2 { retry_once.clone() } else { json!({"max_attempts": 1}) }}})).await;
    }
    let first = s.fetch("mq").await;
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": first["id"]})).await;
    assert_eq!(r.status, StatusCode::OK);
    let second = s.fetch("mq").await;
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": second["id"], "error": {"code": "boom", "message": "m"}})).await;
    assert_eq!(r.body["state"], "discarded");
    let third = s.fetch("mq").await;
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": third["id"], "error": {"code": "boom", "message": "m"}})).await;
    assert_eq!(r.body["state"], "retryable");

    let scraped = std::time::Instant::now();
    let r = s.get("/metrics").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/plain")));
    let label = "{type=\"metrics.job\",queue=\"mq\"}";
    for expected in [
        format!("rebound_jobs_enqueued_total{label} 3"),
        format!("rebound_jobs_completed_total{label} 1"),
        format!("rebound_jobs_failed_total{label} 2"),
        format!("rebound_jobs_discarded_total{label} 1"),
        format!("rebound_jobs_retried_total{label} 1"),
        "rebound_queue_jobs{queue=\"mq\",state=\"completed\"} 1".to_owned(),
        "rebound_queue_jobs{queue=\"mq\",state=\"discarded\"} 1".to_owned(),
        "rebound_queue_jobs{queue=\"mq\",state=\"retryable\"} 1".to_owned(),
        "rebound_queue_jobs{queue=\"mq\",state=\"available\"} 0".to_owned(),
        "rebound_job_start_latency_seconds_count{queue=\"mq\"} 3".to_owned(),
        "rebound_database_up 1".to_owned(),
    ] {
        assert!(r.text.contains(&expected), "missing {expected:?} in:\n{}", r.text);
    }
    assert!(!r.text.contains("rebound_jobs_dead_lettered_total{"), "nothing was dead-lettered");

    // One read of the counts answers every scrape for a second, so a flood of scrapes (the
    // endpoint can be public) costs the database one statement a second.
    s.db.store.pool().close().await;
    // Judged only well inside that second: a loaded machine can take most of it to get here.
    if scraped.elapsed() < rebound_server::health::PROBE_FRESH / 2 {
        assert!(s.get("/metrics").await.text.contains("rebound_database_up 1"), "the last read answers");
    }
    tokio::time::sleep(rebound_server::health::PROBE_FRESH).await;
    assert!(s.get("/metrics").await.text.contains("rebound_database_up 0"), "then the database is read again");
}
