//! OJS workflows over HTTP (ojs-workflows.md §11): `POST /ojs/v1/workflows`,
//! `GET /ojs/v1/workflows/{id}`, `DELETE /ojs/v1/workflows/{id}`.
//!
//! Two request shapes are read, as the public SDKs send them: the spec's (`type` chain with
//! `steps`, group or batch with `jobs` and a batch's `callbacks`), and the HTTP binding's
//! graph, as the Python SDK sends it (no `type`; `steps` with `id` and `depends_on`, callbacks
//! marked `options.callback_type`). A graph that is a chain, a group or a batch is read as one;
//! any other acyclic graph is a `graph` workflow. In the spec's shape, a chain's step or a
//! group's or batch's job may be a workflow itself (told by its `steps` or `jobs`, as the JS
//! SDK sends it), three levels deep at most; deeper ones are refused at creation.
//!
//! The answer is the workflow under `workflow` and, for clients that read it unwrapped (the
//! JS SDK), its fields at the top level as well.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use rebound_queue::{JobState, StoreError};
use std::collections::BTreeMap;

use rebound_queue::store::{BatchCallbacks, GraphStep, MAX_WORKFLOW_JOBS, NewWorkflow, Workflow, WorkflowCancel, WorkflowMember, WorkflowType};
use serde_json::{Map, Value, json};

use super::body::{Fields, JsonObject, json_kind};
use super::envelope::{parse_client_id, parse_new_job};
use super::error::ApiError;
use crate::AppState;
use crate::auth::Caller;

const CALLBACK_NAMES: [&str; 3] = ["on_complete", "on_success", "on_failure"];

/// `POST /ojs/v1/workflows`: 201 with the workflow, its first jobs already enqueued.
pub async fn create(State(state): State<AppState>, body: JsonObject) -> Result<Response, ApiError> {
    let f = body.fields();
    let wf = parse_workflow(&f, Timestamp::now())?;
    let created = state.store.create_workflow(wf).await.map_err(|e| e.map_field(|field| request_field(f.map(), field)))?;
    Ok((StatusCode::CREATED, Json(answer(&created))).into_response())
}

/// `GET /ojs/v1/workflows/{id}`.
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = workflow_id(&id)?;
    let wf = state.store.workflow(id).await?.ok_or_else(|| ApiError::not_found("workflow", id))?;
    Ok(Json(answer(&wf)))
}

/// `DELETE /ojs/v1/workflows/{id}`: cancels what has not run; running jobs finish. A finished
/// workflow is a conflict.
pub async fn cancel(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = workflow_id(&id)?;
    match state.store.cancel_workflow(id, Some(&caller.actor())).await {
        Ok(WorkflowCancel::Cancelled(wf)) => Ok(Json(answer(&wf))),
        Ok(WorkflowCancel::AlreadyFinished(wf)) => Err(ApiError::conflict(format!("workflow {id} is already in terminal state '{}'", wf.state))
            .detail("state", wf.state.as_str())),
        Err(StoreError::Missing { .. }) => Err(ApiError::not_found("workflow", id)),
        Err(e) => Err(e.into()),
    }
}

/// A store's field name as the request spelled it: the store calls every workflow's members
/// `jobs[i]`, at every level of nesting; the request may have called a level's `steps`.
fn request_field(request: &Map<String, Value>, field: &str) -> String {
    let mut level = Some(request);
    let mut out: Vec<String> = Vec::new();
    for part in field.split('.') {
        let member = part.strip_prefix("jobs[").and_then(|rest| rest.strip_suffix(']')).and_then(|i| i.parse::<usize>().ok());
        match (level, member) {
            (Some(m), Some(i)) => {
                let key = if m.contains_key("steps") && !m.contains_key("jobs") { "steps" } else { "jobs" };
                out.push(format!("{key}[{i}]"));
                level = m.get(key).and_then(|v| v.get(i)).and_then(Value::as_object);
            }
            _ => {
                out.push(part.to_string());
                level = None;
            }
        }
    }
    out.join(".")
}

fn workflow_id(s: &str) -> Result<uuid::Uuid, ApiError> {
    parse_client_id(s).map_err(|reason| ApiError::invalid_field("id", reason))
}

