//! What the worker gives up on, and what that costs a job (see docs/faults.md), with the
//! runtime used as a library against a real Postgres:
//!
//! * a result the database refuses for good (not a transient error, here a trigger that
//!   raises): its batch is split so the other results are written, the job is let go but not
//!   handed back uncounted, its lock lapses and the rescuer counts the attempt, while the worker
//!   goes on with other jobs;
//! * a maintenance pass that overruns its stop grace (`maintenance::STOP_GRACE`): the stop
//!   waits that long for it, then abandons it, and Postgres rolls back what it had begun
//!   (its transaction's connection is closed, not returned to the pool);
//! * a database down through the worker's whole stop: the worker exits after its final flush
//!   with its jobs still `active` under its id, and once the database is back the rescuer
//!   charges them (`rebound.stalled`, counted) and they run again.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rebound_queue::cron_schedule::CronSchedule;
use rebound_queue::store::{Actor, CLIENT_CHECK_INTERVAL, CronSpec, CronTemplate, OverlapPolicy};
use rebound_queue::testing::{PrivateCluster, TestDb};
use rebound_queue::{JobState, NewJob, Store};
use rebound_worker::maintenance::STOP_GRACE;
use rebound_worker::{JobContext, MaintenanceSettings, Worker, WorkerBuilder, handler_fn};
use serde_json::json;
use sqlx::Connection;
use support::{admin, IDLE_IN_TRANSACTION_LIMIT, TransactionWatch, eventually};
use tokio::sync::{Barrier, Semaphore};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Every execution the handlers saw, as (job id, attempt), in the order they started.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<(Uuid, i32)>>>);

