//! Job endpoints beyond what the level 0/1 suites check: batch, unique keys, delayed and
//! relative times, TTL, priorities, queues, events, request ids, test mode.

use std::time::Duration;

use axum::http::StatusCode;
use jiff::{SignedDuration, Timestamp};
use rebound_server::config::{ApiAuth, ServerConfig};
use rebound_server::maintenance::run_pass;
use serde_json::{Value, json};

use crate::common::{Reply, TestServer};

fn ts(v: &Value) -> Timestamp {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not a timestamp: {v}"))
}

#[tokio::test]
async fn batch_enqueue_is_all_or_nothing_and_ordered() {
    let s = TestServer::new().await;
    let jobs: Vec<Value> = (0..5).map(|i| json!({"type": "batch.item", "args": [i], "options": {"queue": "bq"}})).collect();
    let r = s.post("/ojs/v1/jobs/batch", json!({"jobs": jobs})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["count"], 5);
    for i in 0..5 {
        assert_eq!(s.fetch("bq").await["args"], json!([i]), "batch jobs run in the order given");
    }
    // A duplicate id inside the batch rejects the whole batch.
    let id = "019539a4-bbbb-7000-8000-000000000001";
    let r = s
        .post("/ojs/v1/jobs/batch", json!({"jobs": [{"type": "a", "args": [], "id": id}, {"type": "b", "args": []}, {"type": "c", "args": [], "id": id}]}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.body["error"]["code"], "duplicate");
    assert_eq!(s.job_count().await, 5);
}

#[tokio::test]
async fn unique_keys_reject_ignore_replace() {
    let s = TestServer::new().await;
    let job = |on_conflict: &str| json!({"type": "uniq.job", "args": [1], "options": {"unique": {"keys": ["type", "args"], "on_conflict": on_conflict}}});
    let first = s.enqueue(job("reject")).await;
    let r = s.post("/ojs/v1/jobs", job("reject")).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.body["error"]["code"], "duplicate");
    assert_eq!(r.body["error"]["details"]["existing_job_id"], first["id"]);
    let r = s.post("/ojs/v1/jobs", job("ignore")).await;
    assert_eq!(r.status, StatusCode::OK, "ignore answers 200 with the existing job");
    assert_eq!(r.body["job"]["id"], first["id"]);
    assert_eq!(r.body["deduplicated"], true);
    let r = s.post("/ojs/v1/jobs", job("replace")).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_ne!(r.body["job"]["id"], first["id"]);
    let old = s.get(&format!("/ojs/v1/jobs/{}", first["id"].as_str().unwrap_or(""))).await;
    assert_eq!(old.body["job"]["state"], "cancelled");
    // Different args: no clash.
    let r = s.post("/ojs/v1/jobs", json!({"type": "uniq.job", "args": [2], "options": {"unique": {"keys": ["type", "args"]}}})).await;
    assert_eq!(r.status, StatusCode::CREATED);

    // replace_except_schedule keeps a scheduled job's time.
    let report = |args: Value, at: Option<&str>| {
        let mut options = json!({"unique": {"keys": ["type"], "on_conflict": "replace_except_schedule"}});
        if let Some(at) = at {
            options["scheduled_at"] = json!(at);
        }
        json!({"type": "uniq.report", "args": args, "options": options})
    };
    let planned = s.enqueue(report(json!(["old"]), Some("2099-01-01T09:00:00Z"))).await;
    let r = s.post("/ojs/v1/jobs", report(json!(["new"]), None)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!((r.body["job"]["state"].as_str(), r.body["job"]["scheduled_at"].as_str()), (Some("scheduled"), Some("2099-01-01T09:00:00Z")), "{}", r.text);
    assert_eq!(r.body["job"]["args"], json!(["new"]));
    let old = s.get(&format!("/ojs/v1/jobs/{}", planned["id"].as_str().unwrap_or(""))).await;
    assert_eq!(old.body["job"]["state"], "cancelled");
    let manifest = s.get("/ojs/manifest").await;
    assert_eq!(manifest.body["capabilities"]["unique_jobs"]["strength"], "strong", "{}", manifest.text);
}

#[tokio::test]
async fn delayed_jobs_relative_times_and_ttl() {
    let s = TestServer::new().await;
    let before = Timestamp::now();
    let job = s.enqueue(json!({"type": "later.job", "args": [], "options": {"queue": "dq", "scheduled_at": "+PT1S", "expires_at": "2099-12-31T23:59:59Z"}})).await;
    let after = Timestamp::now();
    assert_eq!(job["state"], "scheduled");
    assert_eq!(job["expires_at"], "2099-12-31T23:59:59Z", "expires_at is echoed as sent");
    let at = ts(&job["scheduled_at"]);
    let second = SignedDuration::from_secs(1);
    assert!(at >= before.checked_add(second).expect("ts") - SignedDuration::from_millis(1) && at <= after.checked_add(second).expect("ts"), "{at}");
    assert_eq!(s.fetch("dq").await, Value::Null, "not fetchable before it is due");

    // A job whose TTL passed is discarded without completed_at and never fetched.
    let expiring = s.enqueue(json!({"type": "ttl.job", "args": [], "options": {"queue": "tq", "expires_at": "+PT0.2S"}})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = run_pass(&s.db.store, &s.state.metrics).await.expect("maintenance pass");
    assert_eq!((report.promoted, report.expired), (1, 1));
    assert_eq!(s.fetch("dq").await["id"], job["id"]);
    assert_eq!(s.fetch("tq").await, Value::Null);
    let r = s.get(&format!("/ojs/v1/jobs/{}", expiring["id"].as_str().unwrap_or(""))).await;
    assert_eq!(r.body["job"]["state"], "discarded");
    assert!(r.body["job"].get("completed_at").is_none(), "{}", r.text);
}

#[tokio::test]
async fn priorities_then_fifo() {
    let s = TestServer::new().await;
    let low = s.enqueue(json!({"type": "p.job", "args": ["low"], "options": {"queue": "pq", "priority": -5}})).await;
    let high1 = s.enqueue(json!({"type": "p.job", "args": ["high1"], "options": {"queue": "pq", "priority": 50}})).await;
    let high2 = s.enqueue(json!({"type": "p.job", "args": ["high2"], "options": {"queue": "pq", "priority": 50}})).await;
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["pq"], "count": 3})).await;
    let ids: Vec<&Value> = r.body["jobs"].as_array().expect("jobs").iter().map(|j| &j["id"]).collect();
    assert_eq!(ids, [&high1["id"], &high2["id"], &low["id"]]);
}

