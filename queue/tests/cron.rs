//! Cron in the store: ticks taken exactly once by concurrent firers, catch-up, overlap
//! policies, pause / resume / trigger / delete, run counting, and re-registration.

use jiff::Timestamp;
use rebound_queue::cron_schedule::CronSchedule;
use rebound_queue::store::{Actor, CronSpec, CronTemplate, EventFilter, OverlapPolicy};
use rebound_queue::testing::TestDb;
use rebound_queue::{JobState, NewJob, Store};
use serde_json::json;

fn spec(name: &str, expression: &str, overlap: OverlapPolicy) -> CronSpec {
    CronSpec {
        name: name.into(),
        schedule: CronSchedule::new(expression, "UTC").expect("schedule"),
        template: CronTemplate::from_job(&NewJob::new("cron.job", json!([1])).queue("cq"), json!({"queue": "cq"})),
        overlap_policy: overlap,
        enabled: true,
        description: Some("test".into()),
    }
}

/// Makes the cron job due now: its next tick `minutes_ago` whole minutes ago. (Each tick is
/// decided once, so a test that fires repeatedly uses a different one each time.)
async fn make_due(store: &Store, name: &str, minutes_ago: i32) -> Timestamp {
    sqlx::query_scalar::<_, jiff_sqlx::Timestamp>(
        "UPDATE cron_jobs SET next_run_at = date_trunc('minute', now()) - $2 * interval '1 minute' WHERE name = $1 RETURNING next_run_at",
    )
    .bind(name)
    .bind(minutes_ago)
    .fetch_one(store.pool())
    .await
    .expect("make due")
    .to_jiff()
}

/// Moves the cron job's next tick a month ahead, far from anything computed from now.
async fn park(store: &Store, name: &str) -> Timestamp {
    sqlx::query_scalar::<_, jiff_sqlx::Timestamp>("UPDATE cron_jobs SET next_run_at = now() + interval '30 days' WHERE name = $1 RETURNING next_run_at")
        .bind(name)
        .fetch_one(store.pool())
        .await
        .expect("park")
        .to_jiff()
}

async fn cron_jobs_of(store: &Store, name: &str) -> Vec<(uuid::Uuid, JobState)> {
    sqlx::query_as::<_, (uuid::Uuid, JobState)>("SELECT id, state FROM jobs WHERE meta->>'cron_name' = $1 ORDER BY id")
        .bind(name)
        .fetch_all(store.pool())
        .await
        .expect("jobs")
}

/// Waits out the last seconds of a minute. A test that fires a minutely tick and then
/// asserts that nothing more is due would be wrong if the clock turned a minute between the
/// two, when the next tick rightly falls due; a test run takes a few seconds at most.
async fn away_from_a_minute_turn() {
    let into_minute = Timestamp::now().as_millisecond().rem_euclid(60_000) as u64;
    if into_minute > 50_000 {
        tokio::time::sleep(std::time::Duration::from_millis(60_100 - into_minute)).await;
    }
}

/// How many jobs each tick of the cron job made, by the tick each job records.
async fn jobs_per_tick(store: &Store, name: &str) -> Vec<(String, i64)> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT meta->>'cron_triggered_at', count(*) FROM jobs WHERE meta->>'cron_name' = $1 GROUP BY 1 ORDER BY 1",
    )
    .bind(name)
    .fetch_all(store.pool())
    .await
    .expect("jobs per tick")
}

