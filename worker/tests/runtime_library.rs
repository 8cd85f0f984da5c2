//! The runtime used as a library (as the benchmark and custom-handler users do): handler
//! panics, per-attempt timeouts, snoozes, unknown types, paused queues, and results written in
//! overlapping batches.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rebound_queue::store::Actor;
use rebound_queue::testing::TestDb;
use rebound_queue::{HandlerError, JobState, NewJob, Outcome, PolicyPatch, Store};
use rebound_worker::{MaintenanceSettings, Worker, handler_fn};
use serde_json::json;
use support::eventually;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

async fn wait_state(store: &Store, id: Uuid, state: JobState) -> rebound_queue::Job {
    eventually(&format!("job {id} to be {state}"), Duration::from_secs(60), || async move {
        store.job(id).await.ok().filter(|j| j.state == state)
    })
    .await
}

fn quick(builder: rebound_worker::WorkerBuilder) -> rebound_worker::WorkerBuilder {
    builder.configure(|s| {
        s.poll_interval = Duration::from_millis(100);
        s.shutdown_grace = Duration::from_secs(5);
        s.maintenance = Some(MaintenanceSettings {
            leader_retry: Duration::from_millis(100),
            scheduler_interval: Duration::from_millis(50),
            pruner: None,
            ..MaintenanceSettings::default()
        });
    })
}

#[tokio::test]
async fn panics_timeouts_snoozes_and_unknown_types_become_attempts() {
    let db = TestDb::new().await;
    // One attempt each, so every failure ends its job and leaves exactly one row to inspect.
    for t in ["lib.panics", "lib.sleeps", "lib.unknown"] {
        let once = PolicyPatch { max_attempts: Some(1), ..PolicyPatch::default() };
        db.store.put_policy(t, &once, &Actor::new("test"), None).await.unwrap();
    }
    let snoozed = Arc::new(AtomicBool::new(false));
    let snoozed_in_handler = snoozed.clone();
    let worker = quick(Worker::builder(db.store.clone()))
        .queue("default", 8)
        .handler(
            "lib.panics",
            handler_fn(|_| async {
                if std::hint::black_box(true) {
                    panic!("kaboom: {}", 42);
                }
                Ok(None)
            }),
        )
        .handler_arc(
            "lib.sleeps",
            Arc::new(handler_fn(|_| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(None)
            })),
            Some(Duration::from_millis(300)),
        )
        .handler(
            "lib.snoozes",
            handler_fn(move |job| {
                let first = !snoozed_in_handler.swap(true, Ordering::SeqCst);
                async move {
                    if first {
                        let at = jiff::Timestamp::now() + jiff::SignedDuration::from_millis(300);
                        return Err(Outcome::RetryAfter { at, error: Some(HandlerError::new("lib.rate_limited", "come back later")) });
                    }
                    Ok(Some(json!({ "attempt": job.attempt() })))
                }
            }),
        )
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));

    let enqueue = |job: NewJob| {
        let store = db.store.clone();
        async move { store.enqueue(job).await.unwrap().job.id }
    };
    let panics = enqueue(NewJob::new("lib.panics", json!([]))).await;
    let by_type = enqueue(NewJob::new("lib.sleeps", json!([]))).await;
    let mut own = NewJob::new("lib.sleeps", json!([]));
    own.timeout_ms = Some(150);
    let by_job = enqueue(own).await;
    let unknown = enqueue(NewJob::new("lib.unknown", json!([]))).await;
    let snoozes = enqueue(NewJob::new("lib.snoozes", json!([]))).await;

    wait_state(&db.store, panics, JobState::Discarded).await;
    let a = &db.store.attempts(panics).await.unwrap()[0];
    assert_eq!(a.error_type.as_deref(), Some("rebound.panic"));
    assert_eq!(a.error_message.as_deref(), Some("handler panicked: kaboom: 42"));
    let details = a.error_details.as_ref().unwrap();
    assert_eq!(details["panic"], "kaboom: 42");
    assert!(details["location"].as_str().unwrap().contains("runtime_library.rs"), "{details}");
    assert!(details["backtrace"].is_string());

    // The type's default timeout, and the job's own, which wins over it.
    for (id, ms) in [(by_type, 300), (by_job, 150)] {
        wait_state(&db.store, id, JobState::Discarded).await;
        let a = &db.store.attempts(id).await.unwrap()[0];
        assert_eq!(a.error_type.as_deref(), Some("rebound.timeout"));
        assert_eq!(a.error_details.as_ref().unwrap()["timeout_ms"], ms);
    }

    wait_state(&db.store, unknown, JobState::Discarded).await;
    let a = &db.store.attempts(unknown).await.unwrap()[0];
    assert_eq!(a.error_type.as_deref(), Some("rebound.unknown_type"));

    let done = wait_state(&db.store, snoozes, JobState::Completed).await;
    assert_eq!(done.attempt, 1, "a snooze does not spend an attempt");
    assert_eq!(done.result, Some(json!({"attempt": 1})));
    let rows = db.store.attempts(snoozes).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.outcome.as_str()).collect::<Vec<_>>(), vec!["snoozed", "completed"]);
    assert!(rows[1].started_at.unwrap() >= rows[0].next_run_at.unwrap(), "ran again only after the snooze");

    shutdown.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.results.completed, 1);
    assert_eq!(report.results.failed, 5);
    assert!(!report.grace_expired);
}

