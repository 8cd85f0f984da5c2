//! `rebound-bench`: figures, run by hand, never by the tests.
//!
//! * `throughput`: enqueue, work and the fail path, each beside the raw-SQL ceiling for the
//!   same workload measured in the same run. Creates (and drops) its own database.
//! * `dashboard`: seeds 10 000 000 jobs and 1 000 000 dead letters into a server's database
//!   and measures server-side render times of every page, filter and search.
//! * `peer`: the modes of `../shared/bench`'s peer contract, driven by `bench/compare.sh`,
//!   which prints Rebound beside graphile-worker and the raw-SQL ceiling on one cluster.
//!
//! ```text
//! cargo run --release -p rebound-bench -- throughput --jobs 100000 --rounds 3
//! cargo run --release -p rebound-bench -- dashboard --seed --url http://127.0.0.1:3000 --user admin --password …
//! ```

mod ceiling;
mod dashboard;
mod peer;
mod work;

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use rebound_queue::{NewJob, Store};
use work::Run;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

#[derive(Parser, Debug)]
#[command(about = "Rebound benchmarks (figures, not tests)")]
enum Command {
    /// Enqueue, worker and fail-path throughput against raw-SQL ceilings.
    Throughput(Args),
    /// Server-side render times of the dashboard on a large database.
    Dashboard(DashboardArgs),
    /// The modes of `../shared/bench`'s peer contract, for `bench/compare.sh`.
    Peer(peer::PeerArgs),
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
    #[arg(long, default_value_t = 10_000_000)]
    jobs: i64,
    #[arg(long, default_value_t = 1_000_000)]
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
    /// Measure everything this many times and add the medians (the machine's load changes
    /// between phases; medians of in-round ratios are the figures to quote).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Also print how the worker batched its claims and writes.
    #[arg(long)]
    detail: bool,
    /// SQL run once after the schema is migrated, for A/B measurements of the schema's parts
    /// (e.g. dropping a trigger to see what it costs).
    #[arg(long)]
    after_migrate: Option<String>,
}

struct Figure {
    name: &'static str,
    unit: &'static str,
    per_sec: f64,
    ceiling: Option<(&'static str, f64)>,
}

impl Figure {
    fn ratio(&self) -> f64 {
        self.ceiling.map(|(_, c)| self.per_sec / c.max(1e-9)).unwrap_or(1.0)
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Command::parse() {
        Command::Throughput(args) => throughput(args).await,
        Command::Peer(args) => peer::run(args).await,
        Command::Dashboard(args) => {
            let store = Store::connect(&args.database_url, 4).await?;
            if args.seed {
                let started = std::time::Instant::now();
                dashboard::seed(store.pool(), args.jobs, args.dead_letters).await?;
                println!("seeded {} jobs ({} dead letters) in {:.1?}", args.jobs, args.dead_letters, started.elapsed());
            }
            let dash = dashboard::Dashboard::login(&args.url, &args.user, &args.password).await?;
            if !dashboard::measure(store.pool(), &dash, args.requests).await? {
                println!("some pages are over the 100 ms p95 budget");
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
    if let Some(sql) = &args.after_migrate {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone())).execute(store.pool()).await.context("running --after-migrate")?;
        println!("rebound-bench: ran after migrating: {sql}");
    }
    let sync_commit: String = sqlx::query_scalar("SHOW synchronous_commit").fetch_one(store.pool()).await?;
    let concurrency = args.concurrency.unwrap_or(work::DEFAULT_CONCURRENCY);
    println!(
        "rebound-bench: {} jobs per phase, worker concurrency {concurrency}, synchronous_commit = {sync_commit}, {} round(s)",
        args.jobs, args.rounds
    );
    let mut rounds = Vec::new();
    for round in 1..=args.rounds.max(1) {
        if args.rounds > 1 {
            println!("\nround {round}:");
        }
        let figures = measure_round(&url, &store, &args, concurrency).await?;
        figures.print();
        rounds.push(figures);
    }
    if rounds.len() > 1 {
        println!("\nmedians of {} rounds (each ratio is the median of the rounds' ratios):", rounds.len());
        RoundFigures::median(&rounds).print();
    }
    drop(store);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))).execute(&mut conn).await?;
    Ok(())
}

