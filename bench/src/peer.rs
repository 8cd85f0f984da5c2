//! The peer-comparison contract of `../shared/bench` (see its README): the same modes as the
//! graphile-worker and pg-boss harnesses, so `bench/compare.sh` can measure Rebound on the
//! same cluster, with the same job shape (type `noop`, args `[{"i": n}]`: OJS args are an
//! array, holding the peers' `{"i": n}` payload; queue `default`), in
//! the same rounds, and bracket it with the same CPU and WAL counters. Each measured mode
//! prints one `RESULT {json}` line.
//!
//! Work is done by the real `rebound-worker` binary at its defaults (one process or several),
//! not by the library in process: the figure is what an operator gets. The time is read from
//! the database: first claim to last completion, as the peers measure it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rebound_queue::policy::PolicyPatch;
use rebound_queue::store::{Actor, ClaimRequest, Completion};
use rebound_queue::{NewJob, Store};
use serde_json::json;
use sqlx::Row;

#[derive(clap::Subcommand, Debug)]
pub enum PeerMode {
    /// Drop and re-create Rebound's schema.
    Reset,
    /// Enqueue N no-op jobs, B per call (the store's batch enqueue, as the API's batch uses it).
    AddBatch { n: usize, batch: usize },
    /// Enqueue N jobs as fast as possible, untimed (`--fail-once`: each fails its first attempt).
    Preload {
        n: usize,
        #[arg(long)]
        fail_once: bool,
    },
    /// Run P `rebound-worker` processes at their defaults until N jobs are completed.
    Process {
        n: usize,
        #[arg(long, default_value_t = 1)]
        processes: usize,
        /// The jobs fail their first attempt and are retried after this backoff, through the
        /// queue (preload them with `--fail-once`).
        #[arg(long)]
        backoff: Option<String>,
    },
    /// Enqueue → handler start on an idle worker: N jobs enqueued one at a time, spaced.
    Latency { n: usize },
    /// The store's own claim and batch completion in C loops of B jobs until N are completed,
    /// with no worker around them: what the `jobs` table and its statements cost, apart from
    /// the worker runtime. `--strip` first removes parts of the table, to price each one
    /// (the schema is left broken: `reset` afterwards).
    StoreLoop {
        n: usize,
        #[arg(long, default_value_t = 4)]
        clients: usize,
        #[arg(long, default_value_t = 500)]
        batch: u32,
        #[arg(long, value_enum, value_delimiter = ',')]
        strip: Vec<Strip>,
    },
}

/// What `store-loop --strip` removes from the `jobs` table.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strip {
    /// `jobs_listed`: the dashboard's listing entry a completion adds.
    Listing,
    /// `jobs_locked`: the rescuer's entry a claim adds.
    Locked,
    /// Every secondary index but the claim's (`jobs_claimable`).
    Indexes,
    /// The statement triggers (counters, the transition log, workflows, rate limits).
    Triggers,
}

