//! How the worker is doing, for its row in `workers` (a `/readyz` operators read from the
//! dashboard): `ready`, `degraded` with what is failing, or `stopping`.
//!
//! The parts that talk to the database say when their writes start and stop failing; the
//! heartbeat reports the sum. A worker cut off from its database cannot update its row, of
//! course: the row then goes silent (and its log shows every retry); once the database is
//! back, the row says `degraded` until claims and result writes get through again.

use std::sync::Mutex;

use rebound_queue::store::WorkerStatus;

#[derive(Debug, Default)]
struct Failing {
    claims: Option<String>,
    results: Option<String>,
}

/// Shared by the claim loops, the completer and the heartbeat.
#[derive(Debug, Default)]
pub struct Health {
    failing: Mutex<Failing>,
}

impl Health {
    fn failing(&self) -> std::sync::MutexGuard<'_, Failing> {
        self.failing.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn claims_failing(&self, error: &dyn std::fmt::Display) {
        self.failing().claims = Some(error.to_string());
    }

    pub fn claims_ok(&self) {
        let mut f = self.failing();
        if f.claims.is_some() {
            f.claims = None;
        }
    }

    pub fn results_failing(&self, error: &dyn std::fmt::Display) {
        self.failing().results = Some(error.to_string());
    }

    pub fn results_ok(&self) {
        let mut f = self.failing();
        if f.results.is_some() {
            f.results = None;
        }
    }

    /// The status to report, and what is wrong if anything. Stopping and quiet say what the
    /// worker is doing on purpose and win over degraded; the detail is kept either way.
    pub fn status(&self, stopping: bool, quiet: bool, unwritten_results: usize) -> (WorkerStatus, Option<String>) {
        let f = self.failing();
        let mut problems = Vec::new();
        if let Some(e) = &f.claims {
            problems.push(format!("claims failing: {e}"));
        }
        if let Some(e) = &f.results {
            problems.push(format!("{unwritten_results} job results waiting to be written: {e}"));
        }
        let detail = (!problems.is_empty()).then(|| problems.join("; "));
        let status = if stopping {
            WorkerStatus::Stopping
        } else if quiet {
            WorkerStatus::Quiet
        } else if detail.is_some() {
            WorkerStatus::Degraded
        } else {
            WorkerStatus::Ready
        };
        (status, detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degraded_while_anything_fails_and_stopping_or_quiet_wins() {
        let h = Health::default();
        assert_eq!(h.status(false, false, 0), (WorkerStatus::Ready, None));
        assert_eq!(h.status(false, true, 0), (WorkerStatus::Quiet, None));
        h.claims_failing(&"connection refused");
        h.results_failing(&"connection refused");
        let (status, detail) = h.status(false, false, 12);
        assert_eq!(status, WorkerStatus::Degraded);
        let detail = detail.unwrap_or_default();
        assert!(detail.contains("claims failing: connection refused") && detail.contains("12 job results waiting"), "{detail}");
        h.claims_ok();
        assert_eq!(h.status(false, false, 12).0, WorkerStatus::Degraded);
        let (status, detail) = h.status(false, true, 12);
        assert_eq!(status, WorkerStatus::Quiet);
        assert!(detail.is_some_and(|d| d.contains("12 job results waiting")), "a quiet worker still says what fails");
        assert_eq!(h.status(true, true, 12).0, WorkerStatus::Stopping);
        h.results_ok();
        assert_eq!(h.status(false, false, 0), (WorkerStatus::Ready, None));
    }
}
