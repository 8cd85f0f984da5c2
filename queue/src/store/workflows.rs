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

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row;
use uuid::Uuid;

use super::audit::{Actor, record};
use super::enqueue::{check, insert_many};
use super::{Store, StoreError, ts, ts_opt};
use crate::job::{JobState, NewJob};

/// The most jobs (steps or jobs, and callbacks, nested workflows' included) one workflow may
/// hold: each finish of a member takes the workflow's row lock, and creating it is one insert.
pub const MAX_WORKFLOW_JOBS: usize = 10_000;

/// How many levels workflows nest: a workflow, one among its members, and one among that one's
/// (ojs-workflows.md §10.2: at least three). Deeper ones are refused at creation.
pub const MAX_WORKFLOW_DEPTH: usize = 3;

/// The queue of the jobs that stand for nested workflows in their parents. Nothing claims
/// them: they wait in `pending` until the nested workflow finishes them.
pub const NESTED_WORKFLOW_QUEUE: &str = "rebound.workflows";

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
    /// Members that are workflows themselves (ojs-workflows.md §10), by their index among the
    /// members (a chain's step, a group's or batch's job, a graph's step). The entry of `jobs`
    /// at that index is replaced by the job that stands for the nested workflow in this one
    /// ([`NewWorkflow::standing_job`]): nothing runs it; it finishes when the nested workflow
    /// does (completed with its results, discarded when it failed), which moves this one on.
    pub nested: BTreeMap<usize, NewWorkflow>,
}

impl NewWorkflow {
    /// The job that stands for a nested workflow of `kind` among its parent's members:
    /// `rebound.workflow.<kind>`, in [`NESTED_WORKFLOW_QUEUE`].
    pub fn standing_job(kind: WorkflowType) -> NewJob {
        let mut job = NewJob::new(format!("rebound.workflow.{}", kind.as_str()), json!([]));
        job.queue = NESTED_WORKFLOW_QUEUE.to_string();
        job
    }
}

/// A workflow to insert, its nested ones after it.
struct PlannedWorkflow {
    id: Uuid,
    kind: WorkflowType,
    name: Option<String>,
    job_count: i32,
    /// The parent and the job standing for this one in it.
    parent: Option<(Uuid, Uuid)>,
    step_ids: Vec<String>,
    links: Vec<Links>,
}

struct PlannedJob {
    job: NewJob,
    field: String,
    workflow: Uuid,
    step: i32,
}

/// A workflow and everything nested in it, flattened for insertion and checked as a whole.
#[derive(Default)]
struct Plan {
    workflows: Vec<PlannedWorkflow>,
    jobs: Vec<PlannedJob>,
}

