//! Three `rebound-worker` processes against a Postgres cluster of the test's own, which is
//! restarted (`-m fast`, `-m immediate`), stopped dead for longer than the visibility timeout,
//! and whose worker connections (and the maintenance leader's) are terminated, all while jobs
//! run, fail, retry in place and through the queue, and die into the dead-letter queue.
//!
//! After the faults every job must be exactly where a fault-free run would leave it: each ran
//! the attempts it should have and no other (every job allows a single attempt more than it
//! needs, or none at all, so an attempt charged for work that never ran shows up as a wrong
//! end state); no completion happened twice; no session sat idle in a transaction for a
//! second; every worker is alive, reports itself `ready` again, and stops cleanly.
//!
//! `bench/fault-rounds.sh` runs this test in a loop (the faults land at different moments
//! each time); `REBOUND_FAULT_OUTAGE_SECS` sets the length of the dead stop (default 8).

mod support;

use std::collections::HashMap;
use std::time::Duration;

use rebound_queue::policy::PolicyPatch;
use rebound_queue::store::{Actor, ORPHAN_REASON, WorkerStatus};
use rebound_queue::testing::PrivateCluster;
use rebound_queue::{JobState, NewJob, Store};
use serde_json::{Value, json};
use support::{admin, Recorder, IDLE_IN_TRANSACTION_LIMIT, TransactionWatch, WorkerProcess, eventually, fast_config};
use uuid::Uuid;

/// What each kind of job should come to.
struct Kind {
    job_type: &'static str,
    count: usize,
    args: Value,
    policy: Value,
    state: JobState,
    dead_letter: bool,
    /// The attempt numbers its executions carry, in order.
    runs: &'static [i32],
}

fn kinds() -> Vec<Kind> {
    vec![
        Kind {
            job_type: "fault.ok",
            count: 4_000,
            args: json!({"sleep_ms": 15}),
            // One attempt: a charge for an execution that never happened would discard it.
            policy: json!({"max_attempts": 1}),
            state: JobState::Completed,
            dead_letter: false,
            runs: &[1],
        },
        Kind {
            job_type: "fault.retry",
            count: 600,
            args: json!({"sleep_ms": 15, "fail_attempts": 1}),
            policy: json!({"max_attempts": 2, "initial_interval": "PT0.1S", "backoff_strategy": "constant", "jitter": false}),
            state: JobState::Completed,
            dead_letter: false,
            runs: &[1, 2],
        },
        Kind {
            job_type: "fault.inplace",
            count: 600,
            args: json!({"sleep_ms": 15, "fail_attempts": 1}),
            policy: json!({"max_attempts": 2, "initial_interval": "PT0.0001S", "backoff_strategy": "constant", "jitter": false}),
            state: JobState::Completed,
            dead_letter: false,
            runs: &[1, 2],
        },
        Kind {
            job_type: "fault.dead",
            count: 300,
            args: json!({"sleep_ms": 15, "fail_attempts": 99}),
            policy: json!({"max_attempts": 2, "initial_interval": "PT0.1S", "backoff_strategy": "constant", "jitter": false,
                           "on_exhaustion": "dead_letter"}),
            state: JobState::Discarded,
            dead_letter: true,
            runs: &[1, 2],
        },
    ]
}

async fn finished(store: &Store) -> Option<i64> {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state IN ('completed', 'discarded', 'cancelled')").fetch_one(store.pool()).await.ok()
}

/// Waits until `more` jobs beyond `from` have finished (the database may be coming back).
async fn progress(store: &Store, from: i64, more: i64, total: i64) -> i64 {
    let target = (from + more).min(total);
    eventually(&format!("{target} jobs finished"), Duration::from_secs(120), || async { finished(store).await.filter(|n| *n >= target) }).await
}

/// Terminates the backends `which` selects (a WHERE clause over pg_stat_activity); how many.
async fn terminate(cluster: &PrivateCluster, which: &str) -> i64 {
    let mut conn = admin(cluster).await;
    let sql = format!("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = 'rebound' AND {which}");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(&mut conn).await.unwrap()
}

