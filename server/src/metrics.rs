//! `/metrics` in the Prometheus text format.
//!
//! Counters and the start-latency histogram count what passes through this server's API (jobs
//! completed by a `rebound-worker` talking to Postgres directly are not seen here). Queue depth
//! by state comes from the store at scrape time, so it is the same whoever did the work.
//! A small hand-rolled registry: a handful of label sets, no need for a metrics framework.
//!
//! Labels come from what clients send (job type, queue) and `/metrics` may be served without
//! credentials (`--public-metrics`, or `--api-auth none`), so
//! the label sets are bounded: past [`MAX_LABEL_SETS`] distinct (type, queue) pairs, and as
//! many queues for the latency histogram, new ones are counted under [`OTHER_LABEL`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::sync::Mutex;

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use rebound_queue::JobState;
use rebound_queue::store::{RescueReport, Stats};

use crate::AppState;

/// The job counters, each labelled by job type and queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum JobCounter {
    Enqueued,
    Completed,
    /// Every recorded failed attempt (nack without `requeue`).
    Failed,
    /// Failed attempts that were scheduled for another try.
    Retried,
    /// Jobs that ended discarded (exhausted or non-retryable, not dead-lettered).
    Discarded,
    DeadLettered,
}

impl JobCounter {
    const ALL: [JobCounter; 6] = [
        JobCounter::Enqueued,
        JobCounter::Completed,
        JobCounter::Failed,
        JobCounter::Retried,
        JobCounter::Discarded,
        JobCounter::DeadLettered,
    ];

    fn name(self) -> &'static str {
        match self {
            JobCounter::Enqueued => "rebound_jobs_enqueued_total",
            JobCounter::Completed => "rebound_jobs_completed_total",
            JobCounter::Failed => "rebound_jobs_failed_total",
            JobCounter::Retried => "rebound_jobs_retried_total",
            JobCounter::Discarded => "rebound_jobs_discarded_total",
            JobCounter::DeadLettered => "rebound_jobs_dead_lettered_total",
        }
    }

    fn help(self) -> &'static str {
        match self {
            JobCounter::Enqueued => "Jobs enqueued through this server's API.",
            JobCounter::Completed => "Jobs acknowledged as completed through this server's API.",
            JobCounter::Failed => "Failed attempts reported through this server's API.",
            JobCounter::Retried => "Failed attempts that were scheduled for a retry.",
            JobCounter::Discarded => "Jobs discarded after a failure (exhausted or non-retryable).",
            JobCounter::DeadLettered => "Jobs moved to the dead-letter queue after a failure.",
        }
    }
}

/// How many distinct (type, queue) label pairs the job counters keep, and distinct queues the
/// start-latency histogram keeps; the rest are folded into [`OTHER_LABEL`].
pub const MAX_LABEL_SETS: usize = 1_000;

/// The label value events past [`MAX_LABEL_SETS`] are counted under. No job type or queue can
/// be named so (both start with a letter or digit), so it never mixes with a real one.
pub const OTHER_LABEL: &str = "_other";

/// Upper bounds of the start-latency buckets, in seconds.
const LATENCY_BUCKETS: [f64; 16] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];

#[derive(Clone, Debug, Default)]
struct Histogram {
    /// Per bucket, not cumulative (made cumulative when rendered).
    counts: [u64; LATENCY_BUCKETS.len()],
    overflow: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
        match LATENCY_BUCKETS.iter().position(|b| v <= *b) {
            Some(i) => self.counts[i] += 1,
            None => self.overflow += 1,
        }
        self.sum += v;
    }
}

#[derive(Debug, Default)]
struct Registry {
    counters: BTreeMap<(JobCounter, String, String), u64>,
    /// The (type, queue) pairs the counters use, at most [`MAX_LABEL_SETS`].
    label_sets: BTreeSet<(String, String)>,
    latency: BTreeMap<String, Histogram>,
    rescued_stalled: u64,
    rescued_timed_out: u64,
    promoted: u64,
    expired: u64,
}

/// The server's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Registry>,
}

