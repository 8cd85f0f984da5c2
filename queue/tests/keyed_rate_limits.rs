//! Per-job keyed concurrency limits (ojs-rate-limiting RL-001..RL-006): the jobs of a key hold
//! at most its limit of slots across queues, claimers and processes; the rest wait,
//! `available`, out of the claim's way, and are admitted highest priority first by the
//! statement that frees a slot. Faults at those statements neither leak nor double a slot.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rebound_queue::outcome::HandlerError;
use rebound_queue::store::{Actor, ClaimRequest, Completion, EventFilter, Failure, JobSelection, RateLimitOverride, RedriveBudget, RedriveOptions};
use rebound_queue::testing::{Fault, FaultPoint, FaultProxy, TestDb};
use rebound_queue::{Job, JobState, NewJob, Outcome, PolicyPatch, Store, StoreError};
use serde_json::json;
use uuid::Uuid;

fn keyed(queue: &str, key: &str, concurrency: Option<u32>, n: i64) -> NewJob {
    NewJob::new("rl.keyed", json!([n])).queue(queue).rate_limit(key, concurrency)
}

fn request(worker: &str, queues: &[&str], limit: u32) -> ClaimRequest {
    ClaimRequest { worker_id: worker.into(), queues: queues.iter().map(|q| (*q).to_owned()).collect(), limit, visibility_timeout: Duration::from_secs(300) }
}

fn done(job: &Job) -> Completion {
    Completion { id: job.id, attempt: Some(job.attempt), worker_id: job.locked_by.clone(), started_at: job.started_at, result: None }
}

/// The field a refusal names.
fn field_of(e: &StoreError) -> Option<&str> {
    match e {
        StoreError::InvalidJob(v) => Some(v.field.as_str()),
        StoreError::Invalid { field, .. } => Some(field.as_str()),
        _ => None,
    }
}

/// (active, admitted, waiting) of `key`, counted from the rows.
async fn slots(store: &Store, key: &str) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'active'),
                count(*) FILTER (WHERE state = 'available' AND NOT rate_limited),
                count(*) FILTER (WHERE state = 'available' AND rate_limited)
         FROM jobs WHERE rate_limit_key = $1",
    )
    .bind(key)
    .fetch_one(store.pool())
    .await
    .unwrap()
}

async fn rate_limit_events(store: &Store, kind: &str) -> Vec<serde_json::Value> {
    let filter = EventFilter { types: vec![kind.to_owned()], limit: 1000, ..EventFilter::default() };
    store.rate_limit_events(&filter).await.unwrap().into_iter().map(|e| e.data).collect()
}

#[tokio::test]
async fn a_key_admits_its_limit_and_frees_a_slot_for_each_job_that_stops_running() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut jobs: Vec<NewJob> = (0..5).map(|i| keyed("q", "tenant:acme", Some(2), i)).collect();
    jobs.extend((0..3).map(|i| NewJob::new("rl.free", json!([i])).queue("q")));
    let enqueued = s.enqueue_batch(jobs).await.unwrap();
    assert_eq!(enqueued.iter().filter(|e| e.job.rate_limited).count(), 3, "the answer says which wait");
    assert!(enqueued.iter().all(|e| e.job.state == JobState::Available), "waiting jobs are still available");
    assert_eq!(slots(s, "tenant:acme").await, (0, 2, 3));

    // A claim for ten gets the two admitted and every unkeyed job: it never waits on the key.
    let first = s.claim(&request("w1", &["q"], 10)).await.unwrap();
    assert_eq!(first.iter().filter(|j| j.rate_limit_key.is_some()).count(), 2);
    assert_eq!(first.len(), 5);
    assert!(s.claim(&request("w1", &["q"], 10)).await.unwrap().is_empty(), "the key is full");
    let state = s.rate_limit_key("tenant:acme").await.unwrap().unwrap();
    assert_eq!((state.in_force, state.active, state.admitted, state.waiting, state.free()), (Some(2), 2, 0, 3, Some(0)));

    // A completion frees one slot: one waiting job is admitted by it, in the same statement.
    let running: Vec<&Job> = first.iter().filter(|j| j.rate_limit_key.is_some()).collect();
    assert_eq!(s.complete_batch(&[done(running[0])]).await.unwrap(), vec![running[0].id]);
    assert_eq!(slots(s, "tenant:acme").await, (1, 1, 2));
    let next = s.claim(&request("w1", &["q"], 10)).await.unwrap();
    assert_eq!(next.len(), 1);

    // A failure into a retry stops it running too; the retry comes back through admission.
    let failure = Failure {
        id: running[1].id,
        attempt: Some(running[1].attempt),
        worker_id: Some("w1".into()),
        outcome: Outcome::Retry(HandlerError::new("upstream.busy", "try later")),
        error_code: None,
    };
    s.fail(&failure).await.unwrap();
    assert_eq!(slots(s, "tenant:acme").await, (1, 1, 1));

    // A cancelled running job frees its slot as well.
    s.cancel(next[0].id, None).await.unwrap();
    assert_eq!(slots(s, "tenant:acme").await, (0, 2, 0));

    // Events: one `exceeded` for the enqueue that left three waiting, one `released` per
    // job admitted from the wait.
    let exceeded = rate_limit_events(s, "rate_limit.exceeded").await;
    assert_eq!(exceeded.len(), 1, "{exceeded:?}");
    assert_eq!((exceeded[0]["key"].as_str(), exceeded[0]["limit"].as_i64(), exceeded[0]["current"].as_i64(), exceeded[0]["parked"].as_i64()), (Some("tenant:acme"), Some(2), Some(2), Some(3)));
    let released = rate_limit_events(s, "rate_limit.released").await;
    assert_eq!(released.len(), 3, "{released:?}");
    assert!(released.iter().all(|e| e["strategy"] == "concurrency" && e["job_id"].is_string()));
}

#[tokio::test]
async fn slots_go_to_the_highest_priority_across_queues() {
    let db = TestDb::new().await;
    let s = &db.store;
    let holder = s.enqueue(keyed("a", "api.stripe.com", Some(1), 0)).await.unwrap().job;
    assert!(!holder.rate_limited);
    let mut low = keyed("a", "api.stripe.com", None, 1);
    low.priority = -5;
    let low = s.enqueue(low).await.unwrap().job;
    assert!(low.rate_limited, "a job naming no concurrency keeps the key's limit");
    // A higher-priority job takes the slot of the admitted job no worker has claimed yet,
    // although it came later and to another queue.
    let mut high = keyed("b", "api.stripe.com", None, 2);
    high.priority = 50;
    let high = s.enqueue(high).await.unwrap().job;
    assert!(!high.rate_limited);
    assert!(s.job(holder.id).await.unwrap().rate_limited, "held back for the higher priority");
    assert!(s.claim(&request("w", &["a"], 5)).await.unwrap().is_empty());
    let claimed = s.claim(&request("w", &["b"], 5)).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![high.id]);
    // A running job keeps its slot whatever comes; when it ends, the next in priority order.
    let mut urgent = keyed("b", "api.stripe.com", None, 3);
    urgent.priority = 100;
    assert!(s.enqueue(urgent).await.unwrap().job.rate_limited);
    s.complete_batch(&[done(&claimed[0])]).await.unwrap();
    assert_eq!(s.claim(&request("w", &["b"], 5)).await.unwrap().len(), 1, "the urgent one");
    assert!(s.claim(&request("w", &["a"], 5)).await.unwrap().is_empty(), "the others still wait");
    assert_eq!(slots(s, "api.stripe.com").await, (1, 0, 2));
}

