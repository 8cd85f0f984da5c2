//! A queue purge deletes at most `BULK_LIMIT` jobs per call and says when matching jobs remain,
//! so a capped count is not taken for the whole purge.

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