impl Metrics {
    fn with<T>(&self, f: impl FnOnce(&mut Registry) -> T) -> T {
        // A panic while holding the lock cannot leave a counter half-written; keep counting.
        let mut guard = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut guard)
    }

    /// Counts one job event; once [`MAX_LABEL_SETS`] (type, queue) pairs are in use, a new
    /// pair is counted as (`_other`, `_other`).
    pub fn count(&self, counter: JobCounter, job_type: &str, queue: &str) {
        self.with(|r| {
            let mut labels = (job_type.to_owned(), queue.to_owned());
            if !r.label_sets.contains(&labels) {
                if r.label_sets.len() >= MAX_LABEL_SETS {
                    labels = (OTHER_LABEL.to_owned(), OTHER_LABEL.to_owned());
                }
                r.label_sets.insert(labels.clone());
            }
            *r.counters.entry((counter, labels.0, labels.1)).or_default() += 1;
        });
    }

    /// Records how long a job waited from becoming due to being claimed; once
    /// [`MAX_LABEL_SETS`] queues are in use, a new queue is recorded as `_other`.
    pub fn observe_start_latency(&self, queue: &str, seconds: f64) {
        self.with(|r| {
            let queue = if r.latency.contains_key(queue) || r.latency.len() < MAX_LABEL_SETS { queue } else { OTHER_LABEL };
            r.latency.entry(queue.to_owned()).or_default().observe(seconds);
        });
    }

    /// Records one maintenance pass.
    pub fn maintenance(&self, promoted: u64, rescue: &RescueReport, expired: u64) {
        self.with(|r| {
            r.promoted += promoted;
            r.rescued_stalled += rescue.stalled;
            r.rescued_timed_out += rescue.timed_out;
            r.expired += expired;
        });
    }

    /// The current value of a counter (for tests and diagnostics).
    pub fn counter(&self, counter: JobCounter, job_type: &str, queue: &str) -> u64 {
        self.with(|r| r.counters.get(&(counter, job_type.to_owned(), queue.to_owned())).copied().unwrap_or(0))
    }

    /// The Prometheus text exposition; `depth` is `None` when the database could not be read.
    pub fn render(&self, depth: Option<&Stats>) -> String {
        let mut out = String::new();
        self.with(|r| {
            for counter in JobCounter::ALL {
                let help = format!("{} Past {MAX_LABEL_SETS} distinct type and queue pairs, new pairs are counted under type and queue \"{OTHER_LABEL}\".", counter.help());
                header(&mut out, counter.name(), &help, "counter");
                for ((c, job_type, queue), n) in &r.counters {
                    if *c == counter {
                        let _ = writeln!(out, "{}{{type=\"{}\",queue=\"{}\"}} {n}", counter.name(), escape(job_type), escape(queue));
                    }
                }
            }
            let name = "rebound_job_start_latency_seconds";
            let help = format!("Time from a job becoming due to a worker claiming it, for claims made through this server. Past {MAX_LABEL_SETS} distinct queues, new queues are recorded under queue \"{OTHER_LABEL}\".");
            header(&mut out, name, &help, "histogram");
            for (queue, h) in &r.latency {
                let q = escape(queue);
                let mut cumulative = 0;
                for (bound, n) in LATENCY_BUCKETS.iter().zip(h.counts) {
                    cumulative += n;
                    let _ = writeln!(out, "{name}_bucket{{queue=\"{q}\",le=\"{bound}\"}} {cumulative}");
                }
                let total = cumulative + h.overflow;
                let _ = writeln!(out, "{name}_bucket{{queue=\"{q}\",le=\"+Inf\"}} {total}");
                let _ = writeln!(out, "{name}_sum{{queue=\"{q}\"}} {}", h.sum);
                let _ = writeln!(out, "{name}_count{{queue=\"{q}\"}} {total}");
            }
            header(&mut out, "rebound_maintenance_promoted_total", "Scheduled and retryable jobs made available by this server's maintenance.", "counter");
            let _ = writeln!(out, "rebound_maintenance_promoted_total {}", r.promoted);
            header(&mut out, "rebound_maintenance_rescued_total", "Claims rescued by this server's maintenance, by reason.", "counter");
            let _ = writeln!(out, "rebound_maintenance_rescued_total{{reason=\"stalled\"}} {}", r.rescued_stalled);
            let _ = writeln!(out, "rebound_maintenance_rescued_total{{reason=\"timeout\"}} {}", r.rescued_timed_out);
            header(&mut out, "rebound_maintenance_expired_total", "Jobs discarded by this server's maintenance because their expires_at passed.", "counter");
            let _ = writeln!(out, "rebound_maintenance_expired_total {}", r.expired);
        });
        header(&mut out, "rebound_database_up", "Whether the last scrape could read the database.", "gauge");
        let _ = writeln!(out, "rebound_database_up {}", u8::from(depth.is_some()));
        if let Some(stats) = depth {
            render_depth(&mut out, stats);
        }
        out
    }
}