#[tokio::test]
async fn queues_pause_resume_and_stats() {
    let s = TestServer::new().await;
    let r = s.post("/ojs/v1/queues/paused-q/pause", json!({})).await;
    assert_eq!((r.status, &r.body["queue"]["paused"]), (StatusCode::OK, &json!(true)), "{}", r.text);
    let job = s.enqueue(json!({"type": "q.job", "args": [], "options": {"queue": "paused-q"}})).await;
    assert_eq!(s.fetch("paused-q").await, Value::Null, "a paused queue accepts jobs but hands none out");
    let r = s.get("/ojs/v1/queues/paused-q/stats").await;
    assert_eq!(r.body["stats"]["available"], 1);
    assert_eq!(r.body["status"], "paused");
    let r = s.post("/ojs/v1/queues/paused-q/resume", json!({})).await;
    assert_eq!(r.body["queue"]["paused"], false);
    assert_eq!(s.fetch("paused-q").await["id"], job["id"]);
    let r = s.get("/ojs/v1/queues/paused-q/stats").await;
    assert_eq!((r.body["stats"]["available"].as_i64(), r.body["stats"]["active"].as_i64()), (Some(0), Some(1)));
    let r = s.get("/ojs/v1/queues").await;
    assert_eq!(r.body["queues"][0]["name"], "paused-q");
    let audit = s.db.store.audit_log(&Default::default()).await.expect("audit");
    assert!(audit.iter().any(|e| e.action == "queue.pause"));
    // Both are events (OJS queue.paused / queue.resumed), in the queue's stream too.
    let r = s.get("/ojs/v1/events?types=queue.paused,queue.resumed&queues=paused-q").await;
    let seen: Vec<(&str, &str)> = r.body["events"].as_array().expect("events").iter().filter_map(|e| Some((e["type"].as_str()?, e["subject"].as_str()?))).collect();
    assert_eq!(seen, [("queue.resumed", "paused-q"), ("queue.paused", "paused-q")], "{}", r.text);
    assert!(r.body["events"][1]["data"]["paused_by"].is_string());
    let r = s.get("/ojs/v1/events?types=queue.paused&job_types=q.job").await;
    assert_eq!(r.body["events"], json!([]), "queue events have no job type");
}

#[tokio::test]
async fn events_record_what_happened() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "ev.job", "args": [], "options": {"queue": "eq", "retry": {"max_attempts": 2, "initial_interval": "PT1H", "max_interval": "PT2H"}}})).await;
    s.fetch("eq").await;
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w1", "active_jobs": [job["id"]]})).await;
    assert_eq!(r.body["jobs_extended"], json!([job["id"]]), "{}", r.text);
    s.post("/ojs/v1/workers/nack", json!({"job_id": job["id"], "error": {"code": "e1", "message": "first"}})).await;
    let r = s.get("/ojs/v1/events?queues=eq").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let types: Vec<&str> = r.body["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types, ["job.retrying", "job.failed", "job.heartbeat", "job.started", "job.enqueued"], "newest first");
    assert_eq!(r.body["events"][0]["data"]["error"]["code"], "e1");
    // OJS job.heartbeat: who extended which attempt, and until when.
    let beat = &r.body["events"][2]["data"];
    assert_eq!((&beat["worker_id"], &beat["attempt"], &beat["job_type"]), (&json!("w1"), &json!(1), &json!("ev.job")), "{beat}");
    let until: jiff::Timestamp = beat["visible_until"].as_str().expect("visible_until").parse().expect("RFC 3339");
    let at: jiff::Timestamp = r.body["events"][2]["time"].as_str().expect("time").parse().expect("RFC 3339");
    assert!(until > at, "{until} after {at}");
    let r = s.get("/ojs/v1/events?types=job.completed&queues=eq").await;
    assert_eq!(r.body["events"], json!([]));
    let r = s.get("/ojs/v1/events?queues=other").await;
    assert_eq!(r.body["events"], json!([]));
    // The beating worker registered (OJS worker.started), with the server's other events.
    let r = s.get("/ojs/v1/events?types=worker.started,worker.stopped").await;
    let workers: Vec<(&str, &str, &str)> = r.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| Some((e["type"].as_str()?, e["subject"].as_str()?, e["source"].as_str()?)))
        .collect();
    assert_eq!(workers, [("worker.started", "w1", "ojs://rebound/workers")], "{}", r.text);
    assert_eq!(r.body["events"][0]["data"]["worker_id"], "w1");
    let r = s.get("/ojs/v1/events?queues=eq&types=worker.started").await;
    assert_eq!(r.body["events"], json!([]), "worker events belong to no queue");
    // What a client says it uses must be a plausible number, named when it is not.
    for (field, bad) in [("memory_mb", json!("12 MB")), ("cpu_percent", json!(-3)), ("memory_mb", json!(1e12))] {
        let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w1", "active_jobs": [], field: bad})).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{field} = {bad}: {}", r.text);
        assert!(r.text.contains(field), "{}", r.text);
    }
    // Its beat was an OJS worker.heartbeat; saying it drains starts its quiet spell.
    let r = s
        .post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w1", "active_jobs": [], "state": "quiet", "memory_mb": 96.5, "cpu_percent": 7}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["state"], "quiet", "never told to go back to running: {}", r.text);
    let r = s.get("/ojs/v1/events?types=worker.heartbeat,worker.quiet").await;
    let seen: Vec<(&str, &str, &Value)> = r.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| Some((e["type"].as_str()?, e["subject"].as_str()?, &e["data"]["active_jobs"])))
        .collect();
    assert_eq!(
        seen,
        [("worker.quiet", "w1", &json!(0)), ("worker.heartbeat", "w1", &json!(0)), ("worker.heartbeat", "w1", &json!(1))],
        "newest first: {}",
        r.text
    );
    assert_eq!(r.body["events"][0]["data"]["reason"], "shutdown");
    // The usage it sent is in its beat's event and the admin API's worker; the first beat sent none.
    let (said, first) = (&r.body["events"][1]["data"], &r.body["events"][2]["data"]);
    assert_eq!((said["memory_mb"].as_f64(), said["cpu_percent"].as_f64()), (Some(96.5), Some(7.0)), "{said}");
    assert!(first.get("memory_mb").is_none() && first.get("cpu_percent").is_none(), "{first}");
    let r = s.get("/ojs/v1/admin/workers/w1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!((r.body["memory_mb"].as_f64(), r.body["cpu_percent"].as_f64()), (Some(96.5), Some(7.0)), "{}", r.text);
}

