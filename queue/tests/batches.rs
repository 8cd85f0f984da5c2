//! The store's batch paths that the worker and the batch API lean on, against a real
//! database: batch enqueue answers exactly what it stored, claims stay right once Postgres
//! switches to a generic plan, and the worker's lean complete and fail writes record the same
//! attempts as the full ones.

use std::collections::HashSet;
use std::time::Duration;

use rebound_queue::outcome::{HandlerError, Outcome};
use rebound_queue::policy::PolicyPatch;
use rebound_queue::store::{Actor, ClaimRequest, Completion, EventFilter, Failure, InPlaceEnd, InPlaceRun, KnownRun, RetriedInPlace, StoreError};
use rebound_queue::testing::TestDb;
use rebound_queue::{JobState, NewJob, Store};
use serde_json::json;
use uuid::Uuid;

fn claim_req(queue: &str, worker: &str, limit: u32) -> ClaimRequest {
    ClaimRequest {
        worker_id: worker.into(),
        queues: vec![queue.to_string()],
        limit,
        visibility_timeout: Duration::from_secs(30),
    }
}

async fn put_policy(s: &Store, job_type: &str, v: serde_json::Value) {
    s.put_policy(job_type, &PolicyPatch::from_json(&v).unwrap(), &Actor::new("test"), None).await.unwrap();
}

fn failure(id: Uuid, attempt: i32, error_type: &str) -> Failure {
    Failure {
        id,
        attempt: Some(attempt),
        worker_id: Some("w1".into()),
        outcome: Outcome::Retry(HandlerError::new(error_type, "boom")),
        error_code: None,
    }
}

#[tokio::test]
async fn batch_enqueue_answers_exactly_what_it_stored() {
    let db = TestDb::new().await;
    let s = &db.store;
    put_policy(s, "typed", json!({"max_attempts": 7})).await;
    let later = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600);
    // Nanoseconds the database cannot keep: the answer must carry what was stored.
    let later = later + jiff::SignedDuration::from_nanos(123);
    let mut full = NewJob::new("typed", json!([{"b": 2, "a": [1.5, "x", null]}])).queue("q1");
    full.id = Some(Uuid::now_v7());
    full.meta = json!({"trace": "abc", "n": 3});
    full.extra = json!({"custom": true});
    full.priority = 5;
    full.tags = vec!["one".into(), "two".into()];
    full.retry = Some(PolicyPatch::from_json(&json!({"max_attempts": 2, "initial_interval": "PT3S"})).unwrap());
    full.timeout_ms = Some(1500);
    full.visibility_timeout_ms = Some(9000);
    full.expires_at = Some(later + jiff::SignedDuration::from_secs(60));
    let mut scheduled = NewJob::new("typed", json!([]));
    scheduled.scheduled_at = Some(later);
    let mut pending = NewJob::new("plain", json!([1]));
    pending.pending = true;
    let plain = NewJob::new("plain", json!(["x"]));

    let out = s.enqueue_batch(vec![full, scheduled, pending, plain]).await.unwrap();
    assert_eq!(out.len(), 4);
    for e in &out {
        let stored = s.job(e.job.id).await.unwrap();
        assert_eq!(e.job, stored, "the answer for {} differs from the stored row", e.job.id);
    }
    let states: Vec<JobState> = out.iter().map(|e| e.job.state).collect();
    assert_eq!(states, vec![JobState::Available, JobState::Scheduled, JobState::Pending, JobState::Available]);
    // The job's own override, else the type's policy, else the default.
    let max: Vec<i32> = out.iter().map(|e| e.job.max_attempts).collect();
    assert_eq!(max, vec![2, 7, 3, 3]);

    // A batch that sets no optional column at all (sent as empty arrays) answers as exactly.
    let bare = s.enqueue_batch(vec![NewJob::new("typed", json!([1])), NewJob::new("plain", json!([2]))]).await.unwrap();
    for e in &bare {
        assert_eq!(e.job, s.job(e.job.id).await.unwrap());
    }
    assert_eq!(bare.iter().map(|e| (e.job.priority, e.job.max_attempts)).collect::<Vec<_>>(), vec![(0, 7), (0, 3)]);
}

