//! Stored values that once poisoned shared work: a retry policy whose `max_attempts` does not
//! fit `jobs.max_attempts` (every enqueue of its type failed), and a row nested deeper than
//! serde_json reads (its every claim failed after taking it). Each test gets a fresh database.

use std::time::Duration;

use rebound_queue::policy::PolicyPatch;
use rebound_queue::policy::patch::MAX_ATTEMPTS;
use rebound_queue::store::{ClaimRequest, StoreError};
use rebound_queue::testing::TestDb;
use rebound_queue::{NewJob, Store};
use serde_json::{Value, json};
use sqlx::Executor as _;
use uuid::Uuid;

const MIGRATION: &str = include_str!("../../migrations/20261202000002_policy_max_attempts_bounded.sql");

async fn store_policy(s: &Store, job_type: &str, policy: &str) {
    sqlx::query("INSERT INTO retry_policies (job_type, policy, version, updated_at, updated_by) VALUES ($1, $2::jsonb, 1, now(), 'old')")
        .bind(job_type)
        .bind(policy)
        .execute(s.pool())
        .await
        .expect("insert policy");
}

#[tokio::test]
async fn a_stored_policy_beyond_the_integer_range_does_not_fail_enqueues() {
    let db = TestDb::new().await;
    let s = &db.store;
    // Saved before the bound existed (or by hand after it): too big for jobs.max_attempts.
    store_policy(s, "old.type", r#"{"max_attempts": 3000000000}"#).await;
    store_policy(s, "*", r#"{"max_attempts": 4294967295}"#).await;

    let one = s.enqueue(NewJob::new("old.type", json!([]))).await.expect("enqueue of the type");
    assert_eq!(one.job.max_attempts, i32::MAX);
    let other = s.enqueue(NewJob::new("other.type", json!([]))).await.expect("enqueue under the global default");
    assert_eq!(other.job.max_attempts, i32::MAX);
    // The batch (and workflow) insert reads the policies through its own statement.
    let batch = s.enqueue_batch(vec![NewJob::new("old.type", json!([1])), NewJob::new("other.type", json!([2]))]).await.expect("batch");
    assert!(batch.iter().all(|e| e.job.max_attempts == i32::MAX), "{batch:?}");
    // Not a number at all (saved by hand): the next layer applies, nothing fails.
    store_policy(s, "odd.type", r#"{"max_attempts": "many"}"#).await;
    assert_eq!(s.enqueue(NewJob::new("odd.type", json!([]))).await.expect("enqueue of the odd type").job.max_attempts, i32::MAX);
    let batch = s.enqueue_batch(vec![NewJob::new("odd.type", json!([1]))]).await.expect("batch of the odd type");
    assert_eq!(batch[0].job.max_attempts, i32::MAX);

    // The policy layers a failure resolves read the value capped rather than dropping it.
    let layers = s.policy_layers().await.expect("layers");
    let decided = layers.decide("old.type", None, 1, &rebound_queue::Outcome::Retry(rebound_queue::HandlerError::new("x", "m")), jiff::Timestamp::now(), &mut rebound_queue::policy::FixedJitter(0.5));
    assert_eq!(decided.0.max_attempts, MAX_ATTEMPTS);
}

#[tokio::test]
async fn the_migration_caps_saved_policies_and_their_versions() {
    let db = TestDb::new().await;
    let s = &db.store;
    store_policy(s, "big.type", r#"{"max_attempts": 3000000000, "jitter": false}"#).await;
    store_policy(s, "fine.type", r#"{"max_attempts": 5}"#).await;
    store_policy(s, "odd.type", r#"{"max_attempts": "many"}"#).await;
    sqlx::query("INSERT INTO retry_policy_versions (job_type, version, policy) VALUES ('big.type', 1, '{\"max_attempts\": 4294967295}'), ('big.type', 2, NULL)")
        .execute(s.pool())
        .await
        .expect("insert versions");

    // Run again over rows it has not seen (the test database is already migrated).
    s.pool().execute(sqlx::raw_sql(MIGRATION)).await.expect("migration");

    let policy = |t: &'static str| async move { s.policy(t).await.expect("policy").expect("saved").policy };
    assert_eq!(policy("big.type").await, json!({"max_attempts": 2147483647, "jitter": false}));
    assert_eq!(policy("fine.type").await, json!({"max_attempts": 5}));
    assert_eq!(policy("odd.type").await, json!({"max_attempts": "many"}), "not a number: left for the reader to report");
    let version: Value = sqlx::query_scalar("SELECT policy FROM retry_policy_versions WHERE job_type = 'big.type' AND version = 1")
        .fetch_one(s.pool())
        .await
        .expect("version");
    assert_eq!(version, json!({"max_attempts": 2147483647}));
    // The saved policy parses again, as the dashboard's editor reads it.
    let parsed = PolicyPatch::from_json(&policy("big.type").await).expect("parses");
    assert_eq!(parsed.max_attempts, Some(MAX_ATTEMPTS));
}

#[tokio::test]
async fn a_job_override_beyond_the_integer_range_is_refused_not_wrapped() {
    let db = TestDb::new().await;
    let s = &db.store;
    // Built in code, so no JSON parser stood in the way: it was stored as -1.
    let mut job = NewJob::new("lib.job", json!([]));
    job.retry = Some(PolicyPatch { max_attempts: Some(u32::MAX), ..PolicyPatch::default() });
    let refused = s.enqueue(job).await;
    assert!(matches!(&refused, Err(StoreError::InvalidPolicy(e)) if e.field == "options.retry.max_attempts"), "{refused:?}");
    assert_eq!(s.count_jobs(&Default::default(), 10).await.expect("count"), 0);

    let mut job = NewJob::new("lib.job", json!([]));
    job.retry = Some(PolicyPatch { max_attempts: Some(MAX_ATTEMPTS), ..PolicyPatch::default() });
    assert_eq!(s.enqueue(job).await.expect("at the bound").job.max_attempts, i32::MAX);

    // One stored before the bound reads capped, not as an unparseable override.
    let id = Uuid::now_v7();
    sqlx::query("INSERT INTO jobs (id, type, queue, args, state, enqueued_at, retry) VALUES ($1, 'lib.job', 'q', '[]', 'available', now(), '{\"max_attempts\": 4294967295}')")
        .bind(id)
        .execute(s.pool())
        .await
        .expect("insert job");
    let stored = s.job(id).await.expect("job");
    assert_eq!(stored.retry_patch().map(|p| p.and_then(|p| p.max_attempts)), Ok(Some(MAX_ATTEMPTS)));
}

#[tokio::test]
async fn a_row_nested_beyond_the_parser_is_still_claimed_and_read() {
    let db = TestDb::new().await;
    let s = &db.store;
    // What a workflow trigger made of a result 126 levels deep: `extra.parent_results[0]`
    // puts it two levels further down, past the 127 serde_json reads.
    let deep = format!("{}1{}", "[".repeat(126), "]".repeat(126));
    let extra = format!(r#"{{"parent_results": [{deep}]}}"#);
    let id = Uuid::now_v7();
    sqlx::query("INSERT INTO jobs (id, type, queue, args, extra, state, enqueued_at) VALUES ($1, 'chain.next', 'deep', '[]', $2::jsonb, 'available', now())")
        .bind(id)
        .bind(&extra)
        .execute(s.pool())
        .await
        .expect("insert job");

    let claimed = s
        .claim(&ClaimRequest { worker_id: "w1".into(), queues: vec!["deep".into()], limit: 1, visibility_timeout: Duration::from_secs(30) })
        .await
        .expect("the claim decodes the row");
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), [id]);
    // Kept down to the bound; below it, the rest as its JSON text.
    let mut at = &claimed[0].extra["parent_results"];
    let mut depth = 1; // `extra` itself
    while let Some(inner) = at.as_array().and_then(|a| a.first()) {
        depth += 1;
        at = inner;
    }
    assert_eq!(depth, rebound_queue::storable::MAX_DEPTH);
    let rest = format!("{}1{}", "[".repeat(64), "]".repeat(64));
    assert_eq!(at.as_str().map(|t| t.split_whitespace().collect::<String>()), Some(rest), "the 64 levels below, as text");
    assert!(s.get_job(id).await.expect("read").is_some());
}