/// The `(event, id)` pairs of a Server-Sent Events text.
fn sse_events(text: &str) -> Vec<(String, String)> {
    text.split("\n\n")
        .filter_map(|block| {
            let field = |name: &str| block.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_owned());
            Some((field("event:")?, field("id:")?))
        })
        .collect()
}

#[tokio::test]
async fn events_are_polled_with_a_cursor_and_streamed_per_job() {
    let s = TestServer::new().await;
    let a = s.enqueue(json!({"type": "ev.a", "args": [], "options": {"queue": "pq"}})).await;
    let b = s.enqueue(json!({"type": "ev.b", "args": [], "options": {"queue": "pq"}})).await;
    assert_eq!(s.fetch("pq").await["id"], a["id"]);
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": a["id"]})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let newest = s.get("/ojs/v1/events?queues=pq").await;
    assert_eq!(newest.status, StatusCode::OK, "{}", newest.text);
    let e = &newest.body["events"][0];
    assert_eq!((e["specversion"].as_str(), e["type"].as_str(), e["source"].as_str()), (Some("1.0"), Some("job.completed"), Some("ojs://rebound/jobs")));
    assert!(newest.body["cursor"].as_str().is_some_and(|c| c.starts_with("evt_")) && newest.body["has_more"] == json!(false));

    // A cursor passes only settled events (a second old), so polling waits for them.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // A minute before the first job: a page reads at most ten minutes of history.
    let start = format!("evt_{:016}:", (Timestamp::now() - SignedDuration::from_secs(60)).as_microsecond());
    let first = s.get(&format!("/ojs/v1/events?queues=pq&after={start}&limit=2")).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    let ids = |r: &Reply| r.body["events"].as_array().expect("events").iter().map(|e| e["id"].as_str().expect("id").to_owned()).collect::<Vec<_>>();
    let kinds = |r: &Reply| r.body["events"].as_array().expect("events").iter().map(|e| e["type"].as_str().expect("type").to_owned()).collect::<Vec<_>>();
    assert_eq!(kinds(&first), ["job.enqueued", "job.enqueued"], "oldest first");
    assert_eq!((first.body["has_more"].clone(), first.body["cursor"].as_str()), (json!(true), ids(&first).last().map(String::as_str)));
    let second = s.get(&format!("/ojs/v1/events?queues=pq&after={}&limit=2", first.body["cursor"].as_str().expect("cursor"))).await;
    assert_eq!((kinds(&second), second.body["has_more"].clone()), (vec!["job.started".to_owned(), "job.completed".to_owned()], json!(false)));
    let mut walked = [ids(&first), ids(&second)].concat();
    let mut all = ids(&newest);
    all.sort();
    walked.sort();
    assert_eq!(walked, all, "the pages hold what the newest-first list holds");
    // Nothing new: the cursor stays put or moves up to the horizon, never back.
    let idle = s.get(&format!("/ojs/v1/events?queues=pq&after={}", second.body["cursor"].as_str().expect("cursor"))).await;
    assert!(idle.body["events"].as_array().is_some_and(Vec::is_empty) && idle.body["cursor"].as_str() >= second.body["cursor"].as_str());

    // A cursor far behind steps over the empty windows in one poll and answers the first
    // events after them.
    let hour_ago = format!("evt_{:016}:", (Timestamp::now() - SignedDuration::from_secs(3600)).as_microsecond());
    let r = s.get(&format!("/ojs/v1/events?queues=pq&after={hour_ago}&limit=2")).await;
    assert_eq!((ids(&r), r.body["has_more"].clone()), (ids(&first), json!(true)), "{}", r.text);
    // One from a year back has far too many to step over at once: the poll answers nothing
    // yet, more to come, and a cursor moved on by more than one window.
    let year_ago = Timestamp::now() - SignedDuration::from_hours(24 * 365);
    let r = s.get(&format!("/ojs/v1/events?after=evt_{:016}:", year_ago.as_microsecond())).await;
    assert_eq!((r.body["events"].clone(), r.body["has_more"].clone()), (json!([]), json!(true)), "{}", r.text);
    let moved = r.body["cursor"].as_str().and_then(|c| c.get(4..20)).and_then(|d| d.parse::<i64>().ok()).expect("cursor") - year_ago.as_microsecond();
    assert!(moved > 600_000_000 && moved < 364 * 24 * 3_600_000_000, "stepped on by {moved} µs");
    let only_b = s.get(&format!("/ojs/v1/events?job_types=ev.b&after={start}")).await;
    assert_eq!(only_b.body["events"].as_array().map(|e| e.iter().map(|e| e["data"]["job_id"].clone()).collect::<Vec<_>>()), Some(vec![b["id"].clone()]));
    for bad in ["after=12", "after=evt_123:x", "job_types=Not%20A%20Type"] {
        let r = s.get(&format!("/ojs/v1/events?{bad}")).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some(bad.split('=').next().expect("name"))), "{bad}: {}", r.text);
    }

    // A finished job's stream replays its events and ends; the SDKs' channel form alike.
    for path in [format!("/ojs/v1/jobs/{}/events", a["id"].as_str().expect("id")), format!("/ojs/v1/events/stream?channel=job:{}", a["id"].as_str().expect("id"))] {
        let r = tokio::time::timeout(Duration::from_secs(20), s.get(&path)).await.expect("the stream of a finished job ends");
        assert_eq!((r.status, r.header("content-type")), (StatusCode::OK, Some("text/event-stream")), "{path}");
        let events = sse_events(&r.text);
        assert_eq!(events.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["job.enqueued", "job.started", "job.completed"], "{path}: {}", r.text);
        assert!(events.iter().all(|e| all.contains(&e.1)), "stream ids are the list's ids");
    }
    let r = s.get("/ojs/v1/jobs/019539a4-bbbb-7000-8000-000000000001/events").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    for bad in ["channel=jobs:1", "channel=job:nope", "channel=queue:BAD", "types=job.exploded&channel=queue:pq"] {
        let r = s.get(&format!("/ojs/v1/events/stream?{bad}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.text);
    }
}

#[tokio::test]
async fn a_queue_stream_delivers_new_events_and_resumes_after_the_last_one_seen() {
    use futures::StreamExt;
    let s = TestServer::new().await;
    s.enqueue(json!({"type": "ev.old", "args": [], "options": {"queue": "sq"}})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Read until `want` events have arrived.
    async fn read(s: &TestServer, headers: &[(&str, &str)], want: usize) -> Vec<(String, String)> {
        let res = s.open("/ojs/v1/queues/sq/events", headers).await;
        assert_eq!(res.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("text/event-stream"));
        let mut body = res.into_body().into_data_stream();
        let mut text = String::new();
        while sse_events(&text).len() < want {
            let chunk = tokio::time::timeout(Duration::from_secs(20), body.next()).await.expect("an event within 20 s");
            text.push_str(&String::from_utf8_lossy(&chunk.expect("the stream stays open").expect("a chunk")));
        }
        sse_events(&text)
    }
    let reading = read(&s, &[], 3);
    let work = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.enqueue(json!({"type": "ev.new", "args": [], "options": {"queue": "sq"}})).await;
        s.enqueue(json!({"type": "ev.elsewhere", "args": [], "options": {"queue": "other"}})).await;
        let old = s.fetch("sq").await;
        assert_eq!(old["type"], "ev.old");
        let r = s.post("/ojs/v1/workers/ack", json!({"job_id": old["id"]})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    };
    let (seen, ()) = tokio::join!(reading, work);
    // Only what happened after the stream opened, in this queue.
    assert_eq!(seen.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["job.enqueued", "job.started", "job.completed"], "{seen:?}");
    // Resumed after the first event seen, the stream starts with the second.
    let resumed = read(&s, &[("last-event-id", &seen[0].1)], 1).await;
    assert_eq!(resumed[0], seen[1]);
    let r = s.get("/ojs/v1/queues/BAD/events").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = s.raw("GET", "/ojs/v1/queues/sq/events", &[("last-event-id", "nope")], Vec::new()).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("Last-Event-ID")));
}