/// Reads a workflow in either shape (see the module's documentation).
fn parse_workflow(f: &Fields<'_>, now: Timestamp) -> Result<NewWorkflow, ApiError> {
    let id = match f.str("id")? {
        Some(s) => Some(parse_client_id(s).map_err(|reason| f.error("id", reason))?),
        None => None,
    };
    let name = f.str("name")?.map(str::to_owned);
    let (kind, (jobs, nested), callbacks, graph) = match f.str("type")? {
        Some(t) => {
            let kind = match t {
                "chain" => WorkflowType::Chain,
                "group" => WorkflowType::Group,
                "batch" => WorkflowType::Batch,
                other => return Err(f.error("type", format!("must be chain, group or batch, got {other:?}"))),
            };
            // A chain's are `steps`, a group's and a batch's `jobs`; either name is read.
            let key = match (kind, f.get("steps").is_some(), f.get("jobs").is_some()) {
                (WorkflowType::Chain, true, _) | (_, true, false) => "steps",
                _ => "jobs",
            };
            let jobs = jobs_of(f, key, now)?;
            let callbacks = match f.object("callbacks")? {
                Some(c) => {
                    let mut cb = BatchCallbacks::default();
                    for (i, name) in CALLBACK_NAMES.into_iter().enumerate() {
                        let job = match c.get(name) {
                            None => None,
                            Some(Value::Object(m)) => Some(job_of(m, &c.name(name), now)?),
                            Some(v) => return Err(c.error(name, format!("must be a job (a JSON object), got {}", json_kind(v)))),
                        };
                        match i {
                            0 => cb.on_complete = job,
                            1 => cb.on_success = job,
                            _ => cb.on_failure = job,
                        }
                    }
                    cb
                }
                None => BatchCallbacks::default(),
            };
            (kind, jobs, callbacks, Vec::new())
        }
        None => {
            let (kind, jobs, callbacks, graph) = dag(f, now)?;
            (kind, (jobs, BTreeMap::new()), callbacks, graph)
        }
    };
    Ok(NewWorkflow { id, kind, name, jobs, callbacks, graph, nested })
}

/// A workflow's members: its jobs, and the workflows nested among them by index (each with
/// the job standing for it in its place).
type Members = (Vec<rebound_queue::NewJob>, BTreeMap<usize, NewWorkflow>);

fn jobs_of(f: &Fields<'_>, key: &str, now: Timestamp) -> Result<Members, ApiError> {
    let items = f.array(key)?.ok_or_else(|| f.error(key, "is required"))?;
    if items.is_empty() {
        return Err(f.error(key, "must hold at least one job"));
    }
    if items.len() > MAX_WORKFLOW_JOBS {
        return Err(f.error(key, format!("holds {} jobs; a workflow holds at most {MAX_WORKFLOW_JOBS}", items.len())));
    }
    let mut jobs = Vec::with_capacity(items.len());
    let mut nested = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let name = f.name(&format!("{key}[{i}]"));
        match item {
            Value::Object(m) if is_workflow(m) => {
                let inner = parse_workflow(&Fields::nested(m, &name), now)?;
                jobs.push(NewWorkflow::standing_job(inner.kind));
                nested.insert(i, inner);
            }
            Value::Object(m) => jobs.push(parse_new_job(&Fields::nested(m, &name), now)?),
            other => return Err(f.error(&format!("{key}[{i}]"), format!("must be a job or a workflow (a JSON object), got {}", json_kind(other)))),
        }
    }
    Ok((jobs, nested))
}

/// Whether a member is a workflow: by its shape, as the JS SDK tells them (a job may be of any
/// type), or by a workflow's type, so that one missing its members is told what it lacks.
fn is_workflow(m: &Map<String, Value>) -> bool {
    m.contains_key("steps") || m.contains_key("jobs") || matches!(m.get("type").and_then(Value::as_str), Some("chain" | "group" | "batch"))
}

/// One job of a workflow where only a job can be: a callback, a graph's step.
fn job_of(m: &Map<String, Value>, name: &str, now: Timestamp) -> Result<rebound_queue::NewJob, ApiError> {
    if is_workflow(m) {
        return Err(ApiError::invalid_field(name, "must be a job: a workflow can be nested as a chain's step or a group's or batch's job, not here"));
    }
    parse_new_job(&Fields::nested(m, name), now)
}

/// A workflow read from the request: its kind, jobs, a batch's callbacks and a graph's steps.
type Parsed = (WorkflowType, Vec<rebound_queue::NewJob>, BatchCallbacks, Vec<GraphStep>);

