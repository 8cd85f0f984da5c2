//! The audit log: who did what to which target, written in the same transaction as the change.

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, Row};

use super::listing::like_literal;
use super::{Store, StoreError, ts};

/// Who is acting: an operator's name, an API token's name, or a system component.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Actor {
    pub name: String,
}

impl Actor {
    /// A person or API client.
    pub fn new(name: impl Into<String>) -> Self {
        Actor { name: name.into() }
    }

    /// A component of Rebound itself, e.g. `system:pruner`.
    pub fn system(component: &str) -> Self {
        Actor { name: format!("system:{component}") }
    }
}

/// One audit entry.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditEntry {
    pub id: i64,
    pub at: Timestamp,
    pub actor: String,
    pub action: String,
    pub target: Option<String>,
    pub details: Value,
}

/// Filters for [`Store::audit_log`]; `before` is the keyset cursor (an entry id).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuditFilter {
    pub actor: Option<String>,
    pub action: Option<String>,
    pub target: Option<String>,
    pub before: Option<i64>,
    pub limit: i64,
}

/// Writes an entry inside the caller's transaction.
pub(crate) async fn record(conn: &mut PgConnection, actor: &Actor, action: &str, target: Option<&str>, details: Value) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO audit_log (actor, action, target, details) VALUES ($1, $2, $3, $4)")
        .bind(&actor.name)
        .bind(action)
        .bind(target)
        .bind(details)
        .execute(conn)
        .await?;
    Ok(())
}

impl Store {
    /// Records an action that has no other write of its own (e.g. a login).
    pub async fn audit(&self, actor: &Actor, action: &str, target: Option<&str>, details: Value) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        record(&mut conn, actor, action, target, details).await
    }

    /// Audit entries, newest first, filtered; `action` matches as a prefix (`job.` finds all job
    /// actions), taken literally: a `_` or `%` in it is that character, not a wildcard.
    pub async fn audit_log(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        let limit = if filter.limit <= 0 { 50 } else { filter.limit.min(500) };
        // Planned for each request's own filters (`persistent(false)`): a cached statement's
        // generic plan can use no index for `$1 IS NULL OR actor = $1`, and a rare actor or
        // target walked the whole log newest first (1 000 000 entries: 250-320 ms).
        //
        // An action prefix is read action by action: the few actions it matches are found
        // with a skip over the action index, and each one's newest entries come from it in id
        // order. Left to itself the planner walked the log newest first for a rare action: its
        // statistics sample had never seen one written five times in a million, so it reckoned
        // it as common as the rest (235 ms).
        //
        // The prefix is escaped (`like_literal`): unescaped, `_` or `%` matched every action,
        // and `%zz` had no fixed prefix to skip by, so it read the whole action index.
        let action = filter.action.as_deref().map(like_literal);
        let sql = if filter.action.is_some() {
            "WITH RECURSIVE matching(action) AS (
                 (SELECT action FROM audit_log WHERE action LIKE $2 || '%' ORDER BY action USING ~<~ LIMIT 1)
                 UNION ALL
                 SELECT (SELECT l.action FROM audit_log l WHERE l.action ~>~ m.action AND l.action LIKE $2 || '%'
                         ORDER BY l.action USING ~<~ LIMIT 1)
                 FROM matching m WHERE m.action IS NOT NULL
             )
             SELECT e.* FROM matching m CROSS JOIN LATERAL (
                 SELECT * FROM audit_log l
                 WHERE l.action = m.action
                   AND ($1::text IS NULL OR l.actor = $1)
                   AND ($3::text IS NULL OR l.target = $3)
                   AND ($4::bigint IS NULL OR l.id < $4)
                 ORDER BY l.id DESC LIMIT $5) e
             WHERE m.action IS NOT NULL
             ORDER BY e.id DESC LIMIT $5"
        } else {
            "SELECT * FROM audit_log
             WHERE ($1::text IS NULL OR actor = $1)
               AND $2::text IS NULL
               AND ($3::text IS NULL OR target = $3)
               AND ($4::bigint IS NULL OR id < $4)
             ORDER BY id DESC LIMIT $5"
        };
        let rows = sqlx::query(sql)
            .persistent(false)
            .bind(&filter.actor)
            .bind(&action)
            .bind(&filter.target)
            .bind(filter.before)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(AuditEntry {
                    id: r.try_get("id")?,
                    at: ts(r, "at")?,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    target: r.try_get("target")?,
                    details: r.try_get("details")?,
                })
            })
            .collect()
    }
}
