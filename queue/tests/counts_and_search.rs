//! What keeps the dashboard's reads bounded on a large database, against a real Postgres:
//! the maintained job counters (exact through every kind of write, folded or not) and
//! searches that read a bounded window per page yet find old matches by paging on.

use std::time::Duration;

use rebound_queue::outcome::{HandlerError, Outcome};
use rebound_queue::store::{ClaimRequest, Completion, Failure, JobFilter, Order, PruneConfig, SEARCH_WINDOW};
use rebound_queue::testing::TestDb;
use rebound_queue::{JobState, NewJob, Store, StoreError};
use serde_json::json;

/// Every (queue, type, state, dead_letter) group counted from the jobs table itself.
async fn counted_from_jobs(s: &Store) -> Vec<(String, String, String, bool, i64)> {
    sqlx::query_as(
        "SELECT queue, type, state::text, dead_letter, count(*) FROM jobs GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4",
    )
    .fetch_all(s.pool())
    .await
    .unwrap()
}

/// The same groups as the store reports them (from the counters).
async fn counted_by_store(s: &Store) -> Vec<(String, String, String, bool, i64)> {
    let mut rows: Vec<_> = s
        .stats(None)
        .await
        .unwrap()
        .rows
        .into_iter()
        .map(|r| (r.queue, r.job_type, r.state.as_str().to_string(), r.dead_letter, r.count))
        .collect();
    rows.sort();
    rows
}

async fn assert_counts_exact(s: &Store, when: &str) {
    assert_eq!(counted_by_store(s).await, counted_from_jobs(s).await, "counters disagree with the table {when}");
}

#[tokio::test]
async fn counters_stay_exact_through_every_kind_of_write() {
    let db = TestDb::new().await;
    let s = &db.store;
    let jobs: Vec<NewJob> = (0..30)
        .map(|i| {
            let mut j = NewJob::new(if i % 3 == 0 { "count.a" } else { "count.b" }, json!([i]));
            j.queue = if i % 2 == 0 { "even".into() } else { "odd".into() };
            j
        })
        .collect();
    s.enqueue_batch(jobs).await.unwrap();
    assert_counts_exact(s, "after enqueue").await;

    let claim = ClaimRequest {
        worker_id: "w".into(),
        queues: vec!["even".into(), "odd".into()],
        limit: 12,
        visibility_timeout: Duration::from_secs(30),
    };
    let claimed = s.claim(&claim).await.unwrap();
    assert_eq!(claimed.len(), 12);
    assert_counts_exact(s, "after a claim").await;
    s.fold_job_counts().await.unwrap();
    assert_counts_exact(s, "after a fold").await;

    for job in &claimed[..6] {
        s.complete(&Completion { id: job.id, attempt: Some(1), worker_id: Some("w".into()), started_at: None, result: None }).await.unwrap();
    }
    for (i, job) in claimed[6..].iter().enumerate() {
        let outcome = if i % 2 == 0 {
            Outcome::DeadLetter(HandlerError::new("count.broken", "no"))
        } else {
            Outcome::Retry(HandlerError::new("count.flaky", "again"))
        };
        s.fail(&Failure { id: job.id, attempt: Some(1), worker_id: Some("w".into()), outcome, error_code: None }).await.unwrap();
    }
    assert_counts_exact(s, "after completions and failures").await;
    let completed_lately = async || s.throughput(5).await.unwrap().iter().map(|(_, done, _)| done).sum::<i64>();
    assert_eq!(completed_lately().await, 6, "completions per minute, before a fold");
    s.fold_job_counts().await.unwrap();
    assert_eq!(completed_lately().await, 6, "and after it");
    let groups = s.dead_letter_groups(&JobFilter::dead_letters(), 10).await.unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!((groups[0].signature.as_str(), groups[0].count), ("count.broken: no", 3));
    assert_eq!(groups[0].example_message.as_deref(), Some("no"));
    let in_odd = s.dead_letter_groups(&JobFilter { queue: Some("odd".into()), ..JobFilter::dead_letters() }, 10).await.unwrap();
    let odd_direct: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE dead_letter AND queue = 'odd'").fetch_one(s.pool()).await.unwrap();
    assert_eq!(in_odd.iter().map(|g| g.count).sum::<i64>(), odd_direct);

    // A hand edit in psql is counted like the store's own writes.
    sqlx::query("UPDATE jobs SET queue = 'moved' WHERE type = 'count.a' AND state = 'available'").execute(s.pool()).await.unwrap();
    assert_counts_exact(s, "after a hand edit").await;
    s.fold_job_counts().await.unwrap();

    // Pruning deletes; heartbeats-style updates that change nothing counted add nothing.
    sqlx::query("UPDATE jobs SET updated_at = now()").execute(s.pool()).await.unwrap();
    let deltas: i64 = sqlx::query_scalar("SELECT count(*) FROM job_count_deltas").fetch_one(s.pool()).await.unwrap();
    assert_eq!(deltas, 0, "an update that moves no job between groups appends no delta");
    // Made three days ago (the pruner reads the UUIDv7 id's time), finished two days ago.
    sqlx::query(
        "UPDATE jobs SET completed_at = now() - interval '2 days',
             id = (left(replace(rebound_id_floor(now() - interval '3 days')::text, '-', ''), 12) || right(replace(id::text, '-', ''), 20))::uuid
         WHERE state = 'completed'",
    )
    .execute(s.pool())
    .await
    .unwrap();
    let report = s.prune(&PruneConfig::default()).await.unwrap();
    assert_eq!(report.completed, 6);
    assert_counts_exact(s, "after pruning").await;
    assert_eq!(completed_lately().await, 6, "pruning does not rewrite what was done");
    s.fold_job_counts().await.unwrap();
    assert_counts_exact(s, "after the second fold").await;
    let zero_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM job_counts WHERE n = 0").fetch_one(s.pool()).await.unwrap();
    assert_eq!(zero_rows, 0, "groups that emptied are dropped");

    let queues = s.queues().await.unwrap();
    let names: Vec<&str> = queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["even", "moved", "odd"]);
    let total: i64 = queues.iter().map(|q| q.available + q.active + q.retryable + q.discarded + q.completed).sum();
    let in_table: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(s.pool()).await.unwrap();
    assert_eq!(total, in_table);
    assert_eq!(queues.iter().map(|q| q.dead_letters).sum::<i64>(), 3);

    sqlx::query("TRUNCATE jobs").execute(s.pool()).await.unwrap();
    assert!(counted_by_store(s).await.is_empty(), "a truncate empties the counters");
}

