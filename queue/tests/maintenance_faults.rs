//! The writes that run beside the workers' own, each cut off at its write by a proxy between
//! the store and Postgres (`FaultProxy`): the maintenance passes (expiry, count folding,
//! pruning, the rate-limit sweep), cron's release of waiting runs and its ticks under
//! `cancel_previous` and `enqueue`, and the operator's bulk writes at their `COMMIT`.
//!
//! Cut as sent, a write did nothing, and the next pass (or the operator sending it again)
//! does it. Cut after its commit, it was done once, and the next pass finds nothing left to
//! do. Either way the maintained counters agree with the table. (The worker's own writes are
//! cut in `worker/tests/faults_at_each_write.rs`; docs/faults.md says what each fault costs.)

use std::time::Duration;

use rebound_queue::cron_schedule::CronSchedule;
use rebound_queue::outcome::{HandlerError, Outcome};
use rebound_queue::store::{
    Actor, ClaimRequest, Completion, CronSpec, CronTemplate, EventFilter, Failure, JobSelection, OverlapPolicy, PruneConfig, RateLimitOverride, RedriveBudget,
    RedriveOptions,
};
use rebound_queue::testing::{Fault, FaultPoint, FaultProxy, TestDb};
use rebound_queue::{Job, JobState, NewJob, Store};
use serde_json::json;
use uuid::Uuid;

use FaultPoint::{AfterCommit, BeforeSend};

const POINTS: [FaultPoint; 2] = [BeforeSend, AfterCommit];

/// A database, a proxy in front of it, and a store that talks through the proxy.
struct Cut {
    db: TestDb,
    proxy: FaultProxy,
    through: Store,
}

impl Cut {
    async fn new() -> Cut {
        let db = TestDb::new().await;
        let proxy = FaultProxy::in_front_of(&db.url).await;
        let through = Store::connect(&proxy.url(&db.name), 2).await.expect("connect through the proxy");
        Cut { db, proxy, through }
    }

    fn store(&self) -> &Store {
        &self.db.store
    }
}

/// Panics unless the maintained counters (folded or not) agree with the table.
async fn assert_counts_exact(s: &Store, when: &str) {
    let mut counted: Vec<(String, String, String, bool, i64)> =
        s.stats(None).await.unwrap().rows.into_iter().map(|r| (r.queue, r.job_type, r.state.as_str().to_string(), r.dead_letter, r.count)).collect();
    counted.sort();
    let table: Vec<(String, String, String, bool, i64)> =
        sqlx::query_as("SELECT queue, type, state::text, dead_letter, count(*) FROM jobs GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4")
            .fetch_all(s.pool())
            .await
            .unwrap();
    assert_eq!(counted, table, "the counters disagree with the table {when}");
}

async fn enqueue(s: &Store, job_type: &str, queue: &str, n: usize) -> Vec<Uuid> {
    let jobs = (0..n).map(|i| NewJob::new(job_type, json!([i])).queue(queue)).collect();
    s.enqueue_batch(jobs).await.unwrap().into_iter().map(|e| e.job.id).collect()
}

async fn claim(s: &Store, queue: &str, limit: u32) -> Vec<Job> {
    let req = ClaimRequest { worker_id: "w".into(), queues: vec![queue.into()], limit, visibility_timeout: Duration::from_secs(300) };
    s.claim(&req).await.unwrap()
}

fn done(job: &Job) -> Completion {
    Completion { id: job.id, attempt: Some(job.attempt), worker_id: job.locked_by.clone(), started_at: job.started_at, result: None }
}

async fn states(s: &Store, ids: &[Uuid]) -> Vec<JobState> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(s.job(*id).await.unwrap().state);
    }
    out
}

async fn scalar(s: &Store, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(s.pool()).await.unwrap()
}

#[tokio::test]
async fn an_expiry_pass_cut_off_discards_each_expired_job_once() {
    for point in POINTS {
        let c = Cut::new().await;
        let s = c.store();
        let expired = enqueue(s, "exp.job", "default", 4).await;
        let kept = enqueue(s, "exp.job", "default", 1).await;
        sqlx::query("UPDATE jobs SET expires_at = now() - interval '1 second' WHERE id = ANY($1)").bind(&expired).execute(s.pool()).await.unwrap();

        let hit = c.proxy.inject(Fault::once("'rebound.expired', 'code', 'rebound.expired'", point));
        assert!(c.through.expire_due(100).await.is_err(), "{point:?}: the pass heard nothing back");
        assert_eq!(hit.count(), 1);
        let again = c.through.expire_due(100).await.unwrap();
        assert_eq!(again, if point == BeforeSend { 4 } else { 0 }, "{point:?}: sent again, the pass expires what is left");

        for id in &expired {
            let job = s.job(*id).await.unwrap();
            assert_eq!((job.state, job.attempt), (JobState::Discarded, 0), "{point:?}");
            assert_eq!(job.last_error.as_ref().and_then(|e| e["type"].as_str()), Some("rebound.expired"), "{point:?}");
        }
        assert_eq!(states(s, &kept).await, [JobState::Available], "{point:?}: a job with time left is left alone");
        assert_counts_exact(s, &format!("after an expiry cut {point:?}")).await;
    }
}

