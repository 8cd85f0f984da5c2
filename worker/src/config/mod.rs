//! The `rebound-worker` config file (TOML; see `worker/worker.example.toml`), command-line
//! overrides, and the checks that turn them into a runnable configuration. Every error names
//! the key at fault, e.g. `worker.poll_interval: "fast" is not a duration; …`.

pub mod duration;
pub mod file;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rebound_queue::job::{validate_queue, validate_type};
use rebound_queue::storage_retry::StorageRetry;

pub use duration::{ConfigDuration, parse_duration};
use file::{ConfigFile, HandlerSection, RetryKnobs};

use crate::handlers::BuiltinHandler;
use crate::handlers::demo::DemoBehaviour;
use crate::handlers::exec::{ExecConfig, ExitCodeMap};
use crate::handlers::http::HttpConfig;
use crate::settings::{DEFAULT_QUEUE_CONCURRENCY, MaintenanceSettings, PrunerSettings, RuntimeSettings};

/// A config problem, naming the key (dotted path; `""` for the file as a whole).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{}{message}", if key.is_empty() { String::new() } else { format!("{key}: ") })]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError { key: key.into(), message: message.into() }
    }
}

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (no colours unless stderr is a terminal).
    #[default]
    Plain,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    pub fn parse(s: &str) -> Option<LogFormat> {
        match s {
            "plain" => Some(LogFormat::Plain),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }
}

/// A handler mapping as configured.
#[derive(Clone, Debug)]
pub struct HandlerMapping {
    /// A job type or `prefix.*`.
    pub pattern: String,
    pub handler: BuiltinHandler,
    /// The type's default per-attempt timeout.
    pub timeout: Option<Duration>,
}

/// A checked configuration, ready to run.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// `None` until the command line, `DATABASE_URL` or the file provides one.
    pub database_url: Option<String>,
    pub max_connections: u32,
    /// `(name, concurrency)`, sorted by name.
    pub queues: Vec<(String, u32)>,
    pub handlers: Vec<HandlerMapping>,
    pub settings: RuntimeSettings,
    pub log_format: LogFormat,
}

/// Settings given on the command line (or through the environment); they win over the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub database_url: Option<String>,
    pub worker_id: Option<String>,
    pub log_format: Option<String>,
    /// `name=concurrency`, replacing the file's `[queues]` when any is given.
    pub queues: Vec<String>,
    pub disable_retry: bool,
    pub retry_attempts: Option<i64>,
    pub retry_initial_backoff: Option<Duration>,
    pub retry_max_backoff: Option<Duration>,
    pub retry_jitter: Option<f64>,
    pub claim_retry_attempts: Option<i64>,
    pub claim_retry_initial_backoff: Option<Duration>,
    pub claim_retry_max_backoff: Option<Duration>,
    pub claim_retry_jitter: Option<f64>,
    pub shutdown_grace: Option<Duration>,
}

/// The demo setup used when no config file is given (`worker/demo.toml`): queue `default`
/// with the default concurrency and the `demo.*` handlers.
pub const DEMO_CONFIG: &str = include_str!("../../demo.toml");

impl WorkerConfig {
    /// Reads and checks `path`, or the demo setup when `None`, with `overrides` applied.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<WorkerConfig, ConfigError> {
        let (text, origin) = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| ConfigError::new("", format!("cannot read config file {}: {e}", p.display())))?;
                (text, Some(p))
            }
            None => (DEMO_CONFIG.to_string(), None),
        };
        let mut file = parse(&text).map_err(|e| match origin {
            Some(p) if e.key.is_empty() => ConfigError::new("", format!("{}: {}", p.display(), e.message)),
            _ => e,
        })?;
        apply_overrides(&mut file, overrides)?;
        WorkerConfig::from_file(file)
    }

    /// Checks a parsed file.
    pub fn from_file(file: ConfigFile) -> Result<WorkerConfig, ConfigError> {
        let database_url = file.database.url.clone().filter(|u| !u.trim().is_empty());
        if let Some(url) = &database_url {
            check_database_url(url)?;
        }
        let queues = check_queues(file.queues.as_ref())?;
        let settings = check_settings(&file)?;
        let max_connections = match file.database.max_connections {
            Some(n) => positive("database.max_connections", n)?,
            None => settings.connections_needed(queues.iter().map(|(_, c)| *c)),
        };
        let handlers = check_handlers(file.handlers.as_ref())?;
        let log_format = match &file.log.format {
            None => LogFormat::Plain,
            Some(f) => LogFormat::parse(f).ok_or_else(|| ConfigError::new("log.format", format!("unknown format {f:?}; use \"plain\" or \"json\"")))?,
        };
        Ok(WorkerConfig { database_url, max_connections, queues, handlers, settings, log_format })
    }

    /// The database URL, or the error an operator needs to fix its absence.
    pub fn require_database_url(&self) -> Result<&str, ConfigError> {
        self.database_url.as_deref().ok_or_else(|| {
            ConfigError::new("database.url", "no database URL: set database.url in the config file, DATABASE_URL, or --database-url")
        })
    }

    /// The `demo.*` types configured, with their behaviour (for seeding demo policies).
    pub fn demo_types(&self) -> Vec<(String, DemoBehaviour)> {
        self.handlers
            .iter()
            .filter_map(|m| match &m.handler {
                BuiltinHandler::Demo(b) if !m.pattern.ends_with(".*") => Some((m.pattern.clone(), *b)),
                _ => None,
            })
            .collect()
    }
}