/// Postgres stores no NUL: handler output carrying one (a result, an error message, details,
/// even a panic message) is written with U+FFFD in its place instead of failing the write and
/// leaving the job stuck. Input carrying one is refused by the library's enqueue.
#[tokio::test]
async fn handler_output_with_nul_is_stored_with_replacement_characters() {
    let db = TestDb::new().await;
    let once = PolicyPatch { max_attempts: Some(1), ..PolicyPatch::default() };
    db.store.put_policy("lib.nul.fails", &once, &Actor::new("test"), None).await.unwrap();
    let worker = quick(Worker::builder(db.store.clone()))
        .queue("default", 4)
        .handler("lib.nul.done", handler_fn(|_| async { Ok(Some(json!({"out\u{0}": ["a\u{0}b"], "big": 1.7976931348623157e308}))) }))
        .handler(
            "lib.nul.fails",
            handler_fn(|_| async {
                Err(Outcome::Retry(HandlerError::new("lib.nul\u{0}", "bad\u{0}byte").with_details(json!({"stderr": "x\u{0}y"}))))
            }),
        )
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    let done = db.store.enqueue(NewJob::new("lib.nul.done", json!([]))).await.unwrap().job.id;
    let fails = db.store.enqueue(NewJob::new("lib.nul.fails", json!([]))).await.unwrap().job.id;

    let job = wait_state(&db.store, done, JobState::Completed).await;
    assert_eq!(job.result, Some(json!({"out\u{FFFD}": ["a\u{FFFD}b"], "big": "1.7976931348623157e+308"})));
    wait_state(&db.store, fails, JobState::Discarded).await;
    let a = &db.store.attempts(fails).await.unwrap()[0];
    assert_eq!(a.error_type.as_deref(), Some("lib.nul\u{FFFD}"));
    assert_eq!(a.error_message.as_deref(), Some("bad\u{FFFD}byte"));
    assert_eq!(a.error_details.as_ref().map(|d| d["stderr"].clone()), Some(json!("x\u{FFFD}y")));

    let refused = db.store.enqueue(NewJob::new("lib.nul.done", json!([{"name": "\u{0}"}]))).await;
    assert!(matches!(&refused, Err(rebound_queue::StoreError::InvalidJob(e)) if e.field == "args[0].name"), "{refused:?}");
    shutdown.cancel();
    run.await.unwrap();
}

