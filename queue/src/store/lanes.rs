//! Reading the listing index `jobs_listed` (queue, type, state, dead_letter, id) lane by lane.
//!
//! A job is written into one listing index per state it enters, not three (see
//! migrations/…_listing_lanes.sql), so the index that serves a queue filter also has to serve
//! a type filter and no filter at all. Postgres 15 cannot skip over its leading columns, so a
//! query reads each (queue, type, state, dead_letter) lane that can match on its own and merges them in id
//! order: a `UNION ALL` of one sub-select per lane, each one index range read only as far as
//! the page needs (see [`Source::push_ids`]). A lane is a key of the maintained counters
//! (`job_count_totals`), so finding the lanes that hold jobs reads no jobs.
//!
//! Lanes and jobs are read by two statements: a job moved into a lane no job was in between
//! the two is missing from that one answer (the counters are written in the job's own
//! transaction, so it is there for the next).

use serde::Serialize;
use sqlx::{Postgres, QueryBuilder};

use super::{Store, StoreError};
use crate::job::JobState;

/// The states `jobs_listed` holds (its predicate): all but `active`, which holds a job only
/// while it runs (as many as workers run) and is read through `jobs_locked`. An `available`
/// entry is written on the way in (and again if a rate limit holds the job back or admits
/// it: `rate_limited` is indexed); the claim writes none and the completion one.
pub(crate) const LISTED_STATES: [JobState; 7] = [
    JobState::Available,
    JobState::Scheduled,
    JobState::Pending,
    JobState::Retryable,
    JobState::Completed,
    JobState::Cancelled,
    JobState::Discarded,
];

/// Above this many lanes a query reads the table as a whole instead, through `jobs_state_id`
/// (every listed state but `completed`, which is most of the table and found at once along
/// the primary key, and `available`, which has `jobs_available_id`): planning 256 lanes took
/// 24 ms.
const MAX_LANES: i64 = 256;

/// Where a listing query reads its jobs' ids from (see [`Source::push_ids`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Source {
    /// `jobs` itself: the planner picks an index from the query's conditions.
    Table,
    /// Only these lanes of `jobs_listed`; none means nothing can match.
    Lanes(Vec<Lane>),
}

impl Source {
    /// This source without the lanes of `queues`. (Reading the table as a whole, a query
    /// leaves them out with a condition of its own; so does one with a state's own member,
    /// which becomes the table for it.)
    pub(crate) fn without_queues(self, queues: &[String]) -> Source {
        match self {
            Source::Lanes(lanes) if lanes.iter().any(|l| matches!(l, Lane::Unlisted(_))) => Source::Table,
            Source::Lanes(lanes) => {
                Source::Lanes(lanes.into_iter().filter(|l| !matches!(l, Lane::Listed { queue, .. } if queues.contains(queue))).collect())
            }
            Source::Table => Source::Table,
        }
    }
}

/// One member of a listing read lane by lane.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Lane {
    /// One (queue, type, state, dead_letter) prefix of `jobs_listed`.
    Listed { queue: String, job_type: String, state: JobState, dead_letter: bool },
    /// The jobs in the state `jobs_listed` leaves out (`active`, as many as workers run),
    /// the filter's conditions checked row by row and the few rows sorted. Only read when the
    /// counters say some job in it matches the filter's queue and type.
    Unlisted(JobState),
}

/// Which lanes a query reads: the keys a filter fixes. Empty `states` means every state.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LaneKeys<'a> {
    pub states: &'a [JobState],
    pub queue: Option<&'a str>,
    pub job_type: Option<&'a str>,
    pub dead_letter: Option<bool>,
}

/// Which end of the id (creation) order a listing starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Order {
    #[default]
    NewestFirst,
    OldestFirst,
}

impl Order {
    pub(crate) fn sql(self) -> &'static str {
        match self {
            Order::NewestFirst => "DESC",
            Order::OldestFirst => "ASC",
        }
    }

    /// The condition, to bind an id to, that keeps what comes after that id in this order.
    pub(crate) fn past(self) -> &'static str {
        match self {
            Order::NewestFirst => " AND j.id < ",
            Order::OldestFirst => " AND j.id > ",
        }
    }
}