#[tokio::test]
async fn concurrent_firers_take_each_tick_once() {
    let db = TestDb::new().await;
    let actor = Actor::new("t");
    db.store.register_cron(&spec("race", "* * * * *", OverlapPolicy::Allow), &actor).await.unwrap();
    let (mut total, mut round_started) = (0, Timestamp::now());
    for round in 0..5 {
        round_started = Timestamp::now();
        let tick = make_due(&db.store, "race", 10 - round).await;
        // Eight firers, each with its own pool, as eight processes would be: no leadership.
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let store = Store::connect(&db.url, 2).await.unwrap();
            tasks.push(tokio::spawn(async move { store.fire_due_crons(10).await.unwrap().fired }));
        }
        let mut fired = 0;
        for t in tasks {
            fired += t.await.unwrap();
        }
        // A firer that starts after the clock turns a minute rightly fires that minute's tick
        // too, so the count is per tick: the made-due one once, and none of them twice.
        let per_tick = jobs_per_tick(&db.store, "race").await;
        assert_eq!(per_tick.iter().find(|(t, _)| *t == tick.to_string()).map(|(_, n)| *n), Some(1), "round {round}: tick {tick}: {per_tick:?}");
        assert!(per_tick.iter().all(|(_, n)| *n == 1), "round {round}: a tick fired twice: {per_tick:?}");
        let jobs = cron_jobs_of(&db.store, "race").await.len() as u64;
        assert_eq!(fired, jobs - total, "round {round}: fired {fired}, but {} jobs were made", jobs - total);
        assert!(fired <= 2, "round {round}: one made-due tick and at most the next minute's: {per_tick:?}");
        total = jobs;
    }
    let cron = db.store.cron_job("race").await.unwrap().unwrap();
    assert_eq!(cron.run_count as u64, total);
    assert!(cron.next_run_at.unwrap() > round_started, "next run moved to the future");
}

#[tokio::test]
async fn missed_ticks_fire_once_then_the_next_future_tick() {
    let db = TestDb::new().await;
    away_from_a_minute_turn().await;
    db.store.register_cron(&spec("late", "* * * * *", OverlapPolicy::Allow), &Actor::new("t")).await.unwrap();
    sqlx::query("UPDATE cron_jobs SET next_run_at = date_trunc('minute', now()) - interval '30 minutes' WHERE name = 'late'")
        .execute(db.store.pool())
        .await
        .unwrap();
    let pass = db.store.fire_due_crons(10).await.unwrap();
    assert_eq!(pass.fired, 1);
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 0, "thirty missed minutes fire once");
    let job = db.store.job(cron_jobs_of(&db.store, "late").await[0].0).await.unwrap();
    assert_eq!((job.queue.as_str(), job.job_type.as_str(), job.args.clone()), ("cq", "cron.job", json!([1])));
    assert_eq!(job.meta["cron_name"], "late");
}

