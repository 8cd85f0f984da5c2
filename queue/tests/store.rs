//! The Postgres store against a real database: lifecycle, failure decisions, maintenance,
//! dead letters, policies, listing. Each test gets a fresh database.

use std::collections::HashSet;
use std::time::Duration;

use rebound_queue::job::{OnConflict, UniqueSpec};
use rebound_queue::outcome::{HandlerError, Outcome};
use rebound_queue::policy::PolicyPatch;
use rebound_queue::store::{
    Actor, AuditFilter, ClaimRequest, Completion, EnqueueOutcome, EventFilter, Failure, JobFilter, JobSelection, NamedRun, Notification, ProgressReport, PruneConfig,
    RedriveBudget, RedriveOptions, StoreError,
};
use rebound_queue::testing::TestDb;
use rebound_queue::{JobState, NewJob, Store};
use serde_json::json;
use uuid::Uuid;

fn claim_req(queues: &[&str], limit: u32) -> ClaimRequest {
    ClaimRequest {
        worker_id: "w1".into(),
        queues: queues.iter().map(|q| q.to_string()).collect(),
        limit,
        visibility_timeout: Duration::from_secs(30),
    }
}

fn patch(v: serde_json::Value) -> PolicyPatch {
    PolicyPatch::from_json(&v).unwrap()
}

async fn claim_one(s: &Store, queue: &str) -> rebound_queue::Job {
    let mut jobs = s.claim(&claim_req(&[queue], 1)).await.unwrap();
    assert_eq!(jobs.len(), 1, "expected a job in {queue}");
    jobs.remove(0)
}

fn failure(id: Uuid, error_type: &str) -> Failure {
    Failure {
        id,
        attempt: None,
        worker_id: Some("w1".into()),
        outcome: Outcome::Retry(HandlerError::new(error_type, "boom")),
        error_code: None,
    }
}

/// Makes a retryable job due now, as if its backoff had elapsed.
async fn make_due(s: &Store, id: Uuid) {
    sqlx::query("UPDATE jobs SET scheduled_at = now() - interval '1 minute' WHERE id = $1")
        .bind(id)
        .execute(s.pool())
        .await
        .unwrap();
    s.promote_due(100).await.unwrap();
}

#[tokio::test]
async fn enqueue_claim_complete_records_an_attempt() {
    let db = TestDb::new().await;
    let s = &db.store;
    let e = s.enqueue(NewJob::new("email.send", json!([1]))).await.unwrap();
    assert_eq!(e.job.state, JobState::Available);
    assert_eq!(e.job.attempt, 0);
    assert_eq!(e.job.max_attempts, 3);
    let job = claim_one(s, "default").await;
    assert_eq!((job.id, job.state, job.attempt), (e.job.id, JobState::Active, 1));
    assert!(job.lock_expires_at.is_some());
    let done = s
        .complete(&Completion { id: job.id, attempt: Some(1), worker_id: Some("w1".into()), started_at: None, result: Some(json!({"ok": true})) })
        .await
        .unwrap();
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.result, Some(json!({"ok": true})));
    assert!(done.completed_at.is_some());
    let attempts = s.attempts(job.id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, "completed");
    assert_eq!(attempts[0].worker_id.as_deref(), Some("w1"));
}

#[tokio::test]
async fn invalid_transitions_are_typed_conflicts() {
    let db = TestDb::new().await;
    let s = &db.store;
    let job = s.enqueue(NewJob::new("a.b", json!([]))).await.unwrap().job;
    // Ack of a job that is not active.
    let err = s.complete(&Completion { id: job.id, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { state: JobState::Available, .. }), "{err:?}");
    let err = s.fail(&failure(job.id, "x")).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }));
    // Unknown job.
    let err = s.complete(&Completion { id: Uuid::now_v7(), attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)));
    // Cancel, then everything is refused.
    let c = s.cancel(job.id, None).await.unwrap();
    assert_eq!(c.state, JobState::Cancelled);
    assert!(matches!(s.cancel(job.id, None).await.unwrap_err(), StoreError::Conflict { .. }));
    assert!(s.claim(&claim_req(&["default"], 10)).await.unwrap().is_empty());
}

#[tokio::test]
async fn stale_attempt_results_are_refused() {
    let db = TestDb::new().await;
    let s = &db.store;
    let id = s.enqueue(NewJob::new("a.b", json!([]))).await.unwrap().job.id;
    claim_one(s, "default").await;
    let done = s.complete_batch(&[Completion { id, attempt: Some(7), worker_id: None, started_at: None, result: None }]).await.unwrap();
    assert!(done.is_empty(), "a completion for another attempt must not complete this run");
    assert_eq!(s.job(id).await.unwrap().state, JobState::Active);
}

#[tokio::test]
async fn claim_order_is_queue_order_then_priority_then_fifo() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut low = NewJob::new("t", json!(["low"])).queue("q1");
    low.priority = -5;
    let first = NewJob::new("t", json!(["first"])).queue("q1");
    let second = NewJob::new("t", json!(["second"])).queue("q1");
    let mut high = NewJob::new("t", json!(["high"])).queue("q1");
    high.priority = 10;
    let other = NewJob::new("t", json!(["other"])).queue("q0");
    for j in [low, first, second, high, other] {
        s.enqueue(j).await.unwrap();
    }
    let jobs = s.claim(&claim_req(&["q1", "q0"], 10)).await.unwrap();
    let order: Vec<String> = jobs.iter().map(|j| j.args[0].as_str().unwrap().to_string()).collect();
    assert_eq!(order, vec!["high", "first", "second", "low", "other"]);
}

#[tokio::test]
async fn two_claimers_never_get_the_same_job() {
    let db = TestDb::new().await;
    let s = &db.store;
    let jobs: Vec<NewJob> = (0..400).map(|i| NewJob::new("t", json!([i]))).collect();
    s.enqueue_batch(jobs).await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let mut req = claim_req(&["default"], 7);
                req.worker_id = format!("w{w}");
                let got = s.claim(&req).await.unwrap();
                if got.is_empty() {
                    break;
                }
                mine.extend(got.into_iter().map(|j| j.id));
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), 400);
    assert_eq!(distinct.len(), 400, "a job was claimed twice");
}

#[tokio::test]
async fn paused_queues_accept_but_do_not_hand_out() {
    let db = TestDb::new().await;
    let s = &db.store;
    let actor = Actor::new("ops");
    let info = s.set_queue_paused("mail", true, &actor).await.unwrap();
    assert!(info.paused);
    s.enqueue(NewJob::new("t", json!([])).queue("mail")).await.unwrap();
    assert!(s.claim(&claim_req(&["mail"], 10)).await.unwrap().is_empty());
    let info = s.set_queue_paused("mail", false, &actor).await.unwrap();
    assert_eq!(info.available, 1);
    assert_eq!(s.claim(&claim_req(&["mail"], 10)).await.unwrap().len(), 1);
    let audit = s.audit_log(&AuditFilter { action: Some("queue.".into()), ..Default::default() }).await.unwrap();
    assert_eq!(audit.len(), 2);
    assert_eq!(audit[0].action, "queue.resume");
    assert!(s.queue_names().await.unwrap().contains(&"mail".to_string()));
}

#[tokio::test]
async fn failures_follow_the_policy_to_the_dead_letter_queue() {
    let db = TestDb::new().await;
    let s = &db.store;
    let job = NewJob::new("pay.charge", json!([]))
        .retry(patch(json!({"max_attempts": 3, "initial_interval": "PT10S", "backoff_coefficient": 2.0, "jitter": false, "on_exhaustion": "dead_letter"})));
    let id = s.enqueue(job).await.unwrap().job.id;
    let mut delays = Vec::new();
    for attempt in 1..=3 {
        let job = claim_one(s, "default").await;
        assert_eq!(job.attempt, attempt);
        let r = s.fail(&failure(id, "net.timeout")).await.unwrap();
        if attempt < 3 {
            assert_eq!(r.job.state, JobState::Retryable);
            delays.push(r.job.retry_delay_ms.unwrap());
            assert!(r.job.scheduled_at > jiff::Timestamp::now());
            make_due(s, id).await;
        } else {
            assert_eq!(r.job.state, JobState::Discarded);
            assert!(r.job.dead_letter);
            assert!(r.job.completed_at.is_some() && r.job.discarded_at.is_some());
        }
    }
    assert_eq!(delays, vec![10_000, 20_000]);
    let attempts = s.attempts(id).await.unwrap();
    let outcomes: Vec<&str> = attempts.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, vec!["retried", "retried", "exhausted"]);
    assert_eq!(attempts[0].delay_ms, Some(10_000));
    assert!(attempts.iter().all(|a| a.error_type.as_deref() == Some("net.timeout")));
    let job = s.job(id).await.unwrap();
    assert_eq!(job.last_error.as_ref().unwrap()["type"], "net.timeout");
    assert_eq!(job.last_error.as_ref().unwrap()["attempt"], 3);
    let dl = s.list_jobs(&JobFilter::dead_letters(), None, 10).await.unwrap();
    assert_eq!(dl.items.len(), 1);
}

#[tokio::test]
async fn a_live_policy_edit_applies_to_the_next_failure_of_jobs_in_flight() {
    let db = TestDb::new().await;
    let s = &db.store;
    let actor = Actor::new("ops");
    s.put_policy("report.build", &patch(json!({"initial_interval": "PT5S", "jitter": false, "max_attempts": 5})), &actor, None)
        .await
        .unwrap();
    let id = s.enqueue(NewJob::new("report.build", json!([]))).await.unwrap().job.id;
    assert_eq!(s.job(id).await.unwrap().max_attempts, 5);
    claim_one(s, "default").await;
    assert_eq!(s.fail(&failure(id, "x")).await.unwrap().job.retry_delay_ms, Some(5_000));
    make_due(s, id).await;
    claim_one(s, "default").await;
    // Edited while the job is running.
    let v2 = s
        .put_policy("report.build", &patch(json!({"initial_interval": "PT1M", "backoff_strategy": "constant", "jitter": false, "max_attempts": 2})), &actor, Some("slower"))
        .await
        .unwrap();
    assert_eq!(v2.version, 2);
    let r = s.fail(&failure(id, "x")).await.unwrap();
    // max_attempts 2 reached on attempt 2: exhausted under the new policy.
    assert_eq!(r.job.state, JobState::Discarded);
    assert_eq!(r.job.max_attempts, 2);
    assert_eq!(r.policy.max_attempts, 2);
    let history = s.policy_history("report.build").await.unwrap();
    assert_eq!(history.iter().map(|v| v.version).collect::<Vec<_>>(), vec![2, 1]);
    assert_eq!(history[0].note.as_deref(), Some("slower"));
    let restored = s.restore_policy("report.build", 1, &actor).await.unwrap();
    assert_eq!(restored.version, 3);
    assert_eq!(restored.policy["initial_interval"], "PT5S");
}