/// Parses TOML text into the file model; errors name the key.
pub fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = key_of(e.path());
        let inner = e.inner();
        let line = inner.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let message = match line {
            Some(line) => format!("{} (line {line})", inner.message()),
            None => inner.message().to_string(),
        };
        ConfigError::new(key, message)
    })
}

/// A serde path as a TOML dotted key, quoting segments that contain dots.
fn key_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = Vec::new();
    for segment in path.iter() {
        match segment {
            Segment::Map { key } => out.push(toml_key(key)),
            Segment::Seq { index } => out.push(index.to_string()),
            Segment::Enum { variant } => out.push(variant.clone()),
            Segment::Unknown => {}
        }
    }
    let key = out.join(".");
    // A top-level syntax error reports the root as "."; the file itself is at fault.
    if key == "." { String::new() } else { key }
}

/// `name` as a TOML key: bare when it can be, quoted otherwise.
fn toml_key(name: &str) -> String {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        name.to_string()
    } else {
        format!("{name:?}")
    }
}

fn apply_overrides(file: &mut ConfigFile, o: &Overrides) -> Result<(), ConfigError> {
    if let Some(url) = &o.database_url {
        file.database.url = Some(url.clone());
    }
    if let Some(id) = &o.worker_id {
        file.worker.id = Some(id.clone());
    }
    if let Some(f) = &o.log_format {
        file.log.format = Some(f.clone());
    }
    if !o.queues.is_empty() {
        let mut queues = BTreeMap::new();
        for q in &o.queues {
            let (name, n) = q.split_once('=').ok_or_else(|| ConfigError::new("--queue", format!("{q:?} is not NAME=CONCURRENCY")))?;
            let n: i64 = n.trim().parse().map_err(|_| ConfigError::new("--queue", format!("{q:?}: concurrency must be a whole number")))?;
            queues.insert(name.trim().to_string(), n);
        }
        file.queues = Some(queues);
    }
    if o.disable_retry {
        file.retry.disabled = Some(true);
    }
    let dur = |d: Option<Duration>| d.map(ConfigDuration);
    let s = &mut file.retry.storage;
    s.attempts = o.retry_attempts.or(s.attempts);
    s.initial_backoff = dur(o.retry_initial_backoff).or(s.initial_backoff);
    s.max_backoff = dur(o.retry_max_backoff).or(s.max_backoff);
    s.jitter = o.retry_jitter.or(s.jitter);
    let c = &mut file.retry.claim;
    c.attempts = o.claim_retry_attempts.or(c.attempts);
    c.initial_backoff = dur(o.claim_retry_initial_backoff).or(c.initial_backoff);
    c.max_backoff = dur(o.claim_retry_max_backoff).or(c.max_backoff);
    c.jitter = o.claim_retry_jitter.or(c.jitter);
    if let Some(g) = o.shutdown_grace {
        file.worker.shutdown_grace = Some(ConfigDuration(g));
    }
    Ok(())
}

fn check_database_url(url: &str) -> Result<(), ConfigError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(())
    } else {
        Err(ConfigError::new("database.url", "must be a postgres:// or postgresql:// URL"))
    }
}

fn positive(key: &str, n: i64) -> Result<u32, ConfigError> {
    match u32::try_from(n) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(ConfigError::new(key, format!("must be a whole number from 1 to {}, got {n}", u32::MAX))),
    }
}

