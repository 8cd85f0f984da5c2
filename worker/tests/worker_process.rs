//! The `rebound-worker` binary, spawned as a process against a real Postgres database.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rebound_queue::store::{Actor, ReplayRuleSpec};
use rebound_queue::testing::TestDb;
use rebound_queue::{JobState, NewJob, PolicyPatch, Store};
use serde_json::json;
use sqlx::Row;
use support::{Recorder, Scratch, WorkerProcess, eventually, fast_config, lines, recording_handler};
use uuid::Uuid;

const LONG: Duration = Duration::from_secs(90);

async fn count_in_state(store: &Store, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = $1::job_state")
        .bind(state)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

async fn wait_registered(store: &Store, worker: &WorkerProcess) {
    let pid = worker.pid() as i32;
    eventually("the worker to register", LONG, || async move {
        store.workers().await.ok()?.into_iter().any(|w| w.pid == pid).then_some(())
    })
    .await;
}

async fn wait_state(store: &Store, id: Uuid, state: JobState) -> rebound_queue::Job {
    eventually(&format!("job {id} to be {state}"), LONG, || async move {
        store.job(id).await.ok().filter(|j| j.state == state)
    })
    .await
}

async fn put_policy(store: &Store, job_type: &str, policy: serde_json::Value) {
    let patch = PolicyPatch::from_json(&policy).unwrap();
    store.put_policy(job_type, &patch, &Actor::new("test"), None).await.unwrap();
}

#[tokio::test]
async fn a_thousand_jobs_each_run_exactly_once() {
    let db = TestDb::new().await;
    let scratch = Scratch::new("once");
    let executions = scratch.file("executions.log");
    let config = fast_config("", "default = 16", &recording_handler("record.once", &executions, "0"));
    let jobs = |n: usize| (0..n).map(|i| NewJob::new("record.once", json!([i]))).collect::<Vec<_>>();
    // Half before the worker starts (found by its first claims), half after (found through
    // notifications and polling).
    let mut ids: Vec<Uuid> = db.store.enqueue_batch(jobs(500)).await.unwrap().into_iter().map(|e| e.job.id).collect();
    let mut worker = WorkerProcess::start(&db.url, &config, &[]);
    wait_registered(&db.store, &worker).await;
    ids.extend(db.store.enqueue_batch(jobs(500)).await.unwrap().into_iter().map(|e| e.job.id));

    eventually("1000 completed jobs", LONG, || async { (count_in_state(&db.store, "completed").await == 1000).then_some(()) }).await;

    // Every execution, as the command itself recorded it: each job once, at attempt 1.
    let recorded = lines(&executions);
    assert_eq!(recorded.len(), 1000, "executions recorded");
    let mut seen: HashMap<Uuid, String> = HashMap::new();
    for line in &recorded {
        let (id, attempt) = line.split_once(' ').unwrap();
        let id: Uuid = id.parse().unwrap();
        assert_eq!(attempt, "1", "job {id} ran as attempt {attempt}");
        assert!(seen.insert(id, attempt.to_string()).is_none(), "job {id} ran twice");
    }
    assert_eq!(seen.keys().copied().collect::<HashSet<_>>(), ids.iter().copied().collect::<HashSet<_>>());

    // And as the store recorded them: one completed attempt per job, nothing else.
    let rows = sqlx::query("SELECT outcome, count(*) AS n, count(DISTINCT job_id) AS jobs FROM job_history GROUP BY outcome")
        .fetch_all(db.store.pool())
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "only completed attempts");
    assert_eq!(rows[0].get::<String, _>("outcome"), "completed");
    assert_eq!(rows[0].get::<i64, _>("n"), 1000);
    assert_eq!(rows[0].get::<i64, _>("jobs"), 1000);
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(db.store.pool()).await.unwrap();
    assert_eq!(total, 1000);

    worker.signal("TERM");
    let status = worker.exit_within(Duration::from_secs(30)).await.expect("worker exits after SIGTERM");
    assert_eq!(status.code(), Some(0));
    assert!(db.store.workers().await.unwrap().is_empty(), "the worker deregisters on the way out");
    // Its coming and going are OJS worker events; a clean stop says so.
    // Its drain is reported at once (a beat as SIGTERM arrives), however short it is.
    let comings_and_goings = ["worker.started", "worker.quiet", "worker.stopped"].map(String::from).to_vec();
    let events = db.store.worker_events(&rebound_queue::store::EventFilter { types: comings_and_goings, limit: 10, ..Default::default() }).await.unwrap();
    let kinds: Vec<(&str, Option<&str>)> = events.iter().map(|e| (e.event_type.as_str(), e.data["reason"].as_str())).collect();
    assert_eq!(kinds, [("worker.stopped", Some("shutdown")), ("worker.quiet", Some("shutdown")), ("worker.started", None)]);
    assert!(events[0].data["uptime_ms"].as_i64().is_some_and(|ms| ms > 0));
}