#[tokio::test]
async fn batch_enqueue_refuses_an_id_given_twice_and_stores_nothing() {
    let db = TestDb::new().await;
    let s = &db.store;
    let id = Uuid::now_v7();
    let mut a = NewJob::new("t", json!([0]));
    a.id = Some(id);
    let batch = vec![NewJob::new("t", json!([1])), a.clone(), a];
    let err = s.enqueue_batch(batch).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Duplicate { reason, existing: Some(dup) } if reason.starts_with("jobs[2]") && *dup == id),
        "{err:?}"
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(s.pool()).await.unwrap();
    assert_eq!(count, 0, "a failed batch stores nothing");
}

/// One of each kind of job a batch takes: every optional column set, scheduled later, due
/// already, pending, each layer of `max_attempts`, text that needs escaping in any text format,
/// and times whose nanoseconds the database must round (ties among them).
fn every_kind(later: jiff::Timestamp) -> Vec<(NewJob, bool)> {
    let ns = jiff::SignedDuration::from_nanos;
    let mut full = NewJob::new("typed", json!([{"b": 2, "a": [1.5, "x", null]}])).queue("q1");
    full.meta = json!({"trace": "abc", "n": 3});
    full.extra = json!({"custom": true});
    full.priority = -7;
    full.tags = vec!["one".into(), "twö\ttab".into()];
    full.retry = Some(PolicyPatch::from_json(&json!({"max_attempts": 2, "initial_interval": "PT3S"})).unwrap());
    full.timeout_ms = Some(1500);
    full.visibility_timeout_ms = Some(9000);
    full.expires_at = Some(later + jiff::SignedDuration::from_secs(60) + ns(999_999_500));
    let mut scheduled = NewJob::new("typed", json!([]));
    scheduled.scheduled_at = Some(later + ns(123));
    let mut tie_down = NewJob::new("other", json!([]));
    tie_down.scheduled_at = Some(later + ns(2_500));
    let mut tie_up = NewJob::new("other", json!([]));
    tie_up.scheduled_at = Some(later + ns(1_500));
    let mut due = NewJob::new("plain", json!(["due"]));
    due.scheduled_at = Some(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(30) + ns(777));
    let mut pending = NewJob::new("plain", json!([1]));
    pending.pending = true;
    let escapes = NewJob::new("other", json!([{"s": "tab\there\nnew line\\back slash \"quoted\" ünïcödé 🦀 \u{0001}", "big": 1e300, "neg": -0.0}]))
        .queue("dotted.queue-name_1");
    vec![
        (full, false),
        (scheduled, true),
        (tie_down, true),
        (tie_up, true),
        (due, true),
        (pending, false),
        (escapes, false),
        (NewJob::new("typed", json!([1])), false),
    ]
}

/// A stored job with what differs between two enqueues of the same job blanked: its id and the
/// enqueue's own time (and the scheduled time, when that is the enqueue's time too).
fn as_enqueued(mut job: rebound_queue::Job, scheduled_given: bool) -> rebound_queue::Job {
    let t = jiff::Timestamp::UNIX_EPOCH;
    job.id = Uuid::nil();
    job.created_at = t;
    job.updated_at = t;
    job.enqueued_at = job.enqueued_at.map(|_| t);
    if !scheduled_given {
        job.scheduled_at = t;
    }
    job
}

