//! The store under database faults injected at exact points (a proxy between the store and
//! Postgres: `rebound_queue::testing::FaultProxy`), and what each costs a job:
//!
//! * a transaction whose caller is cancelled while `BEGIN` is on the wire leaves no session
//!   inside a transaction, and the pool never hands out a connection in one;
//! * a claim that commits with its answer lost costs nothing: the worker hands the jobs back
//!   uncounted ([`Store::release_orphans`]), and a heartbeat does if the worker never noticed;
//! * the same for a claim that takes a due retry as it is (no promotion first);
//! * a retry-in-place write whose answer was lost is recognised as written when tried again;
//! * a progress report lost on the way is missing and nothing else is; one whose answer was
//!   lost is kept once;
//! * a snooze whose answer was lost, written again after the same worker claimed the job
//!   again at the attempt number the snooze gave back, is refused, not applied to that run;
//! * after a database restart the rescuer gives every lock one visibility timeout;
//! * a batch enqueue copied in is all or nothing wherever its connection drops: before the
//!   `COPY`, in the middle of its rows, at its `COMMIT`; with the `COMMIT`'s answer lost it
//!   is all there, and sent again with its ids it is refused as a duplicate naming one.

use std::time::Duration;

use rebound_queue::outcome::HandlerError;
use rebound_queue::Outcome;
use rebound_queue::store::{
    ClaimRequest, Completion, Failure, InPlaceEnd, InPlaceRun, KnownRun, ORPHAN_REASON, ProgressReport, RetriedInPlace, WorkerBeat, WorkerRegistration,
    WorkerStatus,
};
use rebound_queue::testing::{Fault, FaultPoint, FaultProxy, PrivateCluster, TestDb};
use rebound_queue::{JobState, NewJob, Store};
use serde_json::json;
use sqlx::Connection;
use uuid::Uuid;

fn claim_req(worker: &str, limit: u32, visibility: Duration) -> ClaimRequest {
    ClaimRequest { worker_id: worker.into(), queues: vec!["default".into()], limit, visibility_timeout: visibility }
}

/// Sessions of `db` that are inside a transaction and have not done anything for `idle_for`.
async fn idle_in_transaction(store: &Store, db: &str, idle_for: Duration) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = $1 AND state LIKE 'idle in transaction%' AND state_change < now() - $2 * interval '1 millisecond'",
    )
    .bind(db)
    .bind(idle_for.as_millis() as i64)
    .fetch_one(store.pool())
    .await
    .unwrap()
}

#[tokio::test]
async fn a_transaction_cancelled_during_begin_leaves_no_session_in_a_transaction() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    // One connection, so the pool must hand the same one out again if it kept it.
    let through = Store::connect(&proxy.url(&db.name), 1).await.unwrap();
    let job = db.store.enqueue(NewJob::new("t.cancel", json!([]))).await.unwrap().job;

    // `cancel` opens a transaction; its BEGIN reaches the server, the answer is held back, and
    // the caller gives up meanwhile, as an HTTP handler does when its client disconnects.
    // It gives up once the proxy has the BEGIN, however long the call took to send it.
    let held = proxy.inject(Fault::once("BEGIN", FaultPoint::Delay(Duration::from_millis(600))));
    // Boxed, so that dropping it drops the call (a stack pin would keep it alive to the end).
    let mut call = Box::pin(through.cancel(job.id, None));
    let sent = async {
        while held.count() == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let finished = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            r = &mut call => Some(r),
            () = sent => None,
        }
    })
    .await
    .expect("BEGIN reached the proxy");
    assert!(finished.is_none(), "the call was still waiting for BEGIN: {finished:?}");
    drop(call);
    assert_eq!(held.count(), 1);

    // The next borrower writes through the pool: that write must be committed on its own,
    // not swallowed by a transaction left open by the cancelled call.
    let other = through.enqueue(NewJob::new("t.after", json!([]))).await.unwrap().job;
    let seen = db.store.get_job(other.id).await.unwrap();
    assert!(seen.is_some(), "a write after the cancelled transaction is visible to other sessions");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(idle_in_transaction(&db.store, &db.name, Duration::from_secs(1)).await, 0, "no session sits in a transaction");
    assert_eq!(db.store.job(job.id).await.unwrap().state, JobState::Available, "the cancelled call wrote nothing");
}

