//! Per-type retry policies, edited live; every version kept.
//!
//! Resolution order at the moment a failure is recorded: built-in defaults ⊕ the `*` row (the
//! editable global default) ⊕ the job type's row ⊕ the job's own override.

use std::collections::HashMap;
use std::sync::Arc;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::{PgConnection, Postgres, QueryBuilder, Row};

use super::audit::{Actor, record};
use super::lanes::{LaneKeys, Order};
use super::{Store, StoreError, ts, ts_opt};
use crate::job::JobState;
use crate::outcome::{self, Decision, Outcome};
use crate::policy::{self, JitterSource, PolicyPatch, ResolvedPolicy, RetryPolicy};

/// The key of the editable global default layer in `retry_policies`.
pub const DEFAULT_POLICY_KEY: &str = "*";

/// A per-type policy as saved.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoredPolicy {
    pub job_type: String,
    /// The partial policy as saved (OJS JSON form).
    pub policy: Value,
    pub version: i32,
    pub updated_at: Timestamp,
    pub updated_by: Option<String>,
}

/// One saved version of a type's policy. `policy` is `None` for a deletion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyVersion {
    pub job_type: String,
    pub version: i32,
    pub policy: Option<Value>,
    pub created_at: Timestamp,
    pub created_by: Option<String>,
    pub note: Option<String>,
}

/// The stored policy layers (the `*` row and per-type rows) as read at one moment: what
/// deciding a failure needs besides the job. The worker keeps a copy of every row to decide
/// at once whether a failure is retried in place (see [`Store::policy_layers`]).
#[derive(Clone, Debug, Default)]
pub struct PolicyLayers {
    star: Option<PolicyPatch>,
    by_type: HashMap<String, PolicyPatch>,
    /// Each stored type's effective policy, and the defaults' (for types with no row),
    /// resolved once: a copy kept for many failures should not merge layers for each.
    resolved: HashMap<String, Arc<RetryPolicy>>,
    resolved_defaults: Arc<RetryPolicy>,
}

impl PolicyLayers {
    /// Loads the `*` layer and the rows of `types` in one query.
    pub(crate) async fn load(conn: &mut PgConnection, types: &[String]) -> Result<PolicyLayers, StoreError> {
        let rows = sqlx::query("SELECT job_type, policy FROM retry_policies WHERE job_type = '*' OR job_type = ANY($1)")
            .bind(types)
            .fetch_all(&mut *conn)
            .await?;
        Self::from_rows(rows)
    }

    /// Loads every stored layer (the table holds one row per edited type).
    pub(crate) async fn load_all(conn: &mut PgConnection) -> Result<PolicyLayers, StoreError> {
        let rows = sqlx::query("SELECT job_type, policy FROM retry_policies").fetch_all(&mut *conn).await?;
        Self::from_rows(rows)
    }

    fn from_rows(rows: Vec<sqlx::postgres::PgRow>) -> Result<PolicyLayers, StoreError> {
        let mut layers = PolicyLayers::default();
        for row in rows {
            let job_type: String = row.try_get("job_type")?;
            let value: Value = row.try_get("policy")?;
            // A row that no longer parses (edited by hand) must not block failures: skip it loudly.
            match PolicyPatch::from_stored_json(&value).map(clamped) {
                Ok(patch) if job_type == DEFAULT_POLICY_KEY => layers.star = Some(patch),
                Ok(patch) => {
                    layers.by_type.insert(job_type, patch);
                }
                Err(e) => tracing::error!(job_type, error = %e, "stored retry policy is invalid; ignoring it"),
            }
        }
        layers.resolved_defaults = Arc::new(layers.defaults());
        layers.resolved = layers.by_type.keys().map(|t| (t.clone(), Arc::new(layers.resolve_lenient(t, None)))).collect();
        Ok(layers)
    }

    /// Loads the `*` layer and the rows of the types of the given jobs, in one query.
    pub(crate) async fn load_for_jobs(conn: &mut PgConnection, job_ids: &[uuid::Uuid]) -> Result<PolicyLayers, StoreError> {
        let rows = sqlx::query(
            "SELECT job_type, policy FROM retry_policies
             WHERE job_type = '*' OR job_type IN (SELECT DISTINCT type FROM jobs WHERE id = ANY($1))",
        )
        .bind(job_ids)
        .fetch_all(&mut *conn)
        .await?;
        Self::from_rows(rows)
    }

    /// Built-in defaults with the `*` layer applied.
    pub(crate) fn defaults(&self) -> RetryPolicy {
        match &self.star {
            Some(p) => p.apply_to(&RetryPolicy::default()),
            None => RetryPolicy::default(),
        }
    }

    /// The effective policy of a job of `job_type` with its own override.
    pub(crate) fn resolve(&self, job_type: &str, job_patch: Option<&PolicyPatch>) -> Result<ResolvedPolicy, crate::policy::PolicyError> {
        policy::resolve(&self.defaults(), self.by_type.get(job_type), job_patch)
    }