#[tokio::test]
async fn invalid_policies_are_rejected_whole() {
    let db = TestDb::new().await;
    let s = &db.store;
    let actor = Actor::new("ops");
    let bad = patch(json!({"initial_interval": "PT10M", "max_interval": "PT1M"}));
    let err = s.put_policy("a.b", &bad, &actor, None).await.unwrap_err();
    assert!(matches!(&err, StoreError::InvalidPolicy(e) if e.field == "max_interval"), "{err:?}");
    assert!(s.policy("a.b").await.unwrap().is_none());
    assert!(s.policy_history("a.b").await.unwrap().is_empty());
    assert!(s.audit_log(&AuditFilter::default()).await.unwrap().is_empty());
    // A bad job override is refused at enqueue, naming the field under options.retry.
    let err = s.enqueue(NewJob::new("a.b", json!([])).retry(patch(json!({"max_interval": "PT0.1S"})))).await.unwrap_err();
    assert!(matches!(&err, StoreError::InvalidPolicy(e) if e.field.starts_with("options.retry.")), "{err:?}");
}

#[tokio::test]
async fn handler_outcomes_and_non_retryable_errors() {
    let db = TestDb::new().await;
    let s = &db.store;
    s.put_policy("t", &patch(json!({"non_retryable_errors": ["auth.*"], "max_attempts": 10})), &Actor::new("ops"), None)
        .await
        .unwrap();
    let cases: Vec<(Outcome, JobState, bool, &str)> = vec![
        (Outcome::Retry(HandlerError::new("auth.expired", "m")), JobState::Discarded, false, "non_retryable"),
        (Outcome::Retry(HandlerError::new("authx", "m")), JobState::Retryable, false, "retried"),
        (Outcome::Discard(HandlerError::new("x", "m")), JobState::Discarded, false, "discarded"),
        (Outcome::Fail(HandlerError::new("x", "m")), JobState::Discarded, false, "failed"),
        (Outcome::DeadLetter(HandlerError::new("x", "m")), JobState::Discarded, true, "dead_lettered"),
    ];
    for (outcome, state, dead, recorded) in cases {
        let id = s.enqueue(NewJob::new("t", json!([]))).await.unwrap().job.id;
        claim_one(s, "default").await;
        let r = s.fail(&Failure { id, attempt: Some(1), worker_id: None, outcome, error_code: None }).await.unwrap();
        assert_eq!((r.job.state, r.job.dead_letter), (state, dead), "{recorded}");
        assert_eq!(s.attempts(id).await.unwrap()[0].outcome, recorded);
        if state == JobState::Retryable {
            s.cancel(id, None).await.unwrap();
        }
    }
    // A snooze is not counted against the budget.
    let id = s.enqueue(NewJob::new("t", json!([]))).await.unwrap().job.id;
    claim_one(s, "default").await;
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60);
    let r = s.fail(&Failure { id, attempt: None, worker_id: None, outcome: Outcome::RetryAfter { at, error: None }, error_code: None }).await.unwrap();
    assert_eq!((r.job.state, r.job.attempt), (JobState::Scheduled, 0));
}

#[tokio::test]
async fn the_rescuer_turns_expired_locks_into_stalled_attempts() {
    let db = TestDb::new().await;
    let s = &db.store;
    let id = s.enqueue(NewJob::new("t", json!([]))).await.unwrap().job.id;
    let mut req = claim_req(&["default"], 1);
    req.visibility_timeout = Duration::from_millis(1);
    s.claim(&req).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let report = s.rescue_expired(100).await.unwrap();
    assert_eq!(report.stalled, 1);
    let job = s.job(id).await.unwrap();
    // A crash is no evidence the job is bad: it is available again at once, the attempt counted.
    assert_eq!((job.state, job.attempt), (JobState::Available, 1));
    let a = s.attempts(id).await.unwrap();
    assert_eq!(a[0].error_type.as_deref(), Some("rebound.stalled"));
    assert_eq!(a[0].worker_id.as_deref(), Some("w1"));
    // Heartbeats keep a lock alive.
    let j = claim_one(s, "default").await;
    let held = s.heartbeat(Some("w1"), &[j.id], Some(Duration::from_secs(60))).await.unwrap();
    assert_eq!((held.extended, held.busy), (vec![j.id], vec![]));
    assert_eq!(s.heartbeat(Some("other"), &[j.id], None).await.unwrap(), Default::default());
    assert_eq!(s.rescue_expired(100).await.unwrap().stalled, 0);
    // A worker's check of the runs it abandoned: once rescued, a job is no longer its.
    assert_eq!(s.jobs_locked_by("w1", &[j.id]).await.unwrap(), vec![j.id]);
    assert!(s.jobs_locked_by("other", &[j.id]).await.unwrap().is_empty());
    sqlx::query("UPDATE jobs SET lock_expires_at = now() - interval '1 second' WHERE id = $1").bind(j.id).execute(s.pool()).await.unwrap();
    assert_eq!(s.rescue_expired(100).await.unwrap().stalled, 1);
    assert!(s.jobs_locked_by("w1", &[j.id]).await.unwrap().is_empty());
}

#[tokio::test]
async fn dead_letters_go_by_age_and_by_each_queues_cap_in_the_order_they_were_dead_lettered() {
    let db = TestDb::new().await;
    let s = &db.store;
    let dead = |queue: &'static str, n: usize| async move {
        let mut ids = Vec::new();
        for i in 0..n {
            let id = s.enqueue(NewJob::new("t", json!([i])).queue(queue)).await.unwrap().job.id;
            claim_one(s, queue).await;
            s.fail(&Failure { id, attempt: None, worker_id: None, outcome: Outcome::DeadLetter(HandlerError::new("x", "y")), error_code: None }).await.unwrap();
            ids.push(id);
        }
        ids
    };
    let qa = dead("qa", 3).await;
    let qb = dead("qb", 1).await;
    let qc = dead("qc", 2).await;
    // In qa the first-made job was dead-lettered last: the cap keeps the newest dead letters,
    // so the second-made one goes.
    sqlx::query("UPDATE jobs SET dead_lettered_at = now() - CASE WHEN id = $1 THEN interval '1 minute' WHEN id = $2 THEN interval '3 hours' ELSE interval '2 hours' END WHERE queue = 'qa'")
        .bind(qa[0])
        .bind(qa[1])
        .execute(s.pool())
        .await
        .unwrap();
    // qb's only dead letter is past the retention (180 days).
    sqlx::query("UPDATE jobs SET dead_lettered_at = now() - interval '200 days' WHERE id = $1").bind(qb[0]).execute(s.pool()).await.unwrap();
    let report = s.prune(&PruneConfig { dead_letters_per_queue: 2, ..Default::default() }).await.unwrap();
    assert_eq!(report.dead_letters, 2);
    for (id, kept) in [(qa[0], true), (qa[1], false), (qa[2], true), (qb[0], false), (qc[0], true), (qc[1], true)] {
        assert_eq!(s.get_job(id).await.unwrap().is_some(), kept, "{id}");
    }
    assert_eq!(s.prune(&PruneConfig { dead_letters_per_queue: 2, ..Default::default() }).await.unwrap().dead_letters, 0, "nothing more to do");
}

/// A run past its timeout is charged at the deadline, whether or not its lock is still held
/// (a worker enforces the timeout itself; the rescuer is the backstop for one that does not,
/// such as an OJS client that keeps beating).
#[tokio::test]
async fn per_attempt_timeouts_are_failed_attempts_with_backoff() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut job = NewJob::new("t", json!([]));
    // A timeout no loaded machine could pass between the claim and the first sweep.
    job.timeout_ms = Some(30_000);
    job.visibility_timeout_ms = Some(120_000);
    let id = s.enqueue(job).await.unwrap().job.id;
    claim_one(s, "default").await;
    assert_eq!(s.rescue_expired(100).await.unwrap().timed_out, 0, "inside its timeout");
    sqlx::query("UPDATE jobs SET started_at = now() - interval '31 seconds' WHERE id = $1").bind(id).execute(s.pool()).await.unwrap();
    assert_eq!(s.rescue_expired(100).await.unwrap().timed_out, 1, "past it, its lock still held");
    let job = s.job(id).await.unwrap();
    assert_eq!(job.state, JobState::Retryable);
    let error = job.last_error.unwrap();
    assert_eq!(error["type"], "rebound.timeout");
    // Judged, and timed, by the database's clock.
    let elapsed = error["details"]["elapsed_seconds"].as_f64().unwrap_or(0.0);
    assert!((31.0..60.0).contains(&elapsed), "{error}");
}

#[tokio::test]
async fn scheduled_jobs_wait_then_are_promoted_and_expired_jobs_never_run() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut later = NewJob::new("t", json!(["later"]));
    later.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600));
    let later = s.enqueue(later).await.unwrap().job;
    assert_eq!(later.state, JobState::Scheduled);
    assert!(s.claim(&claim_req(&["default"], 10)).await.unwrap().is_empty());
    assert_eq!(s.promote_due(100).await.unwrap(), 0);
    make_due(s, later.id).await;
    assert_eq!(s.job(later.id).await.unwrap().state, JobState::Available);

    let mut stale = NewJob::new("t", json!(["stale"])).queue("ttl");
    stale.expires_at = Some(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1));
    let stale = s.enqueue(stale).await.unwrap().job;
    assert!(s.claim(&claim_req(&["ttl"], 10)).await.unwrap().is_empty());
    assert_eq!(s.expire_due(100).await.unwrap(), 1);
    let stale = s.job(stale.id).await.unwrap();
    assert_eq!(stale.state, JobState::Discarded);
    assert!(stale.completed_at.is_none(), "an expired job never ran to an end");
}

