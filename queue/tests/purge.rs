//! A queue purge deletes at most `BULK_LIMIT` jobs per call and says when matching jobs remain,
//! so a capped count is not taken for the whole purge; and it deletes only what still matches
//! when it gets to a row.

use rebound_queue::JobState;
use rebound_queue::store::{Actor, BULK_LIMIT};
use rebound_queue::testing::TestDb;

#[tokio::test]
async fn a_purge_that_reaches_the_cap_says_more_remain() {
    let db = TestDb::new().await;
    let s = &db.store;
    // Written directly: enqueueing this many one by one would take the test's whole budget.
    sqlx::query("INSERT INTO jobs (id, type, queue, state, completed_at) SELECT md5('purge-' || g)::uuid, 'purge.job', 'big', 'completed', now() - interval '1 hour' FROM generate_series(1, $1) AS g")
        .bind(BULK_LIMIT + 1)
        .execute(s.pool())
        .await
        .unwrap();
    let actor = Actor::new("ops");
    let first = s.purge_queue("big", &[JobState::Completed], None, &actor).await.unwrap();
    assert_eq!(first, (BULK_LIMIT as u64, true), "the cap was reached with one job left");
    let second = s.purge_queue("big", &[JobState::Completed], None, &actor).await.unwrap();
    assert_eq!(second, (1, false));
    // Nothing left to purge: nothing deleted, nothing remaining.
    let none = s.purge_queue("big", &[JobState::Completed], None, &actor).await.unwrap();
    assert_eq!(none, (0, false));
}

/// A purge of a queue's waiting jobs picks its ids when its statement starts; a job claimed
/// while the purge waits for its row is running by the time the purge gets it, and must not be
/// deleted under its worker.
#[tokio::test]
async fn a_job_claimed_while_a_purge_waits_for_it_is_not_deleted() {
    let db = TestDb::new().await;
    let s = &db.store;
    let id = s.enqueue(rebound_queue::NewJob::new("purge.race", serde_json::json!([])).queue("racy")).await.unwrap().job.id;
    // A claim holding the row, its transaction still open.
    let mut claim = s.pool().begin().await.unwrap();
    sqlx::query("UPDATE jobs SET state = 'active', attempt = 1, started_at = now(), locked_by = 'w1', lock_expires_at = now() + interval '1 minute' WHERE id = $1")
        .bind(id)
        .execute(&mut *claim)
        .await
        .unwrap();
    let purge = {
        let s = s.clone();
        tokio::spawn(async move { s.purge_queue("racy", &[JobState::Available], None, &Actor::new("ops")).await })
    };
    db.until_a_statement_waits_for_a_lock().await;
    claim.commit().await.unwrap();
    assert_eq!(purge.await.unwrap().unwrap(), (0, false));
    assert_eq!(s.job(id).await.unwrap().state, JobState::Active, "still there, running");
}
