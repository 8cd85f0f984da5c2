//! Maintenance mode against a real Postgres: while it is on nothing is claimed, promoted or
//! fired, enqueues are kept, and turning it off lets all of it go on.

use std::time::Duration;

use rebound_queue::cron_schedule::CronSchedule;
use rebound_queue::store::{Actor, ClaimRequest, CronSpec, CronTemplate, OverlapPolicy};
use rebound_queue::testing::TestDb;
use rebound_queue::{JobState, NewJob};
use serde_json::json;

fn claim(worker: &str) -> ClaimRequest {
    ClaimRequest { worker_id: worker.into(), queues: vec!["default".into(), "cq".into()], limit: 10, visibility_timeout: Duration::from_secs(30) }
}

#[tokio::test]
async fn nothing_is_claimed_promoted_or_fired_until_it_is_turned_off() {
    let db = TestDb::new().await;
    let ops = Actor::new("ops");
    let ready = db.store.enqueue(NewJob::new("m.job", json!([1]))).await.unwrap().job;
    let mut later = NewJob::new("m.job", json!([2]));
    later.scheduled_at = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600));
    let later = db.store.enqueue(later).await.unwrap().job;
    db.store
        .register_cron(
            &CronSpec {
                name: "tick".into(),
                schedule: CronSchedule::new("* * * * *", "UTC").unwrap(),
                template: CronTemplate::from_job(&NewJob::new("cron.job", json!([])).queue("cq"), json!({"queue": "cq"})),
                overlap_policy: OverlapPolicy::Allow,
                enabled: true,
                description: None,
            },
            &ops,
        )
        .await
        .unwrap();

    assert_eq!(db.store.maintenance().await.unwrap(), None);
    let on = db.store.enable_maintenance(Some("database upgrade"), Some(Duration::from_secs(1800)), &ops).await.unwrap();
    assert_eq!((on.reason.as_deref(), on.enabled_by.as_str()), (Some("database upgrade"), "ops"));
    let minutes = on.estimated_end.expect("estimate").duration_since(on.enabled_at).as_secs();
    assert_eq!(minutes, 1800);
    // Turning it on again updates the note, not the start.
    let again = db.store.enable_maintenance(Some("still upgrading"), None, &ops).await.unwrap();
    assert_eq!((again.enabled_at, again.reason.as_deref(), again.estimated_end), (on.enabled_at, Some("still upgrading"), None));

    assert!(db.store.claim(&claim("w1")).await.unwrap().is_empty(), "nothing is handed out");
    let queued = db.store.enqueue(NewJob::new("m.job", json!([3]))).await.unwrap().job;
    assert_eq!(queued.state, JobState::Available, "enqueues are accepted");
    sqlx::query("UPDATE jobs SET scheduled_at = now() - interval '1 second' WHERE id = $1").bind(later.id).execute(db.store.pool()).await.unwrap();
    assert_eq!(db.store.promote_due(100).await.unwrap(), 0, "due jobs wait");
    sqlx::query("UPDATE cron_jobs SET next_run_at = now() - interval '1 minute'").execute(db.store.pool()).await.unwrap();
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 0, "cron ticks wait");
    assert!(db.store.claim(&claim("w1")).await.unwrap().is_empty());

    assert!(db.store.disable_maintenance(&ops).await.unwrap());
    assert!(!db.store.disable_maintenance(&ops).await.unwrap(), "already off");
    assert_eq!(db.store.maintenance().await.unwrap(), None);
    assert_eq!(db.store.promote_due(100).await.unwrap(), 1);
    assert_eq!(db.store.fire_due_crons(10).await.unwrap().fired, 1, "the missed tick fires once");
    let claimed: Vec<_> = db.store.claim(&claim("w1")).await.unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(claimed.len(), 4, "every job waiting: {claimed:?}");
    for id in [ready.id, later.id, queued.id] {
        assert!(claimed.contains(&id), "{id}");
    }
    let audit: Vec<String> = db.store.audit_log(&Default::default()).await.unwrap().into_iter().map(|e| e.action).collect();
    for action in ["system.maintenance_on", "system.maintenance_off"] {
        assert!(audit.iter().any(|a| a == action), "{action} in {audit:?}");
    }
}