#[tokio::test]
async fn a_failing_job_follows_its_policy_to_the_dead_letter() {
    let db = TestDb::new().await;
    put_policy(
        &db.store,
        "always.fails",
        json!({"max_attempts": 4, "initial_interval": "PT0.1S", "backoff_strategy": "constant", "jitter": false, "on_exhaustion": "dead_letter"}),
    )
    .await;
    let handlers = r#"[handlers."always.fails"]
kind = "exec"
command = ["sh", "-c", "echo 'upstream still broken' >&2; exit 75"]
"#;
    let worker = WorkerProcess::start(&db.url, &fast_config("", "default = 2", handlers), &[]);
    let job = db.store.enqueue(NewJob::new("always.fails", json!([]))).await.unwrap().job;
    let done = wait_state(&db.store, job.id, JobState::Discarded).await;
    assert!(done.dead_letter, "exhaustion goes to the dead letters by policy");
    assert_eq!(done.attempt, 4);

    let attempts = db.store.attempts(job.id).await.unwrap();
    assert_eq!(attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(), vec![1, 2, 3, 4], "one row per execution");
    assert_eq!(attempts.iter().map(|a| a.outcome.as_str()).collect::<Vec<_>>(), vec!["retried", "retried", "retried", "exhausted"]);
    assert_eq!(attempts.iter().map(|a| a.delay_ms).collect::<Vec<_>>(), vec![Some(100), Some(100), Some(100), None]);
    for a in &attempts {
        assert_eq!(a.error_type.as_deref(), Some("exec.tempfail"));
        assert_eq!(a.error_message.as_deref(), Some("upstream still broken"));
        assert!(a.worker_id.is_some());
    }
    for pair in attempts.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let planned = before.next_run_at.expect("a retried attempt plans its next run");
        assert_eq!(planned.duration_since(before.finished_at).as_millis(), 100, "planned delay");
        let started = after.started_at.expect("attempt start");
        assert!(started >= planned, "attempt {} started at {started}, before its planned {planned}", after.attempt);
    }

    // An operator's replay rule gives it one more round: the worker leader's replayer re-drives
    // it once it has been dead for the rule's delay (its death is moved back here).
    let rule = ReplayRuleSpec {
        name: "upstream-fixed".into(),
        queue: None,
        job_type: Some("always.fails".into()),
        error_type: Some("exec.*".into()),
        delay: Duration::from_secs(3600),
        max_replays: 1,
        enabled: true,
    };
    db.store.put_replay_rule(&rule, &Actor::new("test")).await.unwrap();
    sqlx::query("UPDATE jobs SET dead_lettered_at = now() - interval '2 hours' WHERE id = $1").bind(job.id).execute(db.store.pool()).await.unwrap();
    let store = &db.store;
    let again = eventually("the job replayed, run again and dead again", LONG, || async move {
        store.job(job.id).await.ok().filter(|j| j.dead_letter && j.meta["ojs.replay_count"] == 1)
    })
    .await;
    assert_eq!((again.attempt, again.meta["ojs.replay_rule"].as_str()), (4, Some("upstream-fixed")), "a fresh budget, used up");
    assert_eq!(db.store.attempts(job.id).await.unwrap().len(), 8, "both rounds' history");
    drop(worker);
}