/// OJS `replace_except_schedule`: the new job replaces a scheduled one at its time, and a job
/// that is not scheduled is replaced as by `replace`.
#[tokio::test]
async fn replacing_a_scheduled_duplicate_can_keep_its_time() {
    let db = TestDb::new().await;
    let s = &db.store;
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600);
    let unique = |args: serde_json::Value, scheduled_at: Option<jiff::Timestamp>| {
        let mut j = NewJob::new("t.report", args);
        j.scheduled_at = scheduled_at;
        j.unique = Some(UniqueSpec { key: "report".into(), on_conflict: OnConflict::ReplaceExceptSchedule, states: vec![], period: None });
        j
    };
    let first = s.enqueue(unique(json!(["old"]), Some(at))).await.unwrap().job;
    assert_eq!(first.state, JobState::Scheduled);
    let second = s.enqueue(unique(json!(["new"]), None)).await.unwrap();
    assert_eq!(second.outcome, EnqueueOutcome::Replaced { old: first.id });
    assert_eq!((second.job.state, second.job.scheduled_at, second.job.args.clone()), (JobState::Scheduled, first.scheduled_at, json!(["new"])));
    assert_eq!(s.job(second.job.id).await.unwrap().scheduled_at, first.scheduled_at, "as stored");
    assert_eq!(s.job(first.id).await.unwrap().state, JobState::Cancelled);
    // Not scheduled: the new job's own time.
    s.cancel(second.job.id, None).await.unwrap();
    let now_job = s.enqueue(unique(json!(["now"]), None)).await.unwrap().job;
    assert_eq!(now_job.state, JobState::Available);
    let later = s.enqueue(unique(json!(["later"]), Some(at))).await.unwrap();
    assert_eq!(later.outcome, EnqueueOutcome::Replaced { old: now_job.id });
    assert_eq!((later.job.state, later.job.scheduled_at), (JobState::Scheduled, s.job(later.job.id).await.unwrap().scheduled_at));
    assert!(later.job.scheduled_at > jiff::Timestamp::now());
}

#[tokio::test]
async fn unique_keys_reject_ignore_or_replace() {
    let db = TestDb::new().await;
    let s = &db.store;
    let unique = |on_conflict| {
        let mut j = NewJob::new("t", json!(["same"]));
        j.unique = Some(UniqueSpec { key: UniqueSpec::key_from_fields(&j, &[]).unwrap(), on_conflict, states: vec![], period: None });
        j
    };
    let first = s.enqueue(unique(OnConflict::Reject)).await.unwrap().job;
    assert!(matches!(s.enqueue(unique(OnConflict::Reject)).await.unwrap_err(), StoreError::Duplicate { .. }));
    let ignored = s.enqueue(unique(OnConflict::Ignore)).await.unwrap();
    assert_eq!((ignored.job.id, ignored.outcome), (first.id, EnqueueOutcome::Existing));
    let replaced = s.enqueue(unique(OnConflict::Replace)).await.unwrap();
    assert_eq!(replaced.outcome, EnqueueOutcome::Replaced { old: first.id });
    assert_eq!(s.job(first.id).await.unwrap().state, JobState::Cancelled);
    // Once the job is finished, the key is free again (default states are the live ones).
    s.cancel(replaced.job.id, None).await.unwrap();
    assert_eq!(s.enqueue(unique(OnConflict::Reject)).await.unwrap().outcome, EnqueueOutcome::Created);
}