#[tokio::test]
async fn paused_queues_are_not_claimed_and_several_queues_run_side_by_side() {
    let db = TestDb::new().await;
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = ran.clone();
    db.store.set_queue_paused("held", true, &Actor::new("test")).await.unwrap();
    let worker = quick(Worker::builder(db.store.clone()))
        .queue("held", 2)
        .queue("open", 2)
        .handler(
            "lib.count",
            handler_fn(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok(None) }
            }),
        )
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    let held = db.store.enqueue(NewJob::new("lib.count", json!([])).queue("held")).await.unwrap().job.id;
    let open = db.store.enqueue(NewJob::new("lib.count", json!([])).queue("open")).await.unwrap().job.id;
    wait_state(&db.store, open, JobState::Completed).await;
    // Several polls later, the paused queue's job is still waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(db.store.job(held).await.unwrap().state, JobState::Available);
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    db.store.set_queue_paused("held", false, &Actor::new("test")).await.unwrap();
    wait_state(&db.store, held, JobState::Completed).await;
    shutdown.cancel();
    run.await.unwrap();
}

#[tokio::test]
async fn results_written_in_overlapping_batches_land_exactly_once() {
    let db = TestDb::new().await;
    // Every other job fails once and is retried at once, so failures, retries and completions
    // are written side by side in many small batches, several in flight, with claims held back
    // by a small backlog.
    let patch = PolicyPatch::from_json(&json!({
        "max_attempts": 3, "initial_interval": "PT0.0001S", "backoff_strategy": "constant", "jitter": false
    }))
    .unwrap();
    db.store.put_policy("lib.bulk", &patch, &Actor::new("test"), None).await.unwrap();
    let n = 3000usize;
    let jobs: Vec<NewJob> = (0..n).map(|i| NewJob::new("lib.bulk", json!([i])).queue("bulk")).collect();
    db.store.enqueue_batch(jobs).await.unwrap();

    let executions = Arc::new(AtomicUsize::new(0));
    let counter = executions.clone();
    let mut settings = rebound_worker::RuntimeSettings::default();
    settings.completer.batch_size = 25;
    settings.completer.flushes_in_flight = 4;
    settings.completer.max_backlog = 100;
    // Through the queue: every retry is claimed again (retries in place have their own test).
    settings.retry_in_place = false;
    let store = Store::connect(&db.url, settings.connections_needed([300])).await.unwrap();
    let worker = quick(Worker::builder(store).settings(settings))
        .queue("bulk", 300)
        .handler(
            "lib.bulk",
            handler_fn(move |job| {
                counter.fetch_add(1, Ordering::SeqCst);
                let fails = job.job().args[0].as_u64().unwrap_or(0) % 2 == 0 && job.attempt() == 1;
                async move { if fails { Err(Outcome::Retry(HandlerError::new("lib.flaky", "first try"))) } else { Ok(None) } }
            }),
        )
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    eventually("every job completed", Duration::from_secs(120), || async {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'completed'").fetch_one(db.store.pool()).await.ok()?;
        (done as usize == n).then_some(())
    })
    .await;
    shutdown.cancel();
    let report = run.await.unwrap();

    assert_eq!(executions.load(Ordering::SeqCst), n + n / 2, "each attempt ran exactly once");
    assert_eq!(report.claimed as usize, n + n / 2);
    assert_eq!((report.results.completed as usize, report.results.failed as usize), (n, n / 2));
    assert_eq!((report.results.refused, report.results.unwritten, report.results.released), (0, 0, 0));
    // One attempt row per execution: attempt 1 retried then attempt 2 completed for the failing
    // half, attempt 1 completed for the rest.
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT outcome, attempt, count(*) FROM job_history GROUP BY outcome, attempt ORDER BY outcome, attempt",
    )
    .fetch_all(db.store.pool())
    .await
    .unwrap();
    let half = (n / 2) as i64;
    assert_eq!(rows, vec![("completed".to_string(), 1, half), ("completed".to_string(), 2, half), ("retried".to_string(), 1, half)]);
    let per_job: i64 = sqlx::query_scalar("SELECT count(*) FROM (SELECT job_id FROM job_history WHERE outcome = 'completed' GROUP BY job_id HAVING count(*) <> 1) x")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(per_job, 0, "no job has more or less than one completion");
}

