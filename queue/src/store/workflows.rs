//! OJS workflows (ojs-workflows.md): a chain runs its steps one after another, each given the
//! results before it; a group runs its jobs side by side; a batch is a group whose callbacks
//! (`on_complete`, `on_success`, `on_failure`) run once its jobs are done. A graph
//! (ojs-http-binding.md §14.1) runs each step once the steps it depends on have completed; a
//! step that fails for good skips everything downstream of it, and the other branches go on.
//!
//! Every job is inserted when the workflow is created, validated and defaulted like any
//! enqueue. A chain's later steps and a batch's callbacks wait in `pending`. The database moves
//! a workflow on: a trigger on its jobs' state (migrations/…_workflows.sql) activates the next
//! step, fires the callbacks and keeps the counts, inside the transaction that finished the
//! job, so no crash or lost connection can separate the two.

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row;
use uuid::Uuid;

use super::audit::{Actor, record};
use super::enqueue::{check, insert_many};
use super::{Store, StoreError, ts, ts_opt};
use crate::job::{JobState, NewJob};

/// The most jobs (steps or jobs, and callbacks) one workflow may hold: each finish of a member
/// takes the workflow's row lock, and creating it is one insert.
pub const MAX_WORKFLOW_JOBS: usize = 10_000;

/// The three OJS primitives, and a general dependency graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowType {
    Chain,
    Group,
    Batch,
    /// Steps with ids and dependencies ([`NewWorkflow::graph`]), acyclic.
    Graph,
}

impl WorkflowType {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowType::Chain => "chain",
            WorkflowType::Group => "group",
            WorkflowType::Batch => "batch",
            WorkflowType::Graph => "graph",
        }
    }

    fn parse(s: &str) -> Result<WorkflowType, StoreError> {
        match s {
            "chain" => Ok(WorkflowType::Chain),
            "group" => Ok(WorkflowType::Group),
            "batch" => Ok(WorkflowType::Batch),
            "graph" => Ok(WorkflowType::Graph),
            other => Err(StoreError::invalid("type", format!("unknown workflow type {other:?}"))),
        }
    }
}

/// What a batch runs when its jobs are done.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchCallbacks {
    /// Whatever the outcome.
    pub on_complete: Option<NewJob>,
    /// Only when every job completed.
    pub on_success: Option<NewJob>,
    /// When any job failed for good.
    pub on_failure: Option<NewJob>,
}

/// A callback's place among a workflow's jobs (`workflow_step`), and its OJS name.
pub const CALLBACKS: [(i32, &str); 3] = [(-1, "on_complete"), (-2, "on_success"), (-3, "on_failure")];

/// A workflow to create.
#[derive(Clone, Debug, PartialEq)]
pub struct NewWorkflow {
    /// Client-chosen; generated (UUIDv7) when absent.
    pub id: Option<Uuid>,
    pub kind: WorkflowType,
    pub name: Option<String>,
    /// A chain's steps in order, or a group's or batch's jobs.
    pub jobs: Vec<NewJob>,
    /// A batch's; must be empty for the others.
    pub callbacks: BatchCallbacks,
    /// A graph's step ids and dependencies, one per job (in `jobs`' order); required for a
    /// graph, refused for the other kinds.
    pub graph: Vec<GraphStep>,
}

/// One step of a [`WorkflowType::Graph`]: the job at the same index of [`NewWorkflow::jobs`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GraphStep {
    /// Unique within the workflow.
    pub id: String,
    /// Ids of the steps that must complete before it starts.
    pub depends_on: Vec<String>,
}

/// A graph step's neighbours by index, sorted and without repeats.
#[derive(Clone, Debug, Default)]
struct Links {
    depends_on: Vec<i32>,
    dependents: Vec<i32>,
}

