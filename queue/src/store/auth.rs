//! Operators, their sessions, and API tokens. Secrets arrive here already hashed: the server
//! hashes passwords with argon2 and tokens with SHA-256, so this module never sees one.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::json;
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::audit::{Actor, record};
use super::{Store, StoreError, millis, ts, ts_opt};

/// Longest operator username, in bytes. A sign-in with a longer one cannot match anybody and
/// is refused before it reaches the database.
pub const MAX_USERNAME_BYTES: usize = 64;

/// How long a session may go unused before [`Store::session`] ends it. The server passes its
/// own limit (`--session-idle-timeout`, the same by default) to [`Store::live_session`].
const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A session's `last_seen_at` is refreshed at most this often (or at half the idle limit, if
/// that is shorter): every dashboard request resolves its session, and writing the row on each
/// one would cost a write per request and serialize a browser's requests on that row's lock.
const SESSION_SEEN_GRANULARITY: Duration = Duration::from_secs(60);

/// What an operator may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read everything, change nothing.
    Viewer,
    /// Act: re-drive, cancel, edit policies, pause queues.
    Operator,
}

impl Role {
    /// `"viewer"` or `"operator"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }

    /// Parses `"viewer"` / `"operator"`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }
}

/// A person who logs in to the dashboard.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Operator {
    pub id: i64,
    pub username: String,
    #[serde(skip)]
    pub password_hash: String,
    pub role: Role,
    pub disabled: bool,
    pub created_at: Timestamp,
    pub last_login_at: Option<Timestamp>,
}

/// A logged-in session with its operator.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Session {
    pub operator: Operator,
    pub csrf_token: String,
    pub expires_at: Timestamp,
}

/// An API client's token (the secret itself is never stored).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ApiToken {
    pub id: i64,
    pub name: String,
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
    pub last_used_at: Option<Timestamp>,
}

fn operator_from_row(r: &PgRow) -> Result<Operator, StoreError> {
    let role: String = r.try_get("role")?;
    Ok(Operator {
        id: r.try_get("id")?,
        username: r.try_get("username")?,
        password_hash: r.try_get("password_hash")?,
        role: Role::parse(&role).unwrap_or(Role::Viewer),
        disabled: r.try_get("disabled")?,
        created_at: ts(r, "created_at")?,
        last_login_at: ts_opt(r, "last_login_at")?,
    })
}

fn token_from_row(r: &PgRow) -> Result<ApiToken, StoreError> {
    Ok(ApiToken {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        created_at: ts(r, "created_at")?,
        revoked_at: ts_opt(r, "revoked_at")?,
        last_used_at: ts_opt(r, "last_used_at")?,
    })
}

impl Store {
    /// Creates an operator, or updates the password and role of an existing one. An existing
    /// operator's sessions end and their known browsers are forgotten: whoever signed in with
    /// the old password (or role) must sign in again, as a stranger.
    pub async fn upsert_operator(&self, username: &str, password_hash: &str, role: Role, actor: &Actor) -> Result<Operator, StoreError> {
        if username.trim().is_empty() || username.len() > MAX_USERNAME_BYTES {
            return Err(StoreError::invalid("username", "must be 1 to 64 characters"));
        }
        let mut tx = self.begin().await?;
        let row = sqlx::query(
            "INSERT INTO operators (username, password_hash, role) VALUES ($1, $2, $3)
             ON CONFLICT (username) DO UPDATE SET password_hash = EXCLUDED.password_hash, role = EXCLUDED.role, disabled = false
             RETURNING *",
        )
        .bind(username)
        .bind(password_hash)
        .bind(role.as_str())
        .fetch_one(&mut *tx)
        .await?;
        let id: i64 = row.try_get("id")?;
        let ended = sqlx::query("DELETE FROM sessions WHERE operator_id = $1").bind(id).execute(&mut *tx).await?.rows_affected();
        // Browsers that signed in with the old password are no longer known either.
        sqlx::query("DELETE FROM sign_in_devices WHERE operator_id = $1").bind(id).execute(&mut *tx).await?;
        record(&mut tx, actor, "operator.upsert", Some(username), json!({"role": role.as_str(), "sessions_ended": ended})).await?;
        tx.commit().await?;
        operator_from_row(&row)
    }

    /// An operator by name.
    pub async fn operator(&self, username: &str) -> Result<Option<Operator>, StoreError> {
        let row = sqlx::query("SELECT * FROM operators WHERE username = $1").bind(username).fetch_optional(&self.pool).await?;
        row.as_ref().map(operator_from_row).transpose()
    }

    /// Every operator.
    pub async fn operators(&self) -> Result<Vec<Operator>, StoreError> {
        let rows = sqlx::query("SELECT * FROM operators ORDER BY username").fetch_all(&self.pool).await?;
        rows.iter().map(operator_from_row).collect()
    }