#[tokio::test]
async fn failures_retried_at_once_run_again_in_place_and_each_is_recorded() {
    let db = TestDb::new().await;
    let put = |v: serde_json::Value| {
        let store = db.store.clone();
        async move { store.put_policy("lib.inplace", &PolicyPatch::from_json(&v).unwrap(), &Actor::new("test"), None).await.unwrap() }
    };
    put(json!({"max_attempts": 4, "initial_interval": "PT0.0001S", "backoff_strategy": "constant", "jitter": false})).await;
    // Attempt 1 fails at once; attempt 2 fails after a while (long enough for the first failure
    // to be written on its own while it runs); attempt 3 completes.
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = runs.clone();
    let worker = quick(Worker::builder(db.store.clone()))
        .queue("default", 4)
        .handler(
            "lib.inplace",
            handler_fn(move |job| {
                seen.lock().unwrap().push((job.id(), job.attempt()));
                let attempt = job.attempt();
                async move {
                    match attempt {
                        1 => Err(Outcome::Retry(HandlerError::new("lib.flaky", "attempt 1 failed"))),
                        2 => {
                            tokio::time::sleep(Duration::from_millis(600)).await;
                            Err(Outcome::Retry(HandlerError::new("lib.flaky", "attempt 2 failed")))
                        }
                        _ => Ok(Some(json!({"attempt": attempt}))),
                    }
                }
            }),
        )
        .build()
        .unwrap();
    let worker_id = worker.id().to_string();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    // The worker reads its copy of the policies once it listens; a job before that would be
    // decided by the database (also correct, but not what this test is about).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id = db.store.enqueue(NewJob::new("lib.inplace", json!([]))).await.unwrap().job.id;

    // While attempt 2 runs, the job shows it, and attempt 1's failure is already recorded.
    let during = eventually("attempt 2 to show as running", Duration::from_secs(10), || async {
        db.store.job(id).await.ok().filter(|j| j.state == JobState::Active && j.attempt == 2)
    })
    .await;
    assert_eq!(during.last_error.as_ref().map(|e| e["message"].clone()), Some(json!("attempt 1 failed")));
    let first = db.store.attempts(id).await.unwrap();
    assert_eq!(first.iter().map(|a| (a.attempt, a.outcome.as_str())).collect::<Vec<_>>(), vec![(1, "retried")]);

    let done = wait_state(&db.store, id, JobState::Completed).await;
    assert_eq!((done.attempt, done.result.clone()), (3, Some(json!({"attempt": 3}))));
    let history = db.store.attempts(id).await.unwrap();
    let summary: Vec<_> = history.iter().map(|a| (a.attempt, a.outcome.as_str(), a.error_message.as_deref(), a.worker_id.as_deref())).collect();
    let me = Some(worker_id.as_str());
    assert_eq!(
        summary,
        vec![(1, "retried", Some("attempt 1 failed"), me), (2, "retried", Some("attempt 2 failed"), me), (3, "completed", None, me)]
    );
    for pair in history.windows(2) {
        assert!(pair[0].finished_at <= pair[1].started_at.unwrap(), "attempts follow each other: {pair:?}");
    }
    assert!(history[1].finished_at.duration_since(history[1].started_at.unwrap()) >= jiff::SignedDuration::from_millis(600));
    assert_eq!(history[0].policy.as_ref().map(|p| p["initial_interval"].clone()), Some(json!("PT0.0001S")));

    // An edit applies to the next failure: one attempt only now, so it is dead-lettered.
    put(json!({"max_attempts": 1, "on_exhaustion": "dead_letter"})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = db.store.enqueue(NewJob::new("lib.inplace", json!([]))).await.unwrap().job.id;
    let dead = wait_state(&db.store, next, JobState::Discarded).await;
    assert!(dead.dead_letter);
    assert_eq!(dead.attempt, 1);

    shutdown.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.claimed, 2, "the retries were not claimed again");
    assert_eq!(runs.lock().unwrap().iter().map(|(_, a)| *a).collect::<Vec<_>>(), vec![1, 2, 3, 1], "each attempt ran once");
    assert_eq!((report.results.completed, report.results.failed, report.results.refused), (1, 3, 0));
}

