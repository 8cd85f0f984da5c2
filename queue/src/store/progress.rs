//! Progress reported by running jobs: kept as a log (`job_progress`), read back as the job's
//! latest report and as `job.progress` events.

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use sqlx::Row;
use uuid::Uuid;

use super::{NamedRun, Store, StoreError, ts};

/// The longest progress message kept; longer ones are refused (they are shown to operators).
pub const MAX_PROGRESS_MESSAGE: usize = 1_000;
/// The largest `data` of one report, as JSON text.
pub const MAX_PROGRESS_DATA: usize = 16 * 1024;

/// A progress report to record.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressReport {
    pub job_id: Uuid,
    /// The attempt the reporter runs; a report for another attempt (the job was rescued and
    /// claimed again meanwhile) is refused like a late result. `None`: the current one.
    pub attempt: Option<i32>,
    /// Who reports; when set it must hold the job.
    pub worker_id: Option<String>,
    /// 0 to 100.
    pub percentage: f64,
    pub message: Option<String>,
    /// Partial results or anything else the handler wants kept with the report.
    pub data: Option<Value>,
}

/// A recorded report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobProgress {
    pub job_id: Uuid,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub percentage: f64,
    pub message: Option<String>,
    pub data: Option<Value>,
    pub at: Timestamp,
}

impl ProgressReport {
    /// Checks the report's own fields, naming the one that is wrong.
    pub fn validate(&self) -> Result<(), StoreError> {
        if !self.percentage.is_finite() || !(0.0..=100.0).contains(&self.percentage) {
            return Err(StoreError::invalid("percentage", format!("must be a number from 0 to 100, got {}", self.percentage)));
        }
        if let Some(m) = &self.message {
            if m.chars().count() > MAX_PROGRESS_MESSAGE {
                return Err(StoreError::invalid("message", format!("must be at most {MAX_PROGRESS_MESSAGE} characters")));
            }
            if m.contains('\0') {
                return Err(StoreError::invalid("message", "must not contain NUL characters"));
            }
        }
        if let Some(d) = &self.data
            && d.to_string().len() > MAX_PROGRESS_DATA
        {
            return Err(StoreError::invalid("data", format!("must be at most {MAX_PROGRESS_DATA} bytes of JSON")));
        }
        Ok(())
    }
}

// Only an active job takes reports, from the attempt and holder given (when given). The job's
// row is read, never written: a report cannot slow or block the job's own result.
const REPORT: &str = "
INSERT INTO job_progress (job_id, queue, attempt, worker_id, percentage, message, data)
SELECT j.id, j.queue, j.attempt, COALESCE($3, j.locked_by), $4, $5, $6
FROM jobs j
WHERE j.id = $1 AND j.state = 'active' AND ($2::int4 IS NULL OR j.attempt = $2) AND ($3::text IS NULL OR j.locked_by = $3)
RETURNING job_id, attempt, worker_id, percentage, message, data, at";

fn progress_from_row(r: &sqlx::postgres::PgRow) -> Result<JobProgress, StoreError> {
    Ok(JobProgress {
        job_id: r.try_get("job_id")?,
        attempt: r.try_get("attempt")?,
        worker_id: r.try_get("worker_id")?,
        percentage: r.try_get("percentage")?,
        message: r.try_get("message")?,
        data: r.try_get("data")?,
        at: ts(r, "at")?,
    })
}