/// A job that comes back still marked waiting (it waited, was cancelled, and is retried) takes
/// its place in line: ahead of an admitted job it outranks that no worker has claimed.
#[tokio::test]
async fn a_waiting_job_retried_after_a_cancel_takes_its_place_in_line() {
    let db = TestDb::new().await;
    let s = &db.store;
    let ops = Actor::new("ops");
    let low = s.enqueue(keyed("a", "line", Some(1), 0)).await.unwrap().job;
    let mut urgent = keyed("a", "line", None, 1);
    urgent.priority = 10;
    let urgent = s.enqueue(urgent).await.unwrap().job;
    assert!(!urgent.rate_limited && s.job(low.id).await.unwrap().rate_limited, "the urgent one first");
    // Stopped, the urgent one is held back too, and cancelled while it waits.
    s.override_rate_limit("line", Some(&RateLimitOverride { concurrency: 0, expires_at: None }), &ops).await.unwrap();
    s.cancel(urgent.id, Some(&ops)).await.unwrap();
    s.override_rate_limit("line", None, &ops).await.unwrap();
    assert!(!s.job(low.id).await.unwrap().rate_limited, "the low one has the slot now");
    // Retried, it comes back still marked waiting, and outranks the admitted one.
    let report = s.retry_finished_jobs(&JobSelection::Ids(vec![urgent.id]), &ops).await.unwrap();
    assert_eq!(report.succeeded, 1, "{report:?}");
    let (u, l) = (s.job(urgent.id).await.unwrap(), s.job(low.id).await.unwrap());
    assert_eq!((u.state, u.rate_limited, l.rate_limited), (JobState::Available, false, true));
    assert_eq!(s.claim(&request("w", &["a"], 5)).await.unwrap().iter().map(|j| j.id).collect::<Vec<_>>(), vec![urgent.id]);
}

/// Six claimers with pools of their own (as separate workers would be) race over two queues
/// holding one key's jobs, completing each job a moment after claiming it. A watcher samples
/// the running count throughout: it never passes the limit, and every job runs.
#[tokio::test]
async fn the_limit_holds_across_concurrent_claimers_and_completions() {
    let db = TestDb::new().await;
    let jobs: Vec<NewJob> = (0..60).map(|i| keyed(if i % 2 == 0 { "x" } else { "y" }, "tenant:busy", Some(3), i)).collect();
    db.store.enqueue_batch(jobs).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let store = Store::connect(&db.url, 1).await.unwrap();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut most = 0i64;
            while !stop.load(Ordering::SeqCst) {
                let holding: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE rate_limit_key = 'tenant:busy' AND state IN ('active', 'available') AND NOT rate_limited")
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                most = most.max(holding);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            most
        })
    };
    let mut claimers = Vec::new();
    for w in 0..6 {
        let store = Store::connect(&db.url, 2).await.unwrap();
        claimers.push(tokio::spawn(async move {
            let mut ran = Vec::new();
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until {
                let claimed = store.claim(&request(&format!("w{w}"), &["x", "y"], 2)).await.unwrap();
                if claimed.is_empty() {
                    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state <> 'completed'").fetch_one(store.pool()).await.unwrap();
                    if left == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    continue;
                }
                tokio::time::sleep(Duration::from_millis(4)).await;
                let done: Vec<Completion> = claimed.iter().map(done).collect();
                assert_eq!(store.complete_batch(&done).await.unwrap().len(), claimed.len());
                ran.extend(claimed.iter().map(|j| j.id));
            }
            ran
        }));
    }
    let mut ran: Vec<Uuid> = Vec::new();
    for c in claimers {
        ran.extend(c.await.unwrap());
    }
    stop.store(true, Ordering::SeqCst);
    let most = watcher.await.unwrap();
    assert_eq!(ran.len(), 60, "every job ran");
    assert_eq!(ran.iter().collect::<HashSet<_>>().len(), 60, "once each");
    assert!(most <= 3, "at most three held a slot at once, saw {most}");
    assert!(most >= 2, "the watcher saw the key busy ({most})");
}

/// Brings a key's override to its end at once, as the clock would in time.
async fn end_override_now(s: &Store, key: &str) {
    sqlx::query("UPDATE rate_limit_keys SET override_expires_at = now() - interval '1 millisecond' WHERE key = $1").bind(key).execute(s.pool()).await.unwrap();
}

#[tokio::test]
async fn an_override_holds_a_key_back_and_its_end_lets_it_go() {
    let db = TestDb::new().await;
    let s = &db.store;
    let ops = Actor::new("ops");
    s.enqueue_batch((0..4).map(|i| keyed("q", "partner-api", Some(2), i)).collect()).await.unwrap();
    assert_eq!(slots(s, "partner-api").await, (0, 2, 2));

    // Incident: stop the key. Admitted jobs no worker has claimed are held back too.
    let paused = s.override_rate_limit("partner-api", Some(&RateLimitOverride { concurrency: 0, expires_at: None }), &ops).await.unwrap();
    assert_eq!((paused.in_force, paused.concurrency, paused.waiting), (Some(0), Some(2), 4));
    assert!(s.claim(&request("w", &["q"], 10)).await.unwrap().is_empty());

    // Lifted: the enqueued limit is back, and two are admitted at once.
    let lifted = s.override_rate_limit("partner-api", None, &ops).await.unwrap();
    assert_eq!((lifted.in_force, lifted.admitted, lifted.waiting, lifted.override_limit), (Some(2), 2, 2, None));

    // A stop that expires: the sweep ends it and admits into the room it leaves.
    // It lasts an hour, and is then brought to its end by hand: no stall can end it early.
    let later = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let stopped = s.override_rate_limit("partner-api", Some(&RateLimitOverride { concurrency: 0, expires_at: Some(later) }), &ops).await.unwrap();
    assert_eq!((stopped.in_force, stopped.admitted), (Some(0), 0));
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 0, "no room while the override lasts");
    end_override_now(s, "partner-api").await;
    assert!(s.settle_rate_limits(100).await.unwrap() >= 1);
    assert_eq!(slots(s, "partner-api").await, (0, 2, 2));

    // A raise that expires: what it admitted and no worker claimed is held back again.
    let raised = s.override_rate_limit("partner-api", Some(&RateLimitOverride { concurrency: 4, expires_at: Some(later) }), &ops).await.unwrap();
    assert_eq!((raised.in_force, raised.admitted, raised.waiting), (Some(4), 4, 0));
    assert_eq!(s.claim(&request("w", &["q"], 1)).await.unwrap().len(), 1);
    end_override_now(s, "partner-api").await;
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 1, "one override ended");
    assert_eq!(slots(s, "partner-api").await, (1, 1, 2), "back to two: one running, one admitted");
    assert_eq!(s.rate_limit_key("partner-api").await.unwrap().unwrap().override_limit, None);

    // Refused with the field named, and nothing changed.
    for (key, o, field) in [
        ("queue:q", RateLimitOverride { concurrency: 1, expires_at: None }, "key"),
        ("bad key", RateLimitOverride { concurrency: 1, expires_at: None }, "key"),
        ("partner-api", RateLimitOverride { concurrency: 1, expires_at: Some(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(5)) }, "expires_at"),
    ] {
        match s.override_rate_limit(key, Some(&o), &ops).await {
            Err(e) => assert_eq!(field_of(&e), Some(field), "{key}: {e}"),
            Ok(k) => panic!("{key}: accepted {k:?}"),
        }
    }
    assert_eq!(s.rate_limit_key("partner-api").await.unwrap().unwrap().override_limit, None);
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'rate_limit.override'").fetch_one(s.pool()).await.unwrap();
    assert_eq!(audited, 4);
}

#[tokio::test]
async fn bad_rate_limits_are_refused_with_their_field_and_store_nothing() {
    let db = TestDb::new().await;
    let s = &db.store;
    for (key, concurrency) in [("", None), ("-lead", None), ("has space", None), ("queue:emails", Some(1)), ("ok", Some(2_000_000))] {
        let err = s.enqueue(keyed("q", key, concurrency, 0)).await.expect_err(key);
        let field = if key == "ok" { "options.rate_limit.concurrency" } else { "options.rate_limit.key" };
        assert_eq!(field_of(&err), Some(field), "{key:?}: {err}");
    }
    for (limit, period, field) in [
        (2_000_000, Duration::from_secs(1), "options.rate_limit.rate.limit"),
        (5, Duration::from_micros(100), "options.rate_limit.rate.period"),
        (5, Duration::from_secs(400 * 24 * 3600), "options.rate_limit.rate.period"),
    ] {
        let err = s.enqueue(NewJob::new("rl.keyed", json!([])).rate_limit_window("ok", limit, period)).await.expect_err(field);
        assert_eq!(field_of(&err), Some(field), "{limit} per {period:?}: {err}");
    }
    // One bad job fails its whole batch, keys and all.
    let batch = vec![keyed("q", "good-key", Some(1), 0), keyed("q", "bad key", Some(1), 1)];
    assert_eq!(s.enqueue_batch(batch).await.err().as_ref().and_then(field_of), Some("jobs[1].options.rate_limit.key"));
    let stored: i64 = sqlx::query_scalar("SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM rate_limit_keys)").fetch_one(s.pool()).await.unwrap();
    assert_eq!(stored, 0);
}