impl Runs {
    fn record(&self, job: &JobContext) {
        self.0.lock().unwrap().push((job.id(), job.attempt()));
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The attempt numbers `id` ran as, in order.
    fn of(&self, id: Uuid) -> Vec<i32> {
        self.0.lock().unwrap().iter().filter(|(j, _)| *j == id).map(|(_, a)| *a).collect()
    }
}

async fn wait_state(store: &Store, id: Uuid, state: JobState) -> rebound_queue::Job {
    eventually(&format!("job {id} to be {state}"), Duration::from_secs(30), || async move {
        store.job(id).await.ok().filter(|j| j.state == state)
    })
    .await
}

/// A leader that takes over, rescues and promotes within a fraction of a second.
fn quick_maintenance() -> MaintenanceSettings {
    MaintenanceSettings {
        leader_retry: Duration::from_millis(100),
        leader_check: Duration::from_millis(200),
        scheduler_interval: Duration::from_millis(50),
        rescuer_interval: Duration::from_millis(300),
        pruner: None,
        ..MaintenanceSettings::default()
    }
}

/// `(attempt, outcome, error_type)` of each execution of `id`, the completing one included.
async fn history(store: &Store, id: Uuid) -> Vec<(i32, String, Option<String>)> {
    store.attempts(id).await.unwrap().into_iter().map(|a| (a.attempt, a.outcome, a.error_type)).collect()
}

// ---------------------------------------------------------------------------------------------
// A result refused for good.

// The refusal: the first completion of a `refused.poison` job raises (SQLSTATE P0001, which
// is not transient), every time it is tried. Each refusal bumps a sequence, which a rolled
// back statement does not undo, so the test can count them.
const REFUSALS: &str = "CREATE SEQUENCE test_refusals";
const REFUSE: &str = r#"CREATE FUNCTION test_refuse_first_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'completed' AND OLD.state = 'active' AND OLD.attempt = 1 AND NEW.type = 'refused.poison' THEN
        PERFORM nextval('test_refusals');
        RAISE EXCEPTION 'the test refuses the result of job % for good', NEW.id;
    END IF;
    RETURN NEW;
END
$$"#;
const REFUSING: &str =
    "CREATE TRIGGER test_refuse_first_completion BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION test_refuse_first_completion()";

async fn refusals(store: &Store) -> i64 {
    sqlx::query_scalar("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM test_refusals").fetch_one(store.pool()).await.unwrap()
}

/// The database refuses one result of a batch for good. The completer writes the batch's
/// results one by one to isolate it: the others are written, the refused one is given up.
/// Its job is no longer held (no heartbeat extends it) but still known, so the heartbeat,
/// which hands back lapsed jobs of this worker that it does not know, leaves it alone: it is
/// never handed back uncounted. Its lock lapses and the rescuer counts the attempt (it ran);
/// it runs again. Meanwhile the worker works other jobs.
#[tokio::test]
async fn a_result_refused_for_good_is_given_up_alone_and_its_attempt_is_counted_by_the_rescuer() {
    let db = TestDb::new().await;
    for sql in [REFUSALS, REFUSE, REFUSING] {
        sqlx::query(sql).execute(db.store.pool()).await.expect("install the refusing trigger");
    }
    let watch = TransactionWatch::start(&db.server_url(), &db.name);
    let runs = Runs::default();
    // The first four jobs finish together, so their results are written as one batch.
    let together = Arc::new(Barrier::new(4));
    let handler = {
        let (runs, together) = (runs.clone(), together.clone());
        handler_fn(move |job| {
            runs.record(&job);
            let together = together.clone();
            async move {
                if job.attempt() == 1 && job.arg(0).and_then(|a| a["together"].as_bool()) == Some(true) {
                    together.wait().await;
                }
                Ok(None)
            }
        })
    };
    let worker = Worker::builder(Store::connect(&db.url, 30).await.unwrap())
        .queue("default", 8)
        .handler("refused.*", handler)
        .configure(|s| {
            s.poll_interval = Duration::from_millis(100);
            s.visibility_timeout = Duration::from_secs(1);
            // Heartbeats far more often than rescues: were the refused job handed back as an
            // unknown job of this worker once its lock lapsed, a heartbeat would do it first.
            s.heartbeat_interval = Duration::from_millis(100);
            // Results that arrive together wait for each other: one batch.
            s.completer.flush_interval = Duration::from_millis(300);
            s.maintenance = Some(quick_maintenance());
        })
        .build()
        .unwrap();
    let me = worker.id().to_string();
    let first: Vec<NewJob> = std::iter::once("refused.poison")
        .chain(std::iter::repeat_n("refused.plain", 3))
        .map(|t| NewJob::new(t, json!([{"together": true}])))
        .collect();
    let enqueued = db.store.enqueue_batch(first).await.unwrap();
    let poison = enqueued.iter().find(|e| e.job.job_type == "refused.poison").map(|e| e.job.id).unwrap();
    let mates: Vec<Uuid> = enqueued.iter().filter(|e| e.job.id != poison).map(|e| e.job.id).collect();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));

    // Its batchmates are written, though the batch they came in was refused.
    for id in &mates {
        let job = wait_state(&db.store, *id, JobState::Completed).await;
        assert_eq!(job.attempt, 1, "batchmate {id}");
    }
    eventually("the poisoned result to be refused", Duration::from_secs(30), || async { (refusals(&db.store).await > 0).then_some(()) }).await;

    // The worker goes on working while the refused job waits for its lock to lapse.
    let later: Vec<NewJob> = (0..5).map(|_| NewJob::new("refused.plain", json!([{"together": false}]))).collect();
    let later: Vec<Uuid> = db.store.enqueue_batch(later).await.unwrap().into_iter().map(|e| e.job.id).collect();
    for id in &later {
        wait_state(&db.store, *id, JobState::Completed).await;
    }

    // The rescuer charged the refused execution, and the job ran again (its second
    // completion is not refused).
    let done = wait_state(&db.store, poison, JobState::Completed).await;
    assert_eq!(done.attempt, 2, "the refused execution was counted");
    assert_eq!(
        history(&db.store, poison).await,
        vec![(1, "retried".to_string(), Some("rebound.stalled".to_string())), (2, "completed".to_string(), None)],
        "one stalled attempt (no `released` row: never handed back uncounted), then the completion"
    );
    let stalled = db.store.attempts(poison).await.unwrap().into_iter().next().unwrap();
    assert_eq!(stalled.worker_id.as_deref(), Some(me.as_str()), "charged to the worker it ran on");
    assert_eq!(runs.of(poison), vec![1, 2]);
    // Refused twice: with its batch, then alone; never after it was given up.
    assert_eq!(refusals(&db.store).await, 2, "the batch was split to isolate the refused result");
    for id in mates.iter().chain(&later) {
        assert_eq!(history(&db.store, *id).await, vec![(1, "completed".to_string(), None)], "job {id}");
        assert_eq!(runs.of(*id), vec![1], "job {id} ran once");
    }
    let released: i64 = sqlx::query_scalar("SELECT count(*) FROM job_attempts WHERE outcome = 'released'").fetch_one(db.store.pool()).await.unwrap();
    assert_eq!(released, 0, "nothing was handed back uncounted");

    shutdown.cancel();
    let report = run.await.unwrap();
    // The given-up result is neither written nor refused as stale.
    assert_eq!(
        (report.claimed, report.results.completed, report.results.refused, report.results.unwritten),
        (10, 9, 0, 0),
        "{report:?}"
    );
    assert!(watch.worst() < IDLE_IN_TRANSACTION_LIMIT, "a session sat idle in a transaction for {:?}", watch.worst());
}