#[tokio::test]
async fn a_claim_whose_answer_is_lost_costs_no_attempt() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let jobs: Vec<Uuid> = db
        .store
        .enqueue_batch((0..3).map(|i| NewJob::new("t.claim", json!([i]))).collect())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.job.id)
        .collect();

    let lost = proxy.inject(Fault::once("SET state = 'active', attempt = j.attempt + 1", FaultPoint::AfterCommit));
    let answer = through.claim(&claim_req("w1", 10, Duration::from_secs(60))).await;
    assert!(answer.is_err(), "the claim's answer was lost: {answer:?}");
    assert_eq!(lost.count(), 1);
    for id in &jobs {
        let job = db.store.job(*id).await.unwrap();
        assert_eq!((job.state, job.attempt, job.locked_by.as_deref()), (JobState::Active, 1, Some("w1")), "committed, under w1");
    }

    // The worker holds none of them: it hands all three back, uncounted, with a record.
    let released = through.release_orphans("w1", &[]).await.unwrap();
    assert_eq!(released.len(), 3);
    for id in &jobs {
        let job = db.store.job(*id).await.unwrap();
        assert_eq!((job.state, job.attempt, job.locked_by), (JobState::Available, 0, None));
        let history = db.store.attempts(*id).await.unwrap();
        assert_eq!(history.len(), 1);
        assert_eq!((history[0].outcome.as_str(), history[0].attempt, history[0].worker_id.as_deref()), ("released", 1, Some("w1")));
        assert_eq!(history[0].error_message.as_deref(), Some(ORPHAN_REASON));
    }
    // Claimed again, they run as attempt 1.
    let again = through.claim(&claim_req("w1", 10, Duration::from_secs(60))).await.unwrap();
    assert!(again.iter().all(|j| j.attempt == 1) && again.len() == 3);
    // Jobs the worker holds are never touched.
    let known: Vec<Uuid> = again.iter().map(|j| j.id).collect();
    assert!(through.release_orphans("w1", &known).await.unwrap().is_empty());
}

/// A due retry is claimed as it is, without a promotion (see
/// migrations/…_retries_claimed_when_due.sql): a claim of one cut as it is sent leaves it
/// waiting, one whose answer was lost costs it nothing once the worker hands it back, and
/// either way its next run is its second attempt.
#[tokio::test]
async fn a_lost_claim_of_a_due_retry_costs_it_no_attempt() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let id = db.store.enqueue(NewJob::new("t.claim", json!([]))).await.unwrap().job.id;
    db.store.claim(&claim_req("w0", 1, Duration::from_secs(60))).await.unwrap();
    let failure = Failure { id, attempt: Some(1), worker_id: Some("w0".into()), outcome: Outcome::Retry(HandlerError::new("t.flaky", "boom")), error_code: None };
    assert_eq!(db.store.fail(&failure).await.unwrap().job.state, JobState::Retryable);
    sqlx::query("UPDATE jobs SET scheduled_at = now() - interval '10 milliseconds' WHERE id = $1").bind(id).execute(db.store.pool()).await.unwrap();

    let cut = proxy.inject(Fault::once("SET state = 'active', attempt = j.attempt + 1", FaultPoint::BeforeSend));
    assert!(through.claim(&claim_req("w1", 10, Duration::from_secs(60))).await.is_err());
    assert_eq!(cut.count(), 1);
    let job = db.store.job(id).await.unwrap();
    assert_eq!((job.state, job.attempt, job.locked_by), (JobState::Retryable, 1, None), "nothing was written");

    let lost = proxy.inject(Fault::once("SET state = 'active', attempt = j.attempt + 1", FaultPoint::AfterCommit));
    assert!(through.claim(&claim_req("w1", 10, Duration::from_secs(60))).await.is_err());
    assert_eq!(lost.count(), 1);
    let job = db.store.job(id).await.unwrap();
    assert_eq!((job.state, job.attempt, job.locked_by.as_deref()), (JobState::Active, 2, Some("w1")), "committed, under w1");
    assert_eq!(through.release_orphans("w1", &[]).await.unwrap().len(), 1);
    let job = db.store.job(id).await.unwrap();
    assert_eq!((job.state, job.attempt, job.locked_by), (JobState::Available, 1, None), "handed back uncounted, ready to run");
    let outcomes: Vec<(String, i32)> = db.store.attempts(id).await.unwrap().into_iter().map(|a| (a.outcome, a.attempt)).collect();
    assert_eq!(outcomes, vec![("retried".to_owned(), 1), ("released".to_owned(), 2)]);

    let again = through.claim(&claim_req("w1", 10, Duration::from_secs(60))).await.unwrap();
    assert_eq!(again.iter().map(|j| (j.id, j.attempt)).collect::<Vec<_>>(), vec![(id, 2)]);
}

