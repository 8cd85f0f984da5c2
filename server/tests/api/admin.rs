//! The OJS admin API, the dead-letter extension, the graceful-shutdown behaviour of the worker
//! protocol and queue rate limits over HTTP.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::common::TestServer;

fn id(job: &Value) -> String {
    job["id"].as_str().unwrap_or_else(|| panic!("no id in {job}")).to_owned()
}

/// `GET /admin/jobs?type=`: a type exactly, or every type under a prefix (`admin.*`), counted
/// and listed alike, newest or oldest first; anything else names the field.
#[tokio::test]
async fn admin_jobs_by_type_or_type_prefix() {
    let s = TestServer::new().await;
    for i in 0..5 {
        s.enqueue(json!({"type": "admin.list", "args": [i], "options": {"queue": "aq"}})).await;
    }
    s.enqueue(json!({"type": "admin.list.deep", "args": [9], "options": {"queue": "other"}})).await;
    s.enqueue(json!({"type": "administer", "args": [10], "options": {"queue": "other"}})).await;
    for (query, total) in [("type=admin.list", 5), ("type=admin.*", 6), ("type=admin.list.*", 1), ("type=admin.*&queue=aq", 5), ("type=admin.*&state=available", 6), ("type=admin.*&state=completed", 0)] {
        let r = s.get(&format!("/ojs/v1/admin/jobs?{query}&per_page=100")).await;
        assert_eq!((r.status, r.body["pagination"]["total"].as_i64(), r.body["items"].as_array().map(Vec::len)),
            (StatusCode::OK, Some(total), Some(usize::try_from(total).unwrap_or(0))), "{query}: {}", r.text);
    }
    // Oldest first, page by page; a page asked for first is found from the start, and the
    // pages of one order are not taken for the other's.
    let args = |r: &crate::common::Reply| r.body["items"].as_array().into_iter().flatten().filter_map(|j| j["args"][0].as_i64()).collect::<Vec<_>>();
    let r = s.get("/ojs/v1/admin/jobs?type=admin.list&per_page=2&page=2&order=asc").await;
    assert_eq!((r.status, args(&r)), (StatusCode::OK, vec![2, 3]), "{}", r.text);
    let mut seen = Vec::new();
    for page in 1..=3 {
        let r = s.get(&format!("/ojs/v1/admin/jobs?type=admin.list&per_page=2&page={page}&sort=created_at&order=asc")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        seen.extend(args(&r));
    }
    assert_eq!(seen, [0, 1, 2, 3, 4]);
    assert_eq!(args(&s.get("/ojs/v1/admin/jobs?type=admin.list&per_page=2&page=2").await), [2, 1], "newest first");
    assert_eq!(args(&s.get("/ojs/v1/admin/jobs?type=admin.list&per_page=2&page=3&order=desc").await), [0]);
    assert_eq!(s.get("/ojs/v1/admin/jobs?order=up").await.error_field(), Some("order"));
    assert_eq!(s.get("/ojs/v1/admin/jobs?sort=sideways").await.error_field(), Some("sort"));
    assert_eq!(s.get("/ojs/v1/admin/jobs?sort=priority&page=501").await.error_field(), Some("page"), "past the sorted window");
    for i in 0..4 {
        // Priorities 0, 5, -5, 10; the last is scheduled an hour from now.
        let priority = [0, 5, -5, 10][i];
        let mut options = json!({"queue": "sorted", "priority": priority});
        if i == 3 {
            options["delay_until"] = json!(jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_hours(1)).unwrap().to_string());
        }
        s.enqueue(json!({"type": "admin.sorted", "args": [i], "options": options})).await;
    }
    for (query, expected) in [
        ("sort=priority", vec![3, 1, 0, 2]),
        ("sort=priority&order=asc", vec![2, 0, 1, 3]),
        ("sort=priority&state=available", vec![1, 0, 2]),
        ("sort=scheduled_at", vec![3, 2, 1, 0]),
        ("sort=scheduled_at&order=asc&per_page=2&page=2", vec![2, 3]),
    ] {
        let r = s.get(&format!("/ojs/v1/admin/jobs?queue=sorted&{query}")).await;
        assert_eq!((r.status, args(&r)), (StatusCode::OK, expected), "{query}: {}", r.text);
    }
    for bad in ["*", "admin*", "Admin.*", "admin..*", ".*"] {
        let r = s.get(&format!("/ojs/v1/admin/jobs?type={bad}")).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("type")), "{bad}: {}", r.text);
    }
}