#[tokio::test]
async fn batch_enqueue_is_all_or_nothing_and_keeps_order() {
    let db = TestDb::new().await;
    let s = &db.store;
    let dup = Uuid::now_v7();
    let mut a = NewJob::new("t", json!([0]));
    a.id = Some(dup);
    s.enqueue(a.clone()).await.unwrap();
    let batch = vec![NewJob::new("t", json!([1])), a];
    let err = s.enqueue_batch(batch).await.unwrap_err();
    assert!(matches!(&err, StoreError::Duplicate { reason, .. } if reason.starts_with("jobs[1]")), "{err:?}");
    let bad = vec![NewJob::new("t", json!([1])), NewJob::new("Bad Type", json!([]))];
    let err = s.enqueue_batch(bad).await.unwrap_err();
    assert!(matches!(&err, StoreError::InvalidJob(e) if e.field == "jobs[1].type"), "{err:?}");
    assert_eq!(s.count_jobs(&JobFilter::default(), 100).await.unwrap(), 1);

    let ok: Vec<NewJob> = (0..5).map(|i| NewJob::new("t", json!([i])).queue("b")).collect();
    let out = s.enqueue_batch(ok).await.unwrap();
    assert_eq!(out.iter().map(|e| e.job.args[0].as_i64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
    let claimed = s.claim(&claim_req(&["b"], 5)).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.args[0].as_i64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
}

/// An error far longer than an index key (a stack trace, a whole response body) still
/// dead-letters its job: the error is kept whole, its signature (the grouping key) is cut.
#[tokio::test]
async fn a_dead_letter_with_a_huge_error_is_recorded_whole_and_grouped_by_its_start() {
    let db = TestDb::new().await;
    let s = &db.store;
    // Letters only, no digits, varied, so nothing shortens it and nothing compresses it into
    // a small key: the shape that broke the index.
    let mut rng = fastrand::Rng::with_seed(7);
    let long: String = (0..10_000).map(|_| rng.alphabetic()).collect();
    let mut ids = Vec::new();
    for tail in ["x", "y"] {
        let id = s.enqueue(NewJob::new("t.long", json!([]))).await.unwrap().job.id;
        claim_one(s, "default").await;
        let message = format!("{long}{tail}");
        let r = s
            .fail(&Failure { id, attempt: None, worker_id: None, outcome: Outcome::DeadLetter(HandlerError::new("upstream.refused", message.clone())), error_code: None })
            .await
            .expect("dead-lettered despite the long error");
        assert!(r.job.dead_letter);
        assert_eq!(r.job.last_error.unwrap()["message"], message.as_str(), "the error is kept whole");
        ids.push(id);
    }
    let groups = s.dead_letter_groups(&JobFilter::default(), 10).await.unwrap();
    assert_eq!(groups.len(), 1, "errors differing only past the signature's length share a group");
    assert_eq!(groups[0].count, 2);
    assert_eq!(groups[0].signature.chars().count(), 400);
    assert!(groups[0].signature.starts_with("upstream.refused: "));
    // Re-driven and dead-lettered again through the same check.
    let opts = RedriveOptions { budget: RedriveBudget::Fresh, stagger: None, actor: Actor::new("ops"), reason: None };
    assert_eq!(s.redrive(&JobSelection::Ids(ids.clone()), &opts).await.unwrap(), 2);
    assert!(s.dead_letter_groups(&JobFilter::default(), 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn dead_letters_are_redriven_by_id_or_filter_and_purged() {
    let db = TestDb::new().await;
    let s = &db.store;
    let actor = Actor::new("ops");
    let mut ids = Vec::new();
    for (i, t) in ["mail.send", "mail.send", "pay.charge"].iter().enumerate() {
        let id = s.enqueue(NewJob::new(*t, json!([i]))).await.unwrap().job.id;
        claim_one(s, "default").await;
        s.fail(&Failure { id, attempt: None, worker_id: None, outcome: Outcome::DeadLetter(HandlerError::new("smtp.rejected", format!("rejected {i}"))), error_code: None })
            .await
            .unwrap();
        ids.push(id);
    }
    let groups = s.dead_letter_groups(&JobFilter::default(), 10).await.unwrap();
    assert_eq!(groups.len(), 1, "messages differing only in digits share a signature");
    assert_eq!(groups[0].count, 3);

    let opts = RedriveOptions { budget: RedriveBudget::Fresh, stagger: None, actor: actor.clone(), reason: Some("smtp fixed".into()) };
    assert_eq!(s.redrive(&JobSelection::Ids(vec![ids[2]]), &opts).await.unwrap(), 1);
    let j = s.job(ids[2]).await.unwrap();
    assert_eq!((j.state, j.attempt, j.dead_letter), (JobState::Available, 0, false));
    // Its history is kept.
    assert_eq!(s.attempts(ids[2]).await.unwrap().len(), 1);

    let by_type = JobSelection::Filter(JobFilter { job_type: Some("mail.send".into()), ..Default::default() });
    let staggered = RedriveOptions { budget: RedriveBudget::OneMore, stagger: Some(Duration::from_secs(60)), ..opts.clone() };
    assert_eq!(s.redrive(&by_type, &staggered).await.unwrap(), 2);
    let a = s.job(ids[0]).await.unwrap();
    let b = s.job(ids[1]).await.unwrap();
    assert_eq!((a.state, b.state), (JobState::Available, JobState::Scheduled), "spread over the window");
    assert_eq!(a.attempt, 1, "one more attempt keeps the count");
    // One more means one more: failing again exhausts at once.
    claim_one(s, "default").await; // ids[2] (fresh)
    let again = claim_one(s, "default").await;
    assert_eq!(again.id, ids[0]);
    let report = ProgressReport { job_id: ids[0], attempt: None, worker_id: None, percentage: 40.0, message: None, data: None };
    s.report_progress(&report).await.unwrap();
    let r = s.fail(&failure(ids[0], "smtp.rejected")).await.unwrap();
    assert_eq!(r.job.state, JobState::Discarded);

    let entries = s.audit_log(&AuditFilter { action: Some("dead_letter.".into()), ..Default::default() }).await.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[1].details["reason"], "smtp fixed");
    assert_eq!(entries[1].target.as_deref(), Some(ids[2].to_string().as_str()));

    let purged = s.purge_dead_letters(&JobSelection::Filter(JobFilter::default()), &actor, Some("cleanup")).await.unwrap();
    assert_eq!(purged, 0, "ids[0] was plain-discarded (policy default on_exhaustion), not a dead letter");
    // A hand edit that dead-letters a job without its signature is refused, not left ungrouped.
    let forgot = sqlx::query("UPDATE jobs SET dead_letter = true, dead_lettered_at = now() WHERE id = $1").bind(ids[0]).execute(s.pool()).await;
    assert!(forgot.is_err_and(|e| e.to_string().contains("jobs_error_signature")));
    sqlx::query("UPDATE jobs SET dead_letter = true, dead_lettered_at = now(), error_signature = rebound_error_signature(last_error) WHERE id = $1").bind(ids[0]).execute(s.pool()).await.unwrap();
    assert_eq!(s.purge_dead_letters(&JobSelection::Ids(vec![ids[0]]), &actor, None).await.unwrap(), 1);
    assert!(s.get_job(ids[0]).await.unwrap().is_none());
    assert!(s.attempts(ids[0]).await.unwrap().is_empty());
    assert!(s.latest_progress(ids[0]).await.unwrap().is_none(), "its progress reports go with it");
}

#[tokio::test]
async fn dead_letters_retried_deleted_and_pruned_are_events() {
    use rebound_queue::store::BulkReport;
    let db = TestDb::new().await;
    let s = &db.store;
    let ops = Actor::new("ops");
    let mut dead = Vec::new();
    for (queue, t) in [("dq1", "mail.send"), ("dq1", "mail.send"), ("dq2", "pay.charge"), ("dq2", "pay.charge")] {
        let id = s.enqueue(NewJob::new(t, json!([])).queue(queue)).await.unwrap().job.id;
        claim_one(s, queue).await;
        let outcome = Outcome::DeadLetter(HandlerError::new("smtp.rejected", "no"));
        s.fail(&Failure { id, attempt: None, worker_id: None, outcome, error_code: None }).await.unwrap();
        dead.push(id);
    }
    // A finished job that is no dead letter: deleting it is no dead-letter event.
    let plain = s.enqueue(NewJob::new("mail.send", json!([])).queue("dq1")).await.unwrap().job.id;
    claim_one(s, "dq1").await;
    s.complete(&Completion { id: plain, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap();

    let opts = RedriveOptions { budget: RedriveBudget::Fresh, stagger: None, actor: ops.clone(), reason: None };
    assert_eq!(s.redrive(&JobSelection::Ids(vec![dead[0]]), &opts).await.unwrap(), 1);
    assert_eq!(s.purge_dead_letters(&JobSelection::Ids(vec![dead[1]]), &Actor::new("ann"), None).await.unwrap(), 1);
    let report: BulkReport = s.delete_finished_jobs(&JobSelection::Ids(vec![dead[2], plain]), &ops).await.unwrap();
    assert_eq!(report.succeeded, 2);
    sqlx::query("UPDATE jobs SET dead_lettered_at = now() - interval '400 days' WHERE id = $1").bind(dead[3]).execute(s.pool()).await.unwrap();
    assert_eq!(s.prune(&PruneConfig::default()).await.unwrap().dead_letters, 1);

    let until = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60));
    let all = EventFilter { after: Some(rebound_queue::store::position_at(jiff::Timestamp::UNIX_EPOCH)), until, limit: 100, ..Default::default() };
    let seen = s.dead_letter_events(&all).await.unwrap();
    type Seen<'a> = (&'a str, &'a str, Option<Uuid>, Option<&'a str>, i64);
    let got: Vec<Seen> = seen.iter().map(|e| (e.event_type.as_str(), e.queue.as_str(), e.job_id, e.actor.as_deref(), e.count)).collect();
    assert_eq!(
        got,
        [
            ("dead_letter.retried", "dq1", Some(dead[0]), Some("ops"), 1),
            ("dead_letter.deleted", "dq1", Some(dead[1]), Some("ann"), 1),
            ("dead_letter.deleted", "dq2", Some(dead[2]), Some("ops"), 1),
            ("dead_letter.pruned", "dq2", None, None, 1),
        ]
    );
    assert_eq!(seen[2].job_type.as_deref(), Some("pay.charge"));
    let of = |f: EventFilter| async move { s.dead_letter_events(&f).await.unwrap().into_iter().map(|e| e.event_type).collect::<Vec<_>>() };
    assert_eq!(of(EventFilter { types: vec!["dead_letter.deleted".into()], limit: 10, ..Default::default() }).await, ["dead_letter.deleted"; 2], "newest first");
    assert_eq!(of(EventFilter { queues: vec!["dq2".into()], ..all.clone() }).await, ["dead_letter.deleted", "dead_letter.pruned"]);
    assert_eq!(of(EventFilter { job_id: Some(dead[3]), ..all.clone() }).await, ["dead_letter.pruned"], "a prune matches the jobs it removed");
    assert_eq!(of(EventFilter { job_types: vec!["mail.send".into()], ..all.clone() }).await, ["dead_letter.retried", "dead_letter.deleted"]);
    assert_eq!(of(EventFilter { after: Some(seen[1].id.clone()), ..all.clone() }).await.len(), 2);
    sqlx::query("UPDATE dead_letter_log SET at = at - interval '2 days'").execute(s.pool()).await.unwrap();
    assert_eq!(s.prune(&PruneConfig::default()).await.unwrap().dead_letter_events, 4, "one log row per statement and queue");
    assert!(s.dead_letter_events(&all).await.unwrap().is_empty());
}

#[tokio::test]
async fn listing_filters_and_keyset_pages() {
    let db = TestDb::new().await;
    let s = &db.store;
    let jobs: Vec<NewJob> = (0..25).map(|i| NewJob::new(if i % 2 == 0 { "even.job" } else { "odd.job" }, json!([{"n": i}]))).collect();
    s.enqueue_batch(jobs).await.unwrap();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = s.list_jobs(&JobFilter::default(), after, 10).await.unwrap();
        seen.extend(page.items.iter().map(|j| j.id));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(seen.len(), 25);
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted, "newest first");
    let even = s.list_jobs(&JobFilter { job_type: Some("even.job".into()), ..Default::default() }, None, 100).await.unwrap();
    assert_eq!(even.items.len(), 13);
    let text = s.list_jobs(&JobFilter { text: Some("\"n\": 7}".into()), ..Default::default() }, None, 100).await.unwrap();
    assert_eq!(text.items.len(), 1);
    assert_eq!(s.count_jobs(&JobFilter { states: vec![JobState::Available], ..Default::default() }, 10).await.unwrap(), 10);
    assert_eq!(s.count_jobs_bounded(&JobFilter { states: vec![JobState::Available], ..Default::default() }, 10).await.unwrap().n, 25, "exact from the counters");
    let stats = s.stats(None).await.unwrap();
    assert_eq!(stats.by_state(JobState::Available), 25);
}

#[tokio::test]
async fn release_hands_jobs_back_without_counting() {
    let db = TestDb::new().await;
    let s = &db.store;
    let id = s.enqueue(NewJob::new("t", json!([]))).await.unwrap().job.id;
    let first = claim_one(s, "default").await;
    let released = s.release(&[(id, NamedRun::of(&first))], Some("w1"), "shutdown").await.unwrap();
    assert_eq!(released.len(), 1);
    let j = s.job(id).await.unwrap();
    assert_eq!((j.state, j.attempt), (JobState::Available, 0));
    assert_eq!(s.attempts(id).await.unwrap()[0].outcome, "released");

    // The same release sent again (its first answer lost) after the same worker claimed the
    // job again: the new run has the same attempt number, and is left alone.
    let second = claim_one(s, "default").await;
    assert_eq!((second.id, second.attempt), (id, first.attempt));
    assert!(s.release(&[(id, NamedRun::of(&first))], Some("w1"), "shutdown").await.unwrap().is_empty(), "the new run was handed back");
    let j = s.job(id).await.unwrap();
    assert_eq!((j.state, j.attempt, j.started_at), (JobState::Active, 1, second.started_at));
    assert_eq!(s.attempts(id).await.unwrap().len(), 1, "one released row");
    // Named with its own run, it goes back; a run left unnamed is not checked.
    assert_eq!(s.release(&[(id, NamedRun::of(&second))], Some("w1"), "shutdown").await.unwrap().len(), 1);
    claim_one(s, "default").await;
    assert_eq!(s.release(&[(id, NamedRun::default())], Some("w1"), "shutdown").await.unwrap().len(), 1);
}

#[tokio::test]
async fn notifications_wake_listeners() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut listener = s.listen().await.unwrap();
    s.enqueue(NewJob::new("t", json!([])).queue("wake")).await.unwrap();
    let got = listener.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(got, Some(Notification::Jobs("wake".into())));

    // Policy edits are heard however they are made: through the store, or by hand in SQL.
    let patch = PolicyPatch::from_json(&json!({"max_attempts": 2})).unwrap();
    s.put_policy("t", &patch, &Actor::new("test"), None).await.unwrap();
    assert_eq!(listener.next(Duration::from_secs(5)).await.unwrap(), Some(Notification::Policies));
    sqlx::query("UPDATE retry_policies SET policy = '{\"max_attempts\": 4}' WHERE job_type = 't'").execute(s.pool()).await.unwrap();
    assert_eq!(listener.next(Duration::from_secs(5)).await.unwrap(), Some(Notification::Policies));
    let layers = s.policy_layers().await.unwrap();
    let failed = Outcome::Retry(HandlerError::new("x.y", "boom"));
    let (policy, _) = layers.decide("t", None, 1, &failed, jiff::Timestamp::now(), &mut fastrand::Rng::with_seed(1));
    assert_eq!(policy.max_attempts, 4, "the hand edit is what a fresh read resolves");
}

#[tokio::test]
async fn leadership_is_exclusive_and_passes_on() {
    let db = TestDb::new().await;
    let a = Store::connect(&db.url, 2).await.unwrap();
    let b = Store::connect(&db.url, 2).await.unwrap();
    let mut lead = a.try_lead().await.unwrap().expect("first to ask leads");
    assert!(lead.still_held().await);
    assert!(b.try_lead().await.unwrap().is_none());
    lead.release().await.unwrap();
    assert!(b.try_lead().await.unwrap().is_some());
}

#[tokio::test]
async fn audit_entries_age_out() {
    let db = TestDb::new().await;
    let s = &db.store;
    let actor = Actor::new("ops");
    s.audit(&actor, "old.thing", None, json!({})).await.unwrap();
    s.audit(&actor, "new.thing", None, json!({})).await.unwrap();
    sqlx::query("UPDATE audit_log SET at = at - interval '400 days' WHERE action = 'old.thing'").execute(s.pool()).await.unwrap();
    assert_eq!(s.prune(&PruneConfig::default()).await.unwrap().audit, 1);
    let left: Vec<String> = s.audit_log(&Default::default()).await.unwrap().into_iter().map(|e| e.action).collect();
    assert_eq!(left, vec!["new.thing".to_string()]);
}

#[tokio::test]
async fn cron_runs_age_out_but_each_cron_keeps_its_latest_and_its_unfinished_runs() {
    let db = TestDb::new().await;
    let s = &db.store;
    // Two runs held back under `enqueue` (`waiting`): one whose job still waits, one whose job
    // was released and has finished since (its outcome still says `waiting`).
    let waiting = s.enqueue(NewJob::new("cron.job", json!([1])).queue("cron-held")).await.unwrap().job.id;
    let finished = s.enqueue(NewJob::new("cron.job", json!([2])).queue("cron-done")).await.unwrap().job.id;
    claim_one(s, "cron-done").await;
    s.complete(&Completion { id: finished, attempt: Some(1), worker_id: Some("w1".into()), started_at: None, result: None }).await.unwrap();
    // `every` ran at 40, 35, 33 and 31 days ago and 1 hour ago; `rare` last ran 40 days ago.
    sqlx::query(
        "INSERT INTO cron_runs (cron_name, scheduled_for, fired_at, outcome, job_id)
         SELECT c, now() - d * interval '1 day', now() - d * interval '1 day', o, j
         FROM (VALUES ('every', 40, 'enqueued', NULL), ('every', 35, 'waiting', $1::uuid), ('every', 33, 'waiting', $2::uuid),
                      ('every', 31, 'skipped', NULL), ('every', 0.04, 'enqueued', NULL), ('rare', 40, 'enqueued', NULL)) AS v(c, d, o, j)",
    )
    .bind(waiting)
    .bind(finished)
    .execute(s.pool())
    .await
    .unwrap();
    assert_eq!(s.prune(&PruneConfig::default()).await.unwrap().cron_runs, 3);
    let left: Vec<(String, String)> = sqlx::query_as("SELECT cron_name, outcome FROM cron_runs ORDER BY cron_name, scheduled_for")
        .fetch_all(s.pool())
        .await
        .unwrap();
    let row = |c: &str, o: &str| (c.to_owned(), o.to_owned());
    assert_eq!(left, vec![row("every", "waiting"), row("every", "enqueued"), row("rare", "enqueued")]);
    let kept: Option<Uuid> = sqlx::query_scalar("SELECT job_id FROM cron_runs WHERE outcome = 'waiting'").fetch_one(s.pool()).await.unwrap();
    assert_eq!(kept, Some(waiting), "the run whose job still waits");
    assert_eq!(s.prune(&PruneConfig::default()).await.unwrap().cron_runs, 0);
}

#[tokio::test]
async fn pruning_respects_retention_and_keeps_recent_dead_letters() {
    let db = TestDb::new().await;
    let s = &db.store;
    // Of three types: the pruner reads each (queue, type) lane of the listing index.
    for (i, t) in ["t", "u", "v"].into_iter().enumerate() {
        let id = s.enqueue(NewJob::new(t, json!([i]))).await.unwrap().job.id;
        claim_one(s, "default").await;
        s.complete(&Completion { id, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap();
    }
    // Made three days ago (ids are UUIDv7: the pruner reads their time), finished two days ago.
    sqlx::query(
        "UPDATE jobs SET completed_at = now() - interval '2 days',
             id = (left(replace(rebound_id_floor(now() - interval '3 days')::text, '-', ''), 12) || right(replace(id::text, '-', ''), 20))::uuid",
    )
    .execute(s.pool())
    .await
    .unwrap();
    let recent = s.enqueue(NewJob::new("t", json!(["recent"]))).await.unwrap().job.id;
    claim_one(s, "default").await;
    s.complete(&Completion { id: recent, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap();
    for i in 0..3 {
        let id = s.enqueue(NewJob::new("t", json!([i]))).await.unwrap().job.id;
        claim_one(s, "default").await;
        s.fail(&Failure { id, attempt: None, worker_id: None, outcome: Outcome::DeadLetter(HandlerError::new("x", "y")), error_code: None }).await.unwrap();
    }
    // Cancelled jobs go after a week: one eight days old, one from today.
    let old_cancelled = s.enqueue(NewJob::new("w", json!(["old"]))).await.unwrap().job.id;
    let new_cancelled = s.enqueue(NewJob::new("w", json!(["new"]))).await.unwrap().job.id;
    for id in [old_cancelled, new_cancelled] {
        s.cancel(id, None).await.unwrap();
    }
    sqlx::query(
        "UPDATE jobs SET updated_at = now() - interval '8 days',
             id = (left(replace(rebound_id_floor(now() - interval '9 days')::text, '-', ''), 12) || right(replace(id::text, '-', ''), 20))::uuid
         WHERE id = $1",
    )
    .bind(old_cancelled)
    .execute(s.pool())
    .await
    .unwrap();
    let cfg = PruneConfig { dead_letters_per_queue: 2, ..Default::default() };
    let report = s.prune(&cfg).await.unwrap();
    assert_eq!(report.completed, 3);
    assert_eq!(report.discarded, 1, "the week-old cancelled job");
    assert!(s.get_job(new_cancelled).await.unwrap().is_some(), "a job cancelled today stays");
    assert!(s.get_job(recent).await.unwrap().is_some(), "a job finished within the retention stays");
    assert_eq!(report.dead_letters, 1, "only the oldest beyond the cap");
    assert_eq!(s.count_jobs(&JobFilter::dead_letters(), 100).await.unwrap(), 2);
    let orphans: i64 = sqlx::query_scalar("SELECT count(*) FROM job_attempts a WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = a.job_id)")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(orphans, 0, "pruned jobs take their attempts with them");
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM job_attempts").fetch_one(s.pool()).await.unwrap();
    assert_eq!(kept, 2, "the kept dead letters keep theirs");
}

#[tokio::test]
async fn history_events_and_chart_read_the_completing_execution_from_the_job_row() {
    let db = TestDb::new().await;
    let s = &db.store;
    s.put_policy("t", &patch(json!({"max_attempts": 3, "initial_interval": "PT1S", "jitter": false})), &Actor::new("ops"), None)
        .await
        .unwrap();
    let id = s.enqueue(NewJob::new("t", json!([1]))).await.unwrap().job.id;
    claim_one(s, "default").await;
    s.fail(&failure(id, "net.reset")).await.unwrap();
    make_due(s, id).await;
    assert_eq!(s.claim(&ClaimRequest { worker_id: "w2".into(), ..claim_req(&["default"], 1) }).await.unwrap().len(), 1);
    s.complete(&Completion { id, attempt: Some(2), worker_id: Some("w2".into()), started_at: None, result: None }).await.unwrap();

    let history = s.attempts(id).await.unwrap();
    let seen: Vec<(bool, i32, &str, Option<&str>)> =
        history.iter().map(|a| (a.id.is_some(), a.attempt, a.outcome.as_str(), a.worker_id.as_deref())).collect();
    assert_eq!(seen, vec![(true, 1, "retried", Some("w1")), (false, 2, "completed", Some("w2"))]);
    assert_eq!(s.attempts_for(&[id]).await.unwrap(), history);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM job_attempts").fetch_one(s.pool()).await.unwrap();
    assert_eq!(rows, 1, "only the failed execution is a row");

    let events = s.events(&EventFilter { job_id: Some(id), limit: 10, ..Default::default() }).await.unwrap();
    let kinds: Vec<(&str, Option<i32>, Option<&str>)> =
        events.iter().map(|e| (e.event_type.as_str(), e.attempt, e.worker_id.as_deref())).collect();
    // Newest first: a failure and its retry share their time, the retry positioned after.
    let expected = vec![
        ("job.completed", Some(2), Some("w2")),
        ("job.started", Some(2), Some("w2")),
        ("job.retrying", Some(1), Some("w1")),
        ("job.failed", Some(1), Some("w1")),
        ("job.started", Some(1), Some("w1")),
        ("job.enqueued", None, None),
    ];
    assert_eq!(kinds, expected);
    // The log that all-jobs reads use holds the same starts (one per claim).
    let starts = s.events(&EventFilter { types: vec!["job.started".into()], limit: 10, ..Default::default() }).await.unwrap();
    let from_log: Vec<&str> = starts.iter().map(|e| e.id.as_str()).collect();
    let from_rows: Vec<&str> = events.iter().filter(|e| e.event_type == "job.started").map(|e| e.id.as_str()).collect();
    assert_eq!(from_log, from_rows, "the same events, the same ids");
    let only_completed =
        s.events(&EventFilter { types: vec!["job.completed".into()], limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(only_completed.len(), 1);

    let chart = s.throughput(5).await.unwrap();
    assert_eq!(chart.len(), 5);
    let (completed, failed) = chart.iter().fold((0, 0), |(c, f), (_, dc, df)| (c + dc, f + df));
    assert_eq!((completed, failed), (1, 1));
}

#[tokio::test]
async fn pending_migrations_name_what_the_database_lacks() {
    let db = TestDb::new().await;
    assert_eq!(db.store.pending_migrations().await.unwrap(), Vec::<String>::new(), "a migrated database is in step");
    let last: (i64, String) = sqlx::query_as("DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations) RETURNING version, description")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(db.store.pending_migrations().await.unwrap(), vec![format!("{} {}", last.0, last.1)]);
}

#[tokio::test]
async fn pruning_steps_over_jobs_created_long_ago_but_finished_recently() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut ids = Vec::new();
    for i in 0..4 {
        let id = s.enqueue(NewJob::new("t", json!([i]))).await.unwrap().job.id;
        claim_one(s, "default").await;
        s.complete(&Completion { id, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap();
        ids.push(id);
    }
    // Three made five days ago but finished just now (a job scheduled far ahead, say), then one
    // made four days ago and finished two days ago: the oldest candidates are not old enough.
    let backdate = "UPDATE jobs SET completed_at = now() - $2 * interval '1 day',
             id = (left(replace(rebound_id_floor(now() - $3 * interval '1 day')::text, '-', ''), 12) || right(replace(id::text, '-', ''), 20))::uuid
         WHERE id = $1 RETURNING id";
    let mut recent = Vec::new();
    for id in &ids[..3] {
        let moved: uuid::Uuid = sqlx::query_scalar(backdate).bind(id).bind(0i32).bind(5i32).fetch_one(s.pool()).await.unwrap();
        recent.push(moved);
    }
    let old: uuid::Uuid = sqlx::query_scalar(backdate).bind(ids[3]).bind(2i32).bind(4i32).fetch_one(s.pool()).await.unwrap();
    let cfg = PruneConfig { batch: 2, ..Default::default() };
    let report = s.prune(&cfg).await.unwrap();
    assert_eq!(report.completed, 1, "the old one behind a window of recent ones");
    assert!(s.get_job(old).await.unwrap().is_none());
    for id in recent {
        assert!(s.get_job(id).await.unwrap().is_some(), "finished within the retention: kept");
    }
}

#[tokio::test]
async fn every_connection_has_the_session_settings() {
    let db = TestDb::new().await;
    let settings: (String, String, String) = sqlx::query_as(
        "SELECT current_setting('jit'), current_setting('idle_in_transaction_session_timeout'), current_setting('max_parallel_workers_per_gather')",
    )
    .fetch_one(db.store.pool())
    .await
    .unwrap();
    assert_eq!(settings, ("off".to_string(), "10s".to_string(), "0".to_string()));
}

#[tokio::test]
async fn audit_filters_combine_and_page_newest_first_across_the_actions_a_prefix_matches() {
    let db = TestDb::new().await;
    let s = &db.store;
    let entries = [
        ("alice", "job.cancel", Some("j1")),
        ("bob", "job.retry", Some("j2")),
        ("alice", "queue.pause", Some("mail")),
        ("bob", "job.cancel", Some("j1")),
        ("alice", "job.retry", Some("j3")),
        ("carol", "jobs.bulk_retry", None),
    ];
    for (actor, action, target) in entries {
        s.audit(&Actor::new(actor), action, target, json!({})).await.unwrap();
    }
    let read = |f: AuditFilter| async move {
        s.audit_log(&f).await.unwrap().into_iter().map(|e| (e.actor, e.action, e.target)).collect::<Vec<_>>()
    };
    let who = |rows: &[(String, String, Option<String>)]| rows.iter().map(|(a, act, _)| format!("{a}:{act}")).collect::<Vec<_>>();
    let jobs = read(AuditFilter { action: Some("job.".into()), ..Default::default() }).await;
    assert_eq!(who(&jobs), ["alice:job.retry", "bob:job.cancel", "bob:job.retry", "alice:job.cancel"], "two actions merged newest first; jobs.* is not job.*");
    let alices = read(AuditFilter { action: Some("job.".into()), actor: Some("alice".into()), ..Default::default() }).await;
    assert_eq!(who(&alices), ["alice:job.retry", "alice:job.cancel"]);
    let on_j1 = read(AuditFilter { target: Some("j1".into()), ..Default::default() }).await;
    assert_eq!(who(&on_j1), ["bob:job.cancel", "alice:job.cancel"]);
    let on_j1_cancels = read(AuditFilter { target: Some("j1".into()), action: Some("job.c".into()), ..Default::default() }).await;
    assert_eq!(on_j1_cancels.len(), 2);
    assert!(read(AuditFilter { action: Some("nope.".into()), ..Default::default() }).await.is_empty());

    // Paged two at a time through the prefix.
    let first = s.audit_log(&AuditFilter { action: Some("job".into()), limit: 2, ..Default::default() }).await.unwrap();
    let second = s.audit_log(&AuditFilter { action: Some("job".into()), limit: 2, before: first.last().map(|e| e.id), ..Default::default() }).await.unwrap();
    let third = s.audit_log(&AuditFilter { action: Some("job".into()), limit: 2, before: second.last().map(|e| e.id), ..Default::default() }).await.unwrap();
    let paged: Vec<String> = first.iter().chain(&second).chain(&third).map(|e| format!("{}:{}", e.actor, e.action)).collect();
    assert_eq!(paged, ["carol:jobs.bulk_retry", "alice:job.retry", "bob:job.cancel", "bob:job.retry", "alice:job.cancel"]);
}

/// Marks the session with this token hash last used `secs` seconds ago.
async fn session_last_used(s: &Store, token_hash: &str, secs: i64) {
    let n = sqlx::query("UPDATE sessions SET last_seen_at = now() - $2 * interval '1 second' WHERE token_hash = $1")
        .bind(token_hash)
        .bind(secs)
        .execute(s.pool())
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(n, 1, "no session {token_hash}");
}

/// How many whole seconds ago the session with this token hash was marked used (`None`: no row).
async fn session_seen_secs_ago(s: &Store, token_hash: &str) -> Option<i64> {
    sqlx::query_scalar::<_, i64>("SELECT extract(epoch FROM now() - last_seen_at)::bigint FROM sessions WHERE token_hash = $1")
        .bind(token_hash)
        .fetch_optional(s.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn sessions_end_when_idle_and_are_marked_used_at_most_once_a_minute() {
    let db = TestDb::new().await;
    let s = &db.store;
    let olivia = s.upsert_operator("olivia", "$argon2id$not-checked-here", rebound_queue::store::Role::Operator, &Actor::system("test")).await.unwrap();
    let idle = Duration::from_secs(30 * 60);
    s.create_session(olivia.id, "h1", "csrf1", Duration::from_secs(3600)).await.unwrap();

    // Used 30 s ago: live, and not written again.
    session_last_used(s, "h1", 30).await;
    for _ in 0..3 {
        assert_eq!(s.live_session("h1", idle).await.unwrap().map(|x| x.csrf_token), Some("csrf1".to_string()));
    }
    let ago = session_seen_secs_ago(s, "h1").await.unwrap();
    assert!(ago >= 30, "marked {ago} s ago: written again within the minute");
    // Used 90 s ago: marked now.
    session_last_used(s, "h1", 90).await;
    assert!(s.live_session("h1", idle).await.unwrap().is_some());
    let ago = session_seen_secs_ago(s, "h1").await.unwrap();
    assert!(ago < 30, "marked {ago} s ago: not marked again after a minute");
    // A limit shorter than two minutes marks it every half limit, so a session in use never
    // looks idle.
    session_last_used(s, "h1", 20).await;
    assert!(s.live_session("h1", Duration::from_secs(30)).await.unwrap().is_some());
    let ago = session_seen_secs_ago(s, "h1").await.unwrap();
    assert!(ago < 15, "marked {ago} s ago: with a 30 s limit, a use 20 s after the last marks it");

    // Unused for longer than the limit: refused, and deleted.
    session_last_used(s, "h1", 29 * 60).await;
    assert!(s.live_session("h1", idle).await.unwrap().is_some());
    session_last_used(s, "h1", 31 * 60).await;
    assert!(s.live_session("h1", idle).await.unwrap().is_none());
    assert_eq!(session_seen_secs_ago(s, "h1").await, None, "the idle session is deleted");

    // `session` applies the 30-minute default.
    s.create_session(olivia.id, "h2", "csrf2", Duration::from_secs(3600)).await.unwrap();
    session_last_used(s, "h2", 29 * 60).await;
    assert!(s.session("h2").await.unwrap().is_some());
    session_last_used(s, "h2", 31 * 60).await;
    assert!(s.session("h2").await.unwrap().is_none());
    assert_eq!(session_seen_secs_ago(s, "h2").await, None);

    // Expired, however recently used: refused, and deleted.
    s.create_session(olivia.id, "h3", "csrf3", Duration::from_secs(3600)).await.unwrap();
    sqlx::query("UPDATE sessions SET expires_at = now() - interval '1 second' WHERE token_hash = 'h3'").execute(s.pool()).await.unwrap();
    assert!(s.live_session("h3", idle).await.unwrap().is_none());
    assert_eq!(session_seen_secs_ago(s, "h3").await, None);

    // Unknown: nothing, and nothing else is touched.
    s.create_session(olivia.id, "h4", "csrf4", Duration::from_secs(3600)).await.unwrap();
    assert!(s.live_session("nope", idle).await.unwrap().is_none());
    assert!(session_seen_secs_ago(s, "h4").await.is_some());
}

#[tokio::test]
async fn a_look_at_login_failures_counts_nothing_and_waits_for_no_lock() {
    let db = TestDb::new().await;
    let s = &db.store;
    let keys = ["account:olivia".to_string(), "address:10.0.0.1".to_string()];
    let forget = Duration::from_secs(15 * 60);
    let total = |f: &[rebound_queue::store::LoginFailures]| Duration::from_secs(f.iter().map(|x| u64::from(x.failures)).sum());

    assert_eq!(s.login_wait(&keys, forget, total).await.unwrap(), Duration::ZERO);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM login_failures").fetch_one(s.pool()).await.unwrap();
    assert_eq!(rows, 0, "a look counts nothing");
    for _ in 0..2 {
        assert_eq!(s.start_login_attempt(&keys, forget, |_| Duration::ZERO).await.unwrap(), Duration::ZERO);
    }
    assert_eq!(s.login_wait(&keys, forget, total).await.unwrap(), Duration::from_secs(4), "two failures of each key");
    assert_eq!(s.login_wait(&keys, forget, total).await.unwrap(), Duration::from_secs(4), "looking again counted nothing");

    // An attempt in progress holds the rows' locks; a look does not wait for them.
    let mut tx = s.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM login_failures WHERE key = ANY($1) FOR UPDATE").bind(&keys[..]).execute(&mut *tx).await.unwrap();
    let looked = tokio::time::timeout(Duration::from_secs(5), s.login_wait(&keys, forget, total)).await.expect("the look waited for a lock");
    assert_eq!(looked.unwrap(), Duration::from_secs(4));
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn sign_in_devices_name_their_enabled_operator_and_only_the_newest_are_kept() {
    let db = TestDb::new().await;
    let s = &db.store;
    let system = Actor::system("test");
    let olivia = s.upsert_operator("olivia", "$argon2id$not-checked-here", rebound_queue::store::Role::Operator, &system).await.unwrap();
    let month = Duration::from_secs(30 * 24 * 3600);
    let last_used = |hash: &'static str, secs_ago: i64| async move {
        sqlx::query("UPDATE sign_in_devices SET last_used_at = now() - $2 * interval '1 second' WHERE token_hash = $1")
            .bind(hash)
            .bind(secs_ago)
            .execute(s.pool())
            .await
            .unwrap();
    };

    assert!(s.remember_sign_in_device(olivia.id, "d1", month, 2).await.unwrap());
    assert_eq!(s.sign_in_device_operator("d1").await.unwrap().as_deref(), Some("olivia"));
    assert_eq!(s.sign_in_device_operator("unknown").await.unwrap(), None);

    // Three devices, two kept: the least recently used goes, and renewing one makes it newest.
    last_used("d1", 300).await;
    s.remember_sign_in_device(olivia.id, "d2", month, 2).await.unwrap();
    last_used("d2", 200).await;
    s.remember_sign_in_device(olivia.id, "d1", month, 2).await.unwrap();
    s.remember_sign_in_device(olivia.id, "d3", month, 2).await.unwrap();
    let kept: Vec<String> = sqlx::query_scalar("SELECT token_hash FROM sign_in_devices ORDER BY token_hash").fetch_all(s.pool()).await.unwrap();
    assert_eq!(kept, ["d1", "d3"], "the renewed device is kept, the one unused longest goes");

    // An expired device names no one and is deleted by the next sign-in's remembering.
    sqlx::query("UPDATE sign_in_devices SET expires_at = now() - interval '1 second' WHERE token_hash = 'd3'").execute(s.pool()).await.unwrap();
    assert_eq!(s.sign_in_device_operator("d3").await.unwrap(), None);
    let bob = s.upsert_operator("bob", "$argon2id$not-checked-here", rebound_queue::store::Role::Viewer, &system).await.unwrap();
    s.remember_sign_in_device(bob.id, "b1", month, 2).await.unwrap();
    let kept: Vec<String> = sqlx::query_scalar("SELECT token_hash FROM sign_in_devices ORDER BY token_hash").fetch_all(s.pool()).await.unwrap();
    assert_eq!(kept, ["b1", "d1"]);
    // Another operator's token cannot be taken over by remembering it for someone else.
    assert!(!s.remember_sign_in_device(bob.id, "d1", month, 2).await.unwrap());
    assert_eq!(s.sign_in_device_operator("d1").await.unwrap().as_deref(), Some("olivia"));

    // A password reset forgets the operator's devices; so does disabling (and re-enabling,
    // which is an upsert, brings none back).
    s.remember_sign_in_device(bob.id, "b2", month, 2).await.unwrap();
    s.upsert_operator("bob", "$argon2id$a-new-one", rebound_queue::store::Role::Viewer, &system).await.unwrap();
    assert_eq!(s.sign_in_device_operator("b1").await.unwrap(), None);
    assert_eq!(s.sign_in_device_operator("b2").await.unwrap(), None);
    assert!(s.disable_operator("olivia", &system).await.unwrap());
    assert_eq!(s.sign_in_device_operator("d1").await.unwrap(), None);
    s.upsert_operator("olivia", "$argon2id$not-checked-here", rebound_queue::store::Role::Operator, &system).await.unwrap();
    assert_eq!(s.sign_in_device_operator("d1").await.unwrap(), None);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM sign_in_devices").fetch_one(s.pool()).await.unwrap();
    assert_eq!(left, 0);

    // A device is forgotten once its throttle key has the limit's failures, not before.
    s.remember_sign_in_device(olivia.id, "d4", month, 2).await.unwrap();
    sqlx::query("INSERT INTO login_failures (key, failures, last_failed_at) VALUES ('device:d4', 4, now())").execute(s.pool()).await.unwrap();
    assert!(!s.forget_failing_sign_in_device("d4", "device:d4", 5).await.unwrap());
    assert!(!s.forget_failing_sign_in_device("d4", "device:none", 5).await.unwrap(), "no failures, not forgotten");
    sqlx::query("UPDATE login_failures SET failures = 5 WHERE key = 'device:d4'").execute(s.pool()).await.unwrap();
    assert!(s.forget_failing_sign_in_device("d4", "device:d4", 5).await.unwrap());
    assert_eq!(s.sign_in_device_operator("d4").await.unwrap(), None);
}

#[tokio::test]
async fn dead_letters_are_listed_most_recently_dead_first_and_a_search_goes_on_past_its_window() {
    use rebound_queue::store::{DeathCursor, SEARCH_WINDOW};
    let db = TestDb::new().await;
    let s = &db.store;
    let n = SEARCH_WINDOW as usize + 3;
    let ids: Vec<Uuid> = s
        .enqueue_batch((0..n).map(|i| NewJob::new(if i == 0 { "rare.kind" } else { "common.kind" }, json!([i])).queue(if i % 2 == 0 { "even" } else { "odd" })).collect())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.job.id)
        .collect();
    // Made dead letters by hand, the first created the last to die: death order is the
    // reverse of creation order.
    sqlx::query(
        "UPDATE jobs SET state = 'discarded', dead_letter = true, discarded_at = now(),
             dead_lettered_at = now() - (row_number * interval '1 second'),
             last_error = '{\"type\": \"net.timeout\", \"message\": \"no\"}', error_signature = rebound_error_signature('{\"type\": \"net.timeout\", \"message\": \"no\"}')
         FROM (SELECT id AS pick, row_number() OVER (ORDER BY id) - 1 AS row_number FROM jobs) o
         WHERE id = o.pick",
    )
    .execute(s.pool())
    .await
    .unwrap();
    let dead = JobFilter::dead_letters();
    let (first, next) = s.dead_letters_by_death(&dead, None, 3).await.unwrap();
    assert_eq!(first.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[0], ids[1], ids[2]], "the oldest-created died last");
    let (second, _) = s.dead_letters_by_death(&dead, next, 3).await.unwrap();
    assert_eq!(second.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[3], ids[4], ids[5]]);
    let (odd, _) = s.dead_letters_by_death(&JobFilter { queue: Some("odd".into()), ..dead.clone() }, None, 2).await.unwrap();
    assert_eq!(odd.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[1], ids[3]], "a queue's by its own index");

    // A search reads a window of the next dead letters; one that ran out before its page
    // filled says where to go on, and going on finds the rest.
    let rare = JobFilter { job_type: Some("rare.kind".into()), ..dead.clone() };
    let (found, next) = s.dead_letters_by_death(&rare, None, 10).await.unwrap();
    assert_eq!(found.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[0]]);
    assert!(next.is_some(), "the window ran out: more may match after it");
    let mut after = next;
    let mut pages = 0;
    while let Some(cursor) = after {
        let (more, next) = s.dead_letters_by_death(&rare, Some(cursor), 10).await.unwrap();
        assert!(more.is_empty(), "one rare dead letter only");
        after = next;
        pages += 1;
        assert!(pages < 5, "the search ends");
    }
    let common = JobFilter { job_type: Some("common.kind".into()), ..dead.clone() };
    let (page, next) = s.dead_letters_by_death(&common, None, 2).await.unwrap();
    assert_eq!((page.iter().map(|j| j.id).collect::<Vec<_>>(), next), (vec![ids[1], ids[2]], DeathCursor::parse(&DeathCursor { at: page[1].dead_lettered_at.unwrap(), id: ids[2] }.encode())));
    // Bounded by when they died, the walk ends with the bound: no pages of nothing after it.
    // Bounded by the database's time of the deaths, not this clock: the ten that died within
    // 9.5 s of the last.
    let last_death = first[0].dead_lettered_at.unwrap();
    let lately = JobFilter { dead_after: Some(last_death - jiff::SignedDuration::from_millis(9_500)), ..dead.clone() };
    let (recent, next) = s.dead_letters_by_death(&lately, None, 50).await.unwrap();
    assert!(recent.len() == 10 && recent[0].id == ids[0], "{}", recent.len());
    assert_eq!(next, None);
    let (recent_common, next) = s.dead_letters_by_death(&JobFilter { job_type: Some("common.kind".into()), ..lately }, None, 50).await.unwrap();
    assert_eq!((recent_common.len() + 1, next), (recent.len(), None), "a search within the bound ends with it too");
    // A re-driven job leaves the listing.
    let opts = RedriveOptions { budget: RedriveBudget::Fresh, stagger: None, actor: Actor::new("ops"), reason: None };
    s.redrive(&JobSelection::Ids(vec![ids[0]]), &opts).await.unwrap();
    let (first, _) = s.dead_letters_by_death(&dead, None, 1).await.unwrap();
    assert_eq!(first[0].id, ids[1]);
    assert_eq!(DeathCursor::parse("nonsense"), None);
}

/// Sets a job's time to run (a retry's backoff elapsed, or not yet).
async fn set_due(s: &Store, id: Uuid, seconds_from_now: f64) {
    sqlx::query("UPDATE jobs SET scheduled_at = now() + $2 * interval '1 second' WHERE id = $1")
        .bind(id)
        .bind(seconds_from_now)
        .execute(s.pool())
        .await
        .unwrap();
}

async fn failed_once(s: &Store, job: NewJob) -> Uuid {
    let id = s.enqueue(job).await.unwrap().job.id;
    let claimed = s.claim(&claim_req(&["default"], 10)).await.unwrap();
    assert!(claimed.iter().any(|j| j.id == id));
    assert_eq!(s.fail(&failure(id, "x")).await.unwrap().job.state, JobState::Retryable);
    id
}

/// A busy worker takes a due retry as it is, without the scheduler's promotion (a write of its
/// own), but never one not yet due, one that expired, one whose rate-limit key admits it, one
/// less urgent than an available job of its queue, nor anything in a paused queue or in
/// maintenance mode. The scheduler leaves a due retry to the claims for
/// `RETRY_CLAIM_WINDOW`, then promotes it as before.
#[tokio::test]
async fn a_due_retry_is_claimed_as_it_is_and_promoted_only_after_its_window() {
    let db = TestDb::new().await;
    let s = &db.store;
    let actor = Actor::new("ops");
    let id = failed_once(s, NewJob::new("t", json!(["r"]))).await;

    set_due(s, id, 30.0).await;
    assert!(s.claim(&claim_req(&["default"], 10)).await.unwrap().is_empty(), "not due yet");

    // Falling due, its queue is told (an idle worker claims it then), and it is not written.
    let mut listener = s.listen().await.unwrap();
    set_due(s, id, -0.01).await;
    assert_eq!(s.promote_due(100).await.unwrap(), 0, "within its window, left to the claims");
    assert_eq!(listener.next(Duration::from_secs(5)).await.unwrap(), Some(Notification::Jobs("default".into())));
    assert_eq!(s.job(id).await.unwrap().state, JobState::Retryable);
    // (Each check of the window sets the retry's time again: a pause of the test past the
    // window must not fail it.)
    set_due(s, id, -0.01).await;
    let until = s.time_until_next_due().await.unwrap().unwrap();
    assert!(until <= rebound_queue::store::RETRY_CLAIM_WINDOW && until > Duration::ZERO, "the scheduler waits for the window's end, not a spin: {until:?}");
    // A job due sooner is waited for by its own time, not the retry's window.
    let mut soon = NewJob::new("t", json!(["soon"])).queue("elsewhere");
    soon.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(30));
    let soon = s.enqueue(soon).await.unwrap().job.id;
    sqlx::query("UPDATE jobs SET scheduled_at = now() + interval '40 milliseconds' WHERE id = $1").bind(soon).execute(s.pool()).await.unwrap();
    set_due(s, id, -0.01).await;
    let until = s.time_until_next_due().await.unwrap().unwrap();
    assert!(until <= Duration::from_millis(40), "{until:?}");
    sqlx::query("DELETE FROM jobs WHERE id = $1").bind(soon).execute(s.pool()).await.unwrap();

    s.set_queue_paused("default", true, &actor).await.unwrap();
    assert!(s.claim(&claim_req(&["default"], 10)).await.unwrap().is_empty(), "paused");
    s.set_queue_paused("default", false, &actor).await.unwrap();
    s.enable_maintenance(None, None, &actor).await.unwrap();
    assert!(s.claim(&claim_req(&["default"], 10)).await.unwrap().is_empty(), "maintenance mode");
    s.disable_maintenance(&actor).await.unwrap();

    let scheduled_at = s.job(id).await.unwrap().scheduled_at;
    let claimed = s.claim(&claim_req(&["default"], 10)).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![id]);
    let job = &claimed[0];
    assert_eq!((job.state, job.attempt), (JobState::Active, 2));
    assert_eq!(job.enqueued_at, Some(scheduled_at), "ready from the moment it fell due");
    let starts: i64 = sqlx::query_scalar("SELECT count(*) FROM job_transitions WHERE state = 'active' AND $1 = ANY(job_ids)")
        .bind(id)
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(starts, 2, "each start is in the log events are read from");
    s.complete(&Completion { id, attempt: Some(2), worker_id: Some("w1".into()), started_at: job.started_at, result: None }).await.unwrap();
    assert_eq!(s.job(id).await.unwrap().state, JobState::Completed);

    // Less urgent than the queue's available work: it waits for its turn as a promoted retry
    // would.
    let low = failed_once(s, NewJob::new("t", json!(["low"]))).await;
    set_due(s, low, -0.01).await;
    let mut urgent = NewJob::new("t", json!(["urgent"]));
    urgent.priority = 5;
    let urgent = s.enqueue(urgent).await.unwrap().job.id;
    let first = s.claim(&claim_req(&["default"], 1)).await.unwrap();
    assert_eq!(first.iter().map(|j| j.id).collect::<Vec<_>>(), vec![urgent]);
    assert_eq!(s.job(low).await.unwrap().state, JobState::Retryable);
    // Past its window, the scheduler promotes it and it is claimed as any available job.
    set_due(s, low, -10.0).await;
    assert_eq!(s.promote_due(100).await.unwrap(), 1);
    assert_eq!(s.job(low).await.unwrap().state, JobState::Available);

    // As urgent as the best available job: the due retry goes first, the rest of the batch
    // from the available jobs.
    // (Its failing run's claim takes `low` along.)
    let due = failed_once(s, NewJob::new("t", json!(["due"]))).await;
    set_due(s, due, -0.01).await;
    let plain = s.enqueue(NewJob::new("t", json!(["plain"]))).await.unwrap().job.id;
    let later = s.enqueue(NewJob::new("t", json!(["later"]))).await.unwrap().job.id;
    let got = s.claim(&claim_req(&["default"], 2)).await.unwrap();
    assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![due, plain]);
    assert_eq!(s.job(later).await.unwrap().state, JobState::Available, "the batch's limit holds across both");
    s.claim(&claim_req(&["default"], 10)).await.unwrap();

    // Expired while it waited: the expiry pass's, not a claim's.
    let mut expiring = NewJob::new("t", json!(["expiring"]));
    expiring.expires_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600));
    let expiring = failed_once(s, expiring).await;
    set_due(s, expiring, -0.01).await;
    sqlx::query("UPDATE jobs SET expires_at = now() - interval '1 second' WHERE id = $1").bind(expiring).execute(s.pool()).await.unwrap();
    assert!(s.claim(&claim_req(&["default"], 10)).await.unwrap().is_empty(), "expired");
    assert_eq!(s.expire_due(10).await.unwrap(), 1);

    // Under a rate-limit key, admission is the key's: promoted at once, never taken as it is.
    let keyed = failed_once(s, NewJob::new("t", json!(["keyed"])).rate_limit("k", Some(1))).await;
    set_due(s, keyed, -0.01).await;
    assert_eq!(s.promote_due(100).await.unwrap(), 1, "no window for a keyed retry");
    assert_eq!(s.job(keyed).await.unwrap().state, JobState::Available);
}