/// A claim over two queues whose second queue fails: one transaction, so the first queue's
/// jobs are not left active under the caller's name either.
#[tokio::test]
async fn a_claim_over_several_queues_is_all_or_nothing_when_a_later_one_fails() {
    let db = TestDb::new().await;
    // A concurrency limit makes the claim lock the queue's row; another transaction holds it,
    // and the claimer gives up on the lock after 300 ms.
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let impatient = Store::connect(&format!("{}{sep}options=-c%20lock_timeout%3D300", db.url), 2).await.unwrap();
    let ids: Vec<Uuid> = db
        .store
        .enqueue_batch((0..4).map(|i| NewJob::new("t.claim", json!([i])).queue(if i < 2 { "a" } else { "b" })).collect())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.job.id)
        .collect();
    sqlx::query("INSERT INTO queues (name, concurrency_limit) VALUES ('b', 100) ON CONFLICT (name) DO UPDATE SET concurrency_limit = 100")
        .execute(db.store.pool())
        .await
        .unwrap();
    let mut holder = db.store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM queues WHERE name = 'b' FOR UPDATE").execute(&mut *holder).await.unwrap();

    let req = ClaimRequest { worker_id: "w1".into(), queues: vec!["a".into(), "b".into()], limit: 10, visibility_timeout: Duration::from_secs(60) };
    // Queue b's failure undoes queue a's claim: a later queue's claim whose answer was lost
    // cannot leave jobs active that the caller never heard of beside the ones it did.
    assert!(impatient.claim(&req).await.is_err(), "queue b's failure is the claim's");
    for id in &ids {
        assert_eq!(db.store.job(*id).await.unwrap().state, JobState::Available, "nothing was claimed");
    }
    let only_b = ClaimRequest { queues: vec!["b".into()], ..req.clone() };
    assert!(impatient.claim(&only_b).await.is_err());
    holder.rollback().await.unwrap();
    let got = impatient.claim(&req).await.expect("both queues' jobs once b is free");
    assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), ids, "queue order, then FIFO");
}

/// A claim its caller gave up on while it waited (a worker stopping lets an unanswered claim
/// go after a grace) must not commit later, when the worker is gone and its final sweep done:
/// its jobs would sit active under a dead worker until the rescuer charged them an attempt.
#[tokio::test]
async fn a_claim_given_up_while_it_waits_claims_nothing_later() {
    let db = TestDb::new().await;
    let id = db.store.enqueue(NewJob::new("t.claim", json!([])).queue("held")).await.unwrap().job.id;
    sqlx::query("INSERT INTO queues (name, concurrency_limit) VALUES ('held', 10) ON CONFLICT (name) DO UPDATE SET concurrency_limit = 10")
        .execute(db.store.pool())
        .await
        .unwrap();
    // A limited queue's claims wait for its row: hold it.
    let mut holder = db.store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM queues WHERE name = 'held' FOR UPDATE").execute(&mut *holder).await.unwrap();
    let req = ClaimRequest { worker_id: "w1".into(), queues: vec!["held".into()], limit: 10, visibility_timeout: Duration::from_secs(60) };
    let waiting = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'")
            .bind(&db.name)
            .fetch_one(db.store.pool())
            .await
            .unwrap()
    };
    // The claim is given up only once the server has it waiting for the row: a fixed timeout
    // could end it before it was even sent, and prove nothing. Boxed, so that dropping it
    // drops the call itself.
    let mut claim = Box::pin(db.store.claim(&req));
    tokio::select! {
        answer = &mut claim => panic!("the claim waits for the queue's row, but was answered: {:?}", answer.map(|jobs| jobs.len())),
        () = db.until_a_statement_waits_for_a_lock() => {}
    }
    drop(claim);

    // Postgres notices the claim has no one to answer within its client check interval.
    let deadline = tokio::time::Instant::now() + rebound_queue::store::CLIENT_CHECK_INTERVAL * 5;
    while waiting().await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the abandoned claim still waits for the queue's row");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holder.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let job = db.store.job(id).await.unwrap();
    assert_eq!((job.state, job.attempt, job.locked_by), (JobState::Available, 0, None), "claimed by no one");
    assert_eq!(db.store.claim(&req).await.unwrap().len(), 1, "a claim someone waits for takes it");
}