#[tokio::test]
async fn admin_queues_jobs_and_stats() {
    let s = TestServer::new().await;
    for i in 0..5 {
        s.enqueue(json!({"type": "admin.list", "args": [i], "options": {"queue": "aq"}})).await;
    }
    s.fetch("aq").await;
    let r = s.get("/ojs/v1/admin/queues").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let q = &r.body["items"][0];
    assert_eq!((q["name"].as_str(), q["state"].as_str(), q["counts"]["available"].as_i64(), q["counts"]["active"].as_i64()), (Some("aq"), Some("active"), Some(4), Some(1)));
    assert_eq!(r.body["pagination"]["total"], 1);
    let r = s.get("/ojs/v1/admin/queues/aq").await;
    assert!(r.body["oldest_available_at"].is_string() && r.body["configuration"].is_object(), "{}", r.text);
    let r = s.post("/ojs/v1/admin/queues/aq/pause", json!({})).await;
    assert_eq!((r.body["name"].as_str(), r.body["paused"].as_bool()), (Some("aq"), Some(true)));
    assert!(r.body["paused_at"].is_string());
    assert_eq!(s.fetch("aq").await, Value::Null);
    assert_eq!(s.post("/ojs/v1/admin/queues/aq/resume", json!({})).await.body["paused"], false);

    // Jobs by page: three pages of two, newest first, then nothing.
    let mut seen = Vec::new();
    for page in 1..=3 {
        let r = s.get(&format!("/ojs/v1/admin/jobs?queue=aq&per_page=2&page={page}")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!((r.body["pagination"]["total"].as_i64(), r.body["pagination"]["page"].as_i64()), (Some(5), Some(page)));
        seen.extend(r.body["items"].as_array().expect("items").iter().map(|j| j["args"][0].as_i64().expect("arg")));
    }
    assert_eq!(seen, [4, 3, 2, 1, 0]);
    let r = s.get("/ojs/v1/admin/jobs?queue=aq&state=active").await;
    assert_eq!(r.body["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(s.get("/ojs/v1/admin/jobs?state=finished").await.error_field(), Some("state"));
    assert_eq!(s.get("/ojs/v1/admin/jobs?per_page=101").await.error_field(), Some("per_page"));

    let job_id = s.get("/ojs/v1/admin/jobs?queue=aq&state=active").await.body["items"][0]["id"].as_str().expect("id").to_owned();
    let r = s.get(&format!("/ojs/v1/admin/jobs/{job_id}")).await;
    assert_eq!((r.body["state"].as_str(), r.body["specversion"].as_str()), (Some("active"), Some("1.0")), "{}", r.text);
    assert!(r.body["retry_policy"]["max_attempts"].is_number() && r.body["metadata"]["started_at"].is_string() && r.body["errors"].is_array());
    let r = s.post(&format!("/ojs/v1/admin/jobs/{job_id}/cancel"), json!({})).await;
    assert_eq!((r.body["job"]["state"].as_str(), r.body["job"]["previous_state"].as_str()), (Some("cancelled"), Some("active")));
    let r = s.post(&format!("/ojs/v1/admin/jobs/{job_id}/retry"), json!({})).await;
    assert_eq!((r.status, r.body["job"]["state"].as_str(), r.body["job"]["attempt"].as_i64()), (StatusCode::OK, Some("available"), Some(0)), "{}", r.text);
    let r = s.post(&format!("/ojs/v1/admin/jobs/{job_id}/retry"), json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "an available job cannot be retried");

    let r = s.get("/ojs/v1/admin/stats").await;
    assert_eq!((r.body["queues"].as_i64(), r.body["jobs"]["available"].as_i64()), (Some(1), Some(5)), "{}", r.text);
    assert!(r.body["throughput"]["processed_per_minute"].is_number() && r.body["uptime_seconds"].is_number());
    let r = s.get("/ojs/v1/admin/stats/history?period=1m").await;
    assert_eq!((r.status, r.body["period"].as_str()), (StatusCode::OK, Some("1m")), "{}", r.text);
    assert!(r.body["data"].as_array().is_some_and(|d| !d.is_empty() && d[0]["timestamp"].is_string()));
    assert_eq!(s.get("/ojs/v1/admin/stats/history?period=2m").await.error_field(), Some("period"));
    let r = s.get("/ojs/v1/admin/system/config").await;
    assert_eq!(r.body["implementation"]["name"], "rebound");
    assert_eq!(r.body["maintenance"], json!({"maintenance": false}));
}

#[tokio::test]
async fn readiness_fails_while_the_schema_is_behind_the_server() {
    let s = TestServer::new().await;
    let r = s.get("/readyz").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)").execute(s.db.store.pool()).await.expect("forget one");
    tokio::time::sleep(rebound_server::health::PROBE_FRESH).await;
    let r = s.get("/readyz").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert!(r.text.contains("1 migration(s) behind") && r.text.contains("rebound-server migrate"), "{}", r.text);
}

#[tokio::test]
async fn maintenance_mode_holds_fetches_and_keeps_enqueues() {
    let s = TestServer::new().await;
    let before = s.enqueue(json!({"type": "m.job", "args": [], "options": {"queue": "mq"}})).await;
    for (body, field) in [
        (json!({}), "enabled"),
        (json!({"enabled": "yes"}), "enabled"),
        (json!({"enabled": true, "estimated_duration": "half an hour"}), "estimated_duration"),
        (json!({"enabled": true, "reason": "x".repeat(1001)}), "reason"),
        (json!({"enabled": true, "until": "later"}), "until"),
    ] {
        let r = s.post("/ojs/v1/admin/system/maintenance", body.clone()).await;
        assert!(r.status == StatusCode::BAD_REQUEST || r.status == StatusCode::UNPROCESSABLE_ENTITY, "{body}: {}", r.text);
        assert_eq!(r.error_field(), Some(field), "{body}: {}", r.text);
    }
    assert_eq!(s.get("/ojs/v1/admin/system/config").await.body["maintenance"]["maintenance"], false, "nothing half-applied");

    let r = s.post("/ojs/v1/admin/system/maintenance", json!({"enabled": true, "reason": "Database migration in progress", "estimated_duration": "PT30M"})).await;
    assert_eq!((r.status, r.body["maintenance"].as_bool(), r.body["reason"].as_str()), (StatusCode::OK, Some(true), Some("Database migration in progress")), "{}", r.text);
    let (start, end): (jiff::Timestamp, jiff::Timestamp) = (r.body["enabled_at"].as_str().unwrap().parse().unwrap(), r.body["estimated_end"].as_str().unwrap().parse().unwrap());
    assert_eq!(end.duration_since(start).as_secs(), 1800);
    assert_eq!(s.get("/ojs/v1/admin/system/config").await.body["maintenance"]["reason"], "Database migration in progress");

    assert_eq!(s.fetch("mq").await, Value::Null, "nothing handed out");
    let during = s.enqueue(json!({"type": "m.job", "args": [], "options": {"queue": "mq"}})).await;
    assert_eq!(during["state"], "available", "enqueues are accepted");

    let r = s.post("/ojs/v1/admin/system/maintenance", json!({"enabled": false})).await;
    assert_eq!((r.status, r.body["maintenance"].as_bool()), (StatusCode::OK, Some(false)), "{}", r.text);
    let first = s.fetch("mq").await;
    let second = s.fetch("mq").await;
    let fetched = [first["id"].as_str(), second["id"].as_str()];
    assert_eq!(fetched, [before["id"].as_str(), during["id"].as_str()], "both jobs run once it is off");
    let audit = s.db.store.audit_log(&Default::default()).await.expect("audit");
    assert!(audit.iter().any(|e| e.action == "system.maintenance_on") && audit.iter().any(|e| e.action == "system.maintenance_off"));
}

#[tokio::test]
async fn bulk_operations_and_purges_demand_confirmation() {
    let s = TestServer::new().await;
    let dead = [s.dead_letter("bq", "Db.Down").await, s.dead_letter("bq", "Db.Down").await];
    let live = s.enqueue(json!({"type": "admin.job", "args": [], "options": {"queue": "bq"}})).await;
    let filter = json!({"queue": "bq"});
    for (path, body) in [
        ("/ojs/v1/admin/jobs/bulk/retry", json!({"filter": filter})),
        ("/ojs/v1/admin/jobs/bulk/delete", json!({"filter": filter, "confirm": false})),
        ("/ojs/v1/admin/jobs/bulk/cancel", json!({"filter": filter, "confirm": "yes"})),
        ("/ojs/v1/dead-letter/retry", json!({"filter": filter})),
    ] {
        let r = s.post(path, body).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("confirm")), "{path}: {}", r.text);
    }
    for (path, body) in [
        ("/ojs/v1/admin/queues/bq/jobs", json!({"states": ["discarded"]})),
        ("/ojs/v1/admin/dead-letter", json!({"queue": "bq"})),
        ("/ojs/v1/dead-letter", json!({"queue": "bq", "confirm": false})),
    ] {
        let r = s.call("DELETE", path, Some(body)).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("confirm")), "{path}: {}", r.text);
    }
    assert_eq!(s.job_count().await, 3, "nothing changed without confirmation");

    // Bulk retry: the two discarded jobs run again; the available one is reported, not retried.
    let r = s.post("/ojs/v1/admin/jobs/bulk/retry", json!({"filter": filter, "confirm": true})).await;
    assert_eq!((r.body["action"].as_str(), r.body["matched"].as_i64(), r.body["succeeded"].as_i64(), r.body["failed"].as_i64()), (Some("retry"), Some(3), Some(2), Some(1)), "{}", r.text);
    assert_eq!(r.body["errors"][0]["job_id"], live["id"]);
    let r = s.post("/ojs/v1/admin/jobs/bulk/cancel", json!({"filter": filter, "confirm": true})).await;
    assert_eq!(r.body["succeeded"], 3, "{}", r.text);
    let r = s.post("/ojs/v1/admin/jobs/bulk/delete", json!({"filter": {"queue": "bq", "state": "cancelled"}, "confirm": true})).await;
    assert_eq!((r.body["matched"].as_i64(), r.body["succeeded"].as_i64()), (Some(3), Some(3)), "{}", r.text);
    assert_eq!(s.job_count().await, 0);
    let _ = dead;

    // Queue purge by state (active refused) and age.
    for i in 0..3 {
        s.enqueue(json!({"type": "admin.job", "args": [i], "options": {"queue": "pq"}})).await;
    }
    let r = s.call("DELETE", "/ojs/v1/admin/queues/pq/jobs", Some(json!({"states": ["active"], "confirm": true}))).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("states")), "{}", r.text);
    let r = s.call("DELETE", "/ojs/v1/admin/queues/pq/jobs", Some(json!({"states": ["available"], "older_than": "2000-01-01T00:00:00Z", "confirm": true}))).await;
    assert_eq!(r.body["purged_count"], 0, "{}", r.text);
    let r = s.call("DELETE", "/ojs/v1/admin/queues/pq/jobs", Some(json!({"states": ["available"], "confirm": true}))).await;
    assert_eq!((r.body["purged_count"].as_i64(), r.body["states"].clone(), r.body["has_more"].as_bool()), (Some(3), json!(["available"]), Some(false)), "{}", r.text);
    let audit = s.db.store.audit_log(&Default::default()).await.expect("audit");
    for action in ["job.bulk_retry", "job.bulk_cancel", "job.bulk_delete", "queue.purge"] {
        assert!(audit.iter().any(|e| e.action == action), "{action} audited");
    }
}

/// A bulk cancel names each job it matched but could not cancel, as retry and delete do:
/// `failed` is never a bare count beside an empty `errors`.
#[tokio::test]
async fn bulk_cancel_names_the_jobs_it_could_not_cancel() {
    let s = TestServer::new().await;
    let done = s.enqueue(json!({"type": "admin.job", "args": [1], "options": {"queue": "bc"}})).await;
    assert_eq!(s.fetch("bc").await["id"], done["id"]);
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": done["id"], "result": {}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let waiting = s.enqueue(json!({"type": "admin.job", "args": [2], "options": {"queue": "bc"}})).await;
    let r = s.post("/ojs/v1/admin/jobs/bulk/cancel", json!({"filter": {"queue": "bc"}, "confirm": true})).await;
    assert_eq!((r.body["matched"].as_i64(), r.body["succeeded"].as_i64(), r.body["failed"].as_i64()), (Some(2), Some(1), Some(1)), "{}", r.text);
    let errors = r.body["errors"].as_array().unwrap_or_else(|| panic!("no errors in {}", r.text));
    assert_eq!((errors.len(), &errors[0]["job_id"]), (1, &done["id"]), "{}", r.text);
    assert!(errors[0]["error"].as_str().is_some_and(|e| e.contains("completed")), "{}", r.text);
    assert_eq!(s.get(&format!("/ojs/v1/jobs/{}", id(&waiting))).await.body["job"]["state"], "cancelled");
    assert_eq!(s.get(&format!("/ojs/v1/jobs/{}", id(&done))).await.body["job"]["state"], "completed");
}