#[tokio::test]
async fn overlap_policies() {
    let db = TestDb::new().await;
    away_from_a_minute_turn().await;
    let actor = Actor::new("t");
    for (name, policy) in [("skip", OverlapPolicy::Skip), ("allow", OverlapPolicy::Allow), ("cancel", OverlapPolicy::CancelPrevious), ("hold", OverlapPolicy::Enqueue)] {
        db.store.register_cron(&spec(name, "* * * * *", policy), &actor).await.unwrap();
        make_due(&db.store, name, 2).await;
    }
    let first = db.store.fire_due_crons(10).await.unwrap();
    assert_eq!(first.fired, 4);
    // The first runs are running: skip and cancel_previous look at running ones.
    for name in ["skip", "cancel"] {
        sqlx::query("UPDATE jobs SET state = 'active', attempt = 1, started_at = now() WHERE meta->>'cron_name' = $1")
            .bind(name)
            .execute(db.store.pool())
            .await
            .unwrap();
    }
    // The same tick again (a cron job re-registered onto a tick it fired) is not fired twice.
    make_due(&db.store, "allow", 2).await;
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 0);
    for name in ["skip", "allow", "cancel", "hold"] {
        make_due(&db.store, name, 1).await;
    }
    let second = db.store.fire_due_crons(10).await.unwrap();
    assert_eq!((second.fired, second.skipped), (3, 1));
    let states = |v: Vec<(uuid::Uuid, JobState)>| v.into_iter().map(|(_, s)| s).collect::<Vec<_>>();
    assert_eq!(states(cron_jobs_of(&db.store, "skip").await), [JobState::Active], "skip: the first is running");
    assert_eq!(states(cron_jobs_of(&db.store, "allow").await), [JobState::Available, JobState::Available]);
    assert_eq!(states(cron_jobs_of(&db.store, "cancel").await), [JobState::Cancelled, JobState::Available]);
    assert_eq!(states(cron_jobs_of(&db.store, "hold").await), [JobState::Available, JobState::Pending], "enqueue: held behind the first");
    assert_eq!(db.store.cron_job("skip").await.unwrap().unwrap().last_outcome.as_deref(), Some("skipped"));
    let skipped = db.store.cron_events(&EventFilter { types: vec!["cron.skipped".into()], limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(skipped.len(), 1);
    assert_eq!((skipped[0].cron_name.as_str(), skipped[0].reason, skipped[0].job_id), ("skip", Some("overlap_skip"), None));
    // ojs-cron §9: a skip names the run in the way, a trigger which run it was.
    let running = cron_jobs_of(&db.store, "skip").await;
    assert_eq!((skipped[0].active_job_id, skipped[0].run_count), (Some(running[0].0), None));
    let allow_runs = db.store.cron_events(&EventFilter { types: vec!["cron.triggered".into()], limit: 100, ..Default::default() }).await.unwrap();
    let mut numbers: Vec<Option<i64>> = allow_runs.iter().filter(|e| e.cron_name == "allow").map(|e| e.run_count).collect();
    numbers.sort();
    assert_eq!(numbers, [Some(1), Some(2)]);
    assert!(allow_runs.iter().all(|e| e.active_job_id.is_none()));
    assert_eq!(db.store.cron_events(&EventFilter { queues: vec!["cq".into()], limit: 100, ..Default::default() }).await.unwrap().len(), 8, "7 triggered + 1 skipped");
    // One job's: the run that enqueued it, newest first or after a cursor.
    let allowed = cron_jobs_of(&db.store, "allow").await;
    for after in [None, Some("evt_0000000000000000:".to_string())] {
        let of_job = db.store.cron_events(&EventFilter { job_id: Some(allowed[1].0), after, limit: 10, ..Default::default() }).await.unwrap();
        assert_eq!(of_job.iter().map(|e| (e.cron_name.as_str(), e.job_id)).collect::<Vec<_>>(), [("allow", Some(allowed[1].0))]);
    }
    assert!(db.store.cron_events(&EventFilter { job_id: Some(uuid::Uuid::now_v7()), limit: 10, ..Default::default() }).await.unwrap().is_empty());
    // The held job is released once the first run finished.
    let hold = cron_jobs_of(&db.store, "hold").await;
    db.store.cancel(hold[0].0, None).await.unwrap();
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().released, 1);
    assert_eq!(db.store.job(hold[1].0).await.unwrap().state, JobState::Available);
    // A manual trigger is a run too, numbered after the scheduled ones.
    let (_, manual) = db.store.trigger_cron("allow", &actor).await.unwrap();
    let of_manual = db.store.cron_events(&EventFilter { job_id: Some(manual.id), limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(of_manual.iter().map(|e| (e.manual, e.run_count)).collect::<Vec<_>>(), [(true, Some(3))]);
}

#[tokio::test]
async fn pause_resume_trigger_delete() {
    let db = TestDb::new().await;
    let actor = Actor::new("olivia");
    let (cron, created) = db.store.register_cron(&spec("ops", "@hourly", OverlapPolicy::Skip), &actor).await.unwrap();
    assert!(created && cron.next_run_at.is_some());
    let (_, created) = db.store.register_cron(&spec("ops", "@daily", OverlapPolicy::Skip), &actor).await.unwrap();
    assert!(!created, "registration is an upsert");
    let until = db.store.time_until_next_cron_tick().await.unwrap().expect("a tick to wait for");
    assert!(until <= std::time::Duration::from_secs(86_400), "{until:?}");
    let paused = db.store.set_cron_enabled("ops", false, &actor).await.unwrap();
    assert_eq!((paused.enabled, paused.next_run_at), (false, None));
    assert_eq!(db.store.time_until_next_cron_tick().await.unwrap(), None, "a paused cron job is not waited for");
    sqlx::query("UPDATE cron_jobs SET next_run_at = now() - interval '1 hour' WHERE name = 'ops'").execute(db.store.pool()).await.unwrap();
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 0, "a paused cron job never fires");
    sqlx::query("UPDATE cron_jobs SET enabled = true WHERE name = 'ops'").execute(db.store.pool()).await.unwrap();
    assert_eq!(db.store.time_until_next_cron_tick().await.unwrap(), None, "a tick already due (one a pass left) is not waited for");
    sqlx::query("UPDATE cron_jobs SET enabled = false WHERE name = 'ops'").execute(db.store.pool()).await.unwrap();
    let resumed = db.store.set_cron_enabled("ops", true, &actor).await.unwrap();
    assert!(resumed.enabled && resumed.next_run_at.unwrap() > Timestamp::now());
    // Bounded by this clock on either side of the read, so a stall between them cannot fail it.
    let before = Timestamp::now();
    let until = db.store.time_until_next_cron_tick().await.unwrap().expect("a tick to wait for");
    let next = resumed.next_run_at.unwrap();
    let (least, most) = (next.duration_since(Timestamp::now()).as_secs_f64() - 5.0, next.duration_since(before).as_secs_f64() + 1.0);
    assert!((least..=most).contains(&until.as_secs_f64()), "{until:?} until the next tick, {least}..={most}s expected");
    let (after, job) = db.store.trigger_cron("ops", &actor).await.unwrap();
    assert_eq!((after.last_outcome.as_deref(), after.last_job_id, after.run_count), (Some("triggered"), Some(job.id), 1));
    assert_eq!(job.state, JobState::Available);
    assert!(db.store.delete_cron("ops", &actor).await.unwrap().is_some());
    assert!(db.store.delete_cron("ops", &actor).await.unwrap().is_none());
    assert_eq!(db.store.job(job.id).await.unwrap().state, JobState::Available, "enqueued jobs stay");
    let actions: Vec<String> = db.store.audit_log(&Default::default()).await.unwrap().into_iter().map(|e| e.action).collect();
    for a in ["cron.register", "cron.update", "cron.pause", "cron.resume", "cron.trigger", "cron.delete"] {
        assert!(actions.iter().any(|x| x == a), "{a} audited: {actions:?}");
    }
}

#[tokio::test]
async fn every_keeps_its_cadence_from_the_anchor() {
    let db = TestDb::new().await;
    away_from_a_minute_turn().await;
    let before = Timestamp::now();
    let (cron, created) = db.store.register_cron(&spec("beat", "@every 7m", OverlapPolicy::Allow), &Actor::new("t")).await.unwrap();
    assert!(created);
    let first = cron.next_run_at.expect("scheduled");
    // Registered between `before` and now: 420 s after either, give or take a second of clocks.
    let (from_before, from_now) = (first.duration_since(before).as_secs_f64(), first.duration_since(Timestamp::now()).as_secs_f64());
    assert!(from_before >= 419.0 && from_now <= 421.0, "first tick one interval after registration, got {from_before}s / {from_now}s");
    // Twenty minutes behind: the tick fires once, and the next is on the same 7-minute
    // cadence from the missed tick (not seven minutes from whenever it happened to fire).
    let tick = make_due(&db.store, "beat", 20).await;
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 1);
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 0, "missed ticks fire once");
    let next = db.store.cron_job("beat").await.unwrap().unwrap().next_run_at.expect("next");
    assert_eq!(next.duration_since(tick).as_secs() % 420, 0, "on the cadence: {tick} then {next}");
    assert!(next > Timestamp::now() && next.duration_since(Timestamp::now()).as_secs() <= 420, "the first tick after now: {next}");
    assert_eq!(cron_jobs_of(&db.store, "beat").await.len(), 1);
}