#[tokio::test]
async fn a_large_batch_is_copied_and_stores_exactly_what_the_insert_would() {
    let db = TestDb::new().await;
    let s = &db.store;
    put_policy(s, "typed", json!({"max_attempts": 7})).await;
    put_policy(s, "*", json!({"max_attempts": 5})).await;
    // Whole microseconds, so that the kinds' added 1.5 and 2.5 µs are exact ties.
    let later = jiff::Timestamp::from_microsecond((jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600)).as_microsecond()).unwrap();
    let kinds = every_kind(later);
    // A few jobs go in one INSERT; a batch of hundreds is copied.
    let small = s.enqueue_batch(kinds.iter().map(|(j, _)| j.clone()).collect()).await.unwrap();
    let large_input: Vec<NewJob> = (0..40).flat_map(|_| kinds.iter().map(|(j, _)| j.clone())).collect();
    let large = s.enqueue_batch(large_input).await.unwrap();
    assert_eq!(large.len(), 40 * kinds.len());

    let states: Vec<JobState> = small.iter().map(|e| e.job.state).collect();
    use JobState::{Available, Pending, Scheduled};
    assert_eq!(states, vec![Available, Scheduled, Scheduled, Scheduled, Available, Pending, Available, Available]);
    assert_eq!(small.iter().map(|e| e.job.max_attempts).collect::<Vec<_>>(), vec![2, 7, 5, 5, 5, 5, 5, 7]);
    for (i, e) in large.iter().enumerate() {
        let stored = s.job(e.job.id).await.unwrap();
        assert_eq!(e.job, stored, "the answer for job {i} differs from the stored row");
        let (_, scheduled_given) = kinds[i % kinds.len()];
        let inserted = s.job(small[i % kinds.len()].job.id).await.unwrap();
        assert_eq!(as_enqueued(stored, scheduled_given), as_enqueued(inserted, scheduled_given), "job {i} is stored unlike its inserted twin");
    }
    // Equal-priority jobs run in the order given, as from an INSERT.
    let available: Vec<Uuid> = large.iter().filter(|e| e.job.state == Available && e.job.queue == "default" && e.job.priority == 0).map(|e| e.job.id).collect();
    let mut sorted = available.clone();
    sorted.sort();
    assert_eq!(available, sorted);

    // The insert trigger ran for the copied rows: the counters and the enqueue events have them.
    let stats = s.stats(None).await.unwrap();
    let counted: Vec<(JobState, i64)> = [Available, Scheduled, Pending].into_iter().map(|st| (st, stats.by_state(st))).collect();
    assert_eq!(counted, vec![(Available, 4 * 41), (Scheduled, 3 * 41), (Pending, 41)]);
    let scheduled = EventFilter { types: vec!["job.scheduled".into()], job_id: Some(large[large.len() - 7].job.id), limit: 10, ..Default::default() };
    assert_eq!(large[large.len() - 7].job.state, Scheduled);
    assert_eq!(s.events(&scheduled).await.unwrap().len(), 1, "the trigger logged the copied job's scheduling");
}