// ---------------------------------------------------------------------------------------------
// A maintenance pass abandoned after its stop grace.

/// A tick of `0 0 1 1 *` in the past, so the cron job is due and the test knows which tick
/// the pass takes.
const TICK: &str = "2025-01-01T00:00:00Z";

/// The leader's cron pass takes a due tick (moves the cron job's `next_run_at` on) and then
/// waits: the test holds, in an open transaction of its own, the `cron_runs` row that the pass
/// inserts next. The worker is told to stop. The pass is given `STOP_GRACE` to finish, not
/// cut off at once; past it, the stop goes on without it. Nothing it began is committed: its
/// session is not left idle in a transaction, it ends once the row it waited for is free
/// (the connection was closed, so Postgres rolls back), and the tick it had taken is still
/// due and fires when a pass runs again.
#[tokio::test]
async fn a_maintenance_pass_past_its_stop_grace_is_abandoned_and_rolled_back() {
    let db = TestDb::new().await;
    let spec = CronSpec {
        name: "yearly".into(),
        schedule: CronSchedule::new("0 0 1 1 *", "UTC").expect("schedule"),
        template: CronTemplate::from_job(&NewJob::new("cron.yearly", json!([])), json!({})),
        overlap_policy: OverlapPolicy::Allow,
        enabled: true,
        description: None,
    };
    db.store.register_cron(&spec, &Actor::new("test")).await.expect("register");
    sqlx::query("UPDATE cron_jobs SET next_run_at = $1::timestamptz WHERE name = 'yearly'").bind(TICK).execute(db.store.pool()).await.unwrap();

    // The test's transaction: the row the pass will insert, uncommitted.
    let mut blocker = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query("SET idle_in_transaction_session_timeout = 0").execute(&mut blocker).await.unwrap();
    let blocker_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut blocker).await.unwrap();
    let mut held = blocker.begin().await.unwrap();
    sqlx::query("INSERT INTO cron_runs (cron_name, scheduled_for, outcome) VALUES ('yearly', $1::timestamptz, 'deciding')")
        .bind(TICK)
        .execute(&mut *held)
        .await
        .unwrap();

    // The worker's own pool, kept open to the end: a connection returned to it inside the
    // abandoned transaction would stay there, in the transaction.
    let worker_store = Store::connect(&db.url, 20).await.unwrap();
    let worker = Worker::builder(worker_store.clone())
        .queue("default", 1)
        .handler("stop.noop", handler_fn(|_| async { Ok(None) }))
        .configure(|s| {
            s.poll_interval = Duration::from_millis(100);
            s.maintenance = Some(quick_maintenance());
        })
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));

    // The pass has taken the tick (its UPDATE of cron_jobs holds that table's row-exclusive
    // lock in its transaction) and waits for the test's row.
    let pass_pid: i32 = eventually("the cron pass to take the tick and wait on the test's row", Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT a.pid FROM pg_stat_activity a
             WHERE a.datname = current_database() AND a.pid <> $1 AND a.wait_event_type = 'Lock' AND a.query LIKE '%cron_runs%'
               AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.relation = 'cron_jobs'::regclass
                           AND l.mode = 'RowExclusiveLock' AND l.granted)",
        )
        .bind(blocker_pid)
        .fetch_optional(db.store.pool())
        .await
        .ok()
        .flatten()
    })
    .await;

    let stopping = Instant::now();
    shutdown.cancel();
    let report = tokio::time::timeout(STOP_GRACE + Duration::from_secs(30), run).await.expect("the stop ends").expect("no panic");
    let took = stopping.elapsed();
    assert!(!report.grace_expired);
    assert!(took >= STOP_GRACE.saturating_sub(Duration::from_millis(100)), "the pass under way was given its grace: the stop took {took:?}");
    assert!(took < STOP_GRACE + Duration::from_secs(8), "the pass was abandoned after its grace: the stop took {took:?}");

    // The test's transaction is still open, so the pass never finished: it was abandoned.
    // No session of the worker sits idle inside a transaction.
    let idle: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> $1 AND state LIKE 'idle in transaction%'",
    )
    .bind(blocker_pid)
    .fetch_all(db.store.pool())
    .await
    .unwrap();
    assert!(idle.is_empty(), "sessions idle in a transaction after the stop: {idle:?}");

    // The abandoned statement still waits for the test's row, but its session ends with its
    // client (`client_connection_check_interval`), releasing what it took, rather than wait
    // on holding the tick's row until the row it wants is free.
    eventually("the abandoned pass's session to end while it waits", CLIENT_CHECK_INTERVAL + Duration::from_secs(5), || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1").bind(pass_pid).fetch_one(db.store.pool()).await.ok()?;
        (n == 0).then_some(())
    })
    .await;
    held.rollback().await.unwrap();
    let idle: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(idle, 0, "no session is left inside a transaction");

    // Nothing the pass began was committed: the tick is still due, undecided, and no job.
    let (due, run_count, last_outcome): (bool, i64, Option<String>) =
        sqlx::query_as("SELECT next_run_at = $1::timestamptz, run_count, last_outcome FROM cron_jobs WHERE name = 'yearly'")
            .bind(TICK)
            .fetch_one(db.store.pool())
            .await
            .unwrap();
    assert!(due, "the tick the abandoned pass took was given back");
    assert_eq!((run_count, last_outcome), (0, None));
    let decided: i64 = sqlx::query_scalar("SELECT count(*) FROM cron_runs WHERE cron_name = 'yearly'").fetch_one(db.store.pool()).await.unwrap();
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE type = 'cron.yearly'").fetch_one(db.store.pool()).await.unwrap();
    assert_eq!((decided, jobs), (0, 0));

    // And nothing of it is left in the way: the next pass fires the tick, once.
    let pass = db.store.fire_due_crons(10).await.expect("a cron pass");
    assert_eq!(pass.fired, 1, "{pass:?}");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE type = 'cron.yearly'").fetch_one(db.store.pool()).await.unwrap();
    assert_eq!(jobs, 1);
    drop(worker_store);
}