#[tokio::test]
async fn streams_end_when_the_server_shuts_down() {
    use futures::StreamExt;
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "ev.wait", "args": [], "options": {"queue": "down"}})).await;
    let id = job["id"].as_str().expect("id").to_owned();
    // A queue's stream, and a job's that would run until the job finishes (it never does).
    let mut bodies = Vec::new();
    for path in ["/ojs/v1/queues/down/events".to_owned(), format!("/ojs/v1/jobs/{id}/events")] {
        let res = s.open(&path, &[]).await;
        assert_eq!(res.status(), StatusCode::OK);
        bodies.push(res.into_body().into_data_stream());
    }
    async fn drain(body: &mut axum::body::BodyDataStream, within: Duration) -> Result<(), tokio::time::error::Elapsed> {
        tokio::time::timeout(within, async {
            while let Some(chunk) = body.next().await {
                chunk.expect("a chunk");
            }
        })
        .await
    }
    for body in &mut bodies {
        assert!(drain(body, Duration::from_millis(1200)).await.is_err(), "the stream stays open while the server runs");
    }
    s.state.shutdown.cancel();
    for body in &mut bodies {
        assert!(drain(body, Duration::from_secs(5)).await.is_ok(), "a stream ends within a poll of the shutdown, so a graceful stop need not wait for its clients");
    }
}

