//! Working jobs with the real worker runtime, in process, with a no-op handler.

use std::time::Duration;

use rebound_queue::Store;
use rebound_queue::policy::PolicyPatch;
use rebound_queue::store::Actor;
use rebound_worker::{Worker, handler::retry, handler_fn};
use tokio_util::sync::CancellationToken;

/// The worker binary's default concurrency for a queue.
pub const DEFAULT_CONCURRENCY: usize = 10;

/// Runs a worker over the `bench` queue until `n` jobs are completed. With `fail_once`, every
/// job's first attempt fails (retried at once) and the second succeeds. Returns the time from
/// the first claim to the last completion, as recorded in the database.
pub async fn run_worker(store: &Store, n: usize, concurrency: Option<usize>, fail_once: bool) -> anyhow::Result<Duration> {
    if fail_once {
        // A sub-millisecond interval retries at once, so the figure is the cost of the fail
        // path itself rather than of waiting out a backoff.
        let patch = PolicyPatch::from_json(&serde_json::json!({
            "max_attempts": 3, "initial_interval": "PT0.0001S", "backoff_strategy": "constant", "jitter": false
        }))?;
        store.put_policy("bench.noop", &patch, &Actor::system("bench"), None).await?;
    }
    let slots = u32::try_from(concurrency.unwrap_or(DEFAULT_CONCURRENCY))?;
    let worker = Worker::builder(store.clone())
        .queue("bench", slots)
        .handler(
            "bench.noop",
            handler_fn(move |job| async move {
                if fail_once && job.attempt() == 1 {
                    return Err(retry("bench.first_attempt", "the first attempt always fails"));
                }
                Ok(None)
            }),
        )
        .build()?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'completed'").fetch_one(store.pool()).await?;
        if done as usize >= n {
            break;
        }
        if running.is_finished() {
            anyhow::bail!("the worker stopped before finishing the jobs ({done}/{n} completed)");
        }
    }
    shutdown.cancel();
    let _ = running.await;
    let secs: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (max(j.completed_at) - (SELECT min(started_at) FROM job_attempts)))::float8 FROM jobs j",
    )
    .fetch_one(store.pool())
    .await?;
    if fail_once {
        store.delete_policy("bench.noop", &Actor::system("bench")).await?;
    }
    Ok(Duration::from_secs_f64(secs.max(1e-6)))
}