#[tokio::test]
async fn builder_rejects_bad_queues_and_patterns() {
    let store = Store::connect_lazy("postgres://nobody@127.0.0.1:1/none", 1).unwrap();
    let noop = || handler_fn(|_| async { Ok(None) });
    assert!(Worker::builder(store.clone()).handler("a.b", noop()).build().is_err(), "no queues");
    assert!(Worker::builder(store.clone()).queue("Bad Queue", 1).build().is_err());
    assert!(Worker::builder(store.clone()).queue("default", 0).build().is_err());
    assert!(Worker::builder(store.clone()).queue("default", 1).handler("Not A Type", noop()).build().is_err());
    let w = Worker::builder(store).queue("default", 1).handler("a.*", noop()).configure(|s| s.worker_id = Some("me".into())).build().unwrap();
    assert_eq!(w.id(), "me");
}

#[tokio::test]
async fn handlers_report_progress_while_they_run() {
    let db = TestDb::new().await;
    let worker = quick(Worker::builder(db.store.clone()))
        .queue("default", 2)
        .handler(
            "lib.progress",
            handler_fn(|job| async move {
                for (pct, msg) in [(25.0, "a quarter"), (75.0, "most")] {
                    job.progress(pct, Some(msg)).await.map_err(|e| Outcome::Retry(HandlerError::new("lib.progress_failed", e.to_string())))?;
                }
                // Out of range: refused by name, and the job runs on.
                let refused = job.progress(120.0, None).await.err().map(|e| e.to_string());
                Ok(Some(json!({ "refused": refused })))
            }),
        )
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    let id = db.store.enqueue(NewJob::new("lib.progress", json!([]))).await.unwrap().job.id;
    let done = wait_state(&db.store, id, JobState::Completed).await;
    assert!(done.result.as_ref().and_then(|r| r["refused"].as_str()).is_some_and(|r| r.contains("percentage")), "{:?}", done.result);
    let latest = db.store.latest_progress(id).await.unwrap().expect("a report");
    assert_eq!((latest.percentage, latest.message.as_deref(), latest.attempt), (75.0, Some("most"), 1));
    assert_eq!(latest.worker_id, done.locked_by, "reported by the worker that ran it");
    let events = db
        .store
        .events(&rebound_queue::store::EventFilter { types: vec!["job.progress".into()], job_id: Some(id), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(events.iter().map(|e| e.progress_percent).collect::<Vec<_>>(), [Some(75.0), Some(25.0)]);
    shutdown.cancel();
    run.await.unwrap();
}

#[tokio::test]
async fn a_chain_s_steps_run_in_order_through_the_worker_each_seeing_the_results_before_it() {
    use rebound_queue::store::{BatchCallbacks, NewWorkflow, WorkflowType};
    let db = TestDb::new().await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let worker = quick(Worker::builder(db.store.clone()))
        .queue("default", 4)
        .handler(
            "lib.step",
            handler_fn(move |job| {
                let record = record.clone();
                async move {
                    let n = job.arg(0).cloned().unwrap_or_default();
                    if let Ok(mut seen) = record.lock() {
                        seen.push((n.clone(), job.parent_results().to_vec(), job.workflow_id()));
                    }
                    Ok(Some(json!({ "step": n })))
                }
            }),
        )
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    let steps = (0..3).map(|i| NewJob::new("lib.step", json!([i]))).collect();
    let wf = db
        .store
        .create_workflow(NewWorkflow { id: None, kind: WorkflowType::Chain, name: None, jobs: steps, callbacks: BatchCallbacks::default(), graph: Vec::new(), nested: Default::default() })
        .await
        .unwrap();
    let done = eventually("the chain to complete", Duration::from_secs(60), || {
        let store = db.store.clone();
        async move { store.workflow(wf.id).await.ok().flatten().filter(|w| w.state == "completed") }
    })
    .await;
    assert_eq!(done.completed_count, 3);
    shutdown.cancel();
    run.await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            (json!(0), vec![], Some(wf.id)),
            (json!(1), vec![json!({"step": 0})], Some(wf.id)),
            (json!(2), vec![json!({"step": 0}), json!({"step": 1})], Some(wf.id)),
        ]
    );
}

