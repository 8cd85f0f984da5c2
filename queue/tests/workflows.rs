//! Workflows against a real database: chains pass results on and stop at a failure, groups and
//! batches finish when all their jobs have, a batch's callbacks fire exactly once even when its
//! last jobs finish in concurrent statements, cancelling stops what has not run, and a step's
//! completion and the next step's start (or its failure and the rest cancelled) survive a lost
//! connection together. Graphs start a
//! step once all it depends on has completed (once, however its dependencies finish), and a
//! failure skips what is downstream of it while the other branches go on.

use std::time::Duration;

use rebound_queue::outcome::{HandlerError, Outcome};
use rebound_queue::store::{
    BatchCallbacks, ClaimRequest, Completion, Failure, GraphStep, NestedCounts, NewWorkflow, StoreError, Workflow, WorkflowCancel, WorkflowType,
};
use rebound_queue::testing::{Fault, FaultPoint, FaultProxy, TestDb};
use rebound_queue::{Job, JobState, NewJob, Store};
use serde_json::{Value, json};
use uuid::Uuid;

fn claim_req(limit: u32) -> ClaimRequest {
    ClaimRequest { worker_id: "w1".into(), queues: vec!["default".into()], limit, visibility_timeout: Duration::from_secs(60) }
}

async fn claim(s: &Store, limit: u32) -> Vec<Job> {
    s.claim(&claim_req(limit)).await.unwrap()
}

async fn complete(s: &Store, job: &Job, result: Value) {
    let done = s
        .complete_batch(&[Completion { id: job.id, attempt: Some(job.attempt), worker_id: Some("w1".into()), started_at: None, result: Some(result) }])
        .await
        .unwrap();
    assert_eq!(done, vec![job.id]);
}

/// A failure of `job`'s current attempt that discards it (no retries).
fn broken(job: &Job) -> Failure {
    Failure {
        id: job.id,
        attempt: Some(job.attempt),
        worker_id: Some("w1".into()),
        outcome: Outcome::Discard(HandlerError::new("step.broken", "it broke")),
        error_code: None,
    }
}

/// Fails the job for good (no retries left).
async fn fail_for_good(s: &Store, job: &Job) {
    s.fail(&broken(job)).await.unwrap();
}

fn job(t: &str, args: Value) -> NewJob {
    NewJob::new(t, args)
}

fn workflow(kind: WorkflowType, jobs: Vec<NewJob>) -> NewWorkflow {
    NewWorkflow { id: None, kind, name: Some("wf".into()), jobs, callbacks: BatchCallbacks::default(), graph: Vec::new(), nested: Default::default() }
}

async fn get(s: &Store, id: Uuid) -> Workflow {
    s.workflow(id).await.unwrap().expect("workflow exists")
}

fn states(wf: &Workflow) -> Vec<(i32, JobState)> {
    wf.members.iter().map(|m| (m.step, m.state)).collect()
}

#[tokio::test]
async fn a_chain_runs_its_steps_in_order_and_passes_every_result_on() {
    let db = TestDb::new().await;
    let s = &db.store;
    let wf = s.create_workflow(workflow(WorkflowType::Chain, vec![job("c.a", json!([1])), job("c.b", json!([2])), job("c.c", json!([3]))])).await.unwrap();
    assert_eq!((wf.state.as_str(), wf.job_count, wf.kind), ("running", 3, WorkflowType::Chain), "its first step is enqueued");
    assert!(wf.started_at.is_none());
    assert_eq!(states(&wf), [(0, JobState::Available), (1, JobState::Pending), (2, JobState::Pending)]);

    // Only the first step can be claimed; claiming it is the workflow's start.
    let first = claim(s, 10).await;
    assert_eq!(first.iter().map(|j| j.job_type.as_str()).collect::<Vec<_>>(), ["c.a"]);
    assert_eq!(first[0].extra["workflow_id"], json!(wf.id), "a workflow's job names it");
    assert!(first[0].extra.get("parent_results").is_none(), "the first step has no parents");
    assert!(get(s, wf.id).await.started_at.is_some());

    complete(s, &first[0], json!({"order": 7})).await;
    let second = claim(s, 10).await;
    assert_eq!(second.len(), 1, "the next step, and only it, is ready at once");
    assert_eq!((second[0].job_type.as_str(), &second[0].extra["parent_results"]), ("c.b", &json!([{"order": 7}])));
    complete(s, &second[0], json!("charged")).await;
    let third = claim(s, 10).await;
    assert_eq!(third[0].extra["parent_results"], json!([{"order": 7}, "charged"]), "every earlier step's result, by index");
    assert_eq!(get(s, wf.id).await.state, "running");
    complete(s, &third[0], json!(null)).await;

    let done = get(s, wf.id).await;
    assert_eq!((done.state.as_str(), done.completed_count, done.failed_count), ("completed", 3, 0));
    assert!(done.finished_at.is_some());
    assert_eq!(done.members[0].result, Some(json!({"order": 7})));
    assert!(claim(s, 10).await.is_empty());
}

#[tokio::test]
async fn a_chain_stops_at_a_step_that_fails_for_good_but_not_at_one_that_will_retry() {
    let db = TestDb::new().await;
    let s = &db.store;
    let wf = s.create_workflow(workflow(WorkflowType::Chain, vec![job("c.a", json!([])), job("c.b", json!([])), job("c.c", json!([]))])).await.unwrap();
    let a = claim(s, 1).await.remove(0);
    complete(s, &a, json!(1)).await;
    let b = claim(s, 1).await.remove(0);
    // A failure with retries left is no failure of the workflow.
    let retry = Failure {
        id: b.id,
        attempt: Some(b.attempt),
        worker_id: Some("w1".into()),
        outcome: Outcome::Retry(HandlerError::new("net.timeout", "slow")),
        error_code: None,
    };
    s.fail(&retry).await.unwrap();
    assert_eq!(s.job(b.id).await.unwrap().state, JobState::Retryable);
    assert_eq!(get(s, wf.id).await.state, "running");
    sqlx::query("UPDATE jobs SET scheduled_at = now() - interval '1 second' WHERE id = $1").bind(b.id).execute(s.pool()).await.unwrap();
    s.promote_due(10).await.unwrap();
    let b = claim(s, 1).await.remove(0);
    fail_for_good(s, &b).await;

    let failed = get(s, wf.id).await;
    assert_eq!((failed.state.as_str(), failed.completed_count, failed.failed_count, failed.failed_step_index), ("failed", 1, 1, Some(1)));
    assert_eq!(states(&failed), [(0, JobState::Completed), (1, JobState::Discarded), (2, JobState::Cancelled)]);
    let error = &failed.errors[0];
    assert_eq!((&error["job_id"], &error["code"], &error["message"], &error["attempt"]), (&json!(b.id), &json!("step.broken"), &json!("it broke"), &json!(2)));
    assert!(claim(s, 10).await.is_empty(), "the step after it never runs");
}

#[tokio::test]
async fn a_group_finishes_when_all_its_jobs_have_and_fails_if_any_did() {
    let db = TestDb::new().await;
    let s = &db.store;
    let wf = s.create_workflow(workflow(WorkflowType::Group, (0..3).map(|i| job("g.x", json!([i]))).collect())).await.unwrap();
    let jobs = claim(s, 10).await;
    assert_eq!(jobs.len(), 3, "every job of a group runs at once");
    fail_for_good(s, &jobs[0]).await;
    let after_failure = get(s, wf.id).await;
    assert_eq!((after_failure.state.as_str(), after_failure.failed_count), ("running", 1), "the others go on");
    complete(s, &jobs[1], json!("b")).await;
    assert_eq!(get(s, wf.id).await.state, "running");
    complete(s, &jobs[2], json!("c")).await;
    let done = get(s, wf.id).await;
    assert_eq!((done.state.as_str(), done.completed_count, done.failed_count), ("failed", 2, 1));

    let ok = s.create_workflow(workflow(WorkflowType::Group, (0..2).map(|i| job("g.y", json!([i]))).collect())).await.unwrap();
    for j in claim(s, 10).await {
        complete(s, &j, json!(true)).await;
    }
    assert_eq!(get(s, ok.id).await.state, "completed");
}

