//! Automatic replay of dead letters (ojs-dead-letter §7) against a real database: which dead
//! letters a rule replays and when, how replays are counted and bounded, what is recorded, and
//! what a database fault at the pass's commit costs.

use std::time::Duration;

use rebound_queue::outcome::{HandlerError, Outcome};
use rebound_queue::store::{Actor, AuditFilter, ClaimRequest, EventFilter, Failure, ReplayRuleSpec, StoreError};
use rebound_queue::testing::{Fault, FaultPoint, FaultProxy, TestDb};
use rebound_queue::{JobState, NewJob, Store};
use serde_json::json;
use uuid::Uuid;

fn rule(name: &str) -> ReplayRuleSpec {
    ReplayRuleSpec {
        name: name.into(),
        queue: None,
        job_type: None,
        error_type: None,
        delay: Duration::from_secs(3600),
        max_replays: 2,
        enabled: true,
    }
}

/// Claims and dead-letters `id` (it must be the next job of its queue).
async fn kill(s: &Store, id: Uuid, queue: &str, error_type: &str) {
    let req = ClaimRequest { worker_id: "w1".into(), queues: vec![queue.into()], limit: 1, visibility_timeout: Duration::from_secs(30) };
    let claimed = s.claim(&req).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), [id]);
    let outcome = Outcome::DeadLetter(HandlerError::new(error_type, "no"));
    s.fail(&Failure { id, attempt: None, worker_id: None, outcome, error_code: None }).await.unwrap();
    assert!(s.job(id).await.unwrap().dead_letter);
}

async fn dead_letter(s: &Store, queue: &str, error_type: &str) -> Uuid {
    let id = s.enqueue(NewJob::new("mail.send", json!([])).queue(queue)).await.unwrap().job.id;
    kill(s, id, queue, error_type).await;
    id
}

/// Moves every dead letter's death `age` into the past.
async fn age_dead_letters(s: &Store, age: &str) {
    sqlx::query("UPDATE jobs SET dead_lettered_at = dead_lettered_at - $1::interval WHERE dead_letter")
        .bind(age)
        .execute(s.pool())
        .await
        .unwrap();
}

async fn replay_count(s: &Store, id: Uuid) -> Option<i64> {
    s.job(id).await.unwrap().meta["ojs.replay_count"].as_i64()
}

#[tokio::test]
async fn a_rule_replays_the_dead_letters_it_matches_once_they_are_due_and_records_it() {
    let db = TestDb::new().await;
    let s = &db.store;
    let timeout = dead_letter(s, "billing", "net.timeout").await;
    let refused = dead_letter(s, "billing", "net.refused").await;
    let bad_input = dead_letter(s, "billing", "input.invalid").await;
    let elsewhere = dead_letter(s, "email", "net.timeout").await;
    let spec = ReplayRuleSpec { queue: Some("billing".into()), error_type: Some("net.*".into()), ..rule("network-blips") };
    let (stored, created) = s.put_replay_rule(&spec, &Actor::new("ops")).await.unwrap();
    assert!(created);
    assert_eq!(stored.spec, spec);

    // Not dead for an hour yet: nothing.
    let report = s.replay_due().await.unwrap();
    assert_eq!((report.replayed, report.more), (0, false));
    assert!(s.job(timeout).await.unwrap().dead_letter);

    age_dead_letters(s, "61 minutes").await;
    assert_eq!(s.replay_due().await.unwrap().replayed, 2);
    for id in [timeout, refused] {
        let job = s.job(id).await.unwrap();
        assert_eq!((job.state, job.dead_letter, job.attempt), (JobState::Available, false, 0), "re-driven with a fresh budget");
        assert_eq!(job.meta["ojs.replay_count"], 1);
        assert_eq!(job.meta["ojs.replay_rule"], "network-blips");
        let at: jiff::Timestamp = job.meta["ojs.last_replayed_at"].as_str().unwrap().parse().unwrap();
        assert!((jiff::Timestamp::now() - at).get_seconds().abs() < 60, "{at}");
        assert_eq!(s.attempts(id).await.unwrap().len(), 1, "its history is kept");
    }
    for id in [bad_input, elsewhere] {
        assert!(s.job(id).await.unwrap().dead_letter, "not matched: left dead");
    }
    let rule = s.replay_rule("network-blips").await.unwrap().unwrap();
    assert_eq!(rule.replayed_total, 2);
    assert!(rule.last_replayed_at.is_some());

    // One event per job, naming the rule; one audit entry for the pass.
    let all = EventFilter { types: vec!["dead_letter.replayed".into()], limit: 10, ..Default::default() };
    let events = s.dead_letter_events(&all).await.unwrap();
    let mut replayed: Vec<Uuid> = events.iter().filter_map(|e| e.job_id).collect();
    replayed.sort();
    let mut expected = vec![timeout, refused];
    expected.sort();
    assert_eq!(replayed, expected);
    assert!(events.iter().all(|e| e.actor.as_deref() == Some("system:replay-rule:network-blips") && e.queue == "billing"));
    let audit = s.audit_log(&AuditFilter { action: Some("dead_letter.replay".into()), limit: 10, ..Default::default() }).await.unwrap();
    let actions: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
    assert!(actions.contains(&"dead_letter.replay") && actions.contains(&"dead_letter.replay_rule.create"), "{actions:?}");

    // A pass with nothing new to look at does nothing.
    assert_eq!(s.replay_due().await.unwrap(), Default::default());
}