#[tokio::test]
async fn headers_request_ids_and_location() {
    let s = TestServer::new().await;
    let r = s
        .raw("POST", "/ojs/v1/jobs", &[("content-type", "application/json"), ("x-request-id", "client-42")], br#"{"type":"h.job","args":[]}"#.to_vec())
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.header("x-request-id"), Some("client-42"));
    assert_eq!(r.header("content-type"), Some("application/openjobspec+json"));
    assert_eq!(r.header("ojs-version"), Some("1.0"));
    let id = r.body["job"]["id"].as_str().expect("id");
    assert_eq!(r.header("location"), Some(format!("/ojs/v1/jobs/{id}").as_str()));
    let r = s.raw("GET", "/ojs/v1/jobs/019539a4-0000-7000-8000-000000000009", &[("x-request-id", "client-43")], Vec::new()).await;
    assert_eq!(r.body["error"]["request_id"], "client-43");
    let r = s.get("/ojs/v1/jobs/019539a4-0000-7000-8000-000000000009").await;
    let generated = r.header("x-request-id").expect("a request id is generated");
    assert!(generated.starts_with("req_"));
    assert_eq!(r.body["error"]["request_id"], generated);
    // A client's id is kept only as one plain token: anything else, which would be echoed and
    // logged as sent, is replaced by one of ours.
    let missing = "/ojs/v1/jobs/019539a4-0000-7000-8000-000000000009";
    let longest = "a".repeat(128);
    let too_long = "a".repeat(129);
    for sent in [vec![longest.as_str()], vec!["req_0193.x:y-z"]] {
        let r = s.raw("GET", missing, &sent.iter().map(|v| ("x-request-id", *v)).collect::<Vec<_>>(), Vec::new()).await;
        assert_eq!(r.header("x-request-id"), Some(sent[0]), "{sent:?}");
    }
    for sent in [vec![too_long.as_str()], vec!["two words"], vec!["id\"quoted\""], vec!["ok-1", "ok-2"]] {
        let r = s.raw("GET", missing, &sent.iter().map(|v| ("x-request-id", *v)).collect::<Vec<_>>(), Vec::new()).await;
        let id = r.header("x-request-id").expect("an id");
        assert!(id.starts_with("req_") && id.len() == 40, "{sent:?} gave {id}");
        assert_eq!(r.body["error"]["request_id"], id, "{sent:?}");
    }
}

#[tokio::test]
async fn test_mode_reset_and_heartbeat_directives() {
    let s = TestServer::with_config(ServerConfig { api_auth: ApiAuth::None, test_mode: true, ..ServerConfig::default() }).await;
    let quiet = s.enqueue(json!({"type": "t.job", "args": [], "options": {"queue": "tm", "metadata": {"test_directive": "quiet"}}})).await;
    assert_eq!(quiet["options"]["metadata"]["test_directive"], "quiet", "unmodelled options are kept");
    s.fetch("tm").await;
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w1", "active_jobs": [quiet["id"]]})).await;
    assert_eq!(r.body["state"], "quiet", "{}", r.text);
    assert_eq!(r.body["jobs_extended"], json!([quiet["id"]]));
    let r = s.post("/ojs/v1/admin/reset", json!({})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(s.job_count().await, 0);

    // Outside test mode the same metadata changes nothing.
    let prod = TestServer::new().await;
    let job = prod.enqueue(json!({"type": "t.job", "args": [], "options": {"queue": "tm", "metadata": {"test_directive": "terminate"}}})).await;
    prod.fetch("tm").await;
    let r = prod.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w1", "active_jobs": [job["id"]]})).await;
    assert_eq!(r.body["state"], "running");
    let workers = prod.db.store.workers().await.expect("workers");
    assert_eq!(workers.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(), ["w1"], "heartbeats register the worker");
}

#[tokio::test]
async fn nack_requeue_does_not_count_the_attempt() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "r.job", "args": [], "options": {"queue": "rq"}})).await;
    assert_eq!(s.fetch("rq").await["attempt"], 1);
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": job["id"], "requeue": true, "error": {"code": "cancelled", "message": "shutting down"}})).await;
    assert_eq!((r.body["state"].as_str(), r.body["attempt"].as_i64()), (Some("available"), Some(0)), "{}", r.text);
    assert_eq!(s.fetch("rq").await["attempt"], 1);
}

#[tokio::test]
async fn expired_claims_are_rescued_and_rerun() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "v.job", "args": [], "options": {"queue": "vq"}})).await;
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["vq"], "visibility_timeout_ms": 1})).await;
    assert_eq!(r.body["jobs"][0]["id"], job["id"]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let report = run_pass(&s.db.store, &s.state.metrics).await.expect("pass");
    assert_eq!(report.rescued.stalled, 1);
    let r = s.get(&format!("/ojs/v1/jobs/{}", job["id"].as_str().unwrap_or(""))).await;
    assert_eq!(r.body["job"]["state"], "available");
    assert_eq!(r.body["job"]["errors"][0]["type"], "rebound.stalled");
}

