//! A statement stuck behind a lock somebody else holds gives up at the server's lock timeout:
//! its request is answered 503, its pooled connection is free again, and it changed nothing.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rebound_queue::testing::TestDb;
use rebound_queue::{JobState, NewJob, Store};
use rebound_server::config::{ApiAuth, ServerConfig};
use rebound_server::{AppState, router};
use serde_json::{Value, json};
use sqlx::Connection;
use tower::ServiceExt;

async fn answer(app: &axum::Router, method: &str, path: &str) -> (StatusCode, Value) {
    let req = Request::builder().method(method).uri(path).body(Body::empty()).expect("request");
    let res = app.clone().oneshot(req).await.expect("the router is infallible");
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await.expect("body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn requests_held_up_by_a_lock_give_up_at_the_lock_timeout_and_free_their_connections() {
    let db = TestDb::new().await;
    // Two pooled connections, and four requests held up at once: without the lock timeout the
    // first two would keep both until the lock went, and everything else would wait for them.
    // The request timeout is the server's default: the 503 comes before it.
    let store = Store::connect_lazy_bounded(&db.url, 2, Duration::from_secs(1)).expect("store");
    store.now().await.expect("warm the pool");
    let app = router(AppState::new(store, ServerConfig { api_auth: ApiAuth::None, ..ServerConfig::default() }));
    let job = db.store.enqueue(NewJob::new("t.locked", json!([1]))).await.expect("enqueue").job;

    // Somebody's open transaction (an operator's psql session, say) holds the job's row.
    let mut holder = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut holder).await.expect("begin");
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE").bind(job.id).execute(&mut holder).await.expect("lock the row");

    let started = Instant::now();
    let path = format!("/ojs/v1/jobs/{}", job.id);
    let cancels: Vec<_> = (0..4)
        .map(|_| {
            let (app, path) = (app.clone(), path.clone());
            tokio::spawn(async move { answer(&app, "DELETE", &path).await })
        })
        .collect();
    for cancel in cancels {
        let (status, body) = tokio::time::timeout(Duration::from_secs(20), cancel).await.expect("answered while the lock is still held").expect("task");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let message = body.pointer("/error/message").and_then(Value::as_str).unwrap_or_default();
        assert!(message.contains("waiting for a lock"), "{body}");
        assert_eq!(body.pointer("/error/retryable"), Some(&json!(true)), "{body}");
    }
    // Two rounds of one second on two connections, and a margin for a slow build.
    assert!(started.elapsed() < Duration::from_secs(9), "took {:?}", started.elapsed());

    // The pool is free again while the lock is still held: a read is answered at once.
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), answer(&app, "GET", &path)).await.expect("a read answered");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body.pointer("/job/state"), Some(&json!("available")), "the cancels that gave up changed nothing");

    sqlx::query("ROLLBACK").execute(&mut holder).await.expect("release the row");
    let (status, body) = answer(&app, "DELETE", &path).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(db.store.job(job.id).await.expect("job").state, JobState::Cancelled);
}
