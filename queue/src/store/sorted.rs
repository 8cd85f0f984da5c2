//! Listing jobs in the order they run rather than the order they were created: by priority
//! (the order a claim takes available jobs in) or by scheduled time (OJS admin API §7.1's
//! `sort=priority` and `sort=scheduled_at`).
//!
//! The listing indexes keep jobs in id order only, so a sorted listing reads the jobs it sorts.
//! Two shapes are kept in these orders by indexes and are served at any size: the available
//! jobs of one queue by priority (`jobs_claimable`, which is the claim's own order, beside
//! `jobs_held_by_queue` for those a rate limit holds back), and the scheduled and retryable
//! jobs of every queue by scheduled time (`jobs_due`, the scheduler's). Any other filter is
//! sorted whole when it matches at most [`SORT_WINDOW`] jobs, and refused with the reason
//! otherwise: sorting millions of finished jobs by priority would read them all for every page.

use sqlx::{Postgres, QueryBuilder};
use uuid::Uuid;

use super::lanes::Order;
use super::{Store, StoreError, jobs_from_rows};
use crate::job::{Job, JobState};
use super::listing::JobFilter;

/// What a sorted listing orders by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Priority, then scheduled time, then id. Descending, this is the order claims take
    /// available jobs in (highest priority first, then the longest due); ascending, its reverse.
    Priority,
    /// Scheduled time, then id.
    ScheduledAt,
}

impl SortKey {
    /// The `ORDER BY` list on `jobs j`, `descending` or not.
    fn order_by(self, descending: bool) -> &'static str {
        match (self, descending) {
            (SortKey::Priority, true) => "j.priority DESC, j.scheduled_at, j.id",
            (SortKey::Priority, false) => "j.priority, j.scheduled_at DESC, j.id DESC",
            (SortKey::ScheduledAt, true) => "j.scheduled_at DESC, j.id DESC",
            (SortKey::ScheduledAt, false) => "j.scheduled_at, j.id",
        }
    }

    fn name(self) -> &'static str {
        match self {
            SortKey::Priority => "priority",
            SortKey::ScheduledAt => "scheduled_at",
        }
    }
}

/// How many jobs a sorted listing orders: a filter matching more is refused unless an index
/// keeps its jobs in that order, and the pages of any sorted listing reach this far into it.
pub const SORT_WINDOW: i64 = 10_000;