impl Plan {
    /// Adds `wf` (at nesting `depth`, from 1) and what is nested in it; `field` names it in
    /// errors (`jobs[i]` of its parent, empty for the outermost).
    fn add(&mut self, wf: NewWorkflow, id: Uuid, parent: Option<(Uuid, Uuid)>, field: &str, depth: usize) -> Result<(), StoreError> {
        let at = |f: &str| if field.is_empty() { f.to_string() } else { format!("{field}.{f}") };
        if depth > MAX_WORKFLOW_DEPTH {
            return Err(StoreError::invalid(field, format!("workflows nest at most {MAX_WORKFLOW_DEPTH} levels deep (a workflow, one inside it, and one inside that)")));
        }
        if wf.jobs.is_empty() {
            return Err(StoreError::invalid(at("jobs"), "a workflow needs at least one job"));
        }
        if let Some(&i) = wf.nested.keys().find(|&&i| i >= wf.jobs.len()) {
            return Err(StoreError::invalid(at(&format!("jobs[{i}]")), format!("a nested workflow's index must be one of the {} members", wf.jobs.len())));
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
                return Err(StoreError::invalid(at("callbacks"), "a batch needs at least one of on_complete, on_success, on_failure"));
            }
            WorkflowType::Chain | WorkflowType::Group | WorkflowType::Graph if !callbacks.is_empty() => {
                return Err(StoreError::invalid(at("callbacks"), format!("only a batch has callbacks, not a {}", wf.kind.as_str())));
            }
            _ => {}
        }
        let links = match wf.kind {
            WorkflowType::Graph if wf.graph.len() != wf.jobs.len() => {
                return Err(StoreError::invalid(at("graph"), format!("a graph names {} steps for {} jobs: one each", wf.graph.len(), wf.jobs.len())));
            }
            WorkflowType::Graph => resolve_graph(&wf.graph).map_err(|e| e.map_field(|f| at(f)))?,
            _ if !wf.graph.is_empty() => {
                return Err(StoreError::invalid(at("graph"), format!("only a graph has step ids and dependencies, not a {}", wf.kind.as_str())));
            }
            _ => Vec::new(),
        };
        let job_count = i32::try_from(wf.jobs.len()).map_err(|_| StoreError::invalid(at("jobs"), "too many jobs"))?;
        if self.jobs.len() + wf.jobs.len() + callbacks.len() > MAX_WORKFLOW_JOBS {
            return Err(StoreError::invalid(at("jobs"), format!("a workflow holds at most {MAX_WORKFLOW_JOBS} jobs, nested ones included")));
        }
        self.workflows.push(PlannedWorkflow {
            id,
            kind: wf.kind,
            name: wf.name,
            job_count,
            parent,
            step_ids: wf.graph.into_iter().map(|g| g.id).collect(),
            links,
        });
        let mut nested = wf.nested;
        let placed = wf.jobs.into_iter().enumerate().map(|(i, job)| (i as i32, at(&format!("jobs[{i}]")), job));
        let placed = placed.chain(callbacks.into_iter().map(|(step, name, job)| (step, at(&format!("callbacks.{name}")), job)));
        // Every job of a workflow names it on its envelope.
        let member = |mut job: NewJob| {
            if let Value::Object(extra) = &mut job.extra {
                extra.insert("workflow_id".into(), json!(id));
            }
            job
        };
        for (step, field, job) in placed {
            let inner = if step >= 0 { nested.remove(&(step as usize)) } else { None };
            if let Some(inner) = inner {
                let mut job = member(NewWorkflow::standing_job(inner.kind));
                let standing = Uuid::now_v7();
                job.id = Some(standing);
                job.pending = true;
                self.jobs.push(PlannedJob { job, field: field.clone(), workflow: id, step });
                let inner_id = inner.id.unwrap_or_else(Uuid::now_v7);
                self.add(inner, inner_id, Some((id, standing)), &field, depth + 1)?;
                continue;
            }
            if job.unique.is_some() {
                return Err(StoreError::invalid(format!("{field}.unique"), "unique jobs are not supported inside a workflow"));
            }
            if job.pending {
                return Err(StoreError::invalid(format!("{field}.pending"), "a workflow decides when its jobs start"));
            }
            // Dropping or rescheduling a member happens while its key is settled, under the
            // key's lock, and would take the workflow's locks after it: against the order
            // every other writer keeps (workflow first).
            if job.rate_limit.as_ref().is_some_and(|r| r.on_limit != crate::job::OnLimit::Wait) {
                return Err(StoreError::invalid(format!("{field}.rate_limit.on_limit"), "a workflow's jobs wait for their key's limit (on_limit \"wait\")"));
            }
            let mut job = member(job);
            // Every member waits for the workflow: `rebound_workflow_start` decides which
            // start it (see migrations/…_workflow_start.sql), at its creation for the
            // outermost one, when its parent gets to it for a nested one.
            job.pending = true;
            self.jobs.push(PlannedJob { job, field, workflow: id, step });
        }
        Ok(())
    }
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
    /// The workflow it is nested in.
    pub parent_id: Option<Uuid>,
}

