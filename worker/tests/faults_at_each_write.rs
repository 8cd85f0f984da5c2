//! Every statement by which the worker writes job state, broken at that exact statement: the
//! `rebound-worker` binary talks to Postgres through a proxy (`FaultProxy`) that drops the
//! connection as the statement is sent (the server never runs it) or right after its commit
//! (the server ran it, the worker never hears so). Each case runs a workload that goes through
//! that statement and asserts what the fault cost (see docs/faults.md): every job ends where
//! it should, no attempt is counted that did not run, nothing ran twice that should not, no
//! session was left idle inside a transaction, and the worker lived on.
//!
//! The visibility timeout is a minute (except where heartbeats are the subject), so nothing
//! here is resolved by the rescuer waiting it out: each fault is recovered from by the path
//! meant for it, within seconds.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use rebound_queue::policy::PolicyPatch;
use rebound_queue::store::{Actor, ClaimRequest, ORPHAN_REASON};
use rebound_queue::testing::{Fault, FaultPoint, FaultProxy, TestDb};
use rebound_queue::{JobState, NewJob};
use serde_json::{Value, json};
use support::{Recorder, IDLE_IN_TRANSACTION_LIMIT, TransactionWatch, WorkerProcess, eventually, fast_config};
use uuid::Uuid;

const CLAIM: &str = "SET state = 'active', attempt = j.attempt + 1";
const COMPLETE: &str = "SET state = 'completed', completed_at = now(), result = i.result";
const FAIL: &str = "attempt = j.attempt + i.attempt_delta";
const IN_PLACE: &str = "AS t(id, stored_attempt, new_attempt";
const RELEASE: &str = "j.id = ANY($1) AND ($2::text IS NULL OR j.locked_by = $2)";
const HEARTBEAT: &str = "WITH mine AS";
// The promotion's notify runs, in the promoting transaction, only when jobs were promoted:
// a fault there strikes a pass that did something (every pass runs the promoting UPDATE).
const PROMOTE: &str = "FROM unnest($1::text[]) AS q";
// A rescue writes its failures with the failure statement, inside the rescuing transaction,
// only when it found lapsed locks (the rescuer's SELECT runs every pass).
const RESCUE: &str = FAIL;
const REGISTER: &str = "INSERT INTO workers";

/// What a case runs, and so which statements it goes through.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Workload {
    /// Jobs that complete at once: claims, completions, registration.
    Plain,
    /// Jobs that fail once, retried after a backoff through the queue: failures, and claims
    /// that take the due retries as they are.
    FailOnceThroughQueue,
    /// The same under a rate-limit key (with room for all), whose retries are always
    /// promoted (their key admits them), never claimed as they are: promotions.
    FailOncePromoted,
    /// Jobs that fail once, retried at once in place, the retry slow enough to be written
    /// while it runs, and to be running still when that write's storage retry comes back.
    FailOnceInPlace,
    /// Long jobs cut short by a shutdown and handed back, then finished by a second worker.
    ShutdownRelease,
    /// Jobs longer than their visibility timeout, kept alive by heartbeats.
    SlowHeartbeats,
    /// A job held by a worker that vanished, rescued by the leader.
    Rescue,
}

struct Setup {
    db: TestDb,
    proxy: FaultProxy,
    recorder: Recorder,
    watch: TransactionWatch,
}

async fn setup() -> Setup {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let recorder = Recorder::start().await;
    let watch = TransactionWatch::start(&db.server_url(), &db.name);
    Setup { db, proxy, recorder, watch }
}

fn config(s: &Setup, workload: Workload) -> String {
    let worker = match workload {
        // Heartbeats at a sixth of the visibility timeout: a lost one, and the reconnection
        // after it, leave the lock more than two seconds to spare, so a stall on a loaded
        // machine does not hand a live job to the rescuer.
        Workload::SlowHeartbeats => "visibility_timeout = \"3s\"\nheartbeat_interval = \"500ms\"\nshutdown_grace = \"5s\"",
        Workload::ShutdownRelease => "visibility_timeout = \"60s\"\nshutdown_grace = \"300ms\"",
        _ => "visibility_timeout = \"60s\"",
    };
    fast_config(worker, "default = 8", &s.recorder.handler("fault.*"))
}

