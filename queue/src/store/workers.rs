//! The registry of worker processes and their heartbeats.

use jiff::Timestamp;
use serde::Serialize;
use sqlx::Row;

use super::{Store, StoreError, ts};

/// What a worker says about itself when it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRegistration {
    pub id: String,
    pub host: String,
    pub pid: i32,
    pub queues: Vec<String>,
    pub concurrency: i32,
    pub version: String,
}

/// A registered worker.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerInfo {
    pub id: String,
    pub host: String,
    pub pid: i32,
    pub queues: Vec<String>,
    pub concurrency: i32,
    pub version: String,
    pub running: i32,
    pub started_at: Timestamp,
    pub last_heartbeat_at: Timestamp,
    pub stopping: bool,
    /// Seconds since the last heartbeat, by the database's clock.
    pub silent_for_secs: f64,
}

impl Store {
    /// Registers (or re-registers) a worker.
    pub async fn register_worker(&self, w: &WorkerRegistration) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO workers (id, host, pid, queues, concurrency, version, started_at, last_heartbeat_at)
             VALUES ($1, $2, $3, $4, $5, $6, now(), now())
             ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
                 concurrency = EXCLUDED.concurrency, version = EXCLUDED.version, last_heartbeat_at = now(), stopping = false",
        )
        .bind(&w.id)
        .bind(&w.host)
        .bind(w.pid)
        .bind(&w.queues)
        .bind(w.concurrency)
        .bind(&w.version)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a worker's heartbeat and how many jobs it is running.
    pub async fn worker_heartbeat(&self, id: &str, running: i32, stopping: bool) -> Result<(), StoreError> {
        sqlx::query("UPDATE workers SET last_heartbeat_at = now(), running = $2, stopping = $3 WHERE id = $1")
            .bind(id)
            .bind(running)
            .bind(stopping)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Removes a worker that stopped cleanly.
    pub async fn deregister_worker(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM workers WHERE id = $1").bind(id).execute(&self.pool).await?;
        Ok(())
    }

    /// Every registered worker, most recently heard from first.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>, StoreError> {
        let rows = sqlx::query(
            "SELECT *, EXTRACT(EPOCH FROM (now() - last_heartbeat_at))::float8 AS silent_for_secs
             FROM workers ORDER BY last_heartbeat_at DESC, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(WorkerInfo {
                    id: r.try_get("id")?,
                    host: r.try_get("host")?,
                    pid: r.try_get("pid")?,
                    queues: r.try_get("queues")?,
                    concurrency: r.try_get("concurrency")?,
                    version: r.try_get("version")?,
                    running: r.try_get("running")?,
                    started_at: ts(r, "started_at")?,
                    last_heartbeat_at: ts(r, "last_heartbeat_at")?,
                    stopping: r.try_get("stopping")?,
                    silent_for_secs: r.try_get("silent_for_secs")?,
                })
            })
            .collect()
    }
}
