//! Listing jobs with filters and keyset pagination, and counting them.

use jiff::Timestamp;
use serde::Serialize;
use sqlx::{Postgres, QueryBuilder, Row};
use uuid::Uuid;

use super::{Store, StoreError, jobs_from_rows};
use crate::job::{Job, JobState};

/// Which jobs. Every field narrows; the default matches every job.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobFilter {
    /// Any of these states (empty: any state).
    pub states: Vec<JobState>,
    pub queue: Option<String>,
    pub job_type: Option<String>,
    /// Matches `last_error.type` exactly, or as a prefix when it ends with `.*`.
    pub error_type: Option<String>,
    /// Case-insensitive substring of the args or of `last_error.message`.
    pub text: Option<String>,
    /// Only dead letters (`Some(true)`) or only others (`Some(false)`).
    pub dead_letter: Option<bool>,
    pub created_after: Option<Timestamp>,
    pub created_before: Option<Timestamp>,
}

impl JobFilter {
    /// Only dead letters.
    pub fn dead_letters() -> Self {
        JobFilter { dead_letter: Some(true), ..Default::default() }
    }

    /// Appends ` AND …` conditions for this filter to a query whose `jobs` rows are aliased `j`.
    pub(crate) fn push_conditions(&self, qb: &mut QueryBuilder<Postgres>) {
        // States are spelled as literals (they come from the enum, never from input): the
        // listing indexes leave out `available` and `active`, and only a literal lets the
        // planner prove that a filter stays inside an index's predicate.
        match self.states.as_slice() {
            [] => {}
            // Postgres 15 cannot walk a (…, state, id) index in id order under `IN`, so the
            // common one-state filter is spelled as an equality.
            [one] => {
                qb.push(format_args!(" AND j.state = '{}'", one.as_str()));
            }
            many => {
                let states: Vec<String> = many.iter().map(|s| format!("'{}'", s.as_str())).collect();
                qb.push(format_args!(" AND j.state IN ({})", states.join(", ")));
            }
        }
        if let Some(q) = &self.queue {
            qb.push(" AND j.queue = ").push_bind(q.clone());
        }
        if let Some(t) = &self.job_type {
            qb.push(" AND j.type = ").push_bind(t.clone());
        }
        if let Some(e) = &self.error_type {
            match e.strip_suffix(".*") {
                Some(prefix) => {
                    qb.push(" AND starts_with(j.last_error->>'type', ").push_bind(format!("{prefix}.")).push(")");
                }
                None => {
                    qb.push(" AND j.last_error->>'type' = ").push_bind(e.clone());
                }
            }
        }
        if let Some(text) = self.text.as_deref().filter(|t| !t.is_empty()) {
            let pattern = format!("%{}%", text.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
            qb.push(" AND (j.args::text ILIKE ").push_bind(pattern.clone());
            qb.push(" OR (j.last_error->>'message') ILIKE ").push_bind(pattern).push(")");
        }
        if let Some(d) = self.dead_letter {
            qb.push(" AND j.dead_letter = ").push_bind(d);
        }
        if let Some(t) = self.created_after {
            qb.push(" AND j.created_at >= ").push_bind(t.to_string()).push("::timestamptz");
        }
        if let Some(t) = self.created_before {
            qb.push(" AND j.created_at < ").push_bind(t.to_string()).push("::timestamptz");
        }
    }
}

/// One page of a keyset-paginated listing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `after` to get the next page; `None` on the last page.
    pub next: Option<Uuid>,
}

/// A row of [`Stats`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatsRow {
    pub queue: String,
    pub job_type: String,
    pub state: JobState,
    pub dead_letter: bool,
    pub count: i64,
}

/// Counts by queue, type and state.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    pub rows: Vec<StatsRow>,
}

impl Stats {
    /// Total in a state across queues and types.
    pub fn by_state(&self, state: JobState) -> i64 {
        self.rows.iter().filter(|r| r.state == state).map(|r| r.count).sum()
    }
}

/// Dead letters sharing an error signature: the error type plus the message with digits and
/// ids normalised, so "timeout after 31s" and "timeout after 30s" group together.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorGroup {
    pub error_type: Option<String>,
    pub signature: String,
    pub example_message: Option<String>,
    pub count: i64,
    pub latest: Option<Timestamp>,
}