#[tokio::test]
async fn searches_read_a_bounded_window_and_page_on_to_older_matches() {
    let db = TestDb::new().await;
    let s = &db.store;
    // The needle is the oldest job, behind more than two windows of others.
    s.enqueue(NewJob::new("search.job", json!([{"note": "needle-in-the-haystack"}]))).await.unwrap();
    let others = 2 * SEARCH_WINDOW + 500;
    sqlx::query(
        "INSERT INTO jobs (id, type, queue, args, state)
         SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint + 1000 + g), 12, '0')
                 || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
                'search.job', 'default', jsonb_build_array(jsonb_build_object('note', 'hay ' || g)), 'completed'
         FROM generate_series(1, $1) AS g",
    )
    .bind(others)
    .execute(s.pool())
    .await
    .unwrap();

    let filter = JobFilter { text: Some("NEEDLE".into()), ..Default::default() };
    let first = s.list_jobs(&filter, None, 50).await.unwrap();
    assert!(first.items.is_empty(), "the first window holds only hay");
    let mut after = first.next;
    let mut pages = 1;
    let mut found = Vec::new();
    while let Some(a) = after {
        let page = s.list_jobs(&filter, Some(a), 50).await.unwrap();
        found.extend(page.items.iter().map(|j| j.id));
        after = page.next;
        pages += 1;
        assert!(pages < 10, "paging a search must end");
    }
    assert_eq!(found.len(), 1, "paging on reaches the old match");
    assert_eq!(pages, 3, "two full windows, then the rest");

    let counted = s.count_jobs_bounded(&filter, 10_000).await.unwrap();
    assert_eq!((counted.n, counted.capped, counted.windowed), (0, false, true));
    let (together, together_count) = s.list_jobs_counted(&filter, None, 50, 10_000).await.unwrap();
    assert_eq!((together.items.len(), together.next, together_count), (0, first.next, counted), "one window for a page and its count");
    // The newest hay is inside the first window.
    let hay = JobFilter { text: Some(format!("hay {}", others - 10)), ..Default::default() };
    let counted = s.count_jobs_bounded(&hay, 100).await.unwrap();
    assert_eq!((counted.n, counted.capped, counted.windowed), (1, false, true));
    let all_hay = JobFilter { text: Some("hay".into()), ..Default::default() };
    let counted = s.count_jobs_bounded(&all_hay, 100).await.unwrap();
    assert_eq!((counted.n, counted.capped, counted.windowed), (100, true, true));
    // A first page read together with its count is the page and the count read apart.
    for cap in [100, 10_000] {
        let (together, together_count) = s.list_jobs_counted(&all_hay, None, 50, cap).await.unwrap();
        let apart = s.list_jobs(&all_hay, None, 50).await.unwrap();
        assert_eq!(together, apart, "the same page (cap {cap})");
        assert_eq!(together_count, s.count_jobs_bounded(&all_hay, cap).await.unwrap(), "the same count (cap {cap})");
    }
    let (_, whole_window) = s.list_jobs_counted(&all_hay, None, 50, 10_000).await.unwrap();
    assert_eq!((whole_window.n, whole_window.capped, whole_window.windowed), (SEARCH_WINDOW, false, true));

    // Without a row-by-row condition there is no window: counts and pages are whole.
    let plain = s.count_jobs_bounded(&JobFilter { states: vec![JobState::Available], ..Default::default() }, 10).await.unwrap();
    assert_eq!((plain.n, plain.capped, plain.windowed), (1, false, false));
}

