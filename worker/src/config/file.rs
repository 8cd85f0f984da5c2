//! The config file as written: every key optional, unknown keys refused. Checked and turned
//! into a [`super::WorkerConfig`] by [`super::WorkerConfig::from_file`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::duration::ConfigDuration;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub database: DatabaseSection,
    #[serde(default)]
    pub worker: WorkerSection,
    /// Queue name → concurrency (jobs run at once from that queue).
    pub queues: Option<BTreeMap<String, i64>>,
    #[serde(default)]
    pub retry: RetrySection,
    #[serde(default)]
    pub maintenance: MaintenanceSection,
    #[serde(default)]
    pub prune: PruneSection,
    /// Job type (or `prefix.*`) → handler.
    pub handlers: Option<BTreeMap<String, HandlerSection>>,
    #[serde(default)]
    pub log: LogSection,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSection {
    pub url: Option<String>,
    pub max_connections: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    pub id: Option<String>,
    pub poll_interval: Option<ConfigDuration>,
    pub visibility_timeout: Option<ConfigDuration>,
    pub heartbeat_interval: Option<ConfigDuration>,
    pub job_timeout: Option<ConfigDuration>,
    pub shutdown_grace: Option<ConfigDuration>,
    pub claim_batch_max: Option<i64>,
    pub claim_gather: Option<ConfigDuration>,
    pub retry_in_place: Option<bool>,
    pub completer_batch_size: Option<i64>,
    pub completer_flush_interval: Option<ConfigDuration>,
    pub completer_flushes_in_flight: Option<i64>,
    pub completer_max_backlog: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySection {
    /// One attempt per storage operation (the loops still ride out outages).
    pub disabled: Option<bool>,
    /// complete / fail / release / heartbeat.
    #[serde(default)]
    pub storage: RetryKnobs,
    /// claims.
    #[serde(default)]
    pub claim: RetryKnobs,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryKnobs {
    pub attempts: Option<i64>,
    pub initial_backoff: Option<ConfigDuration>,
    pub max_backoff: Option<ConfigDuration>,
    pub multiplier: Option<f64>,
    pub jitter: Option<f64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceSection {
    pub enabled: Option<bool>,
    pub leader_retry: Option<ConfigDuration>,
    pub leader_check: Option<ConfigDuration>,
    pub scheduler_interval: Option<ConfigDuration>,
    pub rescuer_interval: Option<ConfigDuration>,
    pub expirer_interval: Option<ConfigDuration>,
    pub batch: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneSection {
    pub enabled: Option<bool>,
    pub interval: Option<ConfigDuration>,
    pub completed_after: Option<ConfigDuration>,
    pub discarded_after: Option<ConfigDuration>,
    pub dead_letters_after: Option<ConfigDuration>,
    pub dead_letters_per_queue: Option<i64>,
    pub workers_after: Option<ConfigDuration>,
    pub audit_after: Option<ConfigDuration>,
    pub cron_runs_after: Option<ConfigDuration>,
    pub batch: Option<i64>,
}

/// One handler. Which keys apply depends on `kind`; the others are refused by validation.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerSection {
    pub kind: Option<String>,
    /// The type's default per-attempt timeout.
    pub timeout: Option<ConfigDuration>,
    // exec
    pub command: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub working_dir: Option<PathBuf>,
    pub exit_codes: Option<BTreeMap<String, String>>,
    // http
    pub url: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub request_timeout: Option<ConfigDuration>,
    // demo
    pub behaviour: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `plain` or `json`.
    pub format: Option<String>,
}
