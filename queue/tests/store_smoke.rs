use rebound_queue::testing::TestDb;
use rebound_queue::{NewJob, JobState};
use rebound_queue::store::ClaimRequest;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn enqueue_claim_complete() {
    let db = TestDb::new().await;
    let s = &db.store;
    let e = s.enqueue(NewJob::new("email.send", json!([1]))).await.unwrap();
    assert_eq!(e.job.state, JobState::Available);
    let jobs = s.claim(&ClaimRequest { worker_id: "w1".into(), queues: vec!["default".into()], limit: 10, visibility_timeout: Duration::from_secs(30) }).await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].attempt, 1);
}
