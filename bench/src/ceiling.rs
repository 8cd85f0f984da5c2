//! The raw-SQL ceilings: what Postgres itself does for the same workload with no job system
//! around it, measured in the same run so the ratios survive machine load.

use std::time::{Duration, Instant};

use sqlx::PgPool;
use uuid::Uuid;

/// Multi-row INSERT of minimal job rows in batches: the ceiling for enqueue.
pub async fn insert_ceiling(pool: &PgPool, n: usize, batch: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut left = n;
    while left > 0 {
        let k = left.min(batch);
        let ids: Vec<Uuid> = (0..k).map(|_| Uuid::now_v7()).collect();
        sqlx::query(
            "INSERT INTO jobs (id, type, queue, args, state, enqueued_at)
             SELECT id, 'bench.noop', 'bench', '[]'::jsonb, 'available', now() FROM unnest($1::uuid[]) AS id",
        )
        .bind(&ids)
        .execute(pool)
        .await?;
        left -= k;
    }
    Ok(started.elapsed())
}

/// `clients` loops that each claim `batch` jobs with SKIP LOCKED and complete them with plain
/// SQL until none are left: the ceiling for working jobs.
pub async fn work_ceiling(pool: &PgPool, clients: usize, batch: i64) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let ids: Vec<Uuid> = sqlx::query_scalar(
                    "WITH picked AS (
                         SELECT id FROM jobs WHERE state = 'available' AND NOT rate_limited AND queue = 'bench'
                         ORDER BY priority DESC, scheduled_at, id LIMIT $1 FOR UPDATE SKIP LOCKED
                     )
                     UPDATE jobs j SET state = 'active', attempt = j.attempt + 1, started_at = now()
                     FROM picked WHERE j.id = picked.id RETURNING j.id",
                )
                .bind(batch)
                .fetch_all(&pool)
                .await?;
                if ids.is_empty() {
                    return Ok::<_, sqlx::Error>(());
                }
                sqlx::query("UPDATE jobs SET state = 'completed', completed_at = now() WHERE id = ANY($1)")
                    .bind(&ids)
                    .execute(&pool)
                    .await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}
