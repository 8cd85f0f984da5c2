//! Listing jobs with filters and keyset pagination, and counting them.

use jiff::Timestamp;
use serde::Serialize;
use sqlx::{Postgres, QueryBuilder, Row};
use uuid::Uuid;

use super::lanes::{LaneKeys, Order, Source};
use super::{Store, StoreError, jobs_from_rows};
use crate::job::{Job, JobState};

/// Which jobs. Every field narrows; the default matches every job.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobFilter {
    /// Any of these states (empty: any state).
    pub states: Vec<JobState>,
    pub queue: Option<String>,
    /// The job type exactly, or every type under a prefix when it ends with `.*` (`email.*`:
    /// `email.send`, `email.digest.weekly`, …), as OJS' admin listing offers.
    pub job_type: Option<String>,
    /// Matches `last_error.type` exactly, or as a prefix when it ends with `.*`.
    pub error_type: Option<String>,
    /// Case-insensitive substring of the args or of `last_error.message`.
    pub text: Option<String>,
    /// Only dead letters (`Some(true)`) or only others (`Some(false)`).
    pub dead_letter: Option<bool>,
    pub created_after: Option<Timestamp>,
    pub created_before: Option<Timestamp>,
    /// Only jobs dead-lettered at or after this time (so only dead letters). Checked row by
    /// row, like text: a listing stays in id order, so a filter by when jobs died searches
    /// windows of the newest dead letters (see [`SEARCH_WINDOW`]).
    pub dead_after: Option<Timestamp>,
    /// Only jobs dead-lettered before this time.
    pub dead_before: Option<Timestamp>,
}

impl JobFilter {
    /// Only dead letters.
    pub fn dead_letters() -> Self {
        JobFilter { dead_letter: Some(true), ..Default::default() }
    }

    /// Appends ` AND …` conditions for this filter to a query whose `jobs` rows are aliased `j`.
    pub(crate) fn push_conditions(&self, qb: &mut QueryBuilder<Postgres>) {
        self.push_conditions_in(qb, false);
    }

    /// [`JobFilter::push_conditions`], or inside a lane of the listing index (`in_lane`),
    /// whose keys already fix the state, queue, type and dead-letter flag (the lanes read are
    /// the ones these conditions select; see [`super::lanes`]).
    pub(crate) fn push_conditions_in(&self, qb: &mut QueryBuilder<Postgres>, in_lane: bool) {
        self.push_indexed(qb, in_lane);
        self.push_residual(qb);
    }

    /// Appends ` AND …` matching the filter's job type (exact, or a `.*` prefix) to `column`.
    pub(crate) fn push_type(&self, qb: &mut QueryBuilder<Postgres>, column: &'static str) {
        let Some(t) = &self.job_type else { return };
        match dotted_prefix(t) {
            Some(prefix) => {
                qb.push(format_args!(" AND starts_with({column}, ")).push_bind(prefix.to_owned()).push(")");
            }
            None => {
                qb.push(format_args!(" AND {column} = ")).push_bind(t.clone());
            }
        }
    }