#[tokio::test]
async fn dead_letter_extension_get_bulk_retry_purge_and_stats() {
    let s = TestServer::new().await;
    let a = s.dead_letter("billing", "DatabaseConnectionError").await;
    let b = s.dead_letter("billing", "TimeoutError").await;
    let c = s.dead_letter("email", "DatabaseConnectionError").await;
    let r = s.get(&format!("/ojs/v1/dead-letter/{a}")).await;
    assert_eq!((r.status, r.body["job"]["errors"][0]["type"].as_str()), (StatusCode::OK, Some("DatabaseConnectionError")), "{}", r.text);
    let live = s.enqueue(json!({"type": "x.y", "args": []})).await;
    assert_eq!(s.get(&format!("/ojs/v1/dead-letter/{}", id(&live))).await.status, StatusCode::NOT_FOUND, "not a dead letter");

    let r = s.get("/ojs/v1/dead-letter/stats").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["total"], 3);
    assert_eq!(r.body["by_queue"], json!({"billing": 2, "email": 1}));
    assert_eq!(r.body["by_error_type"], json!({"DatabaseConnectionError": 2, "TimeoutError": 1}));
    assert!(r.body["oldest_at"].is_string() && r.body["newest_at"].is_string());
    assert_eq!((r.body["retention"]["max_age"].as_str(), r.body["retention"]["max_count"].as_i64()), (Some("PT4320H"), Some(10_000)), "180 days");
    // A server that prunes (`--prune`) reports its own.
    let retention = rebound_queue::store::PruneConfig { dead_letters_after: std::time::Duration::from_secs(3600), dead_letters_per_queue: 7, ..Default::default() };
    let pruning = TestServer::with_config(rebound_server::config::ServerConfig { retention: Some(retention), api_auth: rebound_server::config::ApiAuth::None, ..Default::default() }).await;
    let r = pruning.get("/ojs/v1/dead-letter/stats").await;
    assert_eq!((r.body["retention"]["max_age"].as_str(), r.body["retention"]["max_count"].as_i64()), (Some("PT1H"), Some(7)), "{}", r.text);
    assert!(r.body["retention"]["source"].as_str().is_some_and(|s| s.contains("--prune")), "{}", r.text);
    // A type, or a prefix of types (`dead.*`, not `de.*`), in the stats and the list alike.
    for (query, n) in [("type=dead.job", 3), ("type=dead.*", 3), ("type=de.*", 0)] {
        assert_eq!(s.get(&format!("/ojs/v1/dead-letter/stats?{query}")).await.body["total"], n, "{query}");
        let r = s.get(&format!("/ojs/v1/dead-letter?{query}")).await;
        assert_eq!(r.body["jobs"].as_array().map(Vec::len), Some(n), "{query}: {}", r.text);
    }
    for bad in ["/ojs/v1/dead-letter/stats?type=dead*", "/ojs/v1/dead-letter?type=Dead.*"] {
        assert_eq!(s.get(bad).await.error_field(), Some("type"), "{bad}");
    }

    let r = s.post("/ojs/v1/dead-letter/retry", json!({"filter": {"queue": "billing", "error_type": "DatabaseConnectionError"}, "confirm": true})).await;
    assert_eq!(r.body["retried"], 1, "{}", r.text);
    assert_eq!(s.get(&format!("/ojs/v1/jobs/{a}")).await.body["job"]["state"], "available");
    let r = s.call("DELETE", "/ojs/v1/dead-letter", Some(json!({"queue": "billing", "confirm": true}))).await;
    assert_eq!(r.body["purged_count"], 1, "{}", r.text);
    assert_eq!(s.get(&format!("/ojs/v1/jobs/{b}")).await.status, StatusCode::NOT_FOUND);
    // The admin path lists and retries dead letters too.
    let r = s.get("/ojs/v1/admin/dead-letter?queue=email").await;
    assert_eq!((r.body["items"][0]["id"].as_str(), r.body["pagination"]["total"].as_i64()), (Some(c.as_str()), Some(1)), "{}", r.text);
    let r = s.post(&format!("/ojs/v1/admin/dead-letter/{c}/retry"), json!({})).await;
    assert_eq!(r.body["job"]["state"], "available");
    assert_eq!(s.get("/ojs/v1/dead-letter/stats").await.body["total"], 0);
    // Each was an OJS dead-letter event, newest first, with who did it.
    let r = s.get("/ojs/v1/events?types=dead_letter.retried,dead_letter.deleted,dead_letter.pruned").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let seen: Vec<(&str, &str, &str)> = r.body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| Some((e["type"].as_str()?, e["subject"].as_str()?, e["data"]["queue"].as_str()?)))
        .collect();
    assert_eq!(
        seen,
        [("dead_letter.retried", c.as_str(), "email"), ("dead_letter.deleted", b.as_str(), "billing"), ("dead_letter.retried", a.as_str(), "billing")],
        "{}",
        r.text
    );
    assert!(r.body["events"][0]["data"]["retried_by"].is_string() && r.body["events"][1]["data"]["deleted_by"].is_string(), "{}", r.text);
    assert_eq!(r.body["events"][1]["source"], "ojs://rebound/dead-letter");
}

#[tokio::test]
async fn a_dead_letter_is_retried_with_an_override() {
    let s = TestServer::new().await;
    let a = s.dead_letter("billing", "DatabaseConnectionError").await;
    // A refused change names its field and leaves the dead letter as it was.
    for (changes, field) in [
        (json!({"queue": "Bad Queue"}), "override.queue"),
        (json!({"meta": [1]}), "override.meta"),
        (json!({"args": {"a": 1}}), "override.args"),
        (json!({"priority": 500}), "override.priority"),
        (json!({"retry": {"max_attempts": -1}}), "override.retry.max_attempts"),
        (json!({"retry": "often"}), "override.retry"),
        (json!({"queues": "billing-retry"}), "override.queues"),
    ] {
        let r = s.post(&format!("/ojs/v1/dead-letter/{a}/retry"), json!({"override": changes})).await;
        assert!(r.status == StatusCode::BAD_REQUEST || r.status == StatusCode::UNPROCESSABLE_ENTITY, "{changes}: {}", r.text);
        assert_eq!(r.error_field(), Some(field), "{changes}: {}", r.text);
    }
    let unchanged = s.get(&format!("/ojs/v1/dead-letter/{a}")).await;
    assert_eq!((unchanged.status, unchanged.body["job"]["queue"].as_str()), (StatusCode::OK, Some("billing")), "{}", unchanged.text);

    // The spec's example, plus new args and a priority.
    let changes = json!({"queue": "billing-retry", "meta": {"retry_source": "manual_dlq_retry"}, "retry": {"max_attempts": 2},
                         "args": [{"fixed": true}], "priority": 5});
    let r = s.post(&format!("/ojs/v1/dead-letter/{a}/retry"), json!({"override": changes})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let job = &r.body["job"];
    assert_eq!((job["state"].as_str(), job["queue"].as_str(), job["priority"].as_i64(), job["max_attempts"].as_i64()), (Some("available"), Some("billing-retry"), Some(5), Some(2)), "{job}");
    assert_eq!((job["meta"]["retry_source"].as_str(), job["args"].clone()), (Some("manual_dlq_retry"), json!([{"fixed": true}])), "{job}");
    let stored = s.db.store.job(a.parse().expect("id")).await.expect("job");
    assert_eq!(stored.retry, Some(json!({"max_attempts": 2, "on_exhaustion": "dead_letter"})), "merged over the job's own override");
    let audit = s.db.store.audit_log(&Default::default()).await.expect("audit");
    let entry = audit.iter().find(|e| e.action == "dead_letter.redrive").expect("audited");
    assert_eq!(entry.details["override"]["queue"], "billing-retry", "{}", entry.details);

    // It runs from its new queue, under the merged policy: two failures dead-letter it again.
    for round in 0..2 {
        assert_eq!(s.fetch("billing-retry").await["id"].as_str(), Some(a.as_str()), "round {round}");
        let r = s.post("/ojs/v1/workers/nack", json!({"job_id": a, "error": {"code": "e", "type": "DatabaseConnectionError", "message": "still down"}})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        if round == 0 {
            sqlx::query("UPDATE jobs SET state = 'available', scheduled_at = now() WHERE id = $1::uuid AND state = 'retryable'").bind(&a).execute(s.db.store.pool()).await.expect("due now");
        }
    }
    assert_eq!(s.get(&format!("/ojs/v1/dead-letter/{a}")).await.status, StatusCode::OK, "a dead letter again after two attempts");
    // No body at all: a plain retry, on either path.
    let r = s.call("POST", &format!("/ojs/v1/admin/dead-letter/{a}/retry"), None).await;
    assert_eq!((r.status, r.body["job"]["state"].as_str()), (StatusCode::OK, Some("available")), "{}", r.text);
}

/// An OJS client's heartbeat says what its worker is (worker protocol §4.2, the JS SDK's body):
/// the admin worker list and the `worker.heartbeat` event show it, later beats that say nothing
/// keep it, and a bad value is refused by name before any claim is touched.
#[tokio::test]
async fn an_ojs_heartbeat_says_what_its_worker_is() {
    let s = TestServer::new().await;
    let beat = json!({
        "worker_id": "js-1", "state": "running", "active_jobs": 0, "active_job_ids": [],
        "hostname": "web-1", "pid": 4242, "queues": ["email", "default", "email"], "concurrency": 8, "labels": ["canary"],
    });
    let r = s.post("/ojs/v1/workers/heartbeat", beat).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "js-1", "active_jobs": []})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.get("/ojs/v1/admin/workers/js-1").await;
    assert_eq!(
        (r.body["hostname"].as_str(), r.body["pid"].as_i64(), r.body["queues"].clone(), r.body["concurrency"].as_i64(), r.body["version"].as_str()),
        (Some("web-1"), Some(4242), json!(["email", "default"]), Some(8), Some("ojs/1.0")),
        "a beat that says nothing keeps what the first said: {}",
        r.text
    );
    let r = s.get("/ojs/v1/events?types=worker.heartbeat").await;
    let data = &r.body["events"][1]["data"];
    assert_eq!((data["worker_id"].as_str(), data["queues"].clone(), data["concurrency"].as_i64()), (Some("js-1"), json!(["email", "default"]), Some(8)), "{}", r.text);
    let many: Vec<String> = (0..101).map(|i| format!("q{i}")).collect();
    for (field, bad, named) in [
        ("hostname", json!("h".repeat(256)), "hostname"),
        ("hostname", json!(7), "hostname"),
        ("pid", json!(-1), "pid"),
        ("pid", json!(1u64 << 40), "pid"),
        ("queues", json!("email"), "queues"),
        ("queues", json!(["Bad Queue"]), "queues[0]"),
        ("queues", json!(many), "queues"),
        ("concurrency", json!(1_000_000), "concurrency"),
        ("concurrency", json!(1.5), "concurrency"),
    ] {
        let r = s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "js-2", "active_jobs": [], field: bad})).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some(named)), "{field} = {bad}: {}", r.text);
    }
    assert_eq!(s.get("/ojs/v1/admin/workers/js-2").await.status, StatusCode::NOT_FOUND, "a refused beat registers nothing");
}