#[tokio::test]
async fn a_job_is_replayed_at_most_max_replays_times_and_raising_the_limit_looks_again() {
    let db = TestDb::new().await;
    let s = &db.store;
    let id = dead_letter(s, "default", "net.timeout").await;
    s.put_replay_rule(&rule("twice"), &Actor::new("ops")).await.unwrap();
    for n in 1..=2 {
        age_dead_letters(s, "2 hours").await;
        assert_eq!(s.replay_due().await.unwrap().replayed, 1, "replay {n}");
        assert_eq!(replay_count(s, id).await, Some(n));
        kill(s, id, "default", "net.timeout").await;
    }
    age_dead_letters(s, "2 hours").await;
    assert_eq!(s.replay_due().await.unwrap().replayed, 0, "two replays were its limit");
    assert!(s.job(id).await.unwrap().dead_letter);

    // A raised limit makes the rule look at every dead letter again.
    s.put_replay_rule(&ReplayRuleSpec { max_replays: 3, ..rule("twice") }, &Actor::new("ops")).await.unwrap();
    assert_eq!(s.replay_due().await.unwrap().replayed, 1);
    assert_eq!(replay_count(s, id).await, Some(3));

    // Replays by any rule count: a second rule with a limit of 3 gives it none.
    kill(s, id, "default", "net.timeout").await;
    s.put_replay_rule(&ReplayRuleSpec { enabled: false, ..rule("twice") }, &Actor::new("ops")).await.unwrap();
    s.put_replay_rule(&ReplayRuleSpec { max_replays: 3, ..rule("another") }, &Actor::new("ops")).await.unwrap();
    age_dead_letters(s, "2 hours").await;
    assert_eq!(s.replay_due().await.unwrap().replayed, 0);
}

#[tokio::test]
async fn no_rule_replays_a_job_dead_for_less_than_a_minute_and_a_disabled_rule_none() {
    let db = TestDb::new().await;
    let s = &db.store;
    let id = dead_letter(s, "default", "net.timeout").await;
    s.put_replay_rule(&ReplayRuleSpec { delay: Duration::ZERO, ..rule("at-once") }, &Actor::new("ops")).await.unwrap();
    age_dead_letters(s, "30 seconds").await;
    assert_eq!(s.replay_due().await.unwrap().replayed, 0, "a transaction may still be committing dead letters that old");
    s.put_replay_rule(&ReplayRuleSpec { delay: Duration::ZERO, enabled: false, ..rule("at-once") }, &Actor::new("ops")).await.unwrap();
    age_dead_letters(s, "1 minute").await;
    assert_eq!(s.replay_due().await.unwrap().replayed, 0, "disabled");
    s.put_replay_rule(&ReplayRuleSpec { delay: Duration::ZERO, ..rule("at-once") }, &Actor::new("ops")).await.unwrap();
    assert_eq!(s.replay_due().await.unwrap().replayed, 1, "enabled again, it reaches what died meanwhile");
    assert_eq!(replay_count(s, id).await, Some(1));
}