impl Strip {
    fn sql(self) -> &'static str {
        match self {
            Strip::Listing => "DROP INDEX jobs_listed",
            Strip::Locked => "DROP INDEX jobs_locked",
            Strip::Indexes => {
                "DO $$ DECLARE r record; BEGIN
                   FOR r IN SELECT indexrelid::regclass::text AS name FROM pg_index
                            WHERE indrelid = 'jobs'::regclass AND NOT indisprimary AND indexrelid::regclass::text <> 'jobs_claimable'
                   LOOP EXECUTE format('DROP INDEX %I', r.name); END LOOP; END $$"
            }
            Strip::Triggers => "ALTER TABLE jobs DISABLE TRIGGER USER",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct PeerArgs {
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// The worker binary (a release build for figures).
    #[arg(long, default_value = "target/release/rebound-worker")]
    pub worker_bin: PathBuf,
    #[command(subcommand)]
    pub mode: PeerMode,
}

const NOOP: &str = "noop";
const FLAKY: &str = "noop.flaky";

fn result(v: serde_json::Value) {
    println!("RESULT {v}");
}

pub async fn run(args: PeerArgs) -> anyhow::Result<()> {
    let store = Store::connect(&args.database_url, 8).await.context("connecting to the database")?;
    match args.mode {
        PeerMode::Reset => {
            sqlx::query("DROP SCHEMA public CASCADE").execute(store.pool()).await?;
            sqlx::query("CREATE SCHEMA public").execute(store.pool()).await?;
            store.migrate().await?;
        }
        PeerMode::AddBatch { n, batch } => {
            // Warm the connection and the statement, as the peers' harnesses do.
            store.enqueue_batch(vec![NewJob::new(NOOP, json!([{"i": -1}]))]).await?;
            sqlx::query("TRUNCATE jobs, job_attempts").execute(store.pool()).await?;
            let started = Instant::now();
            let mut i = 0;
            while i < n {
                let k = batch.min(n - i);
                store.enqueue_batch((i..i + k).map(|i| NewJob::new(NOOP, json!([{"i": i}]))).collect()).await?;
                i += k;
            }
            let secs = started.elapsed().as_secs_f64();
            result(json!({"jobs": n, "seconds": secs, "jobs_per_s": n as f64 / secs, "batch": batch}));
        }
        PeerMode::Preload { n, fail_once } => {
            let (job_type, extra) = if fail_once { (FLAKY, json!({"fail_attempts": 1})) } else { (NOOP, json!({})) };
            let mut i = 0;
            while i < n {
                let k = 5_000.min(n - i);
                let jobs = (i..i + k)
                    .map(|i| {
                        let mut args = json!({"i": i});
                        if let (Some(a), Some(e)) = (args.as_object_mut(), extra.as_object()) {
                            a.extend(e.clone());
                        }
                        NewJob::new(job_type, json!([args]))
                    })
                    .collect();
                store.enqueue_batch(jobs).await?;
                i += k;
            }
            sqlx::query("VACUUM ANALYZE jobs").execute(store.pool()).await?;
        }
        PeerMode::Process { n, processes, backoff } => process(&args.database_url, &args.worker_bin, &store, n, processes, backoff).await?,
        PeerMode::Latency { n } => latency(&args.database_url, &args.worker_bin, &store, n).await?,
        PeerMode::StoreLoop { n, clients, batch, strip } => store_loop(&args.database_url, &store, n, clients, batch, &strip).await?,
    }
    Ok(())
}

/// A config for the worker binary: its defaults, the two no-op types, no pruning. For
/// experiments (never the comparison's figures, which are at the defaults), the TOML in
/// `REBOUND_BENCH_WORKER_TOML` is put first, e.g. `[worker]\nclaim_batch_max = 1000`.
fn worker_config(dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("bench-worker.toml");
    let extra = std::env::var("REBOUND_BENCH_WORKER_TOML").unwrap_or_default();
    std::fs::write(
        &path,
        format!("{extra}\n[prune]\nenabled = false\n\n[handlers.\"{NOOP}\"]\nkind = \"demo\"\nbehaviour = \"noop\"\n\n[handlers.\"{FLAKY}\"]\nkind = \"demo\"\nbehaviour = \"flaky\"\n"),
    )?;
    Ok(path)
}

struct Workers(Vec<tokio::process::Child>);

impl Workers {
    fn start(url: &str, bin: &std::path::Path, count: usize) -> anyhow::Result<Workers> {
        let dir = std::env::temp_dir().join(format!("rebound-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let config = worker_config(&dir)?;
        let mut children = Vec::new();
        for _ in 0..count {
            let child = tokio::process::Command::new(bin)
                .arg("--config")
                .arg(&config)
                .env("DATABASE_URL", url)
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {} (build it with cargo build --release -p rebound-worker)", bin.display()))?;
            children.push(child);
        }
        Ok(Workers(children))
    }

    async fn stop(mut self) {
        for c in &mut self.0 {
            if let Some(pid) = c.id() {
                let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
            }
        }
        for c in &mut self.0 {
            let _ = tokio::time::timeout(Duration::from_secs(30), c.wait()).await;
        }
    }
}

// Read from the maintained counters, as the dashboard does: a `count(*)` over the completed
// jobs every poll cost Postgres a tenth of a core by the end of a 100 000-job run, CPU the run
// itself then lacked (the peers' harnesses poll nothing; their workers count what they ran).
async fn completed(store: &Store) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT COALESCE(sum(n), 0)::bigint FROM job_count_totals WHERE state = 'completed'").fetch_one(store.pool()).await?)
}

async fn store_loop(url: &str, store: &Store, n: usize, clients: usize, batch: u32, strip: &[Strip]) -> anyhow::Result<()> {
    for part in strip {
        sqlx::query(part.sql()).execute(store.pool()).await.with_context(|| format!("stripping {part:?}"))?;
    }
    let loops = Store::connect(url, clients as u32 + 1).await.context("connecting the loops")?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let store = loops.clone();
        let req = ClaimRequest { worker_id: format!("store-loop-{c}"), queues: vec!["default".into()], limit: batch, visibility_timeout: Duration::from_secs(30) };
        tasks.spawn(async move {
            let mut done = 0usize;
            loop {
                let jobs = store.claim(&req).await?;
                if jobs.is_empty() {
                    return Ok::<_, anyhow::Error>(done);
                }
                // As the worker's completer writes them: each names its attempt, run and worker.
                let results: Vec<Completion> = jobs
                    .iter()
                    .map(|j| Completion { id: j.id, attempt: Some(j.attempt), worker_id: Some(req.worker_id.clone()), started_at: j.started_at, result: None })
                    .collect();
                done += store.complete_batch(&results).await?.len();
            }
        });
    }
    let mut done = 0;
    while let Some(r) = tasks.join_next().await {
        done += r??;
    }
    let secs = started.elapsed().as_secs_f64();
    if done < n {
        bail!("only {done} of {n} jobs were completed");
    }
    let strip: Vec<String> = strip.iter().map(|s| format!("{s:?}").to_lowercase()).collect();
    result(json!({"jobs": done, "seconds": secs, "jobs_per_s": done as f64 / secs, "clients": clients, "batch": batch, "strip": strip.join("+")}));
    Ok(())
}

async fn process(url: &str, bin: &std::path::Path, store: &Store, n: usize, processes: usize, backoff: Option<String>) -> anyhow::Result<()> {
    if let Some(interval) = &backoff {
        let patch = PolicyPatch::from_json(&json!({
            "max_attempts": 3, "initial_interval": interval, "backoff_strategy": "constant", "jitter": false
        }))?;
        store.put_policy(FLAKY, &patch, &Actor::system("bench"), None).await?;
    }
    let workers = Workers::start(url, bin, processes)?;
    let deadline = Instant::now() + Duration::from_secs(600);
    // Polled slowly: the bench's own queries should not take CPU from the run.
    while (completed(store).await? as usize) < n {
        if Instant::now() > deadline {
            bail!("not every job completed within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    workers.stop().await;
    let row = sqlx::query(
        "SELECT EXTRACT(EPOCH FROM (max(completed_at) - (SELECT min(started_at) FROM job_history)))::float8 AS secs,
                count(*) FILTER (WHERE attempt > 1) AS retried
         FROM jobs WHERE state = 'completed'",
    )
    .fetch_one(store.pool())
    .await?;
    let secs: f64 = row.try_get("secs")?;
    let retried: i64 = row.try_get("retried")?;
    result(json!({"jobs": n, "seconds": secs, "jobs_per_s": n as f64 / secs, "processes": processes,
                  "backoff": backoff, "retried": retried}));
    Ok(())
}

async fn latency(url: &str, bin: &std::path::Path, store: &Store, n: usize) -> anyhow::Result<()> {
    let workers = Workers::start(url, bin, 1)?;
    // Idle and listening before the first job.
    let registered = Instant::now() + Duration::from_secs(30);
    while store.workers().await?.is_empty() {
        if Instant::now() > registered {
            bail!("the worker did not register");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..n {
        store.enqueue(NewJob::new(NOOP, json!([{"i": i}]))).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while (completed(store).await? as usize) < n {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    workers.stop().await;
    // Both ends on the database's clock: the enqueue's insert and the claim that started it.
    let row = sqlx::query(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50, percentile_cont(0.95) WITHIN GROUP (ORDER BY ms) AS p95
         FROM (SELECT EXTRACT(EPOCH FROM (started_at - created_at)) * 1000 AS ms FROM jobs) t",
    )
    .fetch_one(store.pool())
    .await?;
    let (p50, p95): (f64, f64) = (row.try_get("p50")?, row.try_get("p95")?);
    result(json!({"jobs": n, "seconds": 0, "jobs_per_s": 0, "p50_ms": p50, "p95_ms": p95}));
    Ok(())
}
