//! Working jobs with the real worker runtime, in process, with a no-op handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rebound_queue::Store;
use rebound_queue::policy::PolicyPatch;
use rebound_queue::store::Actor;
use rebound_worker::settings::{DEFAULT_QUEUE_CONCURRENCY, RuntimeSettings};
use rebound_worker::{Worker, handler::retry, handler_fn};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

/// The worker binary's default concurrency for a queue.
pub const DEFAULT_CONCURRENCY: usize = DEFAULT_QUEUE_CONCURRENCY as usize;

/// What the no-op handler does with each job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    /// Every job completes at once.
    Complete,
    /// Every job's first attempt fails and is retried at once (a sub-millisecond interval);
    /// the second completes. The worker's defaults retry it in place.
    FailOnce,
    /// The same, with retries in place turned off: each retry goes back through the queue.
    FailOnceThroughQueue,
}

/// Runs a worker with default settings over the `bench` queue until `n` jobs are completed.
/// Returns the time from the first claim to the last completion, as recorded in the database.
pub async fn run_worker(url: &str, store: &Store, n: usize, concurrency: usize, run: Run, detail: bool) -> anyhow::Result<Duration> {
    let fail_once = run != Run::Complete;
    if fail_once {
        // A sub-millisecond interval retries at once, so the figure is the cost of the fail
        // path itself rather than of waiting out a backoff.
        let patch = PolicyPatch::from_json(&serde_json::json!({
            "max_attempts": 3, "initial_interval": "PT0.0001S", "backoff_strategy": "constant", "jitter": false
        }))?;
        store.put_policy("bench.noop", &patch, &Actor::system("bench"), None).await?;
    }
    let slots = u32::try_from(concurrency)?;
    let settings = RuntimeSettings { retry_in_place: run != Run::FailOnceThroughQueue, ..RuntimeSettings::default() };
    // A pool of its own, sized as the binary sizes it, so the bench's queries never take the
    // worker's connections. Opened up front, as a long-running worker has them: otherwise the
    // first claims and writes would each wait for a new backend inside the measured window.
    let connections = settings.connections_needed([slots]);
    let pool = PgPoolOptions::new().max_connections(connections).min_connections(connections).connect(url).await?;
    let mut opened = Vec::new();
    for _ in 0..connections {
        opened.push(pool.acquire().await?);
    }
    drop(opened);

    let succeeded = Arc::new(AtomicUsize::new(0));
    let counter = succeeded.clone();
    let worker = Worker::builder(Store::from_pool(pool))
        .queue("bench", slots)
        .settings(settings)
        .handler(
            "bench.noop",
            handler_fn(move |job| {
                let counter = counter.clone();
                async move {
                    if fail_once && job.attempt() == 1 {
                        return Err(retry("bench.first_attempt", "the first attempt always fails"));
                    }
                    counter.fetch_add(1, Ordering::Relaxed);
                    Ok(None)
                }
            }),
        )
        .build()?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // Watching the handlers costs nothing; only once they have all run is the database asked,
    // so the bench's own queries do not take CPU from the run it measures.
    while succeeded.load(Ordering::Relaxed) < n {
        if running.is_finished() {
            anyhow::bail!("the worker stopped before running every job ({}/{n} succeeded)", succeeded.load(Ordering::Relaxed));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    loop {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'completed'").fetch_one(store.pool()).await?;
        if done as usize >= n {
            break;
        }
        if running.is_finished() {
            anyhow::bail!("the worker stopped before finishing the jobs ({done}/{n} completed)");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown.cancel();
    let _ = running.await;
    let secs: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (max(j.completed_at) - (SELECT min(started_at) FROM job_history)))::float8 FROM jobs j",
    )
    .fetch_one(store.pool())
    .await?;
    if detail {
        let name = match run {
            Run::Complete => "worker",
            Run::FailOnce => "fail path",
            Run::FailOnceThroughQueue => "fail path through the queue",
        };
        print_batching(store, name).await?;
    }
    if fail_once {
        store.delete_policy("bench.noop", &Actor::system("bench")).await?;
    }
    Ok(Duration::from_secs_f64(secs.max(1e-6)))
}

/// How the run batched, read back from the history: every job a claim took shares the
/// `started_at` of the execution it was claimed for (the claim's `now()`), and every result a
/// write took shares its `finished_at` (an execution retried in place starts and ends on the
/// worker's clock, so only claimed executions and written results are counted).
async fn print_batching(store: &Store, run: &str) -> anyhow::Result<()> {
    let (claims, per_claim, writes, per_write, latency_ms): (i64, f64, i64, f64, f64) = sqlx::query_as(
        "WITH claimed AS (
             SELECT DISTINCT ON (job_id, started_at) started_at FROM job_history h
             WHERE NOT EXISTS (SELECT 1 FROM job_history p WHERE p.job_id = h.job_id AND p.attempt = h.attempt - 1
                                                         AND p.outcome = 'retried' AND p.finished_at = h.started_at)
         ), written AS (SELECT completed_at AS at FROM jobs UNION ALL
                        SELECT finished_at FROM job_attempts a WHERE NOT EXISTS (
                            SELECT 1 FROM job_history n WHERE n.job_id = a.job_id AND n.attempt = a.attempt + 1
                                                        AND n.started_at = a.finished_at))
         SELECT (SELECT count(DISTINCT started_at) FROM claimed),
                (SELECT count(*) FROM claimed)::float8 / greatest((SELECT count(DISTINCT started_at) FROM claimed), 1),
                (SELECT count(DISTINCT at) FROM written),
                (SELECT count(*) FROM written)::float8 / greatest((SELECT count(DISTINCT at) FROM written), 1),
                (SELECT EXTRACT(EPOCH FROM avg(completed_at - started_at))::float8 * 1000 FROM jobs)",
    )
    .fetch_one(store.pool())
    .await?;
    println!(
        "  {run}: {claims} claims of {per_claim:.1} jobs, {writes} writes of {per_write:.1} results, \
         {latency_ms:.1} ms from the last execution's start to written"
    );
    Ok(())
}