fn batch(jobs: usize, callbacks: BatchCallbacks) -> NewWorkflow {
    NewWorkflow { id: None, kind: WorkflowType::Batch, name: None, jobs: (0..jobs).map(|i| job("b.job", json!([i]))).collect(), callbacks, graph: Vec::new(), nested: Default::default() }
}

fn all_callbacks() -> BatchCallbacks {
    BatchCallbacks {
        on_complete: Some(job("b.complete", json!([]))),
        on_success: Some(job("b.success", json!([]))),
        on_failure: Some(job("b.failure", json!([]))),
    }
}

#[tokio::test]
async fn a_batch_fires_the_callbacks_its_outcome_calls_for_with_every_result() {
    let db = TestDb::new().await;
    let s = &db.store;
    let wf = s.create_workflow(batch(2, all_callbacks())).await.unwrap();
    assert_eq!(states(&wf), [(0, JobState::Available), (1, JobState::Available), (-1, JobState::Pending), (-2, JobState::Pending), (-3, JobState::Pending)]);
    let jobs = claim(s, 10).await;
    assert_eq!(jobs.iter().map(|j| j.job_type.as_str()).collect::<Vec<_>>(), ["b.job", "b.job"], "callbacks wait");
    let (first, second) = if jobs[0].args == json!([0]) { (&jobs[0], &jobs[1]) } else { (&jobs[1], &jobs[0]) };
    complete(s, first, json!({"sent": 1})).await;
    fail_for_good(s, second).await;

    let fired = claim(s, 10).await;
    let mut types: Vec<&str> = fired.iter().map(|j| j.job_type.as_str()).collect();
    types.sort();
    assert_eq!(types, ["b.complete", "b.failure"], "on_complete always, on_failure as one failed");
    for cb in &fired {
        assert_eq!(cb.extra["parent_results"], json!([{"sent": 1}, null]), "every job's result by index, null for the failed one");
    }
    let waiting = get(s, wf.id).await;
    assert_eq!((waiting.state.as_str(), waiting.failed_count), ("running", 1), "running while its callbacks run");
    assert_eq!(waiting.members.iter().find(|m| m.step == -2).map(|m| m.state), Some(JobState::Cancelled), "on_success never runs");
    complete(s, &fired[0], json!("ok")).await;
    assert_eq!(get(s, wf.id).await.state, "running");
    complete(s, &fired[1], json!("ok")).await;
    let done = get(s, wf.id).await;
    assert_eq!(done.state, "completed", "its callbacks completed (ojs-workflows §8.3)");

    // All jobs succeed: on_success; a callback that fails fails the batch.
    let wf = s.create_workflow(batch(1, all_callbacks())).await.unwrap();
    let j = claim(s, 10).await.remove(0);
    complete(s, &j, json!(5)).await;
    let mut fired = claim(s, 10).await;
    fired.sort_by(|a, b| a.job_type.cmp(&b.job_type));
    assert_eq!(fired.iter().map(|j| j.job_type.as_str()).collect::<Vec<_>>(), ["b.complete", "b.success"]);
    fail_for_good(s, &fired[1]).await;
    let failed = get(s, wf.id).await;
    assert_eq!(failed.state, "failed");
    assert_eq!(failed.errors[0]["role"], "on_success");
}

