//! Cron fired by real `rebound-worker` processes: on schedule, exactly once per tick with three
//! workers competing, and still exactly once after the leader is killed mid-stream.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use rebound_queue::cron_schedule::CronSchedule;
use rebound_queue::store::{Actor, CronSpec, CronTemplate, OverlapPolicy};
use rebound_queue::testing::TestDb;
use rebound_queue::{NewJob, Store};
use serde_json::json;
use sqlx::Row;
use support::{WorkerProcess, eventually, fast_config};

const LONG: Duration = Duration::from_secs(60);

/// Jobs the cron job enqueued, by tick: (tick, how many jobs, when the first was created).
async fn ticks(store: &Store) -> BTreeMap<Timestamp, (i64, Timestamp)> {
    let rows = sqlx::query(
        "SELECT (meta->>'cron_triggered_at')::timestamptz AS tick, count(*) AS n, min(created_at) AS created
         FROM jobs WHERE meta->>'cron_name' = 'every-second' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(store.pool())
    .await
    .expect("count cron jobs");
    rows.iter()
        .map(|r| {
            let tick = r.try_get::<jiff_sqlx::Timestamp, _>("tick").expect("tick").to_jiff();
            let created = r.try_get::<jiff_sqlx::Timestamp, _>("created").expect("created").to_jiff();
            (tick, (r.try_get("n").expect("n"), created))
        })
        .collect()
}

/// Every tick fired once, never early, and within 3 s of its time unless `excused` (ticks due
/// while no leader was alive: they fire when one takes over, however long that took).
fn assert_once_each_on_time(ticks: &BTreeMap<Timestamp, (i64, Timestamp)>, excused: impl Fn(Timestamp) -> bool) {
    for (tick, (n, created)) in ticks {
        assert_eq!(*n, 1, "tick {tick} fired {n} times: {ticks:?}");
        assert_eq!(tick.as_millisecond() % 1000, 0, "ticks fall on whole seconds: {tick}");
        let late = created.duration_since(*tick);
        assert!(late >= jiff::SignedDuration::ZERO, "tick {tick} fired early, at {created}");
        assert!(excused(*tick) || late < jiff::SignedDuration::from_secs(3), "tick {tick} fired {late:?} late");
    }
}

#[tokio::test]
async fn three_workers_fire_each_tick_once_and_a_killed_leader_changes_nothing() {
    let db = TestDb::new().await;
    let spec = CronSpec {
        name: "every-second".into(),
        schedule: CronSchedule::new("* * * * * *", "UTC").expect("schedule"),
        template: CronTemplate::from_job(&NewJob::new("cron.tick", json!([])).queue("cron-out"), json!({"queue": "cron-out"})),
        overlap_policy: OverlapPolicy::Allow,
        enabled: true,
        description: None,
    };
    db.store.register_cron(&spec, &Actor::new("test")).await.expect("register");
    // The workers serve another queue, so the cron jobs stay put to be counted.
    let config = fast_config("", "elsewhere = 1", "[handlers.\"other.job\"]\nkind = \"exec\"\ncommand = [\"true\"]\n");
    let mut workers: Vec<WorkerProcess> = (0..3).map(|_| WorkerProcess::start(&db.url, &config, &[])).collect();

    eventually("the first ticks", LONG, || async { (ticks(&db.store).await.len() >= 4).then_some(()) }).await;
    let leader = eventually("a leader", LONG, || {
        let found = workers.iter().position(|w| w.log_text().contains("became the maintenance leader"));
        async move { found }
    })
    .await;
    let before_kill: BTreeMap<_, _> = ticks(&db.store).await.into_iter().skip(1).collect();
    assert_once_each_on_time(&before_kill, |_| false);

    workers[leader].kill9();
    let killed_at = Timestamp::now();
    eventually("ticks after the leader was killed", LONG, || async {
        let after = ticks(&db.store).await;
        (after.keys().filter(|t| **t > killed_at + jiff::SignedDuration::from_secs(1)).count() >= 3).then_some(())
    })
    .await;
    // The first tick fired may be late, and leave one out, by as long as the workers took to
    // start and elect a leader; from then on every tick fires on time.
    let all: BTreeMap<_, _> = ticks(&db.store).await.into_iter().skip(1).collect();
    // The new leader's first fire is a catch-up of the ticks due since the kill: it is as late
    // as the take-over was slow (the dead leader's lock freed, a survivor's next campaign),
    // which a loaded machine stretches. Every tick after it is held to the bound again.
    let takeover = all.values().map(|(_, created)| *created).filter(|c| *c > killed_at).min().expect("a fire after the kill");
    assert_once_each_on_time(&all, |tick| tick > killed_at - jiff::SignedDuration::from_secs(1) && tick <= takeover);
    // A new leader took over: the survivors' logs say so.
    assert!(
        workers.iter().enumerate().any(|(i, w)| i != leader && w.log_text().contains("became the maintenance leader")),
        "a surviving worker became leader"
    );
    // A tick is left out only when the tick before it fired late, at or after the one left out:
    // catch-up fires once, the next tick being the first after the late fire. The take-over
    // leaves such a gap, and so may a stalled pass on a loaded machine; a gap with no late
    // fire behind it is a tick missed. (A leader that paused a fixed second after each pass
    // drifted across a whole second every minute or two, and left a tick out each time behind
    // a late fire, which this allows: the cron service's own test holds it to waking just
    // after the next tick.)
    let second = jiff::SignedDuration::from_secs(1);
    for ((a, (_, fired)), (b, _)) in all.iter().zip(all.iter().skip(1)) {
        if b.duration_since(*a) > second {
            assert!(*fired >= *b - second, "tick {a} fired on time at {fired}, yet the ticks up to {b} were missed: {:?}", all.keys().collect::<Vec<_>>());
        }
    }
    // Up to the last tick read: the workers fire on meanwhile.
    let last = all.keys().next_back().expect("ticks").to_string();
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM cron_runs WHERE cron_name = 'every-second' AND scheduled_for <= $1::timestamptz")
        .bind(last)
        .fetch_one(db.store.pool())
        .await
        .expect("runs");
    assert_eq!(runs, all.len() as i64 + 1, "one decided run per job");
}