// ---------------------------------------------------------------------------------------------
// A database down through the whole stop.

const GRACE: Duration = Duration::from_secs(1);
const FLUSH: Duration = Duration::from_secs(1);

/// A worker of two job types. At attempt 1, `down.finishes` runs until the test opens `gate`
/// and `down.outlasts` never ends; at later attempts both complete at once.
fn down_worker(store: Store, runs: &Runs, gate: &Arc<Semaphore>) -> WorkerBuilder {
    let (finishing, outlasting, gate) = (runs.clone(), runs.clone(), gate.clone());
    Worker::builder(store)
        // As many slots as jobs: no claim is in flight when the stop begins.
        .queue("default", 2)
        .handler(
            "down.finishes",
            handler_fn(move |job| {
                finishing.record(&job);
                let gate = gate.clone();
                async move {
                    if job.attempt() == 1 {
                        let _ = gate.acquire().await;
                    }
                    Ok(None)
                }
            }),
        )
        .handler(
            "down.outlasts",
            handler_fn(move |job| {
                outlasting.record(&job);
                async move {
                    if job.attempt() == 1 {
                        std::future::pending::<()>().await;
                    }
                    Ok(None)
                }
            }),
        )
        .configure(|s| {
            s.poll_interval = Duration::from_millis(100);
            s.visibility_timeout = Duration::from_secs(1);
        })
}

