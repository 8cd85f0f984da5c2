//! LISTEN/NOTIFY: wakes the claim loop of a queue when jobs become available in it.
//!
//! Notifications are an optimisation: the claim loops poll anyway, so a listener that is
//! down (database restarting) only costs latency. It reconnects with backoff until shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rebound_queue::Store;
use rebound_queue::storage_retry::StorageRetry;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::outage::OutageBackoff;

/// Routes notifications to per-queue wake-ups.
pub struct Notifier {
    pub store: Store,
    pub wakes: HashMap<String, Arc<Notify>>,
    /// How long one wait for a notification lasts before the listener checks for shutdown
    /// and connection health again.
    pub wait: Duration,
    pub retry: StorageRetry,
}

impl Notifier {
    pub async fn run(self, shutdown: CancellationToken) {
        let mut outage = OutageBackoff::like(&self.retry);
        'connect: loop {
            let listener = tokio::select! {
                _ = shutdown.cancelled() => return,
                l = self.store.listen() => l,
            };
            let mut listener = match listener {
                Ok(l) => {
                    outage.reset();
                    // Anything notified while we were not listening is picked up by a poll;
                    // waking every loop now shortens that wait.
                    self.wake_all();
                    l
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for new jobs; relying on polling for now");
                    if !outage.wait(&shutdown).await {
                        return;
                    }
                    continue 'connect;
                }
            };
            loop {
                let next = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    n = listener.next(self.wait) => n,
                };
                match next {
                    Ok(Some(queue)) => {
                        if let Some(wake) = self.wakes.get(&queue) {
                            wake.notify_one();
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "lost the notification listener; reconnecting");
                        if !outage.wait(&shutdown).await {
                            return;
                        }
                        continue 'connect;
                    }
                }
            }
        }
    }

    fn wake_all(&self) {
        for wake in self.wakes.values() {
            wake.notify_one();
        }
    }
}