#[tokio::test]
async fn sigterm_lets_the_running_job_finish_and_exits_zero() {
    let db = TestDb::new().await;
    let config = fast_config("shutdown_grace = \"20s\"", "default = 1", "");
    // The demo config's handlers are not in `config`; add demo.slow.
    let config = format!("{config}\n[handlers.\"demo.slow\"]\nkind = \"demo\"\n");
    let mut worker = WorkerProcess::start(&db.url, &config, &[]);
    let running = db.store.enqueue(NewJob::new("demo.slow", json!([{"ms": 1500}]))).await.unwrap().job;
    let waiting = db.store.enqueue(NewJob::new("demo.slow", json!([{"ms": 1500}]))).await.unwrap().job;
    wait_state(&db.store, running.id, JobState::Active).await;

    worker.signal("TERM");
    let status = worker.exit_within(Duration::from_secs(20)).await.expect("exit within the grace period");
    assert_eq!(status.code(), Some(0));
    let finished = db.store.job(running.id).await.unwrap();
    assert_eq!(finished.state, JobState::Completed, "the running job finished during the grace period");
    assert_eq!(finished.result, Some(json!({"slept_ms": 1500})));
    // With its only slot busy, the worker never claimed the second job, and stopped claiming.
    let untouched = db.store.job(waiting.id).await.unwrap();
    assert_eq!((untouched.state, untouched.attempt), (JobState::Available, 0));
    assert!(worker.log_text().contains("stopping"));
}

#[tokio::test]
async fn an_operator_quiets_the_worker_then_terminates_it() {
    let db = TestDb::new().await;
    let config = format!(
        "{}\n[handlers.\"demo.slow\"]\nkind = \"demo\"\n",
        fast_config("heartbeat_interval = \"100ms\"\nshutdown_grace = \"20s\"", "default = 2", "")
    );
    let mut worker = WorkerProcess::start(&db.url, &config, &[]);
    wait_registered(&db.store, &worker).await;
    let pid = worker.pid() as i32;
    let id = db.store.workers().await.unwrap().into_iter().find(|w| w.pid == pid).expect("registered").id;
    let running = db.store.enqueue(NewJob::new("demo.slow", json!([{"ms": 1500}]))).await.unwrap().job;
    wait_state(&db.store, running.id, JobState::Active).await;

    // As the dashboard's and the OJS admin API's "quiet" do.
    assert!(db.store.request_worker_state(&id, "quiet", &Actor::new("ops")).await.unwrap());
    eventually("the worker to hear quiet", LONG, || async { worker.log_text().contains("go quiet").then_some(()) }).await;
    let later = db.store.enqueue(NewJob::new("demo.slow", json!([{"ms": 10}]))).await.unwrap().job;
    let finished = wait_state(&db.store, running.id, JobState::Completed).await;
    assert_eq!(finished.result, Some(json!({"slept_ms": 1500})), "the running job finished");
    // Five poll intervals and a notification later, a claiming worker would have taken it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let untouched = db.store.job(later.id).await.unwrap();
    assert_eq!((untouched.state, untouched.attempt), (JobState::Available, 0), "a quiet worker claims nothing");
    assert!(worker.running(), "quiet is not a shutdown");
    // It says so at its next heartbeat: the row's status, and one OJS worker.quiet event.
    let row = db.store.workers().await.unwrap().into_iter().find(|w| w.pid == pid).expect("registered");
    assert_eq!(row.status, rebound_queue::store::WorkerStatus::Quiet);
    let of = |t: &str| rebound_queue::store::EventFilter { types: vec![t.to_string()], limit: 100, ..Default::default() };
    let quiet = db.store.worker_events(&of("worker.quiet")).await.unwrap();
    assert_eq!(quiet.len(), 1, "{quiet:?}");
    assert_eq!((quiet[0].worker_id.as_str(), quiet[0].data["reason"].as_str()), (id.as_str(), Some("quiet")));
    let beats = db.store.worker_events(&of("worker.heartbeat")).await.unwrap();
    assert!(beats.len() >= 2, "a heartbeat event per beat: {beats:?}");
    assert_eq!((beats[0].data["status"].as_str(), &beats[0].data["queues"]), (Some("quiet"), &json!(["default"])));
    // Every beat says what the process uses: a real process has resident memory, and the CPU
    // share of an idle worker is small but known.
    for beat in &beats {
        let memory = beat.data["memory_mb"].as_f64().unwrap_or_default();
        let cpu = beat.data["cpu_percent"].as_f64().unwrap_or(-1.0);
        assert!(memory > 1.0 && (0.0..1_000.0).contains(&cpu), "{:?}", beat.data);
    }
    assert!(row.usage.memory_mb.is_some_and(|m| m > 1.0), "the registry shows it too: {:?}", row.usage);

    assert!(db.store.request_worker_state(&id, "terminate", &Actor::new("ops")).await.unwrap());
    let status = worker.exit_within(Duration::from_secs(20)).await.expect("terminate exits");
    assert_eq!(status.code(), Some(0));
    assert!(worker.log_text().contains("asked this worker to terminate"));
    assert!(db.store.workers().await.unwrap().iter().all(|w| w.pid != pid), "deregistered on the way out");
    assert_eq!(db.store.job(later.id).await.unwrap().state, JobState::Available);
    assert_eq!(db.store.worker_events(&of("worker.quiet")).await.unwrap().len(), 1, "draining after quiet is the same quiet spell");
}