/// Two jobs run; the database stops; the worker is told to stop. One job finishes within
/// the shutdown grace (its completion is buffered), the other is cut short at its end (its
/// release is buffered). Neither can be written, so after the final flush the worker gives
/// up on both and exits, leaving both `active` under its id with nothing recorded. When the
/// database is back, another worker's rescuer charges each its lost execution
/// (`rebound.stalled`, counted: it may have run, and here it did), and both run again.
#[tokio::test]
async fn a_database_down_through_the_whole_stop_leaves_the_jobs_to_the_rescuer_which_counts_them() {
    let cluster = PrivateCluster::start(&[]);
    sqlx::query("CREATE DATABASE rebound").execute(&mut admin(&cluster).await).await.unwrap();
    let url = cluster.url("rebound");
    let store = Store::connect(&url, 4).await.unwrap();
    store.migrate().await.unwrap();

    let runs = Runs::default();
    let gate = Arc::new(Semaphore::new(0));
    let first = down_worker(Store::connect(&url, 20).await.unwrap(), &runs, &gate)
        .configure(|s| {
            s.worker_id = Some("stopping".into());
            s.shutdown_grace = GRACE;
            s.completer.final_flush_timeout = FLUSH;
            // No maintenance here: a pass caught by the stop would add its own grace to it.
            // The rescue is another process's (the second worker's) job.
            s.maintenance = None;
        })
        .build()
        .unwrap();
    let finishes = store.enqueue(NewJob::new("down.finishes", json!([]))).await.unwrap().job.id;
    let outlasts = store.enqueue(NewJob::new("down.outlasts", json!([]))).await.unwrap().job.id;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(first.run(shutdown.clone()));
    eventually("both jobs to be running", Duration::from_secs(30), || {
        let n = runs.count();
        async move { (n == 2).then_some(()) }
    })
    .await;
    for id in [finishes, outlasts] {
        let job = store.job(id).await.unwrap();
        assert_eq!((job.state, job.locked_by.as_deref()), (JobState::Active, Some("stopping")), "job {id}");
    }

    cluster.pg_ctl(&["-m", "immediate", "stop"]);
    let stopping = Instant::now();
    shutdown.cancel();
    gate.add_permits(1);
    let report = tokio::time::timeout(Duration::from_secs(60), run).await.expect("the worker exits with the database down").expect("no panic");
    let took = stopping.elapsed();
    assert!(report.grace_expired, "the long job was cut short: {report:?}");
    assert_eq!(
        (report.claimed, report.results.completed, report.results.released, report.results.unwritten),
        (2, 0, 0, 2),
        "a completion and a release given up: {report:?}"
    );
    // It waited out the grace and the final flush, and no longer: the rest of the stop is
    // bounded too (the last heartbeat 2 s, deregistering 5 s).
    assert!(took >= GRACE + FLUSH, "the stop took {took:?}");
    assert!(took < GRACE + FLUSH + Duration::from_secs(12), "the stop took {took:?}");

    cluster.pg_ctl(&["start"]);
    let store = Store::connect(&url, 4).await.unwrap();
    // The worker exited with both jobs held under its id, and recorded nothing.
    for id in [finishes, outlasts] {
        let job = store.job(id).await.unwrap();
        assert_eq!((job.state, job.attempt, job.locked_by.as_deref()), (JobState::Active, 1, Some("stopping")), "job {id}");
        assert!(history(&store, id).await.is_empty(), "job {id}: {:?}", history(&store, id).await);
    }

    let second = down_worker(Store::connect(&url, 20).await.unwrap(), &runs, &gate)
        .configure(|s| {
            s.worker_id = Some("rescuing".into());
            s.maintenance = Some(quick_maintenance());
        })
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(second.run(shutdown.clone()));
    for id in [finishes, outlasts] {
        let job = wait_state(&store, id, JobState::Completed).await;
        assert_eq!(job.attempt, 2, "job {id}: the lost execution was counted");
        assert_eq!(
            history(&store, id).await,
            vec![(1, "retried".to_string(), Some("rebound.stalled".to_string())), (2, "completed".to_string(), None)],
            "job {id}"
        );
        let charged = store.attempts(id).await.unwrap().into_iter().next().unwrap();
        assert_eq!(charged.worker_id.as_deref(), Some("stopping"), "job {id}: charged to the worker that held it");
        assert_eq!(runs.of(id), vec![1, 2], "job {id}");
    }
    shutdown.cancel();
    run.await.unwrap();
}