#[tokio::test]
async fn workers_quiet_and_stale_deregistration() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "gs.job", "args": [], "options": {"queue": "gs"}})).await;
    s.enqueue(json!({"type": "gs.job", "args": [], "options": {"queue": "gs"}})).await;
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["gs"], "worker_id": "w-1"})).await;
    assert_eq!(r.body["jobs"][0]["id"], job["id"]);
    let beat = |state: &str| json!({"worker_id": "w-1", "active_jobs": [job["id"]], "state": state});
    assert_eq!(s.post("/ojs/v1/workers/heartbeat", beat("running")).await.body["state"], "running");
    let r = s.get("/ojs/v1/admin/workers").await;
    assert_eq!((r.body["items"][0]["id"].as_str(), r.body["summary"]["running"].as_i64()), (Some("w-1"), Some(1)), "{}", r.text);

    // An operator quiets it: the next beat says so, and it is handed no new job.
    let r = s.post("/ojs/v1/admin/workers/w-1/quiet", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.post("/ojs/v1/workers/heartbeat", beat("running")).await;
    assert_eq!((r.body["state"].as_str(), r.body["jobs_extended"].clone()), (Some("quiet"), json!([job["id"]])), "beats still extend its jobs");
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["gs"], "worker_id": "w-1"})).await;
    assert_eq!(r.body["jobs"], json!([]), "a quiet worker gets nothing");
    let r = s.get("/ojs/v1/admin/workers/w-1").await;
    assert_eq!((r.body["active_job_ids"].clone(), r.body["requested_state"].as_str()), (json!([job["id"]]), Some("quiet")));

    // A worker that says it is draining gets nothing either; others still do.
    s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w-2", "active_jobs": [], "state": "quiet"})).await;
    assert_eq!(s.post("/ojs/v1/workers/fetch", json!({"queues": ["gs"], "worker_id": "w-2"})).await.body["jobs"], json!([]));
    assert_eq!(s.post("/ojs/v1/workers/fetch", json!({"queues": ["gs"], "worker_id": "w-3"})).await.body["jobs"].as_array().map(Vec::len), Some(1));

    // A live worker cannot be deregistered; a stale one can. Its job's claim still holds (the
    // worker may only be cut off): left running until the lock lapses.
    assert_eq!(s.call("DELETE", "/ojs/v1/admin/workers/w-1", None).await.status, StatusCode::CONFLICT);
    sqlx::query("UPDATE workers SET last_heartbeat_at = now() - interval '5 minutes' WHERE id = 'w-1'").execute(s.db.store.pool()).await.expect("age");
    assert_eq!(s.get("/ojs/v1/admin/workers").await.body["summary"]["stale"], 1);
    let r = s.call("DELETE", "/ojs/v1/admin/workers/w-1", None).await;
    assert_eq!((r.status, r.body["released_jobs"].as_i64()), (StatusCode::OK, Some(0)), "{}", r.text);
    let j = s.get(&format!("/ojs/v1/jobs/{}", id(&job))).await;
    assert_eq!(j.body["job"]["state"].as_str(), Some("active"), "its claim holds");
    assert_eq!(s.call("DELETE", "/ojs/v1/admin/workers/w-1", None).await.status, StatusCode::NOT_FOUND);

    // A stale worker whose claims have lapsed: its jobs are rescheduled at once, the
    // attempt counted as the rescuer counts a dead worker's (it may have run).
    s.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w-1", "active_jobs": [job["id"]]})).await;
    sqlx::query("UPDATE workers SET last_heartbeat_at = now() - interval '5 minutes' WHERE id = 'w-1'").execute(s.db.store.pool()).await.expect("age");
    sqlx::query("UPDATE jobs SET lock_expires_at = now() - interval '1 second' WHERE id = $1::uuid").bind(id(&job)).execute(s.db.store.pool()).await.expect("lapse");
    let r = s.call("DELETE", "/ojs/v1/admin/workers/w-1", None).await;
    assert_eq!((r.status, r.body["released_jobs"].as_i64()), (StatusCode::OK, Some(1)), "{}", r.text);
    let history: Vec<(String, i32, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT outcome, attempt, worker_id, error_type FROM job_attempts WHERE job_id = $1::uuid")
            .bind(id(&job))
            .fetch_all(s.db.store.pool())
            .await
            .expect("history");
    assert!(
        matches!(history.as_slice(), [(o, 1, Some(w), Some(t))] if o == "retried" && w == "w-1" && t == "rebound.stalled"),
        "{history:?}"
    );
    let j = s.get(&format!("/ojs/v1/jobs/{}", id(&job))).await;
    assert_ne!(j.body["job"]["state"].as_str(), Some("active"), "{}", j.text);
    assert_eq!(s.call("DELETE", "/ojs/v1/admin/workers/w-1", None).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn shutdown_errors_are_always_retried() {
    let s = TestServer::new().await;
    let job = s.enqueue(json!({"type": "gs.stop", "args": [], "options": {"queue": "sd", "retry": {"max_attempts": 3, "initial_interval": "PT1H", "max_interval": "PT2H"}}})).await;
    s.fetch("sd").await;
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": job["id"], "error": {"code": "ShutdownError", "type": "ShutdownError", "message": "grace period over", "retryable": false}})).await;
    assert_eq!(r.body["state"], "retryable", "{}", r.text);
}

#[tokio::test]
async fn queue_rate_limits_over_http() {
    let s = TestServer::new().await;
    let r = s.call("PUT", "/ojs/v1/admin/queues/rl/rate-limit", Some(json!({"rate": {"limit": 2, "period": "PT1H"}, "concurrency": 5}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["rate_limit"], json!({"rate": {"limit": 2, "period": "PT1H"}, "concurrency": 5}));
    for i in 0..4 {
        s.enqueue(json!({"type": "rl.job", "args": [i], "options": {"queue": "rl"}})).await;
    }
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["rl"], "count": 10})).await;
    assert_eq!(r.body["jobs"].as_array().map(Vec::len), Some(2), "two per hour");
    assert_eq!(s.fetch("rl").await, Value::Null);
    let r = s.get("/ojs/v1/rate-limits/queue:rl").await;
    assert_eq!((r.body["rate"]["current_count"].as_i64(), r.body["concurrency"]["active"].as_i64(), r.body["waiting_count"].as_i64()), (Some(2), Some(2), Some(2)), "{}", r.text);
    assert!(r.body["rate"]["window_resets_at"].is_string());
    assert_eq!(s.get("/ojs/v1/rate-limits").await.body["items"][0]["key"], "queue:rl");
    assert_eq!(s.get("/ojs/v1/admin/queues/rl").await.body["configuration"]["rate_limit"]["rate"]["limit"], 2);
    // The suites' shorthand, through the spec's PUT; an empty body removes the limit.
    let r = s.call("PUT", "/ojs/v1/rate-limits/queue:rl", Some(json!({"max_per_second": 1}))).await;
    assert_eq!(r.body["rate_limit"]["throttle"], json!({"limit": 1, "period": "PT1S"}), "{}", r.text);
    assert!(s.fetch("rl").await.is_object());
    assert_eq!(s.fetch("rl").await, Value::Null, "one per second");
    assert_eq!(s.call("PUT", "/ojs/v1/rate-limits/queue:rl", Some(json!({}))).await.body["rate_limit"], Value::Null);
    assert!(s.fetch("rl").await.is_object());
    // Bad input names the field; keyed per-job limits are not offered.
    let r = s.call("PUT", "/ojs/v1/admin/queues/rl/rate-limit", Some(json!({"rate": {"limit": 2, "period": "soon"}}))).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("rate.period")), "{}", r.text);
    let r = s.call("PUT", "/ojs/v1/admin/queues/rl/rate-limit", Some(json!({"throttle": {"limit": 0, "period": "PT1S"}}))).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("throttle.limit")), "{}", r.text);
    let r = s.call("PUT", "/ojs/v1/admin/queues/rl/rate-limit", Some(json!({"max_per_second": 5000}))).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("max_per_second")), "spaced under a millisecond: {}", r.text);
    let r = s.call("PUT", "/ojs/v1/rate-limits/queue:Stripe%20API", Some(json!({"concurrency": 1}))).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("key")), "{}", r.text);
    // A bare key is a keyed partition in the spec, not a queue: unknown until limited, and
    // limiting it limits no queue.
    assert_eq!(s.get("/ojs/v1/rate-limits/stripe-api").await.status, StatusCode::NOT_FOUND);
    let r = s.call("PUT", "/ojs/v1/rate-limits/stripe-api", Some(json!({"concurrency": 0}))).await;
    assert_eq!((r.status, r.body["concurrency"]["limit"].as_i64()), (StatusCode::OK, Some(0)), "{}", r.text);
    assert_eq!(s.get("/ojs/v1/rate-limits/queue:stripe-api").await.status, StatusCode::NOT_FOUND);
    assert_eq!(s.get("/ojs/v1/rate-limits/queue:none").await.status, StatusCode::NOT_FOUND);
}