async fn policy(s: &Setup, job_type: &str, v: Value) {
    s.db.store.put_policy(job_type, &PolicyPatch::from_json(&v).unwrap(), &Actor::new("test"), None).await.unwrap();
}

async fn enqueue(s: &Setup, job_type: &str, n: usize, args: Value) -> Vec<Uuid> {
    let jobs = (0..n).map(|_| NewJob::new(job_type, json!([args.clone()]))).collect();
    s.db.store.enqueue_batch(jobs).await.unwrap().into_iter().map(|e| e.job.id).collect()
}

async fn settled(s: &Setup, ids: &[Uuid], state: JobState) {
    let what = format!("{} jobs to be {state:?}", ids.len());
    eventually(&what, Duration::from_secs(45), || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE id = ANY($1) AND state = $2::job_state")
            .bind(ids)
            .bind(state.as_str())
            .fetch_one(s.db.store.pool())
            .await
            .ok()?;
        (n == ids.len() as i64).then_some(())
    })
    .await;
}

/// Each job's executions as the handler saw them: attempt numbers in order.
fn executions(s: &Setup) -> HashMap<Uuid, Vec<i32>> {
    let mut by_job: HashMap<Uuid, Vec<i32>> = HashMap::new();
    for (id, attempt) in s.recorder.executions() {
        by_job.entry(id).or_default().push(attempt);
    }
    by_job
}

/// `(outcome, error_type, reason)` of every recorded attempt row of `id`, oldest first.
async fn attempt_rows(s: &Setup, id: Uuid) -> Vec<(String, Option<String>, Option<String>)> {
    s.db.store.attempts(id).await.unwrap().into_iter().filter(|a| a.outcome != "completed").map(|a| (a.outcome, a.error_type, a.error_message)).collect()
}

async fn run_case(statement: &str, point: FaultPoint, workload: Workload) {
    run_case_then(statement, point, workload, None).await;
}