/// A retry's backoff is its own: the retried job comes back through admission when it is due.
#[tokio::test]
async fn a_retried_job_waits_for_a_slot_again() {
    let db = TestDb::new().await;
    let s = &db.store;
    let patch = PolicyPatch::from_json(&json!({"initial_interval": "PT0.001S", "jitter": false})).unwrap();
    let first = s.enqueue(keyed("q", "k1", Some(1), 0).retry(patch)).await.unwrap().job;
    let second = s.enqueue(keyed("q", "k1", Some(1), 1)).await.unwrap().job;
    let claimed = s.claim(&request("w", &["q"], 5)).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![first.id]);
    let failure = Failure { id: first.id, attempt: Some(1), worker_id: Some("w".into()), outcome: Outcome::Retry(HandlerError::new("x.y", "no")), error_code: None };
    s.fail(&failure).await.unwrap();
    // The second took the freed slot; the first, due again, waits behind it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.promote_due(100).await.unwrap();
    let first_now = s.job(first.id).await.unwrap();
    assert_eq!((first_now.state, first_now.rate_limited), (JobState::Available, true));
    let claimed = s.claim(&request("w", &["q"], 5)).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![second.id]);
}

/// The completion that frees a slot, cut off before Postgres saw it: nothing moved, the slot
/// is still held. Its answer lost after it committed: the slot was freed and the next job
/// admitted once, and the worker's retry of the write changes nothing.
#[tokio::test]
async fn a_completion_cut_off_at_either_side_of_its_commit_admits_exactly_once() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let s = &db.store;
    // A rate window beside the slot: each admission is counted in it exactly once too.
    let hour = Duration::from_secs(3600);
    s.enqueue_batch((0..3).map(|i| keyed("q", "k", Some(1), i).rate_limit_window("k", 10, hour)).collect()).await.unwrap();
    let used = |s: &Store| {
        let s = s.clone();
        async move { s.rate_limit_key("k").await.unwrap().map(|k| k.rate_used) }
    };
    assert_eq!(used(s).await, Some(1));
    let job = s.claim(&request("w", &["q"], 5)).await.unwrap().remove(0);
    let fragment = "SET state = 'completed', completed_at = now()";

    let dropped = proxy.inject(Fault::once(fragment, FaultPoint::BeforeSend));
    assert!(through.complete_batch(&[done(&job)]).await.is_err());
    assert_eq!(dropped.count(), 1);
    assert_eq!(slots(s, "k").await, (1, 0, 2), "nothing moved");
    assert_eq!(used(s).await, Some(1));

    let lost = proxy.inject(Fault::once(fragment, FaultPoint::AfterCommit));
    assert!(through.complete_batch(&[done(&job)]).await.is_err(), "the answer was lost");
    assert_eq!(lost.count(), 1);
    assert_eq!(slots(s, "k").await, (0, 1, 1), "freed and refilled once");
    proxy.clear();
    assert!(through.complete_batch(&[done(&job)]).await.unwrap().is_empty(), "the retry finds it done");
    assert_eq!(slots(s, "k").await, (0, 1, 1));
    assert_eq!(used(s).await, Some(2), "the admission counted once");
    assert_eq!(rate_limit_events(s, "rate_limit.released").await.len(), 1);
}

/// A keyed enqueue and an override, each cut off at its COMMIT: rolled back whole, the key's
/// limit with it.
#[tokio::test]
async fn a_keyed_enqueue_or_override_cut_off_at_its_commit_leaves_nothing_behind() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let s = &db.store;
    s.enqueue(keyed("q", "k", Some(1), 0)).await.unwrap();

    let dropped = proxy.inject(Fault::once("COMMIT", FaultPoint::BeforeSend));
    assert!(through.enqueue(keyed("q", "k", Some(7), 1)).await.is_err());
    assert_eq!(dropped.count(), 1);
    let k = s.rate_limit_key("k").await.unwrap().unwrap();
    assert_eq!((k.concurrency, k.admitted, k.waiting), (Some(1), 1, 0), "neither the job nor its limit");

    let dropped = proxy.inject(Fault::once("COMMIT", FaultPoint::BeforeSend));
    assert!(through.override_rate_limit("k", Some(&RateLimitOverride { concurrency: 0, expires_at: None }), &Actor::new("ops")).await.is_err());
    assert_eq!(dropped.count(), 1);
    let k = s.rate_limit_key("k").await.unwrap().unwrap();
    assert_eq!((k.override_limit, k.admitted), (None, 1), "the admitted job was not held back");
    proxy.clear();
    through.enqueue(keyed("q", "k", Some(7), 1)).await.unwrap();
    assert_eq!(s.rate_limit_key("k").await.unwrap().unwrap().admitted, 2);
}

/// A handler's failure saying when the upstream takes calls again (`rate_limit_until`, §9)
/// holds its key until then: nothing more is admitted, an admitted job not yet claimed is held
/// back, `rate_limit.dynamic_adjusted` says so, and the sweep lets the key go when the time is
/// up. A value that is not a time changes nothing (and does not fail the failure's write).
#[tokio::test]
async fn a_failure_with_rate_limit_until_holds_its_key_until_then() {
    let db = TestDb::new().await;
    let s = &db.store;
    s.enqueue_batch((0..4).map(|i| keyed("q", "upstream", Some(2), i)).collect()).await.unwrap();
    let running = s.claim(&request("w", &["q"], 1)).await.unwrap().remove(0);
    assert_eq!(slots(s, "upstream").await, (1, 1, 2));

    let fail_with = |job: &Job, details: serde_json::Value| Failure {
        id: job.id,
        attempt: Some(job.attempt),
        worker_id: Some("w".into()),
        outcome: Outcome::Retry(HandlerError::new("http.429", "slow down").with_details(details)),
        error_code: None,
    };
    // An hour, ended by hand below: no stall can let the key go early.
    let until = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    s.fail(&fail_with(&running, json!({"rate_limit_until": until.to_string()}))).await.unwrap();
    let held = s.rate_limit_key("upstream").await.unwrap().unwrap();
    assert_eq!((held.in_force, held.held_until.is_some(), held.active, held.admitted, held.waiting), (Some(0), true, 0, 0, 3), "{held:?}");
    assert!(s.claim(&request("w", &["q"], 5)).await.unwrap().is_empty());
    let adjusted = rate_limit_events(s, "rate_limit.dynamic_adjusted").await;
    assert_eq!((adjusted.len(), adjusted[0]["reason"].as_str()), (1, Some("http.429")), "{adjusted:?}");

    sqlx::query("UPDATE rate_limit_keys SET held_until = now() - interval '1 millisecond' WHERE key = 'upstream'").execute(s.pool()).await.unwrap();
    assert!(s.settle_rate_limits(100).await.unwrap() >= 1);
    assert_eq!(slots(s, "upstream").await, (0, 2, 1), "let go: the limit of two again");
    assert_eq!(s.rate_limit_key("upstream").await.unwrap().unwrap().held_until, None);

    // Garbage, or a time already past: recorded as details, the key untouched.
    let next = s.claim(&request("w", &["q"], 1)).await.unwrap().remove(0);
    s.fail(&fail_with(&next, json!({"rate_limit_until": "when pigs fly"}))).await.unwrap();
    let past = s.claim(&request("w", &["q"], 1)).await.unwrap().remove(0);
    s.fail(&fail_with(&past, json!({"rate_limit_until": "2001-01-01T00:00:00Z"}))).await.unwrap();
    // Only an RFC 3339 time with its offset: not Postgres' own words, nor a zone-less time.
    let soon = (jiff::Timestamp::now() + jiff::SignedDuration::from_mins(30)).strftime("%Y-%m-%d %H:%M:%S").to_string();
    s.enqueue_batch((10..14).map(|i| keyed("q", "upstream", Some(2), i)).collect()).await.unwrap();
    for odd in [json!("tomorrow"), json!("infinity"), json!(soon), json!(12)] {
        let run = s.claim(&request("w", &["q"], 1)).await.unwrap().remove(0);
        s.fail(&fail_with(&run, json!({"rate_limit_until": odd}))).await.unwrap();
    }
    assert_eq!(s.rate_limit_key("upstream").await.unwrap().unwrap().held_until, None);
    assert_eq!(rate_limit_events(s, "rate_limit.dynamic_adjusted").await.len(), 1);
}