/// Registers worker `w1` and claims `n` fresh jobs for it (visibility 60 s).
async fn w1_holding(s: &Store, n: u32) -> Vec<Uuid> {
    let registration = WorkerRegistration {
        id: "w1".into(),
        host: "h".into(),
        pid: 1,
        queues: vec!["default".into()],
        concurrency: n as i32,
        version: "t".into(),
    };
    s.register_worker(&registration).await.unwrap();
    s.enqueue_batch((0..n).map(|i| NewJob::new("t.beat", json!([i]))).collect()).await.unwrap();
    s.claim(&claim_req("w1", n, Duration::from_secs(60))).await.unwrap().into_iter().map(|j| j.id).collect()
}

#[tokio::test]
async fn a_heartbeat_extends_what_is_held_and_hands_back_lapsed_jobs_it_does_not_know() {
    let db = TestDb::new().await;
    let s = &db.store;
    let claimed = w1_holding(s, 4).await;
    let [held, orphan, abandoned, fresh] = [claimed[0], claimed[1], claimed[2], claimed[3]];
    // Three lapsed locks: one the worker holds, one it never received, one whose result the
    // database refused (known, not held). The fourth was claimed a moment ago and is not
    // known yet (its claim's answer may still be on its way): a fresh lock is left alone.
    sqlx::query("UPDATE jobs SET lock_expires_at = now() - interval '1 second' WHERE id = ANY($1)")
        .bind(vec![held, orphan, abandoned])
        .execute(s.pool())
        .await
        .unwrap();
    let beat = WorkerBeat {
        worker_id: "w1",
        held: &[held],
        known: &[held, abandoned],
        running: 1,
        status: WorkerStatus::Degraded,
        detail: Some("claims failing: test"),
        usage: Default::default(),
    };
    let report = s.worker_beat(&beat).await.unwrap();
    assert_eq!(report.extended, vec![held]);
    assert_eq!(report.released, vec![orphan]);
    assert!(report.registered);
    let job = |id| async move { s.job(id).await.unwrap() };
    assert!(job(held).await.lock_expires_at.unwrap() > jiff::Timestamp::now());
    let o = job(orphan).await;
    assert_eq!((o.state, o.attempt), (JobState::Available, 0));
    assert_eq!(job(abandoned).await.state, JobState::Active, "a known job is left for the rescuer");
    assert_eq!(job(fresh).await.state, JobState::Active, "a fresh lock is never handed back");
    let w = s.workers().await.unwrap().into_iter().find(|w| w.id == "w1").unwrap();
    assert_eq!((w.status, w.status_detail.as_deref(), w.running), (WorkerStatus::Degraded, Some("claims failing: test"), 1));

    // A worker whose row is gone hears so, to register again.
    s.deregister_worker("w1").await.unwrap();
    assert!(!s.worker_beat(&beat).await.unwrap().registered);
}

/// A worker restarted under the same configured id (its predecessor killed mid-job) knows none
/// of the jobs its predecessor ran: they did start, so they are the rescuer's, which counts
/// the attempt, and never handed back uncounted by the new process's heartbeat or sweep. A job
/// that crashes its worker each time would otherwise run for ever, never charged.
#[tokio::test]
async fn a_process_reusing_a_crashed_predecessor_s_id_hands_back_none_of_its_jobs() {
    let db = TestDb::new().await;
    let s = &db.store;
    let predecessor = w1_holding(s, 2).await;
    sqlx::query("UPDATE jobs SET lock_expires_at = now() - interval '1 second' WHERE id = ANY($1)").bind(&predecessor).execute(s.pool()).await.unwrap();
    // The successor registers as w1, and its own claim's answer is lost.
    let registration = WorkerRegistration { id: "w1".into(), host: "h".into(), pid: 1, queues: vec!["default".into()], concurrency: 4, version: "t".into() };
    s.register_worker(&registration).await.unwrap();
    let own = s.enqueue(NewJob::new("t.beat", json!(["own"]))).await.unwrap().job.id;
    assert_eq!(s.claim(&claim_req("w1", 1, Duration::from_secs(60))).await.unwrap()[0].id, own);

    let beat = WorkerBeat { worker_id: "w1", held: &[], known: &[], running: 0, status: WorkerStatus::Ready, detail: None, usage: Default::default() };
    assert!(s.worker_beat(&beat).await.unwrap().released.is_empty(), "the predecessor's lapsed jobs are not this process's orphans");
    let swept: Vec<Uuid> = s.release_orphans("w1", &[]).await.unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(swept, vec![own], "only its own unknown claim is handed back");
    for id in &predecessor {
        assert_eq!(s.job(*id).await.unwrap().state, JobState::Active, "left for the rescuer");
    }
    let rescued = s.rescue_expired(10).await.unwrap();
    assert_eq!(rescued.stalled, 2, "{rescued:?}");
    for id in &predecessor {
        let history = s.attempts(*id).await.unwrap();
        assert_eq!(history.iter().map(|a| (a.attempt, a.outcome.as_str())).collect::<Vec<_>>(), vec![(1, "retried")], "the crashed run is counted");
    }
}

