//! Automatic replay of dead letters (ojs-dead-letter §7): rules that re-drive the dead letters
//! they match some time after their death, at most `max_replays` times per job, and the
//! replayer's pass that applies them.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::json;
use sqlx::postgres::PgRow;
use sqlx::{Postgres, QueryBuilder, Row};
use uuid::Uuid;

use super::audit::{Actor, record};
use super::cancel::JobSelection;
use super::dead_letter::{DeathCursor, Deaths, RedriveBudget, RedriveOptions, death_scan, redrive_in, replay_count, run_death_scan};
use super::listing::JobFilter;
use super::{Store, StoreError, StoredTime, millis, ts, ts_opt};
use crate::job::{validate_queue, validate_type};

/// The most replays a rule may give one job.
pub const MAX_REPLAYS: i32 = 100;

/// The most rules; each is a statement per replayer pass.
pub const MAX_REPLAY_RULES: i64 = 100;

/// How long after its death a dead letter is replayed at the soonest, whatever a rule's delay.
/// A job's `dead_lettered_at` is its failing transaction's start, so a rule walking dead
/// letters in order of death must not pass a time at which a transaction still open may yet
/// commit one. The walk stops short of the oldest open transaction it can see (see
/// [`Store::replay_due`]); this margin covers those it cannot (sessions of other database
/// roles, whose start `pg_stat_activity` hides).
pub const REPLAY_MARGIN: Duration = Duration::from_secs(60);

/// The advisory lock that serializes rule writes ("replay" in ASCII).
const RULE_WRITES_LOCK: i64 = 0x7265_706c_6179;

/// Dead letters a rule looks at per pass.
const REPLAY_BATCH: i64 = 1_000;

/// What an operator sets: which dead letters (each filter optional, all must match), when, and
/// how often.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayRuleSpec {
    /// Lowercase letters, digits, `.`, `-` and `_`, at most 100 characters.
    pub name: String,
    pub queue: Option<String>,
    pub job_type: Option<String>,
    /// The last error's type, exactly, or as a prefix when it ends with `.*`.
    pub error_type: Option<String>,
    /// How long after its death a dead letter is replayed (at least [`REPLAY_MARGIN`] in
    /// effect).
    pub delay: Duration,
    /// Replays one job gets, counting every rule's (its meta's `ojs.replay_count`): 1 to
    /// [`MAX_REPLAYS`].
    pub max_replays: i32,
    pub enabled: bool,
}

/// A stored rule and what it has done.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayRule {
    pub spec: ReplayRuleSpec,
    /// Jobs this rule has replayed.
    pub replayed_total: i64,
    pub last_replayed_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// What one replayer pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    pub replayed: u64,
    /// Some rule has more dead letters to look at now: run again at once.
    pub more: bool,
}

impl ReplayRuleSpec {
    /// Every field's bounds, naming the field.
    pub fn check(&self) -> Result<(), StoreError> {
        check_rule_name(&self.name)?;
        if let Some(q) = &self.queue {
            validate_queue(q).map_err(|e| StoreError::invalid("filter.queue", e.reason))?;
        }
        if let Some(t) = &self.job_type {
            validate_type(t).map_err(|e| StoreError::invalid("filter.type", e.reason))?;
        }
        if let Some(e) = &self.error_type {
            let prefix = e.strip_suffix(".*").unwrap_or(e);
            if prefix.is_empty() || e.len() > 200 || e.chars().any(char::is_control) {
                return Err(StoreError::invalid("filter.error_type", "must be an error type (or a prefix ending in .*), 1 to 200 characters"));
            }
        }
        crate::bounds::check_interval(self.delay).map_err(|reason| StoreError::invalid("delay", reason))?;
        if !(1..=MAX_REPLAYS).contains(&self.max_replays) {
            return Err(StoreError::invalid("max_replays", format!("must be 1 to {MAX_REPLAYS}")));
        }
        Ok(())
    }

    fn filter(&self) -> JobFilter {
        JobFilter {
            queue: self.queue.clone(),
            job_type: self.job_type.clone(),
            error_type: self.error_type.clone(),
            ..JobFilter::dead_letters()
        }
    }
}