#[tokio::test]
async fn a_count_fold_cut_off_never_counts_a_change_twice() {
    for point in POINTS {
        let c = Cut::new().await;
        let s = c.store();
        enqueue(s, "fold.job", "fq", 6).await;
        let claimed = claim(s, "fq", 4).await;
        assert_eq!(s.complete_batch(&claimed[..2].iter().map(done).collect::<Vec<_>>()).await.unwrap().len(), 2);

        let hit = c.proxy.inject(Fault::once("DELETE FROM job_count_deltas RETURNING", point));
        assert!(c.through.fold_job_counts().await.is_err(), "{point:?}: the fold heard nothing back");
        assert_eq!(hit.count(), 1);
        assert_counts_exact(s, &format!("after a fold cut {point:?}")).await;
        let folded = c.through.fold_job_counts().await.unwrap();
        assert_eq!(folded == 0, point == AfterCommit, "{point:?}: sent again, the fold takes what is left ({folded} rows)");
        assert_eq!(scalar(s, "SELECT count(*) FROM job_count_deltas").await, 0, "{point:?}: every change folded");
        assert_counts_exact(s, &format!("after the fold sent again {point:?}")).await;
        assert_eq!(scalar(s, "SELECT COALESCE(sum(completed), 0)::int8 FROM job_throughput").await, 2, "{point:?}: each completion counted once");
    }
}

#[tokio::test]
async fn a_prune_cut_off_deletes_each_job_with_its_history_once() {
    let keep = Duration::from_secs(86_400);
    let cfg = PruneConfig {
        completed_after: Duration::ZERO,
        discarded_after: keep,
        dead_letters_after: keep,
        dead_letters_per_queue: 1_000,
        workers_after: keep,
        audit_after: keep,
        cron_runs_after: keep,
        batch: 100,
    };
    for point in POINTS {
        let c = Cut::new().await;
        let s = c.store();
        let finished = enqueue(s, "prune.job", "pq", 5).await;
        let claimed = claim(s, "pq", 5).await;
        assert_eq!(s.complete_batch(&claimed.iter().map(done).collect::<Vec<_>>()).await.unwrap().len(), 5);
        let waiting = enqueue(s, "prune.job", "pq", 1).await;
        // Past the cutoff, which ids carry to the millisecond.
        tokio::time::sleep(Duration::from_millis(20)).await;

        let hit = c.proxy.inject(Fault::once("DELETE FROM jobs x", point));
        assert!(c.through.prune(&cfg).await.is_err(), "{point:?}: the pass heard nothing back");
        assert_eq!(hit.count(), 1);
        let again = c.through.prune(&cfg).await.unwrap();
        assert_eq!(again.completed, if point == BeforeSend { 5 } else { 0 }, "{point:?}: sent again, the pass prunes what is left");

        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE id = ANY($1)").bind(&finished).fetch_one(s.pool()).await.unwrap();
        let history: i64 = sqlx::query_scalar("SELECT count(*) FROM job_attempts WHERE job_id = ANY($1)").bind(&finished).fetch_one(s.pool()).await.unwrap();
        assert_eq!((left, history), (0, 0), "{point:?}: the jobs went with their history");
        assert_eq!(states(s, &waiting).await, [JobState::Available], "{point:?}");
        assert_counts_exact(s, &format!("after a prune cut {point:?}")).await;
    }
}

fn cron_spec(overlap: OverlapPolicy) -> CronSpec {
    CronSpec {
        name: "tick".into(),
        // Once a year, so no tick of its own falls due while a test runs: the tests make
        // ticks due by hand.
        schedule: CronSchedule::new("0 0 1 1 *", "UTC").expect("schedule"),
        template: CronTemplate::from_job(&NewJob::new("cron.job", json!([1])).queue("cq"), json!({"queue": "cq"})),
        overlap_policy: overlap,
        enabled: true,
        description: None,
    }
}