#[tokio::test]
async fn a_heartbeat_never_waits_for_a_held_job_whose_result_is_being_written() {
    let db = TestDb::new().await;
    let s = &db.store;
    let claimed = w1_holding(s, 2).await;
    let (writing, running) = (claimed[0], claimed[1]);
    let before = s.job(writing).await.unwrap().lock_expires_at.unwrap();

    // The worker's result write for one held job is in flight: its row is locked. A heartbeat
    // that waited for it could deadlock with a batch locking rows in another order.
    let mut write = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = write.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE").bind(writing).execute(&mut *tx).await.unwrap();
    let held = [writing, running];
    let beat = WorkerBeat { worker_id: "w1", held: &held, known: &held, running: 2, status: WorkerStatus::Ready, detail: None, usage: Default::default() };
    let report = tokio::time::timeout(Duration::from_secs(5), s.worker_beat(&beat))
        .await
        .expect("the heartbeat waited for a row another transaction holds")
        .unwrap();
    assert_eq!(report.extended, vec![running]);
    assert_eq!(report.busy, vec![writing], "still ours, not lost");
    assert!(report.registered);

    // The write lands (the job completes): the next heartbeat no longer reports it at all.
    sqlx::query("UPDATE jobs SET state = 'completed', completed_at = now(), lock_expires_at = NULL WHERE id = $1")
        .bind(writing)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let report = s.worker_beat(&beat).await.unwrap();
    assert_eq!((report.extended, report.busy), (vec![running], vec![]));

    // Had the write rolled back, the job would be extended again by the next heartbeat.
    let mut tx = write.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE").bind(running).execute(&mut *tx).await.unwrap();
    let only = [running];
    let beat = WorkerBeat { held: &only, known: &only, ..beat };
    let report = s.worker_beat(&beat).await.unwrap();
    assert_eq!((report.extended.len(), report.busy.clone()), (0, vec![running]));
    tx.rollback().await.unwrap();
    let report = s.worker_beat(&beat).await.unwrap();
    assert_eq!((report.extended, report.busy), (vec![running], vec![]));
    assert!(s.job(running).await.unwrap().lock_expires_at.unwrap() >= before);
}

#[tokio::test]
async fn an_ojs_heartbeat_never_waits_for_a_held_job_whose_result_is_being_written() {
    let db = TestDb::new().await;
    let s = &db.store;
    let claimed = w1_holding(s, 3).await;
    let (writing, running, done) = (claimed[0], claimed[1], claimed[2]);
    sqlx::query("UPDATE jobs SET state = 'completed', completed_at = now(), lock_expires_at = NULL WHERE id = $1").bind(done).execute(s.pool()).await.unwrap();
    let before = s.job(running).await.unwrap().lock_expires_at.unwrap();

    // An OJS worker acknowledges a job in a request of its own while it beats for all three.
    let mut write = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = write.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE").bind(writing).execute(&mut *tx).await.unwrap();
    let held = tokio::time::timeout(Duration::from_secs(5), s.heartbeat(None, &claimed, Some(Duration::from_secs(600))))
        .await
        .expect("the heartbeat waited for a row another transaction holds")
        .unwrap();
    assert_eq!((held.extended, held.busy), (vec![running], vec![writing]), "the finished job is neither");
    assert!(s.job(running).await.unwrap().lock_expires_at.unwrap() > before + jiff::SignedDuration::from_secs(500));
    tx.rollback().await.unwrap();
    let held = s.heartbeat(Some("w1"), &claimed, None).await.unwrap();
    let mut extended = held.extended.clone();
    extended.sort();
    let mut want = vec![writing, running];
    want.sort();
    assert_eq!((extended, held.busy), (want, vec![]), "once the write is gone the job is extended again");
}

