//! Dead letters grouped by error signature over the most recent ones only: what the dashboard's
//! dead-letter page shows on every refresh. Grouping all of them normalises every message with
//! a regular expression, which grows with the queue (100 000 dead letters is a slow page);
//! the latest few thousand say what is failing now at a bounded cost.

use sqlx::{Postgres, QueryBuilder, Row};

use super::listing::{ErrorGroup, JobFilter};
use super::{Store, StoreError, ts_opt};

/// Error groups among the latest dead letters.
#[derive(Clone, Debug, PartialEq)]
pub struct RecentErrorGroups {
    pub groups: Vec<ErrorGroup>,
    /// How many dead letters were grouped; equal to the sample size when there are more.
    pub sampled: i64,
}

impl Store {
    /// Like [`Store::dead_letter_groups`], but over the `sample` most recently dead-lettered
    /// jobs matching `filter` (newest first by the dead-letter index), `limit` groups at most.
    pub async fn recent_dead_letter_groups(&self, filter: &JobFilter, sample: i64, limit: i64) -> Result<RecentErrorGroups, StoreError> {
        let mut qb = QueryBuilder::<Postgres>::new(
            "WITH recent AS (SELECT j.last_error, j.dead_lettered_at FROM jobs j WHERE j.dead_letter",
        );
        let mut f = filter.clone();
        f.dead_letter = None;
        f.push_conditions(&mut qb);
        qb.push(" ORDER BY j.dead_lettered_at DESC, j.id DESC LIMIT ").push_bind(sample.clamp(1, 100_000));
        qb.push(
            ")
             SELECT last_error->>'type' AS error_type,
                    coalesce(last_error->>'type', '') || ': ' ||
                      regexp_replace(coalesce(last_error->>'message', ''),
                        '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9]+', '#', 'g') AS signature,
                    min(last_error->>'message') AS example_message,
                    count(*) AS n, max(dead_lettered_at) AS latest,
                    (SELECT count(*) FROM recent) AS sampled
             FROM recent GROUP BY 1, 2 ORDER BY n DESC, 2 LIMIT ",
        );
        qb.push_bind(limit.clamp(1, 200));
        let rows = qb.build().fetch_all(&self.pool).await?;
        let sampled = match rows.first() {
            Some(r) => r.try_get("sampled")?,
            None => 0,
        };
        let groups = rows
            .iter()
            .map(|r| {
                Ok(ErrorGroup {
                    error_type: r.try_get("error_type")?,
                    signature: r.try_get("signature")?,
                    example_message: r.try_get("example_message")?,
                    count: r.try_get("n")?,
                    latest: ts_opt(r, "latest")?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(RecentErrorGroups { groups, sampled })
    }
}

#[cfg(all(test, feature = "testing"))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::outcome::{HandlerError, Outcome};
    use crate::store::{ClaimRequest, Failure};
    use crate::testing::TestDb;
    use crate::{NewJob, PolicyPatch};

    async fn dead_letter(store: &Store, job_type: &str, error_type: &str, message: &str) {
        let once = PolicyPatch::from_json(&json!({"max_attempts": 1, "on_exhaustion": "dead_letter"})).unwrap();
        let job = store.enqueue(NewJob::new(job_type, json!([])).retry(once)).await.unwrap().job;
        let req = ClaimRequest { worker_id: "w".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        assert_eq!(store.claim(&req).await.unwrap().len(), 1);
        let outcome = Outcome::Retry(HandlerError::new(error_type, message));
        store.fail(&Failure { id: job.id, attempt: None, worker_id: None, outcome, error_code: None }).await.unwrap();
    }

    #[tokio::test]
    async fn groups_only_the_latest_dead_letters() {
        let db = TestDb::new().await;
        let s = &db.store;
        dead_letter(s, "a.b", "old.error", "gone since 12 days").await;
        for n in [31, 30, 29] {
            dead_letter(s, "a.b", "http.5xx", &format!("503 after {n}s")).await;
        }
        dead_letter(s, "c.d", "auth.denied", "denied").await;

        let all = s.recent_dead_letter_groups(&JobFilter::default(), 100, 10).await.unwrap();
        assert_eq!(all.sampled, 5);
        assert_eq!(all.groups[0].signature, "http.5xx: # after #s");
        assert_eq!(all.groups[0].count, 3);
        assert_eq!(all.groups.len(), 3);

        // The four latest: the oldest error drops out of the sample.
        let recent = s.recent_dead_letter_groups(&JobFilter::default(), 4, 10).await.unwrap();
        assert_eq!(recent.sampled, 4);
        assert!(recent.groups.iter().all(|g| g.error_type.as_deref() != Some("old.error")));

        let filtered = s.recent_dead_letter_groups(&JobFilter { job_type: Some("c.d".into()), ..JobFilter::default() }, 100, 10).await.unwrap();
        assert_eq!(filtered.sampled, 1);
        assert_eq!(filtered.groups[0].error_type.as_deref(), Some("auth.denied"));

        let none = s.recent_dead_letter_groups(&JobFilter { queue: Some("nothing".into()), ..JobFilter::default() }, 100, 10).await.unwrap();
        assert_eq!(none, RecentErrorGroups { groups: vec![], sampled: 0 });
    }
}