/// Worker protocol §5.6: an ack or nack from a worker that does not hold the job is refused,
/// so a stale worker cannot finish (or fail) another worker's run of it.
#[tokio::test]
async fn only_the_worker_holding_a_job_can_ack_or_nack_it() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "held.job", "args": [], "options": {"queue": "hq"}})).await;
    assert_eq!(s.fetch("hq").await["id"], job["id"], "fetched by w1");
    let id = job["id"].as_str().unwrap_or_default();
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": id, "worker_id": "w2"})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.body["error"]["details"]["worker_id"], "w2", "{}", r.text);
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": id, "worker_id": "w2", "error": {"code": "boom", "message": "not mine"}})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": id, "worker_id": "w2", "requeue": true})).await;
    assert_eq!((r.status, r.body["error"]["details"]["worker_id"].as_str()), (StatusCode::CONFLICT, Some("w2")), "{}", r.text);
    let r = s.get(&format!("/ojs/v1/jobs/{id}")).await;
    assert_eq!((r.body["job"]["state"].as_str(), r.body["job"]["attempt"].as_i64()), (Some("active"), Some(1)), "untouched: {}", r.text);
    // The holder can; so can a caller that does not name itself (the SDKs ack by job id).
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": id, "worker_id": "w1"})).await;
    assert_eq!((r.status, r.body["state"].as_str()), (StatusCode::OK, Some("completed")), "{}", r.text);
    let other = s.enqueue(json!({"type": "held.job", "args": [], "options": {"queue": "hq"}})).await;
    assert_eq!(s.fetch("hq").await["id"], other["id"]);
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": other["id"]})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

/// An ack or nack that names its run (`attempt` and `started_at` as the fetch returned them)
/// lands only on that run. A requeue nack gives the attempt number back, so the next fetch
/// runs attempt 1 again: a nack or ack of the first run, sent again (its answer lost), must
/// not fail, hand back or complete the second.
#[tokio::test]
async fn a_result_naming_its_run_never_lands_on_a_later_run_of_the_same_attempt() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "run.job", "args": [], "options": {"queue": "rq"}})).await;
    let id = job["id"].as_str().unwrap_or_default().to_owned();
    let first = s.fetch("rq").await;
    assert_eq!((first["id"].as_str(), first["attempt"].as_i64()), (Some(id.as_str()), Some(1)), "{first}");
    let first_start = first["started_at"].clone();
    assert!(first_start.is_string(), "{first}");
    let requeue = json!({"job_id": id, "worker_id": "w1", "requeue": true, "attempt": 1, "started_at": first_start});
    let r = s.post("/ojs/v1/workers/nack", requeue.clone()).await;
    assert_eq!((r.status, r.body["state"].as_str()), (StatusCode::OK, Some("available")), "{}", r.text);
    tokio::time::sleep(Duration::from_millis(2)).await;
    let second = s.fetch("rq").await;
    assert_eq!((second["id"].as_str(), second["attempt"].as_i64()), (Some(id.as_str()), Some(1)), "the attempt number came back: {second}");
    assert_ne!(second["started_at"], first_start, "{second}");

    // The first run's results, each refused with what the job is running now.
    let stale = [
        ("/ojs/v1/workers/nack", requeue),
        ("/ojs/v1/workers/nack", json!({"job_id": id, "worker_id": "w1", "attempt": 1, "started_at": first_start, "error": {"code": "boom", "message": "first run"}})),
        ("/ojs/v1/workers/nack", json!({"job_id": id, "started_at": first_start, "error": {"code": "DISCARD", "message": "first run"}})),
        ("/ojs/v1/workers/ack", json!({"job_id": id, "worker_id": "w1", "attempt": 1, "started_at": first_start})),
        ("/ojs/v1/workers/ack", json!({"job_id": id, "attempt": 2})),
    ];
    for (path, body) in stale {
        let r = s.post(path, body.clone()).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{body}: {}", r.text);
        let details = &r.body["error"]["details"];
        assert_eq!((&details["current_attempt"], &details["current_started_at"]), (&json!(1), &second["started_at"]), "{body}: {}", r.text);
    }
    let r = s.get(&format!("/ojs/v1/jobs/{id}")).await;
    assert_eq!((r.body["job"]["state"].as_str(), &r.body["job"]["started_at"]), (Some("active"), &second["started_at"]), "untouched: {}", r.text);
    assert!(r.body["job"].get("errors").is_none_or(|e| e.as_array().is_some_and(Vec::is_empty)), "no failure recorded: {}", r.text);

    // The second run's own nack and ack land.
    let r = s
        .post("/ojs/v1/workers/nack", json!({"job_id": id, "worker_id": "w1", "attempt": 1, "started_at": second["started_at"], "error": {"code": "boom", "message": "second run"}}))
        .await;
    assert_eq!((r.status, r.body["attempt"].as_i64()), (StatusCode::OK, Some(1)), "{}", r.text);
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": id, "started_at": second["started_at"]})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "retryable now, not active: {}", r.text);
    assert_eq!(r.body["error"]["details"]["current_state"], "retryable", "{}", r.text);
}