/// The HTTP binding's shape: steps with ids and `depends_on`, read as the chain (each step on
/// the one before), group (none depends on anything) or batch (callbacks marked
/// `options.callback_type`, depending on every job) it is, else as a graph (the store refuses
/// cycles and unknown ids).
fn dag(f: &Fields<'_>, now: Timestamp) -> Result<Parsed, ApiError> {
    let items = f.array("steps")?.ok_or_else(|| f.error("type", "is required (chain, group or batch)"))?;
    if items.is_empty() {
        return Err(f.error("steps", "must hold at least one job"));
    }
    if items.len() > MAX_WORKFLOW_JOBS {
        return Err(f.error("steps", format!("holds {} jobs; a workflow holds at most {MAX_WORKFLOW_JOBS}", items.len())));
    }
    let mut ids: Vec<String> = Vec::new();
    let mut jobs = Vec::new();
    let mut depends: Vec<Vec<String>> = Vec::new();
    let mut callbacks = BatchCallbacks::default();
    for (i, item) in items.iter().enumerate() {
        let field = format!("steps[{i}]");
        let Value::Object(step) = item else {
            return Err(f.error(&field, format!("must be a job (a JSON object), got {}", json_kind(item))));
        };
        let sf = Fields::nested(step, &f.name(&field));
        let step_id = sf.str("id")?.map(str::to_owned).unwrap_or_else(|| format!("step-{i}"));
        let after: Vec<String> = sf.strings("depends_on")?.unwrap_or_default().into_iter().map(str::to_owned).collect();
        // The step's own id and graph are not the job's: the rest is a job envelope.
        let mut envelope = step.clone();
        envelope.remove("id");
        envelope.remove("depends_on");
        let callback = match envelope.get_mut("options") {
            Some(Value::Object(o)) => o.remove("callback_type"),
            _ => None,
        };
        let job = job_of(&envelope, &f.name(&field), now)?;
        match callback {
            Some(Value::String(c)) => {
                let slot = match c.as_str() {
                    "on_complete" => &mut callbacks.on_complete,
                    "on_success" => &mut callbacks.on_success,
                    "on_failure" => &mut callbacks.on_failure,
                    other => return Err(f.error(&format!("{field}.options.callback_type"), format!("must be on_complete, on_success or on_failure, got {other:?}"))),
                };
                *slot = Some(job);
            }
            Some(v) => return Err(f.error(&format!("{field}.options.callback_type"), format!("must be a string, got {}", json_kind(&v)))),
            None => {
                ids.push(step_id);
                depends.push(after);
                jobs.push(job);
            }
        }
    }
    let has_callbacks = callbacks.on_complete.is_some() || callbacks.on_success.is_some() || callbacks.on_failure.is_some();
    let independent = depends.iter().all(Vec::is_empty);
    let sequential = depends.iter().enumerate().all(|(i, d)| if i == 0 { d.is_empty() } else { d.len() == 1 && d[0] == ids[i - 1] });
    if has_callbacks && !independent {
        return Err(f.error("steps", "callbacks (options.callback_type) belong to a batch, whose other steps depend on nothing; give the graph a final step that depends on the others instead"));
    }
    if has_callbacks {
        return Ok((WorkflowType::Batch, jobs, callbacks, Vec::new()));
    }
    // Ids are kept only where the shape does not name its steps itself.
    let standard = ids.iter().enumerate().all(|(i, id)| *id == format!("step-{i}"));
    let kind = if standard && jobs.len() > 1 && independent {
        WorkflowType::Group
    } else if standard && sequential {
        WorkflowType::Chain
    } else {
        let graph = ids.into_iter().zip(depends).map(|(id, depends_on)| GraphStep { id, depends_on }).collect();
        return Ok((WorkflowType::Graph, jobs, callbacks, graph));
    };
    Ok((kind, jobs, callbacks, Vec::new()))
}

/// A job's state as a workflow step's (ojs-workflows.md §4.4).
fn step_state(s: JobState) -> &'static str {
    match s {
        JobState::Pending => "waiting",
        JobState::Scheduled | JobState::Available | JobState::Retryable => "pending",
        JobState::Active => "active",
        JobState::Completed => "completed",
        JobState::Discarded => "failed",
        JobState::Cancelled => "cancelled",
    }
}

/// A workflow's state as a step's, for a nested one.
fn nested_state(state: &str) -> &str {
    match state {
        "pending" => "waiting",
        "running" => "active",
        other => other,
    }
}

