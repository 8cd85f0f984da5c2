//! Failed dashboard sign-ins, counted per key (an account, a client address) so that the
//! server can make guessers wait longer after each failure. Kept in Postgres rather than in
//! one process's memory: several server processes may answer the same login form.
//!
//! An attempt is counted *before* its password is checked ([`Store::start_login_attempt`]) and
//! taken back when it succeeds ([`Store::login_succeeded`]): otherwise guesses sent in parallel
//! would all pass the check before any of them was counted.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{Store, StoreError, millis};

/// How a key has failed lately.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginFailures {
    pub key: String,
    /// Attempts not taken back by a success, since the key last went quiet for the caller's
    /// forget period.
    pub failures: u32,
    /// How long ago the latest one was.
    pub since_last: Duration,
}

// The recent failures of keys `$1` (quiet for less than `$2` ms): read to decide an attempt
// (locked, by `start_login_attempt`) or to look first (by `login_wait`).
macro_rules! recent_failures_sql {
    () => {
        "SELECT key, failures, (extract(epoch FROM now() - last_failed_at) * 1000)::bigint AS since_ms
         FROM login_failures
         WHERE key = ANY($1) AND last_failed_at > now() - $2 * interval '1 millisecond'
         ORDER BY key"
    };
}

impl Store {
    /// Starts a sign-in attempt for `keys`: reads their recent failures (locking the rows, so
    /// concurrent attempts take turns), asks `remaining_wait` how much longer the attempt must
    /// wait, and if nothing, counts it as a failure of every key until [`Store::login_succeeded`]
    /// says otherwise. Returns the wait (zero: go ahead). A refused attempt changes nothing, so
    /// hammering a throttled account does not push its wait further out. Keys quiet for
    /// `forget_after` start again from zero; keys quiet for a day are deleted.
    pub async fn start_login_attempt(
        &self,
        keys: &[String],
        forget_after: Duration,
        remaining_wait: impl FnOnce(&[LoginFailures]) -> Duration,
    ) -> Result<Duration, StoreError> {
        let mut tx = self.begin().await?;
        let rows = sqlx::query(concat!(recent_failures_sql!(), " FOR UPDATE"))
        .bind(keys)
        .bind(millis(forget_after))
        .fetch_all(&mut *tx)
        .await?;
        let wait = remaining_wait(&failures_from_rows(&rows)?);
        if !wait.is_zero() {
            tx.rollback().await?;
            return Ok(wait);
        }
        sqlx::query(
            "INSERT INTO login_failures (key, failures, last_failed_at)
             SELECT k, 1, now() FROM unnest($1::text[]) AS k
             ON CONFLICT (key) DO UPDATE SET
                 failures = CASE WHEN login_failures.last_failed_at > now() - $2 * interval '1 millisecond'
                                 THEN login_failures.failures + 1 ELSE 1 END,
                 last_failed_at = now()",
        )
        .bind(keys)
        .bind(millis(forget_after))
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM login_failures WHERE last_failed_at < now() - interval '1 day'").execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(Duration::ZERO)
    }

    /// How long a sign-in for `keys` would have to wait, as [`Store::start_login_attempt`]
    /// would decide it, but without counting the attempt or locking anything: a first look, so
    /// that an attempt already throttled is refused before it queues for a password check. The
    /// locked look in `start_login_attempt` still decides for the attempts that pass.
    pub async fn login_wait(
        &self,
        keys: &[String],
        forget_after: Duration,
        remaining_wait: impl FnOnce(&[LoginFailures]) -> Duration,
    ) -> Result<Duration, StoreError> {
        let rows = sqlx::query(recent_failures_sql!())
        .bind(keys)
        .bind(millis(forget_after))
        .fetch_all(&self.pool)
        .await?;
        Ok(remaining_wait(&failures_from_rows(&rows)?))
    }

    /// The attempt started for its keys succeeded: the failures of `forget` (the account's,
    /// a device's) are forgotten, and the counts of `taken_back` (the client's address and
    /// network) no longer include this attempt.
    pub async fn login_succeeded(&self, forget: &[String], taken_back: &[String]) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query("DELETE FROM login_failures WHERE key = ANY($1)").bind(forget).execute(&mut *tx).await?;
        sqlx::query("UPDATE login_failures SET failures = greatest(failures - 1, 0) WHERE key = ANY($1)").bind(taken_back).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// The rows of the recent-failures query, as [`LoginFailures`].
fn failures_from_rows(rows: &[PgRow]) -> Result<Vec<LoginFailures>, StoreError> {
    rows.iter()
        .map(|r| {
            let failures: i32 = r.try_get("failures")?;
            let since_ms: i64 = r.try_get("since_ms")?;
            Ok(LoginFailures {
                key: r.try_get("key")?,
                failures: u32::try_from(failures).unwrap_or(0),
                since_last: Duration::from_millis(u64::try_from(since_ms).unwrap_or(0)),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()
}
