//! The maintenance loop promotes delayed jobs while it leads, and lets go on shutdown.

use std::time::Duration;

use rebound_queue::store::{LeaderRole, PruneConfig};
use rebound_server::maintenance;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common::TestServer;

#[tokio::test]
async fn the_loop_promotes_due_jobs_and_releases_leadership() {
    let s = TestServer::new().await;
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(maintenance::run(s.db.store.clone(), s.state.metrics.clone(), Duration::from_millis(200), shutdown.clone()));
    let job = s.enqueue(json!({"type": "m.job", "args": [], "options": {"queue": "mlq", "delay_until": "+PT0.3S"}})).await;
    assert_eq!(job["state"], "scheduled");
    let path = format!("/ojs/v1/jobs/{}", job["id"].as_str().unwrap_or(""));
    let mut state = String::new();
    // Generous deadline: this checks that promotion happens, not how fast.
    for _ in 0..150 {
        state = s.get(&path).await.body["job"]["state"].as_str().unwrap_or("").to_owned();
        if state == "available" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "available");
    shutdown.cancel();
    handle.await.expect("the loop ends on shutdown");
    // Leadership was released: another process can take it at once.
    let lead = s.db.store.try_lead().await.expect("try_lead");
    assert!(lead.is_some(), "leadership was not released on shutdown");
}

/// `--prune`: a server with no Rebound worker beside it keeps retention, under the pruning
/// leadership the workers campaign for: it waits while another process holds it.
#[tokio::test]
async fn a_server_told_to_prune_prunes_while_it_leads_pruning() {
    let s = TestServer::new().await;
    s.enqueue(json!({"type": "p.job", "args": [], "options": {"queue": "prq"}})).await;
    let job = s.fetch("prq").await;
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": job["id"], "result": {}})).await;
    assert_eq!(r.status, axum::http::StatusCode::OK, "{}", r.text);
    let path = format!("/ojs/v1/jobs/{}", job["id"].as_str().unwrap_or(""));

    // A worker leads pruning: the server campaigns and waits.
    let worker = s.db.store.try_lead_as(LeaderRole::Pruning).await.expect("campaign").expect("nobody leads yet");
    let retention = PruneConfig { completed_after: Duration::ZERO, ..PruneConfig::default() };
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(maintenance::run_pruning(s.db.store.clone(), retention, shutdown.clone()));
    // Two of the server's campaigns (a second apart) go by: the job, finished, is still there.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(s.get(&path).await.status, axum::http::StatusCode::OK, "pruned while a worker led pruning");

    // The worker goes: the server takes over and prunes with its own retention.
    worker.release().await.expect("release");
    let mut status = axum::http::StatusCode::OK;
    // Generous deadline: this checks that pruning happens, not how fast.
    for _ in 0..150 {
        status = s.get(&path).await.status;
        if status == axum::http::StatusCode::NOT_FOUND {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, axum::http::StatusCode::NOT_FOUND, "the completed job was pruned");
    shutdown.cancel();
    handle.await.expect("the loop ends on shutdown");
    let lead = s.db.store.try_lead_as(LeaderRole::Pruning).await.expect("campaign");
    assert!(lead.is_some(), "pruning leadership was not released on shutdown");
}