#[tokio::test]
async fn a_retry_in_place_whose_answer_was_lost_is_written_not_refused() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    db.store.enqueue(NewJob::new("t.inplace", json!([]))).await.unwrap();
    let job = db.store.claim(&claim_req("w1", 1, Duration::from_secs(60))).await.unwrap().remove(0);
    let policy = std::sync::Arc::new(db.store.effective_policy("t.inplace", None).await.unwrap().policy);
    let now = jiff::Timestamp::now();
    let run = InPlaceRun {
        id: job.id,
        stored_attempt: 1,
        stored_started_at: job.started_at,
        worker_id: "w1".into(),
        retried: vec![RetriedInPlace { attempt: 1, error: HandlerError::new("app.flaky", "once"), policy, started_at: now, finished_at: now }],
        started_at: now,
        end: InPlaceEnd::Running,
    };
    proxy.inject(Fault::once("WITH input AS", FaultPoint::AfterCommit));
    assert!(through.record_in_place(&[&run]).await.is_err(), "the answer was lost");
    // The retry finds the job already at attempt 2 under our lock: written.
    assert_eq!(through.record_in_place(&[&run]).await.unwrap(), vec![job.id]);
    let stored = db.store.job(job.id).await.unwrap();
    assert_eq!((stored.state, stored.attempt), (JobState::Active, 2));
    assert_eq!(db.store.attempts(job.id).await.unwrap().len(), 1, "the failure is recorded once");
}

#[tokio::test]
async fn a_snooze_written_again_after_its_answer_was_lost_leaves_the_next_claim_alone() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let id = db.store.enqueue(NewJob::new("t.snooze", json!([]))).await.unwrap().job.id;
    let visibility = Duration::from_secs(60);
    let first = db.store.claim(&claim_req("w1", 1, visibility)).await.unwrap().remove(0);
    // A snooze with no wait (an upstream's `Retry-After: 0`): the job is available again at
    // once, at the attempt number it had before this run.
    let snooze = Failure {
        id,
        attempt: Some(first.attempt),
        worker_id: Some("w1".into()),
        outcome: Outcome::RetryAfter { at: jiff::Timestamp::now(), error: Some(HandlerError::new("upstream.busy", "429")) },
        error_code: None,
    };
    let known = |job: &rebound_queue::Job| KnownRun { job_type: job.job_type.clone(), retry: job.retry.clone(), started_at: job.started_at };
    proxy.inject(Fault::once("attempt = j.attempt + i.attempt_delta", FaultPoint::AfterCommit));
    assert!(through.fail_batch_known(&[(snooze.clone(), known(&first))]).await.is_err(), "the answer was lost");

    // Before the worker tries the write again, it claims the job again: the same attempt
    // number, under the same worker.
    let second = db.store.claim(&claim_req("w1", 1, visibility)).await.unwrap().remove(0);
    assert_eq!((second.id, second.attempt), (id, first.attempt));
    assert_ne!(second.started_at, first.started_at);

    // The first run's snooze, sent again, and its completion: both refused.
    assert_eq!(through.fail_batch_known(&[(snooze, known(&first))]).await.unwrap(), Vec::<Uuid>::new(), "the snooze is not applied twice");
    let stale = Completion { id, attempt: Some(first.attempt), worker_id: Some("w1".into()), started_at: first.started_at, result: None };
    assert!(through.complete_batch(&[stale]).await.unwrap().is_empty(), "nor does the first run's completion land on the second");
    let job = db.store.job(id).await.unwrap();
    assert_eq!((job.state, job.attempt, job.started_at), (JobState::Active, second.attempt, second.started_at), "the second run is untouched");
    let rows = db.store.attempts(id).await.unwrap();
    assert_eq!(rows.iter().filter(|a| a.outcome.as_str() == "snoozed").count(), 1, "one snoozed row: {rows:?}");

    // The second run's own result is written.
    let own = Completion { id, attempt: Some(second.attempt), worker_id: Some("w1".into()), started_at: second.started_at, result: None };
    assert_eq!(through.complete_batch(&[own]).await.unwrap(), vec![id]);
}

