//! Browsers an operator has signed in from (`sign_in_devices`): a browser that presents its
//! device token along with its operator's username is let past the sign-in throttles and the
//! queue for password checks that strangers share (the OWASP "device cookie" defence), so a
//! flood of guesses can delay a new browser but never lock an operator out of one they have
//! used. The token proves only that the browser signed in as that operator before; the
//! password is still checked.

use std::time::Duration;

use sqlx::Row;

use super::{Store, StoreError, millis};

impl Store {
    /// The username of the operator whose live device token hashes to `token_hash`, if that
    /// operator is still enabled.
    pub async fn sign_in_device_operator(&self, token_hash: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query(
            "SELECT o.username FROM sign_in_devices d JOIN operators o ON o.id = d.operator_id
             WHERE d.token_hash = $1 AND d.expires_at > now() AND NOT o.disabled",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.try_get("username")).transpose()?)
    }

    /// Remembers (or, for a token it already has, renews) the device `token_hash` of
    /// `operator_id` for `ttl` from now. Only the operator's `keep` most recently used devices
    /// are kept, so a script signing in without keeping cookies cannot grow the table; expired
    /// devices of every operator are deleted. Returns false, changing nothing, if the token is
    /// another operator's.
    pub async fn remember_sign_in_device(&self, operator_id: i64, token_hash: &str, ttl: Duration, keep: i64) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let written = sqlx::query(
            "INSERT INTO sign_in_devices (token_hash, operator_id, expires_at)
             VALUES ($1, $2, now() + $3 * interval '1 millisecond')
             ON CONFLICT (token_hash) DO UPDATE SET last_used_at = now(), expires_at = excluded.expires_at
             WHERE sign_in_devices.operator_id = excluded.operator_id",
        )
        .bind(token_hash)
        .bind(operator_id)
        .bind(millis(ttl))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if written == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query(
            "DELETE FROM sign_in_devices WHERE token_hash = ANY(ARRAY(
                 SELECT token_hash FROM sign_in_devices WHERE operator_id = $1
                 ORDER BY last_used_at DESC OFFSET $2))",
        )
        .bind(operator_id)
        .bind(keep)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM sign_in_devices WHERE expires_at < now()").execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Forgets the device `token_hash` if its throttle key `failure_key` has `limit` recent
    /// failures or more (counted by [`Store::start_login_attempt`]): a browser that keeps
    /// failing is no longer trusted past the throttles. Returns whether it was forgotten.
    pub async fn forget_failing_sign_in_device(&self, token_hash: &str, failure_key: &str, limit: i32) -> Result<bool, StoreError> {
        let forgotten = sqlx::query(
            "DELETE FROM sign_in_devices WHERE token_hash = $1
               AND (SELECT failures FROM login_failures WHERE key = $2) >= $3",
        )
        .bind(token_hash)
        .bind(failure_key)
        .bind(limit)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(forgotten > 0)
    }
}
