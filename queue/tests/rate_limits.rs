//! Per-queue rate limits hold across concurrent claimers, each with its own connection pool
//! (as separate worker processes and API servers would be): the claim statement enforces them.

use std::time::{Duration, Instant};

use rebound_queue::store::{Actor, ClaimRequest, Completion, QueueRateLimit, RateLimitOverride, Window};
use rebound_queue::testing::{Fault, FaultPoint, FaultProxy, TestDb};
use rebound_queue::{NewJob, Store};
use serde_json::json;

async fn fill(store: &Store, queue: &str, n: usize) {
    let jobs = (0..n).map(|i| NewJob::new("rl.job", json!([i])).queue(queue)).collect();
    store.enqueue_batch(jobs).await.expect("enqueue");
}

fn request(queue: &str, worker: usize, limit: u32) -> ClaimRequest {
    ClaimRequest { worker_id: format!("w{worker}"), queues: vec![queue.into()], limit, visibility_timeout: Duration::from_secs(300) }
}

/// `claimers` tasks, each with its own pool, claim from `queue` in a loop for `run`; returns
/// the start times (by the database's clock) of every job claimed.
async fn race(url: &str, queue: &str, claimers: usize, batch: u32, run: Duration) -> Vec<jiff::Timestamp> {
    // Every pool is connected before any claim, and all stop together: the race lasts `run`
    // however long the connecting took (staggered starts made the throttle's count vary).
    let mut stores = Vec::new();
    for _ in 0..claimers {
        stores.push(Store::connect(url, 2).await.expect("connect"));
    }
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for (w, store) in stores.into_iter().enumerate() {
        let queue = queue.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut started = Vec::new();
            while Instant::now() < until {
                for job in store.claim(&request(&queue, w, batch)).await.expect("claim") {
                    started.push(job.started_at.expect("started"));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            started
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("claimer"));
    }
    all.sort();
    all
}

#[tokio::test]
async fn a_rate_window_admits_its_limit_across_eight_claimers() {
    let db = TestDb::new().await;
    fill(&db.store, "limited", 200).await;
    fill(&db.store, "free", 50).await;
    let limit = QueueRateLimit { rate: Some(Window { limit: 7, period: Duration::from_secs(3) }), ..Default::default() };
    db.store.set_queue_rate_limit("limited", Some(&limit), &Actor::new("t")).await.expect("set");
    let started = race(&db.url, "limited", 8, 3, Duration::from_millis(1500)).await;
    assert_eq!(started.len(), 7, "one window admits exactly 7 starts: {started:?}");
    // Unlimited queues are untouched.
    assert_eq!(db.store.claim(&request("free", 99, 50)).await.expect("claim").len(), 50);
    // The next window opens once this one has ended.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let next = race(&db.url, "limited", 8, 3, Duration::from_millis(500)).await;
    assert_eq!(next.len(), 7, "the next window admits 7 more");
    let state = &db.store.rate_limit_states(Some("limited")).await.expect("state")[0];
    assert_eq!((state.rate_used, state.waiting), (7, 200 - 14));
}

#[tokio::test]
async fn a_concurrency_limit_caps_active_jobs_across_claimers() {
    let db = TestDb::new().await;
    fill(&db.store, "conc", 100).await;
    let limit = QueueRateLimit { concurrency: Some(4), ..Default::default() };
    db.store.set_queue_rate_limit("conc", Some(&limit), &Actor::new("t")).await.expect("set");
    let started = race(&db.url, "conc", 8, 5, Duration::from_millis(800)).await;
    assert_eq!(started.len(), 4, "at most 4 active at once");
    // Finishing two frees two slots, for whoever claims next.
    let active: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM jobs WHERE queue = 'conc' AND state = 'active' LIMIT 2")
        .fetch_all(db.store.pool())
        .await
        .expect("active");
    for id in active {
        db.store.complete(&Completion { id, attempt: None, worker_id: None, started_at: None, result: None }).await.expect("complete");
    }
    let more = race(&db.url, "conc", 8, 5, Duration::from_millis(500)).await;
    assert_eq!(more.len(), 2);
    let active: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE queue = 'conc' AND state = 'active'").fetch_one(db.store.pool()).await.expect("count");
    assert_eq!(active, 4);
}

#[tokio::test]
async fn a_throttle_spaces_starts_evenly() {
    let db = TestDb::new().await;
    fill(&db.store, "thr", 100).await;
    // Four per second: starts at least 250 ms apart.
    let limit = QueueRateLimit { throttle: Some(Window { limit: 4, period: Duration::from_secs(1) }), ..Default::default() };
    db.store.set_queue_rate_limit("thr", Some(&limit), &Actor::new("t")).await.expect("set");
    let started = race(&db.url, "thr", 6, 10, Duration::from_millis(1600)).await;
    // About 1.6 s / 250 ms starts: the spacing below is the property; the count only says
    // the queue kept moving (each start's lateness on a loaded machine pushes the next).
    assert!((3..=8).contains(&started.len()), "about 1.6 s / 250 ms starts, got {}: {started:?}", started.len());
    for pair in started.windows(2) {
        let gap = pair[1].duration_since(pair[0]);
        assert!(gap >= jiff::SignedDuration::from_millis(249), "starts {gap:?} apart: {started:?}");
    }
    // Removing the limit frees the queue at once.
    db.store.set_queue_rate_limit("thr", None, &Actor::new("t")).await.expect("clear");
    assert_eq!(db.store.claim(&request("thr", 0, 500)).await.expect("claim").len(), 100 - started.len());
    assert!(db.store.rate_limit_states(None).await.expect("states").is_empty());
}

#[tokio::test]
async fn invalid_limits_are_refused() {
    let db = TestDb::new().await;
    let zero_throttle = QueueRateLimit { throttle: Some(Window { limit: 0, period: Duration::from_secs(1) }), ..Default::default() };
    assert!(db.store.set_queue_rate_limit("q", Some(&zero_throttle), &Actor::new("t")).await.is_err());
    let zero_period = QueueRateLimit { rate: Some(Window { limit: 3, period: Duration::ZERO }), ..Default::default() };
    assert!(db.store.set_queue_rate_limit("q", Some(&zero_period), &Actor::new("t")).await.is_err());
    assert!(db.store.queue_rate_limit("q").await.expect("read").is_none(), "nothing half-saved");
}

#[tokio::test]
async fn an_override_holds_a_queue_over_its_limit_until_it_ends() {
    let db = TestDb::new().await;
    let s = &db.store;
    let ops = Actor::new("ops");
    fill(s, "ov", 20).await;
    let base = QueueRateLimit { concurrency: Some(4), ..Default::default() };
    s.set_queue_rate_limit("ov", Some(&base), &ops).await.expect("set");
    // Whole seconds: the database keeps microseconds.
    let until = (jiff::Timestamp::now() + jiff::SignedDuration::from_mins(30)).round(jiff::Unit::Second).expect("round");
    let one = RateLimitOverride { concurrency: 1, expires_at: Some(until) };
    let state = s.override_queue_concurrency("ov", Some(&one), &ops).await.expect("override").expect("limited");
    assert_eq!((state.limit, state.override_limit, state.concurrency_in_force()), (base, Some(one), Some(1)));
    assert_eq!(race(&db.url, "ov", 8, 5, Duration::from_millis(500)).await.len(), 1, "one active at once across every claimer");
    // The queue's limit set meanwhile is kept under the override, not put in its place.
    let raised = QueueRateLimit { concurrency: Some(6), ..Default::default() };
    s.set_queue_rate_limit("ov", Some(&raised), &ops).await.expect("raise");
    assert_eq!(s.claim(&request("ov", 0, 10)).await.expect("claim").len(), 0, "still one at once");
    let wait = s.time_until_next_due().await.expect("wait").expect("the override's end");
    assert!(wait > Duration::from_secs(29 * 60) && wait <= Duration::from_secs(30 * 60), "{wait:?}");

    // Its end: the sweep clears it and wakes the queue's workers; the limit as set applies.
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.expect("listen");
    listener.listen("rebound_jobs").await.expect("listen");
    sqlx::query("UPDATE queues SET override_expires_at = now() - interval '1 millisecond' WHERE name = 'ov'").execute(s.pool()).await.expect("end");
    assert_eq!(s.time_until_next_due().await.expect("wait"), Some(Duration::ZERO), "an ended override is cleared at once");
    assert_eq!(s.settle_rate_limits(100).await.expect("sweep"), 1);
    let woken = tokio::time::timeout(Duration::from_secs(5), listener.recv()).await.expect("a notification").expect("recv");
    assert_eq!(woken.payload(), "ov");
    let state = &s.rate_limit_states(Some("ov")).await.expect("state")[0];
    assert_eq!((state.override_limit, state.concurrency_in_force()), (None, Some(6)));
    assert_eq!(s.claim(&request("ov", 0, 10)).await.expect("claim").len(), 5, "six at once");
    assert_eq!(s.time_until_next_due().await.expect("wait"), None);

    // An override of a queue with no limit of its own; removed, the queue is unlimited again.
    fill(s, "free", 3).await;
    let stop = RateLimitOverride { concurrency: 0, expires_at: None };
    assert!(s.override_queue_concurrency("free", Some(&stop), &ops).await.expect("override").is_some());
    assert!(s.claim(&request("free", 0, 10)).await.expect("claim").is_empty());
    assert_eq!(s.override_queue_concurrency("free", None, &ops).await.expect("remove"), None, "no limit left");
    assert_eq!(s.claim(&request("free", 0, 10)).await.expect("claim").len(), 3);

    // Bad overrides name their field and store nothing.
    let past = RateLimitOverride { concurrency: 0, expires_at: Some(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1)) };
    let e = s.override_queue_concurrency("free", Some(&past), &ops).await.expect_err("past");
    assert!(e.to_string().contains("expires_at"), "{e}");
    let huge = RateLimitOverride { concurrency: u32::MAX, expires_at: None };
    let e = s.override_queue_concurrency("free", Some(&huge), &ops).await.expect_err("huge");
    assert!(e.to_string().contains("concurrency"), "{e}");
    assert!(s.rate_limit_states(Some("free")).await.expect("state").is_empty(), "nothing half-saved");
}