#[tokio::test]
async fn a_client_written_replay_count_that_is_no_number_counts_as_none() {
    let db = TestDb::new().await;
    let s = &db.store;
    let mut job = NewJob::new("mail.send", json!([]));
    job.meta = json!({"ojs.replay_count": "lots", "tenant": "acme"});
    let id = s.enqueue(job).await.unwrap().job.id;
    kill(s, id, "default", "net.timeout").await;
    let huge = dead_letter(s, "default", "net.timeout").await;
    sqlx::query("UPDATE jobs SET meta = '{\"ojs.replay_count\": 1e300}' WHERE id = $1").bind(huge).execute(s.pool()).await.unwrap();
    s.put_replay_rule(&rule("any"), &Actor::new("ops")).await.unwrap();
    age_dead_letters(s, "2 hours").await;
    assert_eq!(s.replay_due().await.unwrap().replayed, 1, "the huge count is over the limit; the pass still runs");
    let meta = s.job(id).await.unwrap().meta;
    assert_eq!((meta["ojs.replay_count"].as_i64(), meta["tenant"].as_str()), (Some(1), Some("acme")), "{meta}");
    assert!(s.job(huge).await.unwrap().dead_letter);
}

#[tokio::test]
async fn a_rule_with_a_bad_field_is_refused_naming_it_and_nothing_is_saved() {
    let db = TestDb::new().await;
    let s = &db.store;
    let cases = [
        (ReplayRuleSpec { name: "Bad Name".into(), ..rule("x") }, "name"),
        (ReplayRuleSpec { name: String::new(), ..rule("x") }, "name"),
        (ReplayRuleSpec { queue: Some("Not A Queue".into()), ..rule("x") }, "filter.queue"),
        (ReplayRuleSpec { job_type: Some(String::new()), ..rule("x") }, "filter.type"),
        (ReplayRuleSpec { error_type: Some(".*".into()), ..rule("x") }, "filter.error_type"),
        (ReplayRuleSpec { error_type: Some("x".repeat(201)), ..rule("x") }, "filter.error_type"),
        (ReplayRuleSpec { delay: Duration::from_secs(400 * 86_400), ..rule("x") }, "delay"),
        (ReplayRuleSpec { max_replays: 0, ..rule("x") }, "max_replays"),
        (ReplayRuleSpec { max_replays: 101, ..rule("x") }, "max_replays"),
    ];
    for (spec, field) in cases {
        match s.put_replay_rule(&spec, &Actor::new("ops")).await {
            Err(StoreError::Invalid { field: f, .. }) => assert_eq!(f, field, "{spec:?}"),
            other => panic!("{spec:?}: {other:?}"),
        }
    }
    assert!(s.replay_rules().await.unwrap().is_empty());
    assert!(s.audit_log(&AuditFilter { limit: 10, ..Default::default() }).await.unwrap().is_empty());
    assert!(!s.delete_replay_rule("x", &Actor::new("ops")).await.unwrap());
}

/// The pass's commit cut off before it is sent: nothing was replayed and the rule's walk did
/// not move, so the next pass replays. Its answer lost after it committed: the walk moved with
/// the replays, so the next pass does not replay them again.
#[tokio::test]
async fn a_replay_pass_cut_off_at_its_commit_replays_each_job_once() {
    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let through = Store::connect(&proxy.url(&db.name), 2).await.unwrap();
    let s = &db.store;
    let first = dead_letter(s, "default", "net.timeout").await;
    s.put_replay_rule(&rule("blips"), &Actor::new("ops")).await.unwrap();
    age_dead_letters(s, "2 hours").await;

    let dropped = proxy.inject(Fault::once("COMMIT", FaultPoint::BeforeSend));
    assert!(through.replay_due().await.is_err());
    assert_eq!(dropped.count(), 1);
    assert!(s.job(first).await.unwrap().dead_letter, "rolled back");
    assert_eq!(s.replay_rule("blips").await.unwrap().unwrap().replayed_total, 0);
    proxy.clear();
    assert_eq!(through.replay_due().await.unwrap().replayed, 1);
    assert_eq!(replay_count(s, first).await, Some(1));

    kill(s, first, "default", "net.timeout").await;
    let second = dead_letter(s, "default", "net.timeout").await;
    age_dead_letters(s, "2 hours").await;
    let lost = proxy.inject(Fault::once("COMMIT", FaultPoint::AfterCommit));
    assert!(through.replay_due().await.is_err(), "the answer was lost");
    assert_eq!(lost.count(), 1);
    proxy.clear();
    for id in [first, second] {
        assert!(!s.job(id).await.unwrap().dead_letter, "committed");
    }
    assert_eq!(through.replay_due().await.unwrap().replayed, 0, "not replayed twice");
    assert_eq!((replay_count(s, first).await, replay_count(s, second).await), (Some(2), Some(1)));
    assert_eq!(s.replay_rule("blips").await.unwrap().unwrap().replayed_total, 3);
}