#[tokio::test]
async fn skipped_ticks_are_not_counted_as_runs() {
    let db = TestDb::new().await;
    away_from_a_minute_turn().await;
    db.store.register_cron(&spec("solo", "* * * * *", OverlapPolicy::Skip), &Actor::new("t")).await.unwrap();
    make_due(&db.store, "solo", 2).await;
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 1);
    let fired = db.store.cron_job("solo").await.unwrap().unwrap();
    assert_eq!(fired.run_count, 1);
    let last_run = fired.last_run_at.expect("last run of the tick that enqueued");
    sqlx::query("UPDATE jobs SET state = 'active', attempt = 1, started_at = now() WHERE meta->>'cron_name' = 'solo'")
        .execute(db.store.pool())
        .await
        .unwrap();
    let tick = make_due(&db.store, "solo", 1).await;
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().skipped, 1);
    let skipped = db.store.cron_job("solo").await.unwrap().unwrap();
    assert_eq!((skipped.run_count, skipped.last_run_at, skipped.last_outcome.as_deref()), (1, Some(last_run), Some("skipped")), "a skip is not a run");
    assert!(skipped.next_run_at.expect("next") > tick, "the skipped tick is still consumed");
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().skipped, 0, "and not decided again");
}

/// Firing ticks deletes no cron history: its age is the pruner's (`cron_runs_after`, each
/// cron keeping its latest run), so a monthly cron's last run stays on its page while a
/// minutely one fires beside it.
#[tokio::test]
async fn firing_ticks_leaves_the_runs_history_to_the_pruner() {
    let db = TestDb::new().await;
    away_from_a_minute_turn().await;
    db.store.register_cron(&spec("minutely", "* * * * *", OverlapPolicy::Allow), &Actor::new("t")).await.unwrap();
    db.store.register_cron(&spec("monthly", "0 0 1 * *", OverlapPolicy::Allow), &Actor::new("t")).await.unwrap();
    // The monthly cron's last run was 20 days ago, and its job is long done.
    sqlx::query("INSERT INTO cron_runs (cron_name, scheduled_for, fired_at, outcome) VALUES ('monthly', now() - interval '20 days', now() - interval '20 days', 'enqueued')")
        .execute(db.store.pool())
        .await
        .unwrap();
    make_due(&db.store, "minutely", 1).await;
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 1);
    let runs: Vec<String> = sqlx::query_scalar("SELECT cron_name FROM cron_runs ORDER BY scheduled_for").fetch_all(db.store.pool()).await.unwrap();
    assert_eq!(runs, ["monthly", "minutely"], "the monthly cron's last run is kept");
}