#[tokio::test]
async fn time_ranges_select_by_creation_time() {
    let db = TestDb::new().await;
    let s = &db.store;
    let before = s.enqueue(NewJob::new("range.job", json!([]))).await.unwrap().job;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let start = s.now().await.unwrap();
    // Ranges match ids to the millisecond, a bound's own included: the job inside must not
    // share a millisecond with either bound.
    tokio::time::sleep(Duration::from_millis(3)).await;
    let inside = s.enqueue(NewJob::new("range.job", json!([]))).await.unwrap().job;
    tokio::time::sleep(Duration::from_millis(3)).await;
    let end = s.now().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after = s.enqueue(NewJob::new("range.job", json!([]))).await.unwrap().job;
    let page = s
        .list_jobs(&JobFilter { created_after: Some(start), created_before: Some(end), ..Default::default() }, None, 10)
        .await
        .unwrap();
    let ids: Vec<_> = page.items.iter().map(|j| j.id).collect();
    assert_eq!(ids, [inside.id]);
    let since = s.list_jobs(&JobFilter { created_after: Some(start), ..Default::default() }, None, 10).await.unwrap();
    assert_eq!(since.items.iter().map(|j| j.id).collect::<Vec<_>>(), [after.id, inside.id]);
    let until = s.list_jobs(&JobFilter { created_before: Some(start), ..Default::default() }, None, 10).await.unwrap();
    assert_eq!(until.items.iter().map(|j| j.id).collect::<Vec<_>>(), [before.id]);
}

/// The ids `filter`'s listing shows, every page of `limit` followed to the end.
async fn listed(s: &Store, filter: &JobFilter, limit: i64) -> Vec<uuid::Uuid> {
    listed_in(s, filter, limit, Order::NewestFirst).await
}

/// [`listed`] in `order`.
async fn listed_in(s: &Store, filter: &JobFilter, limit: i64, order: Order) -> Vec<uuid::Uuid> {
    let mut ids = Vec::new();
    let mut after = None;
    for _ in 0..1000 {
        let page = s.list_jobs_ordered(filter, after, limit, order).await.unwrap();
        ids.extend(page.items.iter().map(|j| j.id));
        after = page.next;
        if after.is_none() {
            return ids;
        }
    }
    panic!("paging {filter:?} did not end");
}