/// A graph's steps resolved to indexes. Refused, naming the step, when an id is empty or
/// repeated, a dependency names no step, or the dependencies form a cycle (a step depending on
/// itself is one).
fn resolve_graph(steps: &[GraphStep]) -> Result<Vec<Links>, StoreError> {
    let mut index = std::collections::HashMap::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        if step.id.is_empty() {
            return Err(StoreError::invalid(format!("jobs[{i}].id"), "a graph's step needs an id"));
        }
        if let Some(first) = index.insert(step.id.as_str(), i) {
            return Err(StoreError::invalid(format!("jobs[{i}].id"), format!("{:?} is the id of jobs[{first}] too: step ids are unique", step.id)));
        }
    }
    let mut links = vec![Links::default(); steps.len()];
    for (i, step) in steps.iter().enumerate() {
        for dep in &step.depends_on {
            let d = *index.get(dep.as_str()).ok_or_else(|| {
                StoreError::invalid(format!("jobs[{i}].depends_on"), format!("{dep:?} is not the id of a step of this workflow"))
            })?;
            links[i].depends_on.push(d as i32);
            links[d].dependents.push(i as i32);
        }
    }
    for l in &mut links {
        l.depends_on.sort_unstable();
        l.depends_on.dedup();
        l.dependents.sort_unstable();
        l.dependents.dedup();
    }
    // Kahn's order: what it cannot reach lies on a cycle or downstream of one.
    let mut waiting: Vec<usize> = links.iter().map(|l| l.depends_on.len()).collect();
    let mut ready: Vec<usize> = (0..steps.len()).filter(|&i| waiting[i] == 0).collect();
    let mut reached = 0;
    while let Some(i) = ready.pop() {
        reached += 1;
        for &d in &links[i].dependents {
            waiting[d as usize] -= 1;
            if waiting[d as usize] == 0 {
                ready.push(d as usize);
            }
        }
    }
    if reached < steps.len() {
        // Every unreached step waits on another unreached one: following those from any of
        // them comes back round, and that loop is the cycle to name.
        let Some(start) = (0..steps.len()).find(|&i| waiting[i] > 0) else {
            return Err(StoreError::invalid("jobs", "the dependencies form a cycle"));
        };
        let mut path = vec![start];
        let mut at = start;
        loop {
            let Some(next) = links[at].depends_on.iter().map(|&d| d as usize).find(|&d| waiting[d] > 0) else {
                return Err(StoreError::invalid(format!("jobs[{start}].depends_on"), "the dependencies form a cycle"));
            };
            if let Some(pos) = path.iter().position(|&p| p == next) {
                let cycle: Vec<&str> = path[pos..].iter().chain([&next]).map(|&p| steps[p].id.as_str()).collect();
                return Err(StoreError::invalid(
                    format!("jobs[{next}].depends_on"),
                    format!("the dependencies form a cycle: {} (each waits for the next)", cycle.join(" -> ")),
                ));
            }
            path.push(next);
            at = next;
        }
    }
    Ok(links)
}

/// A workflow and where each of its jobs stands.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Workflow {
    pub id: Uuid,
    pub kind: WorkflowType,
    pub name: Option<String>,
    /// `running` (from its creation: its first jobs are enqueued), `completed`, `failed` or
    /// `cancelled`.
    pub state: String,
    /// Steps or jobs, callbacks not counted.
    pub job_count: i32,
    pub completed_count: i32,
    pub failed_count: i32,
    /// A graph's steps cancelled unrun because a step upstream of them failed.
    pub skipped_count: i32,
    /// The chain step that failed.
    pub failed_step_index: Option<i32>,
    /// `{job_id, code, message, attempt, role}` of each job that failed for good.
    pub errors: Value,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub cancelled_at: Option<Timestamp>,
    /// Its jobs by index, then its callbacks (negative `step`s, see [`CALLBACKS`]).
    pub members: Vec<WorkflowMember>,
}

impl Workflow {
    /// Whether it can still change.
    pub fn is_finished(&self) -> bool {
        matches!(self.state.as_str(), "completed" | "failed" | "cancelled")
    }
}

/// One job of a workflow.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkflowMember {
    /// Its index among the steps or jobs; a callback's is negative (see [`CALLBACKS`]).
    pub step: i32,
    /// A graph step's id and the ids it depends on; `None` outside graphs.
    pub graph: Option<GraphStep>,
    pub job_id: Uuid,
    pub job_type: String,
    pub state: JobState,
    pub attempt: i32,
    pub result: Option<Value>,
    pub started_at: Option<Timestamp>,
    pub completed_at: Option<Timestamp>,
}