/// The pruner picks its ids when its statement starts; a dead letter re-driven (by a replay
/// rule or by hand) while the pruner waits for its row is no dead letter by the time it gets
/// the row, and must not be deleted with its history.
#[tokio::test]
async fn a_dead_letter_replayed_while_the_pruner_waits_for_it_is_kept() {
    use rebound_queue::store::PruneConfig;
    let db = TestDb::new().await;
    let s = &db.store;
    let id = dead_letter(s, "default", "net.timeout").await;
    age_dead_letters(s, "400 days").await;
    s.put_replay_rule(&rule("old-ones"), &Actor::new("ops")).await.unwrap();

    // The replay pass holds the job's row (its transaction open) while the pruner comes.
    let mut replay = s.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE id = $1 FOR UPDATE").bind(id).execute(&mut *replay).await.unwrap();
    let pruner = {
        let s = s.clone();
        tokio::spawn(async move { s.prune(&PruneConfig::default()).await })
    };
    db.until_a_statement_waits_for_a_lock().await;
    sqlx::query("UPDATE jobs SET state = 'available', dead_letter = false, dead_lettered_at = NULL, error_signature = NULL, discarded_at = NULL WHERE id = $1")
        .bind(id)
        .execute(&mut *replay)
        .await
        .unwrap();
    replay.commit().await.unwrap();
    let report = pruner.await.unwrap().unwrap();
    assert_eq!(report.dead_letters, 0, "{report:?}");
    let job = s.job(id).await.unwrap();
    assert_eq!((job.state, job.dead_letter), (JobState::Available, false));
    assert_eq!(s.attempts(id).await.unwrap().len(), 1, "its history too");
}

#[tokio::test]
async fn enabling_or_disabling_a_rule_leaves_the_rest_of_it_as_it_is() {
    let db = TestDb::new().await;
    let s = &db.store;
    let spec = ReplayRuleSpec { queue: Some("billing".into()), ..rule("toggled") };
    s.put_replay_rule(&spec, &Actor::new("ops")).await.unwrap();
    let off = s.set_replay_rule_enabled("toggled", false, &Actor::new("ops")).await.unwrap();
    assert_eq!(off.spec, ReplayRuleSpec { enabled: false, ..spec.clone() });
    let on = s.set_replay_rule_enabled("toggled", true, &Actor::new("ann")).await.unwrap();
    assert_eq!(on.spec, spec);
    assert!(matches!(s.set_replay_rule_enabled("nope", true, &Actor::new("ops")).await, Err(StoreError::Missing { .. })));
    let audit = s.audit_log(&AuditFilter { action: Some("dead_letter.replay_rule.".into()), limit: 10, ..Default::default() }).await.unwrap();
    let actions: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["dead_letter.replay_rule.enable", "dead_letter.replay_rule.disable", "dead_letter.replay_rule.create"]);
}

/// An operator saving a rule while a pass holds that rule's row waits for the pass, and both
/// go through: neither is chosen as a deadlock's victim.
#[tokio::test]
async fn saving_a_rule_during_its_pass_waits_for_the_pass() {
    let db = TestDb::new().await;
    let s = &db.store;
    s.put_replay_rule(&rule("busy"), &Actor::new("ops")).await.unwrap();
    // A pass mid-flight: the rule's row locked, its cursor not yet moved.
    let mut pass = s.pool().begin().await.unwrap();
    sqlx::query("SELECT name FROM dead_letter_replay_rules WHERE name = 'busy' FOR UPDATE").execute(&mut *pass).await.unwrap();
    let save = {
        let s = s.clone();
        tokio::spawn(async move { s.put_replay_rule(&ReplayRuleSpec { max_replays: 5, ..rule("busy") }, &Actor::new("ann")).await })
    };
    db.until_a_statement_waits_for_a_lock().await;
    sqlx::query("UPDATE dead_letter_replay_rules SET replayed_total = replayed_total + 1 WHERE name = 'busy'").execute(&mut *pass).await.unwrap();
    pass.commit().await.unwrap();
    let (saved, created) = save.await.unwrap().unwrap();
    assert_eq!((saved.spec.max_replays, saved.replayed_total, created), (5, 1, false));
}