    /// The keys of the listing index's lanes this filter reads.
    pub(crate) fn lane_keys(&self) -> LaneKeys<'_> {
        LaneKeys { states: &self.states, queue: self.queue.as_deref(), job_type: self.job_type.as_deref(), dead_letter: self.dead_letter }
    }

    /// Whether some condition can only be checked row by row (text, error type): a listing
    /// then searches a bounded window of the newest jobs matching the rest, see
    /// [`SEARCH_WINDOW`], instead of possibly reading every job to fill a page.
    pub fn is_search(&self) -> bool {
        self.text.as_deref().is_some_and(|t| !t.is_empty()) || self.error_type.is_some() || self.dead_after.is_some() || self.dead_before.is_some()
    }

    /// Whether every condition is a key of the maintained counters (state, queue, type,
    /// dead-letter flag), so counts need not read jobs.
    fn counted_by_counters(&self) -> bool {
        !self.is_search() && self.created_after.is_none() && self.created_before.is_none()
    }

    /// The conditions the listing indexes answer: state, queue, type, dead-letter flag, and
    /// time ranges as id ranges (ids are UUIDv7: their leading bits are the creation time).
    fn push_indexed(&self, qb: &mut QueryBuilder<Postgres>, in_lane: bool) {
        if !in_lane {
            self.push_keys(qb);
        }
        // By the id's timestamp alone (an id is made when its job is created; a client may
        // choose one, but only a UUIDv7), so a range is an index range and counting it reads
        // no rows. Millisecond precision: the bound's own millisecond is inside the range.
        if let Some(t) = self.created_after {
            qb.push(" AND j.id >= ").push_bind(uuid_floor(t.as_millisecond()));
        }
        if let Some(t) = self.created_before {
            qb.push(" AND j.id < ").push_bind(uuid_floor(t.as_millisecond().saturating_add(1)));
        }
    }

    /// The conditions on the keys of the listing lanes and the counters.
    fn push_keys(&self, qb: &mut QueryBuilder<Postgres>) {
        // States are spelled as literals (they come from the enum, never from input): the
        // listing indexes are partial (by state), and only a literal lets the
        // planner prove that a filter stays inside an index's predicate.
        match self.states.as_slice() {
            [] => {}
            // Postgres 15 cannot walk a (…, state, id) index in id order under `IN`, so the
            // common one-state filter is spelled as an equality.
            [one] => {
                qb.push(format_args!(" AND j.state = '{}'", one.as_str()));
            }
            many => {
                qb.push(format_args!(" AND j.state IN ({})", JobState::sql_literals(many)));
            }
        }
        if let Some(q) = &self.queue {
            qb.push(" AND j.queue = ").push_bind(q.clone());
        }
        self.push_type(qb, "j.type");
        if let Some(d) = self.dead_letter {
            // A literal, like the states: a bound parameter cannot prove the predicate of the
            // dead-letter indexes, and a generic plan would then scan every job.
            qb.push(if d { " AND j.dead_letter" } else { " AND NOT j.dead_letter" });
        }
    }

    /// The conditions checked row by row.
    fn push_residual(&self, qb: &mut QueryBuilder<Postgres>) {
        // A job that is not a dead letter has no `dead_lettered_at`, so these select dead
        // letters only.
        if let Some(t) = self.dead_after {
            qb.push(" AND j.dead_lettered_at >= ").push_bind(t.to_string()).push("::timestamptz");
        }
        if let Some(t) = self.dead_before {
            qb.push(" AND j.dead_lettered_at < ").push_bind(t.to_string()).push("::timestamptz");
        }
        if let Some(e) = &self.error_type {
            match dotted_prefix(e) {
                Some(prefix) => {
                    qb.push(" AND starts_with(j.last_error->>'type', ").push_bind(prefix.to_owned()).push(")");
                }
                None => {
                    qb.push(" AND j.last_error->>'type' = ").push_bind(e.clone());
                }
            }
        }
        if let Some(text) = self.text.as_deref().filter(|t| !t.is_empty()) {
            let pattern = format!("%{}%", like_literal(text));
            qb.push(" AND (j.args::text ILIKE ").push_bind(pattern.clone());
            qb.push(" OR (j.last_error->>'message') ILIKE ").push_bind(pattern).push(")");
        }
    }
}

/// The prefix (with its final `.`) of a dot-namespaced filter ending in `.*` (a job type's or
/// an error type's); `None` for an exact name.
pub(crate) fn dotted_prefix(t: &str) -> Option<&str> {
    t.strip_suffix('*').filter(|p| p.ends_with('.'))
}

/// `s` as a `LIKE` / `ILIKE` pattern that matches exactly `s`: its `\`, `%` and `_` escaped
/// with `\` (the default escape character), so input is never a wildcard. Put `%` around it
/// for a substring, after it for a prefix. Shared by every pattern built from input (the
/// job search here, the audit log's action prefix).
pub(crate) fn like_literal(s: &str) -> String {
    s.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")
}

/// How many of the newest jobs matching a filter's indexed conditions one search request
/// reads (text and error-type conditions are checked row by row, so an unlimited search for a
/// rare string would read all ten million jobs). A page that ran out of window before it
/// filled continues from where the window ended: paging on searches older jobs.
pub const SEARCH_WINDOW: i64 = 5_000;