impl Store {
    /// Jobs matching `filter`, newest first, `limit` at a time (1..=500). `after` is the `next`
    /// of the previous page. Never uses OFFSET, so page 1000 costs what page 1 does.
    pub async fn list_jobs(&self, filter: &JobFilter, after: Option<Uuid>, limit: i64) -> Result<Page<Job>, StoreError> {
        let limit = limit.clamp(1, 500);
        let mut qb = QueryBuilder::<Postgres>::new("SELECT j.* FROM jobs j WHERE true");
        filter.push_conditions(&mut qb);
        if let Some(after) = after {
            qb.push(" AND j.id < ").push_bind(after);
        }
        qb.push(" ORDER BY j.id DESC LIMIT ").push_bind(limit + 1);
        let rows = qb.build().fetch_all(&self.pool).await?;
        let mut items = jobs_from_rows(&rows)?;
        let next = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|j| j.id)
        } else {
            None
        };
        Ok(Page { items, next })
    }

    /// The id that ends the first `offset` jobs matching `filter` in listing order (newest
    /// first), to continue from with [`Store::list_jobs`] as `after`; `None` when fewer match.
    /// For clients that page by offset: it reads ids only (an index-only scan of the listing
    /// index), never the rows it skips.
    pub async fn job_id_at_offset(&self, filter: &JobFilter, offset: i64) -> Result<Option<Uuid>, StoreError> {
        if offset <= 0 {
            return Ok(None);
        }
        let mut qb = QueryBuilder::<Postgres>::new("SELECT j.id FROM jobs j WHERE true");
        filter.push_conditions(&mut qb);
        qb.push(" ORDER BY j.id DESC OFFSET ").push_bind(offset - 1).push(" LIMIT 1");
        Ok(qb.build_query_scalar().fetch_optional(&self.pool).await?)
    }

    /// How many jobs match `filter`, counting at most `cap` (so a huge match stays cheap; the
    /// answer `cap` means "at least cap").
    pub async fn count_jobs(&self, filter: &JobFilter, cap: i64) -> Result<i64, StoreError> {
        let mut qb = QueryBuilder::<Postgres>::new("SELECT count(*) AS n FROM (SELECT 1 FROM jobs j WHERE true");
        filter.push_conditions(&mut qb);
        qb.push(" LIMIT ").push_bind(cap.max(1)).push(") AS capped");
        let row = qb.build().fetch_one(&self.pool).await?;
        Ok(row.try_get("n")?)
    }

    /// Counts by queue, type, state and dead-letter flag.
    pub async fn stats(&self, queue: Option<&str>) -> Result<Stats, StoreError> {
        let rows = sqlx::query(
            "SELECT queue, type, state, dead_letter, count(*) AS n FROM jobs
             WHERE ($1::text IS NULL OR queue = $1)
             GROUP BY queue, type, state, dead_letter ORDER BY queue, type, state",
        )
        .bind(queue)
        .fetch_all(&self.pool)
        .await?;
        let rows = rows
            .iter()
            .map(|r| {
                Ok(StatsRow {
                    queue: r.try_get("queue")?,
                    job_type: r.try_get("type")?,
                    state: r.try_get("state")?,
                    dead_letter: r.try_get("dead_letter")?,
                    count: r.try_get("n")?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Stats { rows })
    }

    /// Dead letters matching `filter`, grouped by error signature, largest groups first.
    pub async fn dead_letter_groups(&self, filter: &JobFilter, limit: i64) -> Result<Vec<ErrorGroup>, StoreError> {
        // Count per signature first (an index-only scan of the partial signature index when
        // unfiltered), then look up one example per group through the same index.
        let mut qb = QueryBuilder::<Postgres>::new(
            "WITH groups AS (
                 SELECT j.error_signature AS signature, count(*) AS n FROM jobs j WHERE j.dead_letter",
        );
        let mut f = filter.clone();
        f.dead_letter = None;
        f.push_conditions(&mut qb);
        qb.push(" GROUP BY 1 ORDER BY n DESC, 1 LIMIT ").push_bind(limit.clamp(1, 200));
        qb.push(
            ")
             SELECT g.signature, g.n, e.error_type, e.example_message, e.latest
             FROM groups g
             CROSS JOIN LATERAL (
                 SELECT x.last_error->>'type' AS error_type, x.last_error->>'message' AS example_message,
                        x.dead_lettered_at AS latest
                 FROM jobs x WHERE x.dead_letter AND x.error_signature = g.signature
                 ORDER BY x.dead_lettered_at DESC LIMIT 1
             ) e
             ORDER BY g.n DESC, g.signature",
        );
        let rows = qb.build().fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(ErrorGroup {
                    error_type: r.try_get("error_type")?,
                    signature: r.try_get("signature")?,
                    example_message: r.try_get("example_message")?,
                    count: r.try_get("n")?,
                    latest: super::ts_opt(r, "latest")?,
                })
            })
            .collect()
    }

    /// Completions and failures per minute over the last `minutes` minutes, oldest first:
    /// `(minute start, completed, failed)`. Pruned jobs and history drop out.
    pub async fn throughput(&self, minutes: i64) -> Result<Vec<(Timestamp, i64, i64)>, StoreError> {
        let rows = sqlx::query(
            "WITH span AS (
                 SELECT date_trunc('minute', now()) - ($1 - 1) * interval '1 minute' AS since
             ), done AS (
                 SELECT date_trunc('minute', completed_at) AS m, count(*) AS n
                 FROM jobs WHERE state = 'completed' AND completed_at >= (SELECT since FROM span) GROUP BY 1
             ), failed AS (
                 SELECT date_trunc('minute', finished_at) AS m, count(*) AS n
                 FROM job_attempts
                 WHERE finished_at >= (SELECT since FROM span) AND outcome NOT IN ('completed', 'released', 'snoozed')
                 GROUP BY 1
             )
             SELECT minutes.m AS minute, COALESCE(done.n, 0) AS completed, COALESCE(failed.n, 0) AS failed
             FROM generate_series((SELECT since FROM span), date_trunc('minute', now()), interval '1 minute') AS minutes(m)
             LEFT JOIN done ON done.m = minutes.m
             LEFT JOIN failed ON failed.m = minutes.m
             ORDER BY minutes.m",
        )
        .bind(minutes.clamp(1, 24 * 60))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((super::ts(r, "minute")?, r.try_get("completed")?, r.try_get("failed")?)))
            .collect()
    }
}