    /// The effective policy for a failure of a job of `job_type` with the stored override
    /// `retry` (a job's `retry` column), resolved leniently (see
    /// [`PolicyLayers::resolve_lenient`]), and what it decides for `outcome` of `attempt`.
    pub fn decide(&self, job_type: &str, retry: Option<&Value>, attempt: i32, outcome: &Outcome, now: Timestamp, rng: &mut dyn JitterSource) -> (Arc<RetryPolicy>, Decision) {
        let policy = match stored_override(retry) {
            Some(patch) => Arc::new(self.resolve_lenient(job_type, Some(&patch))),
            None => self.resolved.get(job_type).unwrap_or(&self.resolved_defaults).clone(),
        };
        let ran = u32::try_from(attempt.max(1)).unwrap_or(1);
        let decision = outcome::decide(ran, &policy, outcome, now, rng);
        (policy, decision)
    }

    /// Like [`PolicyLayers::resolve`], but a job override that no longer combines validly
    /// with a later type edit falls back to the type's policy: recording a failure must
    /// never fail on policy grounds, or the job would be stuck.
    pub(crate) fn resolve_lenient(&self, job_type: &str, job_patch: Option<&PolicyPatch>) -> RetryPolicy {
        match self.resolve(job_type, job_patch) {
            Ok(r) => r.policy,
            Err(e) => {
                tracing::warn!(job_type, error = %e, "job retry override conflicts with the live policy; using the type's policy");
                match self.resolve(job_type, None) {
                    Ok(r) => r.policy,
                    Err(_) => self.defaults(),
                }
            }
        }
    }
}

/// A job's stored retry override. One that no longer parses (edited by hand) is ignored,
/// loudly: a failure must still be recorded.
pub(crate) fn stored_override(retry: Option<&Value>) -> Option<PolicyPatch> {
    match retry.map(PolicyPatch::from_stored_json).transpose() {
        Ok(p) => p.map(clamped),
        Err(e) => {
            tracing::warn!(error = %e, "stored job retry override no longer parses; ignoring it");
            None
        }
    }
}

/// A stored patch with its intervals capped at the bounds (see [`PolicyPatch::clamp_to_bounds`]).
fn clamped(mut patch: PolicyPatch) -> PolicyPatch {
    if patch.clamp_to_bounds() {
        tracing::warn!("a stored retry policy has intervals longer than 365 days; using 365 days");
    }
    patch
}

fn stored_from_row(row: &sqlx::postgres::PgRow) -> Result<StoredPolicy, StoreError> {
    Ok(StoredPolicy {
        job_type: row.try_get("job_type")?,
        policy: row.try_get("policy")?,
        version: row.try_get("version")?,
        updated_at: ts(row, "updated_at")?,
        updated_by: row.try_get("updated_by")?,
    })
}

impl Store {
    /// The saved policy of a job type (or of `*`), if any.
    pub async fn policy(&self, job_type: &str) -> Result<Option<StoredPolicy>, StoreError> {
        let row = sqlx::query("SELECT * FROM retry_policies WHERE job_type = $1")
            .bind(job_type)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(stored_from_row).transpose()
    }

    /// Every saved policy, `*` first, then by type.
    pub async fn policies(&self) -> Result<Vec<StoredPolicy>, StoreError> {
        let rows = sqlx::query("SELECT * FROM retry_policies ORDER BY job_type <> '*', job_type")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(stored_from_row).collect()
    }

