//! The maintenance loop promotes delayed jobs while it leads, and lets go on shutdown.

use std::time::Duration;

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