#[tokio::test]
async fn sigtstp_makes_the_worker_quiet_and_sigterm_still_stops_it() {
    let db = TestDb::new().await;
    let config = format!("{}\n[handlers.\"demo.slow\"]\nkind = \"demo\"\n", fast_config("", "default = 2", ""));
    let mut worker = WorkerProcess::start(&db.url, &config, &[]);
    wait_registered(&db.store, &worker).await;
    let first = db.store.enqueue(NewJob::new("demo.slow", json!([{"ms": 10}]))).await.unwrap().job;
    wait_state(&db.store, first.id, JobState::Completed).await;

    worker.signal("TSTP");
    eventually("the worker to go quiet", LONG, || async { worker.log_text().contains("going quiet").then_some(()) }).await;
    let later = db.store.enqueue(NewJob::new("demo.slow", json!([{"ms": 10}]))).await.unwrap().job;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let untouched = db.store.job(later.id).await.unwrap();
    assert_eq!((untouched.state, untouched.attempt), (JobState::Available, 0), "a quiet worker claims nothing");
    assert!(worker.running(), "quiet, not stopped");

    worker.signal("TERM");
    let status = worker.exit_within(Duration::from_secs(20)).await.expect("exit");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn sigterm_releases_a_job_that_outlives_the_grace_period() {
    let db = TestDb::new().await;
    let config = format!("{}\n[handlers.\"demo.slow\"]\nkind = \"demo\"\n", fast_config("shutdown_grace = \"500ms\"", "default = 2", ""));
    let mut worker = WorkerProcess::start(&db.url, &config, &[]);
    let job = db.store.enqueue(NewJob::new("demo.slow", json!([{"ms": 60000}]))).await.unwrap().job;
    wait_state(&db.store, job.id, JobState::Active).await;

    worker.signal("TERM");
    let status = worker.exit_within(Duration::from_secs(20)).await.expect("exit soon after the grace period");
    assert_eq!(status.code(), Some(0));
    let released = db.store.job(job.id).await.unwrap();
    assert_eq!(released.state, JobState::Available, "handed back for another worker");
    assert_eq!(released.attempt, 0, "the cut-short attempt is not counted");
    assert!(released.locked_by.is_none());
    let attempts = db.store.attempts(job.id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, "released");
}

#[tokio::test]
async fn kill_9_mid_job_is_rescued_by_another_worker_as_stalled() {
    let db = TestDb::new().await;
    let config = format!(
        "{}\n[handlers.\"demo.slow\"]\nkind = \"demo\"\n",
        fast_config("visibility_timeout = \"2s\"\nheartbeat_interval = \"500ms\"", "default = 2", "")
    );
    let mut first = WorkerProcess::start(&db.url, &config, &["--worker-id", "first"]);
    let job = db.store.enqueue(NewJob::new("demo.slow", json!([{"ms": 1500}]))).await.unwrap().job;
    let active = wait_state(&db.store, job.id, JobState::Active).await;
    assert_eq!(active.locked_by.as_deref(), Some("first"));
    first.kill9();

    let second = WorkerProcess::start(&db.url, &config, &["--worker-id", "second"]);
    let done = wait_state(&db.store, job.id, JobState::Completed).await;
    assert_eq!(done.attempt, 2);
    let attempts = db.store.attempts(job.id).await.unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    assert_eq!(attempts[0].attempt, 1);
    assert_eq!(attempts[0].worker_id.as_deref(), Some("first"));
    assert_eq!(attempts[0].error_type.as_deref(), Some("rebound.stalled"));
    assert_eq!(attempts[0].outcome, "retried");
    assert_eq!(attempts[1].attempt, 2);
    assert_eq!(attempts[1].worker_id.as_deref(), Some("second"));
    assert_eq!(attempts[1].outcome, "completed");
    drop(second);
}

#[tokio::test]
async fn a_policy_edit_applies_to_the_next_failure_without_a_restart() {
    let db = TestDb::new().await;
    put_policy(
        &db.store,
        "flip.flop",
        json!({"max_attempts": 3, "initial_interval": "PT2S", "backoff_strategy": "constant", "jitter": false, "on_exhaustion": "discard"}),
    )
    .await;
    let handlers = "[handlers.\"flip.flop\"]\nkind = \"exec\"\ncommand = [\"sh\", \"-c\", \"exit 75\"]\n";
    let mut worker = WorkerProcess::start(&db.url, &fast_config("", "default = 2", handlers), &[]);
    let job = db.store.enqueue(NewJob::new("flip.flop", json!([]))).await.unwrap().job;
    let first = eventually("the first failure", LONG, || async { db.store.attempts(job.id).await.ok().filter(|a| !a.is_empty()) }).await;
    assert_eq!(first[0].delay_ms, Some(2000), "the first failure uses the original policy");

    // Edited while the job waits for its retry, as an operator would from the dashboard.
    put_policy(
        &db.store,
        "flip.flop",
        json!({"max_attempts": 3, "initial_interval": "PT0.1S", "backoff_strategy": "constant", "jitter": false, "on_exhaustion": "dead_letter"}),
    )
    .await;
    let done = wait_state(&db.store, job.id, JobState::Discarded).await;
    assert!(done.dead_letter, "exhaustion follows the edited policy");
    let attempts = db.store.attempts(job.id).await.unwrap();
    assert_eq!(attempts.iter().map(|a| a.delay_ms).collect::<Vec<_>>(), vec![Some(2000), Some(100), None]);
    assert_eq!(attempts[1].policy.as_ref().unwrap()["initial_interval"], "PT0.1S");
    assert!(worker.running(), "no restart happened");
}

#[tokio::test]
async fn bad_config_names_the_key_and_exits_2() {
    let db = TestDb::new().await;
    let mut worker = WorkerProcess::start(&db.url, "[worker]\npoll_interval = \"often\"\n", &[]);
    let status = worker.exit_within(Duration::from_secs(20)).await.expect("exits at once");
    assert_eq!(status.code(), Some(2));
    let log = worker.log_text();
    assert!(log.contains("worker.poll_interval") && log.contains("often"), "{log}");

    let mut unknown = WorkerProcess::start(&db.url, "[handlers.\"a.b\"]\nkind = \"ftp\"\n", &[]);
    assert_eq!(unknown.exit_within(Duration::from_secs(20)).await.and_then(|s| s.code()), Some(2));
    assert!(unknown.log_text().contains("handlers.\"a.b\".kind"), "{}", unknown.log_text());
}

#[tokio::test]
async fn a_worker_newer_than_its_database_says_so_and_stops() {
    let db = TestDb::new().await;
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)").execute(db.store.pool()).await.unwrap();
    let config = fast_config("", "default = 1", "[handlers.\"x.y\"]\nkind = \"demo\"\nbehaviour = \"succeed\"\n");
    let mut worker = WorkerProcess::start(&db.url, &config, &[]);
    let status = worker.exit_within(Duration::from_secs(20)).await.expect("stops");
    assert_eq!(status.code(), Some(1));
    let log = worker.log_text();
    assert!(log.contains("1 migration(s) behind this worker") && log.contains("--migrate"), "{log}");
}