/// [`run_case`], with a second fault armed behind the first: it strikes the first statement
/// containing `then.0` after the first fault did (or before, if such a statement comes first).
async fn run_case_then(statement: &str, point: FaultPoint, workload: Workload, then: Option<(&str, FaultPoint)>) {
    let s = setup().await;
    policy(&s, "fault.retry", json!({"max_attempts": 3, "initial_interval": "PT0.2S", "backoff_strategy": "constant", "jitter": false})).await;
    policy(&s, "fault.inplace", json!({"max_attempts": 3, "initial_interval": "PT0.0001S", "backoff_strategy": "constant", "jitter": false})).await;
    let cfg = config(&s, workload);
    let hits = s.proxy.inject(Fault::once(statement, point));
    let then_hits = then.map(|(statement, point)| s.proxy.inject(Fault::once(statement, point)));
    let url = s.proxy.url(&s.db.name);

    // The work is there before the worker starts, so its first claim (and first heartbeat)
    // carries jobs: a fault on an empty claim would cost nothing and prove nothing.
    let (ids, done_attempt, runs): (Vec<Uuid>, i32, Vec<i32>) = match workload {
        Workload::Plain => (enqueue(&s, "fault.ok", 20, json!({})).await, 1, vec![1]),
        Workload::FailOnceThroughQueue => (enqueue(&s, "fault.retry", 8, json!({"fail_attempts": 1})).await, 2, vec![1, 2]),
        Workload::FailOncePromoted => {
            let jobs = (0..8).map(|_| NewJob::new("fault.retry", json!([{"fail_attempts": 1}])).rate_limit("fault", Some(100))).collect();
            (s.db.store.enqueue_batch(jobs).await.unwrap().into_iter().map(|e| e.job.id).collect(), 2, vec![1, 2])
        }
        Workload::FailOnceInPlace => (enqueue(&s, "fault.inplace", 6, json!({"fail_attempts": 1, "sleep_ms": 600})).await, 2, vec![1, 2]),
        Workload::SlowHeartbeats => (enqueue(&s, "fault.ok", 4, json!({"sleep_ms": 4500})).await, 1, vec![1]),
        // Handed back uncounted at shutdown, then run again as the same attempt.
        Workload::ShutdownRelease => (enqueue(&s, "fault.ok", 4, json!({"sleep_ms": 2000})).await, 1, vec![1, 1]),
        Workload::Rescue => {
            // A worker that claimed a job and vanished: its lock lapses in a second. The
            // vanished execution never reached the handler; the rescue counts it all the same.
            let ids = enqueue(&s, "fault.ok", 1, json!({})).await;
            let claim = ClaimRequest { worker_id: "ghost".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: Duration::from_secs(1) };
            assert_eq!(s.db.store.claim(&claim).await.unwrap().len(), 1);
            (ids, 2, vec![2])
        }
    };
    let mut worker = WorkerProcess::start(&url, &cfg, &["--worker-id", "faulty"]);

    if workload == Workload::ShutdownRelease {
        eventually("every job to be running", Duration::from_secs(30), || async { (s.recorder.executions().len() >= ids.len()).then_some(()) }).await;
        worker.signal("TERM");
        let status = worker.exit_within(Duration::from_secs(30)).await.expect("exits after SIGTERM");
        assert_eq!(status.code(), Some(0), "{}", worker.log_text());
        assert_eq!(hits.count(), 1, "the fault struck the release");
        // A second worker, straight to the database, finishes what was handed back.
        worker = WorkerProcess::start(&s.db.url, &cfg, &["--worker-id", "second"]);
    }
    settled(&s, &ids, JobState::Completed).await;
    assert_eq!(hits.count(), 1, "the fault struck exactly once:\n{}", worker.log_text());
    if let Some(then_hits) = &then_hits {
        assert_eq!(then_hits.count(), 1, "the second fault struck exactly once:\n{}", worker.log_text());
    }
    assert!(worker.running(), "the worker died:\n{}", worker.log_text());

    let ran = executions(&s);
    let mut orphans_handed_back = 0;
    for id in &ids {
        let job = s.db.store.job(*id).await.unwrap();
        assert_eq!(job.attempt, done_attempt, "job {id}'s attempts:\n{:?}", attempt_rows(&s, *id).await);
        assert_eq!(ran.get(id).cloned().unwrap_or_default(), runs, "job {id} ran as expected");
        let mut handed_back = 0;
        for (outcome, error_type, reason) in attempt_rows(&s, *id).await {
            match (outcome.as_str(), error_type.as_deref()) {
                ("retried", Some("http.5xx")) => assert!(runs.len() > 1 && workload != Workload::ShutdownRelease),
                ("released", None) if reason.as_deref() == Some(ORPHAN_REASON) => {
                    handed_back += 1;
                    orphans_handed_back += 1;
                    assert_eq!(handed_back, 1, "job {id} was handed back twice");
                }
                ("released", None) => assert_eq!(workload, Workload::ShutdownRelease),
                ("retried", Some("rebound.stalled")) => assert_eq!(workload, Workload::Rescue),
                other => panic!("job {id}: unexpected attempt {other:?}"),
            }
        }
    }
    if workload == Workload::Rescue {
        let id = ids[0];
        let stalled = attempt_rows(&s, id).await.into_iter().filter(|(_, t, _)| t.as_deref() == Some("rebound.stalled")).count();
        assert_eq!(stalled, 1, "the ghost's attempt is counted once");
    }
    // Only a claim whose answer was lost leaves orphans, and then they were handed back.
    let lost_claim = statement == CLAIM && point == FaultPoint::AfterCommit;
    assert_eq!(orphans_handed_back > 0, lost_claim, "orphans handed back: {orphans_handed_back}\n{}", worker.log_text());

    assert!(s.watch.worst() < IDLE_IN_TRANSACTION_LIMIT, "a session sat idle in a transaction for {:?}", s.watch.worst());
    worker.signal("TERM");
    let status = worker.exit_within(Duration::from_secs(30)).await.expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", worker.log_text());
}