#[tokio::test]
async fn concurrent_finishes_fire_a_batch_s_callbacks_exactly_once() {
    let db = TestDb::new().await;
    let s = &db.store;
    let callbacks = BatchCallbacks { on_complete: Some(job("b.complete", json!([]))), ..Default::default() };
    let wf = s.create_workflow(batch(200, callbacks)).await.unwrap();
    let jobs = claim(s, 500).await;
    assert_eq!(jobs.len(), 200);
    // Four writers finish the jobs side by side, in batches of ten, as workers' completers do.
    let mut writers = Vec::new();
    for part in jobs.chunks(50) {
        let (store, part) = (s.clone(), part.to_vec());
        writers.push(tokio::spawn(async move {
            for chunk in part.chunks(10) {
                let items: Vec<Completion> = chunk
                    .iter()
                    .map(|j| Completion { id: j.id, attempt: Some(j.attempt), worker_id: Some("w1".into()), started_at: None, result: Some(json!(j.args[0])) })
                    .collect();
                store.complete_batch(&items).await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let fired = claim(s, 500).await;
    assert_eq!(fired.len(), 1, "one on_complete");
    let results = fired[0].extra["parent_results"].as_array().unwrap().clone();
    assert_eq!(results, (0..200).map(|i| json!(i)).collect::<Vec<_>>());
    let wf = get(s, wf.id).await;
    assert_eq!((wf.completed_count, wf.failed_count, wf.state.as_str()), (200, 0, "running"));
}

#[tokio::test]
async fn cancelling_stops_what_has_not_run_and_lets_running_jobs_finish() {
    let db = TestDb::new().await;
    let s = &db.store;
    let wf = s.create_workflow(workflow(WorkflowType::Chain, vec![job("c.a", json!([])), job("c.b", json!([]))])).await.unwrap();
    let running = claim(s, 1).await.remove(0);
    let WorkflowCancel::Cancelled(cancelled) = s.cancel_workflow(wf.id, None).await.unwrap() else { panic!("it was running") };
    assert_eq!(cancelled.state, "cancelled");
    assert!(cancelled.cancelled_at.is_some());
    assert_eq!(states(&cancelled), [(0, JobState::Active), (1, JobState::Cancelled)]);
    // The running step finishes; the workflow stays cancelled and nothing follows it.
    complete(s, &running, json!(1)).await;
    assert_eq!(get(s, wf.id).await.state, "cancelled");
    assert!(claim(s, 10).await.is_empty());
    assert!(matches!(s.cancel_workflow(wf.id, None).await.unwrap(), WorkflowCancel::AlreadyFinished(w) if w.state == "cancelled"));
    let unknown = s.cancel_workflow(Uuid::now_v7(), None).await;
    assert!(matches!(unknown, Err(StoreError::Missing { .. })), "{unknown:?}");

    // A group cancelled before anything ran: all of it.
    let group = s.create_workflow(workflow(WorkflowType::Group, vec![job("g", json!([])), job("g", json!([]))])).await.unwrap();
    let WorkflowCancel::Cancelled(g) = s.cancel_workflow(group.id, None).await.unwrap() else { panic!("running") };
    assert!(g.members.iter().all(|m| m.state == JobState::Cancelled));
}

#[tokio::test]
async fn a_bad_workflow_is_refused_whole_naming_the_field() {
    let db = TestDb::new().await;
    let s = &db.store;
    let refused = |r: Result<Workflow, StoreError>| match r {
        Err(StoreError::Invalid { field, .. }) => field,
        Err(StoreError::InvalidJob(v)) => v.field,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(refused(s.create_workflow(workflow(WorkflowType::Chain, vec![])).await), "jobs");
    assert_eq!(refused(s.create_workflow(batch(2, BatchCallbacks::default())).await), "callbacks");
    let mut chain = workflow(WorkflowType::Chain, vec![job("a", json!([]))]);
    chain.callbacks.on_complete = Some(job("cb", json!([])));
    assert_eq!(refused(s.create_workflow(chain).await), "callbacks");
    let bad_step = workflow(WorkflowType::Chain, vec![job("a", json!([])), job("", json!([]))]);
    assert!(refused(s.create_workflow(bad_step).await).starts_with("jobs[1]."));
    let mut unique = job("u", json!([]));
    unique.unique = Some(rebound_queue::job::UniqueSpec { key: "k".into(), on_conflict: rebound_queue::job::OnConflict::Reject, states: vec![], period: None });
    assert_eq!(refused(s.create_workflow(workflow(WorkflowType::Group, vec![unique])).await), "jobs[0].unique");
    let bad_callback = BatchCallbacks { on_failure: Some(job("cb", json!("not an array"))), ..Default::default() };
    assert!(refused(s.create_workflow(batch(1, bad_callback)).await).starts_with("callbacks.on_failure."));
    let count: i64 = sqlx::query_scalar("SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM workflows)").fetch_one(s.pool()).await.unwrap();
    assert_eq!(count, 0, "nothing half-created");

    // The same id twice is a duplicate, and the first stays as it was.
    let id = Uuid::now_v7();
    let first = NewWorkflow { id: Some(id), ..workflow(WorkflowType::Group, vec![job("a", json!([]))]) };
    s.create_workflow(first.clone()).await.unwrap();
    assert!(matches!(s.create_workflow(first).await, Err(StoreError::Duplicate { .. })));
    assert_eq!(get(s, id).await.members.len(), 1);
}

#[tokio::test]
async fn a_step_s_completion_and_the_next_step_s_start_are_one_write_under_a_lost_connection() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let wf = db.store.create_workflow(workflow(WorkflowType::Chain, vec![job("c.a", json!([])), job("c.b", json!([]))])).await.unwrap();
    let a = claim(&db.store, 1).await.remove(0);

    // Dropped before the server sees it: neither the completion nor the next step happened.
    let dropped = proxy.inject(Fault::once("SET state = 'completed'", FaultPoint::BeforeSend));
    let item = Completion { id: a.id, attempt: Some(a.attempt), worker_id: Some("w1".into()), started_at: None, result: Some(json!("a")) };
    assert!(through.complete_batch(std::slice::from_ref(&item)).await.is_err());
    assert_eq!(dropped.count(), 1);
    let wf_now = get(&db.store, wf.id).await;
    assert_eq!(states(&wf_now), [(0, JobState::Active), (1, JobState::Pending)]);

    // Committed with the answer lost: both happened, once; writing it again changes nothing.
    let lost = proxy.inject(Fault::once("SET state = 'completed'", FaultPoint::AfterCommit));
    assert!(through.complete_batch(std::slice::from_ref(&item)).await.is_err());
    assert_eq!(lost.count(), 1);
    assert_eq!(through.complete_batch(std::slice::from_ref(&item)).await.unwrap(), Vec::<Uuid>::new(), "already completed");
    let wf_now = get(&db.store, wf.id).await;
    assert_eq!(states(&wf_now), [(0, JobState::Completed), (1, JobState::Available)]);
    assert_eq!(wf_now.completed_count, 1, "counted once");
    let b = claim(&db.store, 10).await;
    assert_eq!((b.len(), &b[0].extra["parent_results"]), (1, &json!(["a"])));
}

#[tokio::test]
async fn a_step_s_failure_and_what_it_stops_are_one_write_under_a_lost_connection() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let wf = db.store.create_workflow(workflow(WorkflowType::Chain, vec![job("c.a", json!([])), job("c.b", json!([])), job("c.c", json!([]))])).await.unwrap();
    let a = claim(&db.store, 1).await.remove(0);
    let failure = broken(&a);

    // Dropped before the server sees it: the step is still running, nothing downstream moved.
    let dropped = proxy.inject(Fault::once("attempt = j.attempt + i.attempt_delta", FaultPoint::BeforeSend));
    assert!(through.fail_batch(std::slice::from_ref(&failure)).await.is_err());
    assert_eq!(dropped.count(), 1);
    let wf_now = get(&db.store, wf.id).await;
    assert_eq!((wf_now.state.as_str(), states(&wf_now)), ("running", vec![(0, JobState::Active), (1, JobState::Pending), (2, JobState::Pending)]));

    // Committed with the answer lost: the failure and the cancelled rest happened, once;
    // writing it again changes nothing.
    let lost = proxy.inject(Fault::once("attempt = j.attempt + i.attempt_delta", FaultPoint::AfterCommit));
    assert!(through.fail_batch(std::slice::from_ref(&failure)).await.is_err());
    assert_eq!(lost.count(), 1);
    assert!(through.fail_batch(std::slice::from_ref(&failure)).await.unwrap().is_empty(), "already failed");
    let wf_now = get(&db.store, wf.id).await;
    assert_eq!((wf_now.state.as_str(), wf_now.failed_count, wf_now.failed_step_index), ("failed", 1, Some(0)));
    assert_eq!(states(&wf_now), [(0, JobState::Discarded), (1, JobState::Cancelled), (2, JobState::Cancelled)]);
    assert_eq!(wf_now.errors.as_array().map(Vec::len), Some(1), "the failure is recorded once: {}", wf_now.errors);
    assert_eq!(db.store.attempts(a.id).await.unwrap().len(), 1);
}

#[tokio::test]
async fn finished_workflows_age_out_with_their_jobs_retention() {
    let db = TestDb::new().await;
    let s = &db.store;
    let old = s.create_workflow(workflow(WorkflowType::Group, vec![job("g", json!([]))])).await.unwrap();
    let j = claim(s, 1).await.remove(0);
    complete(s, &j, json!(1)).await;
    let live = s.create_workflow(workflow(WorkflowType::Group, vec![job("g", json!([]))])).await.unwrap();
    sqlx::query("UPDATE workflows SET finished_at = now() - interval '8 days' WHERE id = $1").bind(old.id).execute(s.pool()).await.unwrap();
    let report = s.prune(&rebound_queue::store::PruneConfig::default()).await.unwrap();
    assert_eq!(report.workflows, 1);
    assert!(s.workflow(old.id).await.unwrap().is_none());
    assert_eq!(get(s, live.id).await.state, "running", "an unfinished one stays, however old");
}

#[tokio::test]
async fn a_running_workflow_s_finished_steps_outlive_their_retention_until_it_finishes() {
    let db = TestDb::new().await;
    let s = &db.store;
    let at_once = rebound_queue::store::PruneConfig { completed_after: Duration::ZERO, ..Default::default() };
    let wf = s.create_workflow(workflow(WorkflowType::Chain, vec![job("c.a", json!([])), job("c.b", json!([])), job("c.c", json!([]))])).await.unwrap();
    let a = claim(s, 1).await.remove(0);
    complete(s, &a, json!("a")).await;
    // Beside it, a plain job finished as long ago: pruned.
    let plain = s.enqueue(job("plain", json!([]))).await.unwrap().job;
    let b = claim(s, 10).await;
    let (b, p): (Vec<Job>, Vec<Job>) = b.into_iter().partition(|j| j.id != plain.id);
    complete(s, &p[0], json!("p")).await;
    assert_eq!(s.prune(&at_once).await.unwrap().completed, 1);
    assert!(s.get_job(plain.id).await.unwrap().is_none());
    assert!(s.get_job(a.id).await.unwrap().is_some(), "the chain's first step is kept while the chain runs");

    // The third step is owed both results, by index.
    complete(s, &b[0], json!("b")).await;
    assert_eq!(s.prune(&at_once).await.unwrap().completed, 0);
    let c = claim(s, 1).await.remove(0);
    assert_eq!(c.extra["parent_results"], json!(["a", "b"]));
    complete(s, &c, json!("c")).await;
    assert_eq!(get(s, wf.id).await.state, "completed");
    // Finished, its steps age out as any job does.
    assert_eq!(s.prune(&at_once).await.unwrap().completed, 3);
}

#[tokio::test]
async fn a_running_workflow_s_kept_jobs_never_hold_up_the_pruning_of_others() {
    let db = TestDb::new().await;
    let s = &db.store;
    // Windows of two candidates, a few per pass: nine kept jobs older than the prunable one
    // fill more windows than a pass reads.
    let at_once = rebound_queue::store::PruneConfig { completed_after: Duration::ZERO, batch: 2, ..Default::default() };
    let wf = s.create_workflow(workflow(WorkflowType::Group, (0..10).map(|i| job("g.k", json!([i]))).collect())).await.unwrap();
    let members = claim(s, 10).await;
    for m in &members[..9] {
        complete(s, m, json!("done")).await;
    }
    let plain = s.enqueue(job("plain", json!([]))).await.unwrap().job;
    let p = claim(s, 1).await.remove(0);
    assert_eq!(p.id, plain.id);
    complete(s, &p, json!("p")).await;
    assert_eq!(s.prune(&at_once).await.unwrap().completed, 1, "the plain job went, past the kept ones");
    assert!(s.get_job(plain.id).await.unwrap().is_none());
    assert_eq!(get(s, wf.id).await.members.iter().filter(|m| m.state == JobState::Completed).count(), 9);
}

#[tokio::test]
async fn creating_or_cancelling_cut_off_midway_leaves_nothing_half_done() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();

    // The workflow's row went in; the connection drops as its jobs are sent: neither stays.
    let cut = proxy.inject(Fault::once("INSERT INTO jobs", FaultPoint::BeforeSend));
    let id = Uuid::now_v7();
    let wf = NewWorkflow { id: Some(id), ..workflow(WorkflowType::Chain, vec![job("c.a", json!([])), job("c.b", json!([]))]) };
    assert!(through.create_workflow(wf.clone()).await.is_err());
    assert_eq!(cut.count(), 1);
    assert!(db.store.workflow(id).await.unwrap().is_none(), "no workflow without its jobs");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(db.store.pool()).await.unwrap();
    assert_eq!(jobs, 0);
    // Sent again, it is created whole.
    let created = through.create_workflow(wf).await.unwrap();
    assert_eq!(created.members.len(), 2);

    // The cancel's update of the jobs is lost before it runs: the workflow is not cancelled
    // either, and cancelling again does it all.
    let cut = proxy.inject(Fault::once("WHERE workflow_id = $1 AND state IN", FaultPoint::BeforeSend));
    assert!(through.cancel_workflow(id, None).await.is_err());
    assert_eq!(cut.count(), 1);
    let after = get(&db.store, id).await;
    assert_eq!((after.state.as_str(), states(&after)), ("running", vec![(0, JobState::Available), (1, JobState::Pending)]));
    let WorkflowCancel::Cancelled(done) = through.cancel_workflow(id, None).await.unwrap() else { panic!("it was running") };
    assert_eq!(states(&done), [(0, JobState::Cancelled), (1, JobState::Cancelled)]);

    // Committed with the answer lost: cancelled once; asked again, it says it is finished.
    let other = db.store.create_workflow(workflow(WorkflowType::Group, vec![job("g", json!([]))])).await.unwrap();
    let lost = proxy.inject(Fault::once("WHERE workflow_id = $1 AND state IN", FaultPoint::AfterCommit));
    assert!(through.cancel_workflow(other.id, None).await.is_err());
    assert_eq!(lost.count(), 1);
    assert_eq!(get(&db.store, other.id).await.state, "cancelled");
    assert!(matches!(through.cancel_workflow(other.id, None).await.unwrap(), WorkflowCancel::AlreadyFinished(_)));
}

#[tokio::test]
async fn workflows_are_listed_newest_first_by_state_and_paged() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(s.create_workflow(workflow(WorkflowType::Group, vec![job("g", json!([]))])).await.unwrap().id);
    }
    s.cancel_workflow(ids[1], None).await.unwrap();
    let all: Vec<Uuid> = s.list_workflows(None, None, 10).await.unwrap().iter().map(|w| w.id).collect();
    assert_eq!(all, [ids[2], ids[1], ids[0]]);
    let page: Vec<Uuid> = s.list_workflows(None, Some(ids[2]), 1).await.unwrap().iter().map(|w| w.id).collect();
    assert_eq!(page, [ids[1]]);
    let cancelled: Vec<Uuid> = s.list_workflows(Some("cancelled"), None, 10).await.unwrap().iter().map(|w| w.id).collect();
    assert_eq!(cancelled, [ids[1]]);
    let running: Vec<Uuid> = s.list_workflows(Some("running"), Some(ids[2]), 10).await.unwrap().iter().map(|w| w.id).collect();
    assert_eq!(running, [ids[0]], "each shape of the listing has a statement of its own: state and page together");
}

#[tokio::test]
async fn a_workflow_whose_unfinished_job_is_deleted_fails_instead_of_waiting_forever() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut jobs: Vec<NewJob> = (0..2).map(|i| job("g", json!([i]))).collect();
    jobs[1].queue = "doomed".into();
    let wf = s.create_workflow(workflow(WorkflowType::Group, jobs)).await.unwrap();
    let purged = s.purge_queue("doomed", &[JobState::Available], None, &rebound_queue::store::Actor::new("ops")).await.unwrap();
    assert_eq!(purged, (1, false));
    let failed = get(s, wf.id).await;
    assert_eq!((failed.state.as_str(), failed.failed_count), ("failed", 1));
    assert_eq!(failed.errors[0]["code"], "deleted");
    // The job left finishes without moving it.
    let j = claim(s, 10).await.remove(0);
    complete(s, &j, json!(1)).await;
    assert_eq!(get(s, wf.id).await.state, "failed");
}