/// The smallest UUIDv7 of Unix millisecond `ms` (all random bits zero): ids at or above it were
/// created in that millisecond or later.
fn uuid_floor(ms: i64) -> Uuid {
    let ms = ms.clamp(0, (1i64 << 48) - 1) as u64;
    uuid::Builder::from_unix_timestamp_millis(ms, &[0; 10]).into_uuid()
}

/// A count of matching jobs, as far as it was cheap to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct JobCount {
    pub n: i64,
    /// At least `n` match: counting stopped at the cap.
    pub capped: bool,
    /// A search: `n` counts only the newest [`SEARCH_WINDOW`] jobs matching the indexed
    /// conditions (`true` when there were more than that).
    pub windowed: bool,
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
        let source = self.source_of(filter).await?;
        let window_end = self.window_end_for(filter, &source, after).await?;
        self.list_jobs_in(filter, &source, after, limit, window_end, Order::NewestFirst).await
    }

    /// [`Store::list_jobs`] in either order of creation: oldest first pages on from `after`
    /// to newer jobs. Refused for a search, whose window is of the newest matches.
    pub async fn list_jobs_ordered(&self, filter: &JobFilter, after: Option<Uuid>, limit: i64, order: Order) -> Result<Page<Job>, StoreError> {
        if order == Order::NewestFirst {
            return self.list_jobs(filter, after, limit).await;
        }
        if filter.is_search() {
            return Err(StoreError::invalid("order", "a search lists its matches newest first"));
        }
        let source = self.source_of(filter).await?;
        self.list_jobs_in(filter, &source, after, limit, None, order).await
    }

    /// Where `filter`'s jobs are read from: the listing index's lanes that can match, or the
    /// table (see [`super::lanes`]). Dead letters have indexes of their own.
    pub(crate) async fn source_of(&self, filter: &JobFilter) -> Result<Source, StoreError> {
        if filter.dead_letter == Some(true) {
            return Ok(Source::Table);
        }
        self.source_for(filter.lane_keys()).await
    }

    /// A page of [`Store::list_jobs`] and the count of [`Store::count_jobs_bounded`], for a
    /// page that shows both: a search's first page and its count read the same window, which
    /// is found once.
    pub async fn list_jobs_counted(
        &self,
        filter: &JobFilter,
        after: Option<Uuid>,
        limit: i64,
        cap: i64,
    ) -> Result<(Page<Job>, JobCount), StoreError> {
        let source = self.source_of(filter).await?;
        let first_window = self.window_end_for(filter, &source, None).await?;
        if filter.is_search() && after.is_none() {
            return self.search_first_page(filter, &source, limit, cap, first_window).await;
        }
        let window_end = if after.is_none() { first_window } else { self.window_end_for(filter, &source, after).await? };
        // Side by side on two connections: the two do not depend on each other.
        let (page, count) = futures::try_join!(
            self.list_jobs_in(filter, &source, after, limit, window_end, Order::NewestFirst),
            self.count_jobs_in(filter, &source, cap, first_window)
        )?;
        Ok((page, count))
    }

    /// A search's first page and its count from one read of its window: the ids of every match
    /// in it (at most [`SEARCH_WINDOW`], or `cap`), then the rows of the page's. Checking the
    /// text row by row is what a search costs, and a separate count would check it all again.
    async fn search_first_page(
        &self,
        filter: &JobFilter,
        source: &Source,
        limit: i64,
        cap: i64,
        window_end: Option<Uuid>,
    ) -> Result<(Page<Job>, JobCount), StoreError> {
        let limit = limit.clamp(1, 500);
        let cap = cap.max(1);
        let mut qb = QueryBuilder::<Postgres>::new("");
        source.push_ids(&mut qb, Order::NewestFirst, cap.max(limit + 1).min(SEARCH_WINDOW), |qb, in_lane| {
            filter.push_conditions_in(qb, in_lane);
            if let Some(end) = window_end {
                qb.push(" AND j.id >= ").push_bind(end);
            }
        });
        let ids: Vec<Uuid> = qb.build_query_scalar().fetch_all(&self.pool).await?;
        let n = (ids.len() as i64).min(cap);
        let count = JobCount { n, capped: n >= cap, windowed: window_end.is_some() };
        let shown = &ids[..ids.len().min(limit as usize)];
        let rows = sqlx::query("SELECT * FROM jobs WHERE id = ANY($1) ORDER BY id DESC").bind(shown).fetch_all(&self.pool).await?;
        let items = jobs_from_rows(&rows)?;
        // As in `list_jobs_in`: more matches continue after the page's last; a window that ran
        // out first continues with the window after it.
        let next = if ids.len() as i64 > limit { items.last().map(|j| j.id) } else { window_end };
        Ok((Page { items, next }, count))
    }

    /// The end of a search's window after `after`; `None` for filters that are not searches.
    async fn window_end_for(&self, filter: &JobFilter, source: &Source, after: Option<Uuid>) -> Result<Option<Uuid>, StoreError> {
        if filter.is_search() { self.search_window_end(filter, source, after).await } else { Ok(None) }
    }

    /// A page in `order` (a search's `window_end` bounds a newest-first page).
    async fn list_jobs_in(
        &self,
        filter: &JobFilter,
        source: &Source,
        after: Option<Uuid>,
        limit: i64,
        window_end: Option<Uuid>,
        order: Order,
    ) -> Result<Page<Job>, StoreError> {
        let limit = limit.clamp(1, 500);
        // Ids first, then their rows: picking the page's ids from a listing index is an
        // index-only scan the planner prefers. Asked for whole rows in id order, it may walk
        // the primary key backwards instead, betting that matches are spread evenly, and read
        // millions of rows when they are all old (every discarded job of a queue, say).
        let mut qb = QueryBuilder::<Postgres>::new("SELECT j.* FROM jobs j WHERE j.id IN (");
        source.push_ids(&mut qb, order, limit + 1, |qb, in_lane| {
            filter.push_conditions_in(qb, in_lane);
            if let Some(after) = after {
                qb.push(order.past()).push_bind(after);
            }
            if let Some(end) = window_end {
                qb.push(" AND j.id >= ").push_bind(end);
            }
        });
        qb.push(format_args!(") ORDER BY j.id {}", order.sql()));
        let rows = qb.build().fetch_all(&self.pool).await?;
        let mut items = jobs_from_rows(&rows)?;
        let next = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|j| j.id)
        } else {
            // The window ran out before the page filled: older jobs may still match, and the
            // next page searches the window after this one.
            window_end
        };
        Ok(Page { items, next })
    }

    /// For a search: the oldest id of the next [`SEARCH_WINDOW`] jobs (after `after`) that
    /// match the filter's indexed conditions, or `None` when fewer remain. Reads ids only.
    async fn search_window_end(&self, filter: &JobFilter, source: &Source, after: Option<Uuid>) -> Result<Option<Uuid>, StoreError> {
        let mut qb = QueryBuilder::<Postgres>::new("SELECT id FROM (");
        source.push_ids(&mut qb, Order::NewestFirst, SEARCH_WINDOW, |qb, in_lane| {
            filter.push_indexed(qb, in_lane);
            if let Some(after) = after {
                qb.push(" AND j.id < ").push_bind(after);
            }
        });
        qb.push(") AS w ORDER BY id DESC OFFSET ").push_bind(SEARCH_WINDOW - 1).push(" LIMIT 1");
        Ok(qb.build_query_scalar().fetch_optional(&self.pool).await?)
    }

    /// The id that ends the first `offset` jobs matching `filter` in listing order (newest
    /// first), to continue from with [`Store::list_jobs`] as `after`; `None` when fewer match.
    /// For clients that page by offset: it reads ids only (an index-only scan of the listing
    /// index), never the rows it skips.
    pub async fn job_id_at_offset(&self, filter: &JobFilter, offset: i64) -> Result<Option<Uuid>, StoreError> {
        self.job_id_at_offset_ordered(filter, offset, Order::NewestFirst).await
    }

    /// [`Store::job_id_at_offset`] in either order of creation, to continue from with
    /// [`Store::list_jobs_ordered`].
    pub async fn job_id_at_offset_ordered(&self, filter: &JobFilter, offset: i64, order: Order) -> Result<Option<Uuid>, StoreError> {
        if offset <= 0 {
            return Ok(None);
        }
        let source = self.source_of(filter).await?;
        let mut qb = QueryBuilder::<Postgres>::new("SELECT id FROM (");
        source.push_ids(&mut qb, order, offset, |qb, in_lane| filter.push_conditions_in(qb, in_lane));
        qb.push(format_args!(") AS skipped ORDER BY id {} OFFSET ", order.sql())).push_bind(offset - 1).push(" LIMIT 1");
        Ok(qb.build_query_scalar().fetch_optional(&self.pool).await?)
    }

    /// How many jobs match `filter`, counting at most `cap` (so a huge match stays cheap; the
    /// answer `cap` means "at least cap"). A search counts within its window, see
    /// [`Store::count_jobs_bounded`].
    pub async fn count_jobs(&self, filter: &JobFilter, cap: i64) -> Result<i64, StoreError> {
        Ok(self.count_jobs_bounded(filter, cap).await?.n.min(cap.max(1)))
    }

    /// How many jobs match `filter`, saying how far the count went. Filters on state, queue,
    /// type and the dead-letter flag only are counted exactly from the maintained counters;
    /// others count at most `cap`, and a search only within the newest [`SEARCH_WINDOW`] jobs
    /// matching the indexed conditions.
    pub async fn count_jobs_bounded(&self, filter: &JobFilter, cap: i64) -> Result<JobCount, StoreError> {
        // Counted from the counters: no jobs are read, so the lanes are not needed.
        let source = if filter.counted_by_counters() { Source::Table } else { self.source_of(filter).await? };
        let window_end = self.window_end_for(filter, &source, None).await?;
        self.count_jobs_in(filter, &source, cap, window_end).await
    }

    async fn count_jobs_in(&self, filter: &JobFilter, source: &Source, cap: i64, window_end: Option<Uuid>) -> Result<JobCount, StoreError> {
        let cap = cap.max(1);
        if filter.counted_by_counters() {
            // Every condition is a key of the maintained counters: an exact count, whatever
            // the size, from a few hundred counter rows.
            let mut qb = QueryBuilder::<Postgres>::new("SELECT COALESCE(sum(c.n), 0)::bigint FROM job_count_totals c WHERE true");
            if !filter.states.is_empty() {
                let states: Vec<String> = filter.states.iter().map(|s| s.as_str().to_string()).collect();
                qb.push(" AND c.state::text = ANY(").push_bind(states).push(")");
            }
            if let Some(q) = &filter.queue {
                qb.push(" AND c.queue = ").push_bind(q.clone());
            }
            filter.push_type(&mut qb, "c.type");
            if let Some(d) = filter.dead_letter {
                qb.push(" AND c.dead_letter = ").push_bind(d);
            }
            let n: i64 = qb.build_query_scalar().fetch_one(&self.pool).await?;
            return Ok(JobCount { n, capped: false, windowed: false });
        }
        let conditions = |qb: &mut QueryBuilder<Postgres>, in_lane: bool| {
            filter.push_conditions_in(qb, in_lane);
            if let Some(end) = window_end {
                qb.push(" AND j.id >= ").push_bind(end);
            }
        };
        let mut qb = QueryBuilder::<Postgres>::new("SELECT count(*) AS n FROM (");
        if *source == Source::Table {
            // In no particular order: the planner may count along any index.
            qb.push("SELECT 1 FROM jobs j WHERE true");
            conditions(&mut qb, false);
            qb.push(" LIMIT ").push_bind(cap);
        } else {
            source.push_ids(&mut qb, Order::NewestFirst, cap, conditions);
        }
        qb.push(") AS capped");
        let row = qb.build().fetch_one(&self.pool).await?;
        let n: i64 = row.try_get("n")?;
        Ok(JobCount { n, capped: n >= cap, windowed: window_end.is_some() })
    }

    /// Counts by queue, type, state and dead-letter flag: exact, from the maintained counters
    /// (never a count over the jobs table).
    pub async fn stats(&self, queue: Option<&str>) -> Result<Stats, StoreError> {
        let rows = sqlx::query(
            "SELECT queue, type, state, dead_letter, n FROM job_count_totals
             WHERE ($1::text IS NULL OR queue = $1)
             ORDER BY queue, type, state, dead_letter",
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
    /// Filtered by queue and type only (what the page opens with), the counts come from the
    /// maintained counters; other filters count the matching dead letters, a search within
    /// its window (see [`SEARCH_WINDOW`]).
    pub async fn dead_letter_groups(&self, filter: &JobFilter, limit: i64) -> Result<Vec<ErrorGroup>, StoreError> {
        let mut f = filter.clone();
        f.dead_letter = None;
        // The group counters have no state in their key.
        let from_counters = f.states.is_empty() && f.counted_by_counters();
        let mut qb = if from_counters {
            let mut qb = QueryBuilder::<Postgres>::new(
                "WITH groups AS (
                     SELECT c.signature, sum(c.n)::bigint AS n FROM dead_letter_group_totals c WHERE true",
            );
            if let Some(q) = &f.queue {
                qb.push(" AND c.queue = ").push_bind(q.clone());
            }
            f.push_type(&mut qb, "c.type");
            qb.push(" GROUP BY 1 HAVING sum(c.n) > 0");
            qb
        } else {
            // Dead letters are read through their own indexes, not the listing lanes.
            let window_end =
                if f.is_search() { self.search_window_end(&JobFilter { dead_letter: Some(true), ..f.clone() }, &Source::Table, None).await? } else { None };
            let mut qb = QueryBuilder::<Postgres>::new(
                "WITH groups AS (
                     SELECT j.error_signature AS signature, count(*) AS n FROM jobs j WHERE j.dead_letter",
            );
            f.push_conditions(&mut qb);
            if let Some(end) = window_end {
                qb.push(" AND j.id >= ").push_bind(end);
            }
            qb.push(" GROUP BY 1");
            qb
        };
        qb.push(" ORDER BY n DESC, 1 LIMIT ").push_bind(limit.clamp(1, 200));
        // One example per group, newest first, through the signature index.
        qb.push(
            ")
             SELECT g.signature, g.n, e.error_type, e.example_message, e.latest
             FROM groups g
             CROSS JOIN LATERAL (
                 SELECT x.last_error->>'type' AS error_type, x.last_error->>'message' AS example_message,
                        x.dead_lettered_at AS latest
                 FROM jobs x WHERE x.dead_letter AND x.error_signature = g.signature",
        );
        if let Some(q) = &f.queue {
            qb.push(" AND x.queue = ").push_bind(q.clone());
        }
        f.push_type(&mut qb, "x.type");
        qb.push(
            "
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
    /// `(minute start, completed, failed)`. Completions are counted as they happen (the
    /// maintained per-minute counts, kept two days); failures are the attempt history's.
    pub async fn throughput(&self, minutes: i64) -> Result<Vec<(Timestamp, i64, i64)>, StoreError> {
        // The window start is spelled out in each condition (the minute count is a clamped
        // integer, not input text) rather than taken from a CTE or a parameter: only then can
        // the planner estimate the range and read the last hour's failures through the attempt
        // history's time index instead of scanning all of it.
        let minutes = minutes.clamp(1, 24 * 60);
        let since = format!("(date_trunc('minute', now()) - {} * interval '1 minute')", minutes - 1);
        let sql = format!(
            "WITH done AS (
                 SELECT m, sum(n)::bigint AS n FROM (
                     SELECT minute AS m, completed AS n FROM job_throughput WHERE minute >= {since}
                     UNION ALL
                     SELECT date_trunc('minute', at), n FROM job_count_deltas
                     WHERE state = 'completed' AND n > 0 AND at >= {since}
                 ) c GROUP BY 1
             ), failed AS (
                 SELECT date_trunc('minute', finished_at) AS m, count(*) AS n
                 FROM job_attempts
                 WHERE finished_at >= {since} AND outcome NOT IN ('completed', 'released', 'snoozed', 'cancelled', 'dropped')
                 GROUP BY 1
             )
             SELECT minutes.m AS minute, COALESCE(done.n, 0) AS completed, COALESCE(failed.n, 0) AS failed
             FROM generate_series({since}, date_trunc('minute', now()), interval '1 minute') AS minutes(m)
             LEFT JOIN done ON done.m = minutes.m
             LEFT JOIN failed ON failed.m = minutes.m
             ORDER BY minutes.m"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| Ok((super::ts(r, "minute")?, r.try_get("completed")?, r.try_get("failed")?)))
            .collect()
    }
}
