//! The worker's copy of the stored retry policies, with which it decides at once, without a
//! round trip, whether a failure is retried in place.
//!
//! The copy is only trusted while it is known to be fresh: every change to `retry_policies`
//! notifies [`rebound_queue::store::POLICY_CHANNEL`] (a trigger, so hand edits in SQL count
//! too), and the notifier drops the copy when it hears one, or when its connection is lost
//! and notifications may have been missed, then reads it again. While there is no fresh
//! copy nothing is retried in place: failures go to the database, which decides with the
//! live policy as always. A policy edit therefore governs the next failure either way.

use std::sync::{Arc, Mutex, MutexGuard};

use rebound_queue::Store;
use rebound_queue::store::PolicyLayers;

#[derive(Debug, Default)]
struct State {
    layers: Option<Arc<PolicyLayers>>,
    /// Bumped by every invalidation, so a read that began before one is not installed after it.
    generation: u64,
}

/// See the module docs. Starts empty (stale) until the first [`LivePolicies::reload`].
#[derive(Debug, Default)]
pub struct LivePolicies {
    state: Mutex<State>,
}

impl LivePolicies {
    pub fn new() -> Self {
        LivePolicies::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a plain assignment, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The copy, if it is known to be fresh.
    pub fn current(&self) -> Option<Arc<PolicyLayers>> {
        self.lock().layers.clone()
    }

    /// Drops the copy: a change was announced, or announcements may have been missed.
    pub fn invalidate(&self) {
        let mut state = self.lock();
        state.layers = None;
        state.generation += 1;
    }

    /// Reads the policies again; true if the copy is fresh afterwards. Call it only while
    /// listening for changes, so none can slip between the read and the next announcement.
    pub async fn reload(&self, store: &Store) -> bool {
        let generation = self.lock().generation;
        match store.policy_layers().await {
            Ok(layers) => {
                let mut state = self.lock();
                if state.generation == generation {
                    state.layers = Some(Arc::new(layers));
                }
                state.layers.is_some()
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the retry policies; failures are decided by the database until they are read");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalidation_drops_the_copy() {
        let live = LivePolicies::new();
        assert!(live.current().is_none(), "stale until read");
        live.lock().layers = Some(Arc::new(PolicyLayers::default()));
        assert!(live.current().is_some());
        live.invalidate();
        assert!(live.current().is_none());
        assert_eq!(live.lock().generation, 1);
    }
}