    /// Disables an operator, ends their sessions and forgets their known browsers. Returns
    /// whether they existed.
    pub async fn disable_operator(&self, username: &str, actor: &Actor) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let id: Option<i64> = sqlx::query_scalar("UPDATE operators SET disabled = true WHERE username = $1 RETURNING id")
            .bind(username)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(id) = id {
            sqlx::query("DELETE FROM sessions WHERE operator_id = $1").bind(id).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM sign_in_devices WHERE operator_id = $1").bind(id).execute(&mut *tx).await?;
            record(&mut tx, actor, "operator.disable", Some(username), json!({})).await?;
        }
        tx.commit().await?;
        Ok(id.is_some())
    }

    /// Removes an operator; their sessions go with them. Returns whether they existed. Their
    /// audit entries stay (they name the operator, not the row).
    pub async fn remove_operator(&self, username: &str, actor: &Actor) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let removed = sqlx::query("DELETE FROM operators WHERE username = $1").bind(username).execute(&mut *tx).await?.rows_affected() > 0;
        if removed {
            record(&mut tx, actor, "operator.remove", Some(username), json!({})).await?;
        }
        tx.commit().await?;
        Ok(removed)
    }

    /// Starts a session for an operator.
    pub async fn create_session(&self, operator_id: i64, token_hash: &str, csrf_token: &str, ttl: Duration) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO sessions (token_hash, operator_id, csrf_token, expires_at)
             VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')",
        )
        .bind(token_hash)
        .bind(operator_id)
        .bind(csrf_token)
        .bind(millis(ttl))
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE operators SET last_login_at = now() WHERE id = $1").bind(operator_id).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM sessions WHERE expires_at < now()").execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The live session for a token hash, if any, ending sessions unused for 30 minutes (see
    /// [`Store::live_session`]).
    pub async fn session(&self, token_hash: &str) -> Result<Option<Session>, StoreError> {
        self.live_session(token_hash, DEFAULT_SESSION_IDLE_TIMEOUT).await
    }

    /// The live session for a token hash, if any, marking it used. Expired sessions, sessions
    /// unused for longer than `idle_timeout` and disabled operators have none; an expired or
    /// idle session is deleted when it is presented. `last_seen_at` is refreshed at most once a
    /// minute (like `last_used_at` in [`Store::verify_token`]), or every half `idle_timeout` if
    /// that is shorter, so that a session in use never looks idle.
    pub async fn live_session(&self, token_hash: &str, idle_timeout: Duration) -> Result<Option<Session>, StoreError> {
        let refresh_after = SESSION_SEEN_GRANULARITY.min(idle_timeout / 2);
        // The delete re-checks the row itself: a concurrent request may have just refreshed it.
        let row = sqlx::query(
            "WITH found AS (
                 SELECT token_hash, operator_id, csrf_token, expires_at, last_seen_at,
                        expires_at > now() AND last_seen_at > now() - $2 * interval '1 millisecond' AS live
                 FROM sessions WHERE token_hash = $1
             ), touched AS (
                 UPDATE sessions s SET last_seen_at = now() FROM found
                 WHERE s.token_hash = found.token_hash AND found.live
                   AND found.last_seen_at <= now() - $3 * interval '1 millisecond'
             ), ended AS (
                 DELETE FROM sessions s USING found
                 WHERE s.token_hash = found.token_hash AND NOT found.live
                   AND (s.expires_at <= now() OR s.last_seen_at <= now() - $2 * interval '1 millisecond')
             )
             SELECT o.*, found.csrf_token, found.expires_at
             FROM found JOIN operators o ON o.id = found.operator_id
             WHERE found.live AND NOT o.disabled",
        )
        .bind(token_hash)
        .bind(millis(idle_timeout))
        .bind(millis(refresh_after))
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref()
            .map(|r| {
                Ok(Session { operator: operator_from_row(r)?, csrf_token: r.try_get("csrf_token")?, expires_at: ts(r, "expires_at")? })
            })
            .transpose()
    }

    /// Ends a session.
    pub async fn delete_session(&self, token_hash: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sessions WHERE token_hash = $1").bind(token_hash).execute(&self.pool).await?;
        Ok(())
    }

    /// Stores a new API token under a unique name.
    pub async fn create_token(&self, name: &str, token_hash: &str, actor: &Actor) -> Result<ApiToken, StoreError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("INSERT INTO api_tokens (name, token_hash) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING RETURNING *")
            .bind(name)
            .bind(token_hash)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::Duplicate { reason: format!("a token named {name:?} already exists"), existing: None })?;
        record(&mut tx, actor, "token.create", Some(name), json!({})).await?;
        tx.commit().await?;
        token_from_row(&row)
    }

    /// Revokes a token by name. Returns whether a live one existed.
    pub async fn revoke_token(&self, name: &str, actor: &Actor) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let n = sqlx::query("UPDATE api_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL")
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n > 0 {
            record(&mut tx, actor, "token.revoke", Some(name), json!({})).await?;
        }
        tx.commit().await?;
        Ok(n > 0)
    }

    /// Every token, revoked ones included.
    pub async fn tokens(&self) -> Result<Vec<ApiToken>, StoreError> {
        let rows = sqlx::query("SELECT * FROM api_tokens ORDER BY name").fetch_all(&self.pool).await?;
        rows.iter().map(token_from_row).collect()
    }

    /// The live token with this hash, marking it used. `last_used_at` is refreshed at most
    /// once a minute: every API request verifies its token, and writing the same row on each
    /// one would serialize all requests of a client on that row's lock.
    pub async fn verify_token(&self, token_hash: &str) -> Result<Option<ApiToken>, StoreError> {
        let row = sqlx::query(
            "WITH live AS (
                 SELECT * FROM api_tokens WHERE token_hash = $1 AND revoked_at IS NULL
             ), touched AS (
                 UPDATE api_tokens t SET last_used_at = now() FROM live
                 WHERE t.id = live.id AND (live.last_used_at IS NULL OR live.last_used_at < now() - interval '1 minute')
             )
             SELECT * FROM live",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(token_from_row).transpose()
    }
}