#[tokio::test]
async fn batches_finishing_jobs_of_the_same_workflows_in_opposite_orders_never_deadlock() {
    let db = TestDb::new().await;
    let s = &db.store;
    let group = |t: &str| workflow(WorkflowType::Group, (0..40).map(|i| job(t, json!([i]))).collect());
    let (w1, w2) = (s.create_workflow(group("w.one")).await.unwrap(), s.create_workflow(group("w.two")).await.unwrap());
    let jobs = claim(s, 500).await;
    let of = |t: &str| jobs.iter().filter(|j| j.job_type == t).cloned().collect::<Vec<_>>();
    let (ones, twos) = (of("w.one"), of("w.two"));
    let done = |j: &Job| Completion { id: j.id, attempt: Some(j.attempt), worker_id: Some("w1".into()), started_at: None, result: Some(json!(1)) };
    // Twenty pairs of statements at once, each finishing a job of each workflow: one pair
    // names the first workflow's job first, the other the second's.
    let mut writers = Vec::new();
    for i in 0..20 {
        let forward = vec![done(&ones[2 * i]), done(&twos[2 * i])];
        let backward = vec![done(&twos[2 * i + 1]), done(&ones[2 * i + 1])];
        for batch in [forward, backward] {
            let store = s.clone();
            writers.push(tokio::spawn(async move { store.complete_batch(&batch).await }));
        }
    }
    for w in writers {
        let written = w.await.unwrap().expect("no statement is chosen as a deadlock victim");
        assert_eq!(written.len(), 2);
    }
    for wf in [w1.id, w2.id] {
        let wf = get(s, wf).await;
        assert_eq!((wf.state.as_str(), wf.completed_count), ("completed", 40));
    }
}

#[tokio::test]
async fn a_workflow_s_start_steps_and_end_are_ojs_events() {
    use rebound_queue::store::EventFilter;
    let db = TestDb::new().await;
    let s = &db.store;
    let ok = s.create_workflow(workflow(WorkflowType::Chain, vec![job("c.a", json!([])), job("c.b", json!([]))])).await.unwrap();
    for _ in 0..2 {
        let j = claim(s, 1).await.remove(0);
        complete(s, &j, json!(1)).await;
    }
    let broken = s.create_workflow(workflow(WorkflowType::Chain, vec![job("d.a", json!([])), job("d.b", json!([]))])).await.unwrap();
    let j = claim(s, 1).await.remove(0);
    fail_for_good(s, &j).await;

    let all = EventFilter { limit: 100, ..Default::default() };
    let mut seen = s.workflow_events(&all).await.unwrap();
    seen.reverse();
    let kinds: Vec<(&str, Uuid)> = seen.iter().map(|e| (e.event_type.as_str(), e.workflow_id)).collect();
    assert_eq!(
        kinds,
        [
            ("workflow.started", ok.id),
            ("workflow.step_completed", ok.id),
            // The last step's completion and the workflow's are one statement's, one moment's:
            // events of one moment are ordered by type.
            ("workflow.completed", ok.id),
            ("workflow.step_completed", ok.id),
            ("workflow.started", broken.id),
            ("workflow.failed", broken.id),
        ]
    );
    assert_eq!((&seen[0].data["workflow_name"], &seen[0].data["total_steps"]), (&json!("wf"), &json!(2)));
    assert_eq!((&seen[1].data["step_id"], &seen[1].data["step_type"], &seen[1].data["steps_remaining"]), (&json!("step-0"), &json!("c.a"), &json!(1)));
    assert_eq!(seen[3].data["steps_remaining"], json!(0));
    assert_eq!(seen[2].at, seen[3].at);
    assert!(seen[2].data["duration_ms"].as_i64().is_some_and(|ms| ms >= 0));
    let failed = &seen[5].data;
    assert_eq!((&failed["failed_step_id"], &failed["failed_step_type"], &failed["error"]["code"]), (&json!("step-0"), &json!("d.a"), &json!("step.broken")));
    // Not queue events: a queue filter finds none; a type filter finds its own.
    assert!(s.workflow_events(&EventFilter { queues: vec!["default".into()], ..all.clone() }).await.unwrap().is_empty());
    let ends = s.workflow_events(&EventFilter { types: vec!["workflow.completed".into(), "workflow.failed".into()], ..all.clone() }).await.unwrap();
    assert_eq!(ends.len(), 2);
    // Aged out with the completed jobs.
    sqlx::query("UPDATE workflow_events SET at = at - interval '2 days'").execute(s.pool()).await.unwrap();
    assert_eq!(s.prune(&rebound_queue::store::PruneConfig::default()).await.unwrap().workflow_events, 6);
}