impl Store {
    /// Records a running job's progress. A job that is not active (or not at that attempt, or
    /// not held by that worker) is a conflict; an unknown one is not found.
    pub async fn report_progress(&self, report: &ProgressReport) -> Result<JobProgress, StoreError> {
        report.validate()?;
        let row = sqlx::query(REPORT)
            .bind(report.job_id)
            .bind(report.attempt)
            .bind(report.worker_id.as_deref())
            .bind(report.percentage)
            .bind(report.message.as_deref())
            .bind(report.data.as_ref())
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(r) => progress_from_row(&r),
            None => Err(self.refusal(report.job_id, "report progress", None, NamedRun::default()).await),
        }
    }

    /// A job's latest progress report, of any attempt; `None` if it never reported any.
    pub async fn latest_progress(&self, job_id: Uuid) -> Result<Option<JobProgress>, StoreError> {
        let row = sqlx::query(
            "SELECT job_id, attempt, worker_id, percentage, message, data, at FROM job_progress WHERE job_id = $1 ORDER BY id DESC LIMIT 1",
        )
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(progress_from_row).transpose()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::NewJob;
    use crate::store::{ClaimRequest, Completion};
    use crate::testing::TestDb;

    fn report(job_id: Uuid, percentage: f64) -> ProgressReport {
        ProgressReport { job_id, attempt: None, worker_id: None, percentage, message: None, data: None }
    }

    #[tokio::test]
    async fn only_a_running_job_reports_and_its_latest_report_is_kept() {
        let db = TestDb::new().await;
        let s = &db.store;
        let job = s.enqueue(NewJob::new("p.long", serde_json::json!([])).queue("pq")).await.unwrap().job;
        assert!(matches!(s.report_progress(&report(job.id, 10.0)).await, Err(StoreError::Conflict { .. })), "not running yet");
        assert!(matches!(s.report_progress(&report(Uuid::now_v7(), 10.0)).await, Err(StoreError::NotFound(_))));
        s.claim(&ClaimRequest { worker_id: "w1".into(), queues: vec!["pq".into()], limit: 1, visibility_timeout: Duration::from_secs(60) }).await.unwrap();
        assert_eq!(s.latest_progress(job.id).await.unwrap(), None);

        let first = ProgressReport { message: Some("a quarter".into()), data: Some(serde_json::json!({"rows": 25})), ..report(job.id, 25.0) };
        let kept = s.report_progress(&first).await.unwrap();
        assert_eq!((kept.attempt, kept.worker_id.as_deref(), kept.percentage), (1, Some("w1"), 25.0), "the holder by default");
        let later = ProgressReport { attempt: Some(1), worker_id: Some("w1".into()), ..report(job.id, 62.5) };
        s.report_progress(&later).await.unwrap();
        let latest = s.latest_progress(job.id).await.unwrap().unwrap();
        assert_eq!((latest.percentage, latest.message), (62.5, None));

        // Another attempt's or another worker's report is refused, like a late result.
        let stale = ProgressReport { attempt: Some(2), ..report(job.id, 90.0) };
        assert!(matches!(s.report_progress(&stale).await, Err(StoreError::Conflict { .. })));
        let other = ProgressReport { worker_id: Some("w2".into()), ..report(job.id, 90.0) };
        assert!(matches!(s.report_progress(&other).await, Err(StoreError::Conflict { .. })));
        // Bad fields are refused by name, before the database.
        for (bad, field) in [
            (report(job.id, 100.5), "percentage"),
            (report(job.id, f64::NAN), "percentage"),
            (ProgressReport { message: Some("x".repeat(MAX_PROGRESS_MESSAGE + 1)), ..report(job.id, 1.0) }, "message"),
            (ProgressReport { data: Some(serde_json::json!("y".repeat(MAX_PROGRESS_DATA))), ..report(job.id, 1.0) }, "data"),
        ] {
            match s.report_progress(&bad).await {
                Err(StoreError::Invalid { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert_eq!(s.latest_progress(job.id).await.unwrap().unwrap().percentage, 62.5, "nothing refused was kept");

        s.complete(&Completion { id: job.id, attempt: None, worker_id: None, started_at: None, result: None }).await.unwrap();
        assert!(matches!(s.report_progress(&report(job.id, 100.0)).await, Err(StoreError::Conflict { .. })), "finished");
        assert_eq!(s.latest_progress(job.id).await.unwrap().unwrap().percentage, 62.5, "the last report outlives the run");

        // Each report is a `job.progress` event, newest first or by cursor, by job, queue and
        // job type.
        use crate::store::{EventFilter, position_at};
        let progress = EventFilter { types: vec!["job.progress".into()], limit: 100, ..Default::default() };
        let newest = s.events(&progress).await.unwrap();
        let seen: Vec<_> = newest.iter().map(|e| (e.progress_percent, e.progress_message.as_deref(), e.attempt, e.worker_id.as_deref())).collect();
        assert_eq!(seen, vec![(Some(62.5), None, Some(1), Some("w1")), (Some(25.0), Some("a quarter"), Some(1), Some("w1"))]);
        let until = Some(Timestamp::now() + jiff::SignedDuration::from_secs(60));
        let from_start = EventFilter { after: Some(position_at(Timestamp::UNIX_EPOCH)), until, ..progress.clone() };
        let oldest: Vec<String> = s.events(&from_start).await.unwrap().into_iter().map(|e| e.id).collect();
        assert_eq!(oldest, newest.iter().rev().map(|e| e.id.clone()).collect::<Vec<_>>());
        let rest = s.events(&EventFilter { after: Some(oldest[0].clone()), ..from_start.clone() }).await.unwrap();
        assert_eq!(rest.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), [oldest[1].as_str()]);
        assert_eq!(s.events(&EventFilter { job_id: Some(job.id), ..progress.clone() }).await.unwrap().len(), 2);
        assert!(s.events(&EventFilter { job_id: Some(Uuid::now_v7()), ..progress.clone() }).await.unwrap().is_empty());
        assert_eq!(s.events(&EventFilter { queues: vec!["pq".into()], job_types: vec!["p.long".into()], ..progress.clone() }).await.unwrap().len(), 2);
        assert!(s.events(&EventFilter { queues: vec!["elsewhere".into()], ..progress.clone() }).await.unwrap().is_empty());

        // The pruner ages the reports out with the completed jobs' retention.
        sqlx::query("UPDATE job_progress SET at = at - interval '2 days'").execute(s.pool()).await.unwrap();
        assert_eq!(s.prune(&crate::store::PruneConfig::default()).await.unwrap().progress, 2);
        assert!(s.events(&progress).await.unwrap().is_empty());
    }
}