impl Source {
    /// Appends a query of the ids of at most `limit` jobs in `order`, among those that
    /// `conditions` (appended after a `WHERE`, as ` AND …` on `jobs j`) select. `conditions`
    /// is told whether it is inside a lane, whose own keys then say the state, queue, type and
    /// dead-letter flag: repeating them would make Postgres count their selectivity twice, and
    /// a state list can turn the lane's ordered read into a sorted one.
    ///
    /// Each lane is its own sub-select with the conditions, the order and the limit: Postgres
    /// does not flatten `UNION ALL` members that have a `WHERE`, so a member's planner never
    /// hears of an order or limit outside it, and would read its whole lane. With them inside,
    /// each lane is one index range read as far as the limit, and the lanes' few rows are
    /// sorted once.
    pub(crate) fn push_ids(&self, qb: &mut QueryBuilder<Postgres>, order: Order, limit: i64, conditions: impl Fn(&mut QueryBuilder<Postgres>, bool)) {
        let dir = order.sql();
        match self {
            Source::Table => {
                qb.push("SELECT j.id FROM jobs j WHERE true");
                conditions(qb, false);
                qb.push(format_args!(" ORDER BY j.id {dir} LIMIT ")).push_bind(limit);
            }
            Source::Lanes(lanes) if lanes.is_empty() => {
                qb.push("SELECT NULL::uuid AS id WHERE false");
            }
            Source::Lanes(lanes) => {
                qb.push("SELECT id FROM (");
                for (i, lane) in lanes.iter().enumerate() {
                    if i > 0 {
                        qb.push(" UNION ALL ");
                    }
                    // The state as a literal (it comes from the enum): only a literal proves the
                    // index's predicate.
                    match lane {
                        Lane::Listed { queue, job_type, state, dead_letter } => {
                            qb.push("(SELECT j.id FROM jobs j WHERE j.queue = ")
                                .push_bind(queue.clone())
                                .push(" AND j.type = ")
                                .push_bind(job_type.clone())
                                .push(format_args!(" AND j.state = '{}' AND j.dead_letter = {}", state.as_str(), dead_letter));
                            conditions(qb, true);
                        }
                        // (The filter names no state here: its keys are the queue and type.)
                        Lane::Unlisted(state) => {
                            qb.push(format_args!("(SELECT j.id FROM jobs j WHERE j.state = '{}'", state.as_str()));
                            conditions(qb, false);
                        }
                    }
                    qb.push(format_args!(" ORDER BY j.id {dir} LIMIT ")).push_bind(limit).push(")");
                }
                qb.push(format_args!(") AS lanes ORDER BY id {dir} LIMIT ")).push_bind(limit);
            }
        }
    }
}

impl Store {
    /// Where to read the jobs `keys` select: the lanes of `jobs_listed` that hold such jobs,
    /// when every state is one it lists and there are not too many lanes; otherwise the table.
    /// Keys of a queue or type without a state read every state: the listed ones lane by lane,
    /// and `active` through its own index if the counters say it holds a match (a type with few
    /// jobs among millions is then found without reading the others).
    pub(crate) async fn source_for(&self, keys: LaneKeys<'_>) -> Result<Source, StoreError> {
        let every_state = keys.states.is_empty() && (keys.queue.is_some() || keys.job_type.is_some());
        let states: &[JobState] = if every_state { &JobState::ALL } else { keys.states };
        if states.is_empty() || !(every_state || states.iter().all(|s| LISTED_STATES.contains(s))) {
            return Ok(Source::Table);
        }
        let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        // A type prefix (`email.*`) reads the lanes of every type under it.
        let prefix = keys.job_type.and_then(super::listing::dotted_prefix);
        let lanes: Vec<(String, String, JobState, bool)> = sqlx::query_as(
            "SELECT queue, type, state, dead_letter FROM job_count_totals
             WHERE state::text = ANY($1) AND ($2::text IS NULL OR queue = $2)
               AND ($3::text IS NULL OR type = $3 OR ($4 AND starts_with(type, $3)))
               AND ($5::bool IS NULL OR dead_letter = $5)
             GROUP BY 1, 2, 3, 4 HAVING sum(n) > 0
             ORDER BY 1, 2, 3, 4 LIMIT $6",
        )
        .bind(&names)
        .bind(keys.queue)
        .bind(prefix.or(keys.job_type))
        .bind(prefix.is_some())
        .bind(keys.dead_letter)
        .bind(MAX_LANES + 1)
        .fetch_all(&self.pool)
        .await?;
        if lanes.len() as i64 > MAX_LANES {
            return Ok(Source::Table);
        }
        let mut members: Vec<Lane> = Vec::with_capacity(lanes.len());
        for (queue, job_type, state, dead_letter) in lanes {
            if LISTED_STATES.contains(&state) {
                members.push(Lane::Listed { queue, job_type, state, dead_letter });
            } else if !members.contains(&Lane::Unlisted(state)) {
                members.push(Lane::Unlisted(state));
            }
        }
        Ok(Source::Lanes(members))
    }
}