/// Makes the cron job's next tick `minutes_ago` whole minutes ago.
async fn make_due(s: &Store, minutes_ago: i32) {
    sqlx::query("UPDATE cron_jobs SET next_run_at = date_trunc('minute', now()) - $1 * interval '1 minute' WHERE name = 'tick'")
        .bind(minutes_ago)
        .execute(s.pool())
        .await
        .unwrap();
}

/// The cron job's jobs, oldest tick first.
async fn cron_jobs(s: &Store) -> Vec<(Uuid, JobState)> {
    sqlx::query_as("SELECT j.id, j.state FROM cron_runs r JOIN jobs j ON j.id = r.job_id WHERE r.cron_name = 'tick' ORDER BY r.scheduled_for")
        .fetch_all(s.pool())
        .await
        .unwrap()
}

async fn run_outcomes(s: &Store) -> Vec<String> {
    sqlx::query_scalar("SELECT outcome FROM cron_runs WHERE cron_name = 'tick' ORDER BY scheduled_for").fetch_all(s.pool()).await.unwrap()
}

/// Fires the first tick, and leaves its job running (claimed) or finished.
async fn first_run(s: &Store, overlap: OverlapPolicy, finish: bool) -> Uuid {
    s.register_cron(&cron_spec(overlap), &Actor::new("t")).await.unwrap();
    make_due(s, 3).await;
    assert_eq!(s.fire_due_crons(10).await.unwrap().fired, 1);
    let claimed = claim(s, "cq", 10).await;
    assert_eq!(claimed.len(), 1);
    if finish {
        assert_eq!(s.complete_batch(&[done(&claimed[0])]).await.unwrap().len(), 1);
    }
    claimed[0].id
}

#[tokio::test]
async fn a_waiting_cron_run_released_under_a_cut_is_released_once() {
    for point in POINTS {
        let c = Cut::new().await;
        let s = c.store();
        s.register_cron(&cron_spec(OverlapPolicy::Enqueue), &Actor::new("t")).await.unwrap();
        make_due(s, 3).await;
        assert_eq!(s.fire_due_crons(10).await.unwrap().fired, 1);
        make_due(s, 2).await;
        assert_eq!(s.fire_due_crons(10).await.unwrap().fired, 1, "the second run waits for the first");
        let first = claim(s, "cq", 10).await;
        assert_eq!(first.len(), 1, "only the first run is handed out");
        assert_eq!(s.complete_batch(&[done(&first[0])]).await.unwrap().len(), 1);

        let hit = c.proxy.inject(Fault::once("WITH waiting AS", point));
        assert!(c.through.fire_due_crons(10).await.is_err(), "{point:?}: the release heard nothing back");
        assert_eq!(hit.count(), 1);
        let pass = c.through.fire_due_crons(10).await.unwrap();
        assert_eq!(pass.released, u64::from(point == BeforeSend), "{point:?}: sent again, it releases what is still waiting");

        let runs = cron_jobs(s).await;
        assert_eq!(runs.iter().map(|(_, st)| *st).collect::<Vec<_>>(), [JobState::Completed, JobState::Available], "{point:?}");
        assert_eq!(run_outcomes(s).await, ["enqueued", "waiting"], "{point:?}");
        assert_counts_exact(s, &format!("after a release cut {point:?}")).await;
    }
}

#[tokio::test]
async fn a_tick_cut_off_under_cancel_previous_or_enqueue_is_decided_once() {
    // The statement each policy adds to the tick's transaction.
    let cases = [
        (OverlapPolicy::CancelPrevious, "UPDATE jobs SET state = 'cancelled', cancelled_at = now(), locked_by = NULL", JobState::Cancelled, JobState::Available, "enqueued"),
        (OverlapPolicy::Enqueue, "INSERT INTO jobs (id, type, queue", JobState::Active, JobState::Pending, "waiting"),
    ];
    for (overlap, statement, previous, next, outcome) in cases {
        for point in POINTS {
            let c = Cut::new().await;
            let s = c.store();
            let running = first_run(s, overlap, false).await;
            make_due(s, 2).await;

            let hit = c.proxy.inject(Fault::once(statement, point));
            // A failed tick is logged and left to the next pass.
            let cut = c.through.fire_due_crons(10).await.unwrap();
            assert_eq!((hit.count(), cut.fired), (1, 0), "{overlap:?} {point:?}: the fault struck the tick");
            let again = c.through.fire_due_crons(10).await.unwrap();
            assert_eq!(again.fired, u64::from(point == BeforeSend), "{overlap:?} {point:?}: the next pass fires it only if it never landed");

            let runs = cron_jobs(s).await;
            assert_eq!(runs.len(), 2, "{overlap:?} {point:?}: one job per tick: {runs:?}");
            assert_eq!((runs[0], runs[1].1), ((running, previous), next), "{overlap:?} {point:?}");
            assert_eq!(run_outcomes(s).await, ["enqueued", outcome], "{overlap:?} {point:?}: one decision per tick");
            assert_eq!(s.cron_job("tick").await.unwrap().unwrap().run_count, 2, "{overlap:?} {point:?}");
            assert_counts_exact(s, &format!("after a tick cut {overlap:?} {point:?}")).await;
        }
    }
}