macro_rules! cases {
    ($($name:ident: $statement:expr, $point:expr, $workload:expr;)*) => {
        $(
            #[tokio::test]
            async fn $name() {
                run_case($statement, $point, $workload).await;
            }
        )*
    };
}

use FaultPoint::{AfterCommit, BeforeSend};
use Workload::*;

cases! {
    claim_lost_before_it_ran: CLAIM, BeforeSend, Plain;
    claim_committed_answer_lost: CLAIM, AfterCommit, Plain;
    completion_lost_before_it_ran: COMPLETE, BeforeSend, Plain;
    completion_committed_answer_lost: COMPLETE, AfterCommit, Plain;
    registration_lost_before_it_ran: REGISTER, BeforeSend, Plain;
    registration_committed_answer_lost: REGISTER, AfterCommit, Plain;
    failure_lost_before_it_ran: FAIL, BeforeSend, FailOnceThroughQueue;
    failure_committed_answer_lost: FAIL, AfterCommit, FailOnceThroughQueue;
    promotion_lost_before_it_ran: PROMOTE, BeforeSend, FailOncePromoted;
    promotion_committed_answer_lost: PROMOTE, AfterCommit, FailOncePromoted;
    retry_in_place_lost_before_it_ran: IN_PLACE, BeforeSend, FailOnceInPlace;
    retry_in_place_committed_answer_lost: IN_PLACE, AfterCommit, FailOnceInPlace;
    heartbeat_lost_before_it_ran: HEARTBEAT, BeforeSend, SlowHeartbeats;
    heartbeat_committed_answer_lost: HEARTBEAT, AfterCommit, SlowHeartbeats;
    release_lost_before_it_ran: RELEASE, BeforeSend, ShutdownRelease;
    release_committed_answer_lost: RELEASE, AfterCommit, ShutdownRelease;
    rescue_lost_before_it_ran: RESCUE, BeforeSend, Rescue;
    rescue_committed_answer_lost: RESCUE, AfterCommit, Rescue;
}

// The sweep that hands back a lost claim's jobs, itself cut: tried again, it hands each back
// once (and the worker lives on).
const SWEEP: &str = "j.locked_by = $2 AND NOT (j.id = ANY($1))";

#[tokio::test]
async fn orphan_sweep_lost_before_it_ran() {
    run_case_then(CLAIM, AfterCommit, Plain, Some((SWEEP, BeforeSend))).await;
}

#[tokio::test]
async fn orphan_sweep_committed_answer_lost() {
    run_case_then(CLAIM, AfterCommit, Plain, Some((SWEEP, AfterCommit))).await;
}

/// A heartbeat decides what it knows, then waits for its connection (the database is away)
/// while the world moves on. Nothing claimed meanwhile may be taken for an orphan when the
/// statement finally runs: a job claimed, run and not yet written would be handed back to run
/// again. So no claim lands between a heartbeat's snapshot and its answer.
#[tokio::test]
async fn a_heartbeat_that_waits_for_its_connection_hands_back_nothing_that_ran() {
    let s = setup().await;
    let cfg = fast_config("visibility_timeout = \"1s\"", "default = 4", &s.recorder.handler("fault.*"));
    let mut worker = WorkerProcess::start(&s.proxy.url(&s.db.name), &cfg, &["--worker-id", "held"]);
    eventually("the worker to register", Duration::from_secs(30), || async {
        s.db.store.workers().await.ok().filter(|w| !w.is_empty()).map(|_| ())
    })
    .await;
    // The next heartbeat reaches the server 2.5 s after it was decided: longer than the
    // visibility timeout of any job claimed in between.
    let held = s.proxy.inject(Fault::once(HEARTBEAT, FaultPoint::HoldRequest(Duration::from_millis(2_500))));
    eventually("a heartbeat to be held", Duration::from_secs(10), || async { (held.count() == 1).then_some(()) }).await;
    let ids = enqueue(&s, "fault.ok", 4, json!({"sleep_ms": 1500})).await;
    settled(&s, &ids, JobState::Completed).await;
    let ran = executions(&s);
    for id in &ids {
        assert_eq!(ran.get(id).cloned().unwrap_or_default(), vec![1], "job {id} ran once:\n{}", worker.log_text());
        assert!(attempt_rows(&s, *id).await.is_empty(), "job {id}: {:?}", attempt_rows(&s, *id).await);
    }
    worker.signal("TERM");
    assert_eq!(worker.exit_within(Duration::from_secs(30)).await.and_then(|s| s.code()), Some(0));
}