impl Workflow {
    /// Whether it can still change.
    pub fn is_finished(&self) -> bool {
        matches!(self.state.as_str(), "completed" | "failed" | "cancelled")
    }

    /// Its jobs counted through every workflow nested in it, as OJS's `metadata` counts them
    /// ("including nested"): a nested workflow's jobs stand in for the job that represents it
    /// in this one, so a finished group whose jobs all ran still has `completed + failed =
    /// jobs` with nested workflows in it. The workflow's own counters (`job_count`, …) count
    /// that job once, as its state machine does. Needs the nested workflows loaded, as
    /// [`Store::workflow`] loads them.
    pub fn counts_with_nested(&self) -> NestedCounts {
        let mut c = NestedCounts { jobs: self.job_count, completed: self.completed_count, failed: self.failed_count };
        for m in &self.members {
            if let Some(inner) = &m.nested {
                let i = inner.counts_with_nested();
                // The standing job was counted as completed when its workflow completed, and
                // as failed, with an entry in `errors`, when it ended otherwise (failed, or
                // cancelled on its own while this one ran).
                let id = m.job_id.to_string();
                let counted_failed = self.errors.as_array().is_some_and(|e| e.iter().any(|x| x.get("job_id").and_then(Value::as_str) == Some(id.as_str())));
                c.jobs += i.jobs - 1;
                c.completed += i.completed - i32::from(m.state == JobState::Completed);
                c.failed += i.failed - i32::from(counted_failed);
            }
        }
        c
    }
}

/// A workflow's jobs counted through its nested workflows ([`Workflow::counts_with_nested`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NestedCounts {
    /// Every job of the workflow and of the workflows nested in it; callbacks not counted.
    pub jobs: i32,
    /// Those that completed.
    pub completed: i32,
    /// Those that failed for good.
    pub failed: i32,
}