#[tokio::test]
async fn a_rate_limit_sweep_cut_off_ends_an_override_and_admits_each_job_once() {
    for point in POINTS {
        let c = Cut::new().await;
        let s = c.store();
        let ops = Actor::new("ops");
        s.enqueue_batch((0..4).map(|i| NewJob::new("rl.keyed", json!([i])).queue("q").rate_limit("k", Some(2))).collect()).await.unwrap();
        let until = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
        let stopped = s.override_rate_limit("k", Some(&RateLimitOverride { concurrency: 0, expires_at: Some(until) }), &ops).await.unwrap();
        assert_eq!((stopped.in_force, stopped.admitted), (Some(0), 0));
        // Its time is up.
        sqlx::query("UPDATE rate_limit_keys SET override_expires_at = now() - interval '1 second' WHERE key = 'k'").execute(s.pool()).await.unwrap();

        let hit = c.proxy.inject(Fault::once("rebound_rate_limit_end_overrides()", point));
        assert!(c.through.settle_rate_limits(100).await.is_err(), "{point:?}: the sweep heard nothing back");
        assert_eq!(hit.count(), 1);
        c.through.settle_rate_limits(100).await.unwrap();

        let k = s.rate_limit_key("k").await.unwrap().unwrap();
        assert_eq!((k.override_limit, k.admitted, k.waiting), (None, 2, 2), "{point:?}: back to the key's own limit");
        let filter = EventFilter { types: vec!["rate_limit.released".into()], limit: 100, ..EventFilter::default() };
        // One event per job admitted (the two the key's own limit lets run), none twice.
        let mut admitted: Vec<String> = s.rate_limit_events(&filter).await.unwrap().into_iter().map(|e| e.data["job_id"].to_string()).collect();
        let events = admitted.len();
        admitted.sort();
        admitted.dedup();
        assert_eq!((events, admitted.len()), (2, 2), "{point:?}: each admitted once: {admitted:?}");
        assert_counts_exact(s, &format!("after a sweep cut {point:?}")).await;
    }
}

/// The operator's writes, each one transaction with its audit entry.
#[derive(Clone, Copy, Debug)]
enum Action {
    BulkRetry,
    BulkCancel,
    BulkDelete,
    PurgeQueue,
    Redrive,
    PurgeDeadLetters,
    TriggerCron,
}

/// Puts three jobs where `action` applies to them.
async fn prepare(s: &Store, action: Action) -> Vec<Uuid> {
    let ops = Actor::new("ops");
    match action {
        Action::TriggerCron => {
            s.register_cron(&cron_spec(OverlapPolicy::Allow), &ops).await.unwrap();
            Vec::new()
        }
        Action::BulkCancel => enqueue(s, "op.job", "oq", 3).await,
        Action::BulkRetry | Action::BulkDelete | Action::PurgeQueue => {
            let ids = enqueue(s, "op.job", "oq", 3).await;
            // Run once, so that a retry's fresh budget shows (attempt 1 → 0).
            assert_eq!(claim(s, "oq", 3).await.len(), 3);
            assert_eq!(s.cancel_jobs(&JobSelection::Ids(ids.clone()), &ops).await.unwrap(), 3);
            ids
        }
        Action::Redrive | Action::PurgeDeadLetters => {
            let ids = enqueue(s, "op.job", "oq", 3).await;
            for job in claim(s, "oq", 3).await {
                let outcome = Outcome::DeadLetter(HandlerError::new("op.broken", "no"));
                s.fail(&Failure { id: job.id, attempt: Some(job.attempt), worker_id: Some("w".into()), outcome, error_code: None }).await.unwrap();
            }
            ids
        }
    }
}