/// A rule's name: what events, audit entries and the jobs' meta call it.
pub fn check_rule_name(name: &str) -> Result<(), StoreError> {
    let mut chars = name.chars();
    let ok = name.len() <= 100
        && matches!(chars.next(), Some('a'..='z' | '0'..='9'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '.' | '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::invalid("name", "must be lowercase letters, digits, '.', '-' and '_', starting with a letter or digit, at most 100 characters"))
    }
}

fn rule_from_row(r: &PgRow) -> Result<ReplayRule, StoreError> {
    let delay_ms: i64 = r.try_get("delay_ms")?;
    Ok(ReplayRule {
        spec: ReplayRuleSpec {
            name: r.try_get("name")?,
            queue: r.try_get("queue")?,
            job_type: r.try_get("job_type")?,
            error_type: r.try_get("error_type")?,
            delay: Duration::from_millis(u64::try_from(delay_ms).unwrap_or(0)),
            max_replays: r.try_get("max_replays")?,
            enabled: r.try_get("enabled")?,
        },
        replayed_total: r.try_get("replayed_total")?,
        last_replayed_at: ts_opt(r, "last_replayed_at")?,
        created_at: ts(r, "created_at")?,
        updated_at: ts(r, "updated_at")?,
    })
}

impl Store {
    /// Every replay rule, by name.
    pub async fn replay_rules(&self) -> Result<Vec<ReplayRule>, StoreError> {
        let rows = sqlx::query("SELECT * FROM dead_letter_replay_rules ORDER BY name").fetch_all(&self.pool).await?;
        rows.iter().map(rule_from_row).collect()
    }

    /// One replay rule.
    pub async fn replay_rule(&self, name: &str) -> Result<Option<ReplayRule>, StoreError> {
        let row = sqlx::query("SELECT * FROM dead_letter_replay_rules WHERE name = $1").bind(name).fetch_optional(&self.pool).await?;
        row.as_ref().map(rule_from_row).transpose()
    }

    /// Creates or replaces a replay rule; true if it was created. Checked whole before
    /// anything is written ([`StoreError::Invalid`] naming the field). A changed filter or
    /// `max_replays` makes the rule look at every dead letter again, from the oldest; a change
    /// of delay or of `enabled` alone does not. Audited.
    pub async fn put_replay_rule(&self, spec: &ReplayRuleSpec, actor: &Actor) -> Result<(ReplayRule, bool), StoreError> {
        spec.check()?;
        let mut tx = self.begin().await?;
        // Rule writes are rare: taken one at a time, two creations cannot both pass the cap.
        // An advisory lock only rule writes take: a table lock would also stop a pass holding
        // this rule's row from moving its cursor, while this write waits for that row.
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(RULE_WRITES_LOCK).execute(&mut *tx).await?;
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letter_replay_rules WHERE name <> $1").bind(&spec.name).fetch_one(&mut *tx).await?;
        if count >= MAX_REPLAY_RULES {
            return Err(StoreError::invalid("name", format!("there are already {MAX_REPLAY_RULES} replay rules; delete one first")));
        }
        let row = sqlx::query(
            "INSERT INTO dead_letter_replay_rules AS r (name, queue, job_type, error_type, delay_ms, max_replays, enabled)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (name) DO UPDATE SET
                 queue = EXCLUDED.queue, job_type = EXCLUDED.job_type, error_type = EXCLUDED.error_type,
                 delay_ms = EXCLUDED.delay_ms, max_replays = EXCLUDED.max_replays, enabled = EXCLUDED.enabled,
                 -- Kept only while what the walk decided by stands (no row: both NULL).
                 (cursor_at, cursor_id) = (SELECT r.cursor_at, r.cursor_id
                                           WHERE (r.queue, r.job_type, r.error_type, r.max_replays)
                                                 IS NOT DISTINCT FROM (EXCLUDED.queue, EXCLUDED.job_type, EXCLUDED.error_type, EXCLUDED.max_replays)),
                 updated_at = now()
             RETURNING r.*, (xmax = 0) AS created",
        )
        .bind(&spec.name)
        .bind(&spec.queue)
        .bind(&spec.job_type)
        .bind(&spec.error_type)
        .bind(millis(spec.delay))
        .bind(spec.max_replays)
        .bind(spec.enabled)
        .fetch_one(&mut *tx)
        .await?;
        let created: bool = row.try_get("created")?;
        let rule = rule_from_row(&row)?;
        let action = if created { "dead_letter.replay_rule.create" } else { "dead_letter.replay_rule.update" };
        record(&mut tx, actor, action, Some(&spec.name), json!({ "rule": spec, "delay_ms": millis(spec.delay) })).await?;
        tx.commit().await?;
        Ok((rule, created))
    }

    /// Enables or disables a replay rule, leaving the rest of it (and its place in its walk)
    /// as it is. Audited.
    pub async fn set_replay_rule_enabled(&self, name: &str, enabled: bool, actor: &Actor) -> Result<ReplayRule, StoreError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("UPDATE dead_letter_replay_rules SET enabled = $2, updated_at = now() WHERE name = $1 RETURNING *")
            .bind(name)
            .bind(enabled)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::Missing { what: format!("replay rule {name}") })?;
        let action = if enabled { "dead_letter.replay_rule.enable" } else { "dead_letter.replay_rule.disable" };
        record(&mut tx, actor, action, Some(name), json!({})).await?;
        tx.commit().await?;
        rule_from_row(&row)
    }

    /// Deletes a replay rule; false if there was none. Audited.
    pub async fn delete_replay_rule(&self, name: &str, actor: &Actor) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let gone = sqlx::query("DELETE FROM dead_letter_replay_rules WHERE name = $1").bind(name).execute(&mut *tx).await?.rows_affected();
        if gone == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        record(&mut tx, actor, "dead_letter.replay_rule.delete", Some(name), json!({})).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The replayer's pass: each enabled rule, in its own transaction, looks at the next
    /// dead letters (at most 1 000) that died since the last one it looked at and are due: by
    /// its delay, at least [`REPLAY_MARGIN`] ago, and before the oldest transaction still open
    /// began (one of those may yet commit a dead letter that died then). Of those it
    /// re-drives, with a fresh budget, the ones it matches that have had fewer than its
    /// `max_replays`. A job two rules match is replayed by the first by name that reaches it.
    /// A rule that fails is logged and left to the next pass, and the others go on; the pass
    /// answers that error only if no rule replayed anything.
    pub async fn replay_due(&self) -> Result<ReplayReport, StoreError> {
        let names: Vec<String> = sqlx::query_scalar("SELECT name FROM dead_letter_replay_rules WHERE enabled ORDER BY name").fetch_all(&self.pool).await?;
        let mut report = ReplayReport::default();
        let mut failed = None;
        for name in names {
            // One rule's failure (a lock timeout, a deadlock broken) leaves the others theirs.
            match self.replay_rule_once(&name).await {
                Ok((replayed, more)) => {
                    report.replayed += replayed;
                    report.more |= more;
                }
                Err(e) => {
                    tracing::warn!(rule = name, error = %e, "a replay rule's pass failed; the next pass tries it again");
                    failed = Some(e);
                }
            }
        }
        match failed {
            Some(e) if report.replayed == 0 => Err(e),
            _ => Ok(report),
        }
    }

    async fn replay_rule_once(&self, name: &str) -> Result<(u64, bool), StoreError> {
        let mut tx = self.begin().await?;
        // Locked, so an edit made meanwhile waits for the pass instead of having its reset
        // cursor overwritten by it.
        let Some(row) = sqlx::query("SELECT * FROM dead_letter_replay_rules WHERE name = $1 AND enabled FOR UPDATE")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?
        else {
            tx.rollback().await?;
            return Ok((0, false));
        };
        let rule = rule_from_row(&row)?;
        let cursor_at: Option<StoredTime> = row.try_get("cursor_at")?;
        let cursor_id: Option<Uuid> = row.try_get("cursor_id")?;
        let spec = &rule.spec;

        // Read before the walk, in a statement of its own: a transaction not open now has
        // committed or rolled back, so the walk's later snapshot sees what it wrote.
        let due_before: StoredTime = sqlx::query_scalar(
            "SELECT LEAST(now() - $1 * interval '1 millisecond',
                          (SELECT min(xact_start) FROM pg_stat_activity
                           WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()))",
        )
        .bind(millis(spec.delay.max(REPLAY_MARGIN)))
        .fetch_one(&mut *tx)
        .await?;
        // The next dead letters by time of death, matching or not, so the walk advances over
        // what the rule passes by. By the queue's index when the rule names one.
        let past = match (cursor_at, cursor_id) {
            (Some(at), Some(id)) => Some(DeathCursor { at: at.0, id }),
            _ => None,
        };
        let scan = death_scan(spec.queue.as_deref(), Deaths::OldestFirst, past, None, Some(due_before.0), REPLAY_BATCH);
        let seen = run_death_scan(scan, &mut *tx).await?;
        let Some(last) = seen.last().copied() else {
            tx.rollback().await?;
            return Ok((0, false));
        };

        // Of those, what the rule matches, locked in id order as every bulk action locks.
        let ids: Vec<Uuid> = seen.iter().map(|c| c.id).collect();
        let mut pick = QueryBuilder::<Postgres>::new("SELECT j.id FROM jobs j WHERE j.dead_letter AND j.id = ANY(");
        pick.push_bind(ids).push(concat!(") AND ", replay_count!(), " < ")).push_bind(spec.max_replays);
        // Re-driven and dead again since the walk read it: due only by its new death.
        pick.push(" AND j.dead_lettered_at < ").push_bind(jiff_sqlx::Timestamp::from(due_before.0));
        spec.filter().push_conditions(&mut pick);
        pick.push(" ORDER BY j.id FOR UPDATE");
        let matched: Vec<Uuid> = pick.build_query_scalar().fetch_all(&mut *tx).await?;

        let replayed = if matched.is_empty() {
            0
        } else {
            let opts = RedriveOptions {
                budget: RedriveBudget::Fresh,
                stagger: None,
                actor: Actor::system(&format!("replay-rule:{name}")),
                reason: Some(format!("replay rule {name}")),
            };
            redrive_in(&mut tx, &JobSelection::Ids(matched), &opts, None, Some(name)).await?
        };
        sqlx::query(
            "UPDATE dead_letter_replay_rules SET cursor_at = $2, cursor_id = $3, replayed_total = replayed_total + $4,
                 last_replayed_at = CASE WHEN $4 > 0 THEN now() ELSE last_replayed_at END
             WHERE name = $1",
        )
        .bind(name)
        .bind(jiff_sqlx::Timestamp::from(last.at))
        .bind(last.id)
        .bind(replayed as i64)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((replayed, seen.len() as i64 >= REPLAY_BATCH))
    }
}