/// The sweep's end of a queue's override cut off at its COMMIT: the claim already judges the
/// override by its end, so the queue's own limit applies at once; the row is cleared (and the
/// workers woken) by the next sweep.
#[tokio::test]
async fn an_ended_override_whose_clearing_is_cut_off_still_ends() {
    let db = TestDb::new().await;
    let s = &db.store;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.expect("connect");
    fill(s, "cut", 3).await;
    let stop = RateLimitOverride { concurrency: 0, expires_at: Some(jiff::Timestamp::now() + jiff::SignedDuration::from_mins(5)) };
    s.override_queue_concurrency("cut", Some(&stop), &Actor::new("ops")).await.expect("override");
    assert!(s.claim(&request("cut", 0, 10)).await.expect("claim").is_empty());
    sqlx::query("UPDATE queues SET override_expires_at = now() - interval '1 millisecond' WHERE name = 'cut'").execute(s.pool()).await.expect("end");

    let cut = proxy.inject(Fault::once("COMMIT", FaultPoint::BeforeSend));
    assert!(through.settle_rate_limits(100).await.is_err());
    assert_eq!(cut.count(), 1);
    proxy.clear();
    let left: Option<i32> = sqlx::query_scalar("SELECT override_concurrency FROM queues WHERE name = 'cut'").fetch_one(s.pool()).await.expect("row");
    assert_eq!(left, Some(0), "the clearing was rolled back");
    assert!(s.rate_limit_states(Some("cut")).await.expect("state").is_empty(), "but the override is over");
    assert_eq!(s.claim(&request("cut", 0, 1)).await.expect("claim").len(), 1, "and claims go on");
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.expect("listen");
    listener.listen("rebound_jobs").await.expect("listen");
    assert_eq!(s.settle_rate_limits(100).await.expect("sweep"), 1, "the next sweep clears it");
    let woken = tokio::time::timeout(Duration::from_secs(5), listener.recv()).await.expect("a notification").expect("recv");
    assert_eq!(woken.payload(), "cut", "and wakes the queue's workers");
    let left: Option<i32> = sqlx::query_scalar("SELECT override_concurrency FROM queues WHERE name = 'cut'").fetch_one(s.pool()).await.expect("row");
    assert_eq!(left, None);
}
