//! `rebound-bench`: figures, run by hand, never by the tests.
//!
//! * `throughput`: enqueue, work and the fail path, each beside the raw-SQL ceiling for the
//!   same workload measured in the same run. Creates (and drops) its own database.
//! * `dashboard`: seeds 1 000 000 jobs and 100 000 dead letters into a server's database and
//!   measures server-side render times of the busiest pages.
//!
//! ```text
//! cargo run --release -p rebound-bench -- throughput --jobs 100000
//! cargo run --release -p rebound-bench -- dashboard --seed --url http://127.0.0.1:3000 --user admin --password …
//! ```

mod ceiling;
mod dashboard;
mod work;

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use rebound_queue::{NewJob, Store};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

#[derive(Parser, Debug)]
#[command(about = "Rebound benchmarks (figures, not tests)")]
enum Command {
    /// Enqueue, worker and fail-path throughput against raw-SQL ceilings.
    Throughput(Args),
    /// Server-side render times of the dashboard on a large database.
    Dashboard(DashboardArgs),
}

#[derive(clap::Args, Debug)]
struct DashboardArgs {
    /// The database the server uses (seeded with --seed).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The running server.
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    url: String,
    #[arg(long, default_value = "admin")]
    user: String,
    #[arg(long)]
    password: String,
    /// Insert 1 000 000 jobs (100 000 dead letters) first.
    #[arg(long)]
    seed: bool,
    #[arg(long, default_value_t = 1_000_000)]
    jobs: i64,
    #[arg(long, default_value_t = 100_000)]
    dead_letters: i64,
    /// Requests per page.
    #[arg(long, default_value_t = 200)]
    requests: usize,
}

#[derive(clap::Args, Debug)]
struct Args {
    /// Any database on the server to use; the benchmark creates `rebound_bench` beside it.
    #[arg(long, env = "DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    database_url: String,
    /// Jobs per phase.
    #[arg(long, default_value_t = 100_000)]
    jobs: usize,
    /// Rows per enqueue batch.
    #[arg(long, default_value_t = 1_000)]
    enqueue_batch: usize,
    /// Worker concurrency (handler slots); the worker's default when unset.
    #[arg(long)]
    concurrency: Option<usize>,
}

struct Figure {
    name: &'static str,
    jobs_per_sec: f64,
    ceiling: Option<(&'static str, f64)>,
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Command::parse() {
        Command::Throughput(args) => throughput(args).await,
        Command::Dashboard(args) => {
            let store = Store::connect(&args.database_url, 4).await?;
            if args.seed {
                let started = std::time::Instant::now();
                dashboard::seed(store.pool(), args.jobs, args.dead_letters).await?;
                println!("seeded {} jobs ({} dead letters) in {:.1?}", args.jobs, args.dead_letters, started.elapsed());
            }
            let dash = dashboard::Dashboard::login(&args.url, &args.user, &args.password).await?;
            if !dashboard::measure(store.pool(), &dash, args.requests).await? {
                println!("some pages are over the 50 ms p95 budget");
            }
            Ok(())
        }
    }
}

async fn throughput(args: Args) -> anyhow::Result<()> {
    let admin: PgConnectOptions = args.database_url.parse().context("--database-url must be a postgres:// URL")?;
    let db = "rebound_bench";
    let mut conn = PgConnection::connect_with(&admin).await.context("connecting to the server")?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))).execute(&mut conn).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}"))).execute(&mut conn).await?;
    let url = format!("postgres://{}@{}:{}/{db}", admin.get_username(), admin.get_host(), admin.get_port());
    let store = Store::connect(&url, 20).await?;
    store.migrate().await?;
    let pool = store.pool().clone();
    let n = args.jobs;
    let truncate = || async { sqlx::query("TRUNCATE jobs, job_attempts").execute(&pool).await.map(|_| ()) };
    let sync_commit: String = sqlx::query_scalar("SHOW synchronous_commit").fetch_one(&pool).await?;
    println!("rebound-bench: {n} jobs per phase, synchronous_commit = {sync_commit}");

    // Enqueue: multi-row INSERT ceiling, then the store's batch enqueue.
    let raw_insert = rate(n, ceiling::insert_ceiling(&pool, n, args.enqueue_batch).await?);
    truncate().await?;
    let started = std::time::Instant::now();
    let mut left = n;
    while left > 0 {
        let k = left.min(args.enqueue_batch);
        store.enqueue_batch((0..k).map(|_| NewJob::new("bench.noop", serde_json::json!([])).queue("bench")).collect()).await?;
        left -= k;
    }
    let enqueue = rate(n, started.elapsed());

    // Work ceiling: best of a few raw-SQL configurations.
    let mut best_ceiling = 0.0f64;
    let mut best_config = String::new();
    for (clients, batch) in [(4usize, 100i64), (4, 1000), (8, 100)] {
        truncate().await?;
        ceiling::insert_ceiling(&pool, n, 5_000).await?;
        let r = rate(n, ceiling::work_ceiling(&pool, clients, batch).await?);
        println!("  raw SQL claim+complete, {clients} clients × batch {batch}: {r:>9.0} jobs/s");
        if r > best_ceiling {
            best_ceiling = r;
            best_config = format!("{clients} clients × batch {batch}");
        }
    }

    // The worker: first claim to last completion.
    truncate().await?;
    ceiling::insert_ceiling(&pool, n, 5_000).await?;
    let worked = rate(n, work::run_worker(&store, n, args.concurrency, false).await?);

    // The fail path: every job fails once, then succeeds.
    truncate().await?;
    ceiling::insert_ceiling(&pool, n, 5_000).await?;
    let fail_path = rate(n, work::run_worker(&store, n, args.concurrency, true).await?);

    let figures = [
        Figure { name: "enqueue (batch)", jobs_per_sec: enqueue, ceiling: Some(("multi-row INSERT", raw_insert)) },
        Figure { name: "worker (no-op jobs)", jobs_per_sec: worked, ceiling: Some(("best raw SQL", best_ceiling)) },
        Figure { name: "fail path (fail once, then succeed)", jobs_per_sec: fail_path, ceiling: Some(("worker complete path", worked)) },
    ];
    println!("\nresults (best raw-SQL work configuration: {best_config}):");
    for f in &figures {
        match f.ceiling {
            Some((what, c)) => println!(
                "  {:<38} {:>9.0} jobs/s   {:>5.1} % of {what} ({c:.0} jobs/s)",
                f.name,
                f.jobs_per_sec,
                100.0 * f.jobs_per_sec / c.max(1e-9)
            ),
            None => println!("  {:<38} {:>9.0} jobs/s", f.name, f.jobs_per_sec),
        }
    }
    drop(store);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))).execute(&mut conn).await?;
    Ok(())
}
