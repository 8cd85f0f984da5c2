//! LISTEN/NOTIFY: wakes the claim loop of a queue when jobs become available in it, and
//! keeps the worker's copy of the retry policies ([`LivePolicies`]) fresh.
//!
//! Job notifications are an optimisation: the claim loops poll anyway, so a listener that is
//! down (database restarting) only costs latency. It reconnects with backoff until shutdown.
//! The policy copy is dropped whenever a change may have gone unheard, and read again once
//! the listener is back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rebound_queue::Store;
use rebound_queue::storage_retry::StorageRetry;
use rebound_queue::store::Notification;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::live_policies::LivePolicies;
use crate::orphans::Orphans;
use crate::outage::OutageBackoff;

/// Routes notifications to per-queue wake-ups.
pub struct Notifier {
    pub store: Store,
    pub wakes: HashMap<String, Arc<Notify>>,
    /// How long one wait for a notification lasts before the listener checks for shutdown
    /// and connection health again.
    pub wait: Duration,
    pub retry: StorageRetry,
    pub policies: Arc<LivePolicies>,
    /// Told when the connection was lost: a claim may have committed unanswered meanwhile.
    pub orphans: Arc<Orphans>,
    /// Counts the times the listener got (back) onto the database. A claim loop waiting out
    /// an outage ends its wait when this moves, and only then: a queue's notifications say
    /// nothing about whether its claims can succeed again.
    pub listening: watch::Sender<u64>,
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
                    // waking every loop now shortens that wait. Policies may have changed
                    // unheard too: read them again now that changes will be heard.
                    self.wake_all();
                    self.listening.send_modify(|n| *n = n.wrapping_add(1));
                    self.policies.invalidate();
                    self.policies.reload(&self.store).await;
                    l
                }
                Err(e) => {
                    self.policies.invalidate();
                    if !outage.wait_logged("listening for new jobs (polling meanwhile)", &e, &shutdown).await {
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
                    Ok(Some(Notification::Jobs(queue))) => {
                        if let Some(wake) = self.wakes.get(&queue) {
                            wake.notify_one();
                        }
                    }
                    Ok(Some(Notification::Policies)) => {
                        self.policies.invalidate();
                        self.policies.reload(&self.store).await;
                    }
                    Ok(Some(Notification::Reconnected)) => {
                        // Changes may have gone unheard. Listening again from scratch reads
                        // the policies once the new subscription is in place; until then,
                        // failures are decided by the database.
                        self.policies.invalidate();
                        self.orphans.suspect();
                        continue 'connect;
                    }
                    Ok(None) => {
                        // A read that failed (database down) is tried again while idle.
                        if self.policies.current().is_none() {
                            self.policies.reload(&self.store).await;
                        }
                    }
                    Err(e) => {
                        self.policies.invalidate();
                        if !outage.wait_logged("the notification listener", &e, &shutdown).await {
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
