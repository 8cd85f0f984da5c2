//! The audit log's action filter against a real database: a prefix taken literally, so `_`,
//! `%` and `\` in it are characters of an action, never wildcards.

use rebound_queue::store::{Actor, AuditFilter};
use rebound_queue::testing::TestDb;
use serde_json::json;

#[tokio::test]
async fn an_action_prefix_is_literal_not_a_like_pattern() {
    let db = TestDb::new().await;
    let s = &db.store;
    let actions = ["job.cancel", "queue.pause", "dead_letter.redrive", "deadxletter.redrive", "50%_off.apply", "500.apply", "a\\b.x", "ab.x"];
    for action in actions {
        s.audit(&Actor::new("alice"), action, Some("t"), json!({})).await.unwrap();
    }
    let read = |prefix: &str| {
        let filter = AuditFilter { action: Some(prefix.to_string()), ..Default::default() };
        async move {
            let mut found: Vec<String> = s.audit_log(&filter).await.unwrap().into_iter().map(|e| e.action).collect();
            found.sort();
            found
        }
    };

    // Wildcards alone match nothing: no action starts with a literal `_` or `%`. Unescaped,
    // each matched all eight.
    for wildcard in ["_", "%", "%zz", "__", "%.%"] {
        assert_eq!(read(wildcard).await, Vec::<String>::new(), "{wildcard:?}");
    }
    // `_` is an underscore: dead_letter. is not deadxletter.
    assert_eq!(read("dead_letter.").await, ["dead_letter.redrive"]);
    // `%` is a percent sign: 50% is not 500.
    assert_eq!(read("50%").await, ["50%_off.apply"]);
    assert_eq!(read("50%_").await, ["50%_off.apply"]);
    // `\` is a backslash, not an escape.
    assert_eq!(read("a\\").await, ["a\\b.x"]);
    // Plain prefixes as before.
    assert_eq!(read("job.").await, ["job.cancel"]);
    assert_eq!(read("").await.len(), actions.len(), "an empty prefix is every action");
    assert_eq!(read("5").await, ["50%_off.apply", "500.apply"]);
}
