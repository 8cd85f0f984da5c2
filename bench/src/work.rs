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

/// Runs a worker with default settings over the `bench` queue until `n` jobs are completed.
/// With `fail_once`, every job's first attempt fails (retried at once) and the second
/// succeeds. Returns the time from the first claim to the last completion, as recorded in the
/// database.
pub async fn run_worker(url: &str, store: &Store, n: usize, concurrency: usize, fail_once: bool, detail: bool) -> anyhow::Result<Duration> {
    if fail_once {
        // A sub-millisecond interval retries at once, so the figure is the cost of the fail
        // path itself rather than of waiting out a backoff.
        let patch = PolicyPatch::from_json(&serde_json::json!({
            "max_attempts": 3, "initial_interval": "PT0.0001S", "backoff_strategy": "constant", "jitter": false
        }))?;
        store.put_policy("bench.noop", &patch, &Actor::system("bench"), None).await?;
    }
    let slots = u32::try_from(concurrency)?;
    let settings = RuntimeSettings::default();
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
        print_batching(store, if fail_once { "fail path" } else { "worker" }).await?;
    }
    if fail_once {
        store.delete_policy("bench.noop", &Actor::system("bench")).await?;
    }
    Ok(Duration::from_secs_f64(secs.max(1e-6)))
}

/// How the run batched, read back from the attempt rows: every job a claim took shares its
/// `started_at` (the claim's `now()`), every result a write took shares its `finished_at`.
async fn print_batching(store: &Store, run: &str) -> anyhow::Result<()> {
    let (claims, per_claim, writes, per_write, latency_ms): (i64, f64, i64, f64, f64) = sqlx::query_as(
        "SELECT count(DISTINCT started_at), count(*)::float8 / greatest(count(DISTINCT started_at), 1),
                count(DISTINCT finished_at), count(*)::float8 / greatest(count(DISTINCT finished_at), 1),
                EXTRACT(EPOCH FROM avg(finished_at - started_at))::float8 * 1000
         FROM job_history",
    )
    .fetch_one(store.pool())
    .await?;
    println!(
        "  {run}: {claims} claims of {per_claim:.1} jobs, {writes} writes of {per_write:.1} results, \
         {latency_ms:.1} ms from claim to written"
    );
    Ok(())
}