#[tokio::test]
async fn re_registering_unchanged_keeps_the_schedule() {
    let db = TestDb::new().await;
    let actor = Actor::new("deploy");
    db.store.register_cron(&spec("nightly", "@every 24h", OverlapPolicy::Skip), &actor).await.unwrap();
    // A tick fell due while the server was down.
    let due = make_due(&db.store, "nightly", 5).await;
    // The next deploy registers it again, with a new template and description but the same
    // schedule: the due tick is kept, not pushed a day ahead.
    let mut again = spec("nightly", "@every 24h", OverlapPolicy::Allow);
    again.template = CronTemplate::from_job(&NewJob::new("cron.job", json!([2])).queue("cq2"), json!({"queue": "cq2"}));
    again.description = Some("changed".into());
    let (cron, created) = db.store.register_cron(&again, &actor).await.unwrap();
    assert!(!created);
    assert_eq!((cron.next_run_at, cron.overlap_policy, cron.template.queue.as_str()), (Some(due), OverlapPolicy::Allow, "cq2"));
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 1, "the missed tick is caught up once");
    let job = db.store.job(cron_jobs_of(&db.store, "nightly").await[0].0).await.unwrap();
    assert_eq!((job.queue.as_str(), job.args.clone()), ("cq2", json!([2])), "the updated template");
    let parked = park(&db.store, "nightly").await;
    let (kept, _) = db.store.register_cron(&again, &actor).await.unwrap();
    assert_eq!(kept.next_run_at, Some(parked), "unchanged: kept, even when in the future");
    // A changed expression, time zone or enabled flag reschedules from now.
    let hourly = spec("nightly", "@hourly", OverlapPolicy::Allow);
    let (moved, _) = db.store.register_cron(&hourly, &actor).await.unwrap();
    assert!(moved.next_run_at.expect("next") < parked, "new expression: from now");
    let parked = park(&db.store, "nightly").await;
    let mut zoned = spec("nightly", "@hourly", OverlapPolicy::Allow);
    zoned.schedule = CronSchedule::new("@hourly", "Asia/Kolkata").expect("schedule");
    let (moved, _) = db.store.register_cron(&zoned, &actor).await.unwrap();
    assert!(moved.next_run_at.expect("next") < parked, "new time zone: from now");
    zoned.enabled = false;
    let (off, _) = db.store.register_cron(&zoned, &actor).await.unwrap();
    assert_eq!(off.next_run_at, None, "disabled: no next run");
    zoned.enabled = true;
    let (on, _) = db.store.register_cron(&zoned, &actor).await.unwrap();
    assert!(on.next_run_at.expect("re-enabled: scheduled") > Timestamp::now());
}