/// Fails one job of `job_type`; returns it and the snapshot its failed attempt points at.
async fn failed_once_with_snapshot(s: &Store, job_type: &str) -> (Uuid, Uuid) {
    let id = failed_once(s, NewJob::new(job_type, json!([]))).await;
    let snapshot: Uuid = sqlx::query_scalar("SELECT policy_id FROM job_attempts WHERE job_id = $1").bind(id).fetch_one(s.pool()).await.unwrap();
    (id, snapshot)
}

async fn snapshots(s: &Store) -> HashSet<Uuid> {
    sqlx::query_scalar("SELECT id FROM policy_snapshots").fetch_all(s.pool()).await.unwrap().into_iter().collect()
}

/// The sweep deletes the policy snapshots no attempt refers to any more, and not one that a
/// failure came to point at while the sweep's scan ran (a failure reuses a stored snapshot
/// without writing it, and the scan holds no lock that would make it wait).
#[tokio::test]
async fn policy_snapshots_no_attempt_refers_to_are_swept_but_not_one_a_failure_took_up_meanwhile() {
    let db = TestDb::new().await;
    let s = &db.store;
    for (job_type, attempts) in [("snap.kept", 5), ("snap.gone", 6), ("snap.again", 7)] {
        s.put_policy(job_type, &patch(json!({"max_attempts": attempts, "initial_interval": "PT1M"})), &Actor::new("test"), None).await.unwrap();
    }
    let (_, kept) = failed_once_with_snapshot(s, "snap.kept").await;
    let (gone_job, gone) = failed_once_with_snapshot(s, "snap.gone").await;
    let (again_job, again) = failed_once_with_snapshot(s, "snap.again").await;
    assert_eq!(snapshots(s).await, HashSet::from([kept, gone, again]), "one snapshot per policy");
    // Their jobs were pruned: two snapshots no attempt refers to.
    for sql in ["DELETE FROM job_attempts WHERE job_id = ANY($1)", "DELETE FROM jobs WHERE id = ANY($1)"] {
        sqlx::query(sql).bind(vec![gone_job, again_job]).execute(s.pool()).await.unwrap();
    }

    let sweep = s.begin_snapshot_sweep().await.unwrap();
    assert_eq!(sweep.candidates.iter().copied().collect::<HashSet<_>>(), HashSet::from([gone, again]));
    // Between the scan and the delete, a failure judged by the same policy points at its
    // stored snapshot again.
    let (again_job, again_now) = failed_once_with_snapshot(s, "snap.again").await;
    assert_eq!(again_now, again, "the failure reused the stored snapshot");
    assert_eq!(s.finish_snapshot_sweep(sweep).await.unwrap(), 1, "only the snapshot nothing refers to");
    assert_eq!(snapshots(s).await, HashSet::from([kept, again]));
    let history = s.attempts(again_job).await.unwrap();
    assert_eq!(history[0].policy.as_ref().map(|p| p["max_attempts"].clone()), Some(json!(7)), "the attempt still reads its policy");

    // A sweep with nothing to take deletes nothing, and a failure after one stores its
    // snapshot afresh.
    assert_eq!(s.prune_policy_snapshots().await.unwrap(), 0);
    let (_, gone_now) = failed_once_with_snapshot(s, "snap.gone").await;
    assert_eq!((gone_now, snapshots(s).await), (gone, HashSet::from([kept, gone, again])));
}