fn member_json(m: &WorkflowMember) -> Value {
    if let Some(n) = &m.nested {
        return json!({
            "id": m.step_id(),
            "index": m.step,
            "type": n.kind.as_str(),
            "state": nested_state(&n.state),
            "job_id": m.job_id.to_string(),
            "workflow_id": n.id.to_string(),
            "result": m.result,
            "started_at": n.started_at.map(|t| t.to_string()),
            "completed_at": n.finished_at.map(|t| t.to_string()),
            "workflow": workflow_json(n),
        });
    }
    let mut v = json!({
        "id": m.step_id(),
        "index": (m.step >= 0).then_some(m.step),
        "type": m.job_type,
        "state": step_state(m.state),
        "job_id": m.job_id.to_string(),
        "attempt": m.attempt,
    });
    if let Value::Object(o) = &mut v {
        if let Some(cb) = m.callback() {
            o.insert("callback_type".into(), json!(cb));
        }
        if let Some(g) = &m.graph {
            o.insert("depends_on".into(), json!(g.depends_on));
        }
        if let Some(r) = &m.result {
            o.insert("result".into(), r.clone());
        }
        for (key, t) in [("started_at", m.started_at), ("completed_at", m.completed_at)] {
            if let Some(t) = t {
                o.insert(key.into(), json!(t.to_string()));
            }
        }
    }
    v
}

/// The workflow as the API shows it.
pub fn workflow_json(wf: &Workflow) -> Value {
    let time = |t: Option<Timestamp>| t.map(|t| t.to_string());
    let (total_key, done_key) = if wf.kind == WorkflowType::Chain { ("steps_total", "steps_completed") } else { ("jobs_total", "jobs_completed") };
    let failed_job_ids: Vec<&Value> = wf.errors.as_array().map(|e| e.iter().filter_map(|e| e.get("job_id")).collect()).unwrap_or_default();
    // The spec's metadata counts nested workflows' jobs; the top-level totals count members.
    let all = wf.counts_with_nested();
    json!({
        "id": wf.id.to_string(),
        "type": wf.kind.as_str(),
        "name": wf.name,
        "state": wf.state,
        "created_at": wf.created_at.to_string(),
        "started_at": time(wf.started_at),
        "completed_at": time(wf.finished_at),
        "cancelled_at": time(wf.cancelled_at),
        "parent_id": wf.parent_id.map(|p| p.to_string()),
        total_key: wf.job_count,
        done_key: wf.completed_count,
        "failed_count": wf.failed_count,
        "skipped_count": wf.skipped_count,
        "failed_step_index": wf.failed_step_index,
        "failed_job_ids": failed_job_ids,
        "errors": wf.errors,
        "metadata": {
            "created_at": wf.created_at.to_string(),
            "started_at": time(wf.started_at),
            "completed_at": time(wf.finished_at),
            "cancelled_at": time(wf.cancelled_at),
            "job_count": all.jobs,
            "completed_count": all.completed,
            "failed_count": all.failed,
            "skipped_count": wf.skipped_count,
        },
        "steps": wf.members.iter().map(member_json).collect::<Vec<_>>(),
    })
}