#[tokio::test]
async fn a_copied_batch_with_a_duplicate_id_stores_nothing() {
    let db = TestDb::new().await;
    // One connection, so that the session each batch runs in can be told apart.
    let s = &Store::connect(&db.url, 1).await.unwrap();
    let session = || async { sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()").fetch_one(s.pool()).await.unwrap() };
    let first = session().await;
    let taken = s.enqueue(NewJob::new("t", json!([0]))).await.unwrap().job.id;
    let mut jobs: Vec<NewJob> = (0..100).map(|i| NewJob::new("t", json!([i]))).collect();
    jobs[70].id = Some(taken);
    let err = s.enqueue_batch(jobs).await.unwrap_err();
    assert!(matches!(&err, StoreError::Duplicate { reason, existing: Some(dup) } if reason.starts_with("jobs[70]") && *dup == taken), "{err:?}");
    let twice = Uuid::now_v7();
    let mut jobs: Vec<NewJob> = (0..100).map(|i| NewJob::new("t", json!([i]))).collect();
    jobs[10].id = Some(twice);
    jobs[90].id = Some(twice);
    let err = s.enqueue_batch(jobs).await.unwrap_err();
    assert!(matches!(&err, StoreError::Duplicate { reason, existing: Some(dup) } if reason.starts_with("jobs[90]") && *dup == twice), "{err:?}");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(s.pool()).await.unwrap();
    assert_eq!(count, 1, "a failed batch stores nothing");
    // Each refused copy was rolled back and its connection kept, in step for the next batch.
    assert_eq!(session().await, first, "the refused copies' session was kept, not closed");
    assert_eq!(s.enqueue_batch((0..100).map(|i| NewJob::new("t", json!([i]))).collect()).await.unwrap().len(), 100);
    assert_eq!(session().await, first);
}

#[tokio::test]
async fn claims_stay_right_across_many_limits() {
    let db = TestDb::new().await;
    let s = &db.store;
    let jobs: Vec<NewJob> = (0..300).map(|i| NewJob::new("t", json!([i])).queue("q")).collect();
    let ids: Vec<Uuid> = s.enqueue_batch(jobs).await.unwrap().into_iter().map(|e| e.job.id).collect();
    // Enough claims of one statement for Postgres to switch it to a generic plan.
    let mut claimed = Vec::new();
    for limit in [1u32, 7, 50, 3, 100, 2, 9, 60, 1, 40, 27] {
        let got = s.claim(&claim_req("q", "w1", limit)).await.unwrap();
        assert_eq!(got.len(), limit as usize);
        assert!(got.iter().all(|j| j.state == JobState::Active && j.attempt == 1 && j.locked_by.as_deref() == Some("w1")));
        claimed.extend(got.into_iter().map(|j| j.id));
    }
    assert_eq!(claimed, ids, "FIFO order, every job once");
    assert!(s.claim(&claim_req("q", "w1", 10)).await.unwrap().is_empty());
}

#[tokio::test]
async fn lean_completions_record_the_attempt_and_refuse_stale_ones() {
    let db = TestDb::new().await;
    let s = &db.store;
    let ids: Vec<Uuid> = s
        .enqueue_batch((0..3).map(|i| NewJob::new("t", json!([i]))).collect())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.job.id)
        .collect();
    s.claim(&claim_req("default", "holder", 3)).await.unwrap();
    let done = s
        .complete_batch(&[
            Completion { id: ids[0], attempt: Some(1), worker_id: Some("holder".into()), started_at: None, result: Some(json!({"ok": 1})) },
            // No worker given: the attempt is recorded under the job's holder.
            Completion { id: ids[1], attempt: Some(1), worker_id: None, started_at: None, result: None },
            // A stale attempt: refused, the job stays active.
            Completion { id: ids[2], attempt: Some(2), worker_id: Some("holder".into()), started_at: None, result: None },
            // The right attempt, from a worker that does not hold it: refused too.
            Completion { id: ids[2], attempt: Some(1), worker_id: Some("other".into()), started_at: None, result: None },
        ])
        .await
        .unwrap();
    assert_eq!(done.into_iter().collect::<HashSet<_>>(), HashSet::from([ids[0], ids[1]]));
    let first = s.job(ids[0]).await.unwrap();
    assert_eq!(first.state, JobState::Completed);
    assert_eq!(first.result, Some(json!({"ok": 1})));
    assert_eq!(first.locked_by.as_deref(), Some("holder"), "kept as the worker that ran it");
    assert_eq!(first.lock_expires_at, None);
    let attempts = s.attempts(ids[0]).await.unwrap();
    assert_eq!(attempts.len(), 1, "the completing execution, read from the job row");
    assert_eq!((attempts[0].id, attempts[0].attempt, attempts[0].outcome.as_str()), (None, 1, "completed"));
    assert_eq!(attempts[0].started_at, first.started_at);
    assert_eq!(Some(attempts[0].finished_at), first.completed_at);
    let workers: Vec<Option<String>> =
        vec![s.attempts(ids[0]).await.unwrap()[0].worker_id.clone(), s.attempts(ids[1]).await.unwrap()[0].worker_id.clone()];
    assert_eq!(workers, vec![Some("holder".to_string()), Some("holder".to_string())]);
    assert!(s.attempts(ids[2]).await.unwrap().is_empty());
    assert_eq!(s.job(ids[2]).await.unwrap().state, JobState::Active);
}