impl WorkflowMember {
    /// The callback's OJS name, if it is one.
    pub fn callback(&self) -> Option<&'static str> {
        CALLBACKS.iter().find(|(step, _)| *step == self.step).map(|(_, name)| *name)
    }

    /// Its id as the API and the events give it: a graph step's own, a callback's name, or
    /// `step-N`.
    pub fn step_id(&self) -> String {
        match (&self.graph, self.callback()) {
            (Some(g), _) => g.id.clone(),
            (None, Some(cb)) => cb.to_string(),
            (None, None) => format!("step-{}", self.step),
        }
    }
}

impl Store {
    /// Creates a workflow and enqueues its jobs in one transaction: a chain's first step and
    /// every job of a group or batch can run at once; the rest wait. Every job is checked as
    /// an enqueue would check it (the error names `jobs[i]` or `callbacks.on_…`); unique keys
    /// and `pending` are refused inside workflows.
    pub async fn create_workflow(&self, wf: NewWorkflow) -> Result<Workflow, StoreError> {
        if wf.jobs.is_empty() {
            return Err(StoreError::invalid("jobs", "a workflow needs at least one job"));
        }
        let callbacks: Vec<(i32, &str, NewJob)> = [
            (CALLBACKS[0], wf.callbacks.on_complete.clone()),
            (CALLBACKS[1], wf.callbacks.on_success.clone()),
            (CALLBACKS[2], wf.callbacks.on_failure.clone()),
        ]
        .into_iter()
        .filter_map(|((step, name), job)| job.map(|j| (step, name, j)))
        .collect();
        match wf.kind {
            WorkflowType::Batch if callbacks.is_empty() => {
                return Err(StoreError::invalid("callbacks", "a batch needs at least one of on_complete, on_success, on_failure"));
            }
            WorkflowType::Chain | WorkflowType::Group | WorkflowType::Graph if !callbacks.is_empty() => {
                return Err(StoreError::invalid("callbacks", format!("only a batch has callbacks, not a {}", wf.kind.as_str())));
            }
            _ => {}
        }
        let links = match wf.kind {
            WorkflowType::Graph if wf.graph.len() != wf.jobs.len() => {
                return Err(StoreError::invalid("graph", format!("a graph names {} steps for {} jobs: one each", wf.graph.len(), wf.jobs.len())));
            }
            WorkflowType::Graph => resolve_graph(&wf.graph)?,
            _ if !wf.graph.is_empty() => {
                return Err(StoreError::invalid("graph", format!("only a graph has step ids and dependencies, not a {}", wf.kind.as_str())));
            }
            _ => Vec::new(),
        };
        if wf.jobs.len() + callbacks.len() > MAX_WORKFLOW_JOBS {
            return Err(StoreError::invalid("jobs", format!("a workflow holds at most {MAX_WORKFLOW_JOBS} jobs")));
        }
        let id = wf.id.unwrap_or_else(Uuid::now_v7);
        let job_count = i32::try_from(wf.jobs.len()).map_err(|_| StoreError::invalid("jobs", "too many jobs"))?;
        let mut jobs = Vec::with_capacity(wf.jobs.len() + callbacks.len());
        let mut members = Vec::with_capacity(jobs.capacity());
        let placed = wf.jobs.into_iter().enumerate().map(|(i, job)| (i as i32, format!("jobs[{i}]"), job));
        let placed = placed.chain(callbacks.into_iter().map(|(step, name, job)| (step, format!("callbacks.{name}"), job)));
        for (step, field, mut job) in placed {
            if job.unique.is_some() {
                return Err(StoreError::invalid(format!("{field}.unique"), "unique jobs are not supported inside a workflow"));
            }
            if job.pending {
                return Err(StoreError::invalid(format!("{field}.pending"), "a workflow decides when its jobs start"));
            }
            // A chain's later steps, a graph's steps with dependencies and every callback wait
            // for the workflow to start them.
            job.pending = step < 0
                || (wf.kind == WorkflowType::Chain && step > 0)
                || links.get(step as usize).is_some_and(|l| !l.depends_on.is_empty());
            if let Value::Object(extra) = &mut job.extra {
                extra.insert("workflow_id".into(), json!(id));
            }
            jobs.push(job);
            members.push((id, step, field));
        }
        let mut checked = Vec::with_capacity(jobs.len());
        for (job, (_, _, field)) in jobs.iter().zip(&members) {
            checked.push(check(job).map_err(|e| e.map_field(|f| format!("{field}.{f}")))?);
        }
        let members: Vec<(Uuid, i32)> = members.into_iter().map(|(id, step, _)| (id, step)).collect();
        let mut tx = self.begin().await?;
        let inserted = sqlx::query("INSERT INTO workflows (id, type, name, job_count) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING")
            .bind(id)
            .bind(wf.kind.as_str())
            .bind(&wf.name)
            .bind(job_count)
            .execute(&mut *tx)
            .await?;
        if inserted.rows_affected() == 0 {
            // Nothing was written; a failed rollback closes the connection instead.
            let _ = tx.rollback().await;
            return Err(StoreError::Duplicate { reason: format!("a workflow with id {id} already exists"), existing: Some(id) });
        }
        if !links.is_empty() {
            let names: Vec<&str> = wf.graph.iter().map(|g| g.id.as_str()).collect();
            // Arrays of arrays must be rectangular in Postgres: each step's go as text.
            let list = |l: &[i32]| l.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
            let depends_on: Vec<String> = links.iter().map(|l| list(&l.depends_on)).collect();
            let dependents: Vec<String> = links.iter().map(|l| list(&l.dependents)).collect();
            sqlx::query(
                "INSERT INTO workflow_steps (workflow_id, step, name, depends_on, dependents)
                 SELECT $1, s.i - 1, s.name, string_to_array(s.after, ',')::int[], string_to_array(s.before, ',')::int[]
                 FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS s(name, after, before, i)",
            )
            .bind(id)
            .bind(&names)
            .bind(&depends_on)
            .bind(&dependents)
            .execute(&mut *tx)
            .await?;
        }
        insert_many(&mut tx, jobs, &checked, &members).await?;
        tx.commit().await?;
        self.workflow(id).await?.ok_or_else(|| StoreError::Missing { what: format!("workflow {id}") })
    }

