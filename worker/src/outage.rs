//! Riding out outages longer than one storage retry.
//!
//! [`StorageRetry`] gives up after a few attempts so a caller can react; the worker's loops
//! react by waiting and trying again, for as long as it takes, because a worker must never
//! exit (or drop a result) over a database that is down. The waits grow like the retry's own
//! backoff, are jittered, and end at once on shutdown.

use std::time::Duration;

use rebound_queue::policy::RetryPolicy;
use rebound_queue::storage_retry::StorageRetry;
use tokio_util::sync::CancellationToken;

/// Consecutive failed rounds of one loop, and the wait before the next.
#[derive(Debug)]
pub struct OutageBackoff {
    policy: RetryPolicy,
    failures: u32,
    rng: fastrand::Rng,
}

impl OutageBackoff {
    /// Backs off like `retry` does between its attempts (same initial wait, growth and cap).
    pub fn like(retry: &StorageRetry) -> Self {
        let mut policy = retry.as_policy();
        // The policy's attempt budget is irrelevant here: an outage is waited out indefinitely.
        policy.max_attempts = u32::MAX;
        OutageBackoff { policy, failures: 0, rng: fastrand::Rng::new() }
    }

    /// The wait after one more failed round.
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.policy.jittered_delay_for(self.failures, &mut self.rng)
    }

    /// Records a failed round and waits before the next; false if `cancel` fired meanwhile.
    pub async fn wait(&mut self, cancel: &CancellationToken) -> bool {
        let delay = self.next_delay();
        tokio::select! {
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// Like [`OutageBackoff::wait`], after logging that `what` failed with `error`, how many
    /// rounds in a row have, and when the next try is: an operator watching a worker that
    /// cannot reach its database sees every wait, not one line and then silence.
    pub async fn wait_logged(&mut self, what: &str, error: &(dyn std::fmt::Display + Sync), cancel: &CancellationToken) -> bool {
        let delay = self.next_delay();
        tracing::error!(failures = self.failures, error = %error, retry_in_ms = delay.as_millis() as u64,
            next_try_at = %at_after(delay), "{what} failed; waiting, then trying again");
        tokio::select! {
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// The loop got through: the next outage starts from the initial wait again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failed rounds in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// The wall-clock time `wait` from now, for logs ("next try at …").
pub fn at_after(wait: Duration) -> jiff::Timestamp {
    let now = jiff::Timestamp::now();
    jiff::SignedDuration::try_from(wait).ok().and_then(|d| now.checked_add(d).ok()).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_to_the_cap_and_reset() {
        let retry = StorageRetry { jitter_fraction: 0.0, ..StorageRetry::storage_default() };
        let mut b = OutageBackoff::like(&retry);
        let waits: Vec<u128> = (0..9).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(b.failures(), 9);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[tokio::test]
    async fn shutdown_ends_the_wait_at_once() {
        let retry = StorageRetry { initial_backoff: Duration::from_secs(3600), max_backoff: Duration::from_secs(3600), ..StorageRetry::storage_default() };
        let mut b = OutageBackoff::like(&retry);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let started = std::time::Instant::now();
        assert!(!b.wait(&cancel).await);
        assert!(started.elapsed() < Duration::from_secs(60));
    }
}