#[test]
fn check_config_accepts_the_example_and_rejects_a_missing_url() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/worker.example.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rebound-worker"))
        .args(["--config", example, "--check-config"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("handler email.send → exec"), "{stdout}");

    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/demo.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rebound-worker"))
        .args(["--config", demo, "--check-config", "--database-url", "postgres://localhost/rebound"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("handler demo.flaky → demo"));

    // No config file and no URL anywhere.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rebound-worker")).arg("--check-config").env_remove("DATABASE_URL").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("database.url"));
}

/// A systemd notification socket (`NOTIFY_SOCKET`) that a worker process reports to, and what
/// it has said so far.
struct NotifySocket {
    _scratch: Scratch,
    path: String,
    socket: std::os::unix::net::UnixDatagram,
    heard: String,
}

impl NotifySocket {
    fn new(name: &str) -> NotifySocket {
        let scratch = Scratch::new(name);
        let path = scratch.file("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        NotifySocket { path: path.display().to_string(), _scratch: scratch, socket, heard: String::new() }
    }

    /// Reads until the worker has said `needle` (30 s at most between messages).
    fn hear(&mut self, needle: &str) {
        let mut buf = [0u8; 4096];
        while !self.heard.contains(needle) {
            let n = self.socket.recv(&mut buf).unwrap_or_else(|e| panic!("no {needle} from the worker ({e}); heard: {}", self.heard));
            self.heard.push_str(&String::from_utf8_lossy(&buf[..n]));
            self.heard.push('\n');
        }
    }
}

#[tokio::test]
async fn systemd_hears_ready_watchdog_and_stopping() {
    let db = TestDb::new().await;
    let mut notify = NotifySocket::new("notify");
    let config = format!("{}\n[handlers.\"demo.succeed\"]\nkind = \"demo\"\n", fast_config("", "default = 1", ""));
    let mut worker = WorkerProcess::start_with_env(&db.url, &config, &[], &[("NOTIFY_SOCKET", &notify.path), ("WATCHDOG_USEC", "400000")]);
    notify.hear("READY=1");
    notify.hear("WATCHDOG=1");
    worker.signal("TERM");
    notify.hear("STOPPING=1");
    let status = worker.exit_within(Duration::from_secs(20)).await.expect("exits");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn an_operators_terminate_tells_systemd_it_is_stopping() {
    let db = TestDb::new().await;
    let mut notify = NotifySocket::new("notify-terminate");
    let config = format!("{}\n[handlers.\"demo.succeed\"]\nkind = \"demo\"\n", fast_config("heartbeat_interval = \"100ms\"", "default = 1", ""));
    let mut worker = WorkerProcess::start_with_env(&db.url, &config, &[], &[("NOTIFY_SOCKET", &notify.path)]);
    wait_registered(&db.store, &worker).await;
    let pid = worker.pid() as i32;
    let id = db.store.workers().await.unwrap().into_iter().find(|w| w.pid == pid).expect("registered").id;
    assert!(db.store.request_worker_state(&id, "terminate", &Actor::new("ops")).await.unwrap());
    notify.hear("STOPPING=1");
    assert_eq!(worker.exit_within(Duration::from_secs(20)).await.expect("exits").code(), Some(0));
}

#[tokio::test]
async fn a_worker_started_before_its_database_logs_every_wait_and_lives_on() {
    // A "database" that takes connections and hangs up at once: each try fails fast.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hangups = tokio::spawn(async move {
        loop {
            if let Ok((conn, _)) = listener.accept().await {
                drop(conn);
            }
        }
    });
    let config = fast_config("", "default = 1", "[handlers.\"x.y\"]\nkind = \"demo\"\nbehaviour = \"succeed\"\n");
    let url = format!("postgres://postgres@{addr}/nowhere?sslmode=disable");
    let mut worker = WorkerProcess::start(&url, &config, &[]);
    let waits = eventually("several logged waits", Duration::from_secs(30), || async {
        let log = worker.log_text();
        let waits: Vec<String> = log.lines().filter(|l| l.contains("next_try_at=")).map(str::to_string).collect();
        // The storage retry's quick tries, then the outage backoff's longer waits.
        (waits.len() >= 6 && waits.iter().any(|l| l.contains("waiting, then trying again"))).then_some(waits)
    })
    .await;
    assert!(waits.iter().all(|l| l.contains("register")), "{waits:?}");
    assert!(worker.running(), "the worker gave up:\n{}", worker.log_text());
    worker.signal("TERM");
    let status = worker.exit_within(Duration::from_secs(15)).await.expect("exits after SIGTERM while waiting");
    assert_eq!(status.code(), Some(0), "{}", worker.log_text());
    hangups.abort();
}

/// Keyed concurrency through the worker binary: twelve jobs of one key with a limit of two,
/// under a worker allowed eight at once. The handler logs when each run starts and ends: never
/// more than two overlap, all twelve run once, and unkeyed jobs on the same queue are not held.
#[tokio::test]
async fn a_rate_limit_key_caps_how_many_of_its_jobs_run_at_once() {
    let db = TestDb::new().await;
    let scratch = Scratch::new("keyed");
    let log = scratch.file("runs.log");
    let handler = |job_type: &str| {
        format!(
            r#"[handlers."{job_type}"]
kind = "exec"
command = ["sh", "-c", "echo \"$REBOUND_JOB_ID start $(date +%s%N)\" >> '{log}'; sleep 0.3; echo \"$REBOUND_JOB_ID end $(date +%s%N)\" >> '{log}'"]
"#,
            log = log.display()
        )
    };
    let config = fast_config("", "default = 8", &format!("{}{}", handler("keyed.call"), handler("free.call")));
    let mut jobs: Vec<NewJob> = (0..12).map(|i| NewJob::new("keyed.call", json!([i])).rate_limit("partner:w", Some(2))).collect();
    jobs.extend((0..6).map(|i| NewJob::new("free.call", json!([i]))));
    let enqueued = db.store.enqueue_batch(jobs).await.unwrap();
    let keyed: HashSet<Uuid> = enqueued.iter().filter(|e| e.job.rate_limit_key.is_some()).map(|e| e.job.id).collect();
    let mut worker = WorkerProcess::start(&db.url, &config, &[]);
    eventually("18 completed jobs", LONG, || async { (count_in_state(&db.store, "completed").await == 18).then_some(()) }).await;
    worker.signal("TERM");
    worker.exit_within(Duration::from_secs(30)).await.expect("worker exits");

    // Replay the log: the most keyed runs open at once, and the most runs of any kind.
    let mut events: Vec<(u128, i32, bool)> = lines(&log)
        .iter()
        .map(|l| {
            let parts: Vec<&str> = l.split(' ').collect();
            let id: Uuid = parts[0].parse().unwrap();
            (parts[2].parse::<u128>().unwrap(), if parts[1] == "start" { 1 } else { -1 }, keyed.contains(&id))
        })
        .collect();
    events.sort_by_key(|e| (e.0, e.1));
    let (mut open_keyed, mut open_all, mut most_keyed, mut most_all) = (0, 0, 0, 0);
    for (_, delta, is_keyed) in &events {
        open_all += delta;
        if *is_keyed {
            open_keyed += delta;
        }
        most_keyed = most_keyed.max(open_keyed);
        most_all = most_all.max(open_all);
    }
    assert_eq!(events.len(), 36, "every run started and ended once");
    assert_eq!(most_keyed, 2, "the key's limit, reached and never passed");
    assert!(most_all > 2, "unkeyed jobs ran beside them ({most_all} at once)");
}

/// An upstream's 429 with `Retry-After`, answered to the built-in `http` handler, holds the
/// job's rate-limit key until then (ojs-rate-limiting §9): the key's other jobs, enqueued
/// meanwhile, wait for it instead of each collecting a 429, and all of them run afterwards.
#[tokio::test]
async fn a_429_with_retry_after_holds_its_rate_limit_key() {
    let db = TestDb::new().await;
    let recorder = Recorder::start().await;
    let config = fast_config("", "default = 8", &recorder.handler("partner.call"));
    let call = |args: serde_json::Value| NewJob::new("partner.call", json!([args])).rate_limit("partner:h", Some(4));
    let first = db.store.enqueue(call(json!({"too_many_once": 2}))).await.unwrap().job.id;
    let mut worker = WorkerProcess::start(&db.url, &config, &[]);
    let held = eventually("the 429 to hold the key", LONG, || async {
        db.store.rate_limit_key("partner:h").await.ok().flatten().and_then(|k| k.held_until)
    })
    .await;
    let refused_at = recorder.executions_at().first().map(|c| c.2).expect("the first call");
    let others: HashSet<Uuid> = db.store.enqueue_batch((0..5).map(|i| call(json!({"n": i}))).collect()).await.unwrap().iter().map(|e| e.job.id).collect();
    eventually("all six completed", LONG, || async { (count_in_state(&db.store, "completed").await == 6).then_some(()) }).await;
    worker.signal("TERM");
    worker.exit_within(Duration::from_secs(30)).await.expect("worker exits");

    let calls = recorder.executions_at();
    assert_eq!(calls.len(), 7, "the 429, its job again, and the five others once each: {calls:?}");
    assert_eq!(calls.iter().filter(|c| c.0 == first).count(), 2);
    let earliest = calls.iter().filter(|c| others.contains(&c.0)).map(|c| c.2).min().expect("the others ran");
    // Retry-After is whole seconds from when the worker read the answer, after it was sent.
    assert!(earliest.duration_since(refused_at) >= Duration::from_millis(1900), "the key held for {:?} (until {held})", earliest.duration_since(refused_at));
    let adjusted = db.store.rate_limit_events(&rebound_queue::store::EventFilter { types: vec!["rate_limit.dynamic_adjusted".into()], limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(adjusted.len(), 1, "{adjusted:?}");
}

/// A claim that fails for a reason other than an outage (here a trigger that refuses every
/// claim) is retried on the outage backoff, not once per notification: the database keeps
/// notifying as jobs arrive, and a loop woken by each would retry, and log, as fast as they
/// come. Once the cause is gone the backed-off loop claims again and every job runs.
#[tokio::test]
async fn claims_failing_while_notifications_flow_back_off_instead_of_retrying_per_notification() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'claims refused by the test'; END $$;
         CREATE TRIGGER refuse_claims BEFORE UPDATE ON jobs FOR EACH ROW WHEN (NEW.state = 'active') EXECUTE FUNCTION refuse_claims();",
    )
    .execute(db.store.pool())
    .await
    .unwrap();
    let config = fast_config("", "default = 4", "[handlers.\"x.y\"]\nkind = \"demo\"\nbehaviour = \"succeed\"\n");
    let mut worker = WorkerProcess::start(&db.url, &config, &[]);
    wait_registered(&db.store, &worker).await;
    let failed_claims = |log: &str| log.lines().filter(|l| l.contains("claiming from queue default failed")).count();
    // 120 jobs, one per enqueue, over about three seconds: 120 notifications.
    for i in 0..120 {
        db.store.enqueue(NewJob::new("x.y", json!([i]))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let during = failed_claims(&worker.log_text());
    assert!(during >= 1, "the claims did fail:\n{}", worker.log_text());
    assert!(during <= 20, "{during} failed claims in 3 s of notifications: retried per notification, not backed off");
    assert_eq!(count_in_state(&db.store, "available").await, 120);
    sqlx::raw_sql("DROP TRIGGER refuse_claims ON jobs").execute(db.store.pool()).await.unwrap();
    eventually("all 120 jobs completed", LONG, || async { (count_in_state(&db.store, "completed").await == 120).then_some(()) }).await;
    assert!(worker.log_text().contains("claims work again"), "{}", worker.log_text());
    worker.signal("TERM");
    assert_eq!(worker.exit_within(Duration::from_secs(20)).await.expect("exits").code(), Some(0));
}