/// A key's row goes once no job names it, nothing is in force on it (an override, a hold, a
/// rate window) and nothing touched it for the completed jobs' retention; a key whose jobs are
/// still kept (a dead letter that could be re-driven), an override with no end, a window still
/// open, or a key an enqueue holds while the pruner passes, stays. Keys that must stay do not
/// keep the pruner from the ones that can go.
#[tokio::test]
async fn keys_are_pruned_once_no_job_names_them() {
    use rebound_queue::store::PruneConfig;
    let db = TestDb::new().await;
    let s = &db.store;
    let ops = Actor::new("ops");
    let hour = Duration::from_secs(3600);
    s.enqueue_batch(vec![
        keyed("q", "finished", Some(1), 1),
        keyed("q", "waiting", Some(1), 2),
        keyed("dlq", "dead", Some(1), 3),
        keyed("w", "windowed", None, 4).rate_limit_window("windowed", 5, hour),
    ])
    .await
    .unwrap();
    s.override_rate_limit("stopped", Some(&RateLimitOverride { concurrency: 0, expires_at: None }), &ops).await.unwrap();
    s.override_rate_limit("lapsed", Some(&RateLimitOverride { concurrency: 0, expires_at: Some(jiff::Timestamp::now() + jiff::SignedDuration::from_millis(300)) }), &ops)
        .await
        .unwrap();
    let finished = s.claim(&request("w", &["q"], 1)).await.unwrap().remove(0);
    s.complete(&done(&finished)).await.unwrap();
    let windowed = s.claim(&request("w", &["w"], 1)).await.unwrap().remove(0);
    s.complete(&done(&windowed)).await.unwrap();
    let dead = s.claim(&request("w", &["dlq"], 1)).await.unwrap().remove(0);
    s.fail(&Failure { id: dead.id, attempt: Some(dead.attempt), worker_id: Some("w".into()), outcome: Outcome::DeadLetter(HandlerError::new("x", "no")), error_code: None })
        .await
        .unwrap();
    // The stalest rows are the ones that must stay: a pass of one still finds the others.
    sqlx::query("UPDATE rate_limit_keys SET updated_at = updated_at - interval '1 day' WHERE key IN ('stopped', 'windowed', 'dead')").execute(s.pool()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;

    let names = |s: &Store| {
        let s = s.clone();
        async move { s.rate_limit_key_names(None, 100).await.unwrap() }
    };
    // Within the retention, nothing goes.
    assert_eq!(s.prune(&PruneConfig::default()).await.unwrap().rate_limit_keys, 0);
    let instant = PruneConfig { completed_after: Duration::ZERO, batch: 1, ..Default::default() };
    let mut gone = 0;
    for _ in 0..4 {
        gone += s.prune(&instant).await.unwrap().rate_limit_keys;
    }
    assert_eq!(gone, 2);
    assert_eq!(names(s).await, ["dead", "stopped", "waiting", "windowed"], "the finished job's key and the lapsed override went");
    assert_eq!(s.rate_limit_key_names(Some("dead"), 1).await.unwrap(), ["stopped"]);
    assert_eq!(s.rate_limit_key_count(Some("stopped")).await.unwrap(), (4, 2));
    // Its window over, the windowed key goes too.
    sqlx::query("UPDATE rate_limit_keys SET rate_window_start = rate_window_start - interval '2 hours' WHERE key = 'windowed'").execute(s.pool()).await.unwrap();
    assert_eq!(s.prune(&instant).await.unwrap().rate_limit_keys, 1);

    // The waiting key's job finishes and is pruned, while an enqueue naming the key holds its
    // row: the pruner passes it over, and the job the enqueue adds keeps it afterwards.
    let job = s.claim(&request("w", &["q"], 1)).await.unwrap().remove(0);
    s.complete(&done(&job)).await.unwrap();
    let mut enqueue = s.pool().begin().await.unwrap();
    sqlx::query("UPDATE rate_limit_keys SET updated_at = now() WHERE key = 'waiting'").execute(&mut *enqueue).await.unwrap();
    sqlx::query("INSERT INTO jobs (id, type, queue, args, state, rate_limit_key) VALUES ($1, 'rl.keyed', 'q', '[]', 'available', 'waiting')")
        .bind(Uuid::now_v7())
        .execute(&mut *enqueue)
        .await
        .unwrap();
    let report = s.prune(&PruneConfig { batch: 10, ..instant.clone() }).await.unwrap();
    assert_eq!((report.completed, report.rate_limit_keys), (1, 0), "{report:?}");
    enqueue.commit().await.unwrap();
    assert_eq!(s.prune(&instant).await.unwrap().rate_limit_keys, 0);
    assert_eq!(names(s).await, ["dead", "stopped", "waiting"]);
    assert_eq!(slots(s, "waiting").await, (0, 1, 0), "the new job holds a slot under the kept limit");

    // The dead letter comes back under its key's limit.
    let opts = RedriveOptions { budget: RedriveBudget::Fresh, stagger: None, actor: ops.clone(), reason: None };
    assert_eq!(s.redrive(&JobSelection::Ids(vec![dead.id]), &opts).await.unwrap(), 1);
    let back = s.rate_limit_key("dead").await.unwrap().unwrap();
    assert_eq!((back.in_force, back.admitted), (Some(1), 1), "{back:?}");
}

/// Ends `key`'s rate window and throttle spacing now, as if their periods had passed.
async fn end_window(store: &Store, key: &str) {
    sqlx::query(
        "UPDATE rate_limit_keys SET rate_window_start = rate_window_start - rate_period_ms * interval '1 millisecond',
                throttle_window_start = throttle_window_start - throttle_period_ms * interval '1 millisecond' / throttle_max
         WHERE key = $1",
    )
    .bind(key)
    .execute(store.pool())
    .await
    .unwrap();
}

/// A key's rate window (RL-R001) lets at most its limit of jobs start per period, across
/// queues, with or without a concurrency beside it: the rest wait, and the sweep admits the
/// next window's share once the period is over. Jobs admitted and never claimed count in the
/// next window (they do not pile up), and a job that comes in while others wait joins the line.
#[tokio::test]
async fn a_rate_window_admits_its_limit_per_period() {
    let db = TestDb::new().await;
    let s = &db.store;
    let hour = Duration::from_secs(3600);
    let windowed = |queue: &str, n: i64| NewJob::new("rl.keyed", json!([n])).queue(queue).rate_limit_window("smtp", 3, hour);
    s.enqueue_batch((0..5).map(|n| windowed(if n % 2 == 0 { "a" } else { "b" }, n)).collect()).await.unwrap();
    s.enqueue(windowed("a", 5)).await.unwrap();
    let k = s.rate_limit_key("smtp").await.unwrap().unwrap();
    assert_eq!((k.rate.map(|w| w.limit), k.rate_used, k.admitted, k.waiting, k.in_force), (Some(3), 3, 3, 3, None), "{k:?}");
    assert!(k.rate_window_resets_at.is_some_and(|t| t > jiff::Timestamp::now() + jiff::SignedDuration::from_mins(59)), "{k:?}");
    let exceeded = rate_limit_events(s, "rate_limit.exceeded").await;
    let mut parked: Vec<_> = exceeded.iter().map(|e| (e["strategy"].as_str(), e["parked"].as_i64())).collect();
    parked.sort();
    assert_eq!(parked, [(Some("rate"), Some(1)), (Some("rate"), Some(2))], "{exceeded:?}");

    // Finishing them frees no start: the window is spent.
    let first = s.claim(&request("w", &["a", "b"], 10)).await.unwrap();
    assert_eq!(first.len(), 3);
    for job in &first {
        s.complete(&done(job)).await.unwrap();
    }
    assert_eq!(slots(s, "smtp").await, (0, 0, 3));
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 0, "no room before the window ends");

    // The next window: the sweep admits three more.
    end_window(s, "smtp").await;
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 1);
    assert_eq!(slots(s, "smtp").await, (0, 3, 0));
    assert_eq!(s.rate_limit_key("smtp").await.unwrap().unwrap().rate_used, 3);

    // No worker claims them (a paused queue, say) and the window ends: they start in the next
    // one and fill it, so the two that come now wait.
    end_window(s, "smtp").await;
    let late: Vec<Uuid> = s.enqueue_batch((6..8).map(|n| windowed("a", n)).collect()).await.unwrap().iter().map(|e| e.job.id).collect();
    assert_eq!(slots(s, "smtp").await, (0, 3, 2));
    for job in &s.claim(&request("w", &["a", "b"], 10)).await.unwrap() {
        s.complete(&done(job)).await.unwrap();
    }

    // Two waiting when the window ends; three come in before the sweep: the two that waited
    // go first (same priority, older), then one of the three.
    end_window(s, "smtp").await;
    let newer: Vec<Uuid> = s.enqueue_batch((8..11).map(|n| windowed("b", n)).collect()).await.unwrap().iter().map(|e| e.job.id).collect();
    let admitted: HashSet<Uuid> = sqlx::query_scalar("SELECT id FROM jobs WHERE rate_limit_key = 'smtp' AND state = 'available' AND NOT rate_limited")
        .fetch_all(s.pool())
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(admitted.len(), 3);
    assert!(late.iter().all(|id| admitted.contains(id)), "the two that waited: {admitted:?}");
    assert_eq!(newer.iter().filter(|id| admitted.contains(id)).count(), 1);
}

