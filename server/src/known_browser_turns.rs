//! Turns at a password check for sign-ins from known browsers (see
//! [`login_throttle::DEVICE`](crate::login_throttle::DEVICE)). Strangers' sign-ins never take
//! these; and each operator has one turn of their own before taking one of the few shared
//! among known browsers, so one operator signing in in a loop from a browser of theirs holds
//! at most one shared turn and cannot keep the others' known browsers waiting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// How many known browsers' password checks run at once, across operators.
pub const KNOWN_BROWSER_CHECKS: usize = 2;

/// See the module docs.
#[derive(Debug)]
pub struct KnownBrowserTurns {
    shared: Arc<Semaphore>,
    /// One single-turn semaphore per operator name. Only names with a live device reach
    /// here, so this grows with the operators, not with whoever sends requests.
    own: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Default for KnownBrowserTurns {
    fn default() -> Self {
        KnownBrowserTurns { shared: Arc::new(Semaphore::new(KNOWN_BROWSER_CHECKS)), own: Mutex::default() }
    }
}

impl KnownBrowserTurns {
    /// Waits for `operator`'s own turn, then for a shared one; the check runs while both are
    /// held.
    pub async fn take(&self, operator: &str) -> Result<Vec<OwnedSemaphorePermit>, AcquireError> {
        let own = {
            // A poisoned map only means another sign-in panicked while inserting: its
            // contents are still whole.
            let mut map = self.own.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            map.entry(operator.to_owned()).or_insert_with(|| Arc::new(Semaphore::new(1))).clone()
        };
        let own = own.acquire_owned().await?;
        let shared = self.shared.clone().acquire_owned().await?;
        Ok(vec![own, shared])
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn an_operator_holds_one_shared_turn_at_most() {
        let turns = KnownBrowserTurns::default();
        let olivia = turns.take("olivia").await.expect("a turn");
        // Olivia's second sign-in waits for her first, not for a shared turn.
        assert!(tokio::time::timeout(Duration::from_millis(50), turns.take("olivia")).await.is_err());
        let bob = tokio::time::timeout(Duration::from_millis(500), turns.take("bob")).await.expect("Bob is not held up").expect("a turn");
        // Both shared turns are taken now: a third operator waits until one is given back.
        assert!(tokio::time::timeout(Duration::from_millis(50), turns.take("carol")).await.is_err());
        drop(olivia);
        assert!(tokio::time::timeout(Duration::from_millis(500), turns.take("carol")).await.is_ok());
        drop(bob);
    }
}