/// One round's figures, each beside the ceiling it is compared with.
struct RoundFigures {
    best_config: String,
    figures: Vec<Figure>,
}

impl RoundFigures {
    fn print(&self) {
        println!("results (best raw-SQL work configuration: {}):", self.best_config);
        for f in &self.figures {
            match f.ceiling {
                Some((what, c)) => println!(
                    "  {:<38} {:>9.0} {:<7} {:>5.1} % of {what} ({c:.0} jobs/s)",
                    f.name,
                    f.per_sec,
                    f.unit,
                    100.0 * f.ratio()
                ),
                None => println!("  {:<38} {:>9.0} {}", f.name, f.per_sec, f.unit),
            }
        }
    }

    /// The median of every figure, ceiling and ratio across rounds.
    fn median(rounds: &[RoundFigures]) -> RoundFigures {
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let m = v.len() / 2;
            if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 }
        };
        let figures = rounds[0]
            .figures
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let per_sec = med(rounds.iter().map(|r| r.figures[i].per_sec).collect());
                let ratio = med(rounds.iter().map(|r| r.figures[i].ratio()).collect());
                // The ceiling shown is the one that gives the median ratio for the median figure.
                Figure { name: f.name, unit: f.unit, per_sec, ceiling: f.ceiling.map(|(what, _)| (what, per_sec / ratio.max(1e-9))) }
            })
            .collect();
        let configs: Vec<&str> = rounds.iter().map(|r| r.best_config.as_str()).collect();
        RoundFigures { best_config: configs.join(" / "), figures }
    }
}

/// Every phase once: enqueue, the raw-SQL work ceilings, the worker and the fail path.
async fn measure_round(url: &str, store: &Store, args: &Args, concurrency: usize) -> anyhow::Result<RoundFigures> {
    let pool = store.pool();
    let n = args.jobs;
    let truncate = || async { sqlx::query("TRUNCATE jobs, job_attempts").execute(pool).await.map(|_| ()) };

    // Enqueue: multi-row INSERT ceiling, then the store's batch enqueue (the public
    // `enqueue_batch`, full jobs back, as the HTTP batch endpoint uses it).
    truncate().await?;
    let raw_insert = rate(n, ceiling::insert_ceiling(pool, n, args.enqueue_batch).await?);
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
        ceiling::insert_ceiling(pool, n, 5_000).await?;
        let r = rate(n, ceiling::work_ceiling(pool, clients, batch).await?);
        println!("  raw SQL claim+complete, {clients} clients × batch {batch}: {r:>9.0} jobs/s");
        if r > best_ceiling {
            best_ceiling = r;
            best_config = format!("{clients} clients × batch {batch}");
        }
    }

    // The worker: first claim to last completion.
    truncate().await?;
    ceiling::insert_ceiling(pool, n, 5_000).await?;
    let worked = rate(n, work::run_worker(url, store, n, concurrency, Run::Complete, args.detail).await?);

    // The fail path: every job fails once, then succeeds; with the worker's defaults (retried
    // in place), and with every retry sent back through the queue.
    truncate().await?;
    ceiling::insert_ceiling(pool, n, 5_000).await?;
    let fail_path = rate(n, work::run_worker(url, store, n, concurrency, Run::FailOnce, args.detail).await?);
    truncate().await?;
    ceiling::insert_ceiling(pool, n, 5_000).await?;
    let through_queue = rate(n, work::run_worker(url, store, n, concurrency, Run::FailOnceThroughQueue, args.detail).await?);

    Ok(RoundFigures {
        best_config,
        figures: vec![
            Figure { name: "enqueue (batch)", unit: "jobs/s", per_sec: enqueue, ceiling: Some(("multi-row INSERT", raw_insert)) },
            Figure { name: "worker (no-op jobs)", unit: "jobs/s", per_sec: worked, ceiling: Some(("best raw SQL", best_ceiling)) },
            Figure {
                name: "fail path (fail once, then succeed)",
                unit: "jobs/s",
                per_sec: fail_path,
                ceiling: Some(("worker complete path", worked)),
            },
            // Claimed, run and written twice per job: at most half the complete path.
            Figure {
                name: "  same, retry_in_place = false",
                unit: "jobs/s",
                per_sec: through_queue,
                ceiling: Some(("worker complete path", worked)),
            },
        ],
    })
}
