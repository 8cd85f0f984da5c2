//! Running the real `rebound-worker` binary in tests: config files, signals, waiting.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A scratch directory removed on drop.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let path = std::env::temp_dir().join(format!("rebound-worker-test-{tag}-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).expect("create scratch dir");
        Scratch { path }
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Test-speed settings: short intervals everywhere, pruning off. `extra` is appended (queues,
/// handlers, overrides of these sections' keys are not allowed twice, so tests pass the
/// sections they need in full).
pub fn fast_config(worker: &str, queues: &str, handlers: &str) -> String {
    format!(
        r#"
[worker]
poll_interval = "200ms"
completer_flush_interval = "2ms"
{worker}

[maintenance]
leader_retry = "200ms"
leader_check = "200ms"
scheduler_interval = "50ms"
rescuer_interval = "200ms"
expirer_interval = "1s"

[prune]
enabled = false

[queues]
{queues}

{handlers}
"#
    )
}

/// A spawned worker process; killed on drop if still running.
pub struct WorkerProcess {
    child: Child,
    pub log: PathBuf,
    pub config: PathBuf,
    _scratch: Scratch,
}

impl WorkerProcess {
    /// Starts `rebound-worker --config <config>` against `database_url`.
    pub fn start(database_url: &str, config: &str, args: &[&str]) -> WorkerProcess {
        Self::start_with_env(database_url, config, args, &[])
    }

    pub fn start_with_env(database_url: &str, config: &str, args: &[&str], env: &[(&str, &str)]) -> WorkerProcess {
        let scratch = Scratch::new("proc");
        let config_path = scratch.file("worker.toml");
        std::fs::write(&config_path, config).expect("write config");
        let log = scratch.file("worker.log");
        let log_file = std::fs::File::create(&log).expect("create log");
        let child = Command::new(env!("CARGO_BIN_EXE_rebound-worker"))
            .arg("--config")
            .arg(&config_path)
            .args(args)
            .env("DATABASE_URL", database_url)
            .env("RUST_LOG", "info,rebound_worker=debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .spawn()
            .expect("spawn rebound-worker");
        WorkerProcess { child, log, config: config_path, _scratch: scratch }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.pid().to_string()).status().expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        self.child.kill().expect("kill -9");
        let _ = self.child.wait();
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `within` for the process to exit.
    pub async fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- worker {} log ----\n{}", self.child.id(), self.log_text());
        }
    }
}

/// Polls `check` until it yields `Some`, or panics with `what` after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lines of a file, or none if it does not exist yet.
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).map(|s| s.lines().map(str::to_string).collect()).unwrap_or_default()
}

/// An exec handler section that appends "<job id> <attempt>" to `log`, after sleeping `sleep`
/// seconds (a shell number, e.g. "0" or "0.02").
pub fn recording_handler(job_type: &str, log: &Path, sleep: &str) -> String {
    format!(
        r#"[handlers."{job_type}"]
kind = "exec"
command = ["sh", "-c", "sleep {sleep}; echo \"$REBOUND_JOB_ID $REBOUND_JOB_ATTEMPT\" >> '{}'"]
"#,
        log.display()
    )
}

type Calls = std::sync::Arc<std::sync::Mutex<Vec<(uuid::Uuid, i32, std::time::Instant)>>>;

/// An HTTP endpoint for the `http` handler that records every execution it is sent and answers
/// as the job's args ask: `{"fail_attempts": n, "sleep_ms": m}` fails (500) attempts 1..=n and
/// completes later ones, each after `m` ms; `{"too_many_once": s}` answers a job's first call
/// 429 with `Retry-After: s`.
pub struct Recorder {
    pub url: String,
    calls: Calls,
    server: tokio::task::JoinHandle<()>,
}

