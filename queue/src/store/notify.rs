//! LISTEN/NOTIFY: wake workers when due work appears in their queues.

use std::time::Duration;

use sqlx::postgres::PgListener;

use super::{Store, StoreError};

/// The channel notified with a queue name whenever jobs become available in it.
pub const NOTIFY_CHANNEL: &str = "rebound_jobs";

/// Notifies the queues in one statement, inside the caller's transaction if it has one (then
/// the notification is sent at commit, never for work that was rolled back).
pub(crate) async fn notify_queues<'e, E>(exec: E, queues: &[String]) -> Result<(), StoreError>
where
    E: sqlx::PgExecutor<'e>,
{
    if queues.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify('rebound_jobs', q) FROM unnest($1::text[]) AS q")
        .bind(queues)
        .execute(exec)
        .await?;
    Ok(())
}

/// A subscription to [`NOTIFY_CHANNEL`].
pub struct JobListener {
    listener: PgListener,
}

impl JobListener {
    /// Waits for the next notification and returns its queue name, or `None` after `timeout`
    /// (callers poll then, so a lost notification only delays work). Reconnects transparently
    /// after the connection is lost.
    pub async fn next(&mut self, timeout: Duration) -> Result<Option<String>, StoreError> {
        match tokio::time::timeout(timeout, self.listener.try_recv()).await {
            Err(_) => Ok(None),
            Ok(Ok(Some(n))) => Ok(Some(n.payload().to_string())),
            // The connection dropped; PgListener reconnects on the next call.
            Ok(Ok(None)) => Ok(None),
            Ok(Err(e)) => Err(e.into()),
        }
    }
}

impl Store {
    /// Subscribes to new-work notifications.
    pub async fn listen(&self) -> Result<JobListener, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        Ok(JobListener { listener })
    }

    /// Notifies that jobs are available in `queues`.
    pub async fn notify(&self, queues: &[String]) -> Result<(), StoreError> {
        notify_queues(&self.pool, queues).await
    }
}