#[tokio::test]
async fn a_time_swallowed_by_daylight_saving_is_a_skip_event_not_a_run() {
    let db = TestDb::new().await;
    let zoned = CronSpec { schedule: CronSchedule::new("30 2 * * *", "America/New_York").expect("schedule"), ..spec("nightly", "* * * * *", OverlapPolicy::CancelPrevious) };
    db.store.register_cron(&zoned, &Actor::new("t")).await.unwrap();
    // 2026-03-08: New York jumps from 02:00 to 03:00, so 02:30 never happens that day. The
    // firing pass still looks at the schedule just after the gap, and records the skip.
    let gap = zoned.schedule.next_tick_after("2026-03-08T05:00:00Z".parse().unwrap()).expect("a tick in the gap");
    let set_tick = |at: Timestamp| {
        sqlx::query("UPDATE cron_jobs SET next_run_at = $2::timestamptz WHERE name = $1").bind("nightly").bind(at.to_string()).execute(db.store.pool())
    };
    set_tick(gap).await.unwrap();
    let listed = db.store.cron_job("nightly").await.unwrap().unwrap();
    assert_eq!((listed.next_tick_at, listed.next_run_at), (Some(gap), Some("2026-03-09T06:30:00Z".parse().unwrap())), "next_run_at names the next real run");

    let pass = db.store.fire_due_crons(10).await.unwrap();
    assert_eq!((pass.fired, pass.skipped), (0, 1));
    assert!(cron_jobs_of(&db.store, "nightly").await.is_empty(), "nothing enqueued for a time that did not exist");
    let after = db.store.cron_job("nightly").await.unwrap().unwrap();
    assert_eq!((after.run_count, after.last_outcome.as_deref()), (0, Some("skipped")));
    assert_eq!(after.next_tick_at, Some("2026-03-09T06:30:00Z".parse().unwrap()), "the tick is consumed; the next is the run after it");
    let skips = db.store.cron_events(&EventFilter { types: vec!["cron.skipped".into()], limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(skips.len(), 1, "{skips:?}");
    assert_eq!((skips[0].reason, skips[0].scheduled_time, skips[0].active_job_id, skips[0].job_id), (Some("dst_skip"), gap, None, None));
    assert_eq!((skips[0].expression.as_deref(), skips[0].timezone.as_deref()), (Some("30 2 * * *"), Some("America/New_York")));
    // That run is long past here: it fires once (a catch-up), and the schedule moves on.
    let pass = db.store.fire_due_crons(10).await.unwrap();
    assert_eq!((pass.fired, pass.skipped), (1, 0), "the skip is decided once");
    assert!(db.store.cron_job("nightly").await.unwrap().unwrap().next_run_at.expect("next") > Timestamp::now());

    // A pass that comes late, past the gap and past the run after it (the server was down):
    // the skip does not fold that run away; it fires once, on the next pass.
    let both = CronSpec { schedule: CronSchedule::new("30 2,3 * * *", "America/New_York").expect("schedule"), ..spec("twice", "* * * * *", OverlapPolicy::Allow) };
    db.store.register_cron(&both, &Actor::new("t")).await.unwrap();
    let gap = both.schedule.next_tick_after("2026-03-08T05:00:00Z".parse().unwrap()).expect("a tick in the gap");
    assert!(both.schedule.skips_at(gap));
    sqlx::query("UPDATE cron_jobs SET next_run_at = $2::timestamptz WHERE name = $1").bind("twice").bind(gap.to_string()).execute(db.store.pool()).await.unwrap();
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().skipped, 1);
    let after_gap = db.store.cron_job("twice").await.unwrap().unwrap().next_tick_at.expect("next");
    assert_eq!(after_gap, "2026-03-08T07:30:00Z".parse().unwrap(), "03:30 EDT, the run after the gap, though it is long past");
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 1, "and it fires, once");
    assert_eq!(cron_jobs_of(&db.store, "twice").await.len(), 1);

    // The jump lands on a time the schedule names (02:00 swallowed, 03:00 named): the skip is
    // recorded a microsecond before the jump, and 03:00 fires after it.
    let landing = CronSpec { schedule: CronSchedule::new("0 2,3 * * *", "America/New_York").expect("schedule"), ..spec("landing", "* * * * *", OverlapPolicy::Allow) };
    db.store.register_cron(&landing, &Actor::new("t")).await.unwrap();
    let skip = landing.schedule.next_tick_after("2026-03-08T05:00:00Z".parse().unwrap()).expect("a tick");
    sqlx::query("UPDATE cron_jobs SET next_run_at = $2::timestamptz WHERE name = $1").bind("landing").bind(skip.to_string()).execute(db.store.pool()).await.unwrap();
    let pass = db.store.fire_due_crons(10).await.unwrap();
    assert_eq!((pass.fired, pass.skipped), (0, 1));
    let fire: Timestamp = "2026-03-08T07:00:00Z".parse().unwrap();
    assert_eq!(db.store.cron_job("landing").await.unwrap().unwrap().next_tick_at, Some(fire), "03:00 EDT is next");
    let skips = db.store.cron_events(&EventFilter { types: vec!["cron.skipped".into()], limit: 10, ..Default::default() }).await.unwrap();
    let landed: Vec<_> = skips.iter().filter(|e| e.cron_name == "landing").collect();
    assert_eq!(landed.len(), 1, "{skips:?}");
    assert_eq!((landed[0].reason, landed[0].scheduled_time), (Some("dst_skip"), skip), "kept to the microsecond");
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 1, "then 03:00 fires");
    assert_eq!(cron_jobs_of(&db.store, "landing").await.len(), 1);
}

