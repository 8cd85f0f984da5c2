//! Event streams are bounded: how many are open at once on the server (`max_event_streams`),
//! and how long each stays open (`event_stream_lifetime`) before the client resumes it.

use std::time::Duration;

use axum::http::StatusCode;
use futures::StreamExt;
use rebound_server::config::{ApiAuth, ServerConfig};
use serde_json::json;

use crate::common::{Reply, TestServer};

/// A request that must be refused: a stream it opened by mistake would never end.
async fn refused(s: &TestServer, path: &str) -> Reply {
    tokio::time::timeout(Duration::from_secs(10), s.get(path)).await.unwrap_or_else(|_| panic!("{path}: a stream opened past the limit"))
}

#[tokio::test]
async fn streams_past_the_limit_are_refused_until_one_closes() {
    let s = TestServer::with_config(ServerConfig { api_auth: ApiAuth::None, max_event_streams: 2, ..ServerConfig::default() }).await;
    let job = s.enqueue(json!({"type": "ev.wait", "args": [], "options": {"queue": "lim"}})).await;
    let job_path = format!("/ojs/v1/jobs/{}/events", job["id"].as_str().expect("id"));
    let first = s.open("/ojs/v1/queues/lim/events", &[]).await;
    let second = s.open(&job_path, &[]).await;
    assert_eq!((first.status(), second.status()), (StatusCode::OK, StatusCode::OK));

    // Every stream route shares the one limit.
    for path in ["/ojs/v1/queues/lim/events", job_path.as_str(), "/ojs/v1/events/stream?channel=queue:lim"] {
        let r = refused(&s, path).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{path}: {}", r.text);
        r.assert_ojs_error(path);
        assert_eq!((r.body["error"]["code"].as_str(), r.body["error"]["retryable"].as_bool()), (Some("rate_limited"), Some(true)), "{}", r.text);
        assert!(r.body["error"]["message"].as_str().is_some_and(|m| m.contains("limit")), "{}", r.text);
        assert_eq!(r.body["error"]["details"]["limit"], 2);
        assert_eq!(r.header("retry-after"), Some("5"));
    }

    // A client hanging up (its body dropped) frees its place; refusals took none.
    drop(first);
    let third = s.open("/ojs/v1/events/stream?channel=queue:lim", &[]).await;
    assert_eq!(third.status(), StatusCode::OK);
    let r = refused(&s, "/ojs/v1/queues/lim/events").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    drop((second, third));
    for _ in 0..2 {
        let res = s.open("/ojs/v1/queues/lim/events", &[]).await;
        assert_eq!(res.status(), StatusCode::OK, "places are given back, not leaked");
    }
    // A request refused for another reason gives its place back too.
    let r = s.get("/ojs/v1/jobs/019539a4-bbbb-7000-8000-000000000001/events").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    let (a, b) = (s.open("/ojs/v1/queues/lim/events", &[]).await, s.open(&job_path, &[]).await);
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
}

#[tokio::test]
async fn a_stream_ends_at_its_lifetime_and_gives_back_its_place() {
    let s = TestServer::with_config(ServerConfig {
        api_auth: ApiAuth::None,
        max_event_streams: 1,
        event_stream_lifetime: Duration::from_millis(300),
        ..ServerConfig::default()
    })
    .await;
    let res = s.open("/ojs/v1/queues/life/events", &[]).await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body().into_data_stream();
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.expect("a chunk")));
        }
    })
    .await
    .expect("the stream ends at its lifetime");
    // EventSource clients are told to come back soon.
    assert!(text.starts_with("retry: 1000\n"), "{text:?}");
    // Whatever id it ended on (where it had read up to) is a place to resume from.
    for id in text.lines().filter_map(|l| l.strip_prefix("id: ")) {
        let res = s.open("/ojs/v1/queues/life/events", &[("last-event-id", id)]).await;
        assert_eq!(res.status(), StatusCode::OK, "resume from {id}");
    }
    // Its place was given back when it ended, before the body was dropped.
    let again = s.open("/ojs/v1/queues/life/events", &[]).await;
    assert_eq!(again.status(), StatusCode::OK);
    drop(body);
}