/// Runs `action` through `s`, on `ids` where it takes a selection.
async fn act(s: &Store, action: Action, ids: &[Uuid]) -> Result<(), rebound_queue::StoreError> {
    let ops = Actor::new("ops");
    let sel = JobSelection::Ids(ids.to_vec());
    match action {
        Action::BulkRetry => s.retry_finished_jobs(&sel, &ops).await.map(drop),
        Action::BulkCancel => s.cancel_unfinished_jobs(&sel, &ops).await.map(drop),
        Action::BulkDelete => s.delete_finished_jobs(&sel, &ops).await.map(drop),
        Action::PurgeQueue => s.purge_queue("oq", &[JobState::Cancelled], None, &ops).await.map(drop),
        Action::Redrive => {
            let opts = RedriveOptions { budget: RedriveBudget::Fresh, stagger: None, actor: ops, reason: None };
            s.redrive(&sel, &opts).await.map(drop)
        }
        Action::PurgeDeadLetters => s.purge_dead_letters(&sel, &ops, None).await.map(drop),
        Action::TriggerCron => s.trigger_cron("tick", &ops).await.map(drop),
    }
}

/// `(state, dead letter)` of each job still there.
type Standing = Vec<(JobState, bool)>;

/// Where the jobs stand now: `(state, dead letter)` of each of `ids` still there,
/// or for a trigger, one entry per job the cron job has enqueued.
async fn landed(s: &Store, action: Action, ids: &[Uuid]) -> Standing {
    if let Action::TriggerCron = action {
        let n: i64 = scalar(s, "SELECT count(*) FROM jobs WHERE queue = 'cq'").await;
        return vec![(JobState::Available, false); usize::try_from(n).unwrap()];
    }
    let mut out = Vec::new();
    for id in ids {
        if let Some(job) = s.get_job(*id).await.unwrap() {
            out.push((job.state, job.dead_letter));
        }
    }
    out
}

#[tokio::test]
async fn an_operator_write_cut_off_at_its_commit_lands_whole_or_not_at_all() {
    let actions = [Action::BulkRetry, Action::BulkCancel, Action::BulkDelete, Action::PurgeQueue, Action::Redrive, Action::PurgeDeadLetters, Action::TriggerCron];
    for action in actions {
        // Where the jobs stand before the write, and after it has landed once.
        let (before, after): (Standing, Standing) = match action {
            Action::BulkRetry => (vec![(JobState::Cancelled, false); 3], vec![(JobState::Available, false); 3]),
            Action::BulkCancel => (vec![(JobState::Available, false); 3], vec![(JobState::Cancelled, false); 3]),
            Action::BulkDelete | Action::PurgeQueue => (vec![(JobState::Cancelled, false); 3], vec![]),
            Action::Redrive => (vec![(JobState::Discarded, true); 3], vec![(JobState::Available, false); 3]),
            Action::PurgeDeadLetters => (vec![(JobState::Discarded, true); 3], vec![]),
            Action::TriggerCron => (vec![], vec![(JobState::Available, false)]),
        };
        for point in POINTS {
            let c = Cut::new().await;
            let s = c.store();
            let ids = prepare(s, action).await;
            assert_eq!(landed(s, action, &ids).await, before, "{action:?}: prepared");
            let audited = scalar(s, "SELECT count(*) FROM audit_log").await;

            let hit = c.proxy.inject(Fault::once("COMMIT", point));
            assert!(act(&c.through, action, &ids).await.is_err(), "{action:?} {point:?}: the operator is told it failed");
            assert_eq!(hit.count(), 1, "{action:?} {point:?}");
            let committed = point == AfterCommit;
            assert_eq!(&landed(s, action, &ids).await, if committed { &after } else { &before }, "{action:?} {point:?}: all or nothing");
            assert_eq!(scalar(s, "SELECT count(*) FROM audit_log").await - audited, i64::from(committed), "{action:?} {point:?}: audited as it landed");
            assert_counts_exact(s, &format!("after {action:?} cut {point:?}")).await;

            // The operator sends it again. What landed is not done twice: the jobs have moved
            // on, so the selection no longer applies to them. A trigger is a new trigger.
            act(&c.through, action, &ids).await.unwrap();
            let twice = match action {
                Action::TriggerCron if committed => vec![(JobState::Available, false); 2],
                _ => after.clone(),
            };
            assert_eq!(landed(s, action, &ids).await, twice, "{action:?} {point:?}: sent again");
            if let Action::BulkRetry | Action::Redrive = action {
                for id in &ids {
                    assert_eq!(s.job(*id).await.unwrap().attempt, 0, "{action:?} {point:?}: the run counted before is given back");
                }
            }
            assert_counts_exact(s, &format!("after {action:?} sent again {point:?}")).await;
        }
    }
}