#[tokio::test]
async fn a_tick_lost_before_it_is_sent_or_committed_unanswered_fires_once() {
    use rebound_queue::testing::{Fault, FaultPoint, FaultProxy};
    let db = TestDb::new().await;
    away_from_a_minute_turn().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.expect("connect through the proxy");
    // The tick's decision is written inside the transaction that takes it.
    const DECIDING: &str = "INSERT INTO cron_runs (cron_name, scheduled_for, outcome) VALUES ($1, $2::timestamptz, 'deciding')";
    for (name, point) in [("lost-before", FaultPoint::BeforeSend), ("lost-after", FaultPoint::AfterCommit)] {
        db.store.register_cron(&spec(name, "* * * * *", OverlapPolicy::Allow), &Actor::new("t")).await.unwrap();
        let tick = make_due(&db.store, name, 3).await;
        let hit = proxy.inject(Fault::once(DECIDING, point));
        // The pass logs the failed tick and goes on; either way nothing is enqueued twice.
        let _ = through.fire_due_crons(10).await;
        assert_eq!(hit.count(), 1, "{name}: the fault struck the tick");
        let after_fault = cron_jobs_of(&db.store, name).await.len();
        let pass = through.fire_due_crons(10).await.expect("the next pass");
        let jobs = cron_jobs_of(&db.store, name).await;
        assert_eq!(jobs.len(), 1, "{name}: the tick fired exactly once: {jobs:?}");
        match point {
            // Never reached the database: the tick is still due and the next pass fires it.
            FaultPoint::BeforeSend => assert_eq!((after_fault, pass.fired), (0, 1), "{name}"),
            // Committed unanswered: the tick was taken, so the next pass finds it gone.
            _ => assert_eq!((after_fault, pass.fired), (1, 0), "{name}"),
        }
        let runs: Vec<(String,)> = sqlx::query_as("SELECT outcome FROM cron_runs WHERE cron_name = $1 AND scheduled_for = $2::timestamptz")
            .bind(name)
            .bind(tick.to_string())
            .fetch_all(db.store.pool())
            .await
            .unwrap();
        assert_eq!(runs, vec![("enqueued".to_string(),)], "{name}: one decision for the tick");
        let cron = db.store.cron_job(name).await.unwrap().unwrap();
        assert_eq!(cron.run_count, 1, "{name}");
        assert!(cron.next_run_at.expect("next") > tick, "{name}: the schedule moved on");
    }
}