/// The sweep's first half waits out a failure in flight: one that points an attempt at an
/// unreferenced snapshot and commits after a later attempt did. Scanned at once, that attempt
/// would be unseen yet below the watermark, and its snapshot deleted under it.
#[tokio::test]
async fn the_snapshot_sweep_waits_for_failures_in_flight() {
    let db = TestDb::new().await;
    let s = &db.store;
    s.put_policy("snap.late", &patch(json!({"max_attempts": 9, "initial_interval": "PT1M"})), &Actor::new("test"), None).await.unwrap();
    let (job, snapshot) = failed_once_with_snapshot(s, "snap.late").await;
    sqlx::query("DELETE FROM job_attempts WHERE job_id = $1").bind(job).execute(s.pool()).await.unwrap();

    // A failure in flight, written as the fail statement writes: the snapshot, then its attempt.
    let mut in_flight = s.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO policy_snapshots (id, policy) SELECT id, policy FROM policy_snapshots WHERE id = $1 ON CONFLICT (id) DO NOTHING")
        .bind(snapshot)
        .execute(&mut *in_flight)
        .await
        .unwrap();
    sqlx::query("INSERT INTO job_attempts (job_id, attempt, outcome, policy_id) VALUES ($1, 2, 'retried', $2)").bind(job).bind(snapshot).execute(&mut *in_flight).await.unwrap();
    // A later attempt, committed first.
    sqlx::query("INSERT INTO job_attempts (job_id, attempt, outcome) VALUES ($1, 3, 'released')").bind(Uuid::now_v7()).execute(s.pool()).await.unwrap();

    let sweeper = s.clone();
    let mut sweep = tokio::spawn(async move { sweeper.prune_policy_snapshots().await });
    tokio::select! {
        done = &mut sweep => panic!("the sweep did not wait for the failure in flight: {done:?}"),
        () = db.until_a_statement_waits_for_a_lock() => {}
    }
    in_flight.commit().await.unwrap();
    // Had the machine stalled past the sweep's lock timeout before that commit, it gave up
    // without deleting anything; either way the next sweep finds the snapshot referenced.
    match sweep.await.unwrap() {
        Ok(swept) => assert_eq!(swept, 0, "the snapshot is referenced now"),
        Err(e) => assert!(e.is_lock_timeout(), "{e}"),
    }
    assert_eq!(s.prune_policy_snapshots().await.unwrap(), 0);
    assert!(snapshots(s).await.contains(&snapshot));
}