/// Every retry is a start of its own, a retry with no backoff too (the job goes straight back
/// to `available`): once the window is spent, the next retry waits for the next window. With a
/// concurrency beside the window, both hold.
#[tokio::test]
async fn every_retry_counts_in_the_rate_window() {
    let db = TestDb::new().await;
    let s = &db.store;
    let hour = Duration::from_secs(3600);
    let patch = PolicyPatch::from_json(&json!({"max_attempts": 5, "initial_interval": "PT0.0001S", "jitter": false})).unwrap();
    s.put_policy("rl.keyed", &patch, &Actor::new("ops"), None).await.unwrap();
    let failed = |job: &Job| Failure {
        id: job.id,
        attempt: Some(job.attempt),
        worker_id: Some("w".into()),
        outcome: Outcome::Retry(HandlerError::new("smtp.busy", "421")),
        error_code: None,
    };
    let id = s.enqueue(NewJob::new("rl.keyed", json!([1])).queue("a").rate_limit_window("retry", 2, hour)).await.unwrap().job.id;
    let run = s.claim(&request("w", &["a"], 10)).await.unwrap().remove(0);
    s.fail(&failed(&run)).await.unwrap();
    assert_eq!(s.job(id).await.unwrap().state, JobState::Available, "retried at once");
    let again = s.claim(&request("w", &["a"], 10)).await.unwrap();
    assert_eq!(again.len(), 1, "the second start of the window");
    s.fail(&failed(&again[0])).await.unwrap();
    assert!(s.claim(&request("w", &["a"], 10)).await.unwrap().is_empty(), "a third start would pass the window");
    let k = s.rate_limit_key("retry").await.unwrap().unwrap();
    assert_eq!((k.rate_used, k.waiting), (2, 1), "{k:?}");
    end_window(s, "retry").await;
    assert_eq!(s.settle_rate_limits(10).await.unwrap(), 1);
    assert_eq!(s.claim(&request("w", &["a"], 10)).await.unwrap().len(), 1);

    // A concurrency beside the window: one at a time, two per window.
    let both = |n: i64| NewJob::new("rl.keyed", json!([n])).queue("b").rate_limit_window("both", 2, hour).rate_limit("both", Some(1));
    s.enqueue_batch((0..4).map(both).collect()).await.unwrap();
    let k = s.rate_limit_key("both").await.unwrap().unwrap();
    assert_eq!((k.concurrency, k.rate.map(|w| w.limit), k.admitted, k.waiting), (Some(1), Some(2), 1, 3), "the builder kept both: {k:?}");
    for _ in 0..2 {
        let run = s.claim(&request("w", &["b"], 10)).await.unwrap();
        assert_eq!(run.len(), 1);
        s.complete(&done(&run[0])).await.unwrap();
    }
    assert!(s.claim(&request("w", &["b"], 10)).await.unwrap().is_empty(), "two starts spent");
    assert_eq!(slots(s, "both").await, (0, 0, 2));
}

