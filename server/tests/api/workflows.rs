//! OJS workflows over HTTP, driven as an OJS worker drives them: fetch, ack, nack.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::common::TestServer;

async fn fetch(s: &TestServer, queue: &str) -> Vec<Value> {
    let r = s.post("/ojs/v1/workers/fetch", json!({"queues": [queue], "count": 10, "worker_id": "w1"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.body["jobs"].as_array().cloned().unwrap_or_default()
}

async fn ack(s: &TestServer, job: &Value, result: Value) {
    let r = s.post("/ojs/v1/workers/ack", json!({"job_id": job["id"], "result": result})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn a_chain_over_http_runs_step_by_step_with_the_results_before_it() {
    let s = TestServer::new().await;
    let r = s
        .post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "name": "order", "steps": [
                {"type": "order.validate", "args": [{"order": 1}], "options": {"queue": "wq"}},
                {"type": "order.charge", "args": [], "options": {"queue": "wq"}},
            ]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let wf = &r.body["workflow"];
    assert_eq!((&wf["type"], &wf["name"], &wf["state"], &wf["steps_total"], &wf["steps_completed"]), (&json!("chain"), &json!("order"), &json!("running"), &json!(2), &json!(0)));
    assert_eq!((&r.body["id"], &r.body["type"]), (&wf["id"], &wf["type"]), "the fields at the top level too");
    let steps: Vec<(&Value, &Value, &Value)> = wf["steps"].as_array().unwrap().iter().map(|s| (&s["id"], &s["index"], &s["state"])).collect();
    assert_eq!(steps, [(&json!("step-0"), &json!(0), &json!("pending")), (&json!("step-1"), &json!(1), &json!("waiting"))]);
    assert_eq!(wf["metadata"]["job_count"], 2);
    let id = wf["id"].as_str().unwrap().to_string();

    let first = fetch(&s, "wq").await;
    assert_eq!(first.len(), 1, "only the first step: {first:?}");
    assert_eq!((&first[0]["type"], &first[0]["workflow_id"]), (&json!("order.validate"), &json!(id)));
    let r = s.get(&format!("/ojs/v1/workflows/{id}")).await;
    assert_eq!((&r.body["workflow"]["steps"][0]["state"], r.body["workflow"]["started_at"].is_string()), (&json!("active"), true));
    ack(&s, &first[0], json!({"total": 42})).await;

    let second = fetch(&s, "wq").await;
    assert_eq!(second.len(), 1);
    assert_eq!((&second[0]["type"], &second[0]["parent_results"]), (&json!("order.charge"), &json!([{"total": 42}])));
    ack(&s, &second[0], json!("paid")).await;
    let r = s.get(&format!("/ojs/v1/workflows/{id}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let wf = &r.body["workflow"];
    assert_eq!((&wf["state"], &wf["steps_completed"], &wf["metadata"]["completed_count"]), (&json!("completed"), &json!(2), &json!(2)));
    assert_eq!((&wf["steps"][0]["result"], &wf["steps"][1]["result"]), (&json!({"total": 42}), &json!("paid")));
    assert!(wf["completed_at"].is_string() && wf["started_at"].is_string());

    // Finished: cancelling it is a conflict; an unknown one is not found.
    let r = s.call("DELETE", &format!("/ojs/v1/workflows/{id}"), None).await;
    assert_eq!((r.status, r.body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("conflict")), "{}", r.text);
    r.assert_ojs_error("cancel a finished workflow");
    let r = s.get("/ojs/v1/workflows/019539a4-bbbb-7000-8000-000000000001").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    r.assert_ojs_error("unknown workflow");
}

#[tokio::test]
async fn a_failed_step_fails_the_chain_and_a_cancel_stops_what_waits() {
    let s = TestServer::new().await;
    let step = |t: &str| json!({"type": t, "args": [], "options": {"queue": "fq", "retry": {"max_attempts": 1}}});
    let r = s.post("/ojs/v1/workflows", json!({"type": "chain", "steps": [step("a"), step("b")]})).await;
    let id = r.body["id"].as_str().unwrap().to_string();
    let a = fetch(&s, "fq").await.remove(0);
    let r = s.post("/ojs/v1/workers/nack", json!({"job_id": a["id"], "error": {"code": "boom", "message": "no"}})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = s.get(&format!("/ojs/v1/workflows/{id}")).await;
    let wf = &r.body["workflow"];
    assert_eq!((&wf["state"], &wf["failed_step_index"], &wf["failed_job_ids"]), (&json!("failed"), &json!(0), &json!([a["id"]])));
    assert_eq!((&wf["steps"][0]["state"], &wf["steps"][1]["state"]), (&json!("failed"), &json!("cancelled")));
    assert_eq!(wf["errors"][0]["attempt"], 1);
    assert!(fetch(&s, "fq").await.is_empty());

    // A group cancelled while one job runs: the others are cancelled, the running one finishes.
    let r = s.post("/ojs/v1/workflows", json!({"type": "group", "jobs": [step("g"), step("g"), step("g")]})).await;
    assert_eq!((r.status, &r.body["jobs_total"]), (StatusCode::CREATED, &json!(3)), "{}", r.text);
    let id = r.body["id"].as_str().unwrap().to_string();
    let running = s.post("/ojs/v1/workers/fetch", json!({"queues": ["fq"], "count": 1})).await.body["jobs"][0].clone();
    let r = s.call("DELETE", &format!("/ojs/v1/workflows/{id}"), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["workflow"]["state"], "cancelled");
    let states: Vec<&str> = r.body["workflow"]["steps"].as_array().unwrap().iter().filter_map(|s| s["state"].as_str()).collect();
    assert_eq!(states.iter().filter(|s| **s == "cancelled").count(), 2, "{states:?}");
    assert_eq!(states.iter().filter(|s| **s == "active").count(), 1, "{states:?}");
    ack(&s, &running, json!(1)).await;
    assert_eq!(s.get(&format!("/ojs/v1/workflows/{id}")).await.body["workflow"]["state"], "cancelled");
}

#[tokio::test]
async fn a_batch_s_callbacks_run_on_their_own_queue_with_every_result() {
    let s = TestServer::new().await;
    let r = s
        .post(
            "/ojs/v1/workflows",
            json!({"type": "batch", "name": "mail", "jobs": [
                {"type": "mail.send", "args": ["a"], "options": {"queue": "bq"}},
                {"type": "mail.send", "args": ["b"], "options": {"queue": "bq"}},
            ], "callbacks": {
                "on_complete": {"type": "mail.report", "args": [], "options": {"queue": "cbq"}},
                "on_failure": {"type": "mail.alert", "args": [], "options": {"queue": "cbq"}},
            }}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let id = r.body["id"].as_str().unwrap().to_string();
    let callbacks: Vec<(&Value, &Value)> =
        r.body["steps"].as_array().unwrap().iter().filter(|s| s["callback_type"].is_string()).map(|s| (&s["id"], &s["state"])).collect();
    assert_eq!(callbacks, [(&json!("on_complete"), &json!("waiting")), (&json!("on_failure"), &json!("waiting"))]);
    assert!(fetch(&s, "cbq").await.is_empty(), "callbacks wait for the jobs");
    for job in fetch(&s, "bq").await {
        ack(&s, &job, json!(format!("sent {}", job["args"][0].as_str().unwrap_or("?")))).await;
    }
    let fired = fetch(&s, "cbq").await;
    assert_eq!(fired.len(), 1, "on_complete only: nothing failed: {fired:?}");
    assert_eq!((&fired[0]["type"], &fired[0]["parent_results"]), (&json!("mail.report"), &json!(["sent a", "sent b"])));
    assert_eq!(s.get(&format!("/ojs/v1/workflows/{id}")).await.body["state"], "running", "until its callback is done");
    ack(&s, &fired[0], json!(null)).await;
    let r = s.get(&format!("/ojs/v1/workflows/{id}")).await;
    assert_eq!((&r.body["state"], &r.body["jobs_completed"]), (&json!("completed"), &json!(2)));
}

#[tokio::test]
async fn the_python_sdk_s_graph_is_read_as_the_workflow_it_describes() {
    let s = TestServer::new().await;
    let r = s
        .post(
            "/ojs/v1/workflows",
            json!({"name": "py-chain", "steps": [
                {"id": "step-0", "type": "test.echo", "args": ["step1"], "depends_on": []},
                {"id": "step-1", "type": "test.echo", "args": ["step2"], "depends_on": ["step-0"]},
            ]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!((&r.body["workflow"]["type"], &r.body["workflow"]["state"]), (&json!("chain"), &json!("running")));
    assert!(r.body["workflow"]["created_at"].as_str().is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()), "{}", r.text);
}

#[tokio::test]
async fn any_other_graph_runs_each_step_after_what_it_depends_on() {
    let s = TestServer::new().await;
    let step = |id: &str, after: Value| json!({"id": id, "type": format!("g.{id}"), "args": [id], "depends_on": after, "options": {"queue": "dag"}});
    let r = s
        .post(
            "/ojs/v1/workflows",
            json!({"name": "onboarding", "steps": [step("welcome", json!([])), step("profile", json!([])), step("confirm", json!(["welcome", "profile"]))]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let wf = &r.body["workflow"];
    assert_eq!((&wf["type"], &wf["state"], &wf["jobs_total"]), (&json!("graph"), &json!("running"), &json!(3)));
    let steps: Vec<(&Value, &Value, &Value)> = wf["steps"].as_array().unwrap().iter().map(|s| (&s["id"], &s["state"], &s["depends_on"])).collect();
    assert_eq!(
        steps,
        [
            (&json!("welcome"), &json!("pending"), &json!([])),
            (&json!("profile"), &json!("pending"), &json!([])),
            (&json!("confirm"), &json!("waiting"), &json!(["welcome", "profile"]))
        ]
    );
    let id = wf["id"].as_str().unwrap().to_string();

    let roots = fetch(&s, "dag").await;
    assert_eq!(roots.len(), 2, "{roots:?}");
    ack(&s, &roots[0], json!(0)).await;
    assert!(fetch(&s, "dag").await.is_empty(), "confirm waits for both");
    ack(&s, &roots[1], json!(1)).await;
    let last = fetch(&s, "dag").await;
    assert_eq!(last.len(), 1);
    assert_eq!(last[0]["type"], "g.confirm");
    let upstream = last[0]["parent_results"].as_object().cloned().unwrap_or_default();
    assert_eq!(upstream.keys().map(String::as_str).collect::<Vec<_>>(), ["profile", "welcome"], "by step id");
    ack(&s, &last[0], json!("sent")).await;
    let r = s.get(&format!("/ojs/v1/workflows/{id}")).await;
    assert_eq!((&r.body["workflow"]["state"], &r.body["workflow"]["metadata"]["completed_count"]), (&json!("completed"), &json!(3)), "{}", r.text);
    assert_eq!(r.body["workflow"]["steps"][2]["result"], "sent");
}

#[tokio::test]
async fn a_chain_with_a_nested_group_as_the_js_sdk_sends_it() {
    let s = TestServer::new().await;
    let job = |t: &str| json!({"type": t, "args": [t], "options": {"queue": "nest"}});
    let r = s
        .post(
            "/ojs/v1/workflows",
            json!({"type": "chain", "name": "etl", "steps": [job("extract"), {"type": "group", "name": "transforms", "jobs": [job("csv"), job("json")]}, job("load")]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let wf = &r.body["workflow"];
    let step = &wf["steps"][1];
    assert_eq!((&step["type"], &step["state"], &step["workflow"]["name"], &step["workflow"]["state"]), (&json!("group"), &json!("waiting"), &json!("transforms"), &json!("pending")), "{step}");
    assert_eq!(step["workflow"]["parent_id"], wf["id"]);
    assert_eq!(step["workflow"]["steps"].as_array().map(Vec::len), Some(2));
    // Three steps, four jobs: the metadata counts the nested group's jobs (ojs-workflows §3.3).
    assert_eq!((&wf["steps_total"], &wf["metadata"]["job_count"], &wf["metadata"]["completed_count"]), (&json!(3), &json!(4), &json!(0)), "{wf}");
    let id = wf["id"].as_str().unwrap().to_string();

    let first = fetch(&s, "nest").await;
    assert_eq!(first.len(), 1, "{first:?}");
    ack(&s, &first[0], json!({"rows": 2})).await;
    let fanned = fetch(&s, "nest").await;
    assert_eq!(fanned.len(), 2, "the group's jobs run side by side: {fanned:?}");
    assert!(fanned.iter().all(|j| j["parent_results"] == json!([{"rows": 2}])), "{fanned:?}");
    let r = s.get(&format!("/ojs/v1/workflows/{id}")).await;
    assert_eq!(r.body["workflow"]["steps"][1]["state"], "active", "{}", r.text);
    for j in &fanned {
        ack(&s, j, j["args"][0].clone()).await;
    }
    let load = fetch(&s, "nest").await;
    assert_eq!(load.len(), 1);
    assert_eq!(load[0]["parent_results"], json!([{"rows": 2}, ["csv", "json"]]));
    ack(&s, &load[0], json!("done")).await;
    let r = s.get(&format!("/ojs/v1/workflows/{id}")).await;
    let wf = &r.body["workflow"];
    assert_eq!((&wf["state"], &wf["steps"][1]["state"], &wf["steps"][1]["result"]), (&json!("completed"), &json!("completed"), &json!(["csv", "json"])), "{}", r.text);
    assert_eq!((&wf["steps_completed"], &wf["metadata"]["job_count"], &wf["metadata"]["completed_count"], &wf["metadata"]["failed_count"]), (&json!(3), &json!(4), &json!(4), &json!(0)), "{wf}");
}

#[tokio::test]
async fn a_bad_workflow_gets_a_400_naming_the_field_and_creates_nothing() {
    let s = TestServer::new().await;
    let cases = [
        (json!({"type": "chain", "steps": []}), "steps"),
        (json!({"type": "pipeline", "steps": [{"type": "a", "args": []}]}), "type"),
        (json!({"type": "group", "jobs": [{"type": "a", "args": []}, {"type": "b", "args": "x"}]}), "jobs[1].args"),
        (json!({"type": "batch", "jobs": [{"type": "a", "args": []}]}), "callbacks"),
        (json!({"type": "chain", "steps": [{"type": "a", "args": [], "options": {"unique": {"keys": ["type"]}}}]}), "steps[0].unique"),
        (json!({"type": "chain", "steps": [{"type": "group", "jobs": [{"type": "a", "args": "x"}]}]}), "steps[0].jobs[0].args"),
        (json!({"type": "chain", "steps": [{"type": "a", "args": [], "options": {"rate_limit": {"key": "k", "concurrency": 1, "on_limit": "drop"}}}]}), "steps[0].rate_limit.on_limit"),
        (json!({"type": "group", "jobs": [{"type": "group", "jobs": [{"type": "group", "jobs": [{"type": "chain", "steps": [{"type": "a", "args": []}]}]}]}]}), "jobs[0].jobs[0].jobs[0]"),
        (json!({"type": "chain", "steps": [{"type": "chain", "steps": [{"type": "chain", "steps": [{"type": "chain", "steps": [{"type": "a", "args": []}]}]}]}]}), "steps[0].steps[0].steps[0]"),
        (json!({"steps": [{"id": "a", "type": "t", "args": [], "depends_on": []}, {"id": "b", "type": "t", "args": [], "depends_on": ["x"]}]}), "steps[1].depends_on"),
        (json!({"steps": [{"id": "a", "type": "t", "args": [], "depends_on": ["b"]}, {"id": "b", "type": "t", "args": [], "depends_on": ["a"]}]}), "steps[0].depends_on"),
        (json!({"steps": [{"id": "a", "type": "t", "args": [], "depends_on": []}, {"id": "a", "type": "t", "args": [], "depends_on": ["a"]}]}), "steps[1].id"),
        (json!({"type": "chain", "steps": [{"type": "a", "args": []}], "id": "not-a-uuid"}), "id"),
    ];
    for (body, field) in cases {
        let r = s.post("/ojs/v1/workflows", body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text);
        assert_eq!(r.error_field(), Some(field), "{body}: {}", r.text);
        r.assert_ojs_error(field);
    }
    // A bad retry policy is a 422, as on a plain enqueue.
    let r = s.post("/ojs/v1/workflows", json!({"type": "group", "jobs": [{"type": "a", "args": [], "options": {"retry": {"max_attempts": -1}}}]})).await;
    assert_eq!((r.status, r.error_field()), (StatusCode::UNPROCESSABLE_ENTITY, Some("jobs[0].options.retry.max_attempts")), "{}", r.text);
    let r = s.get("/ojs/v1/admin/jobs").await;
    assert_eq!(r.body["pagination"]["total"], json!(0), "{}", r.text);
}

#[tokio::test]
async fn workflow_events_are_served_with_the_others() {
    let s = TestServer::new().await;
    let r = s.post("/ojs/v1/workflows", json!({"type": "group", "name": "fan-out", "jobs": [{"type": "g", "args": [], "options": {"queue": "eq"}}]})).await;
    let id = r.body["id"].as_str().unwrap().to_string();
    let job = fetch(&s, "eq").await.remove(0);
    ack(&s, &job, json!("ok")).await;
    let r = s.get("/ojs/v1/events?types=workflow.started,workflow.step_completed,workflow.completed").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let events = r.body["events"].as_array().unwrap();
    let seen: Vec<(&str, &str, &str)> =
        events.iter().filter_map(|e| Some((e["type"].as_str()?, e["subject"].as_str()?, e["source"].as_str()?))).collect();
    let source = "ojs://rebound/workflows";
    // Newest first; the job's completion and the workflow's are one moment, ordered by type.
    assert_eq!(seen, [("workflow.step_completed", id.as_str(), source), ("workflow.completed", id.as_str(), source), ("workflow.started", id.as_str(), source)], "{}", r.text);
    assert_eq!((&events[1]["data"]["workflow_name"], &events[1]["data"]["total_steps"]), (&json!("fan-out"), &json!(1)));
    let r = s.get("/ojs/v1/events?types=workflow.bogus").await;
    assert_eq!((r.status, r.error_field()), (StatusCode::BAD_REQUEST, Some("types")));
}