fn nonzero(key: &str, d: Option<ConfigDuration>, default: Duration) -> Result<Duration, ConfigError> {
    match d {
        None => Ok(default),
        Some(ConfigDuration(d)) if d.is_zero() => Err(ConfigError::new(key, "must be longer than 0s")),
        Some(ConfigDuration(d)) => Ok(d),
    }
}

fn check_queues(queues: Option<&BTreeMap<String, i64>>) -> Result<Vec<(String, u32)>, ConfigError> {
    let Some(queues) = queues else {
        return Ok(vec![("default".to_string(), DEFAULT_QUEUE_CONCURRENCY)]);
    };
    if queues.is_empty() {
        return Err(ConfigError::new("queues", "no queues: add at least one, e.g. default = 10"));
    }
    let mut out = Vec::new();
    for (name, n) in queues {
        let key = format!("queues.{}", toml_key(name));
        validate_queue(name).map_err(|e| ConfigError::new(&key, e.reason))?;
        let n = positive(&key, *n)?;
        out.push((name.clone(), n));
    }
    Ok(out)
}

fn check_retry(key: &str, knobs: &RetryKnobs, base: StorageRetry) -> Result<StorageRetry, ConfigError> {
    let mut r = base;
    if let Some(a) = knobs.attempts {
        r.max_attempts = positive(&format!("{key}.attempts"), a)?;
    }
    r.initial_backoff = nonzero(&format!("{key}.initial_backoff"), knobs.initial_backoff, r.initial_backoff)?;
    r.max_backoff = nonzero(&format!("{key}.max_backoff"), knobs.max_backoff, r.max_backoff)?;
    if r.max_backoff < r.initial_backoff {
        return Err(ConfigError::new(format!("{key}.max_backoff"), "must not be shorter than initial_backoff"));
    }
    if let Some(m) = knobs.multiplier {
        if !(m.is_finite() && m >= 1.0) {
            return Err(ConfigError::new(format!("{key}.multiplier"), format!("must be at least 1.0, got {m}")));
        }
        r.multiplier = m;
    }
    if let Some(j) = knobs.jitter {
        if !(0.0..=1.0).contains(&j) {
            return Err(ConfigError::new(format!("{key}.jitter"), format!("must be a fraction from 0.0 to 1.0, got {j}")));
        }
        r.jitter_fraction = j;
    }
    Ok(r)
}

fn check_settings(file: &ConfigFile) -> Result<RuntimeSettings, ConfigError> {
    let d = RuntimeSettings::default();
    let w = &file.worker;
    let mut s = RuntimeSettings {
        worker_id: w.id.clone().filter(|id| !id.trim().is_empty()),
        poll_interval: nonzero("worker.poll_interval", w.poll_interval, d.poll_interval)?,
        visibility_timeout: nonzero("worker.visibility_timeout", w.visibility_timeout, d.visibility_timeout)?,
        heartbeat_interval: d.heartbeat_interval,
        job_timeout: nonzero("worker.job_timeout", w.job_timeout, d.job_timeout)?,
        shutdown_grace: w.shutdown_grace.map(|g| g.0).unwrap_or(d.shutdown_grace),
        claim_batch_max: match w.claim_batch_max {
            Some(n) => positive("worker.claim_batch_max", n)?,
            None => d.claim_batch_max,
        },
        claim_gather: w.claim_gather.map(|g| g.0).unwrap_or(d.claim_gather),
        retry_in_place: w.retry_in_place.unwrap_or(d.retry_in_place),
        in_place_write_after: d.in_place_write_after,
        completer: crate::settings::CompleterSettings {
            batch_size: match w.completer_batch_size {
                Some(n) => positive("worker.completer_batch_size", n)? as usize,
                None => d.completer.batch_size,
            },
            flush_interval: nonzero("worker.completer_flush_interval", w.completer_flush_interval, d.completer.flush_interval)?,
            flushes_in_flight: match w.completer_flushes_in_flight {
                Some(n) => positive("worker.completer_flushes_in_flight", n)? as usize,
                None => d.completer.flushes_in_flight,
            },
            max_backlog: match w.completer_max_backlog {
                Some(n) => positive("worker.completer_max_backlog", n)? as usize,
                None => d.completer.max_backlog,
            },
            ..d.completer
        },
        storage_retry: check_retry("retry.storage", &file.retry.storage, d.storage_retry)?,
        claim_retry: check_retry("retry.claim", &file.retry.claim, d.claim_retry)?,
        maintenance: None,
    };
    s.heartbeat_interval = match w.heartbeat_interval {
        Some(_) => {
            let set = nonzero("worker.heartbeat_interval", w.heartbeat_interval, d.heartbeat_interval)?;
            if set >= s.visibility_timeout {
                return Err(ConfigError::new("worker.heartbeat_interval", "must be shorter than worker.visibility_timeout (a third of it or less is safest)"));
            }
            set
        }
        // Unset, it follows the visibility timeout: two heartbeats may fail before a lock lapses.
        None => d.heartbeat_interval.min(s.visibility_timeout / 3),
    };
    if file.retry.disabled == Some(true) {
        s.disable_storage_retry();
    }
    let m = &file.maintenance;
    if m.enabled != Some(false) {
        let md = MaintenanceSettings::default();
        s.maintenance = Some(MaintenanceSettings {
            leader_retry: nonzero("maintenance.leader_retry", m.leader_retry, md.leader_retry)?,
            leader_check: nonzero("maintenance.leader_check", m.leader_check, md.leader_check)?,
            scheduler_interval: nonzero("maintenance.scheduler_interval", m.scheduler_interval, md.scheduler_interval)?,
            rescuer_interval: nonzero("maintenance.rescuer_interval", m.rescuer_interval, md.rescuer_interval)?,
            expirer_interval: nonzero("maintenance.expirer_interval", m.expirer_interval, md.expirer_interval)?,
            batch: match m.batch {
                Some(n) => i64::from(positive("maintenance.batch", n)?),
                None => md.batch,
            },
            pruner: check_prune(file)?,
        });
    }
    Ok(s)
}

