//! Failed dashboard sign-ins, counted per key (an account, a client address) so that the
//! server can make guessers wait longer after each failure. Kept in Postgres rather than in
//! one process's memory: several server processes may answer the same login form.

use std::time::Duration;

use sqlx::Row;

use super::{Store, StoreError};

/// How a key has failed lately.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginFailures {
    pub key: String,
    /// Failures since the key last went quiet for the caller's forget period.
    pub failures: u32,
    /// How long ago the latest failure was.
    pub since_last: Duration,
}

impl Store {
    /// The recent failures of each of `keys` that has any within `forget_after`.
    pub async fn login_failures(&self, keys: &[String], forget_after: Duration) -> Result<Vec<LoginFailures>, StoreError> {
        let rows = sqlx::query(
            "SELECT key, failures, (extract(epoch FROM now() - last_failed_at) * 1000)::bigint AS since_ms
             FROM login_failures
             WHERE key = ANY($1) AND last_failed_at > now() - $2 * interval '1 millisecond'",
        )
        .bind(keys)
        .bind(super::millis(forget_after))
        .fetch_all(&self.pool)
        .await?;
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
            .collect()
    }

    /// Counts one more failure for each of `keys` (starting again from one for a key quiet
    /// for `forget_after`) and forgets keys quiet for a day.
    pub async fn record_login_failure(&self, keys: &[String], forget_after: Duration) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO login_failures (key, failures, last_failed_at)
             SELECT k, 1, now() FROM unnest($1::text[]) AS k
             ON CONFLICT (key) DO UPDATE SET
                 failures = CASE WHEN login_failures.last_failed_at > now() - $2 * interval '1 millisecond'
                                 THEN login_failures.failures + 1 ELSE 1 END,
                 last_failed_at = now()",
        )
        .bind(keys)
        .bind(super::millis(forget_after))
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM login_failures WHERE last_failed_at < now() - interval '1 day'").execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Forgets the failures of `key` (an account that just signed in).
    pub async fn clear_login_failures(&self, key: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM login_failures WHERE key = $1").bind(key).execute(&self.pool).await?;
        Ok(())
    }
}
