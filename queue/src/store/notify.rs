//! LISTEN/NOTIFY: wake workers when due work appears in their queues, and tell them when
//! retry policies change.

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

/// The channel notified (by a trigger on `retry_policies`) whenever a stored policy layer
/// changes, however it was changed: through the store, or by hand in SQL.
pub const POLICY_CHANNEL: &str = "rebound_policies";

/// What a [`JobListener`] heard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notification {
    /// Jobs became available in this queue.
    Jobs(String),
    /// A retry policy changed: copies of the policies are stale.
    Policies,
    /// The connection was lost and is being re-established: anything notified meanwhile was
    /// missed, so copies of the policies may be stale and queues may hold work.
    Reconnected,
}

/// A subscription to [`NOTIFY_CHANNEL`] and [`POLICY_CHANNEL`].
pub struct JobListener {
    listener: PgListener,
}

impl JobListener {
    /// Waits for the next notification, or `None` after `timeout` (callers poll then, so a
    /// lost notification only delays work). A lost connection is reported at once
    /// ([`Notification::Reconnected`]); the next call connects and listens again.
    pub async fn next(&mut self, timeout: Duration) -> Result<Option<Notification>, StoreError> {
        match tokio::time::timeout(timeout, self.listener.try_recv()).await {
            Err(_) => Ok(None),
            Ok(Ok(Some(n))) if n.channel() == POLICY_CHANNEL => Ok(Some(Notification::Policies)),
            Ok(Ok(Some(n))) => Ok(Some(Notification::Jobs(n.payload().to_string()))),
            // The connection dropped; PgListener reconnects (and listens again) on the next call.
            Ok(Ok(None)) => Ok(Some(Notification::Reconnected)),
            Ok(Err(e)) => Err(e.into()),
        }
    }
}

impl Store {
    /// Subscribes to new-work and policy-change notifications.
    pub async fn listen(&self) -> Result<JobListener, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        // Told of a lost connection at once, not after sqlx has reconnected inside the same
        // call: callers bound each wait with a timeout, and one that dropped the call while
        // it reconnected (the database still down) left the next call to re-listen silently,
        // so `Reconnected` never came and nobody re-read what changed unheard.
        listener.eager_reconnect(false);
        listener.listen_all([NOTIFY_CHANNEL, POLICY_CHANNEL]).await?;
        Ok(JobListener { listener })
    }

    /// Notifies that jobs are available in `queues`.
    pub async fn notify(&self, queues: &[String]) -> Result<(), StoreError> {
        notify_queues(&self.pool, queues).await
    }
}
