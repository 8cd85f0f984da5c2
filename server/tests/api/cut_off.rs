//! Requests whose answer nobody waits for any more (the request timeout answered first, or
//! the client hung up) still finish what they started: a handler is never dropped halfway
//! through a transaction.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rebound_queue::store::ClaimRequest;
use rebound_queue::testing::{Fault, FaultHits, FaultPoint, FaultProxy, TestDb};
use rebound_queue::{JobState, NewJob, Store};
use rebound_server::config::{ApiAuth, ServerConfig};
use rebound_server::{AppState, router};
use serde_json::json;
use tower::ServiceExt;

/// The router over a store whose statements pass through `proxy`, its connection made.
async fn app_through(db: &TestDb, proxy: &FaultProxy, request_timeout: Duration) -> axum::Router {
    app_through_pool(db, proxy, request_timeout, 1).await
}

/// [`app_through`] with `connections` pooled connections (a failure reads on two at once).
async fn app_through_pool(db: &TestDb, proxy: &FaultProxy, request_timeout: Duration, connections: u32) -> axum::Router {
    let store = Store::connect(&proxy.url(&db.name), connections).await.expect("connect through the proxy");
    // A pooled connection, opened now: the request under test then spends no time connecting.
    store.now().await.expect("warm the pool");
    router(AppState::new(store, ServerConfig { api_auth: ApiAuth::None, request_timeout, ..ServerConfig::default() }))
}