#[tokio::test]
async fn workers_ride_out_restarts_crashes_and_killed_connections() {
    let outage = std::env::var("REBOUND_FAULT_OUTAGE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(8u64);
    let cluster = PrivateCluster::start(&["max_connections=200"]);
    sqlx::query("CREATE DATABASE rebound").execute(&mut admin(&cluster).await).await.unwrap();
    let url = cluster.url("rebound");
    let store = Store::connect(&url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let recorder = Recorder::start().await;
    let watch = TransactionWatch::start(&cluster.url("postgres"), "rebound");

    let kinds = kinds();
    let mut expected: HashMap<Uuid, usize> = HashMap::new();
    for (k, kind) in kinds.iter().enumerate() {
        store.put_policy(kind.job_type, &PolicyPatch::from_json(&kind.policy).unwrap(), &Actor::new("test"), None).await.unwrap();
        let jobs = (0..kind.count).map(|_| NewJob::new(kind.job_type, json!([kind.args.clone()]))).collect();
        for e in store.enqueue_batch(jobs).await.unwrap() {
            expected.insert(e.job.id, k);
        }
    }
    let total = expected.len() as i64;

    // A visibility timeout shorter than the dead stop: locks lapse while the database is down.
    let config = fast_config("visibility_timeout = \"5s\"", "default = 8", &recorder.handler("fault.*"));
    let mut workers: Vec<WorkerProcess> = ["one", "two", "three"].iter().map(|id| WorkerProcess::start(&url, &config, &["--worker-id", id])).collect();

    let mut done = progress(&store, 0, 400, total).await;
    cluster.pg_ctl(&["-m", "fast", "restart"]);
    done = progress(&store, done, 600, total).await;
    cluster.pg_ctl(&["-m", "immediate", "restart"]);
    done = progress(&store, done, 600, total).await;
    let killed = terminate(&cluster, "application_name = 'rebound-worker'").await;
    assert!(killed > 0, "no worker connection to terminate");
    done = progress(&store, done, 600, total).await;
    let leader = terminate(
        &cluster,
        "pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
                 AND database = (SELECT oid FROM pg_database WHERE datname = 'rebound'))",
    )
    .await;
    assert_eq!(leader, 1, "exactly one maintenance leader");
    done = progress(&store, done, 600, total).await;
    cluster.pg_ctl(&["-m", "immediate", "stop"]);
    tokio::time::sleep(Duration::from_secs(outage)).await;
    cluster.pg_ctl(&["start"]);
    assert!(done < total, "the faults happened under load ({done} of {total} were done before the last)");
    progress(&store, done, total, total).await;

    for w in &mut workers {
        assert!(w.running(), "a worker exited:\n{}", w.log_text());
    }

    // Each job ran the attempts it should have, and ended where it should.
    let mut runs: HashMap<Uuid, Vec<i32>> = HashMap::new();
    for (id, attempt) in recorder.executions() {
        runs.entry(id).or_default().push(attempt);
    }
    let rows = sqlx::query_as::<_, (Uuid, String, i32, bool)>("SELECT id, state::text, attempt, dead_letter FROM jobs")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(rows.len(), expected.len());
    let mut wrong = Vec::new();
    for (id, state, attempt, dead_letter) in rows {
        let kind = &kinds[expected[&id]];
        let ran = runs.remove(&id).unwrap_or_default();
        if state != kind.state.as_str() || dead_letter != kind.dead_letter || attempt != kind.runs.len() as i32 || ran != kind.runs {
            wrong.push(format!("{} {id}: {state} at attempt {attempt} (dead letter: {dead_letter}), ran {ran:?}", kind.job_type));
        }
    }
    assert!(wrong.is_empty(), "{} jobs ended wrongly, e.g.:\n{}", wrong.len(), wrong.iter().take(10).cloned().collect::<Vec<_>>().join("\n"));

    // The only attempts that did not run as a handler execution are claims whose answer was
    // lost, handed back uncounted; no lock lapsed into a rescue.
    let others: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT outcome, error_type, error_message FROM job_attempts WHERE error_type IS DISTINCT FROM 'http.5xx'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(
        others.iter().all(|(outcome, _, reason)| outcome == "released" && reason.as_deref() == Some(ORPHAN_REASON)),
        "{others:?}"
    );
    eprintln!("jobs handed back after a claim's answer was lost: {}", others.len());

    assert!(watch.worst() < IDLE_IN_TRANSACTION_LIMIT, "a session sat idle in a transaction for {:?}", watch.worst());
    eventually("every worker to report itself ready", Duration::from_secs(30), || async {
        let ws = store.workers().await.ok()?;
        (ws.len() == 3 && ws.iter().all(|w| w.status == WorkerStatus::Ready)).then_some(())
    })
    .await;

    for w in &mut workers {
        w.signal("TERM");
    }
    for w in &mut workers {
        let status = w.exit_within(Duration::from_secs(30)).await.expect("exits after SIGTERM");
        assert_eq!(status.code(), Some(0), "{}", w.log_text());
    }
}