/// ojs-rate-limiting §10.2 on a queue: `{"concurrency": 0, "expires_at": …}` stops it until
/// then, over its limits as set, which apply again when the override ends or is removed.
#[tokio::test]
async fn a_queue_s_concurrency_is_overridden_until_a_time() {
    let s = TestServer::new().await;
    let key = "/ojs/v1/rate-limits/queue:ov";
    let r = s.call("PUT", key, Some(json!({"concurrency": 2, "rate": {"limit": 100, "period": "PT1H"}}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for i in 0..4 {
        s.enqueue(json!({"type": "ov.job", "args": [i], "options": {"queue": "ov"}})).await;
    }
    let r = s.call("PUT", key, Some(json!({"concurrency": 0, "expires_at": "+PT1H"}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!((&r.body["concurrency"]["limit"], &r.body["override"]["concurrency"], &r.body["limit"]), (&json!(0), &json!(0), &json!({"concurrency": 2, "rate": {"limit": 100, "period": "PT1H"}})), "{}", r.text);
    assert!(r.body["override"]["expires_at"].is_string(), "{}", r.text);
    assert_eq!(s.fetch("ov").await, Value::Null, "stopped by the override");
    let r = s.get(key).await;
    assert_eq!((&r.body["override"]["concurrency"], r.body["waiting_count"].as_i64()), (&json!(0), Some(4)), "{}", r.text);
    let r = s.get("/ojs/v1/admin/queues/ov").await;
    let config = &r.body["configuration"];
    assert_eq!((&config["concurrency"], &config["concurrency_override"]["concurrency"]), (&json!(2), &json!(0)), "{}", r.text);

    // Bad overrides name their field and change nothing.
    for (body, status, field) in [
        (json!({"concurrency": 1, "expires_at": "+PT1H", "rate": {"limit": 1, "period": "PT1S"}}), StatusCode::UNPROCESSABLE_ENTITY, "rate"),
        (json!({"concurrency": 1, "expires_at": "2001-01-01T00:00:00Z"}), StatusCode::BAD_REQUEST, "expires_at"),
        (json!({"concurrency": -1, "expires_at": "+PT1H"}), StatusCode::BAD_REQUEST, "concurrency"),
        (json!({"expires_at": "+PT1H"}), StatusCode::BAD_REQUEST, "concurrency"),
    ] {
        let r = s.call("PUT", key, Some(body.clone())).await;
        assert_eq!((r.status, r.error_field()), (status, Some(field)), "{body}: {}", r.text);
    }
    let r = s.call("PUT", "/ojs/v1/admin/queues/ov/config", Some(json!({"rate_limit": {"concurrency": 1, "expires_at": "+PT1H"}}))).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("rate_limit.expires_at")), "{}", r.text);
    assert_eq!(s.get(key).await.body["override"]["concurrency"], 0, "still stopped");

    // Its end (here brought forward) is cleared by the scheduler's sweep: the limit as set
    // applies again.
    sqlx::query("UPDATE queues SET override_expires_at = now() - interval '1 second' WHERE name = 'ov'").execute(s.db.store.pool()).await.expect("end");
    assert!(s.db.store.settle_rate_limits(100).await.expect("sweep") >= 1);
    let r = s.get(key).await;
    assert_eq!((r.body.get("override"), &r.body["concurrency"]["limit"]), (None, &json!(2)), "{}", r.text);
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["ov"], "count": 10})).await;
    assert_eq!(r.body["jobs"].as_array().map(Vec::len), Some(2), "the queue's own two: {}", r.text);

    // Until removed, then removed by an override without a concurrency.
    let r = s.call("PUT", key, Some(json!({"concurrency": 3, "expires_at": null}))).await;
    assert_eq!((&r.body["override"], &r.body["concurrency"]["limit"]), (&json!({"concurrency": 3, "expires_at": null}), &json!(3)), "{}", r.text);
    assert!(s.fetch("ov").await.is_object(), "a third slot");
    let r = s.call("PUT", key, Some(json!({"expires_at": null}))).await;
    assert_eq!((r.body.get("override"), &r.body["concurrency"]["limit"]), (None, &json!(2)), "{}", r.text);
    assert_eq!(s.fetch("ov").await, Value::Null, "three running, two allowed");
    assert_eq!(s.get("/ojs/v1/admin/queues/ov").await.body["configuration"]["concurrency_override"], Value::Null);
    // Removing none changes nothing (not audited below).
    let r = s.call("PUT", key, Some(json!({"expires_at": null}))).await;
    assert_eq!((r.status, r.body.get("override")), (StatusCode::OK, None), "{}", r.text);

    // A queue with no limits of its own: the override alone limits it, and lists it.
    s.enqueue(json!({"type": "ov.job", "args": [], "options": {"queue": "solo"}})).await;
    let r = s.call("PUT", "/ojs/v1/rate-limits/queue:solo", Some(json!({"concurrency": 0, "expires_at": "+PT10M"}))).await;
    assert_eq!((r.status, &r.body["limit"], &r.body["concurrency"]["limit"]), (StatusCode::OK, &json!({}), &json!(0)), "{}", r.text);
    assert_eq!(s.fetch("solo").await, Value::Null);
    let keys: Vec<Value> = s.get("/ojs/v1/rate-limits").await.body["items"].as_array().cloned().unwrap_or_default().into_iter().map(|i| i["key"].clone()).collect();
    assert!(keys.contains(&json!("queue:solo")), "{keys:?}");
    let r = s.call("PUT", "/ojs/v1/rate-limits/queue:solo", Some(json!({"concurrency": null, "expires_at": null}))).await;
    assert_eq!((r.status, r.body.get("override")), (StatusCode::OK, None), "{}", r.text);
    assert!(s.fetch("solo").await.is_object());
    let audit: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'queue.rate_limit_override'").fetch_one(s.db.store.pool()).await.expect("audit");
    assert_eq!(audit, 5, "every override set or removed");
}

/// admin-api §6: a queue's `concurrency` through its config is the queue's concurrency limit
/// across every worker and fetch. Alone it keeps the queue's rate (and its window); with a
/// `rate_limit` it sets the limit's concurrency; null removes it; bad values name the field.
/// Its `retention` is the queue's own (the pruner applies it: see `counts_and_search.rs`).
#[tokio::test]
async fn a_queue_s_concurrency_and_retention_are_set_through_its_config() {
    let s = TestServer::new().await;
    let config = "/ojs/v1/admin/queues/cq/config";
    let r = s.call("PUT", config, Some(json!({"rate_limit": {"rate": {"limit": 3, "period": "PT1H"}}}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    for i in 0..4 {
        s.enqueue(json!({"type": "cq.job", "args": [i], "options": {"queue": "cq"}})).await;
    }
    assert!(s.fetch("cq").await.is_object(), "one of the window's three");
    let r = s.call("PUT", config, Some(json!({"concurrency": 1}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!((&r.body["configuration"]["concurrency"], &r.body["configuration"]["rate_limit"]), (&json!(1), &json!({"concurrency": 1, "rate": {"limit": 3, "period": "PT1H"}})), "{}", r.text);
    assert_eq!(s.fetch("cq").await, Value::Null, "one active: the queue is full");
    let r = s.get("/ojs/v1/rate-limits/queue:cq").await;
    assert_eq!((r.body["rate"]["current_count"].as_i64(), r.body["concurrency"]["active"].as_i64()), (Some(1), Some(1)), "the window kept its count: {}", r.text);
    let r = s.call("PUT", config, Some(json!({"concurrency": null}))).await;
    assert_eq!((r.status, &r.body["configuration"]["concurrency"]), (StatusCode::OK, &Value::Null), "{}", r.text);
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": ["cq"], "count": 10})).await;
    assert_eq!(r.body["jobs"].as_array().map(Vec::len), Some(2), "the rest of the window: {}", r.text);
    // With a rate_limit, the concurrency is the limit's.
    let r = s.call("PUT", config, Some(json!({"concurrency": 2, "rate_limit": {"throttle": {"limit": 1, "period": "PT1S"}}}))).await;
    assert_eq!(r.body["configuration"]["rate_limit"], json!({"concurrency": 2, "throttle": {"limit": 1, "period": "PT1S"}}), "{}", r.text);
    for bad in [json!({"concurrency": -1}), json!({"concurrency": "3"}), json!({"concurrency": 1.5})] {
        let r = s.call("PUT", config, Some(bad.clone())).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("concurrency")), "{bad}: {}", r.text);
    }
    // The retention alone leaves the limits as they are; a bad part refuses the whole body.
    let r = s.call("PUT", config, Some(json!({"retention": {"completed": "P14D", "discarded": "PT1H"}}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!((&r.body["configuration"]["retention"], &r.body["configuration"]["concurrency"]), (&json!({"completed": "PT336H", "discarded": "PT1H"}), &json!(2)), "durations as Rebound writes them: {}", r.text);
    for (bad, field) in [
        (json!({"retention": {"completed": "soon"}}), "retention.completed"),
        (json!({"retention": {"discarded": "P400D"}}), "retention.discarded"),
        (json!({"retention": {"kept": "P1D"}}), "retention.kept"),
        (json!({"retention": "P1D"}), "retention"),
        (json!({"concurrency": 7, "retention": {"completed": 5}}), "retention.completed"),
        (json!({"concurrency": 7, "retention": {"completed": "P400D"}}), "retention.completed"),
    ] {
        let r = s.call("PUT", config, Some(bad.clone())).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some(field)), "{bad}: {}", r.text);
    }
    let q = s.get("/ojs/v1/admin/queues/cq").await;
    assert_eq!((&q.body["configuration"]["rate_limit"]["concurrency"], &q.body["configuration"]["retention"]["completed"]), (&json!(2), &json!("PT336H")), "nothing half-saved: {}", q.text);
    let r = s.call("PUT", config, Some(json!({"retention": null}))).await;
    assert_eq!((&r.body["configuration"]["retention"], &r.body["configuration"]["concurrency"]), (&json!({"completed": null, "discarded": null}), &json!(2)), "{}", r.text);
}

/// ojs-errors ERR-006: every 503 says when to come back.
#[tokio::test]
async fn an_unavailable_backend_answers_503_with_retry_after() {
    let s = TestServer::new().await;
    assert_eq!(s.get("/ojs/v1/health").await.header("retry-after"), None);
    let looked = std::time::Instant::now();
    assert_eq!(s.get("/readyz").await.status, StatusCode::OK);
    s.db.store.pool().close().await;
    // The probes need no token, so one look at the database answers them all for a second: a
    // flood of probes costs one statement a second, not the pool. Only probes sent well inside
    // that second are judged, since a loaded machine can take most of it to answer.
    let mut answered = 0;
    while answered < 20 && looked.elapsed() < rebound_server::health::PROBE_FRESH / 2 {
        assert_eq!(s.get("/ojs/v1/health").await.status, StatusCode::OK, "the last look answers");
        assert_eq!(s.get("/readyz").await.status, StatusCode::OK, "the last look answers");
        answered += 1;
    }
    assert!(answered > 0, "no probe was sent within the second");
    tokio::time::sleep(rebound_server::health::PROBE_FRESH).await;
    assert_eq!(s.get("/readyz").await.status, StatusCode::SERVICE_UNAVAILABLE);
    let r = s.get("/ojs/v1/health").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_eq!(r.body["status"], "degraded");
    assert_eq!(r.header("retry-after"), Some("2"));
}

#[tokio::test]
async fn dead_letters_are_found_and_redriven_by_when_they_died() {
    let s = TestServer::new().await;
    let old = s.dead_letter("died", "Db.Down").await;
    let recent = s.dead_letter("died", "Db.Down").await;
    // The first died two days ago (created at the same time as the second, as an old job
    // that kept failing might not be: these filter by death, not by creation).
    sqlx::query("UPDATE jobs SET dead_lettered_at = now() - interval '2 days' WHERE id = $1::uuid")
        .bind(&old)
        .execute(s.db.store.pool())
        .await
        .expect("age the first death");
    let since = jiff::Timestamp::now().checked_sub(jiff::SignedDuration::from_hours(1)).expect("an hour ago").to_string();
    let ids = |r: &crate::common::Reply| -> Vec<String> { r.body["jobs"].as_array().expect("jobs").iter().map(|j| j["id"].as_str().unwrap_or("").to_owned()).collect() };
    let r = s.get(&format!("/ojs/v1/dead-letter?queue=died&dead_since={since}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(ids(&r), vec![recent.clone()], "{}", r.text);
    let r = s.get(&format!("/ojs/v1/dead-letter?queue=died&dead_before={since}")).await;
    assert_eq!(ids(&r), vec![old.clone()], "{}", r.text);
    let r = s.get("/ojs/v1/dead-letter?dead_since=yesterday").await;
    assert_eq!((r.status, r.body["error"]["details"]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("dead_since")), "{}", r.text);
    // After a fix: re-drive what failed since then, and only that.
    let r = s.post("/ojs/v1/dead-letter/retry", json!({"filter": {"queue": "died", "dead_since": since}, "confirm": true})).await;
    assert_eq!((r.status, r.body["retried"].as_i64()), (StatusCode::OK, Some(1)), "{}", r.text);
    let recent_state = s.get(&format!("/ojs/v1/jobs/{recent}")).await.body["job"]["state"].clone();
    let old_state = s.get(&format!("/ojs/v1/jobs/{old}")).await.body["job"]["state"].clone();
    assert_eq!(recent_state, "available");
    assert_eq!(old_state, "discarded", "died before the fix: left alone");
}

#[tokio::test]
async fn dead_letter_replay_rules_are_managed_over_http_and_replay() {
    let s = TestServer::new().await;
    let rule = json!({"filter": {"queue": "billing", "error_type": "Net.*"}, "delay": "PT1H", "max_replays": 2});
    let r = s.call("PUT", "/ojs/v1/dead-letter/replay-rules/net-blips", Some(rule.clone())).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let got = &r.body["replay_rule"];
    assert_eq!((got["name"].as_str(), got["delay"].as_str(), got["max_replays"].as_i64()), (Some("net-blips"), Some("PT1H"), Some(2)), "{}", r.text);
    assert_eq!((got["filter"]["error_type"].as_str(), got["filter"]["type"].is_null(), got["enabled"].as_bool()), (Some("Net.*"), true, Some(true)));
    let r = s.call("PUT", "/ojs/v1/dead-letter/replay-rules/net-blips", Some(json!({"delay": "PT2H", "max_replays": 2, "enabled": false}))).await;
    assert_eq!((r.status, r.body["replay_rule"]["enabled"].as_bool()), (StatusCode::OK, Some(false)), "replaced: {}", r.text);
    assert!(r.body["replay_rule"]["filter"]["queue"].is_null(), "a PUT replaces the whole rule");
    s.call("PUT", "/ojs/v1/dead-letter/replay-rules/net-blips", Some(rule)).await;

    // Refused, naming the field; nothing saved.
    for (path, body, field) in [
        ("other", json!({"max_replays": 1}), "delay"),
        ("other", json!({"delay": "one hour", "max_replays": 1}), "delay"),
        ("other", json!({"delay": "PT1H", "max_replays": 0}), "max_replays"),
        ("other", json!({"delay": "PT1H"}), "max_replays"),
        ("other", json!({"delay": "PT1H", "max_replays": 1, "filter": {"error_type": ".*"}}), "filter.error_type"),
        ("other", json!({"delay": "PT1H", "max_replays": 1, "filter": {"queue": "No Such Queue"}}), "filter.queue"),
        ("other", json!({"delay": "PT1H", "max_replays": 1, "filter": {"state": "x"}}), "filter.state"),
        ("other", json!({"delay": "PT1H", "max_replays": 1, "name": "different"}), "name"),
        ("Not%20A%20Name", json!({"delay": "PT1H", "max_replays": 1}), "name"),
    ] {
        let r = s.call("PUT", &format!("/ojs/v1/dead-letter/replay-rules/{path}"), Some(body.clone())).await;
        assert!(r.status.is_client_error(), "{body}: {}", r.text);
        r.assert_ojs_error(&body.to_string());
        assert_eq!(r.error_field(), Some(field), "{body}: {}", r.text);
    }
    let r = s.get("/ojs/v1/dead-letter/replay-rules").await;
    let names: Vec<&str> = r.body["replay_rules"].as_array().expect("rules").iter().filter_map(|x| x["name"].as_str()).collect();
    assert_eq!(names, ["net-blips"], "{}", r.text);
    assert_eq!(s.get("/ojs/v1/dead-letter/replay-rules/nope").await.status, StatusCode::NOT_FOUND);
    assert_eq!(s.get("/ojs/v1/dead-letter/replay-rules/Bad%20Name").await.status, StatusCode::NOT_FOUND);

    // The maintenance leader applies it: a worker's replayer, or with no worker the server's
    // own pass, run here in process.
    let matched = s.dead_letter("billing", "Net.Timeout").await;
    let unmatched = s.dead_letter("billing", "Card.Declined").await;
    sqlx::query("UPDATE jobs SET dead_lettered_at = now() - interval '2 hours' WHERE dead_letter")
        .execute(s.db.store.pool())
        .await
        .expect("age the deaths");
    let pass = rebound_server::maintenance::run_pass(&s.db.store, &s.state.metrics).await.expect("maintenance pass");
    assert_eq!(pass.replay.replayed, 1);
    let job = s.get(&format!("/ojs/v1/jobs/{matched}")).await.body["job"].clone();
    assert_eq!((job["state"].as_str(), job["meta"]["ojs.replay_count"].as_i64(), job["meta"]["ojs.replay_rule"].as_str()), (Some("available"), Some(1), Some("net-blips")), "{job}");
    assert_eq!(s.get(&format!("/ojs/v1/jobs/{unmatched}")).await.body["job"]["state"], "discarded");
    let r = s.get("/ojs/v1/events?types=dead_letter.replayed").await;
    let events = r.body["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{}", r.text);
    assert_eq!((events[0]["data"]["job_id"].as_str(), events[0]["data"]["rule"].as_str()), (Some(matched.as_str()), Some("net-blips")), "{}", r.text);
    let r = s.get("/ojs/v1/dead-letter/replay-rules/net-blips").await;
    assert_eq!(r.body["replay_rule"]["replayed_total"], 1, "{}", r.text);

    let r = s.call("DELETE", "/ojs/v1/dead-letter/replay-rules/net-blips", None).await;
    assert_eq!((r.status, r.body["deleted"].as_bool()), (StatusCode::OK, Some(true)), "{}", r.text);
    assert_eq!(s.call("DELETE", "/ojs/v1/dead-letter/replay-rules/net-blips", None).await.status, StatusCode::NOT_FOUND);
    // The dead-letter routes beside them still answer.
    assert_eq!(s.get(&format!("/ojs/v1/dead-letter/{unmatched}")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn dead_letters_are_listed_most_recently_dead_first_on_request() {
    let s = TestServer::new().await;
    let older = s.dead_letter("sorted", "Db.Down").await;
    let newer = s.dead_letter("sorted", "Db.Down").await;
    // The older job died last.
    sqlx::query("UPDATE jobs SET dead_lettered_at = now() - interval '1 hour' WHERE id = $1::uuid")
        .bind(&newer)
        .execute(s.db.store.pool())
        .await
        .expect("age the newer job's death");
    let ids = |r: &crate::common::Reply| -> Vec<String> { r.body["jobs"].as_array().expect("jobs").iter().map(|j| j["id"].as_str().unwrap_or("").to_owned()).collect() };
    let r = s.get("/ojs/v1/dead-letter?queue=sorted").await;
    assert_eq!(ids(&r), [newer.clone(), older.clone()], "by default newest created first: {}", r.text);
    let r = s.get("/ojs/v1/dead-letter?queue=sorted&sort=dead_lettered_at&order=desc&limit=1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(ids(&r), vec![older.clone()], "{}", r.text);
    let cursor = r.body["pagination"]["next_cursor"].as_str().expect("a next cursor").to_owned();
    let r = s.get(&format!("/ojs/v1/dead-letter?queue=sorted&sort=dead_lettered_at&limit=1&cursor={cursor}")).await;
    assert_eq!((ids(&r), r.body["pagination"]["has_more"].as_bool()), (vec![newer.clone()], Some(false)), "{}", r.text);
    let r = s.get("/ojs/v1/dead-letter?sort=dead_lettered_at&type=dead.job&error_type=Db.*").await;
    assert_eq!(ids(&r), [older, newer], "a search in that order: {}", r.text);
    let not_a_death_cursor = format!("sort=dead_lettered_at&cursor={}", uuid::Uuid::nil());
    // Well formed, at a time no job died at and Postgres cannot hold (it was a 500).
    let before_any_death = format!("sort=dead_lettered_at&cursor=-300000000000000000_{}", uuid::Uuid::nil());
    for (query, field) in [
        (before_any_death.as_str(), "cursor"),
        ("sort=priority", "sort"),
        ("sort=dead_lettered_at&order=asc", "order"),
        ("sort=dead_lettered_at&offset=5", "offset"),
        (not_a_death_cursor.as_str(), "cursor"),
    ] {
        let r = s.get(&format!("/ojs/v1/dead-letter?{query}")).await;
        assert!(r.status.is_client_error(), "{query}: {}", r.text);
        assert_eq!(r.error_field(), Some(field), "{query}: {}", r.text);
    }
}

/// Keyed concurrency over HTTP, as an OJS client sees it: jobs naming a key share its limit
/// across queues, the rest wait `available` (marked `rate_limited`), an ack admits the next,
/// and the key's state, an operator's override and the `rate_limit.*` events are readable.
#[tokio::test]
async fn keyed_rate_limits_over_http() {
    let s = TestServer::new().await;
    let mut ids = Vec::new();
    for (i, queue) in ["ka", "kb", "ka"].iter().enumerate() {
        let job = s.enqueue(json!({"type": "rl.keyed", "args": [i], "options": {"queue": queue, "rate_limit": {"key": "tenant:acme", "concurrency": 1, "on_limit": "wait"}}})).await;
        assert_eq!((job["state"].as_str(), job["rate_limit"]["key"].as_str()), (Some("available"), Some("tenant:acme")), "{job}");
        assert_eq!(job.get("rate_limited").is_some(), i > 0, "{job}");
        ids.push(job["id"].clone());
    }
    let first = s.fetch("ka").await;
    assert_eq!(first["id"], ids[0]);
    assert_eq!(s.fetch("kb").await, Value::Null, "the key is full in every queue");
    let r = s.get("/ojs/v1/rate-limits/tenant:acme").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!((r.body["concurrency"]["limit"].as_i64(), r.body["concurrency"]["active"].as_i64(), r.body["concurrency"]["available"].as_i64(), r.body["waiting_count"].as_i64()),
        (Some(1), Some(1), Some(0), Some(2)), "{}", r.text);
    let waiting = s.get(&format!("/ojs/v1/jobs/{}", ids[1].as_str().unwrap_or_default())).await;
    assert_eq!((waiting.body["job"]["state"].as_str(), waiting.body["job"]["rate_limited"].as_bool()), (Some("available"), Some(true)), "{}", waiting.text);

    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": first["id"], "result": null})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let second = s.fetch("kb").await;
    assert_eq!(second["id"], ids[1], "the ack admitted the next");

    // A nack saying when the upstream takes calls again holds the key until then (§9).
    let bad = s.post("/ojs/v1/workers/nack", json!({"job_id": second["id"], "error": {"code": "http.429", "message": "slow down", "rate_limit_until": "soon"}})).await;
    assert_eq!((bad.status, bad.error_field()), (StatusCode::BAD_REQUEST, Some("error.rate_limit_until")), "{}", bad.text);
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": second["id"], "error": {"code": "http.429", "message": "slow down", "rate_limit_until": "+PT1H"}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.get("/ojs/v1/rate-limits/tenant:acme").await;
    assert!(r.body["held_until"].is_string(), "{}", r.text);
    assert_eq!((r.body["concurrency"]["limit"].as_i64(), r.body["waiting_count"].as_i64()), (Some(0), Some(1)), "{}", r.text);
    // Its end, as the sweep finds it.
    sqlx::query("UPDATE rate_limit_keys SET held_until = now()").execute(s.db.store.pool()).await.unwrap();
    assert!(s.db.store.settle_rate_limits(10).await.unwrap() >= 1);

    // An override stops the key; the list shows queue and keyed limits side by side.
    let r = s.call("PUT", "/ojs/v1/rate-limits/tenant:acme", Some(json!({"concurrency": 0, "expires_at": "+PT1H"}))).await;
    assert_eq!((r.status, r.body["override"]["concurrency"].as_i64(), r.body["limit"]["concurrency"].as_i64()), (StatusCode::OK, Some(0), Some(1)), "{}", r.text);
    s.call("PUT", "/ojs/v1/admin/queues/ka/rate-limit", Some(json!({"concurrency": 3}))).await;
    let keys: Vec<String> = s.get("/ojs/v1/rate-limits").await.body["items"].as_array().map(|a| a.iter().filter_map(|i| i["key"].as_str().map(str::to_owned)).collect()).unwrap_or_default();
    assert_eq!(keys, vec!["queue:ka", "tenant:acme"]);
    // Pages of queue and keyed limits together, the keys read from the database page by page.
    for key in ["a-key", "zeta"] {
        assert_eq!(s.call("PUT", &format!("/ojs/v1/rate-limits/{key}"), Some(json!({"concurrency": 5}))).await.status, StatusCode::OK);
    }
    let (mut walked, mut cursor) = (Vec::new(), String::new());
    loop {
        let r = s.get(&format!("/ojs/v1/rate-limits?limit=2{cursor}")).await;
        assert_eq!(r.body["pagination"]["total"].as_i64(), Some(4), "{}", r.text);
        walked.extend(r.body["items"].as_array().into_iter().flatten().filter_map(|i| i["key"].as_str().map(str::to_owned)));
        match r.body["pagination"]["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(walked, ["a-key", "queue:ka", "tenant:acme", "zeta"]);
    let r = s.get("/ojs/v1/rate-limits?limit=2&offset=1").await;
    let page: Vec<&str> = r.body["items"].as_array().into_iter().flatten().filter_map(|i| i["key"].as_str()).collect();
    assert_eq!((page, r.body["pagination"]["has_more"].as_bool()), (vec!["queue:ka", "tenant:acme"], Some(true)), "{}", r.text);
    let r = s.call("PUT", "/ojs/v1/rate-limits/tenant:acme", Some(json!({}))).await;
    assert!(r.body.get("override").is_none(), "{}", r.text);

    // Bad input names its field.
    for (body, field) in [
        (json!({"concurrency": -1}), "concurrency"),
        (json!({"concurrency": 1, "expires_at": "yesterday"}), "expires_at"),
        (json!({"expires_at": "+PT1H"}), "concurrency"),
        (json!({"concurrency": 1, "nope": 1}), "nope"),
    ] {
        let r = s.call("PUT", "/ojs/v1/rate-limits/tenant:acme", Some(body.clone())).await;
        assert_eq!((r.status.is_client_error(), r.error_field()), (true, Some(field)), "{body}: {}", r.text);
    }
    let r = s.post("/ojs/v1/jobs", json!({"type": "rl.keyed", "args": [], "options": {"rate_limit": {"key": "bad key"}}})).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("options.rate_limit.key")), "{}", r.text);
    let r = s.post("/ojs/v1/jobs", json!({"type": "rl.keyed", "args": [], "options": {"rate_limit": {"concurrency": 2}}})).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("options.rate_limit.key")), "{}", r.text);
    // A cron template's is checked as a job's is.
    let r = s.post("/ojs/v1/cron", json!({"name": "keyed", "expression": "@hourly", "job_template": {"type": "rl.keyed", "options": {"rate_limit": {"key": "queue:x"}}}})).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("job_template.options.rate_limit.key")), "{}", r.text);

    // Events: the enqueues that left jobs waiting, and each admission.
    let events = s.get("/ojs/v1/events?types=rate_limit.exceeded,rate_limit.released,rate_limit.dynamic_adjusted").await;
    let types: Vec<&str> = events.body["events"].as_array().map(|a| a.iter().filter_map(|e| e["type"].as_str()).collect()).unwrap_or_default();
    // (A maintenance pass of the server may promote the nacked job meanwhile, and the override
    // hold it back: more of either, never fewer.)
    assert!(types.iter().filter(|t| **t == "rate_limit.exceeded").count() >= 2, "the two enqueues that left jobs waiting: {}", events.text);
    assert!(types.iter().filter(|t| **t == "rate_limit.released").count() >= 2, "the ack's admission, and the hold's end: {}", events.text);
    assert_eq!(types.iter().filter(|t| **t == "rate_limit.dynamic_adjusted").count(), 1, "{}", events.text);
    assert!(events.body["events"].as_array().is_some_and(|a| a.iter().all(|e| e["subject"] == "tenant:acme" && e["data"]["key"] == "tenant:acme")));

    // A key's rate window (RL-R001): two starts per hour, the third job waits for the next.
    for i in 0..3 {
        let job = s.enqueue(json!({"type": "rl.windowed", "args": [i], "options": {"queue": "kw", "rate_limit": {"key": "mailer", "rate": {"limit": 2, "period": "PT1H"}}}})).await;
        assert_eq!(job.get("rate_limited").is_some(), i == 2, "{job}");
    }
    let r = s.get("/ojs/v1/rate-limits/mailer").await;
    assert_eq!((r.body["rate"]["limit"].as_i64(), r.body["rate"]["period"].as_str(), r.body["rate"]["current_count"].as_i64(), r.body["waiting_count"].as_i64()),
        (Some(2), Some("PT1H"), Some(2), Some(1)), "{}", r.text);
    assert!(r.body["rate"]["window_resets_at"].is_string(), "{}", r.text);
    assert_eq!(r.body["limit"]["rate"], json!({"limit": 2, "period": "PT1H"}), "{}", r.text);
    for _ in 0..2 {
        let job = s.fetch("kw").await;
        assert_eq!(s.post("/ojs/v1/workers/ack", json!({"job_id": job["id"]})).await.status, StatusCode::OK);
    }
    assert_eq!(s.fetch("kw").await, Value::Null, "the window is spent, however many finished");
    // on_limit: drop (§6.2): the job the spent window would leave waiting is discarded at once.
    let r = s.post("/ojs/v1/jobs", json!({"type": "rl.windowed", "args": [9], "options": {"queue": "kw", "rate_limit": {"key": "mailer", "on_limit": "drop"}}})).await;
    assert_eq!((r.status, r.body["job"]["state"].as_str()), (StatusCode::CREATED, Some("discarded")), "{}", r.text);
    let dropped = s.get("/ojs/v1/events?types=rate_limit.dropped").await;
    assert_eq!(dropped.body["events"][0]["data"]["job_id"], r.body["job"]["id"], "{}", dropped.text);
    let detail = s.get(&format!("/ojs/v1/admin/jobs/{}", r.body["job"]["id"].as_str().unwrap_or_default())).await;
    assert_eq!((&detail.body["errors"][0]["type"], &detail.body["errors"][0]["retryable"]), (&json!("rate_limit.dropped"), &json!(false)), "{}", detail.text);
    // An override is of the concurrency; a rate in it is refused, not ignored.
    let r = s.call("PUT", "/ojs/v1/rate-limits/mailer", Some(json!({"concurrency": 1, "rate": {"limit": 5, "period": "PT1M"}}))).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::UNPROCESSABLE_ENTITY, Some("rate")), "{}", r.text);
    let r = s.call("PUT", "/ojs/v1/rate-limits/mailer", Some(json!({"concurrency": 1, "throttle": {"limit": 5, "period": "PT1M"}}))).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::UNPROCESSABLE_ENTITY, Some("throttle")), "{}", r.text);

    // A key's throttle (RL-R002): starts spaced period / limit apart, so the second job waits
    // for the first's spacing to end, whichever queue it is in.
    for (i, throttle) in [json!({"throttle": {"limit": 2, "period": "PT1H"}}), json!({"max_per_second": 1})].into_iter().enumerate() {
        let key = format!("paced-{i}");
        let mut options = json!({"key": key});
        if let (Some(o), Some(t)) = (options.as_object_mut(), throttle.as_object()) {
            o.extend(t.clone());
        }
        for (n, queue) in ["kt", "ku"].iter().enumerate() {
            let job = s.enqueue(json!({"type": "rl.paced", "args": [n], "options": {"queue": queue, "rate_limit": options}})).await;
            assert_eq!(job.get("rate_limited").is_some(), n == 1, "{job}");
        }
        let r = s.get(&format!("/ojs/v1/rate-limits/{key}")).await;
        let (limit, period) = if i == 0 { (2, "PT1H") } else { (1, "PT1S") };
        assert_eq!((r.body["throttle"]["limit"].as_i64(), r.body["throttle"]["period"].as_str(), r.body["waiting_count"].as_i64()),
            (Some(limit), Some(period), Some(1)), "{}", r.text);
        // (A second's spacing may be over on a loaded machine by the time it is read.)
        assert!(i > 0 || r.body["throttle"]["next_allowed_at"].is_string(), "{}", r.text);
        assert_eq!(r.body["limit"]["throttle"], json!({"limit": limit, "period": period}), "{}", r.text);
    }
    let before = s.job_count().await;
    for (throttle, field) in [
        (json!({"throttle": {"limit": 0, "period": "PT1S"}}), "options.rate_limit.throttle.limit"),
        (json!({"throttle": {"limit": 5000, "period": "PT1S"}}), "options.rate_limit.throttle.period"),
        (json!({"throttle": {"limit": 1}}), "options.rate_limit.throttle.period"),
        (json!({"max_per_second": 0}), "options.rate_limit.max_per_second"),
        (json!({"max_per_second": 5000}), "options.rate_limit.max_per_second"),
        (json!({"max_per_second": 2, "throttle": {"limit": 2, "period": "PT1S"}}), "options.rate_limit.max_per_second"),
    ] {
        let mut options = json!({"key": "paced-bad"});
        if let (Some(o), Some(t)) = (options.as_object_mut(), throttle.as_object()) {
            o.extend(t.clone());
        }
        let r = s.post("/ojs/v1/jobs", json!({"type": "rl.paced", "args": [], "options": {"rate_limit": options}})).await;
        assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some(field)), "{throttle}: {}", r.text);
    }
    assert_eq!(s.job_count().await, before, "nothing stored");
    assert_eq!(s.get("/ojs/v1/rate-limits/paced-bad").await.status, StatusCode::NOT_FOUND, "no key made");
}