    /// A page of workflows without their jobs (`members` empty), newest first: those created
    /// before `before` (a workflow id), in `state` if given, at most `limit` (1–500).
    pub async fn list_workflows(&self, state: Option<&str>, before: Option<Uuid>, limit: i64) -> Result<Vec<Workflow>, StoreError> {
        // One statement per shape, not `($1 IS NULL OR state = $1)`: a prepared statement's
        // generic plan cannot use the state index for that: it walked the newest workflows
        // until it had a page of a rare state (510 000 of a million for the cancelled ones).
        let sql = match (state.is_some(), before.is_some()) {
            (false, false) => "SELECT * FROM workflows WHERE $1::text IS NULL AND $2::uuid IS NULL ORDER BY id DESC LIMIT $3",
            (false, true) => "SELECT * FROM workflows WHERE $1::text IS NULL AND id < $2 ORDER BY id DESC LIMIT $3",
            (true, false) => "SELECT * FROM workflows WHERE state = $1 AND $2::uuid IS NULL ORDER BY id DESC LIMIT $3",
            (true, true) => "SELECT * FROM workflows WHERE state = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
        };
        let rows = sqlx::query(sql).bind(state).bind(before).bind(limit.clamp(1, 500)).fetch_all(&self.pool).await?;
        rows.iter().map(|row| workflow_from_row(row, Vec::new())).collect()
    }