#[tokio::test]
async fn a_lost_progress_report_costs_only_itself() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    db.store.enqueue(NewJob::new("t.progress", json!([]))).await.unwrap();
    let job = db.store.claim(&claim_req("w1", 1, Duration::from_secs(60))).await.unwrap().remove(0);
    let report = |percentage: f64| ProgressReport {
        job_id: job.id,
        attempt: Some(job.attempt),
        worker_id: Some("w1".into()),
        percentage,
        message: Some(format!("{percentage}%")),
        data: None,
    };
    let fragment = "INSERT INTO job_progress";

    // Dropped before the server sees it: the caller hears of it, the report is missing, and
    // the job is as it was (a report never writes the job's row).
    let dropped = proxy.inject(Fault::once(fragment, FaultPoint::BeforeSend));
    assert!(through.report_progress(&report(10.0)).await.is_err());
    assert_eq!(dropped.count(), 1);
    assert_eq!(db.store.latest_progress(job.id).await.unwrap(), None);
    let after = db.store.job(job.id).await.unwrap();
    assert_eq!((after.state, after.attempt, after.locked_by.as_deref(), after.updated_at), (JobState::Active, job.attempt, Some("w1"), job.updated_at));

    // Committed with the answer lost: kept once (reports are not sent again); the next one
    // supersedes it.
    let lost = proxy.inject(Fault::once(fragment, FaultPoint::AfterCommit));
    assert!(through.report_progress(&report(40.0)).await.is_err());
    assert_eq!(lost.count(), 1);
    assert_eq!(db.store.latest_progress(job.id).await.unwrap().map(|p| p.percentage), Some(40.0));
    through.report_progress(&report(70.0)).await.unwrap();
    assert_eq!(db.store.latest_progress(job.id).await.unwrap().map(|p| p.percentage), Some(70.0));
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM job_progress WHERE job_id = $1").bind(job.id).fetch_one(db.store.pool()).await.unwrap();
    assert_eq!(kept, 2);
    // The job's own result is untouched by any of it.
    let done = Completion { id: job.id, attempt: Some(job.attempt), worker_id: Some("w1".into()), started_at: job.started_at, result: None };
    assert_eq!(through.complete_batch(&[done]).await.unwrap(), vec![job.id]);
}

#[tokio::test]
async fn after_a_restart_the_rescuer_gives_every_lock_one_visibility_timeout() {
    let cluster = PrivateCluster::start(&[]);
    {
        let mut admin = sqlx::PgConnection::connect(&cluster.url("postgres")).await.unwrap();
        sqlx::query("CREATE DATABASE rebound").execute(&mut admin).await.unwrap();
    }
    let store = Store::connect(&cluster.url("rebound"), 2).await.unwrap();
    store.migrate().await.unwrap();
    let mut job = NewJob::new("t.restart", json!([]));
    // Long enough that a loaded machine brings the database back well inside it.
    job.visibility_timeout_ms = Some(6_000);
    let job = store.enqueue(job).await.unwrap().job;
    // And one whose per-attempt timeout ran out while the database was down: its worker may
    // hold a result it made in time and could not write, and the restart is no more its fault
    // than the other's lapsed lock.
    let mut timed = NewJob::new("t.restart", json!([]));
    timed.visibility_timeout_ms = Some(6_000);
    timed.timeout_ms = Some(1_000);
    let timed = store.enqueue(timed).await.unwrap().job;
    assert_eq!(store.claim(&claim_req("w1", 2, Duration::from_secs(6))).await.unwrap().len(), 2);
    // Its lock lapsed while the database was down (nobody could have extended it).
    sqlx::query("UPDATE jobs SET lock_expires_at = now() - interval '1 second' WHERE id = $1").bind(job.id).execute(store.pool()).await.unwrap();
    sqlx::query("UPDATE jobs SET started_at = now() - interval '8 seconds' WHERE id = $1").bind(timed.id).execute(store.pool()).await.unwrap();
    cluster.pg_ctl(&["-m", "immediate", "restart"]);

    let rescued = async || {
        for _ in 0..50 {
            if let Ok(r) = store.rescue_expired(10).await {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the database did not come back");
    };
    let first = rescued().await;
    let since_start: f64 = sqlx::query_scalar("SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8")
        .fetch_one(store.pool())
        .await
        .unwrap();
    // A loaded machine can take most of the grace to reconnect; only a pass that ran inside
    // it can show that the grace held.
    if since_start < 5.0 {
        assert_eq!((first.stalled, first.timed_out), (0, 0), "just after the restart, the worker gets to extend the lock or deliver its result first");
    } else {
        eprintln!("reconnecting took {since_start:.1}s of the 6s grace: the first pass proves nothing");
    }
    // The grace runs from the server's start, not from when this test got through again.
    let left: f64 = sqlx::query_scalar("SELECT extract(epoch FROM pg_postmaster_start_time() + interval '6.1 s' - now())::float8")
        .fetch_one(store.pool())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs_f64(left.max(0.0))).await;
    let second = rescued().await;
    assert_eq!(first.stalled + second.stalled, 1, "one visibility timeout after the restart, the lock has lapsed");
    assert_eq!(first.timed_out + second.timed_out, 1, "and the timeout is charged");
    let after = store.job(job.id).await.unwrap();
    assert_eq!((after.state, after.attempt), (JobState::Available, 1));
    let after = store.job(timed.id).await.unwrap();
    assert_eq!((after.state, after.attempt), (JobState::Retryable, 1));
    assert_eq!(after.last_error.unwrap()["type"], "rebound.timeout");
}

#[tokio::test]
async fn a_listener_says_its_connection_was_lost_even_while_the_database_stays_away() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let store = Store::connect(&proxy.url(&db.name), 2).await.expect("connect through the proxy");
    let mut listener = store.listen().await.expect("listen");
    db.store.enqueue(NewJob::new("t", json!([])).queue("heard")).await.expect("enqueue");
    assert_eq!(listener.next(Duration::from_secs(5)).await.expect("next"), Some(rebound_queue::store::Notification::Jobs("heard".into())));
    // The connection drops and the database cannot be reached again (the proxy is gone, so a
    // reconnect waits out the pool's acquire timeout). The caller's short wait must still
    // hear of the loss: policies and jobs may change unheard from now on. A listener that
    // reconnected inside that wait was cut off by it and re-listened silently later.
    proxy.drop_connections();
    drop(proxy);
    // Short next to the pool's 10 s acquire timeout, long enough for a loaded machine.
    let heard = listener.next(Duration::from_secs(3)).await;
    assert!(matches!(heard, Ok(Some(rebound_queue::store::Notification::Reconnected))), "the loss was reported: {heard:?}");
}