#[tokio::test]
async fn a_graph_s_join_runs_through_the_worker_reading_each_upstream_result_by_step_id() {
    use rebound_queue::store::{BatchCallbacks, GraphStep, NewWorkflow, WorkflowType};
    let db = TestDb::new().await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let worker = quick(Worker::builder(db.store.clone()))
        .queue("default", 4)
        .handler(
            "lib.node",
            handler_fn(move |job| {
                let record = record.clone();
                async move {
                    let n = job.arg(0).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                    let upstream = ["left", "right"].map(|id| job.upstream_result(id).cloned());
                    if let Ok(mut seen) = record.lock() {
                        seen.push((n.clone(), upstream, job.parent_results().len()));
                    }
                    Ok(Some(json!({ "node": n })))
                }
            }),
        )
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    let nodes = [("left", vec![]), ("right", vec![]), ("join", vec!["left".to_string(), "right".to_string()])];
    let wf = NewWorkflow {
        id: None,
        kind: WorkflowType::Graph,
        name: None,
        jobs: nodes.iter().map(|(id, _)| NewJob::new("lib.node", json!([id]))).collect(),
        callbacks: BatchCallbacks::default(),
        graph: nodes.iter().map(|(id, after)| GraphStep { id: id.to_string(), depends_on: after.clone() }).collect(),
        nested: Default::default(),
    };
    let wf = db.store.create_workflow(wf).await.unwrap();
    let done = eventually("the graph to complete", Duration::from_secs(60), || {
        let store = db.store.clone();
        async move { store.workflow(wf.id).await.ok().flatten().filter(|w| w.state == "completed") }
    })
    .await;
    assert_eq!(done.completed_count, 3);
    shutdown.cancel();
    run.await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let join = seen.iter().find(|(n, _, _)| n == "join").cloned();
    assert_eq!(join, Some(("join".to_string(), [Some(json!({"node": "left"})), Some(json!({"node": "right"}))], 0)), "{seen:?}");
    assert_eq!(seen.last().map(|(n, _, _)| n.as_str()), Some("join"), "after both: {seen:?}");
}

/// Sets its flag when dropped: the worker stops a handler by dropping its future.
struct Stopped(Arc<AtomicBool>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_run_is_stopped_when_its_job_is_cancelled_retried_and_claimed_here_again() {
    let db = TestDb::new().await;
    let first_stopped = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let (stopped, runs) = (first_stopped.clone(), started.clone());
    let worker = quick(Worker::builder(db.store.clone()))
        // No heartbeat in this test's time: only the new claim can tell the worker the first
        // run is over.
        .configure(|s| s.heartbeat_interval = Duration::from_secs(120))
        .queue("default", 2)
        .handler(
            "lib.long",
            handler_fn(move |job| {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                let guard = (n == 0).then(|| Stopped(stopped.clone()));
                async move {
                    // Only the first run takes long (a retry starts the attempts afresh).
                    if let Some(_guard) = guard {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    Ok(Some(json!({"attempt": job.attempt()})))
                }
            }),
        )
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    let id = db.store.enqueue(NewJob::new("lib.long", json!([]))).await.unwrap().job.id;
    eventually("the first run to start", Duration::from_secs(10), || async { (started.load(Ordering::SeqCst) == 1).then_some(()) }).await;

    // An operator cancels it, and retries it at once: this worker claims it again.
    let ops = Actor::new("ops");
    db.store.cancel(id, Some(&ops)).await.unwrap();
    let report = db.store.retry_finished_jobs(&rebound_queue::store::JobSelection::Ids(vec![id]), &ops).await.unwrap();
    assert_eq!(report.succeeded, 1, "{report:?}");
    let done = wait_state(&db.store, id, JobState::Completed).await;
    assert_eq!(done.result, Some(json!({"attempt": 1})), "the retry started the attempts afresh");
    eventually("the first run to be stopped", Duration::from_secs(10), || async { first_stopped.load(Ordering::SeqCst).then_some(()) }).await;
    let history = db.store.attempts(id).await.unwrap();
    assert_eq!(started.load(Ordering::SeqCst), 2, "{:?}", history.iter().map(|a| (a.attempt, a.outcome.as_str(), a.error_message.clone())).collect::<Vec<_>>());
    shutdown.cancel();
    run.await.unwrap();
}