impl Recorder {
    pub async fn start() -> Recorder {
        use axum::Json;
        use axum::extract::State;
        use axum::http::{HeaderMap, HeaderValue, StatusCode};
        async fn run(State(calls): State<Calls>, Json(job): Json<serde_json::Value>) -> (StatusCode, HeaderMap, Json<serde_json::Value>) {
            let id: uuid::Uuid = job["id"].as_str().and_then(|s| s.parse().ok()).unwrap_or_default();
            let attempt = job["attempt"].as_i64().unwrap_or(0) as i32;
            let first = {
                let mut calls = calls.lock().unwrap();
                let first = !calls.iter().any(|c| c.0 == id);
                calls.push((id, attempt, std::time::Instant::now()));
                first
            };
            let args = &job["args"][0];
            if let Some(ms) = args["sleep_ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if let (true, Some(s)) = (first, args["too_many_once"].as_u64()) {
                let mut headers = HeaderMap::new();
                headers.insert("retry-after", HeaderValue::from(s));
                return (StatusCode::TOO_MANY_REQUESTS, headers, Json(serde_json::json!({"error": "slow down"})));
            }
            if i64::from(attempt) <= args["fail_attempts"].as_i64().unwrap_or(0) {
                (StatusCode::INTERNAL_SERVER_ERROR, HeaderMap::new(), Json(serde_json::json!({"error": "asked to fail"})))
            } else {
                (StatusCode::OK, HeaderMap::new(), Json(serde_json::json!({"ok": true})))
            }
        }
        let calls: Calls = Default::default();
        let app = axum::Router::new().route("/run", axum::routing::post(run)).with_state(calls.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the recorder");
        let url = format!("http://{}/run", listener.local_addr().expect("recorder address"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Recorder { url, calls, server }
    }

    /// A handler section sending `job_type` here.
    pub fn handler(&self, job_type: &str) -> String {
        format!("[handlers.\"{job_type}\"]\nkind = \"http\"\nurl = \"{}\"\nrequest_timeout = \"60s\"\n", self.url)
    }

    /// Every execution so far, as (job id, attempt), in the order they started.
    pub fn executions(&self) -> Vec<(uuid::Uuid, i32)> {
        self.calls.lock().unwrap().iter().map(|c| (c.0, c.1)).collect()
    }

    /// Every execution so far with when it reached the endpoint, in that order.
    pub fn executions_at(&self) -> Vec<(uuid::Uuid, i32, std::time::Instant)> {
        self.calls.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// How long a session may sit idle inside a transaction before a test calls it abandoned.
/// An abandoned one sits there until the server's idle-in-transaction timeout (10 s) or for
/// good; a live one can sit a second or so while a loaded machine stalls the worker or the
/// fault proxy between two statements.
pub const IDLE_IN_TRANSACTION_LIMIT: Duration = Duration::from_secs(3);

/// Watches `pg_stat_activity` of one database for sessions idle inside a transaction, the
/// trace of a transaction abandoned by a cancelled caller (and the cause of row locks nobody
/// can take). [`TransactionWatch::worst`] is the longest such idle time seen.
pub struct TransactionWatch {
    worst_ms: std::sync::Arc<std::sync::atomic::AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

impl TransactionWatch {
    pub fn start(admin_url: &str, database: &str) -> TransactionWatch {
        let worst_ms = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
        let (worst, url, db) = (worst_ms.clone(), admin_url.to_string(), database.to_string());
        let task = tokio::spawn(async move {
            use sqlx::Connection;
            loop {
                // Reconnects across database restarts; a failed sample is simply skipped.
                if let Ok(mut conn) = sqlx::PgConnection::connect(&url).await {
                    loop {
                        let sample: Result<Option<i64>, _> = sqlx::query_scalar(
                            "SELECT (extract(epoch FROM max(now() - state_change)) * 1000)::int8 FROM pg_stat_activity
                             WHERE datname = $1 AND state LIKE 'idle in transaction%'",
                        )
                        .bind(&db)
                        .fetch_one(&mut conn)
                        .await;
                        match sample {
                            Ok(ms) => {
                                worst.fetch_max(ms.unwrap_or(0), std::sync::atomic::Ordering::SeqCst);
                            }
                            Err(_) => break,
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        TransactionWatch { worst_ms, task }
    }

    /// The longest time a session of the database was seen idle inside a transaction.
    pub fn worst(&self) -> Duration {
        Duration::from_millis(self.worst_ms.load(std::sync::atomic::Ordering::SeqCst).max(0) as u64)
    }
}

impl Drop for TransactionWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connection to `cluster`'s `postgres` database, waiting (up to 10 s) for it to answer.
pub async fn admin(cluster: &rebound_queue::testing::PrivateCluster) -> sqlx::PgConnection {
    use sqlx::Connection;
    for _ in 0..100 {
        if let Ok(c) = sqlx::PgConnection::connect(&cluster.url("postgres")).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the cluster does not answer");
}