fn render_depth(out: &mut String, stats: &Stats) {
    let mut by_queue_state: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    let mut dead: BTreeMap<&str, i64> = BTreeMap::new();
    for row in &stats.rows {
        *by_queue_state.entry((row.queue.as_str(), row.state.as_str())).or_default() += row.count;
        if row.dead_letter {
            *dead.entry(row.queue.as_str()).or_default() += row.count;
        }
    }
    let queues: std::collections::BTreeSet<&str> = by_queue_state.keys().map(|(q, _)| *q).collect();
    header(out, "rebound_queue_jobs", "Jobs per queue and state, read from the database at scrape time.", "gauge");
    for q in &queues {
        for state in JobState::ALL {
            let n = by_queue_state.get(&(*q, state.as_str())).copied().unwrap_or(0);
            let _ = writeln!(out, "rebound_queue_jobs{{queue=\"{}\",state=\"{}\"}} {n}", escape(q), state.as_str());
        }
    }
    header(out, "rebound_queue_dead_letters", "Dead-lettered jobs per queue.", "gauge");
    for q in &queues {
        let _ = writeln!(out, "rebound_queue_dead_letters{{queue=\"{}\"}} {}", escape(q), dead.get(q).copied().unwrap_or(0));
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Escapes a label value (backslash, double quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `GET /metrics`.
pub async fn serve_metrics(State(state): State<AppState>) -> Response {
    // One read of the counts a second answers every scrape (see `health::Probes`).
    let depth = state
        .probes
        .depth
        .answer(|| async {
            match state.store.stats(None).await {
                Ok(s) => Some(std::sync::Arc::new(s)),
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: cannot read queue depth");
                    None
                }
            }
        }, None)
        .await;
    let body = state.metrics.render(depth.as_deref());
    (StatusCode::OK, [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_queue::store::StatsRow;

    #[test]
    fn renders_counters_histogram_and_depth() {
        let m = Metrics::default();
        m.count(JobCounter::Enqueued, "email.send", "default");
        m.count(JobCounter::Enqueued, "email.send", "default");
        m.count(JobCounter::Failed, "a\"b", "q");
        m.observe_start_latency("default", 0.3);
        m.observe_start_latency("default", 7200.0);
        let stats = Stats {
            rows: vec![StatsRow { queue: "default".into(), job_type: "email.send".into(), state: JobState::Discarded, dead_letter: true, count: 4 }],
        };
        let text = m.render(Some(&stats));
        assert!(text.contains("rebound_jobs_enqueued_total{type=\"email.send\",queue=\"default\"} 2"), "{text}");
        assert!(text.contains("rebound_jobs_failed_total{type=\"a\\\"b\",queue=\"q\"} 1"), "{text}");
        assert!(text.contains("rebound_job_start_latency_seconds_bucket{queue=\"default\",le=\"0.5\"} 1"), "{text}");
        assert!(text.contains("rebound_job_start_latency_seconds_bucket{queue=\"default\",le=\"3600\"} 1"), "{text}");
        assert!(text.contains("rebound_job_start_latency_seconds_count{queue=\"default\"} 2"), "{text}");
        assert!(text.contains("rebound_queue_jobs{queue=\"default\",state=\"discarded\"} 4"), "{text}");
        assert!(text.contains("rebound_queue_jobs{queue=\"default\",state=\"available\"} 0"), "{text}");
        assert!(text.contains("rebound_queue_dead_letters{queue=\"default\"} 4"), "{text}");
        assert!(text.contains("rebound_database_up 1"));
        assert!(m.render(None).contains("rebound_database_up 0"));
        assert_eq!(m.counter(JobCounter::Enqueued, "email.send", "default"), 2);
    }

    #[test]
    fn client_sent_labels_are_bounded() {
        let m = Metrics::default();
        for i in 0..MAX_LABEL_SETS + 500 {
            m.count(JobCounter::Enqueued, &format!("t{i}"), "q");
            m.observe_start_latency(&format!("q{i}"), 0.1);
        }
        // Pairs already in use keep their own labels; new ones share one.
        m.count(JobCounter::Failed, "t0", "q");
        m.count(JobCounter::Failed, "t-new", "q");
        assert_eq!(m.counter(JobCounter::Enqueued, "t999", "q"), 1);
        assert_eq!(m.counter(JobCounter::Enqueued, "t1000", "q"), 0);
        assert_eq!(m.counter(JobCounter::Enqueued, OTHER_LABEL, OTHER_LABEL), 500);
        assert_eq!(m.counter(JobCounter::Failed, "t0", "q"), 1);
        assert_eq!(m.counter(JobCounter::Failed, OTHER_LABEL, OTHER_LABEL), 1);
        let text = m.render(None);
        let series = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(series("rebound_jobs_enqueued_total{"), MAX_LABEL_SETS + 1, "{text}");
        assert_eq!(series("rebound_job_start_latency_seconds_count{"), MAX_LABEL_SETS + 1);
        assert!(text.contains("rebound_job_start_latency_seconds_count{queue=\"_other\"} 500"), "{text}");
        assert!(text.contains("# HELP rebound_jobs_enqueued_total Jobs enqueued through this server's API. Past 1000 distinct"), "{text}");
    }
}