/// Six claimers with pools of their own race over a key with a concurrency of 3 and a window of
/// 10 starts, completing half of what they claim and failing the rest into an immediate retry,
/// while more jobs of the key are enqueued: exactly 10 starts happen, never more than 3 at once.
#[tokio::test]
async fn a_rate_window_holds_across_concurrent_claimers_enqueues_and_retries() {
    let db = TestDb::new().await;
    let hour = Duration::from_secs(3600);
    let patch = PolicyPatch::from_json(&json!({"max_attempts": 20, "initial_interval": "PT0.0001S", "jitter": false})).unwrap();
    db.store.put_policy("rl.keyed", &patch, &Actor::new("ops"), None).await.unwrap();
    let job = move |i: i64| keyed(if i % 2 == 0 { "x" } else { "y" }, "tenant:windowed", Some(3), i).rate_limit_window("tenant:windowed", 10, hour);
    db.store.enqueue_batch((0..20).map(job).collect()).await.unwrap();
    let running = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let most = Arc::new(std::sync::atomic::AtomicI64::new(0));
    // The claimers go on until told to stop, which is once the window is spent and nothing is
    // running under the key (and a little after, so that a start the window should have
    // refused gets its chance): an idle spell on a loaded machine does not end the race early.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut claimers = Vec::new();
    for w in 0..6 {
        let store = Store::connect(&db.url, 2).await.unwrap();
        let (running, most, stop) = (running.clone(), most.clone(), stop.clone());
        claimers.push(tokio::spawn(async move {
            let mut starts = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let claimed = store.claim(&request(&format!("w{w}"), &["x", "y"], 2)).await.unwrap();
                if claimed.is_empty() {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    continue;
                }
                starts += claimed.len();
                let now = running.fetch_add(claimed.len() as i64, Ordering::SeqCst) + claimed.len() as i64;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                running.fetch_sub(claimed.len() as i64, Ordering::SeqCst);
                for (n, j) in claimed.iter().enumerate() {
                    if (starts + n).is_multiple_of(2) {
                        store.complete(&done(j)).await.unwrap();
                    } else {
                        let failure = Failure { id: j.id, attempt: Some(j.attempt), worker_id: j.locked_by.clone(), outcome: Outcome::Retry(HandlerError::new("x.busy", "try again")), error_code: None };
                        store.fail(&failure).await.unwrap();
                    }
                }
            }
            starts
        }));
    }
    let enqueuer = {
        let store = db.store.clone();
        tokio::spawn(async move {
            for i in 0..5 {
                store.enqueue_batch(vec![job(100 + 2 * i), job(101 + 2 * i)]).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    enqueuer.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let k = db.store.rate_limit_key("tenant:windowed").await.unwrap().unwrap();
        if (k.rate_used >= 10 && k.active == 0 && k.admitted == 0) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let mut starts = 0;
    for c in claimers {
        starts += c.await.unwrap();
    }
    assert_eq!(starts, 10, "the window's ten starts, retries among them");
    assert!(most.load(Ordering::SeqCst) <= 3, "at most three at once");
    let k = db.store.rate_limit_key("tenant:windowed").await.unwrap().unwrap();
    assert_eq!((k.rate_used, k.active, k.admitted), (10, 0, 0), "{k:?}");
}

/// `on_limit` (OJS rate limiting §6.2): a job its key's limit would leave waiting is dropped
/// (discarded, `rate_limit.dropped`) or, when a spent rate window holds it, rescheduled to the
/// window's end, and comes back through admission then; held by the concurrency, a job asking
/// to be rescheduled waits (no end can be named). A job its key has room for runs as usual.
#[tokio::test]
async fn on_limit_drops_or_reschedules_what_would_wait() {
    use rebound_queue::job::OnLimit;
    let db = TestDb::new().await;
    let s = &db.store;
    let hour = Duration::from_secs(3600);
    let first = s.enqueue(keyed("q", "drop-key", Some(1), 0).on_limit(OnLimit::Drop)).await.unwrap().job;
    assert_eq!((first.state, first.rate_limited), (JobState::Available, false));
    let dropped = s.enqueue(keyed("q", "drop-key", Some(1), 1).on_limit(OnLimit::Drop)).await.unwrap().job;
    assert_eq!(dropped.state, JobState::Discarded, "the answer says so");
    let stored = s.job(dropped.id).await.unwrap();
    assert_eq!((stored.state, stored.last_error.as_ref().and_then(|e| e["type"].as_str())), (JobState::Discarded, Some("rate_limit.dropped")));
    let events = rate_limit_events(s, "rate_limit.dropped").await;
    assert_eq!((events.len(), events[0]["job_id"].as_str()), (1, Some(dropped.id.to_string().as_str())), "{events:?}");
    assert_eq!(slots(s, "drop-key").await, (0, 1, 0));
    // It never ran: one attempt row says why, and its events end with `job.discarded`.
    let attempts = s.attempts(dropped.id).await.unwrap();
    assert_eq!(attempts.iter().map(|a| (a.outcome.as_str(), a.attempt, a.started_at)).collect::<Vec<_>>(), vec![("dropped", 0, None)]);
    let mut seen = s.events(&EventFilter { job_id: Some(dropped.id), limit: 10, ..Default::default() }).await.unwrap();
    seen.reverse();
    assert_eq!(seen.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>(), ["job.enqueued", "job.discarded"], "{seen:?}");
    assert_eq!(seen[1].error.as_ref().and_then(|e| e["type"].as_str()), Some("rate_limit.dropped"));
    // A drop is not a failure: the overview's failure count leaves it out.
    let failed: i64 = s.throughput(5).await.unwrap().iter().map(|m| m.2).sum();
    assert_eq!(failed, 0);
    // An operator's retry asks for it to run: it waits for its key, not dropped again.
    let ops = Actor::new("ops");
    assert_eq!(s.retry_finished_jobs(&JobSelection::Ids(vec![dropped.id]), &ops).await.unwrap().succeeded, 1);
    let retried = s.job(dropped.id).await.unwrap();
    assert_eq!((retried.state, retried.rate_limited), (JobState::Available, true), "waiting");
    s.complete(&done(&s.claim(&request("w", &["q"], 5)).await.unwrap()[0])).await.unwrap();
    assert_eq!(s.claim(&request("w", &["q"], 5)).await.unwrap().iter().map(|j| j.id).collect::<Vec<_>>(), vec![dropped.id], "admitted when the slot freed");
    assert_eq!(rate_limit_events(s, "rate_limit.dropped").await.len(), 1);

    let windowed = |n: i64| NewJob::new("rl.keyed", json!([n])).queue("r").rate_limit_window("resched", 1, hour).on_limit(OnLimit::Reschedule);
    let a = s.enqueue(windowed(0)).await.unwrap().job;
    let b = s.enqueue(windowed(1)).await.unwrap().job;
    assert_eq!(a.state, JobState::Available);
    assert_eq!(b.state, JobState::Scheduled);
    assert!(b.scheduled_at > jiff::Timestamp::now() + jiff::SignedDuration::from_mins(59), "the window's end: {}", b.scheduled_at);
    let mut moved = s.events(&EventFilter { job_id: Some(b.id), types: vec!["job.scheduled".into()], limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!((moved.len(), moved.pop().and_then(|e| e.scheduled_at)), (1, Some(b.scheduled_at)), "a job.scheduled event");
    assert_eq!(s.job(b.id).await.unwrap().enqueued_at, None, "scheduled, so not enqueued yet");
    let held = keyed("c", "conc", Some(1), 0).on_limit(OnLimit::Reschedule);
    s.enqueue(held).await.unwrap();
    let waits = s.enqueue(keyed("c", "conc", Some(1), 1).on_limit(OnLimit::Reschedule)).await.unwrap().job;
    assert_eq!((waits.state, waits.rate_limited), (JobState::Available, true), "held by the concurrency, it waits");
    // A handler's hold names its end: a job asking to be rescheduled goes to then.
    s.enqueue(keyed("h", "held", Some(5), 0)).await.unwrap();
    sqlx::query("UPDATE rate_limit_keys SET held_until = date_trunc('second', now()) + interval '10 minutes' WHERE key = 'held'").execute(s.pool()).await.unwrap();
    let until: jiff::Timestamp = sqlx::query_scalar::<_, String>("SELECT to_char(held_until AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') FROM rate_limit_keys WHERE key = 'held'")
        .fetch_one(s.pool()).await.unwrap().parse().unwrap();
    let later = s.enqueue(keyed("h", "held", Some(5), 1).on_limit(OnLimit::Reschedule)).await.unwrap().job;
    assert_eq!((later.state, later.scheduled_at), (JobState::Scheduled, until), "the hold's end");

    // Its time come (and the window over), the rescheduled job is admitted like any other.
    let ran = s.claim(&request("w", &["r"], 5)).await.unwrap();
    assert_eq!(ran.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a.id]);
    s.complete(&done(&ran[0])).await.unwrap();
    end_window(s, "resched").await;
    sqlx::query("UPDATE jobs SET scheduled_at = now() WHERE id = $1").bind(b.id).execute(s.pool()).await.unwrap();
    s.promote_due(10).await.unwrap();
    let back = s.job(b.id).await.unwrap();
    assert_eq!((back.state, back.rate_limited), (JobState::Available, false));
    assert_eq!(s.claim(&request("w", &["r"], 5)).await.unwrap().len(), 1);
}

/// An enqueue its key's limit drops (`on_limit: drop`), cut off at its COMMIT: before Postgres
/// saw it, nothing of it stands (no job, no drop, no event); with the answer lost after it
/// committed, the job was dropped once, and the enqueue sent again with the same id is refused
/// as a duplicate naming it, dropping nothing more.
#[tokio::test]
async fn a_dropping_enqueue_cut_off_at_its_commit_drops_at_most_once() {
    use rebound_queue::job::OnLimit;
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let s = &db.store;
    s.enqueue(keyed("q", "k", Some(1), 0)).await.unwrap();
    let mut job = keyed("q", "k", Some(1), 1).on_limit(OnLimit::Drop);
    job.id = Some(Uuid::now_v7());
    let id = job.id;

    let cut = proxy.inject(Fault::once("COMMIT", FaultPoint::BeforeSend));
    assert!(through.enqueue(job.clone()).await.is_err());
    assert_eq!(cut.count(), 1);
    assert!(matches!(s.job(id.unwrap()).await, Err(StoreError::NotFound(_))), "rolled back whole");
    assert!(rate_limit_events(s, "rate_limit.dropped").await.is_empty());

    let lost = proxy.inject(Fault::once("COMMIT", FaultPoint::AfterCommit));
    assert!(through.enqueue(job.clone()).await.is_err(), "the answer was lost");
    assert_eq!(lost.count(), 1);
    proxy.clear();
    match through.enqueue(job).await {
        Err(StoreError::Duplicate { existing, .. }) => assert_eq!(existing, id),
        other => panic!("the second send is a duplicate: {other:?}"),
    }
    let stored = s.job(id.unwrap()).await.unwrap();
    assert_eq!(stored.state, JobState::Discarded);
    assert_eq!(rate_limit_events(s, "rate_limit.dropped").await.len(), 1);
    assert_eq!(s.attempts(stored.id).await.unwrap().len(), 1, "one drop recorded");
    assert_eq!(slots(s, "k").await, (0, 1, 0), "the first job keeps its slot");
}

/// A job to drop that another transaction held while its key was settled stays waiting; the
/// sweep settles its key though the key has no room, and drops it then.
#[tokio::test]
async fn the_sweep_drops_what_a_settle_passed_over() {
    let db = TestDb::new().await;
    let s = &db.store;
    s.enqueue(keyed("q", "k", Some(1), 0)).await.unwrap();
    let passed = s.enqueue(keyed("q", "k", Some(1), 1)).await.unwrap().job;
    assert!(passed.rate_limited);
    // As if it had asked to be dropped and its row had been held when its key was settled.
    sqlx::query("UPDATE jobs SET rate_limit_on_limit = 'drop' WHERE id = $1").bind(passed.id).execute(s.pool()).await.unwrap();
    assert_eq!(s.job(passed.id).await.unwrap().state, JobState::Available);
    s.settle_rate_limits(10).await.unwrap();
    assert_eq!(s.job(passed.id).await.unwrap().state, JobState::Discarded);
    assert_eq!(slots(s, "k").await, (0, 1, 0), "the admitted job keeps its slot");
}

/// A key's throttle (RL-R002) spaces its jobs' starts at least `period / limit` apart across
/// queues: one is admitted per spacing, in line order, beside the key's concurrency; the
/// scheduler is told when the spacing ends; a job that asks to be rescheduled is, one spacing
/// after the one before it.
#[tokio::test]
async fn a_throttle_spaces_its_keys_starts() {
    use rebound_queue::job::OnLimit;
    let db = TestDb::new().await;
    let s = &db.store;
    let hour = Duration::from_secs(3600);
    // Two per hour: one every 30 minutes.
    let throttled = |queue: &str, n: i64| NewJob::new("rl.keyed", json!([n])).queue(queue).rate_limit_throttle("api", 2, hour);
    s.enqueue_batch((0..3).map(|n| throttled(if n % 2 == 0 { "a" } else { "b" }, n)).collect()).await.unwrap();
    let mut urgent = throttled("a", 3);
    urgent.priority = 5;
    let late = s.enqueue(urgent).await.unwrap().job;
    assert!(!late.rate_limited, "it outranks the admitted job no worker has claimed and takes its place");
    let k = s.rate_limit_key("api").await.unwrap().unwrap();
    assert_eq!((k.throttle.map(|w| (w.limit, w.period)), k.admitted, k.waiting, k.rate), (Some((2, hour)), 1, 3, None), "{k:?}");
    let next = k.throttle_next_allowed_at.expect("the spacing is running");
    let now = jiff::Timestamp::now();
    assert!(next > now + jiff::SignedDuration::from_mins(29) && next <= now + jiff::SignedDuration::from_mins(30), "{next}");
    let exceeded = rate_limit_events(s, "rate_limit.exceeded").await;
    assert!(exceeded.iter().all(|e| e["strategy"] == "throttle"), "{exceeded:?}");
    assert_eq!(exceeded.iter().map(|e| e["parked"].as_i64().unwrap_or(0)).sum::<i64>(), 3, "{exceeded:?}");

    // Finishing the job frees nothing before the spacing ends; the scheduler knows when it does.
    let first = s.claim(&request("w", &["a", "b"], 10)).await.unwrap();
    assert_eq!(first.iter().map(|j| j.id).collect::<Vec<_>>(), vec![late.id]);
    s.complete(&done(&first[0])).await.unwrap();
    assert_eq!(slots(s, "api").await, (0, 0, 3));
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 0, "no room before the spacing ends");
    let wait = s.time_until_next_due().await.unwrap().expect("jobs wait for the spacing");
    assert!(wait > Duration::from_secs(29 * 60) && wait <= Duration::from_secs(30 * 60), "{wait:?}");

    // Each spacing admits one, in line order.
    end_window(s, "api").await;
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 1);
    assert_eq!(slots(s, "api").await, (0, 1, 2));
    assert_eq!(s.claim(&request("w", &["a", "b"], 10)).await.unwrap().iter().map(|j| j.args[0].as_i64()).collect::<Vec<_>>(), vec![Some(0)]);
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 0);
    // An admitted job no worker claimed before the spacing ended starts in the next one.
    end_window(s, "api").await;
    s.settle_rate_limits(100).await.unwrap();
    end_window(s, "api").await;
    s.settle_rate_limits(100).await.unwrap();
    assert_eq!(slots(s, "api").await, (1, 1, 1), "the admitted job fills the next spacing");

    // Beside a concurrency, both hold. Three slots, two taken: the admitted job no worker has
    // claimed fills the spacing, which holds the rest. It begins no window (it would end with
    // the job still unclaimed, and begin again): nothing to wake the scheduler for.
    s.enqueue(NewJob::new("rl.keyed", json!([9])).queue("a").rate_limit("api", Some(3))).await.unwrap();
    assert_eq!(slots(s, "api").await, (1, 1, 2), "a slot is free, the spacing is not");
    assert_eq!(s.time_until_next_due().await.unwrap(), None, "no window begun");
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 0, "and the sweep leaves the key alone");
    // Claimed, the next sweep admits the next; its spacing is waited for.
    assert_eq!(s.claim(&request("w", &["a", "b"], 10)).await.unwrap().len(), 1);
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 1);
    assert_eq!(slots(s, "api").await, (2, 1, 1));
    let wait = s.time_until_next_due().await.unwrap().expect("a spacing begun, jobs waiting");
    assert!(wait > Duration::from_secs(29 * 60) && wait <= Duration::from_secs(30 * 60), "{wait:?}");
    // The spacing over, the concurrency holds the last: its three slots are taken.
    assert_eq!(s.claim(&request("w", &["a", "b"], 10)).await.unwrap().len(), 1);
    end_window(s, "api").await;
    assert_eq!(s.settle_rate_limits(100).await.unwrap(), 0, "no slot");
    assert_eq!(slots(s, "api").await, (3, 0, 1), "the spacing is over, the slots are taken");
    assert_eq!(s.time_until_next_due().await.unwrap(), None, "nothing to wait for but a slot");

    // Rescheduled jobs come back one spacing apart, in line order.
    let resched = |n: i64| NewJob::new("rl.keyed", json!([n])).queue("r").rate_limit_throttle("spaced", 1, hour).on_limit(OnLimit::Reschedule);
    let jobs: Vec<Job> = s.enqueue_batch((0..3).map(resched).collect()).await.unwrap().into_iter().map(|e| e.job).collect();
    let states: Vec<JobState> = jobs.iter().map(|j| j.state).collect();
    assert_eq!(states, [JobState::Available, JobState::Scheduled, JobState::Scheduled]);
    let (b, c) = (s.job(jobs[1].id).await.unwrap(), s.job(jobs[2].id).await.unwrap());
    assert!(b.scheduled_at > jiff::Timestamp::now() + jiff::SignedDuration::from_mins(59), "the spacing's end: {}", b.scheduled_at);
    // One spacing and a little (a tenth, at most 50 ms) later.
    let slot = jiff::SignedDuration::from_hours(1) + jiff::SignedDuration::from_millis(50);
    assert_eq!(c.scheduled_at.duration_since(b.scheduled_at), slot, "one spacing later");
    // One rescheduled later goes after them, not on top of the first.
    let d = s.enqueue(resched(3)).await.unwrap().job;
    assert_eq!((d.state, d.scheduled_at.duration_since(c.scheduled_at)), (JobState::Scheduled, slot), "after the line");
    // The line gone (cancelled), the next goes to the spacing's end again, not after it.
    let cancelled = JobSelection::Ids(vec![b.id, c.id, d.id]);
    assert_eq!(s.cancel_jobs(&cancelled, &Actor::new("ops")).await.unwrap(), 3);
    let e = s.enqueue(resched(4)).await.unwrap().job;
    assert_eq!((e.state, e.scheduled_at), (JobState::Scheduled, b.scheduled_at), "the reservation is forgotten");
    // A rate of 0 holds its jobs for good: no window end to wake for.
    s.enqueue(NewJob::new("rl.keyed", json!([0])).queue("z").rate_limit_window("zero", 0, hour)).await.unwrap();
    sqlx::query("UPDATE rate_limit_keys SET rate_window_start = now() - interval '2 hours' WHERE key = 'zero'").execute(s.pool()).await.unwrap();
    assert_eq!(s.time_until_next_due().await.unwrap().map(|w| w > Duration::from_secs(59 * 60)), Some(true), "only the rescheduled jobs' times");
}