/// Inserts `n` jobs spread over `queues` × `types` × `states` (one after another, so
/// neighbouring ids are in different lanes), with time-ordered UUIDv7 ids.
async fn insert_spread(s: &Store, n: i64, queues: &[&str], types: &[&str], states: &[&str]) {
    sqlx::query(
        "INSERT INTO jobs (id, type, queue, args, state, completed_at, discarded_at)
         SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint - 100000 + g), 12, '0')
                 || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
                ($3::text[])[1 + g % cardinality($3)], ($2::text[])[1 + (g / cardinality($3)) % cardinality($2)],
                jsonb_build_array(jsonb_build_object('note', 'lane job ' || g)), st::job_state,
                CASE WHEN st = 'completed' THEN now() END, CASE WHEN st = 'discarded' THEN now() END
         FROM (SELECT g, ($4::text[])[1 + (g / 7) % cardinality($4)] AS st FROM generate_series(1, $1) AS g) x",
    )
    .bind(n)
    .bind(queues)
    .bind(types)
    .bind(states)
    .execute(s.pool())
    .await
    .unwrap();
}

#[tokio::test]
async fn listings_by_state_read_every_lane_in_id_order() {
    let db = TestDb::new().await;
    let s = &db.store;
    insert_spread(s, 400, &["default", "mail", "billing"], &["a.one", "b.two", "c.three", "b.sub.four", "bb.five"], &["completed", "discarded", "retryable", "available", "active"]).await;

    // (No state: every state, lane by lane where a queue or type is given.)
    let states = [vec![], vec![JobState::Completed], vec![JobState::Completed, JobState::Discarded], vec![JobState::Retryable], vec![JobState::Available]];
    let queues = [None, Some("mail"), Some("nowhere")];
    // An exact type, and a prefix: `b.*` is b.two and b.sub.four, not bb.five.
    let types = [None, Some("b.two"), Some("b.*")];
    for st in &states {
        for q in queues {
            for t in types {
                let filter = JobFilter { states: st.clone(), queue: q.map(str::to_string), job_type: t.map(str::to_string), ..Default::default() };
                // What the table holds, newest first; `extra` is a literal condition.
                let matching = |extra: &'static str| {
                    let names: Vec<String> = if st.is_empty() { &JobState::ALL[..] } else { &st[..] }.iter().map(|s| s.as_str().to_string()).collect();
                    async move {
                        sqlx::query_scalar::<_, uuid::Uuid>(sqlx::AssertSqlSafe(format!(
                            "SELECT id FROM jobs WHERE state::text = ANY($1) AND ($2::text IS NULL OR queue = $2) AND ($3::text IS NULL OR type = $3 OR ($3 = 'b.*' AND type IN ('b.two', 'b.sub.four'))) {extra}
                             ORDER BY id DESC"
                        )))
                        .bind(names)
                        .bind(q)
                        .bind(t)
                        .fetch_all(s.pool())
                        .await
                        .unwrap()
                    }
                };
                let expected = matching("").await;
                assert_eq!(listed(s, &filter, 7).await, expected, "pages of {filter:?}");
                let oldest: Vec<uuid::Uuid> = expected.iter().rev().copied().collect();
                assert_eq!(listed_in(s, &filter, 7, Order::OldestFirst).await, oldest, "oldest first, pages of {filter:?}");
                assert_eq!(s.job_id_at_offset_ordered(&filter, 5, Order::OldestFirst).await.unwrap(), oldest.get(4).copied());
                assert_eq!(s.count_jobs(&filter, 10_000).await.unwrap(), expected.len() as i64, "count of {filter:?}");
                for offset in [1usize, 5, 20] {
                    assert_eq!(s.job_id_at_offset(&filter, offset as i64).await.unwrap(), expected.get(offset - 1).copied(), "offset {offset} of {filter:?}");
                }
                // A search inside the same lanes: its window, page and count.
                let search = JobFilter { text: Some("lane job 1".into()), ..filter.clone() };
                let found = matching("AND args::text ILIKE '%lane job 1%'").await;
                assert_eq!(listed(s, &search, 5).await, found, "pages of {search:?}");
                let (first, count) = s.list_jobs_counted(&search, None, 5, 10_000).await.unwrap();
                assert_eq!(count.n, found.len() as i64, "count of {search:?}");
                assert_eq!(first.items.iter().map(|j| j.id).collect::<Vec<_>>(), found.iter().take(5).copied().collect::<Vec<_>>());
            }
        }
    }

    // More lanes than are worth merging: the listing reads the table instead, with the same answer.
    let many: Vec<String> = (0..300).map(|i| format!("many.t{i:03}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    insert_spread(s, 600, &["wide"], &many, &["completed"]).await;
    let filter = JobFilter { states: vec![JobState::Completed], ..Default::default() };
    let expected: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'completed' ORDER BY id DESC").fetch_all(s.pool()).await.unwrap();
    assert_eq!(listed(s, &filter, 250).await, expected);
    let wide = JobFilter { queue: Some("wide".into()), job_type: Some("many.t007".into()), ..filter };
    let expected: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'completed' AND queue = 'wide' AND type = 'many.t007' ORDER BY id DESC")
            .fetch_all(s.pool())
            .await
            .unwrap();
    assert_eq!(expected.len(), 2);
    assert_eq!(listed(s, &wide, 1).await, expected);
    // A prefix over more lanes than are worth merging reads the table too.
    let prefixed = JobFilter { queue: None, job_type: Some("many.*".into()), ..wide };
    let expected: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'completed' AND type LIKE 'many.%' ORDER BY id DESC").fetch_all(s.pool()).await.unwrap();
    assert_eq!(expected.len(), 600);
    assert_eq!(listed(s, &prefixed, 250).await, expected);
    assert_eq!(listed_in(s, &prefixed, 250, Order::OldestFirst).await, expected.iter().rev().copied().collect::<Vec<_>>());
    let search = JobFilter { text: Some("lane".into()), ..prefixed.clone() };
    assert!(matches!(s.list_jobs_ordered(&search, None, 10, Order::OldestFirst).await, Err(StoreError::Invalid { .. })), "a search lists newest first");
    assert_eq!(s.count_jobs(&prefixed, 10_000).await.unwrap(), 600, "from the counters");
}

/// A queue's own retention overrides the pruner's for its finished jobs, shorter or longer;
/// the other queues keep the pruner's (a day for completed jobs, a week for discarded ones).
#[tokio::test]
async fn a_queue_s_own_retention_overrides_the_pruner_s() {
    use rebound_queue::store::{Actor, QueueRetention};
    let db = TestDb::new().await;
    let s = &db.store;
    let hour = Duration::from_secs(3600);
    s.set_queue_retention("short", QueueRetention { completed: Some(hour), discarded: None }, &Actor::new("t")).await.unwrap();
    s.set_queue_retention("long", QueueRetention { completed: Some(30 * 24 * hour), discarded: Some(hour) }, &Actor::new("t")).await.unwrap();
    assert_eq!(s.queue_retention("plain").await.unwrap(), QueueRetention::default());
    // In each queue: a job completed two days ago, one completed two hours ago, and one
    // cancelled two hours ago (each made an hour before it finished: the pruner reads the
    // UUIDv7 id's time).
    for queue in ["short", "long", "plain"] {
        for (args, finished_hours) in [(json!(["old"]), 48), (json!(["recent"]), 2), (json!(["cancelled"]), 2)] {
            let cancel = args == json!(["cancelled"]);
            let job = s.enqueue(NewJob::new("ret.job", args).queue(queue)).await.unwrap().job;
            sqlx::query(
                "UPDATE jobs SET state = CASE WHEN $3 THEN 'cancelled'::job_state ELSE 'completed'::job_state END,
                     completed_at = CASE WHEN $3 THEN NULL ELSE now() - $2 * interval '1 hour' END,
                     cancelled_at = CASE WHEN $3 THEN now() - $2 * interval '1 hour' END,
                     updated_at = now() - $2 * interval '1 hour',
                     id = (left(replace(rebound_id_floor(now() - ($2 + 1) * interval '1 hour')::text, '-', ''), 12) || right(replace(id::text, '-', ''), 20))::uuid
                 WHERE id = $1",
            )
            .bind(job.id)
            .bind(finished_hours)
            .bind(cancel)
            .execute(s.pool())
            .await
            .unwrap();
        }
    }
    let report = s.prune(&PruneConfig::default()).await.unwrap();
    let left: Vec<(String, String)> =
        sqlx::query_as("SELECT queue, args->>0 FROM jobs ORDER BY queue, args->>0").fetch_all(s.pool()).await.unwrap();
    let left: Vec<(&str, &str)> = left.iter().map(|(q, a)| (q.as_str(), a.as_str())).collect();
    assert_eq!(
        left,
        [
            ("long", "old"), ("long", "recent"), // a month's retention; its cancelled job went after an hour
            ("plain", "cancelled"), ("plain", "recent"), // the pruner's day and week
            ("short", "cancelled"), // an hour for completed jobs; its discards follow the pruner's week
        ],
        "{report:?}"
    );
    assert_eq!((report.completed, report.discarded), (3, 1));
    assert_counts_exact(s, "after pruning by queue").await;
}

/// Inserts `n` jobs of `queue` in `state` with priorities -3..=3 and scheduled times spread
/// over minutes before or after now, every 97th held back by a rate limit when available.
async fn insert_sortable(s: &Store, n: i64, queue: &str, state: &str, future: bool) {
    sqlx::query(
        "INSERT INTO jobs (id, type, queue, args, state, priority, scheduled_at, rate_limit_key, rate_limited, completed_at)
         SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint - 200000 + g), 12, '0')
                 || '7' || substr(md5($2 || $3 || g), 1, 3) || '8' || substr(md5($2 || $3 || g), 4, 15))::uuid,
                'sort.job', $2, jsonb_build_array(g), $3::job_state, g % 7 - 3,
                now() + CASE WHEN $4 THEN 1 ELSE -1 END * ((g * 7919) % 600) * interval '1 second',
                CASE WHEN $3 = 'available' AND g % 97 = 0 THEN 'sort.key' END, $3 = 'available' AND g % 97 = 0,
                CASE WHEN $3 = 'completed' THEN now() END
         FROM generate_series(1, $1) AS g",
    )
    .bind(n)
    .bind(queue)
    .bind(state)
    .bind(future)
    .execute(s.pool())
    .await
    .unwrap();
}

