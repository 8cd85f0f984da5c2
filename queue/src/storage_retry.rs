//! Retrying storage operations through transient database errors (seed 000).
//!
//! A worker must ride through a database restart: a completion that fails because the
//! connection dropped is retried with backoff and jitter rather than lost. Only errors that can
//! plausibly succeed on a retry are retried; a shutdown (cancellation) is never waited out.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::policy::{BackoffStrategy, Jitter, OnExhaustion, RetryPolicy};
use crate::store::StoreError;

/// How a storage operation is retried.
#[derive(Clone, Debug, PartialEq)]
pub struct StorageRetry {
    /// Attempts including the first; 1 disables retry.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub multiplier: f64,
    /// Each wait is the backoff ± this fraction, uniformly.
    pub jitter_fraction: f64,
}

impl StorageRetry {
    /// Storage ops (complete, fail, heartbeat): 5 attempts, 100 ms → 5 s, ×2, ±10 %.
    pub fn storage_default() -> Self {
        StorageRetry {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            multiplier: 2.0,
            jitter_fraction: 0.1,
        }
    }

    /// The claim loop polls anyway, so it backs off longer: 3 attempts, 500 ms → 10 s, ×2, ±20 %.
    pub fn claim_default() -> Self {
        StorageRetry {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
            multiplier: 2.0,
            jitter_fraction: 0.2,
        }
    }

    /// Every operation is attempted exactly once.
    pub fn disabled() -> Self {
        StorageRetry { max_attempts: 1, ..Self::storage_default() }
    }

    /// The backoff as a retry policy, so storage retry and job retry share one piece of math.
    pub fn as_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.max(1),
            initial_interval: self.initial_backoff,
            backoff_coefficient: self.multiplier.max(1.0),
            max_interval: self.max_backoff.max(self.initial_backoff),
            jitter: if self.jitter_fraction > 0.0 {
                Jitter::Proportional(self.jitter_fraction.min(1.0))
            } else {
                Jitter::Off
            },
            non_retryable_errors: Vec::new(),
            on_exhaustion: OnExhaustion::Discard,
            backoff_strategy: BackoffStrategy::Exponential,
            schedule: Vec::new(),
        }
    }

    /// Runs `op` until it succeeds, fails with a non-transient error, runs out of attempts, or
    /// `cancel` fires (then [`StoreError::Cancelled`] at once, even mid-wait).
    pub async fn run<T, F, Fut>(&self, what: &str, cancel: &CancellationToken, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let policy = self.as_policy();
        let mut rng = fastrand::Rng::new();
        let mut attempt: u32 = 1;
        loop {
            if cancel.is_cancelled() {
                return Err(StoreError::Cancelled);
            }
            let result = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(StoreError::Cancelled),
                r = op() => r,
            };
            match result {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transient() && attempt < policy.max_attempts => {
                    let wait = policy.jittered_delay_for(attempt, &mut rng);
                    let next_try_at = jiff::SignedDuration::try_from(wait)
                        .ok()
                        .and_then(|d| jiff::Timestamp::now().checked_add(d).ok())
                        .map(|t| t.to_string())
                        .unwrap_or_default();
                    tracing::warn!(operation = what, attempt, wait_ms = wait.as_millis() as u64, next_try_at, error = %e,
                        "transient storage error; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return Err(StoreError::Cancelled),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    fn transient() -> StoreError {
        StoreError::Database(sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset")))
    }

    #[test]
    fn defaults_follow_seed_000() {
        let p = StorageRetry::storage_default().as_policy();
        let ms: Vec<u128> = (1..=8).map(|n| p.delay_for(n).as_millis()).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        let c = StorageRetry::claim_default().as_policy();
        assert_eq!(c.delay_for(1), Duration::from_millis(500));
        assert_eq!(c.delay_for(6), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_until_success() {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let out = StorageRetry::storage_default()
            .run("t", &CancellationToken::new(), || {
                let c = c.clone();
                async move {
                    if c.fetch_add(1, Ordering::SeqCst) < 3 { Err(transient()) } else { Ok(7) }
                }
            })
            .await;
        assert_eq!(out.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_max_attempts_and_never_retries_permanent_errors() {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let out: Result<(), _> = StorageRetry::storage_default()
            .run("t", &CancellationToken::new(), || {
                let c = c.clone();
                async move { c.fetch_add(1, Ordering::SeqCst); Err(transient()) }
            })
            .await;
        assert!(out.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 5);

        calls.store(0, Ordering::SeqCst);
        let c = calls.clone();
        let out: Result<(), _> = StorageRetry::storage_default()
            .run("t", &CancellationToken::new(), || {
                let c = c.clone();
                async move { c.fetch_add(1, Ordering::SeqCst); Err(StoreError::NotFound(uuid::Uuid::nil())) }
            })
            .await;
        assert!(matches!(out, Err(StoreError::NotFound(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        calls.store(0, Ordering::SeqCst);
        let c = calls.clone();
        let out: Result<(), _> = StorageRetry::disabled()
            .run("t", &CancellationToken::new(), || {
                let c = c.clone();
                async move { c.fetch_add(1, Ordering::SeqCst); Err(transient()) }
            })
            .await;
        assert!(out.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn cancellation_interrupts_the_wait_at_once() {
        let cancel = CancellationToken::new();
        let slow = StorageRetry { initial_backoff: Duration::from_secs(3600), max_backoff: Duration::from_secs(3600), ..StorageRetry::storage_default() };
        let c2 = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            c2.cancel();
        });
        let started = std::time::Instant::now();
        let out: Result<(), _> = slow.run("t", &cancel, || async { Err(transient()) }).await;
        assert!(matches!(out, Err(StoreError::Cancelled)));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