fn graph(steps: &[(&str, &[&str])]) -> NewWorkflow {
    NewWorkflow {
        id: None,
        kind: WorkflowType::Graph,
        name: Some("dag".into()),
        jobs: steps.iter().map(|(id, _)| job(&format!("g.{id}"), json!([id]))).collect(),
        callbacks: BatchCallbacks::default(),
        graph: steps.iter().map(|(id, after)| GraphStep { id: id.to_string(), depends_on: after.iter().map(|a| a.to_string()).collect() }).collect(),
        nested: Default::default(),
    }
}

fn types(jobs: &[Job]) -> Vec<&str> {
    let mut t: Vec<&str> = jobs.iter().map(|j| j.job_type.as_str()).collect();
    t.sort_unstable();
    t
}

async fn step_events(s: &Store, wf: Uuid, kind: &str, key: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT data->>$3 FROM workflow_events WHERE workflow_id = $1 AND type = $2 ORDER BY id")
        .bind(wf)
        .bind(kind)
        .bind(key)
        .fetch_all(s.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_graph_starts_each_step_once_everything_it_depends_on_has_completed() {
    let db = TestDb::new().await;
    let s = &db.store;
    // a -> (b, c) -> d
    let wf = s.create_workflow(graph(&[("a", &[]), ("b", &["a"]), ("c", &["a"]), ("d", &["b", "c"])])).await.unwrap();
    assert_eq!((wf.kind, wf.state.as_str(), wf.job_count), (WorkflowType::Graph, "running", 4));
    assert_eq!(states(&wf), [(0, JobState::Available), (1, JobState::Pending), (2, JobState::Pending), (3, JobState::Pending)]);
    let ids: Vec<String> = wf.members.iter().map(|m| m.step_id()).collect();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    assert_eq!(wf.members[3].graph.as_ref().map(|g| g.depends_on.clone()), Some(vec!["b".to_string(), "c".to_string()]));

    let a = claim(s, 10).await;
    assert_eq!(types(&a), ["g.a"], "only the root can run");
    complete(s, &a[0], json!({"rows": 3})).await;
    let fanned = claim(s, 10).await;
    assert_eq!(types(&fanned), ["g.b", "g.c"], "both dependents of a start together");
    for j in &fanned {
        assert_eq!(j.extra["parent_results"], json!({"a": {"rows": 3}}), "the results upstream, by step id");
    }
    let (b, c) = if fanned[0].job_type == "g.b" { (&fanned[0], &fanned[1]) } else { (&fanned[1], &fanned[0]) };
    complete(s, b, json!("b done")).await;
    assert!(claim(s, 10).await.is_empty(), "d still waits for c");
    assert_eq!(get(s, wf.id).await.members[3].state, JobState::Pending);
    complete(s, c, json!(null)).await;
    let d = claim(s, 10).await;
    assert_eq!(types(&d), ["g.d"]);
    assert_eq!(d[0].extra["parent_results"], json!({"a": {"rows": 3}, "b": "b done", "c": null}), "everything upstream, not only the direct dependencies");
    assert_eq!(get(s, wf.id).await.state, "running");
    complete(s, &d[0], json!(1)).await;

    let done = get(s, wf.id).await;
    assert_eq!((done.state.as_str(), done.completed_count, done.failed_count, done.skipped_count), ("completed", 4, 0, 0));
    assert!(done.finished_at.is_some());
    assert_eq!(step_events(s, wf.id, "workflow.step_completed", "step_id").await, ["a", "b", "c", "d"], "events name the steps by their ids");
    assert_eq!(step_events(s, wf.id, "workflow.completed", "total_steps").await, ["4"]);
}

#[tokio::test]
async fn a_graph_step_that_fails_skips_what_is_downstream_while_other_branches_go_on() {
    let db = TestDb::new().await;
    let s = &db.store;
    // a -> b -> c, beside x -> y
    let wf = s.create_workflow(graph(&[("a", &[]), ("b", &["a"]), ("c", &["b"]), ("x", &[]), ("y", &["x"])])).await.unwrap();
    let roots = claim(s, 10).await;
    assert_eq!(types(&roots), ["g.a", "g.x"]);
    let (a, x) = if roots[0].job_type == "g.a" { (&roots[0], &roots[1]) } else { (&roots[1], &roots[0]) };
    fail_for_good(s, a).await;

    let after = get(s, wf.id).await;
    assert_eq!((after.state.as_str(), after.failed_count, after.skipped_count), ("running", 1, 2), "x's branch is still running");
    assert_eq!(states(&after), [(0, JobState::Discarded), (1, JobState::Cancelled), (2, JobState::Cancelled), (3, JobState::Active), (4, JobState::Pending)]);
    let skipped = s.job(after.members[2].job_id).await.unwrap();
    assert_eq!(skipped.last_error.as_ref().map(|e| (e["type"].clone(), e["message"].clone())), Some((json!("rebound.upstream_failed"), json!("step a failed"))));
    assert_eq!(after.errors.as_array().map(Vec::len), Some(1), "the skipped steps are not failures of their own");

    complete(s, x, json!("x")).await;
    let y = claim(s, 10).await;
    assert_eq!(types(&y), ["g.y"], "the branch that does not depend on a goes on");
    complete(s, &y[0], json!("y")).await;
    let failed = get(s, wf.id).await;
    assert_eq!((failed.state.as_str(), failed.completed_count, failed.failed_count, failed.skipped_count), ("failed", 2, 1, 2));
    assert!(failed.finished_at.is_some());
    assert_eq!(step_events(s, wf.id, "workflow.failed", "failed_step_id").await, ["a"]);

    // A failure whose downstream is all that is left finishes the graph at once.
    let wf = s.create_workflow(graph(&[("p", &[]), ("q", &["p"])])).await.unwrap();
    let p = claim(s, 10).await.remove(0);
    fail_for_good(s, &p).await;
    let failed = get(s, wf.id).await;
    assert_eq!((failed.state.as_str(), failed.failed_count, failed.skipped_count), ("failed", 1, 1));
}

#[tokio::test]
async fn a_graph_s_join_starts_once_when_its_dependencies_finish_side_by_side() {
    let db = TestDb::new().await;
    let s = &db.store;
    // Forty roots, one join on all of them; ten writers finish the roots concurrently.
    let names: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
    let mut steps: Vec<(&str, &[&str])> = names.iter().map(|n| (n.as_str(), &[][..])).collect();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    steps.push(("join", &all));
    let wf = s.create_workflow(graph(&steps)).await.unwrap();
    let roots = claim(s, 100).await;
    assert_eq!(roots.len(), 40);
    let mut writers = Vec::new();
    for part in roots.chunks(4) {
        let (store, part) = (s.clone(), part.to_vec());
        writers.push(tokio::spawn(async move {
            let items: Vec<Completion> =
                part.iter().map(|j| Completion { id: j.id, attempt: Some(j.attempt), worker_id: Some("w1".into()), started_at: None, result: Some(j.args[0].clone()) }).collect();
            store.complete_batch(&items).await.unwrap();
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let join = claim(s, 100).await;
    assert_eq!(types(&join), ["g.join"], "started exactly once");
    let results = join[0].extra["parent_results"].as_object().cloned().unwrap_or_default();
    assert_eq!(results.len(), 40);
    assert_eq!(results.get("r7"), Some(&json!("r7")));
    assert_eq!(get(s, wf.id).await.completed_count, 40);
}

#[tokio::test]
async fn a_bad_graph_is_refused_naming_the_step() {
    let db = TestDb::new().await;
    let s = &db.store;
    let refused = |r: Result<Workflow, StoreError>| match r {
        Err(StoreError::Invalid { field, reason }) => format!("{field}: {reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let cycle = refused(s.create_workflow(graph(&[("a", &[]), ("b", &["a", "d"]), ("c", &["b"]), ("d", &["c"])])).await);
    assert!(cycle.contains("depends_on: the dependencies form a cycle") && cycle.contains("b -> d -> c -> b"), "{cycle}");
    let itself = refused(s.create_workflow(graph(&[("a", &["a"])])).await);
    assert!(itself.starts_with("jobs[0].depends_on:") && itself.contains("a -> a"), "{itself}");
    let unknown = refused(s.create_workflow(graph(&[("a", &[]), ("b", &["nope"])])).await);
    assert!(unknown.starts_with("jobs[1].depends_on:") && unknown.contains("\"nope\""), "{unknown}");
    let twice = refused(s.create_workflow(graph(&[("a", &[]), ("a", &[])])).await);
    assert!(twice.starts_with("jobs[1].id:") && twice.contains("jobs[0]"), "{twice}");
    let mut short = graph(&[("a", &[])]);
    short.jobs.push(job("extra", json!([])));
    assert!(refused(s.create_workflow(short).await).starts_with("graph:"));
    let mut chain = workflow(WorkflowType::Chain, vec![job("a", json!([]))]);
    chain.graph = vec![GraphStep { id: "a".into(), depends_on: vec![] }];
    assert!(refused(s.create_workflow(chain).await).starts_with("graph:"));
    let count: i64 = sqlx::query_scalar("SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM workflows) + (SELECT count(*) FROM workflow_steps)")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(count, 0, "nothing half-created");
}

#[tokio::test]
async fn a_graph_s_creation_and_its_join_s_start_survive_a_lost_connection() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();

    // Cut as the steps are sent, after the workflow's row: nothing of it stays.
    let cut = proxy.inject(Fault::once("INSERT INTO workflow_steps", FaultPoint::BeforeSend));
    let id = Uuid::now_v7();
    let wf = NewWorkflow { id: Some(id), ..graph(&[("a", &[]), ("b", &[]), ("join", &["a", "b"])]) };
    assert!(through.create_workflow(wf.clone()).await.is_err());
    assert_eq!(cut.count(), 1);
    let left: i64 = sqlx::query_scalar("SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM workflows) + (SELECT count(*) FROM workflow_steps)")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0);
    through.create_workflow(wf).await.unwrap();

    let roots = claim(&db.store, 10).await;
    let (a, b) = if roots[0].job_type == "g.a" { (&roots[0], &roots[1]) } else { (&roots[1], &roots[0]) };
    complete(&db.store, a, json!("a")).await;
    // The last dependency's completion commits with its answer lost: the join started with it,
    // once; writing the completion again changes nothing.
    let item = Completion { id: b.id, attempt: Some(b.attempt), worker_id: Some("w1".into()), started_at: None, result: Some(json!("b")) };
    let lost = proxy.inject(Fault::once("SET state = 'completed'", FaultPoint::AfterCommit));
    assert!(through.complete_batch(std::slice::from_ref(&item)).await.is_err());
    assert_eq!(lost.count(), 1);
    assert_eq!(through.complete_batch(std::slice::from_ref(&item)).await.unwrap(), Vec::<Uuid>::new(), "already completed");
    let join = claim(&db.store, 10).await;
    assert_eq!(types(&join), ["g.join"]);
    assert_eq!(join[0].extra["parent_results"], json!({"a": "a", "b": "b"}));
    assert_eq!(get(&db.store, id).await.completed_count, 2, "counted once");
}

fn nested(mut wf: NewWorkflow, inner: Vec<(usize, NewWorkflow)>) -> NewWorkflow {
    for (i, w) in inner {
        wf.jobs.insert(i, NewWorkflow::standing_job(w.kind));
        wf.nested.insert(i, w);
    }
    wf
}

async fn claim_types(s: &Store) -> Vec<Job> {
    let mut jobs = claim(s, 20).await;
    jobs.sort_by(|a, b| a.job_type.cmp(&b.job_type));
    jobs
}

#[tokio::test]
async fn a_chain_with_a_group_as_a_step_fans_out_and_hands_the_group_s_results_on() {
    let db = TestDb::new().await;
    let s = &db.store;
    let group = workflow(WorkflowType::Group, vec![job("t.csv", json!([])), job("t.json", json!([]))]);
    let wf = s.create_workflow(nested(workflow(WorkflowType::Chain, vec![job("extract", json!([])), job("load", json!([]))]), vec![(1, group)])).await.unwrap();
    assert_eq!(wf.job_count, 3, "extract, the group, load");
    let inner = wf.members[1].nested.clone().expect("step 1 is the group");
    assert_eq!((inner.kind, inner.state.as_str(), inner.parent_id), (WorkflowType::Group, "pending", Some(wf.id)), "it waits for extract");
    assert_eq!(wf.members[1].job_type, "rebound.workflow.group");
    assert!(inner.members.iter().all(|m| m.state == JobState::Pending));
    // The job standing for it is never handed out, not even when asked for.
    assert!(s.activate(wf.members[1].job_id, None).await.is_err());

    let extract = claim_types(s).await;
    assert_eq!(types(&extract), ["extract"], "the group's jobs wait with it");
    assert!(get(s, wf.id).await.started_at.is_some());
    complete(s, &extract[0], json!({"rows": 2})).await;
    let fanned = claim_types(s).await;
    assert_eq!(types(&fanned), ["t.csv", "t.json"]);
    for j in &fanned {
        assert_eq!(j.extra["parent_results"], json!([{"rows": 2}]), "the group's jobs get the chain's results");
        assert_eq!(j.extra["workflow_id"], json!(inner.id));
    }
    assert_eq!(get(s, inner.id).await.state, "running");
    complete(s, &fanned[0], json!("a.csv")).await;
    assert!(claim(s, 20).await.is_empty(), "load waits for the whole group");
    complete(s, &fanned[1], json!("a.json")).await;

    let load = claim_types(s).await;
    assert_eq!(types(&load), ["load"]);
    assert_eq!(load[0].extra["parent_results"], json!([{"rows": 2}, ["a.csv", "a.json"]]), "the group's entry holds each of its jobs' results");
    complete(s, &load[0], json!("loaded")).await;
    let done = get(s, wf.id).await;
    assert_eq!((done.state.as_str(), done.completed_count), ("completed", 3));
    let inner = done.members[1].nested.clone().expect("nested");
    assert_eq!((inner.state.as_str(), inner.completed_count), ("completed", 2));
    assert_eq!(done.members[1].state, JobState::Completed);
    let listed: Vec<Uuid> = s.list_workflows(None, None, 10).await.unwrap().iter().map(|w| w.id).collect();
    assert_eq!(listed, [wf.id], "nested workflows are listed through their parent");
}

#[tokio::test]
async fn a_failure_three_levels_down_fails_each_workflow_it_is_nested_in() {
    let db = TestDb::new().await;
    let s = &db.store;
    // chain[a, group[chain[b, c], d], e]
    let inner_chain = workflow(WorkflowType::Chain, vec![job("b", json!([])), job("c", json!([]))]);
    let group = nested(workflow(WorkflowType::Group, vec![job("d", json!([]))]), vec![(0, inner_chain)]);
    let wf = s.create_workflow(nested(workflow(WorkflowType::Chain, vec![job("a", json!([])), job("e", json!([]))]), vec![(1, group)])).await.unwrap();
    let a = claim_types(s).await;
    assert_eq!(types(&a), ["a"]);
    complete(s, &a[0], json!(1)).await;
    let second = claim_types(s).await;
    assert_eq!(types(&second), ["b", "d"], "the group starts, and the chain inside it");
    let (b, d) = (&second[0], &second[1]);
    complete(s, b, json!(2)).await;
    let c = claim_types(s).await;
    assert_eq!((types(&c), &c[0].extra["parent_results"]), (vec!["c"], &json!([2])), "the results before it in its own chain");
    fail_for_good(s, &c[0]).await;

    let mid = get(s, wf.id).await;
    let group_now = mid.members[1].nested.clone().expect("group");
    let chain_now = group_now.members[0].nested.clone().expect("inner chain");
    assert_eq!(chain_now.state, "failed");
    assert_eq!((group_now.state.as_str(), group_now.failed_count), ("running", 1), "the group waits for d");
    assert_eq!(mid.state, "running");
    complete(s, d, json!(3)).await;

    let failed = get(s, wf.id).await;
    assert_eq!((failed.state.as_str(), failed.failed_step_index), ("failed", Some(1)));
    assert_eq!(failed.members[1].nested.as_ref().map(|g| g.state.as_str()), Some("failed"));
    assert_eq!(failed.members[2].state, JobState::Cancelled, "the step after the group never runs");
    assert_eq!(failed.errors[0]["code"], "rebound.workflow_failed");
    let message = failed.errors[0]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("nested group") && message.contains("nested chain") && message.contains("it broke"), "{message}");
    // Five jobs through the levels: a, b and d completed, c failed, e never ran; the chain's
    // own counters see three steps, one of them (the group) failed.
    assert_eq!((failed.job_count, failed.completed_count, failed.failed_count), (3, 1, 1));
    assert_eq!(failed.counts_with_nested(), NestedCounts { jobs: 5, completed: 3, failed: 1 });
}

#[tokio::test]
async fn a_batch_s_callbacks_get_a_nested_chain_s_results_and_cancelling_reaches_every_level() {
    let db = TestDb::new().await;
    let s = &db.store;
    let callbacks = BatchCallbacks { on_complete: Some(job("report", json!([]))), ..Default::default() };
    let inner = workflow(WorkflowType::Chain, vec![job("x", json!([])), job("y", json!([]))]);
    let batch = NewWorkflow { callbacks, ..nested(workflow(WorkflowType::Batch, vec![job("z", json!([]))]), vec![(0, inner)]) };
    let wf = s.create_workflow(batch).await.unwrap();
    let first = claim_types(s).await;
    assert_eq!(types(&first), ["x", "z"]);
    complete(s, &first[0], json!("x")).await;
    complete(s, &first[1], json!("z")).await;
    let y = claim_types(s).await;
    complete(s, &y[0], json!("y")).await;
    let report = claim_types(s).await;
    assert_eq!((types(&report), &report[0].extra["parent_results"]), (vec!["report"], &json!([["x", "y"], "z"])));
    complete(s, &report[0], json!(null)).await;
    assert_eq!(get(s, wf.id).await.state, "completed");

    // Cancelled while its first step runs: the nested group that waits is cancelled with its jobs.
    let group = workflow(WorkflowType::Group, vec![job("g1", json!([])), job("g2", json!([]))]);
    let wf = s.create_workflow(nested(workflow(WorkflowType::Chain, vec![job("first", json!([]))]), vec![(1, group)])).await.unwrap();
    let running = claim_types(s).await;
    assert_eq!(types(&running), ["first"]);
    let WorkflowCancel::Cancelled(cancelled) = s.cancel_workflow(wf.id, None).await.unwrap() else { panic!("it was running") };
    let group = cancelled.members[1].nested.clone().expect("group");
    assert_eq!(group.state, "cancelled");
    assert!(group.members.iter().all(|m| m.state == JobState::Cancelled), "{:?}", states(&group));
    complete(s, &running[0], json!(1)).await;
    assert!(claim(s, 20).await.is_empty());
}

#[tokio::test]
async fn nesting_deeper_than_three_levels_is_refused_at_creation() {
    let db = TestDb::new().await;
    let s = &db.store;
    let level = |inner: NewWorkflow| nested(workflow(WorkflowType::Group, vec![job("j", json!([]))]), vec![(0, inner)]);
    let three = level(level(workflow(WorkflowType::Chain, vec![job("leaf", json!([]))])));
    s.create_workflow(three).await.expect("three levels are fine");
    let four = level(level(level(workflow(WorkflowType::Chain, vec![job("leaf", json!([]))]))));
    match s.create_workflow(four).await {
        Err(StoreError::Invalid { field, reason }) => {
            assert_eq!(field, "jobs[0].jobs[0].jobs[0]");
            assert!(reason.contains("at most 3 levels"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let bad_inner = level(workflow(WorkflowType::Chain, vec![job("ok", json!([])), job("bad", json!("not an array"))]));
    match s.create_workflow(bad_inner).await {
        Err(StoreError::InvalidJob(v)) => assert!(v.field.starts_with("jobs[0].jobs[1]."), "{}", v.field),
        Err(StoreError::Invalid { field, .. }) => assert!(field.starts_with("jobs[0].jobs[1]."), "{field}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM workflows").fetch_one(s.pool()).await.unwrap();
    assert_eq!(count, 3, "only the three-level one, whole");
}

#[tokio::test]
async fn a_nested_workflow_s_end_and_its_parent_s_next_step_are_one_write_under_a_lost_connection() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let group = workflow(WorkflowType::Group, vec![job("g", json!([]))]);
    let wf = db.store.create_workflow(nested(workflow(WorkflowType::Chain, vec![job("after", json!([]))]), vec![(0, group)])).await.unwrap();
    let g = claim_types(&db.store).await;
    assert_eq!(types(&g), ["g"], "the group is the chain's first step");
    let item = Completion { id: g[0].id, attempt: Some(g[0].attempt), worker_id: Some("w1".into()), started_at: None, result: Some(json!("g")) };

    // Dropped before the server sees it: the group, the job standing for it and the chain stay.
    let dropped = proxy.inject(Fault::once("SET state = 'completed'", FaultPoint::BeforeSend));
    assert!(through.complete_batch(std::slice::from_ref(&item)).await.is_err());
    assert_eq!(dropped.count(), 1);
    let now = get(&db.store, wf.id).await;
    assert_eq!((now.members[0].state, now.members[0].nested.as_ref().map(|n| n.state.clone())), (JobState::Pending, Some("running".into())));
    assert!(claim(&db.store, 10).await.is_empty());

    // Committed with the answer lost: all of it happened, once.
    let lost = proxy.inject(Fault::once("SET state = 'completed'", FaultPoint::AfterCommit));
    assert!(through.complete_batch(std::slice::from_ref(&item)).await.is_err());
    assert_eq!(lost.count(), 1);
    assert_eq!(through.complete_batch(std::slice::from_ref(&item)).await.unwrap(), Vec::<Uuid>::new(), "already completed");
    let next = claim_types(&db.store).await;
    assert_eq!((types(&next), &next[0].extra["parent_results"]), (vec!["after"], &json!([["g"]])));
    complete(&db.store, &next[0], json!(1)).await;

    // Aged out, the outermost takes the nested one with it.
    sqlx::query("UPDATE workflows SET finished_at = now() - interval '30 days'").execute(db.store.pool()).await.unwrap();
    let report = db.store.prune(&rebound_queue::store::PruneConfig::default()).await.unwrap();
    assert_eq!(report.workflows, 1, "the outermost is the one pruned");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM workflows").fetch_one(db.store.pool()).await.unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn workflow_jobs_that_cannot_run_on_their_own_are_refused_a_retry() {
    let db = TestDb::new().await;
    let s = &db.store;
    let actor = rebound_queue::store::Actor::new("olivia");
    // a -> b beside c; a fails, so b is skipped; c runs on.
    let wf = s.create_workflow(graph(&[("a", &[]), ("b", &["a"]), ("c", &[])])).await.unwrap();
    let roots = claim_types(s).await;
    fail_for_good(s, &roots[0]).await;
    let skipped = get(s, wf.id).await.members[1].job_id;
    let report = s.retry_finished_jobs(&rebound_queue::store::JobSelection::Ids(vec![skipped]), &actor).await.unwrap();
    assert_eq!(report.succeeded, 0);
    assert!(report.refused.first().is_some_and(|(id, why)| *id == skipped && why.contains("workflow")), "{:?}", report.refused);
    assert_eq!(s.job(skipped).await.unwrap().state, JobState::Cancelled);
    // The failed step itself may run again; its completion leaves the graph's failure counted.
    let failed = roots[0].id;
    assert_eq!(s.retry_finished_jobs(&rebound_queue::store::JobSelection::Ids(vec![failed]), &actor).await.unwrap().succeeded, 1);
    let again = claim_types(s).await;
    let a = again.iter().find(|j| j.id == failed).expect("a runs again");
    complete(s, a, json!("late")).await;
    let now = get(s, wf.id).await;
    assert_eq!((now.state.as_str(), now.failed_count, now.completed_count, now.errors.as_array().map(Vec::len)), ("running", 1, 0, Some(1)));
    complete(s, &roots[1], json!("c")).await;
    let done = get(s, wf.id).await;
    assert_eq!((done.state.as_str(), done.failed_count, done.completed_count, done.skipped_count), ("failed", 1, 1, 1), "ended by c, naming a");
    assert_eq!(step_events(s, wf.id, "workflow.failed", "failed_step_id").await, ["a"]);

    // The job standing for a nested workflow that failed.
    let inner = workflow(WorkflowType::Chain, vec![job("x", json!([]))]);
    let wf = s.create_workflow(nested(workflow(WorkflowType::Group, vec![job("y", json!([]))]), vec![(0, inner)])).await.unwrap();
    let x = claim_types(s).await.into_iter().find(|j| j.job_type == "x").expect("x");
    fail_for_good(s, &x).await;
    let standing = get(s, wf.id).await.members[0].job_id;
    assert_eq!(s.job(standing).await.unwrap().state, JobState::Discarded);
    let report = s.retry_finished_jobs(&rebound_queue::store::JobSelection::Ids(vec![standing]), &actor).await.unwrap();
    assert_eq!((report.succeeded, report.refused.len()), (0, 1));

    // A failed chain's later step, cancelled unrun: refused. The failed step may run again.
    let wf = s.create_workflow(workflow(WorkflowType::Chain, vec![job("k.a", json!([])), job("k.b", json!([]))])).await.unwrap();
    let first = claim_types(s).await.into_iter().find(|j| j.job_type == "k.a").expect("k.a");
    fail_for_good(s, &first).await;
    let later = get(s, wf.id).await.members[1].job_id;
    assert_eq!(s.job(later).await.unwrap().state, JobState::Cancelled);
    let report = s.retry_finished_jobs(&rebound_queue::store::JobSelection::Ids(vec![later, first.id]), &actor).await.unwrap();
    assert_eq!(report.succeeded, 1, "{report:?}");
    assert!(report.refused.iter().any(|(id, why)| *id == later && why.contains("workflow")), "{:?}", report.refused);
    assert_eq!(s.job(later).await.unwrap().state, JobState::Cancelled);
    // A job cancelled while it ran did run: it may be retried like any failed one.
    let wf = s.create_workflow(workflow(WorkflowType::Group, vec![job("k.g", json!([]))])).await.unwrap();
    let running = claim_types(s).await.into_iter().find(|j| j.job_type == "k.g").expect("k.g");
    s.cancel(running.id, None).await.unwrap();
    assert_eq!(get(s, wf.id).await.state, "failed");
    assert_eq!(s.retry_finished_jobs(&rebound_queue::store::JobSelection::Ids(vec![running.id]), &actor).await.unwrap().succeeded, 1);
}

#[tokio::test]
async fn cancelling_a_parent_while_its_nested_workflow_finishes_does_not_deadlock() {
    let db = TestDb::new().await;
    let s = &db.store;
    let inner = workflow(WorkflowType::Chain, vec![job("n", json!([]))]);
    let wf = s.create_workflow(nested(workflow(WorkflowType::Group, vec![job("p", json!([]))]), vec![(0, inner)])).await.unwrap();
    let jobs = claim_types(s).await;
    let n = jobs.iter().find(|j| j.job_type == "n").expect("n").clone();

    // The cancel locks the parent first, as cancel_workflow does, and holds it...
    let mut cancel = s.pool().begin().await.unwrap();
    sqlx::query("UPDATE workflows SET state = 'cancelled', cancelled_at = now(), finished_at = now() WHERE id = $1")
        .bind(wf.id)
        .execute(&mut *cancel)
        .await
        .unwrap();
    // ...while the nested chain's last job completes, which ends the chain and finishes the job
    // standing for it in the parent.
    let store = s.clone();
    let finishing = tokio::spawn(async move {
        store.complete_batch(&[Completion { id: n.id, attempt: Some(n.attempt), worker_id: Some("w1".into()), started_at: None, result: Some(json!(1)) }]).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sqlx::query(
        "UPDATE jobs SET state = 'cancelled', cancelled_at = now(), locked_by = NULL, lock_expires_at = NULL, updated_at = now()
         WHERE workflow_id = $1 AND state IN ('pending', 'scheduled', 'available', 'retryable')",
    )
    .bind(wf.id)
    .execute(&mut *cancel)
    .await
    .expect("the cancel goes through");
    cancel.commit().await.unwrap();
    let done = finishing.await.unwrap().expect("the completion goes through");
    assert_eq!(done.len(), 1);
    let after = get(s, wf.id).await;
    assert_eq!(after.state, "cancelled");
    let inner = after.members[0].nested.clone().expect("nested");
    assert!(matches!(inner.state.as_str(), "cancelled" | "completed"), "{}", inner.state);
}

#[tokio::test]
async fn a_workflow_s_jobs_scheduled_for_later_are_job_scheduled_events() {
    use rebound_queue::store::EventFilter;
    let db = TestDb::new().await;
    let s = &db.store;
    let mut later = job("later", json!([]));
    later.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600));
    let wf = s.create_workflow(workflow(WorkflowType::Group, vec![later, job("now", json!([]))])).await.unwrap();
    assert_eq!((wf.members[0].state, wf.members[1].state), (JobState::Scheduled, JobState::Available));
    let later_id = wf.members[0].job_id;
    let scheduled = |job_id| EventFilter { job_id, types: vec!["job.scheduled".into()], limit: 10, ..Default::default() };
    let all = s.events(&scheduled(None)).await.unwrap();
    assert_eq!(all.iter().map(|e| e.job_id).collect::<Vec<_>>(), [later_id], "in the stream");
    assert_eq!(s.events(&scheduled(Some(later_id))).await.unwrap().len(), 1, "and among the job's own");

    // A chain's second step, scheduled for later, is scheduled when the chain gets to it.
    let mut second = job("second", json!([]));
    second.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600));
    let chain = s.create_workflow(workflow(WorkflowType::Chain, vec![job("first", json!([])), second])).await.unwrap();
    let claimed = claim_types(s).await;
    assert_eq!(types(&claimed), ["first", "now"], "the chain's first step, and the group's job not held back");
    complete(s, &claimed[0], json!(1)).await;
    let second_id = chain.members[1].job_id;
    assert_eq!(s.job(second_id).await.unwrap().state, JobState::Scheduled);
    assert_eq!(s.events(&scheduled(Some(second_id))).await.unwrap().len(), 1, "logged when released");
    assert_eq!(s.events(&scheduled(None)).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_nested_workflow_cancelled_on_its_own_is_no_failed_job_in_the_counts_through_it() {
    let db = TestDb::new().await;
    let s = &db.store;
    // group[a, chain[b, c]]: b completes, then the chain alone is cancelled while the group runs.
    let inner = workflow(WorkflowType::Chain, vec![job("b", json!([])), job("c", json!([]))]);
    let wf = s.create_workflow(nested(workflow(WorkflowType::Group, vec![job("a", json!([]))]), vec![(1, inner)])).await.unwrap();
    let first = claim_types(s).await;
    assert_eq!(types(&first), ["a", "b"]);
    complete(s, &first[1], json!("b")).await;
    let chain_id = get(s, wf.id).await.members[1].nested.as_ref().expect("chain").id;
    assert!(matches!(s.cancel_workflow(chain_id, None).await.unwrap(), WorkflowCancel::Cancelled(_)));
    complete(s, &first[0], json!("a")).await;

    let done = get(s, wf.id).await;
    // The group's own counters take the cancelled chain as a failed member, as its state
    // machine does; counted through it, no job failed: a and b completed, c never ran.
    assert_eq!((done.state.as_str(), done.job_count, done.completed_count, done.failed_count), ("failed", 2, 1, 1));
    assert_eq!(done.counts_with_nested(), NestedCounts { jobs: 3, completed: 2, failed: 0 });
}
