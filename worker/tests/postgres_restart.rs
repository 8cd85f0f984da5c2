//! Two workers ride out a restart of their Postgres (a private cluster started for this
//! test), and then a 3-second outage, while 2 000 jobs run: every job completes exactly
//! once, none is lost, and neither worker exits.

mod support;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use rebound_queue::testing::{is_root, pg_bin};
use rebound_queue::{NewJob, Store};
use serde_json::json;
use sqlx::Connection;
use sqlx::Row;
use support::{Scratch, WorkerProcess, eventually, fast_config, lines, recording_handler};
use uuid::Uuid;

const JOBS: usize = 2_000;

/// A Postgres cluster of our own on a free port, stopped and deleted on drop.
struct PrivateCluster {
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl PrivateCluster {
    fn start() -> PrivateCluster {
        let dir = std::env::temp_dir().join(format!("rebound-restart-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let as_postgres = is_root();
        if as_postgres {
            // initdb refuses to run as root.
            assert!(Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().unwrap().success());
        }
        let cluster = PrivateCluster { dir, port: free_port(), as_postgres };
        let data = cluster.data();
        cluster.run(&[&pg_bin("initdb").display().to_string(), "-D", &data, "-A", "trust", "-U", "postgres"]);
        cluster.pg_ctl(&["start"]);
        cluster
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn run(&self, args: &[&str]) {
        let status = if self.as_postgres {
            // initdb's progress report is noise in test output.
            let line = args.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(" ");
            Command::new("su").args(["postgres", "-s", "/bin/sh", "-c", &line]).stdout(Stdio::null()).status()
        } else {
            Command::new(args[0]).args(&args[1..]).stdout(Stdio::null()).status()
        };
        assert!(status.unwrap().success(), "{args:?} failed (see {}/pg.log)", self.dir.display());
    }

    fn pg_ctl(&self, action: &[&str]) {
        let data = self.data();
        let opts = format!("-p {} -k {} -c listen_addresses=127.0.0.1", self.port, self.dir.display());
        let log = self.dir.join("pg.log").display().to_string();
        let mut args = vec![pg_bin("pg_ctl").display().to_string(), "-D".into(), data, "-o".into(), opts, "-l".into(), log, "-w".into()];
        args.extend(action.iter().map(|a| a.to_string()));
        self.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let data = self.data();
        let pg_ctl = pg_bin("pg_ctl").display().to_string();
        let args = [pg_ctl.as_str(), "-D", &data, "-m", "immediate", "-w", "stop"];
        if self.as_postgres {
            let line = args.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(" ");
            let _ = Command::new("su").args(["postgres", "-s", "/bin/sh", "-c", &line]).status();
        } else {
            let _ = Command::new(args[0]).args(&args[1..]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn completed(store: &Store) -> Option<i64> {
    sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'completed'").fetch_one(store.pool()).await.ok()
}

async fn postmaster_started(url: &str) -> String {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar("SELECT pg_postmaster_start_time()::text").fetch_one(&mut conn).await.unwrap()
}

#[tokio::test]
async fn workers_ride_out_a_postgres_restart_without_losing_or_repeating_work() {
    let cluster = PrivateCluster::start();
    {
        let mut admin = sqlx::PgConnection::connect(&cluster.url("postgres")).await.unwrap();
        sqlx::query("CREATE DATABASE rebound").execute(&mut admin).await.unwrap();
    }
    let url = cluster.url("rebound");
    let store = Store::connect(&url, 4).await.unwrap();
    store.migrate().await.unwrap();

    let scratch = Scratch::new("restart");
    let executions = scratch.file("executions.log");
    let config = fast_config(
        // A claim whose answer is lost in the restart is rescued after this.
        "visibility_timeout = \"10s\"\nheartbeat_interval = \"1s\"",
        "default = 8",
        &recording_handler("record.restart", &executions, "0.01"),
    );
    let jobs: Vec<NewJob> = (0..JOBS).map(|i| NewJob::new("record.restart", json!([i]))).collect();
    let ids: HashSet<Uuid> = store.enqueue_batch(jobs).await.unwrap().into_iter().map(|e| e.job.id).collect();

    let mut workers = [WorkerProcess::start(&url, &config, &["--worker-id", "one"]), WorkerProcess::start(&url, &config, &["--worker-id", "two"])];
    let at_restart = eventually("work to be under way", Duration::from_secs(60), || async {
        completed(&store).await.filter(|n| *n >= 300)
    })
    .await;
    let before = postmaster_started(&url).await;
    cluster.pg_ctl(&["-m", "fast", "restart"]);
    let after = postmaster_started(&url).await;
    assert_ne!(before, after, "the server really restarted");
    assert!(at_restart < JOBS as i64, "the restart happened mid-run ({at_restart} done)");

    // A longer outage too: longer than the storage retries last, so results have to be kept
    // and written later, and claims back off until the server is back.
    let at_stop = eventually("more work done", Duration::from_secs(60), || async { completed(&store).await.filter(|n| *n >= 1000) }).await;
    cluster.pg_ctl(&["-m", "fast", "stop"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.pg_ctl(&["start"]);
    assert!(at_stop < JOBS as i64, "the outage happened mid-run ({at_stop} done)");

    eventually("every job to complete", Duration::from_secs(120), || async { completed(&store).await.filter(|n| *n == JOBS as i64) }).await;

    for w in &mut workers {
        assert!(w.running(), "a worker exited during the outage:\n{}", w.log_text());
    }
    let noticed = workers.iter().any(|w| {
        let log = w.log_text();
        log.contains("transient storage error") || log.contains("failed") || log.contains("lost")
    });
    assert!(noticed, "neither worker saw the outage");

    // Each job ran exactly once, as its command recorded it…
    let recorded = lines(&executions);
    let ran: Vec<Uuid> = recorded.iter().map(|l| l.split(' ').next().unwrap().parse().unwrap()).collect();
    let distinct: HashSet<Uuid> = ran.iter().copied().collect();
    assert_eq!(distinct, ids, "every job ran");
    assert_eq!(ran.len(), JOBS, "no job ran twice");
    // …and completed exactly once, as the store recorded it.
    let per_job = sqlx::query(
        "SELECT count(*) FILTER (WHERE n <> 1) AS wrong, count(*) AS jobs FROM
           (SELECT job_id, count(*) FILTER (WHERE outcome = 'completed') AS n FROM job_history GROUP BY job_id) t",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(per_job.get::<i64, _>("jobs"), JOBS as i64);
    assert_eq!(per_job.get::<i64, _>("wrong"), 0, "a job completed more or less than once");
    // The only other attempt a restart may leave is a claim whose answer was lost with the
    // connection: that attempt never ran, and the rescuer recorded it as stalled.
    let others: Vec<(String, Option<String>)> = sqlx::query_as("SELECT outcome, error_type FROM job_attempts WHERE outcome <> 'completed'")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert!(others.iter().all(|(_, t)| t.as_deref() == Some("rebound.stalled")), "{others:?}");

    for w in &mut workers {
        w.signal("TERM");
    }
    for w in &mut workers {
        let status = w.exit_within(Duration::from_secs(30)).await.expect("exits after SIGTERM");
        assert_eq!(status.code(), Some(0), "{}", w.log_text());
    }
    drop(workers);
    drop(cluster);
}