/// Sorted by priority or scheduled time (OJS admin `sort`): a filter matching few jobs is
/// sorted whole, whatever it is; the available jobs of one queue by priority and the scheduled
/// ones by scheduled time are read in index order at any size; anything else that matches
/// more than the window is refused naming `sort`, and a page past the window naming `page`.
#[tokio::test]
async fn sorted_listings_order_by_priority_or_scheduled_time() {
    use rebound_queue::store::{SORT_WINDOW, SortKey};
    let db = TestDb::new().await;
    let s = &db.store;
    let big = SORT_WINDOW + 50;
    // A key that admits nothing, so the jobs it holds back stay held.
    sqlx::query("INSERT INTO rate_limit_keys (key, concurrency) VALUES ('sort.key', 0)").execute(s.pool()).await.unwrap();
    insert_sortable(s, big, "backlog", "available", false).await;
    insert_sortable(s, big, "later", "scheduled", true).await;
    insert_sortable(s, 300, "later", "retryable", true).await;
    insert_sortable(s, big, "done", "completed", false).await;
    insert_sortable(s, 40, "small", "available", false).await;
    insert_sortable(s, 30, "small", "completed", false).await;
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE queue = 'backlog' AND rate_limited").fetch_one(s.pool()).await.unwrap();
    assert_eq!(held, big / 97, "held back by the rate limit");

    let ids = |(jobs, _more): (Vec<rebound_queue::Job>, bool)| jobs.into_iter().map(|j| j.id).collect::<Vec<_>>();
    // What Postgres itself says the order is, for rows `cond` selects.
    let truth = |cond: &'static str, order: &'static str, offset: i64, limit: i64| async move {
        sqlx::query_scalar::<_, uuid::Uuid>(sqlx::AssertSqlSafe(format!("SELECT id FROM jobs j WHERE {cond} ORDER BY {order} OFFSET {offset} LIMIT {limit}")))
            .fetch_all(s.pool())
            .await
            .unwrap()
    };
    let by_priority = ["j.priority DESC, j.scheduled_at, j.id", "j.priority, j.scheduled_at DESC, j.id DESC"];
    let by_time = ["j.scheduled_at DESC, j.id DESC", "j.scheduled_at, j.id"];
    let f = |states: Vec<JobState>, queue: Option<&str>| JobFilter { states, queue: queue.map(str::to_string), ..Default::default() };

    for (offset, limit) in [(0, 50), (137, 20), (SORT_WINDOW - 10, 100)] {
        for descending in [true, false] {
            let i = usize::from(!descending);
            // Beyond the window, in the claim's own order (the held-back jobs among them).
            let got = s.list_jobs_sorted(&f(vec![JobState::Available], Some("backlog")), SortKey::Priority, descending, offset, limit).await.unwrap();
            assert!(got.1, "more follow, past the window too");
            let want = truth("j.queue = 'backlog'", by_priority[i], offset, limit.min(SORT_WINDOW - offset)).await;
            assert_eq!(ids(got), want, "backlog by priority, descending {descending}, from {offset}");
            // Beyond the window, in the scheduler's order.
            let states = vec![JobState::Scheduled, JobState::Retryable];
            let got = s.list_jobs_sorted(&f(states, None), SortKey::ScheduledAt, descending, offset, limit).await.unwrap();
            let want = truth("j.state IN ('scheduled', 'retryable')", by_time[i], offset, limit.min(SORT_WINDOW - offset)).await;
            assert_eq!(ids(got), want, "due by scheduled time, descending {descending}, from {offset}");
        }
    }
    // Few matches, any filter and state, either key, sorted whole.
    for descending in [true, false] {
        let i = usize::from(!descending);
        let small = f(vec![], Some("small"));
        let got = s.list_jobs_sorted(&small, SortKey::Priority, descending, 5, 30).await.unwrap();
        assert_eq!(ids(got), truth("j.queue = 'small'", by_priority[i], 5, 30).await);
        let got = s.list_jobs_sorted(&small, SortKey::ScheduledAt, descending, 0, 100).await.unwrap();
        assert!(!got.1, "all 70 on one page");
        assert_eq!(ids(got), truth("j.queue = 'small'", by_time[i], 0, 100).await);
        assert!(s.list_jobs_sorted(&small, SortKey::ScheduledAt, descending, 0, 69).await.unwrap().1, "one more follows");
        let retryable = f(vec![JobState::Retryable], Some("later"));
        let got = s.list_jobs_sorted(&retryable, SortKey::Priority, descending, 0, 500).await.unwrap();
        assert_eq!(ids(got), truth("j.state = 'retryable'", by_priority[i], 0, 500).await);
    }

    // Too many, in no index's order: refused, naming the field and the way out.
    for (filter, key) in [
        (f(vec![JobState::Completed], None), SortKey::Priority),
        (f(vec![JobState::Available], None), SortKey::Priority),
        (f(vec![JobState::Available], Some("backlog")), SortKey::ScheduledAt),
        (f(vec![JobState::Scheduled], Some("later")), SortKey::ScheduledAt),
    ] {
        match s.list_jobs_sorted(&filter, key, true, 0, 20).await {
            Err(StoreError::Invalid { field, reason }) => {
                assert_eq!(field, "sort", "{filter:?} by {key:?}");
                assert!(reason.contains(&SORT_WINDOW.to_string()), "{reason}");
            }
            other => panic!("{filter:?} by {key:?}: {other:?}"),
        }
    }
    assert!(matches!(
        s.list_jobs_sorted(&f(vec![], Some("small")), SortKey::Priority, true, SORT_WINDOW, 20).await,
        Err(StoreError::Invalid { field, .. }) if field == "page"
    ));
    // The policy editor's dry run: a type's retryable jobs, soonest first, read from its lanes
    // however many scheduled jobs come before them in time.
    let waiting = s.waiting_retries("sort.job", 1000).await.unwrap();
    assert_eq!(waiting.iter().map(|w| w.0).collect::<Vec<_>>(), truth("j.state = 'retryable'", "j.scheduled_at, j.id", 0, 1000).await);
    assert_eq!(waiting.len(), 300);
    assert!(s.waiting_retries("sort.other", 10).await.unwrap().is_empty());
    assert!(matches!(s.waiting_retries("sort.*", 10).await, Err(StoreError::InvalidJob(_))), "one type, not a prefix");
    let search = JobFilter { text: Some("1".into()), ..f(vec![], Some("small")) };
    assert!(matches!(s.list_jobs_sorted(&search, SortKey::Priority, true, 0, 20).await, Err(StoreError::Invalid { field, .. }) if field == "sort"));
}