/// An enqueue its key's throttle reschedules, cut off at its COMMIT: before Postgres saw it,
/// nothing of it stands (no job, no slot taken in the line of rescheduled jobs); with the
/// answer lost after it committed, it was rescheduled once, and the enqueue sent again with
/// the same id is a duplicate that takes no second slot.
#[tokio::test]
async fn a_rescheduling_enqueue_cut_off_at_its_commit_takes_one_slot_at_most() {
    use rebound_queue::job::OnLimit;
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let s = &db.store;
    let hour = Duration::from_secs(3600);
    let paced = |n: i64| NewJob::new("rl.keyed", json!([n])).queue("q").rate_limit_throttle("paced", 1, hour).on_limit(OnLimit::Reschedule);
    s.enqueue(paced(0)).await.unwrap();
    let second = s.enqueue(paced(1)).await.unwrap().job;
    assert_eq!(second.state, JobState::Scheduled);
    let reserved = || async {
        sqlx::query_scalar::<_, Option<String>>("SELECT throttle_reserved_until::text FROM rate_limit_keys WHERE key = 'paced'")
            .fetch_one(s.pool())
            .await
            .unwrap()
    };
    let before = reserved().await;
    let mut job = paced(2);
    job.id = Some(Uuid::now_v7());
    let id = job.id;

    let cut = proxy.inject(Fault::once("COMMIT", FaultPoint::BeforeSend));
    assert!(through.enqueue(job.clone()).await.is_err());
    assert_eq!(cut.count(), 1);
    assert!(matches!(s.job(id.unwrap()).await, Err(StoreError::NotFound(_))), "rolled back whole");
    assert_eq!(reserved().await, before, "no slot taken");

    let lost = proxy.inject(Fault::once("COMMIT", FaultPoint::AfterCommit));
    assert!(through.enqueue(job.clone()).await.is_err(), "the answer was lost");
    assert_eq!(lost.count(), 1);
    proxy.clear();
    let after_one = reserved().await;
    assert_ne!(after_one, before, "one slot taken");
    match through.enqueue(job).await {
        Err(StoreError::Duplicate { existing, .. }) => assert_eq!(existing, id),
        other => panic!("the second send is a duplicate: {other:?}"),
    }
    assert_eq!(reserved().await, after_one, "and no second");
    let third = s.job(id.unwrap()).await.unwrap();
    assert_eq!(third.state, JobState::Scheduled);
    assert!(third.scheduled_at > second.scheduled_at, "after the one rescheduled before it");
}