#[tokio::test]
async fn lean_failures_decide_each_job_by_its_own_effective_policy() {
    let db = TestDb::new().await;
    let s = &db.store;
    put_policy(s, "typed", json!({"max_attempts": 5, "initial_interval": "PT10S", "backoff_strategy": "constant", "jitter": false})).await;
    let mut overridden = NewJob::new("typed", json!(["override"]));
    overridden.retry = Some(PolicyPatch::from_json(&json!({"max_attempts": 1, "on_exhaustion": "dead_letter"})).unwrap());
    let jobs = vec![
        NewJob::new("typed", json!(["a"])),
        overridden,
        NewJob::new("typed", json!(["b"])),
        NewJob::new("other", json!(["c"])),
        NewJob::new("typed", json!(["stale"])),
    ];
    let ids: Vec<Uuid> = s.enqueue_batch(jobs).await.unwrap().into_iter().map(|e| e.job.id).collect();
    assert_eq!(s.claim(&claim_req("default", "w1", 5)).await.unwrap().len(), 5);

    let mut failures: Vec<Failure> = ids[..4].iter().map(|id| failure(*id, 1, "app.flaky")).collect();
    // The same failure twice is recorded once; a failure of another attempt not at all.
    failures.push(failure(ids[0], 1, "app.flaky"));
    failures.push(failure(ids[4], 2, "app.flaky"));
    let written = s.fail_batch_ids(&failures).await.unwrap();
    assert_eq!(written.iter().copied().collect::<HashSet<_>>(), ids[..4].iter().copied().collect::<HashSet<_>>());
    assert_eq!(written.len(), 4);

    let a = s.job(ids[0]).await.unwrap();
    assert_eq!((a.state, a.max_attempts, a.retry_delay_ms), (JobState::Retryable, 5, Some(10_000)));
    assert_eq!(a.last_error.as_ref().and_then(|e| e["type"].as_str()), Some("app.flaky"));
    assert_eq!(a.locked_by, None);
    let dead = s.job(ids[1]).await.unwrap();
    assert_eq!((dead.state, dead.dead_letter), (JobState::Discarded, true));
    assert_eq!(s.job(ids[2]).await.unwrap().state, JobState::Retryable);
    let other = s.job(ids[3]).await.unwrap();
    assert_eq!((other.state, other.max_attempts), (JobState::Retryable, 3));
    assert_eq!(s.job(ids[4]).await.unwrap().state, JobState::Active);

    // Each attempt row carries the effective policy its decision used.
    let policy_of = |attempts: Vec<rebound_queue::job::Attempt>| {
        assert_eq!(attempts.len(), 1, "one attempt row per recorded failure");
        let p = attempts[0].policy.clone().unwrap();
        (p["max_attempts"].as_i64(), p["initial_interval"].as_str().map(str::to_string))
    };
    assert_eq!(policy_of(s.attempts(ids[0]).await.unwrap()), (Some(5), Some("PT10S".into())));
    assert_eq!(policy_of(s.attempts(ids[1]).await.unwrap()), (Some(1), Some("PT10S".into())));
    assert_eq!(policy_of(s.attempts(ids[2]).await.unwrap()), (Some(5), Some("PT10S".into())));
    assert_eq!(policy_of(s.attempts(ids[3]).await.unwrap()).0, Some(3));
    let dead_attempt = &s.attempts(ids[1]).await.unwrap()[0];
    assert_eq!((dead_attempt.outcome.as_str(), dead_attempt.worker_id.as_deref()), ("exhausted", Some("w1")));
    assert!(s.attempts(ids[4]).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_lean_failure_lands_only_on_the_run_it_read() {
    let db = TestDb::new().await;
    let s = &db.store;
    let id = s.enqueue(NewJob::new("t.lean", json!([]))).await.unwrap().job.id;
    s.claim(&claim_req("default", "w1", 1)).await.unwrap();

    // Another session holds the row, so the failure's read (which takes no lock) sees this run
    // and its write waits. Meanwhile the job starts another run with the same attempt number
    // and worker (what a snooze and a new claim by the same worker leave behind).
    let mut other = s.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE").bind(id).execute(&mut *other).await.unwrap();
    let failing = tokio::spawn({
        let s = s.clone();
        async move { s.fail_batch_ids(&[failure(id, 1, "app.flaky")]).await }
    });
    let mut waited = Duration::ZERO;
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'")
        .bind(&db.name)
        .fetch_one(s.pool())
        .await
        .unwrap()
        == 0
    {
        assert!(waited < Duration::from_secs(10), "the failure's write never waited for the row");
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
    sqlx::query("UPDATE jobs SET started_at = started_at + interval '1 second' WHERE id = $1").bind(id).execute(&mut *other).await.unwrap();
    other.commit().await.unwrap();

    assert_eq!(failing.await.unwrap().unwrap(), Vec::<Uuid>::new(), "the failure of the run read is not charged to the next");
    let job = s.job(id).await.unwrap();
    assert_eq!((job.state, job.attempt, job.last_error), (JobState::Active, 1, None));
    assert!(s.attempts(id).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_sub_millisecond_retry_is_claimable_again_at_once() {
    let db = TestDb::new().await;
    let s = &db.store;
    put_policy(s, "quick", json!({"max_attempts": 3, "initial_interval": "PT0.0001S", "backoff_strategy": "constant", "jitter": false}))
        .await;
    let id = s.enqueue(NewJob::new("quick", json!([]))).await.unwrap().job.id;
    s.claim(&claim_req("default", "w1", 1)).await.unwrap();
    assert_eq!(s.fail_batch_ids(&[failure(id, 1, "app.flaky")]).await.unwrap(), vec![id]);
    let again = s.claim(&claim_req("default", "w1", 1)).await.unwrap();
    assert_eq!(again.iter().map(|j| (j.id, j.attempt)).collect::<Vec<_>>(), vec![(id, 2)]);
}

#[tokio::test]
async fn known_failures_read_only_the_live_policies_and_stay_guarded() {
    let db = TestDb::new().await;
    let s = &db.store;
    put_policy(s, "typed", json!({"max_attempts": 5, "initial_interval": "PT10S", "backoff_strategy": "constant", "jitter": false})).await;
    let mut overridden = NewJob::new("typed", json!(["override"]));
    overridden.retry = Some(PolicyPatch::from_json(&json!({"max_attempts": 1, "on_exhaustion": "dead_letter"})).unwrap());
    let jobs = vec![NewJob::new("typed", json!(["a"])), overridden, NewJob::new("typed", json!(["cancelled"])), NewJob::new("typed", json!(["stale"]))];
    let claimed = {
        s.enqueue_batch(jobs).await.unwrap();
        s.claim(&claim_req("default", "w1", 4)).await.unwrap()
    };
    assert_eq!(claimed.len(), 4);
    // A policy edit after the claim applies: the policies are read at the write, not the claim.
    put_policy(s, "typed", json!({"max_attempts": 5, "initial_interval": "PT20S", "backoff_strategy": "constant", "jitter": false})).await;
    s.cancel(claimed[2].id, Some(&Actor::new("ops"))).await.unwrap();
    let known = |i: usize| KnownRun { job_type: claimed[i].job_type.clone(), retry: claimed[i].retry.clone(), started_at: claimed[i].started_at };
    let mut items: Vec<(Failure, KnownRun)> = (0..3).map(|i| (failure(claimed[i].id, 1, "app.flaky"), known(i))).collect();
    items.push((failure(claimed[0].id, 1, "app.flaky"), known(0)));
    items.push((failure(claimed[3].id, 2, "app.flaky"), known(3)));
    // The right attempt from a worker that does not hold the job: the write itself refuses it.
    items.push((Failure { worker_id: Some("w9".into()), ..failure(claimed[3].id, 1, "app.flaky") }, known(3)));
    let written = s.fail_batch_known(&items).await.unwrap();
    assert_eq!(written.iter().copied().collect::<HashSet<_>>(), HashSet::from([claimed[0].id, claimed[1].id]), "cancelled, stale and others' are skipped");
    assert!(s.attempts(claimed[3].id).await.unwrap().is_empty());

    let a = s.job(claimed[0].id).await.unwrap();
    assert_eq!((a.state, a.max_attempts, a.retry_delay_ms), (JobState::Retryable, 5, Some(20_000)));
    let dead = s.job(claimed[1].id).await.unwrap();
    assert_eq!((dead.state, dead.dead_letter), (JobState::Discarded, true), "the job's own override, carried by the worker");
    assert_eq!(s.job(claimed[2].id).await.unwrap().state, JobState::Cancelled);
    assert_eq!(s.job(claimed[3].id).await.unwrap().state, JobState::Active);
    assert_eq!(s.attempts(claimed[0].id).await.unwrap().len(), 1, "the duplicate is recorded once");
}

#[tokio::test]
async fn retries_in_place_record_every_failure_and_stay_guarded() {
    let db = TestDb::new().await;
    let s = &db.store;
    put_policy(s, "inplace", json!({"max_attempts": 5, "initial_interval": "PT0.0001S", "backoff_strategy": "constant", "jitter": false})).await;
    let jobs = (0..4).map(|i| NewJob::new("inplace", json!([i]))).collect();
    s.enqueue_batch(jobs).await.unwrap();
    let claimed = s.claim(&claim_req("default", "w1", 4)).await.unwrap();
    assert_eq!(claimed.len(), 4);
    let policy = std::sync::Arc::new(s.effective_policy("inplace", None).await.unwrap().policy);
    let claimed_at = claimed[0].started_at.unwrap();
    let at = |ms: i64| claimed_at.checked_add(jiff::SignedDuration::from_millis(ms)).unwrap();
    let retried = |attempt: i32, from: i64| RetriedInPlace {
        attempt,
        error: HandlerError::new("app.flaky", format!("attempt {attempt} failed")).with_details(json!({"n": attempt})),
        policy: policy.clone(),
        started_at: at(from),
        finished_at: at(from + 5),
    };
    let run = |i: usize, stored: i32, retried: Vec<RetriedInPlace>, started: i64, end: InPlaceEnd| InPlaceRun {
        id: claimed[i].id,
        stored_attempt: stored,
        stored_started_at: None,
        worker_id: "w1".into(),
        retried,
        started_at: at(started),
        end,
    };
    s.cancel(claimed[2].id, Some(&Actor::new("ops"))).await.unwrap();
    let runs = [
        // Failed twice, then completed: one write for all three executions.
        run(0, 1, vec![retried(1, 0), retried(2, 5)], 10, InPlaceEnd::Completed(Some(json!({"ok": true})))),
        // Failed once and still running again.
        run(1, 1, vec![retried(1, 0)], 5, InPlaceEnd::Running),
        // Cancelled meanwhile, and a stale attempt: neither is written, failures included.
        run(2, 1, vec![retried(1, 0)], 5, InPlaceEnd::Running),
        run(3, 2, vec![retried(2, 0)], 5, InPlaceEnd::Running),
    ];
    let written = s.record_in_place(&runs.iter().collect::<Vec<_>>()).await.unwrap();
    assert_eq!(written.iter().copied().collect::<HashSet<_>>(), HashSet::from([claimed[0].id, claimed[1].id]));

    let done = s.job(claimed[0].id).await.unwrap();
    assert_eq!((done.state, done.attempt, done.result.clone(), done.last_error.clone()), (JobState::Completed, 3, Some(json!({"ok": true})), None));
    assert_eq!(done.started_at, Some(at(10)), "the job row holds the execution that completed");
    let history = s.attempts(claimed[0].id).await.unwrap();
    let summary: Vec<_> = history.iter().map(|a| (a.attempt, a.outcome.as_str(), a.error_type.as_deref(), a.worker_id.as_deref())).collect();
    assert_eq!(
        summary,
        vec![(1, "retried", Some("app.flaky"), Some("w1")), (2, "retried", Some("app.flaky"), Some("w1")), (3, "completed", None, Some("w1"))]
    );
    assert_eq!((history[0].started_at, history[0].finished_at), (Some(at(0)), at(5)));
    assert_eq!(history[1].error_details, Some(json!({"n": 2})));
    assert_eq!(history[1].delay_ms, Some(0));
    assert_eq!(history[0].policy.as_ref().map(|p| p["initial_interval"].clone()), Some(json!("PT0.0001S")));

    let running = s.job(claimed[1].id).await.unwrap();
    assert_eq!((running.state, running.attempt, running.locked_by.as_deref()), (JobState::Active, 2, Some("w1")));
    assert!(running.lock_expires_at.unwrap() > jiff::Timestamp::now(), "the lock is renewed for the next execution");
    assert_eq!(running.last_error.as_ref().map(|e| e["message"].clone()), Some(json!("attempt 1 failed")));
    // Its next result names the new attempt, as for any claim.
    assert_eq!(s.complete_batch(&[Completion { id: claimed[1].id, attempt: Some(2), worker_id: None, started_at: None, result: None }]).await.unwrap(), vec![claimed[1].id]);

    let cancelled: Vec<String> = s.attempts(claimed[2].id).await.unwrap().into_iter().map(|a| a.outcome).collect();
    assert_eq!(cancelled, ["cancelled"], "a refused run records no failure, only the cancellation that cut it");
    assert!(s.attempts(claimed[3].id).await.unwrap().is_empty());
    assert_eq!(s.job(claimed[3].id).await.unwrap().attempt, 1);

    // Every start is a `job.started` in the all-jobs events, each at its own time: the claim's
    // for the first attempts, the in-place ones for the rest (none for the refused runs).
    let starts = EventFilter { types: vec!["job.started".into()], limit: 100, ..Default::default() };
    let mut seen: Vec<(Uuid, Option<i32>, jiff::Timestamp)> = s.events(&starts).await.unwrap().into_iter().map(|e| (e.job_id, e.attempt, e.at)).collect();
    seen.sort_by_key(|&(id, attempt, _)| (claimed.iter().position(|c| c.id == id), attempt));
    let mut expected: Vec<(Uuid, Option<i32>, jiff::Timestamp)> = claimed.iter().map(|c| (c.id, Some(1), claimed_at)).collect();
    expected.extend([(claimed[0].id, Some(2), at(5)), (claimed[0].id, Some(3), at(10)), (claimed[1].id, Some(2), at(5))]);
    expected.sort_by_key(|&(id, attempt, _)| (claimed.iter().position(|c| c.id == id), attempt));
    assert_eq!(seen, expected);
}