/// A claim in flight whose answer is held back longer than the grace the worker gives it when
/// it receives `signal`: the claim committed, so jobs sit `active` under the worker's name that
/// it never received. Returns the worker once they are back, uncounted, with a `released` row.
async fn held_claim_handed_back_on(s: &Setup, signal: &str) -> WorkerProcess {
    let cfg = config(s, Plain);
    let ids = enqueue(s, "fault.ok", 5, json!({})).await;
    let hits = s.proxy.inject(Fault::once(CLAIM, FaultPoint::Delay(Duration::from_secs(12))));
    let worker = WorkerProcess::start(&s.proxy.url(&s.db.name), &cfg, &["--worker-id", "stuck"]);
    eventually("the first claim to be held", Duration::from_secs(30), || async { (hits.count() == 1).then_some(()) }).await;
    // The claim ran: its jobs are active under our name, its answer still on the way.
    settled(s, &ids, JobState::Active).await;
    worker.signal(signal);
    // Well within the 60 s visibility timeout: not the heartbeat's path at lock lapse.
    settled(s, &ids, JobState::Available).await;
    assert!(s.recorder.executions().is_empty(), "nothing ran");
    for id in &ids {
        let job = s.db.store.job(*id).await.unwrap();
        assert_eq!((job.attempt, job.locked_by.as_deref()), (0, None), "job {id}:\n{}", worker.log_text());
        let rows = attempt_rows(s, *id).await;
        assert_eq!(rows.len(), 1, "job {id}: {rows:?}");
        assert_eq!((rows[0].0.as_str(), rows[0].2.as_deref()), ("released", Some(ORPHAN_REASON)), "job {id}");
    }
    worker
}

/// Shutdown begins while a claim is in flight and its answer outlasts the grace. Dropping that
/// answer must not leave the jobs to the rescuer, which would charge each an attempt that never
/// ran: the final sweep hands them back, uncounted, before the worker exits.
#[tokio::test]
async fn a_claim_whose_answer_outlasts_the_shutdown_grace_leaves_nothing_held() {
    let s = setup().await;
    let mut worker = held_claim_handed_back_on(&s, "TERM").await;
    let status = worker.exit_within(Duration::from_secs(30)).await.expect("exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", worker.log_text());
}

/// The same when the worker is made quiet instead: its claim loops end, and with them the sweep
/// a next claim would have run first. The jobs must still be handed back at once, not left
/// until their lock lapses, when the heartbeat and the rescuer race for them and the rescuer
/// charges an attempt that never ran.
#[tokio::test]
async fn a_claim_whose_answer_outlasts_the_grace_when_quieted_leaves_nothing_held() {
    let s = setup().await;
    let mut worker = held_claim_handed_back_on(&s, "TSTP").await;
    assert!(worker.exit_within(Duration::from_millis(100)).await.is_none(), "a quiet worker stays up");
    worker.signal("TERM");
    assert_eq!(worker.exit_within(Duration::from_secs(30)).await.and_then(|s| s.code()), Some(0));
}