#[tokio::test]
async fn a_bulk_action_waits_for_a_row_being_written_instead_of_leaving_it_out() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(s.enqueue(NewJob::new("t.bulk", json!([i])).queue("bulk")).await.expect("enqueue").job.id);
    }
    // Another transaction is writing one of them (a worker's result, a promotion) right now.
    let mut other = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut other).await.expect("begin");
    sqlx::query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE").bind(ids[1]).execute(&mut other).await.expect("lock");
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query("COMMIT").execute(&mut other).await.expect("commit");
    });
    let filter = rebound_queue::store::JobFilter { queue: Some("bulk".into()), ..Default::default() };
    let cancelled = s.cancel_jobs(&rebound_queue::store::JobSelection::Filter(filter), &rebound_queue::store::Actor::new("op")).await.expect("bulk cancel");
    release.await.expect("released");
    assert_eq!(cancelled, 3, "the row being written was waited for, not skipped");
    for id in ids {
        assert_eq!(s.job(id).await.expect("job").state, JobState::Cancelled);
    }
}

#[tokio::test]
async fn a_copied_batch_enqueue_is_all_or_nothing_wherever_its_connection_drops() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    // Big enough to go in more than one piece of COPY data (64 KiB each).
    let batch = || -> Vec<NewJob> {
        (0..1000)
            .map(|i| {
                let mut job = NewJob::new("t.copied", json!([{"i": i, "pad": "x".repeat(100)}]));
                job.id = Some(Uuid::now_v7());
                job
            })
            .collect()
    };
    let stored = || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs").fetch_one(db.store.pool()).await.unwrap() };
    let counted = || async { db.store.stats(None).await.unwrap().by_state(JobState::Available) };

    for (fragment, point) in [("COPY jobs", FaultPoint::BeforeSend), ("COPY jobs", FaultPoint::DuringCopy), ("COMMIT", FaultPoint::BeforeSend)] {
        let hit = proxy.inject(Fault::once(fragment, point));
        let err = through.enqueue_batch(batch()).await.unwrap_err();
        assert_eq!(hit.count(), 1, "{fragment} {point:?}");
        assert!(err.is_transient(), "{fragment} {point:?}: {err:?}");
        assert_eq!((stored().await, counted().await), (0, 0), "{fragment} {point:?}: nothing stored, nothing counted");
    }

    // Committed, its answer lost: every job is there, counted once, and the same batch sent
    // again is refused as a duplicate, not stored twice.
    let jobs = batch();
    let lost = proxy.inject(Fault::once("COMMIT", FaultPoint::AfterCommit));
    assert!(through.enqueue_batch(jobs.clone()).await.is_err());
    assert_eq!(lost.count(), 1);
    assert_eq!((stored().await, counted().await), (1000, 1000));
    let again = through.enqueue_batch(jobs.clone()).await.unwrap_err();
    assert!(matches!(&again, rebound_queue::store::StoreError::Duplicate { existing: Some(id), .. } if jobs.iter().any(|j| j.id == Some(*id))), "{again:?}");
    assert_eq!(stored().await, 1000);

    // The store goes on as before: no session was left in a transaction.
    assert_eq!(through.enqueue_batch(batch()).await.unwrap().len(), 1000);
    assert_eq!(idle_in_transaction(&db.store, &db.name, Duration::ZERO).await, 0);
}