/// Sends `req` and gives up once its held statement reached the database: the request future
/// is dropped, as hyper drops it when the client's connection closes.
async fn hang_up_once_held(app: axum::Router, req: Request<Body>, held: &FaultHits) {
    let mut call = Box::pin(app.oneshot(req));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while held.count() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the statement never reached the database");
        tokio::select! {
            r = &mut call => panic!("answered while the statement was held: {:?}", r.map(|r| r.status())),
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
}

async fn state_of(db: &TestDb, id: uuid::Uuid) -> JobState {
    db.store.job(id).await.expect("job").state
}

/// A body still arriving at the request timeout is refused on its own account, a little
/// before the timeout: the 408 names the body and says nothing was done.
#[tokio::test]
async fn a_body_slower_than_the_request_timeout_is_refused_with_nothing_done() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let app = app_through(&db, &proxy, Duration::from_secs(3)).await;
    let first: Result<axum::body::Bytes, std::io::Error> = Ok(axum::body::Bytes::from_static(br#"{"type": "t.slow", "args": ["#));
    let dribble = futures::StreamExt::chain(futures::stream::iter([first]), futures::stream::pending());
    let req = Request::builder()
        .method("POST")
        .uri("/ojs/v1/jobs")
        .header("content-type", "application/openjobspec+json")
        .body(Body::from_stream(dribble))
        .expect("request");
    let started = tokio::time::Instant::now();
    let res = tokio::time::timeout(Duration::from_secs(20), app.oneshot(req)).await.expect("answered").expect("infallible");
    assert!(started.elapsed() < Duration::from_secs(10), "answered by the request timeout, not the 30 s default");
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    let body: serde_json::Value = serde_json::from_slice(&axum::body::to_bytes(res.into_body(), usize::MAX).await.expect("body")).expect("json");
    assert_eq!(body["error"]["details"]["field"], "body", "the body's own refusal: {body}");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(db.store.pool()).await.expect("count");
    assert_eq!(jobs, 0, "nothing was enqueued");
}

#[tokio::test]
async fn a_request_past_its_timeout_is_answered_408_and_its_transaction_still_finishes() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let app = app_through(&db, &proxy, Duration::from_millis(300)).await;
    let id = db.store.enqueue(NewJob::new("t.cut", json!([]))).await.expect("enqueue").job.id;
    // The cancel's write inside its transaction answers late, long after the request timeout.
    let held = proxy.inject(Fault::once("SET state = 'cancelled', cancelled_at = now()", FaultPoint::Delay(Duration::from_secs(3))));
    let req = Request::builder().method("DELETE").uri(format!("/ojs/v1/jobs/{id}")).body(Body::empty()).expect("request");
    let res = app.oneshot(req).await.expect("infallible");
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    let body: serde_json::Value = serde_json::from_slice(&axum::body::to_bytes(res.into_body(), usize::MAX).await.expect("body")).expect("json");
    assert_eq!(body["error"]["retryable"], false, "sent again, it could be done twice: {body}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while held.count() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the write never reached the database");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(state_of(&db, id).await, JobState::Available, "not done yet when the 408 went out");
    // Dropped at the timeout, the transaction would have been rolled back: the job would stay
    // available. Run to its end, it commits.
    while state_of(&db, id).await != JobState::Cancelled {
        assert!(tokio::time::Instant::now() < deadline, "the cancel never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'job.cancel' AND target = $1")
        .bind(id.to_string())
        .fetch_one(db.store.pool())
        .await
        .expect("audit");
    assert_eq!(audited, 1, "the whole transaction landed, its audit entry with it");
}

#[tokio::test]
async fn a_client_hanging_up_does_not_cut_its_request_off() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let app = app_through(&db, &proxy, Duration::from_secs(30)).await;
    let id = db.store.enqueue(NewJob::new("t.cut", json!([]))).await.expect("enqueue").job.id;
    let held = proxy.inject(Fault::once("SET state = 'cancelled', cancelled_at = now()", FaultPoint::Delay(Duration::from_millis(500))));
    let req = Request::builder().method("DELETE").uri(format!("/ojs/v1/jobs/{id}")).body(Body::empty()).expect("request");
    // The client gives up while the write is held: its request future is dropped, as hyper
    // drops it when the connection closes.
    hang_up_once_held(app, req, &held).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while state_of(&db, id).await != JobState::Cancelled {
        assert!(tokio::time::Instant::now() < deadline, "the cancel was cut off with its client");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_fetch_whose_caller_left_hands_its_jobs_back_uncounted() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let app = app_through(&db, &proxy, Duration::from_secs(30)).await;
    let id = db.store.enqueue(NewJob::new("t.cut", json!([]))).await.expect("enqueue").job.id;
    // The claim commits, but its answer is held while the client gives up.
    let held = proxy.inject(Fault::once("SET state = 'active', attempt = j.attempt + 1", FaultPoint::Delay(Duration::from_millis(800))));
    let body = json!({"queues": ["default"], "worker_id": "w-gone"}).to_string();
    let req = Request::builder()
        .method("POST")
        .uri("/ojs/v1/workers/fetch")
        .header("content-type", "application/openjobspec+json")
        .body(Body::from(body))
        .expect("request");
    hang_up_once_held(app, req, &held).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Nobody received the job: it goes back at once, its attempt not counted, rather than
    // sitting active until its lock lapses and the rescuer charges it.
    loop {
        let rows = db.store.attempts(id).await.expect("attempts");
        if !rows.is_empty() {
            assert_eq!(rows.iter().map(|a| a.outcome.as_str()).collect::<Vec<_>>(), ["released"], "{rows:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the job was never handed back: {:?}", db.store.job(id).await.expect("job").state);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let job = db.store.job(id).await.expect("job");
    assert_eq!((job.state, job.attempt), (JobState::Available, 0), "back, not counted");
}

#[tokio::test]
async fn a_hand_back_sent_again_after_its_answer_was_lost_leaves_the_next_claim_alone() {
    // Both a named worker and the fetches that name none, which share one worker id.
    for worker in [Some("w-gone"), None] {
        let db = TestDb::new().await;
        let proxy = FaultProxy::in_front_of(&db.url).await;
        let app = app_through(&db, &proxy, Duration::from_secs(30)).await;
        let id = db.store.enqueue(NewJob::new("t.cut", json!([]))).await.expect("enqueue").job.id;
        const HAND_BACK: &str = "released AS (";
        // The claim's answer is held while the caller gives up; the hand-back commits with its
        // answer lost, and its second sending is held back long enough for a new claim.
        let held = proxy.inject(Fault::once("SET state = 'active', attempt = j.attempt + 1", FaultPoint::Delay(Duration::from_millis(800))));
        let lost = proxy.inject(Fault::once(HAND_BACK, FaultPoint::AfterCommit));
        let resent = proxy.inject(Fault::once(HAND_BACK, FaultPoint::HoldRequest(Duration::from_millis(1500))));
        let mut body = json!({"queues": ["default"]});
        if let Some(w) = worker {
            body["worker_id"] = json!(w);
        }
        let req = Request::builder()
            .method("POST")
            .uri("/ojs/v1/workers/fetch")
            .header("content-type", "application/openjobspec+json")
            .body(Body::from(body.to_string()))
            .expect("request");
        hang_up_once_held(app, req, &held).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while resent.count() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "the hand-back was not sent again (first sending struck: {})", lost.count());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(state_of(&db, id).await, JobState::Available, "the first hand-back committed");
        // The same worker id fetches again while the second sending waits.
        let again = ClaimRequest { worker_id: worker.unwrap_or("anonymous").into(), queues: vec!["default".into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        let claimed = db.store.claim_in_one(&again).await.expect("claim again");
        assert_eq!(claimed.len(), 1);
        let reclaimed_at: String = sqlx::query_scalar("SELECT clock_timestamp()::text").fetch_one(db.store.pool()).await.expect("now");
        // The second sending reaches the database after the hold: wait until the session it
        // went to has finished it since the new claim (its parse and bind arrived before the
        // hold, so the session shows it active until then).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let finished: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND query LIKE 'WITH released AS (%' AND state = 'idle' AND state_change > $1::timestamptz",
            )
            .bind(&reclaimed_at)
            .fetch_one(db.store.pool())
            .await
            .expect("activity");
            if finished > 0 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the hand-back was never sent again after the new claim");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let job = db.store.job(id).await.expect("job");
        assert_eq!((job.state, job.attempt, job.started_at), (JobState::Active, 1, claimed[0].started_at), "the new claim was handed back ({worker:?})");
        let rows = db.store.attempts(id).await.expect("attempts");
        assert_eq!(rows.iter().map(|a| a.outcome.as_str()).collect::<Vec<_>>(), ["released"], "one hand-back recorded: {rows:?}");
    }
}

/// An OJS client's ack, nack or requeue whose connection to the database is cut, before the
/// write reaches it or after it committed: answered 503 (the server cannot tell which), landed
/// at most once, and sent again it either lands (it never ran) or is refused (it did).
#[tokio::test]
async fn an_ack_or_nack_cut_off_is_answered_503_and_lands_at_most_once() {
    const COMPLETE: &str = "SET state = 'completed', completed_at = now()";
    const FAIL: &str = "attempt = j.attempt + i.attempt_delta";
    const REQUEUE: &str = "released AS (";
    let cases = [
        ("ack", COMPLETE, FaultPoint::BeforeSend),
        ("ack", COMPLETE, FaultPoint::AfterCommit),
        ("nack", FAIL, FaultPoint::BeforeSend),
        ("nack", FAIL, FaultPoint::AfterCommit),
        ("requeue", REQUEUE, FaultPoint::BeforeSend),
        ("requeue", REQUEUE, FaultPoint::AfterCommit),
    ];
    for (write, fragment, point) in cases {
        let db = TestDb::new().await;
        let proxy = FaultProxy::in_front_of(&db.url).await;
        let app = app_through_pool(&db, &proxy, Duration::from_secs(30), 2).await;
        let id = db.store.enqueue(NewJob::new("t.acked", json!([])).queue("acks")).await.expect("enqueue").job.id;
        let (status, fetched) = send(app.clone(), "POST", "/ojs/v1/workers/fetch", Some(json!({"queues": ["acks"], "worker_id": "w-ack"}))).await;
        assert_eq!(status, StatusCode::OK, "{fetched}");
        let job = &fetched["jobs"][0];
        let mut body = json!({"job_id": id.to_string(), "worker_id": "w-ack", "attempt": job["attempt"], "started_at": job["started_at"]});
        let path = match write {
            "ack" => "/ojs/v1/workers/ack",
            "nack" => {
                body["error"] = json!({"code": "t.flaky", "message": "failed"});
                "/ojs/v1/workers/nack"
            }
            _ => {
                body["requeue"] = json!(true);
                "/ojs/v1/workers/nack"
            }
        };
        let hit = proxy.inject(Fault::once(fragment, point));
        let (status, answer) = send(app.clone(), "POST", path, Some(body.clone())).await;
        assert_eq!(hit.count(), 1, "{write} {point:?}: the fault struck");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{write} {point:?}: {answer}");
        assert_eq!(answer["error"]["retryable"], false, "{write} {point:?}: it may have landed: {answer}");
        let landed = point == FaultPoint::AfterCommit;
        let (state, rows) = (state_of(&db, id).await, db.store.attempts(id).await.expect("attempts"));
        if landed {
            let expected = match write {
                "ack" => JobState::Completed,
                "nack" => JobState::Retryable,
                _ => JobState::Available,
            };
            assert_eq!(state, expected, "{write} {point:?}");
        } else {
            assert_eq!((state, rows.len()), (JobState::Active, 0), "{write} {point:?}: nothing of it ran");
        }
        // The client sends it again.
        let (status, again) = send(app.clone(), "POST", path, Some(body)).await;
        let expected_status = if landed { StatusCode::CONFLICT } else { StatusCode::OK };
        assert_eq!(status, expected_status, "{write} {point:?}, sent again: {again}");
        let job = db.store.job(id).await.expect("job");
        let rows = db.store.attempts(id).await.expect("attempts");
        match write {
            // The history shows the completed run once.
            "ack" => assert_eq!((job.state, job.attempt, rows.len()), (JobState::Completed, 1, 1), "{write} {point:?}"),
            "nack" => assert_eq!((job.state, job.attempt, rows.len()), (JobState::Retryable, 1, 1), "{write} {point:?}: charged once, one failure recorded"),
            _ => {
                assert_eq!((job.state, job.attempt), (JobState::Available, 0), "{write} {point:?}: not counted");
                assert_eq!(rows.iter().map(|a| a.outcome.as_str()).collect::<Vec<_>>(), ["released"], "{write} {point:?}");
            }
        }
    }
}

/// Sends `body` as JSON with `method` to `uri` and reads the answer.
async fn send(app: axum::Router, method: &str, uri: &str, body: Option<serde_json::Value>) -> (StatusCode, serde_json::Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/openjobspec+json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .expect("request");
    let res = app.oneshot(req).await.expect("infallible");
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await.expect("body");
    (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn a_fetch_whose_commit_goes_unanswered_hands_what_it_claimed_back_uncounted() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let app = app_through(&db, &proxy, Duration::from_secs(30)).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(db.store.enqueue(NewJob::new("t.lost", json!([])).queue("lost")).await.expect("enqueue").job.id);
    }
    // The fetch's transaction commits, and the connection drops before its answer comes back:
    // the server cannot tell whether it claimed anything.
    let hit = proxy.inject(Fault::once("COMMIT", FaultPoint::AfterCommit));
    let (status, body) = send(app.clone(), "POST", "/ojs/v1/workers/fetch", Some(json!({"queues": ["lost"], "count": 2, "worker_id": "w-unanswered"}))).await;
    assert_eq!(hit.count(), 1, "the fault struck the fetch's commit");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["retryable"], true, "nothing it claimed stands, so it can be sent again: {body}");
    // The claim committed (both jobs went active under the worker's name); the server looks
    // its transaction up and hands them back, uncounted, rather than leave them to be
    // charged when their locks lapse.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    for id in &ids {
        loop {
            let rows = db.store.attempts(*id).await.expect("attempts");
            if !rows.is_empty() {
                assert_eq!(rows.iter().map(|a| a.outcome.as_str()).collect::<Vec<_>>(), ["released"], "{rows:?}");
                assert_eq!(rows[0].error_message.as_deref(), Some(rebound_queue::store::UNANSWERED_CLAIM_REASON), "{rows:?}");
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "never handed back: {:?}", db.store.job(*id).await.expect("job").state);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let job = db.store.job(*id).await.expect("job");
        assert_eq!((job.state, job.attempt), (JobState::Available, 0), "back, not counted");
    }
    // Sent again, the fetch gets them, at their first attempt.
    let (status, body) = send(app, "POST", "/ojs/v1/workers/fetch", Some(json!({"queues": ["lost"], "count": 2, "worker_id": "w-unanswered"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let got: Vec<(String, i64)> = body["jobs"].as_array().expect("jobs").iter().map(|j| (j["id"].as_str().unwrap_or("").to_owned(), j["attempt"].as_i64().unwrap_or(-1))).collect();
    assert_eq!(got.len(), 2, "{body}");
    assert!(got.iter().all(|(_, attempt)| *attempt == 1), "{got:?}");
}

#[tokio::test]
async fn a_write_whose_answer_is_lost_is_not_retryable_and_a_read_is() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let app = app_through(&db, &proxy, Duration::from_secs(30)).await;
    // The enqueue's insert commits; its answer is lost with the connection.
    let hit = proxy.inject(Fault::once("INSERT INTO jobs", FaultPoint::AfterCommit));
    let (status, body) = send(app.clone(), "POST", "/ojs/v1/jobs", Some(json!({"type": "t.once", "args": [1], "queue": "once"}))).await;
    assert_eq!(hit.count(), 1);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["retryable"], false, "sent again, the job would be enqueued twice: {body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("may or may not have taken effect")), "{body}");
    let landed: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE type = 't.once'").fetch_one(db.store.pool()).await.expect("count");
    assert_eq!(landed, 1, "the enqueue did land: exactly why a blind resend is refused");
    // A read that loses its answer the same way can simply be asked again.
    let id = db.store.enqueue(NewJob::new("t.read", json!([]))).await.expect("enqueue").job.id;
    let hit = proxy.inject(Fault::once("FROM jobs", FaultPoint::AfterCommit));
    let (status, body) = send(app.clone(), "GET", &format!("/ojs/v1/jobs/{id}"), None).await;
    assert_eq!(hit.count(), 1);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
    let (status, _) = send(app, "GET", &format!("/ojs/v1/jobs/{id}"), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_fetch_over_several_queues_cut_off_before_its_commit_claims_nothing() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let app = app_through(&db, &proxy, Duration::from_secs(30)).await;
    let mut ids = Vec::new();
    for queue in ["multi-a", "multi-b"] {
        ids.push(db.store.enqueue(NewJob::new("t.multi", json!([])).queue(queue)).await.expect("enqueue").job.id);
    }
    // Both queues' claims run; the connection drops as the commit is sent.
    let hit = proxy.inject(Fault::once("COMMIT", FaultPoint::BeforeSend));
    let (status, body) = send(app.clone(), "POST", "/ojs/v1/workers/fetch", Some(json!({"queues": ["multi-a", "multi-b"], "count": 2, "worker_id": "w-multi"}))).await;
    assert_eq!(hit.count(), 1);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["retryable"], true, "all or nothing, so it can be sent again: {body}");
    // What the claims did went with their transaction: no job is left active under a name
    // that never heard of it, none is counted, none has history.
    for id in ids {
        let job = db.store.job(id).await.expect("job");
        assert_eq!((job.state, job.attempt), (JobState::Available, 0));
        assert!(db.store.attempts(id).await.expect("attempts").is_empty());
    }
    let (status, body) = send(app, "POST", "/ojs/v1/workers/fetch", Some(json!({"queues": ["multi-a", "multi-b"], "count": 2, "worker_id": "w-multi"}))).await;
    assert_eq!((status, body["jobs"].as_array().map(Vec::len)), (StatusCode::OK, Some(2)), "{body}");
}

/// A server stopping right after such a fetch waits for its hand-back (here held up by a slow
/// database), rather than exit under it and leave the jobs to be charged when their locks
/// lapse.
#[tokio::test]
async fn a_stopping_server_lets_the_hand_back_of_an_unanswered_fetch_finish() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let store = Store::connect(&proxy.url(&db.name), 2).await.expect("connect through the proxy");
    store.now().await.expect("warm the pool");
    let app = router(AppState::new(store.clone(), ServerConfig { api_auth: ApiAuth::None, ..ServerConfig::default() }));
    let id = db.store.enqueue(NewJob::new("t.lost", json!([])).queue("lost")).await.expect("enqueue").job.id;
    let lost = proxy.inject(Fault::once("COMMIT", FaultPoint::AfterCommit));
    let slow = proxy.inject(Fault::once("pg_xact_status", FaultPoint::Delay(Duration::from_millis(1500))));
    let (status, body) = send(app, "POST", "/ojs/v1/workers/fetch", Some(json!({"queues": ["lost"], "worker_id": "w-stopping"}))).await;
    assert_eq!((status, lost.count()), (StatusCode::SERVICE_UNAVAILABLE, 1), "{body}");
    // What `serve` does on its way out, after its requests.
    assert!(store.settle_background(Duration::from_secs(20)).await, "the hand-back finished within the grace");
    assert_eq!(slow.count(), 1, "it was held up");
    let job = db.store.job(id).await.expect("job");
    assert_eq!((job.state, job.attempt), (JobState::Available, 0), "handed back before the exit, uncounted");
    // Nothing in the background: settled at once.
    assert!(store.settle_background(Duration::ZERO).await);
}