impl Store {
    /// Up to `limit` (1..=500) jobs matching `filter` from position `offset` of `key`'s order,
    /// `descending` or not, and whether more follow. Errors name `sort` when the filter
    /// matches more than [`SORT_WINDOW`] jobs and no index keeps them in that order, and
    /// `page` when `offset` is past the window.
    pub async fn list_jobs_sorted(
        &self,
        filter: &JobFilter,
        key: SortKey,
        descending: bool,
        offset: i64,
        limit: i64,
    ) -> Result<(Vec<Job>, bool), StoreError> {
        let offset = offset.max(0);
        if filter.is_search() {
            return Err(StoreError::invalid("sort", "a search lists its matches newest first"));
        }
        if offset >= SORT_WINDOW {
            return Err(StoreError::invalid(
                "page",
                format!("a listing sorted by {} reaches the first {SORT_WINDOW} jobs in its order; narrow the filter for the rest", key.name()),
            ));
        }
        let limit = limit.clamp(1, 500).min(SORT_WINDOW - offset);
        // One row past the page says whether more follow, past the window too: the API's next
        // page is then refused, saying why (the dashboard offers none past the window, and
        // shows how many match).
        let take = offset + limit + 1;
        let order_by = key.order_by(descending);
        let mut qb = QueryBuilder::<Postgres>::new("SELECT j.* FROM jobs j WHERE j.id IN (");
        if let Some(queue) = claim_ordered(filter, key) {
            // The claim's order: available jobs that may be claimed along `jobs_claimable`, and
            // those a rate limit holds back along `jobs_held_by_queue`, merged.
            // (The merged rows are aliased `j` too, so one ORDER BY list serves every level.)
            let cols = "j.id, j.priority, j.scheduled_at";
            qb.push(format_args!("SELECT id FROM ((SELECT {cols} FROM jobs j WHERE j.state = 'available' AND NOT j.rate_limited AND j.queue = "))
                .push_bind(queue.to_owned())
                .push(format_args!(" ORDER BY {order_by} LIMIT "))
                .push_bind(take)
                .push(format_args!(") UNION ALL (SELECT {cols} FROM jobs j WHERE j.state = 'available' AND j.rate_limited AND j.queue = "))
                .push_bind(queue.to_owned())
                .push(format_args!(" ORDER BY {order_by} LIMIT "))
                .push_bind(take)
                .push(format_args!(")) AS j ORDER BY {order_by} OFFSET "))
                .push_bind(offset)
                .push(" LIMIT ")
                .push_bind(limit + 1);
        } else if let Some(states) = due_ordered(filter, key) {
            // The scheduler's order, along `jobs_due`.
            qb.push(format_args!("SELECT j.id FROM jobs j WHERE j.state IN ({}) ORDER BY {order_by} OFFSET ", JobState::sql_literals(states)))
                .push_bind(offset)
                .push(" LIMIT ")
                .push_bind(limit + 1);
        } else {
            // Sorted whole if there are few: the ids of up to one more than the window first
            // (from the listing lanes), so a filter that has just grown past it is refused
            // rather than sorted in part.
            let source = self.source_of(filter).await?;
            let mut matching = QueryBuilder::<Postgres>::new("");
            source.push_ids(&mut matching, Order::NewestFirst, SORT_WINDOW + 1, |qb, in_lane| filter.push_conditions_in(qb, in_lane));
            let ids: Vec<Uuid> = matching.build_query_scalar().fetch_all(&self.pool).await?;
            if ids.len() as i64 > SORT_WINDOW {
                return Err(StoreError::invalid(
                    "sort",
                    format!(
                        "sorting more than {SORT_WINDOW} matching jobs by {}: narrow the filter to at most {SORT_WINDOW} jobs (a state, queue, type or time range), or sort the available jobs of one queue by priority, or the scheduled and retryable jobs of every queue by scheduled_at, which indexes keep in order",
                        key.name()
                    ),
                ));
            }
            qb.push("SELECT j.id FROM jobs j WHERE j.id = ANY(")
                .push_bind(ids)
                .push(format_args!(") ORDER BY {order_by} OFFSET "))
                .push_bind(offset)
                .push(" LIMIT ")
                .push_bind(limit + 1);
        }
        qb.push(format_args!(") ORDER BY {order_by}"));
        let rows = qb.build().fetch_all(&self.pool).await?;
        let mut jobs = jobs_from_rows(&rows)?;
        let more = jobs.len() as i64 > limit;
        jobs.truncate(limit as usize);
        Ok((jobs, more))
    }
}

/// Whether `filter` selects by state and queue alone (no type, creation range or dead letters
/// only), which is all the index-served orders can answer.
fn by_state_and_queue(filter: &JobFilter) -> bool {
    filter.job_type.is_none() && filter.created_after.is_none() && filter.created_before.is_none() && filter.dead_letter != Some(true)
}

/// The queue whose available jobs `filter` selects, when they are all it selects and `key`
/// is the claim's order.
fn claim_ordered(filter: &JobFilter, key: SortKey) -> Option<&str> {
    (key == SortKey::Priority && by_state_and_queue(filter) && filter.states == [JobState::Available]).then_some(filter.queue.as_deref()).flatten()
}

/// The states of `filter`, when they are scheduled or retryable jobs of every queue and `key`
/// is the scheduler's order.
fn due_ordered(filter: &JobFilter, key: SortKey) -> Option<&[JobState]> {
    let due = !filter.states.is_empty() && filter.states.iter().all(|s| matches!(s, JobState::Scheduled | JobState::Retryable));
    (key == SortKey::ScheduledAt && by_state_and_queue(filter) && filter.queue.is_none() && due).then_some(filter.states.as_slice())
}