/// A job rescheduled by its key's throttle that comes back a little before the spacing of the
/// one ahead of it ended (its promotion ran early, the other's admission late) waits the few
/// ms left instead of going to the end of the line.
#[tokio::test]
async fn a_rescheduled_job_back_a_little_early_waits_for_its_turn() {
    use rebound_queue::job::OnLimit;
    let db = TestDb::new().await;
    let s = &db.store;
    let paced = |n: i64| NewJob::new("rl.keyed", json!([n])).queue("q").rate_limit_throttle("early", 1, Duration::from_secs(3600)).on_limit(OnLimit::Reschedule);
    s.enqueue(paced(0)).await.unwrap();
    let back = s.enqueue(paced(1)).await.unwrap().job;
    let later = s.enqueue(paced(2)).await.unwrap().job;
    assert_eq!((back.state, later.state), (JobState::Scheduled, JobState::Scheduled));
    assert_eq!(s.claim(&request("w", &["q"], 10)).await.unwrap().len(), 1);
    // The spacing ends in 30 ms; the first rescheduled job is due now.
    sqlx::query("UPDATE rate_limit_keys SET throttle_window_start = clock_timestamp() - interval '1 hour' + interval '30 milliseconds' WHERE key = 'early'")
        .execute(s.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET scheduled_at = now() WHERE id = $1").bind(back.id).execute(s.pool()).await.unwrap();
    s.promote_due(10).await.unwrap();
    // (Waiting, or admitted already if the machine took the 30 ms over it: either way, not
    // sent to the end of the line.)
    let waiting = s.job(back.id).await.unwrap();
    assert_eq!(waiting.state, JobState::Available, "it waits for its turn");
    assert_eq!(s.job(later.id).await.unwrap().scheduled_at, later.scheduled_at, "the line behind it is unchanged");
    // Its turn come, the sweep admits it.
    tokio::time::sleep(Duration::from_millis(40)).await;
    s.settle_rate_limits(10).await.unwrap();
    assert!(!s.job(back.id).await.unwrap().rate_limited);
}

#[tokio::test]
async fn the_scheduler_wakes_when_a_hold_or_an_override_ends_and_sleeps_through_maintenance() {
    let db = TestDb::new().await;
    let s = &db.store;
    let ops = Actor::new("ops");
    let in_mins = |m: i64| jiff::Timestamp::now() + jiff::SignedDuration::from_mins(m);
    let around = |wait: Option<Duration>, mins: u64| {
        let wait = wait.expect("a time to wake at");
        assert!(wait > Duration::from_secs(mins * 60 - 60) && wait <= Duration::from_secs(mins * 60), "{wait:?}");
    };

    // An override of 0 until a time: its jobs wait for its end, and so does the scheduler.
    s.override_rate_limit("stopped", Some(&RateLimitOverride { concurrency: 0, expires_at: Some(in_mins(20)) }), &ops).await.unwrap();
    s.enqueue(keyed("q", "stopped", Some(2), 1)).await.unwrap();
    assert_eq!(slots(s, "stopped").await, (0, 0, 1));
    around(s.time_until_next_due().await.unwrap(), 20);

    // A hold ending sooner comes first.
    s.enqueue(keyed("q", "held", Some(2), 2)).await.unwrap();
    sqlx::query("UPDATE rate_limit_keys SET held_until = now() + interval '5 minutes' WHERE key = 'held'").execute(s.pool()).await.unwrap();
    s.enqueue(keyed("q", "held", Some(2), 3)).await.unwrap();
    let held = s.rate_limit_key("held").await.unwrap().unwrap();
    assert!(held.waiting >= 1, "{held:?}");
    around(s.time_until_next_due().await.unwrap(), 5);

    // Ended: nothing left to wait for once the sweep has admitted the jobs.
    sqlx::query("UPDATE rate_limit_keys SET held_until = now() - interval '1 second', override_expires_at = now() - interval '1 second'")
        .execute(s.pool())
        .await
        .unwrap();
    assert_eq!(s.time_until_next_due().await.unwrap(), None, "an ended hold or override is no time to wake at");
    s.settle_rate_limits(100).await.unwrap();
    assert_eq!((slots(s, "stopped").await, slots(s, "held").await), ((0, 1, 0), (0, 2, 0)));

    // Maintenance mode holds every promotion: an overdue job wakes nobody until it is off.
    let mut due = NewJob::new("rl.keyed", json!([4]));
    due.scheduled_at = Some(in_mins(60));
    let due = s.enqueue(due).await.unwrap().job;
    sqlx::query("UPDATE jobs SET scheduled_at = now() - interval '1 minute' WHERE id = $1").bind(due.id).execute(s.pool()).await.unwrap();
    assert_eq!(s.time_until_next_due().await.unwrap(), Some(Duration::ZERO));
    s.enable_maintenance(Some("upgrade"), None, &ops).await.unwrap();
    assert_eq!(s.time_until_next_due().await.unwrap(), None, "nothing is promoted in maintenance mode");
    assert_eq!(s.promote_due(100).await.unwrap(), 0);
    s.disable_maintenance(&ops).await.unwrap();
    assert_eq!(s.time_until_next_due().await.unwrap(), Some(Duration::ZERO));
}

#[tokio::test]
async fn a_spacing_s_end_is_a_limit_wait_beside_jobs_falling_due() {
    let db = TestDb::new().await;
    let s = &db.store;
    let hour = Duration::from_secs(3600);
    for n in 0..3 {
        s.enqueue(NewJob::new("rl.keyed", json!([n])).queue("q").rate_limit_throttle("fast", 1, hour)).await.unwrap();
    }
    assert_eq!(slots(s, "fast").await, (0, 1, 2));
    // The spacing (here an hour, brought forward) ends in two minutes: that is the limits'
    // wait, apart from jobs falling due (see `NextWaits::wait` for the floors of each).
    sqlx::query("UPDATE rate_limit_keys SET throttle_window_start = now() - interval '58 minutes' WHERE key = 'fast'")
        .execute(s.pool())
        .await
        .unwrap();
    let waits = s.next_waits().await.unwrap();
    assert_eq!(waits.job_due, None);
    assert!(waits.limit_ends.is_some_and(|w| w > Duration::from_secs(110) && w <= Duration::from_secs(120)), "{waits:?}");
    // A job falling due keeps its own floor beside it.
    let mut due = NewJob::new("rl.other", json!([]));
    due.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600));
    let due = s.enqueue(due).await.unwrap().job;
    sqlx::query("UPDATE jobs SET scheduled_at = now() - interval '1 second' WHERE id = $1").bind(due.id).execute(s.pool()).await.unwrap();
    sqlx::query("UPDATE rate_limit_keys SET throttle_window_start = now() WHERE key = 'fast'").execute(s.pool()).await.unwrap();
    assert_eq!(s.scheduler_wait(Duration::from_secs(1)).await, rebound_queue::store::SCHEDULER_MIN_WAIT);
}