/// One job of a workflow.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkflowMember {
    /// Its index among the steps or jobs; a callback's is negative (see [`CALLBACKS`]).
    pub step: i32,
    /// A graph step's id and the ids it depends on; `None` outside graphs.
    pub graph: Option<GraphStep>,
    /// The workflow this member is, if it is one; the rest describes the job standing for it.
    pub nested: Option<Box<Workflow>>,
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
    /// Creates a workflow and enqueues its jobs in one transaction: a chain's first step, every
    /// job of a group or batch and a graph's steps without dependencies can run at once (those
    /// of nested workflows too, where their parents start them at once); the rest wait. Every
    /// job is checked as an enqueue would check it (the error names `jobs[i]`, nested ones
    /// `jobs[i].jobs[k]`, or `callbacks.on_…`); unique keys and `pending` are refused inside
    /// workflows.
    pub async fn create_workflow(&self, wf: NewWorkflow) -> Result<Workflow, StoreError> {
        let id = wf.id.unwrap_or_else(Uuid::now_v7);
        let mut planned = Plan::default();
        planned.add(wf, id, None, "", 1)?;
        let Plan { workflows, jobs: placed, .. } = planned;
        let mut jobs = Vec::with_capacity(placed.len());
        let mut members = Vec::with_capacity(placed.len());
        let mut checked = Vec::with_capacity(placed.len());
        for p in placed {
            checked.push(check(&p.job).map_err(|e| e.map_field(|f| format!("{}.{f}", p.field)))?);
            jobs.push(p.job);
            members.push((p.workflow, p.step));
        }
        let mut tx = self.begin().await?;
        let root = &workflows[0];
        let inserted = sqlx::query("INSERT INTO workflows (id, type, name, job_count, state) VALUES ($1, $2, $3, $4, 'pending') ON CONFLICT (id) DO NOTHING")
            .bind(root.id)
            .bind(root.kind.as_str())
            .bind(&root.name)
            .bind(root.job_count)
            .execute(&mut *tx)
            .await?;
        if inserted.rows_affected() == 0 {
            // Nothing was written; a failed rollback closes the connection instead.
            let _ = tx.rollback().await;
            return Err(StoreError::Duplicate { reason: format!("a workflow with id {id} already exists"), existing: Some(id) });
        }
        let nested = &workflows[1..];
        if !nested.is_empty() {
            // Parents come before their children in the plan, as the foreign key wants.
            let inserted = sqlx::query(
                "INSERT INTO workflows (id, type, name, job_count, parent_id, parent_job, state)
                 SELECT *, 'pending' FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int4[], $5::uuid[], $6::uuid[])
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(nested.iter().map(|w| w.id).collect::<Vec<_>>())
            .bind(nested.iter().map(|w| w.kind.as_str()).collect::<Vec<_>>())
            .bind(nested.iter().map(|w| w.name.clone()).collect::<Vec<_>>())
            .bind(nested.iter().map(|w| w.job_count).collect::<Vec<_>>())
            .bind(nested.iter().map(|w| w.parent.map(|(p, _)| p)).collect::<Vec<_>>())
            .bind(nested.iter().map(|w| w.parent.map(|(_, j)| j)).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
            if inserted.rows_affected() != nested.len() as u64 {
                let _ = tx.rollback().await;
                return Err(StoreError::Duplicate { reason: "a nested workflow's id is taken by another workflow".into(), existing: None });
            }
        }
        for w in workflows.iter().filter(|w| !w.links.is_empty()) {
            // Arrays of arrays must be rectangular in Postgres: each step's go as text.
            let list = |l: &[i32]| l.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
            let depends_on: Vec<String> = w.links.iter().map(|l| list(&l.depends_on)).collect();
            let dependents: Vec<String> = w.links.iter().map(|l| list(&l.dependents)).collect();
            sqlx::query(
                "INSERT INTO workflow_steps (workflow_id, step, name, depends_on, dependents)
                 SELECT $1, s.i - 1, s.name, string_to_array(s.after, ',')::int[], string_to_array(s.before, ',')::int[]
                 FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS s(name, after, before, i)",
            )
            .bind(w.id)
            .bind(&w.step_ids)
            .bind(&depends_on)
            .bind(&dependents)
            .execute(&mut *tx)
            .await?;
        }
        insert_many(&mut tx, jobs, &checked, &members).await?;
        sqlx::query("SELECT rebound_workflow_start($1, NULL)").bind(id).execute(&mut *tx).await?;
        tx.commit().await?;
        self.workflow(id).await?.ok_or_else(|| StoreError::Missing { what: format!("workflow {id}") })
    }

    /// A page of outermost workflows (nested ones are read through their parents) without their
    /// jobs (`members` empty), newest first: those created before `before` (a workflow id), in
    /// `state` if given, at most `limit` (1–500).
    pub async fn list_workflows(&self, state: Option<&str>, before: Option<Uuid>, limit: i64) -> Result<Vec<Workflow>, StoreError> {
        // One statement per shape, not `($1 IS NULL OR state = $1)`: a prepared statement's
        // generic plan cannot use the state index for that: it walked the newest workflows
        // until it had a page of a rare state (510 000 of a million for the cancelled ones).
        let sql = match (state.is_some(), before.is_some()) {
            (false, false) => "SELECT * FROM workflows WHERE $1::text IS NULL AND $2::uuid IS NULL AND parent_id IS NULL ORDER BY id DESC LIMIT $3",
            (false, true) => "SELECT * FROM workflows WHERE $1::text IS NULL AND id < $2 AND parent_id IS NULL ORDER BY id DESC LIMIT $3",
            (true, false) => "SELECT * FROM workflows WHERE state = $1 AND $2::uuid IS NULL AND parent_id IS NULL ORDER BY id DESC LIMIT $3",
            (true, true) => "SELECT * FROM workflows WHERE state = $1 AND id < $2 AND parent_id IS NULL ORDER BY id DESC LIMIT $3",
        };
        let rows = sqlx::query(sql).bind(state).bind(before).bind(limit.clamp(1, 500)).fetch_all(&self.pool).await?;
        rows.iter().map(|row| workflow_from_row(row, Vec::new())).collect()
    }

    /// The workflow with its jobs and, in their members, the workflows nested in it; `None`
    /// if there is no such workflow.
    pub async fn workflow(&self, id: Uuid) -> Result<Option<Workflow>, StoreError> {
        // The whole tree in two statements, whatever its size: read level by level, a group
        // of a thousand nested chains took two thousand round trips to render.
        let rows = sqlx::query(
            "WITH RECURSIVE tree AS (
                 SELECT * FROM workflows WHERE id = $1
                 UNION ALL
                 SELECT w.* FROM workflows w JOIN tree t ON w.parent_id = t.id
             ) SELECT * FROM tree",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let ids = rows.iter().map(|r| r.try_get("id")).collect::<Result<Vec<Uuid>, _>>()?;
        let jobs = sqlx::query(
            "SELECT j.workflow_id, j.id, j.type, j.state, j.attempt, j.result, j.started_at, j.completed_at, j.workflow_step, s.name,
                    ARRAY(SELECT d.name FROM workflow_steps d WHERE d.workflow_id = j.workflow_id AND d.step = ANY(s.depends_on) ORDER BY d.step) AS depends_on,
                    (SELECT c.id FROM workflows c WHERE c.parent_job = j.id) AS nested_id
             FROM jobs j LEFT JOIN workflow_steps s ON s.workflow_id = j.workflow_id AND s.step = j.workflow_step
             WHERE j.workflow_id = ANY($1) ORDER BY j.workflow_id, j.workflow_step < 0, abs(j.workflow_step)",
        )
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        // Each workflow's members, with the nested workflow each stands for, if any.
        let mut members: HashMap<Uuid, Vec<(WorkflowMember, Option<Uuid>)>> = HashMap::new();
        for r in &jobs {
            let name: Option<String> = r.try_get("name")?;
            let member = WorkflowMember {
                step: r.try_get("workflow_step")?,
                graph: match name {
                    Some(id) => Some(GraphStep { id, depends_on: r.try_get("depends_on")? }),
                    None => None,
                },
                nested: None,
                job_id: r.try_get("id")?,
                job_type: r.try_get("type")?,
                state: r.try_get("state")?,
                attempt: r.try_get("attempt")?,
                result: r.try_get("result")?,
                started_at: ts_opt(r, "started_at")?,
                completed_at: ts_opt(r, "completed_at")?,
            };
            members.entry(r.try_get("workflow_id")?).or_default().push((member, r.try_get("nested_id")?));
        }
        let mut rows: HashMap<Uuid, sqlx::postgres::PgRow> = ids.into_iter().zip(rows).collect();
        assemble(id, &mut rows, &mut members).map(Some)
    }

    /// Cancels a workflow that has not finished: its waiting and queued jobs are cancelled,
    /// and running ones finish (their results no longer move it); so are the workflows nested
    /// in it that have not finished, level by level. An unknown workflow is
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

/// Workflow `id` from the rows of its tree, with its nested workflows in their members (each
/// row and member list is taken once: a tree has no cycles, and at most
/// [`MAX_WORKFLOW_DEPTH`] levels).
fn assemble(
    id: Uuid,
    rows: &mut HashMap<Uuid, sqlx::postgres::PgRow>,
    members: &mut HashMap<Uuid, Vec<(WorkflowMember, Option<Uuid>)>>,
) -> Result<Workflow, StoreError> {
    let row = rows.remove(&id).ok_or_else(|| StoreError::Missing { what: format!("workflow {id}") })?;
    let mut list = Vec::new();
    for (mut member, nested) in members.remove(&id).unwrap_or_default() {
        if let Some(inner) = nested {
            member.nested = Some(Box::new(assemble(inner, rows, members)?));
        }
        list.push(member);
    }
    workflow_from_row(&row, list)
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
        parent_id: row.try_get("parent_id")?,
    })
}
