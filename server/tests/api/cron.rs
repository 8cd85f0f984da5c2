//! Cron over the HTTP API (`ojs-cron.md`): both request shapes, validation naming the field,
//! list / get / toggle / pause / resume / trigger / delete, and firing on schedule.

use std::time::Duration;

use axum::http::StatusCode;
use rebound_server::maintenance::run_pass;
use serde_json::{Value, json};

use crate::common::TestServer;

#[tokio::test]
async fn register_in_both_shapes_list_get_toggle_delete() {
    let s = TestServer::new().await;
    // The spec's shape.
    let r = s
        .post("/ojs/v1/cron", json!({"name": "daily-report", "cron": "0 9 * * MON-FRI", "timezone": "America/New_York", "type": "report.generate", "args": [{"r": 1}], "options": {"queue": "reports", "retry": {"max_attempts": 2}}, "description": "weekday report"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let c = &r.body["cron_job"];
    assert_eq!((c["cron"].as_str(), c["expression"].as_str(), c["timezone"].as_str()), (Some("0 9 * * MON-FRI"), Some("0 9 * * MON-FRI"), Some("America/New_York")));
    assert_eq!((c["type"].as_str(), c["queue"].as_str(), c["overlap_policy"].as_str(), c["enabled"].as_bool()), (Some("report.generate"), Some("reports"), Some("skip"), Some(true)));
    let next: jiff::Timestamp = c["next_run_at"].as_str().expect("next_run_at").parse().expect("ts");
    let local = next.to_zoned(jiff::tz::TimeZone::get("America/New_York").expect("tz"));
    assert_eq!((local.hour(), local.minute()), (9, 0), "9:00 in New York: {local}");
    assert_eq!(r.body["cron"], r.body["cron_job"], "the suites read `cron`");
    // The suites' shape; registering the same name again is an update (200).
    let r = s.post("/ojs/v1/cron", json!({"name": "cleanup", "expression": "@hourly", "overlap_policy": "allow", "job_template": {"type": "cache.clean", "args": [], "options": {"queue": "maint"}}})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = s.post("/ojs/v1/cron", json!({"name": "beat", "expression": "@every 1h30m", "job_template": {"type": "cache.warm"}})).await;
    assert_eq!((r.status, r.body["cron"]["expression"].as_str()), (StatusCode::CREATED, Some("@every 1h30m")), "{}", r.text);
    let next: jiff::Timestamp = r.body["cron"]["next_run_at"].as_str().and_then(|t| t.parse().ok()).expect("next_run_at");
    let ahead = next.duration_since(jiff::Timestamp::now()).as_secs();
    assert!((5390..=5400).contains(&ahead), "an interval from registration: {ahead}s");
    assert_eq!(s.call("DELETE", "/ojs/v1/cron/beat", None).await.status, StatusCode::OK);
    let r = s.post("/ojs/v1/cron", json!({"name": "cleanup", "expression": "*/5 * * * *", "job_template": {"type": "cache.clean"}})).await;
    assert_eq!((r.status, r.body["cron"]["expression"].as_str()), (StatusCode::OK, Some("*/5 * * * *")), "{}", r.text);

    let r = s.get("/ojs/v1/cron").await;
    let names: Vec<&str> = r.body["crons"].as_array().expect("crons").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["cleanup", "daily-report"]);
    assert_eq!(r.body["cron_jobs"], r.body["crons"]);
    assert_eq!(s.get("/ojs/v1/cron/cleanup").await.body["cron_job"]["name"], "cleanup");

    let r = s.call("PATCH", "/ojs/v1/cron/cleanup", Some(json!({"enabled": false}))).await;
    assert_eq!((r.body["cron_job"]["enabled"].as_bool(), r.body["cron_job"]["next_run_at"].clone()), (Some(false), Value::Null), "{}", r.text);
    assert_eq!(s.get("/ojs/v1/cron?enabled=true").await.body["count"], 1);
    let r = s.post("/ojs/v1/cron/cleanup/resume", json!({})).await;
    assert!(r.body["cron_job"]["next_run_at"].is_string(), "{}", r.text);
    assert_eq!(s.post("/ojs/v1/cron/cleanup/pause", json!({})).await.body["cron"]["status"], "paused");

    let r = s.call("DELETE", "/ojs/v1/cron/cleanup", None).await;
    assert_eq!((r.status, r.body["deleted"].as_bool(), r.body["name"].as_str()), (StatusCode::OK, Some(true), Some("cleanup")));
    let r = s.call("DELETE", "/ojs/v1/cron/cleanup", None).await;
    assert_eq!((r.status, r.body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    assert_eq!(s.get("/ojs/v1/cron/nope").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn invalid_registrations_name_the_field_and_save_nothing() {
    let s = TestServer::new().await;
    let base = || json!({"name": "x", "cron": "* * * * *", "type": "a.b"});
    let with = |k: &str, v: Value| {
        let mut b = base();
        b[k] = v;
        b
    };
    let mut suite_shaped = json!({"name": "x", "expression": "99 25 32 13 8", "job_template": {"type": "a.b"}});
    let cases = [
        (with("cron", json!("not a valid cron")), "cron"),
        (with("cron", json!("0 0 0 0 0 0 0")), "cron"),
        (with("cron", json!("*/0 * * * *")), "cron"),
        (with("cron", json!("")), "cron"),
        (with("cron", json!("@every 500ms")), "cron"),
        (with("cron", json!("@every soon")), "cron"),
        (with("cron", json!("@every 100000000h")), "cron"),
        (json!({"name": "x", "expression": "@every 8761h", "job_template": {"type": "a.b"}}), "expression"),
        (suite_shaped.take(), "expression"),
        (with("timezone", json!("EST")), "timezone"),
        (with("timezone", json!("+05:00")), "timezone"),
        (with("timezone", json!("Mars/Olympus")), "timezone"),
        (with("name", json!("Bad Name")), "name"),
        (with("overlap_policy", json!("sometimes")), "overlap_policy"),
        (with("type", json!("Not.A.Type")), "type"),
        (with("args", json!({"a": 1})), "args"),
        (json!({"name": "x", "expression": "* * * * *", "job_template": {"type": "a.b", "options": {"priority": 500}}}), "job_template.options.priority"),
        (json!({"name": "x", "type": "a.b"}), "cron"),
    ];
    for (body, field) in cases {
        let r = s.post("/ojs/v1/cron", body.clone()).await;
        assert!(r.status == StatusCode::BAD_REQUEST || r.status == StatusCode::UNPROCESSABLE_ENTITY, "{body}: {}", r.text);
        assert_eq!(r.error_field(), Some(field), "{body}: {}", r.text);
        assert!(!r.body["error"]["message"].as_str().unwrap_or("").is_empty());
    }
    assert_eq!(s.get("/ojs/v1/cron").await.body["count"], 0, "nothing half-saved");
}

#[tokio::test]
async fn fires_on_schedule_and_trigger_enqueues_now() {
    let s = TestServer::new().await;
    let r = s.post("/ojs/v1/cron", json!({"name": "tick", "cron": "*/2 * * * * *", "overlap_policy": "allow", "type": "cron.tick", "args": [7], "options": {"queue": "ticks"}})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let first: jiff::Timestamp = r.body["cron"]["next_run_at"].as_str().expect("next").parse().expect("ts");
    // Nothing is due before the first tick.
    run_pass(&s.db.store, &s.state.metrics).await.expect("pass");
    if jiff::Timestamp::now() < first {
        assert_eq!(s.fetch("ticks").await, Value::Null);
    }
    // Passes every 100 ms until three ticks have fired (one pass fires at most one tick).
    let fired = || async {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT meta->>'cron_triggered_at', to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')
             FROM jobs WHERE queue = 'ticks' ORDER BY (meta->>'cron_triggered_at')::timestamptz",
        )
        .fetch_all(s.db.store.pool())
        .await
        .expect("fired ticks");
        rows.into_iter().map(|(tick, created)| (tick.parse::<jiff::Timestamp>().expect("tick"), created.parse::<jiff::Timestamp>().expect("created"))).collect::<Vec<_>>()
    };
    let deadline = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60);
    while fired().await.len() < 3 {
        assert!(jiff::Timestamp::now() < deadline, "three ticks in a minute: {:?}", fired().await);
        run_pass(&s.db.store, &s.state.metrics).await.expect("pass");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fired = fired().await;
    let two = jiff::SignedDuration::from_secs(2);
    assert_eq!(fired.len(), 3, "{fired:?}");
    assert_eq!(fired[0].0, first, "the first tick is the one announced");
    for (i, pair) in fired.windows(2).enumerate() {
        let ((a, a_fired), (b, _)) = (pair[0], pair[1]);
        let apart = b.duration_since(a);
        assert!(apart >= two && apart.as_millis() % 2000 == 0, "ticks every two seconds, each once: {fired:?}");
        // Catch-up fires once: a tick is left out only when the one before it fired at or
        // after it (a pass stalled on a loaded machine), never when that one was on time.
        assert!(apart == two || a_fired >= b - two, "tick {i} fired on time, yet the next was left out: {fired:?}");
    }
    let mut fetched = 0;
    loop {
        let job = s.fetch("ticks").await;
        if job.is_null() {
            break;
        }
        assert_eq!((job["type"].as_str(), job["args"].clone(), job["meta"]["cron_name"].as_str()), (Some("cron.tick"), json!([7]), Some("tick")));
        fetched += 1;
    }
    assert_eq!(fetched, 3, "each tick's job, fetched");
    let cron = s.get("/ojs/v1/cron/tick").await;
    assert_eq!((cron.body["cron"]["run_count"].as_i64(), cron.body["cron"]["last_outcome"].as_str()), (Some(3), Some("enqueued")));

    let r = s.get("/ojs/v1/events?types=cron.triggered&limit=10").await;
    let events = r.body["events"].as_array().expect("events");
    assert_eq!(events.len(), 3, "{}", r.text);
    assert_eq!((events[0]["data"]["cron_name"].as_str(), events[0]["data"]["cron_expression"].as_str()), (Some("tick"), Some("*/2 * * * * *")));
    assert!(events[0]["data"]["job_id"].is_string() && events[0]["data"]["scheduled_time"].is_string());
    let r = s.get("/ojs/v1/events?queues=ticks&limit=50").await;
    let types: Vec<&str> = r.body["events"].as_array().expect("events").iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(types.contains(&"cron.triggered") && types.contains(&"job.enqueued"), "{types:?}");

    let r = s.post("/ojs/v1/cron/tick/trigger", json!({})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!((r.body["job"]["state"].as_str(), r.body["cron"]["last_outcome"].as_str()), (Some("available"), Some("triggered")));
    assert_eq!(s.post("/ojs/v1/cron/nope/trigger", json!({})).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn template_timeout_and_meta_apply_to_every_job() {
    let s = TestServer::new().await;
    // The spec's shape: `options.timeout` in seconds; `options.meta` under the template's `meta`,
    // which wins on a clash.
    let r = s
        .post("/ojs/v1/cron", json!({"name": "report", "cron": "0 9 * * *", "type": "report.generate", "meta": {"team": "top", "a": 1}, "options": {"queue": "reports", "timeout": 300, "meta": {"team": "options", "b": 2}}}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["cron"]["options"], json!({"queue": "reports", "timeout": 300, "meta": {"team": "options", "b": 2}}), "options echoed as sent");
    let r = s.post("/ojs/v1/cron/report/trigger", json!({})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let job = &r.body["job"];
    assert_eq!(job["timeout_ms"], 300_000, "{job}");
    assert_eq!((job["meta"]["team"].as_str(), job["meta"]["a"].as_i64(), job["meta"]["b"].as_i64(), job["meta"]["cron_name"].as_str()), (Some("top"), Some(1), Some(2), Some("report")), "{job}");
    // The suites' shape, and a scheduled tick rather than a manual trigger.
    let r = s.post("/ojs/v1/cron", json!({"name": "warm", "expression": "@hourly", "overlap_policy": "allow", "job_template": {"type": "cache.warm", "options": {"queue": "warm", "timeout": 5, "meta": {"k": "v"}}}})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    sqlx::query("UPDATE cron_jobs SET next_run_at = date_trunc('minute', now()) - interval '1 minute' WHERE name = 'warm'").execute(s.db.store.pool()).await.expect("make due");
    run_pass(&s.db.store, &s.state.metrics).await.expect("pass");
    let job = s.fetch("warm").await;
    assert_eq!((job["timeout_ms"].as_i64(), job["meta"]["k"].as_str(), job["meta"]["cron_name"].as_str()), (Some(5000), Some("v"), Some("warm")), "{job}");

    let base = |options: Value| json!({"name": "bad", "cron": "@daily", "type": "a.b", "options": options});
    let cases = [
        (base(json!({"timeout": 0})), "options.timeout"),
        (base(json!({"timeout": -5})), "options.timeout"),
        (base(json!({"timeout": 1.5})), "options.timeout"),
        (base(json!({"timeout": "30"})), "options.timeout"),
        (base(json!({"timeout": 604_801})), "options.timeout"),
        (base(json!({"timeout": 30, "timeout_ms": 30_000})), "options.timeout"),
        (base(json!({"meta": ["x"]})), "options.meta"),
        (json!({"name": "bad", "expression": "@daily", "job_template": {"type": "a.b", "options": {"timeout": 1e9}}}), "job_template.options.timeout"),
    ];
    for (body, field) in cases {
        let r = s.post("/ojs/v1/cron", body.clone()).await;
        assert!(r.status == StatusCode::BAD_REQUEST || r.status == StatusCode::UNPROCESSABLE_ENTITY, "{body}: {}", r.text);
        assert_eq!(r.error_field(), Some(field), "{body}: {}", r.text);
    }
    let r = s.post("/ojs/v1/cron", base(json!({"timeout": 604_800}))).await;
    assert_eq!(r.status, StatusCode::CREATED, "seven days is the longest timeout: {}", r.text);
}

/// A template's `rate_limit` applies to every job it makes: each tick's job shares the key,
/// so with a concurrency of 1 a second tick's job waits while the first is unfinished, and
/// the window, the throttle and `on_limit` come along. The template is
/// echoed as sent.
#[tokio::test]
async fn a_template_s_rate_limit_applies_to_every_job_it_makes() {
    let s = TestServer::new().await;
    let options = json!({"queue": "feeds", "rate_limit": {"key": "feed:acme", "concurrency": 1, "rate": {"limit": 2, "period": "PT1H"},
                                                          "throttle": {"limit": 6, "period": "PT1H"}, "on_limit": "drop"}});
    let r = s.post("/ojs/v1/cron", json!({"name": "feed", "expression": "@hourly", "overlap_policy": "allow", "job_template": {"type": "feed.pull", "options": options}})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["cron"]["job_template"]["options"]["rate_limit"]["key"], "feed:acme", "echoed: {}", r.text);
    let first = s.post("/ojs/v1/cron/feed/trigger", json!({})).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    assert_eq!(first.body["job"]["state"], "available", "{}", first.text);
    let job = s.db.store.get_job(first.body["job"]["id"].as_str().unwrap_or_default().parse().expect("id")).await.expect("read").expect("job");
    assert_eq!(job.rate_limit_key.as_deref(), Some("feed:acme"));
    let fetched = s.fetch("feeds").await;
    assert_eq!(fetched["id"], first.body["job"]["id"]);
    // The key's one slot is taken: the next tick's job is dropped (on_limit), not left waiting.
    let second = s.post("/ojs/v1/cron/feed/trigger", json!({})).await;
    assert_eq!(second.status, StatusCode::CREATED, "{}", second.text);
    assert_eq!(second.body["job"]["state"], "discarded", "{}", second.text);
    let r = s.get("/ojs/v1/rate-limits/feed:acme").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!((r.body["concurrency"]["limit"].as_i64(), r.body["concurrency"]["active"].as_i64(), r.body["waiting_count"].as_i64()), (Some(1), Some(1), Some(0)), "the template set the key's limit: {}", r.text);
    assert_eq!((r.body["rate"]["limit"].as_i64(), r.body["rate"]["period"].as_str(), r.body["rate"]["current_count"].as_i64()), (Some(2), Some("PT1H"), Some(1)), "and its window: {}", r.text);
    assert_eq!(r.body["limit"]["throttle"], json!({"limit": 6, "period": "PT1H"}), "and its throttle: {}", r.text);
}

#[tokio::test]
async fn lookups_of_impossible_names_are_not_found() {
    let s = TestServer::new().await;
    for (method, path, body) in [
        ("GET", "/ojs/v1/cron/Daily-Report", None),
        ("DELETE", "/ojs/v1/cron/Daily-Report", None),
        ("PATCH", "/ojs/v1/cron/Daily-Report", Some(json!({"enabled": false}))),
        ("POST", "/ojs/v1/cron/Daily-Report/pause", Some(json!({}))),
        ("POST", "/ojs/v1/cron/Daily-Report/resume", Some(json!({}))),
        ("POST", "/ojs/v1/cron/Daily-Report/trigger", Some(json!({}))),
        ("GET", "/ojs/v1/cron/has%20space", None),
    ] {
        let r = s.call(method, path, body).await;
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")), "{method} {path}: {}", r.text);
    }
    // Registering under such a name is still refused as invalid.
    let r = s.post("/ojs/v1/cron", json!({"name": "Daily-Report", "cron": "@daily", "type": "a.b"})).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("name")), "{}", r.text);
}