fn check_prune(file: &ConfigFile) -> Result<Option<PrunerSettings>, ConfigError> {
    let p = &file.prune;
    if p.enabled == Some(false) {
        return Ok(None);
    }
    let d = PrunerSettings::default();
    let r = &d.retention;
    let age = |v: Option<ConfigDuration>, default: Duration| v.map(|x| x.0).unwrap_or(default);
    let dead_letters_per_queue = match p.dead_letters_per_queue {
        Some(n) if n < 0 => return Err(ConfigError::new("prune.dead_letters_per_queue", format!("must be 0 or more, got {n}"))),
        Some(n) => n,
        None => r.dead_letters_per_queue,
    };
    let retention = rebound_queue::store::PruneConfig {
        completed_after: age(p.completed_after, r.completed_after),
        discarded_after: age(p.discarded_after, r.discarded_after),
        dead_letters_after: age(p.dead_letters_after, r.dead_letters_after),
        dead_letters_per_queue,
        workers_after: age(p.workers_after, r.workers_after),
        audit_after: age(p.audit_after, r.audit_after),
        cron_runs_after: age(p.cron_runs_after, r.cron_runs_after),
        batch: match p.batch {
            Some(n) => i64::from(positive("prune.batch", n)?),
            None => r.batch,
        },
    };
    Ok(Some(PrunerSettings { interval: nonzero("prune.interval", p.interval, d.interval)?, retention }))
}

fn check_handlers(handlers: Option<&BTreeMap<String, HandlerSection>>) -> Result<Vec<HandlerMapping>, ConfigError> {
    let Some(handlers) = handlers.filter(|h| !h.is_empty()) else {
        return Err(ConfigError::new("handlers", "no job types are mapped to handlers; add e.g. [handlers.\"email.send\"] with kind = \"exec\""));
    };
    handlers.iter().map(|(pattern, section)| check_handler(pattern, section)).collect()
}