/// `{"workflow": …}` with the same fields beside it.
fn answer(wf: &Workflow) -> Value {
    let v = workflow_json(wf);
    let mut top = match &v {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    top.insert("workflow".into(), v);
    Value::Object(top)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<NewWorkflow, ApiError> {
        let m = v.as_object().cloned().unwrap_or_default();
        parse_workflow(&Fields::of(&m), Timestamp::now())
    }

    fn refused(v: Value) -> String {
        match parse(v) {
            Err(e) => e.message,
            Ok(w) => format!("accepted as {:?}", w.kind),
        }
    }

    #[test]
    fn reads_the_spec_shape() {
        let w = parse(json!({"type": "chain", "name": "n", "steps": [{"type": "a", "args": []}, {"type": "b", "args": [1], "options": {"queue": "q"}}]})).unwrap();
        assert_eq!((w.kind, w.jobs.len(), w.jobs[1].queue.as_str(), w.name.as_deref()), (WorkflowType::Chain, 2, "q", Some("n")));
        let w = parse(json!({"type": "batch", "jobs": [{"type": "a", "args": []}], "callbacks": {"on_failure": {"type": "f", "args": []}}})).unwrap();
        assert_eq!((w.kind, w.callbacks.on_failure.map(|j| j.job_type)), (WorkflowType::Batch, Some("f".to_string())));
        assert!(refused(json!({"type": "dag", "steps": []})).starts_with("type:"));
        assert!(refused(json!({"type": "group", "jobs": []})).starts_with("jobs:"));
        assert!(refused(json!({"type": "chain", "steps": [{"type": "a", "args": "x"}]})).starts_with("steps[0].args:"));
        let nested = parse(json!({"type": "chain", "steps": [{"type": "a", "args": []}, {"type": "group", "jobs": [{"type": "b", "args": []}]}]})).unwrap();
        assert_eq!((nested.jobs.len(), nested.nested.get(&1).map(|g| (g.kind, g.jobs.len()))), (2, Some((WorkflowType::Group, 1))));
        assert_eq!(nested.jobs[1].job_type, "rebound.workflow.group", "the job standing for it");
        assert!(refused(json!({"type": "chain", "steps": [{"type": "group"}]})).starts_with("steps[0].jobs:"));
        assert!(refused(json!({"type": "chain", "steps": [{"type": "group", "jobs": [{"type": "a", "args": 1}]}]})).starts_with("steps[0].jobs[0].args:"));
        let callback = refused(json!({"type": "batch", "jobs": [{"type": "a", "args": []}], "callbacks": {"on_complete": {"type": "chain", "steps": []}}}));
        assert!(callback.starts_with("callbacks.on_complete:") && callback.contains("must be a job"), "{callback}");
        assert!(refused(json!({"type": "batch", "jobs": [{"type": "a", "args": []}], "callbacks": {"on_complete": "x"}})).starts_with("callbacks.on_complete:"));
    }

    #[test]
    fn reads_the_python_sdk_s_graphs() {
        let step = |id: &str, after: Value| json!({"id": id, "type": "t", "args": [], "depends_on": after});
        let chain = parse(json!({"name": "c", "steps": [step("step-0", json!([])), step("step-1", json!(["step-0"])), step("step-2", json!(["step-1"]))]})).unwrap();
        assert_eq!((chain.kind, chain.jobs.len()), (WorkflowType::Chain, 3));
        assert!(chain.jobs[0].extra.get("depends_on").is_none(), "the graph is not echoed as the job's");
        let group = parse(json!({"steps": [step("step-0", json!([])), step("step-1", json!([]))]})).unwrap();
        assert_eq!(group.kind, WorkflowType::Group);
        let mut cb = step("on_success", json!(["step-0", "step-1"]));
        cb["options"] = json!({"callback_type": "on_success", "queue": "cb"});
        let batch = parse(json!({"steps": [step("step-0", json!([])), step("step-1", json!([])), cb]})).unwrap();
        assert_eq!((batch.kind, batch.jobs.len()), (WorkflowType::Batch, 2));
        assert_eq!(batch.callbacks.on_success.map(|j| j.queue), Some("cb".to_string()));
        assert!(refused(json!({"name": "no type"})).starts_with("type:"));
    }

    #[test]
    fn names_a_nested_member_as_the_request_did() {
        let body = json!({"type": "chain", "steps": [{"type": "group", "jobs": [{"type": "chain", "steps": [{"type": "a", "args": []}]}]}]});
        let m = body.as_object().cloned().unwrap_or_default();
        assert_eq!(request_field(&m, "jobs[0].jobs[0].jobs[0].options.retry"), "steps[0].jobs[0].steps[0].options.retry");
        assert_eq!(request_field(&m, "jobs[0].callbacks.on_failure"), "steps[0].callbacks.on_failure");
        assert_eq!(request_field(&m, "graph"), "graph");
    }

    #[test]
    fn reads_any_other_graph_as_a_graph() {
        let step = |id: &str, after: Value| json!({"id": id, "type": "t", "args": [], "depends_on": after});
        let diamond = parse(json!({"steps": [step("a", json!([])), step("b", json!(["a"])), step("c", json!(["a"])), step("d", json!(["b", "c"]))]})).unwrap();
        assert_eq!(diamond.kind, WorkflowType::Graph);
        let links: Vec<(&str, Vec<&str>)> = diamond.graph.iter().map(|g| (g.id.as_str(), g.depends_on.iter().map(String::as_str).collect())).collect();
        assert_eq!(links, [("a", vec![]), ("b", vec!["a"]), ("c", vec!["a"]), ("d", vec!["b", "c"])]);
        // Named steps in a chain's or a group's shape keep their names.
        let named = parse(json!({"steps": [step("extract", json!([])), step("load", json!(["extract"]))]})).unwrap();
        assert_eq!((named.kind, named.graph[1].id.as_str()), (WorkflowType::Graph, "load"));
        let mut cb = step("report", json!(["b"]));
        cb["options"] = json!({"callback_type": "on_complete"});
        let mixed = refused(json!({"steps": [step("a", json!([])), step("b", json!(["a"])), cb]}));
        assert!(mixed.starts_with("steps:") && mixed.contains("callbacks"), "{mixed}");
    }
}