    /// The effective policy for a job of `job_type` with an optional override, with the
    /// layer each field came from.
    pub async fn effective_policy(&self, job_type: &str, job_patch: Option<&PolicyPatch>) -> Result<ResolvedPolicy, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let layers = PolicyLayers::load(&mut conn, &[job_type.to_string()]).await?;
        // A job's override is stored data too: shown as the failure path would apply it.
        let job_patch = job_patch.cloned().map(clamped);
        Ok(layers.resolve(job_type, job_patch.as_ref())?)
    }

    /// Every stored policy layer, as of now. Policy edits notify [`POLICY_CHANNEL`]
    /// (a trigger on `retry_policies`), so a copy can be kept fresh.
    ///
    /// [`POLICY_CHANNEL`]: super::POLICY_CHANNEL
    pub async fn policy_layers(&self) -> Result<PolicyLayers, StoreError> {
        let mut conn = self.pool.acquire().await?;
        PolicyLayers::load_all(&mut conn).await
    }

    /// Saves a new version of a type's policy (or of `*`). The result of merging it over the
    /// defaults is validated first; an invalid policy is rejected whole, nothing is written.
    /// The change and its audit entry commit together, and apply at the next failure.
    pub async fn put_policy(&self, job_type: &str, patch: &PolicyPatch, actor: &Actor, note: Option<&str>) -> Result<StoredPolicy, StoreError> {
        if job_type != DEFAULT_POLICY_KEY {
            crate::job::validate_type(job_type)?;
        }
        let mut tx = self.begin().await?;
        // Serialize edits of one type so versions are gap-free and checks see the latest `*`.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('rebound.policy.' || $1, 0))")
            .bind(job_type)
            .execute(&mut *tx)
            .await?;
        let layers = PolicyLayers::load(&mut tx, &[job_type.to_string()]).await?;
        if job_type == DEFAULT_POLICY_KEY {
            policy::resolve(&patch.apply_to(&RetryPolicy::default()), None, None)?;
        } else {
            policy::resolve(&layers.defaults(), Some(patch), None)?;
        }
        let value = patch.to_json();
        let row = sqlx::query(
            "INSERT INTO retry_policies (job_type, policy, version, updated_at, updated_by)
             VALUES ($1, $2, COALESCE((SELECT max(version) FROM retry_policy_versions WHERE job_type = $1), 0) + 1, now(), $3)
             ON CONFLICT (job_type) DO UPDATE
               SET policy = EXCLUDED.policy, version = EXCLUDED.version, updated_at = now(), updated_by = EXCLUDED.updated_by
             RETURNING *",
        )
        .bind(job_type)
        .bind(&value)
        .bind(&actor.name)
        .fetch_one(&mut *tx)
        .await?;
        let stored = stored_from_row(&row)?;
        sqlx::query(
            "INSERT INTO retry_policy_versions (job_type, version, policy, created_by, note) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(job_type)
        .bind(stored.version)
        .bind(&value)
        .bind(&actor.name)
        .bind(note)
        .execute(&mut *tx)
        .await?;
        record(&mut tx, actor, "policy.update", Some(job_type), json!({"version": stored.version, "policy": value, "note": note})).await?;
        tx.commit().await?;
        Ok(stored)
    }

    /// Removes a type's policy so its jobs fall back to the defaults. Returns whether one existed.
    pub async fn delete_policy(&self, job_type: &str, actor: &Actor) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let deleted = sqlx::query("DELETE FROM retry_policies WHERE job_type = $1 RETURNING version")
            .bind(job_type)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = deleted else {
            tx.rollback().await?;
            return Ok(false);
        };
        let version: i32 = row.try_get("version")?;
        sqlx::query("INSERT INTO retry_policy_versions (job_type, version, policy, created_by, note) VALUES ($1, $2, NULL, $3, 'deleted')")
            .bind(job_type)
            .bind(version + 1)
            .bind(&actor.name)
            .execute(&mut *tx)
            .await?;
        record(&mut tx, actor, "policy.delete", Some(job_type), json!({"version": version + 1})).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Every version of a type's policy, newest first.
    pub async fn policy_history(&self, job_type: &str) -> Result<Vec<PolicyVersion>, StoreError> {
        let rows = sqlx::query("SELECT * FROM retry_policy_versions WHERE job_type = $1 ORDER BY version DESC")
            .bind(job_type)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(PolicyVersion {
                    job_type: row.try_get("job_type")?,
                    version: row.try_get("version")?,
                    policy: row.try_get("policy")?,
                    created_at: ts(row, "created_at")?,
                    created_by: row.try_get("created_by")?,
                    note: row.try_get("note")?,
                })
            })
            .collect()
    }

    /// Saves an old version again as the newest one.
    pub async fn restore_policy(&self, job_type: &str, version: i32, actor: &Actor) -> Result<StoredPolicy, StoreError> {
        let row = sqlx::query("SELECT policy FROM retry_policy_versions WHERE job_type = $1 AND version = $2")
            .bind(job_type)
            .bind(version)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::Missing { what: format!("version {version} of the {job_type} policy") })?;
        let value: Option<Value> = row.try_get("policy")?;
        let value = value.ok_or_else(|| StoreError::invalid("version", "that version records a deletion"))?;
        // An old version may predate the bounds: restored as the failure path applied it.
        let patch = PolicyPatch::from_stored_json(&value)?;
        self.put_policy(job_type, &patch, actor, Some(&format!("restored version {version}"))).await
    }

    /// Jobs of a type waiting to retry, with their next run time, soonest first: what a policy
    /// edit would move. Of more than `limit`, the newest `limit` created. `job_type` is one
    /// type (a `.*` prefix is refused, not read as every type under it).
    pub async fn waiting_retries(&self, job_type: &str, limit: i64) -> Result<Vec<(uuid::Uuid, i32, Option<Timestamp>)>, StoreError> {
        crate::job::validate_type(job_type)?;
        // From the type's retryable lanes, not along `jobs_due` in time order: that walked every
        // scheduled job of every other type first (110 ms with 18 000 scheduled at 10M jobs).
        let states = [JobState::Retryable];
        let source = self.source_for(LaneKeys { states: &states, job_type: Some(job_type), ..Default::default() }).await?;
        let mut qb = QueryBuilder::<Postgres>::new("SELECT j.id, j.attempt, j.scheduled_at FROM jobs j WHERE j.id IN (");
        source.push_ids(&mut qb, Order::NewestFirst, limit, |qb, in_lane| {
            if !in_lane {
                qb.push(" AND j.state = 'retryable' AND j.type = ").push_bind(job_type.to_owned());
            }
        });
        qb.push(") ORDER BY j.scheduled_at, j.id");
        let rows = qb.build().fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("attempt")?, ts_opt(r, "scheduled_at")?)))
            .collect()
    }
}