fn check_handler(pattern: &str, h: &HandlerSection) -> Result<HandlerMapping, ConfigError> {
    let key = format!("handlers.{pattern:?}");
    let field = |name: &str| format!("{key}.{name}");
    validate_type(pattern.strip_suffix(".*").unwrap_or(pattern))
        .map_err(|e| ConfigError::new(&key, format!("not a job type or prefix.* pattern: {}", e.reason)))?;
    let kind = h.kind.as_deref().ok_or_else(|| ConfigError::new(field("kind"), "missing; use \"exec\", \"http\" or \"demo\""))?;
    // Keys that belong to another kind are mistakes worth reporting, not ignoring.
    let present: [(&str, bool, &str); 8] = [
        ("command", h.command.is_some(), "exec"),
        ("env", h.env.is_some(), "exec"),
        ("working_dir", h.working_dir.is_some(), "exec"),
        ("exit_codes", h.exit_codes.is_some(), "exec"),
        ("url", h.url.is_some(), "http"),
        ("headers", h.headers.is_some(), "http"),
        ("request_timeout", h.request_timeout.is_some(), "http"),
        ("behaviour", h.behaviour.is_some(), "demo"),
    ];
    for (name, set, owner) in present {
        if set && owner != kind {
            return Err(ConfigError::new(field(name), format!("only applies to kind = \"{owner}\", not \"{kind}\"")));
        }
    }
    let handler = match kind {
        "exec" => {
            let command = h.command.clone().unwrap_or_default();
            if command.first().is_none_or(|p| p.trim().is_empty()) {
                return Err(ConfigError::new(field("command"), "required: the program and its arguments, e.g. [\"/usr/local/bin/send-email\", \"--json\"]"));
            }
            let exit_codes = match &h.exit_codes {
                Some(entries) => ExitCodeMap::with_overrides(entries).map_err(|(code, reason)| ConfigError::new(format!("{}.{code:?}", field("exit_codes")), reason))?,
                None => ExitCodeMap::default(),
            };
            BuiltinHandler::Exec(ExecConfig { command, env: h.env.clone().unwrap_or_default(), working_dir: h.working_dir.clone(), exit_codes })
        }
        "http" => {
            let url = h.url.as_deref().ok_or_else(|| ConfigError::new(field("url"), "required: where to POST the job"))?;
            let parsed: reqwest::Url = url.parse().map_err(|e| ConfigError::new(field("url"), format!("{url:?} is not a URL: {e}")))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(ConfigError::new(field("url"), "must be an http:// or https:// URL"));
            }
            let mut config = HttpConfig::new(parsed);
            for (name, value) in h.headers.iter().flatten() {
                config.add_header(name, value).map_err(|reason| ConfigError::new(format!("{}.{name:?}", field("headers")), reason))?;
            }
            config.request_timeout = nonzero(&field("request_timeout"), h.request_timeout, config.request_timeout)?;
            BuiltinHandler::Http(config)
        }
        "demo" => {
            let behaviour = match &h.behaviour {
                Some(b) => DemoBehaviour::parse(b).ok_or_else(|| ConfigError::new(field("behaviour"), format!("unknown behaviour {b:?}; use {}", DemoBehaviour::NAMES)))?,
                None => DemoBehaviour::for_type(pattern).ok_or_else(|| {
                    ConfigError::new(field("behaviour"), format!("required: the type's last segment is not a demo behaviour; use {}", DemoBehaviour::NAMES))
                })?,
            };
            BuiltinHandler::Demo(behaviour)
        }
        other => return Err(ConfigError::new(field("kind"), format!("unknown kind {other:?}; use \"exec\", \"http\" or \"demo\""))),
    };
    let timeout = match h.timeout {
        Some(ConfigDuration(d)) if d.is_zero() => return Err(ConfigError::new(field("timeout"), "must be longer than 0s")),
        other => other.map(|d| d.0),
    };
    Ok(HandlerMapping { pattern: pattern.to_string(), handler, timeout })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        match parse(text).and_then(WorkerConfig::from_file) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e,
        }
    }

    const HANDLERS: &str = "[handlers.\"demo.succeed\"]\nkind = \"demo\"\n";

    #[test]
    fn the_demo_config_and_the_example_file_are_valid() {
        let demo = WorkerConfig::load(None, &Overrides::default()).unwrap();
        assert_eq!(demo.queues, vec![("default".to_string(), DEFAULT_QUEUE_CONCURRENCY)]);
        assert_eq!(demo.handlers.len(), 4);
        assert_eq!(demo.demo_types().len(), 4);
        // Silence in the file means the runtime defaults.
        assert_eq!(demo.settings, RuntimeSettings::default());
        assert!(demo.database_url.is_none());
        assert_eq!(demo.require_database_url().unwrap_err().key, "database.url");

        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/worker.example.toml");
        let c = WorkerConfig::load(Some(Path::new(example)), &Overrides::default()).unwrap();
        assert!(c.handlers.iter().any(|h| h.handler.kind() == "exec"));
        assert!(c.handlers.iter().any(|h| h.handler.kind() == "http"));
        assert_eq!(c.settings.shutdown_grace, Duration::from_secs(25));
        // The example documents the defaults of the throughput knobs.
        assert_eq!(c.queues, vec![("default".to_string(), DEFAULT_QUEUE_CONCURRENCY)]);
        assert_eq!(c.settings.claim_batch_max, RuntimeSettings::default().claim_batch_max);
        assert_eq!(c.settings.completer, RuntimeSettings::default().completer);
        assert_eq!(c.max_connections, RuntimeSettings::default().connections_needed([DEFAULT_QUEUE_CONCURRENCY]));
    }

    #[test]
    fn the_heartbeat_interval_follows_a_short_visibility_timeout_unless_set() {
        let load = |toml: &str| {
            let scratch = std::env::temp_dir().join(format!("rebound-config-{}.toml", uuid::Uuid::now_v7().simple()));
            let handlers = "[database]\nurl = \"postgres://x@127.0.0.1/x\"\n[handlers.\"x.y\"]\nkind = \"demo\"\nbehaviour = \"succeed\"\n";
            std::fs::write(&scratch, format!("{toml}{handlers}")).unwrap();
            let c = WorkerConfig::load(Some(&scratch), &Overrides::default());
            let _ = std::fs::remove_file(&scratch);
            c
        };
        let c = load("[worker]\nvisibility_timeout = \"5s\"\n").unwrap();
        assert_eq!(c.settings.heartbeat_interval, Duration::from_secs(5) / 3);
        let c = load("[worker]\nvisibility_timeout = \"2m\"\n").unwrap();
        assert_eq!(c.settings.heartbeat_interval, RuntimeSettings::default().heartbeat_interval);
        let c = load("[worker]\nvisibility_timeout = \"5s\"\nheartbeat_interval = \"4s\"\n").unwrap();
        assert_eq!(c.settings.heartbeat_interval, Duration::from_secs(4));
    }

    #[test]
    fn errors_name_the_key() {
        let cases: &[(&str, &str)] = &[
            ("[worker]\npoll_interval = \"fast\"\n", "worker.poll_interval"),
            ("[worker]\npoll_interval = 5\n", "worker.poll_interval"),
            ("[worker]\npoll_interval = \"0s\"\n", "worker.poll_interval"),
            ("[worker]\npol_interval = \"1s\"\n", "worker.pol_interval"),
            ("[worker]\nheartbeat_interval = \"1m\"\nvisibility_timeout = \"30s\"\n", "worker.heartbeat_interval"),
            ("[queues]\ndefault = 0\n", "queues.default"),
            ("[queues]\n\"Bad Queue\" = 3\n", "queues.\"Bad Queue\""),
            ("[queues]\n", "queues"),
            ("[database]\nurl = \"mysql://x\"\n", "database.url"),
            ("[database]\nmax_connections = -1\n", "database.max_connections"),
            ("[retry.storage]\njitter = 1.5\n", "retry.storage.jitter"),
            ("[retry.claim]\nattempts = 0\n", "retry.claim.attempts"),
            ("[retry.storage]\ninitial_backoff = \"10s\"\nmax_backoff = \"1s\"\n", "retry.storage.max_backoff"),
            ("[prune]\ndead_letters_per_queue = -3\n", "prune.dead_letters_per_queue"),
            ("[log]\nformat = \"xml\"\n", "log.format"),
            ("[handlers.\"email.send\"]\nkind = \"exec\"\n", "handlers.\"email.send\".command"),
            ("[handlers.\"email.send\"]\nkind = \"smtp\"\n", "handlers.\"email.send\".kind"),
            ("[handlers.\"email.send\"]\ncommand = [\"x\"]\n", "handlers.\"email.send\".kind"),
            ("[handlers.\"email.send\"]\nkind = \"exec\"\ncommand = [\"x\"]\nurl = \"http://a\"\n", "handlers.\"email.send\".url"),
            ("[handlers.\"email.send\"]\nkind = \"exec\"\ncommand = [\"x\"]\nexit_codes = { \"75\" = \"maybe\" }\n", "handlers.\"email.send\".exit_codes.\"75\""),
            ("[handlers.\"hook.post\"]\nkind = \"http\"\nurl = \"ftp://a\"\n", "handlers.\"hook.post\".url"),
            ("[handlers.\"hook.post\"]\nkind = \"http\"\nurl = \"http://a\"\nheaders = { \"bad header\" = \"x\" }\n", "handlers.\"hook.post\".headers.\"bad header\""),
            ("[handlers.\"demo.wobble\"]\nkind = \"demo\"\n", "handlers.\"demo.wobble\".behaviour"),
            ("[handlers.\"Email\"]\nkind = \"demo\"\nbehaviour = \"succeed\"\n", "handlers.\"Email\""),
            ("[handlers.\"email.send\"]\nkind = \"exec\"\ncommand = [\"x\"]\ntimeout = \"0s\"\n", "handlers.\"email.send\".timeout"),
            ("[handlers]\n", "handlers"),
        ];
        for (text, key) in cases {
            let full = if text.contains("[handlers") { text.to_string() } else { format!("{text}{HANDLERS}") };
            let e = err(&full);
            assert_eq!(e.key, *key, "for:\n{full}\ngot: {e}");
            assert!(e.to_string().starts_with(&format!("{key}: ")), "{e}");
        }
    }

    #[test]
    fn syntax_errors_give_the_line() {
        let e = err("[worker]\npoll_interval = \n");
        assert!(e.message.contains("line 2"), "{e}");
    }

    #[test]
    fn overrides_win_and_are_checked() {
        let o = Overrides {
            database_url: Some("postgres://cli@localhost/db".into()),
            queues: vec!["critical=3".into(), "default=7".into()],
            retry_attempts: Some(9),
            claim_retry_jitter: Some(0.5),
            shutdown_grace: Some(Duration::from_secs(3)),
            ..Overrides::default()
        };
        let c = WorkerConfig::load(None, &o).unwrap();
        assert_eq!(c.database_url.as_deref(), Some("postgres://cli@localhost/db"));
        assert_eq!(c.queues, vec![("critical".to_string(), 3), ("default".to_string(), 7)]);
        assert_eq!(c.settings.storage_retry.max_attempts, 9);
        assert_eq!(c.settings.claim_retry.jitter_fraction, 0.5);
        assert_eq!(c.settings.shutdown_grace, Duration::from_secs(3));
        // Sized for what two queues' claim loops and the completer's writes use at once.
        assert_eq!(c.max_connections, RuntimeSettings::default().connections_needed([3, 7]));
        assert!(c.max_connections > 2 + c.settings.completer.flushes_in_flight as u32);

        let disabled = WorkerConfig::load(None, &Overrides { disable_retry: true, ..Overrides::default() }).unwrap();
        assert_eq!(disabled.settings.storage_retry.max_attempts, 1);
        assert_eq!(disabled.settings.claim_retry.max_attempts, 1);

        let bad = WorkerConfig::load(None, &Overrides { queues: vec!["default".into()], ..Overrides::default() }).unwrap_err();
        assert_eq!(bad.key, "--queue");
        let bad = WorkerConfig::load(None, &Overrides { retry_jitter: Some(-1.0), ..Overrides::default() }).unwrap_err();
        assert_eq!(bad.key, "retry.storage.jitter");
    }

    #[test]
    fn handler_mappings() {
        let text = r#"
[handlers."email.send"]
kind = "exec"
command = ["/bin/echo", "hi"]
timeout = "45s"
exit_codes = { "3" = "dead_letter" }
[handlers."reports.*"]
kind = "demo"
behaviour = "slow"
[handlers."hook.post"]
kind = "http"
url = "https://hooks.example.com/x"
headers = { Authorization = "Bearer t" }
request_timeout = "5s"
"#;
        let c = WorkerConfig::from_file(parse(text).unwrap()).unwrap();
        let email = c.handlers.iter().find(|h| h.pattern == "email.send").unwrap();
        assert_eq!(email.timeout, Some(Duration::from_secs(45)));
        match &email.handler {
            BuiltinHandler::Exec(e) => assert!(matches!(e.exit_codes.action_for(3), crate::handlers::exec::ExitAction::DeadLetter)),
            other => panic!("{other:?}"),
        }
        let hook = c.handlers.iter().find(|h| h.pattern == "hook.post").unwrap();
        match &hook.handler {
            BuiltinHandler::Http(h) => {
                assert_eq!(h.request_timeout, Duration::from_secs(5));
                assert_eq!(h.headers.get("authorization").unwrap(), "Bearer t");
            }
            other => panic!("{other:?}"),
        }
        // prefix patterns are not seeded with demo policies
        assert!(c.demo_types().is_empty());
    }
}