/// ojs-events: every event of a traced job carries its trace id (§8.1, from `meta.trace_id` or
/// a W3C `traceparent`); `job.failed` says whether the error allowed a retry, and
/// `job.discarded` names the attempts made and the last error.
#[tokio::test]
async fn events_carry_the_trace_id_and_the_fields_the_spec_requires() {
    let s = TestServer::new().await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traced = s
        .enqueue(json!({"type": "tr.job", "args": [], "meta": {"trace_id": trace}, "options": {"queue": "trq", "retry": {"max_attempts": 2, "initial_interval": "PT0.001S", "jitter": false}}}))
        .await;
    let parent = s.enqueue(json!({"type": "tr.other", "args": [], "meta": {"traceparent": format!("00-{trace}-00f067aa0ba902b7-01")}, "options": {"queue": "trq2"}})).await;
    let plain = s.enqueue(json!({"type": "tr.plain", "args": [], "options": {"queue": "trq3"}})).await;
    let id = traced["id"].as_str().unwrap_or_default().to_owned();
    for attempt in 1..=2 {
        if attempt == 2 {
            // Due at once: the scheduler's promotion, as the worker's leader runs it.
            sqlx::query("UPDATE jobs SET scheduled_at = now() WHERE id = $1::uuid").bind(&id).execute(s.db.store.pool()).await.expect("due");
            s.db.store.promote_due(10).await.expect("promote");
        }
        assert_eq!(s.fetch("trq").await["id"], traced["id"]);
        // The second error says it is not worth retrying.
        let r = s.post("/ojs/v1/workers/nack", json!({"job_id": id, "error": {"code": "smtp.refused", "message": "no", "retryable": attempt == 1}})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let r = s.get(&format!("/ojs/v1/events?job_id={id}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let events = r.body["events"].as_array().cloned().unwrap_or_default();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    for kind in ["job.enqueued", "job.started", "job.failed", "job.retrying", "job.discarded"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    for e in &events {
        assert_eq!(e["data"]["trace_id"], trace, "{e}");
    }
    let of = |kind: &str| events.iter().filter(|e| e["type"] == kind).cloned().collect::<Vec<_>>();
    let mut retryable: Vec<bool> = of("job.failed").iter().map(|e| e["data"]["error"]["retryable"].as_bool().expect("retryable")).collect();
    retryable.sort();
    assert_eq!(retryable, [false, true], "a retryable error, then one that is not");
    let discarded = &of("job.discarded")[0]["data"];
    assert_eq!((discarded["total_attempts"].as_i64(), discarded["last_error"]["code"].as_str()), (Some(2), Some("smtp.refused")), "{discarded}");
    assert_eq!(discarded["last_error"]["message"], "no");

    let r = s.get(&format!("/ojs/v1/events?job_id={}", parent["id"].as_str().unwrap_or_default())).await;
    assert_eq!(r.body["events"][0]["data"]["trace_id"], trace, "from traceparent: {}", r.text);
    let r = s.get(&format!("/ojs/v1/events?job_id={}", plain["id"].as_str().unwrap_or_default())).await;
    assert!(r.body["events"][0]["data"].get("trace_id").is_none(), "{}", r.text);
}

/// ojs-timeouts: a run past its timeout and a run whose worker went silent are events of their
/// own (`job.timeout`, `job.stalled`) with the limit that ran out, and a policy may name the
/// OJS error types (`timeout`) for Rebound's own (`rebound.timeout`).
#[tokio::test]
async fn timeouts_and_stalls_are_events_and_answer_to_their_ojs_names() {
    let s = TestServer::new().await;
    let slow = s
        .enqueue(json!({"type": "tmo.job", "args": [], "options": {"queue": "tmo", "timeout_ms": 1000, "visibility_timeout_ms": 60000,
                        "retry": {"max_attempts": 5, "non_retryable_errors": ["timeout"]}}}))
        .await;
    let silent = s.enqueue(json!({"type": "tmo.job", "args": [], "options": {"queue": "stl", "visibility_timeout_ms": 1}})).await;
    assert_eq!(s.fetch("tmo").await["id"], slow["id"]);
    assert_eq!(s.fetch("stl").await["id"], silent["id"]);
    sqlx::query("UPDATE jobs SET started_at = now() - interval '3 seconds' WHERE id = $1::uuid")
        .bind(slow["id"].as_str().unwrap_or_default())
        .execute(s.db.store.pool())
        .await
        .expect("age the run");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let report = run_pass(&s.db.store, &s.state.metrics).await.expect("pass");
    assert_eq!((report.rescued.timed_out, report.rescued.stalled), (1, 1));

    let events = async |id: &Value| {
        let url = format!("/ojs/v1/events?job_id={}", id.as_str().unwrap_or_default());
        s.get(&url).await.body["events"].as_array().cloned().unwrap_or_default()
    };
    let slow_events = events(&slow["id"]).await;
    let timeout = slow_events.iter().find(|e| e["type"] == "job.timeout").expect("a job.timeout event");
    assert_eq!((timeout["data"]["timeout_kind"].as_str(), timeout["data"]["limit_seconds"].as_f64(), timeout["data"]["attempt"].as_i64()), (Some("execution"), Some(1.0), Some(1)), "{timeout}");
    assert!(timeout["data"]["elapsed_seconds"].as_f64().is_some_and(|s| s >= 3.0), "{timeout}");
    // Before the attempt's job.failed and job.discarded, so a job's stream, which ends at its
    // terminal event, carries it.
    let order: Vec<&str> = slow_events.iter().rev().filter_map(|e| e["type"].as_str()).filter(|t| ["job.timeout", "job.failed", "job.discarded"].contains(t)).collect();
    assert_eq!(order, ["job.timeout", "job.failed", "job.discarded"], "oldest first");
    let r = s.get(&format!("/ojs/v1/jobs/{}", slow["id"].as_str().unwrap_or_default())).await;
    assert_eq!(r.body["job"]["state"], "discarded", "`timeout` is non-retryable by its OJS name: {}", r.text);

    let stalled = events(&silent["id"]).await.into_iter().find(|e| e["type"] == "job.stalled").expect("a job.stalled event");
    assert_eq!(stalled["data"]["timeout_kind"], "stalled", "{stalled}");
    // And the type filter knows them.
    let r = s.get("/ojs/v1/events?types=job.timeout,job.stalled").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let mut kinds: Vec<&str> = r.body["events"].as_array().map(|a| a.iter().filter_map(|e| e["type"].as_str()).collect()).unwrap_or_default();
    kinds.sort();
    assert_eq!(kinds, ["job.stalled", "job.timeout"]);
}

/// ojs-http-binding §17: list endpoints page by `limit` and `cursor` (or `offset`) and say so in
/// `pagination`; the events' `cursor` is their `after`.
#[tokio::test]
async fn lists_page_by_limit_and_cursor() {
    let s = TestServer::new().await;
    for q in ["pg-c", "pg-a", "pg-b"] {
        s.enqueue(json!({"type": "pg.job", "args": [], "options": {"queue": q}})).await;
        let r = s.post("/ojs/v1/cron", json!({"name": format!("cron-{q}"), "expression": "@hourly", "job_template": {"type": "pg.tick"}})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    for (list, items, key) in [("/ojs/v1/queues", "queues", "name"), ("/ojs/v1/cron", "cron_jobs", "name")] {
        let names = |r: &Reply| r.body[items].as_array().map(|a| a.iter().filter_map(|i| i[key].as_str().map(str::to_owned)).collect::<Vec<_>>()).unwrap_or_default();
        let first = s.get(&format!("{list}?limit=2")).await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.text);
        let p = &first.body["pagination"];
        assert_eq!((p["total"].as_i64(), p["has_more"].as_bool()), (Some(3), Some(true)), "{list}: {}", first.text);
        let cursor = p["next_cursor"].as_str().expect("next_cursor").to_owned();
        let second = s.get(&format!("{list}?limit=2&cursor={cursor}")).await;
        assert_eq!(second.body["pagination"]["has_more"], false, "{list}: {}", second.text);
        assert!(second.body["pagination"].get("next_cursor").is_none());
        let all = [names(&first), names(&second)].concat();
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!((all.len(), &all), (3, &sorted), "{list}: every item once, by name");
        assert_eq!(names(&s.get(&format!("{list}?limit=1&offset=2")).await), names(&second));
        for bad in ["limit=0", "limit=201", "cursor=a&offset=1", "cursor="] {
            let r = s.get(&format!("{list}?{bad}")).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{list}?{bad}: {}", r.text);
        }
    }
    // Events: `cursor` is `after`.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let start = format!("evt_{:016}:", (Timestamp::now() - SignedDuration::from_secs(60)).as_microsecond());
    let by_after = s.get(&format!("/ojs/v1/events?types=job.enqueued&after={start}&limit=2")).await;
    let by_cursor = s.get(&format!("/ojs/v1/events?types=job.enqueued&cursor={start}&limit=2")).await;
    assert_eq!(by_cursor.status, StatusCode::OK, "{}", by_cursor.text);
    assert_eq!(by_after.body["events"], by_cursor.body["events"]);
    let p = &by_cursor.body["pagination"];
    assert_eq!((p["has_more"].as_bool(), p["next_cursor"].as_str()), (Some(true), by_cursor.body["cursor"].as_str()), "{}", by_cursor.text);
    assert_eq!(s.get(&format!("/ojs/v1/events?after={start}&cursor={start}")).await.status, StatusCode::BAD_REQUEST);
}

/// ojs-dead-letter §9.1: dead letters are searchable by queue, type, error type and args or
/// message text; a search pages by cursor, never by offset (which would check every one).
#[tokio::test]
async fn dead_letters_are_searchable_by_error_type_and_text() {
    let s = TestServer::new().await;
    let refused = s.dead_letter("dlq", "smtp.refused").await;
    let timed_out = s.dead_letter("dlq", "smtp.timeout").await;
    let declined = s.dead_letter("dlq", "pay.declined").await;
    sqlx::query("UPDATE jobs SET args = '[{\"invoice\": \"inv-4711\"}]' WHERE id = $1::uuid").bind(&timed_out).execute(s.db.store.pool()).await.expect("args");
    let ids = |r: &Reply| {
        let mut v: Vec<String> = r.body["jobs"].as_array().map(|a| a.iter().filter_map(|j| j["id"].as_str().map(str::to_owned)).collect()).unwrap_or_default();
        v.sort();
        v
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    for (query, want) in [
        ("error_type=smtp.*", sorted(vec![refused.clone(), timed_out.clone()])),
        ("error_type=pay.declined", vec![declined.clone()]),
        ("q=inv-4711", vec![timed_out.clone()]),
        ("q=BROKE&queue=dlq", sorted(vec![refused.clone(), timed_out.clone(), declined.clone()])),
        ("q=nothing-like-it", vec![]),
    ] {
        let r = s.get(&format!("/ojs/v1/dead-letter?{query}")).await;
        assert_eq!(r.status, StatusCode::OK, "{query}: {}", r.text);
        assert_eq!(ids(&r), want, "{query}");
        assert_eq!(r.body["pagination"]["total"].as_u64(), Some(want.len() as u64), "{query}: {}", r.text);
        assert!(r.body["pagination"].get("total_searched").is_none(), "fewer than a window: every match counted");
    }
    for (query, field) in [("error_type=", "error_type"), ("error_type=smtp.*&offset=50", "offset"), ("since=2026-01-01T00:00:00Z", "since")] {
        let r = s.get(&format!("/ojs/v1/dead-letter?{query}")).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some(field)), "{query}: {}", r.text);
    }
}