    /// The workflow with its jobs, or `None`.
    pub async fn workflow(&self, id: Uuid) -> Result<Option<Workflow>, StoreError> {
        let Some(row) = sqlx::query("SELECT * FROM workflows WHERE id = $1").bind(id).fetch_optional(&self.pool).await? else {
            return Ok(None);
        };
        let jobs = sqlx::query(
            "SELECT j.id, j.type, j.state, j.attempt, j.result, j.started_at, j.completed_at, j.workflow_step, s.name,
                    ARRAY(SELECT d.name FROM workflow_steps d WHERE d.workflow_id = $1 AND d.step = ANY(s.depends_on) ORDER BY d.step) AS depends_on
             FROM jobs j LEFT JOIN workflow_steps s ON s.workflow_id = $1 AND s.step = j.workflow_step
             WHERE j.workflow_id = $1 ORDER BY j.workflow_step < 0, abs(j.workflow_step)",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        let members = jobs
            .iter()
            .map(|r| {
                let name: Option<String> = r.try_get("name")?;
                Ok(WorkflowMember {
                    step: r.try_get("workflow_step")?,
                    graph: match name {
                        Some(id) => Some(GraphStep { id, depends_on: r.try_get("depends_on")? }),
                        None => None,
                    },
                    job_id: r.try_get("id")?,
                    job_type: r.try_get("type")?,
                    state: r.try_get("state")?,
                    attempt: r.try_get("attempt")?,
                    result: r.try_get("result")?,
                    started_at: ts_opt(r, "started_at")?,
                    completed_at: ts_opt(r, "completed_at")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Some(workflow_from_row(&row, members)?))
    }

    /// Cancels a workflow that has not finished: its waiting and queued jobs are cancelled,
    /// and running ones finish (their results no longer move it). An unknown workflow is
    /// [`StoreError::Missing`]. An operator's cancel (`actor`) is audited in the same
    /// transaction.
    pub async fn cancel_workflow(&self, id: Uuid, actor: Option<&Actor>) -> Result<WorkflowCancel, StoreError> {
        let mut tx = self.begin().await?;
        // The workflow first: its jobs' cancellations then find it finished and move nothing.
        let done: Option<bool> = sqlx::query_scalar(
            "WITH before AS (SELECT id, state FROM workflows WHERE id = $1 FOR UPDATE),
                  cancelled AS (
                      UPDATE workflows w SET state = 'cancelled', cancelled_at = now(), finished_at = now()
                      FROM before b WHERE w.id = b.id AND b.state IN ('pending', 'running') RETURNING w.id)
             SELECT EXISTS (SELECT 1 FROM cancelled) FROM before",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        match done {
            None => return Err(StoreError::Missing { what: format!("workflow {id}") }),
            Some(true) => {}
            Some(false) => {
                // Nothing was written; a failed rollback closes the connection instead.
                let _ = tx.rollback().await;
                let wf = self.workflow(id).await?.ok_or_else(|| StoreError::Missing { what: format!("workflow {id}") })?;
                return Ok(WorkflowCancel::AlreadyFinished(wf));
            }
        }
        sqlx::query(
            "UPDATE jobs SET state = 'cancelled', cancelled_at = now(), locked_by = NULL, lock_expires_at = NULL, updated_at = now()
             WHERE workflow_id = $1 AND state IN ('pending', 'scheduled', 'available', 'retryable')",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if let Some(actor) = actor {
            record(&mut tx, actor, "workflow.cancel", Some(&id.to_string()), json!({})).await?;
        }
        tx.commit().await?;
        let wf = self.workflow(id).await?.ok_or_else(|| StoreError::Missing { what: format!("workflow {id}") })?;
        Ok(WorkflowCancel::Cancelled(wf))
    }
}

/// What [`Store::cancel_workflow`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkflowCancel {
    Cancelled(Workflow),
    /// It had finished already (completed, failed or cancelled): nothing changed.
    AlreadyFinished(Workflow),
}

fn workflow_from_row(row: &sqlx::postgres::PgRow, members: Vec<WorkflowMember>) -> Result<Workflow, StoreError> {
    Ok(Workflow {
        id: row.try_get("id")?,
        kind: WorkflowType::parse(row.try_get("type")?)?,
        name: row.try_get("name")?,
        state: row.try_get("state")?,
        job_count: row.try_get("job_count")?,
        completed_count: row.try_get("completed_count")?,
        failed_count: row.try_get("failed_count")?,
        skipped_count: row.try_get("skipped_count")?,
        failed_step_index: row.try_get("failed_step_index")?,
        errors: row.try_get("errors")?,
        created_at: ts(row, "created_at")?,
        started_at: ts_opt(row, "started_at")?,
        finished_at: ts_opt(row, "finished_at")?,
        cancelled_at: ts_opt(row, "cancelled_at")?,
        members,
    })
}
