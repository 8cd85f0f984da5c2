//! Command line and environment: the subcommands and the settings of `serve`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use rebound_queue::config_duration::parse_config_duration;
use rebound_queue::store::PruneConfig;

/// Rebound's server: the Open Job Spec HTTP API, the dashboard, metrics, and operations.
#[derive(Debug, Parser)]
#[command(name = "rebound-server", version, about)]
pub struct Cli {
    /// Postgres connection URL.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API and the dashboard.
    // Boxed: the serve settings dwarf the other subcommands'.
    Serve(Box<ServeArgs>),
    /// Apply pending database migrations, then exit.
    Migrate,
    /// Manage dashboard operators.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage API bearer tokens.
    #[command(subcommand)]
    Token(TokenCommand),
}

/// How API clients authenticate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ApiAuth {
    /// Bearer tokens created with `rebound-server token create`.
    #[default]
    Token,
    /// No authentication: only for loopback use and the conformance run.
    None,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "REBOUND_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// How API clients authenticate.
    #[arg(long, env = "REBOUND_API_AUTH", value_enum, default_value_t = ApiAuth::Token)]
    pub api_auth: ApiAuth,

    /// Enable test-only behaviour for the OJS conformance runner: `POST /ojs/v1/admin/reset`
    /// (wipes every job) and heartbeat directives from `options.metadata.test_directive`.
    /// Never use in production.
    #[arg(long)]
    pub test_mode: bool,

    /// How long a fetched job stays claimed without a heartbeat when neither the job nor the
    /// fetch sets `visibility_timeout_ms` (e.g. "300s", "5m", "PT5M").
    #[arg(long, env = "REBOUND_VISIBILITY_TIMEOUT", default_value = "300s", value_parser = parse_duration)]
    pub visibility_timeout: Duration,

    /// Apply pending migrations before serving.
    #[arg(long)]
    pub migrate: bool,

    /// Serve `/metrics` without a bearer token even when the API requires one (a scraper on a
    /// network only it reaches). Otherwise it names every job type and queue to whoever asks,
    /// so it asks for a token as the API does (Prometheus: `authorization: {credentials: …}`).
    #[arg(long, env = "REBOUND_PUBLIC_METRICS")]
    pub public_metrics: bool,

    /// Largest accepted request body, in bytes (OJS requires envelopes up to 1 MiB).
    #[arg(long, env = "REBOUND_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Most bytes of request bodies handled at once (server-wide): bodies are parsed whole, into
    /// many times their size, so past this a request waits for room (answered 503 if none comes
    /// within half the request timeout).
    #[arg(long, env = "REBOUND_MAX_BODY_BYTES_IN_FLIGHT", default_value_t = 64 * 1024 * 1024)]
    pub max_body_bytes_in_flight: usize,

    /// Requests taking longer are answered 408; their handlers still run to their end.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Most HTTP connections open at once; past it new ones wait in the listen backlog until
    /// one closes. Bounds the file descriptors and memory that clients can hold.
    /// The process's open-file limit is raised to fit (or, if it cannot be, the cap lowered).
    #[arg(long, env = "REBOUND_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_connections: usize,

    /// How long a client has to send a request's head once its connection is ready for one
    /// (just opened, or kept alive after an answer); then the connection is closed. Clients
    /// that pool connections should keep idle ones for less than this.
    #[arg(long, default_value = "30s", value_parser = parse_second_to_hour)]
    pub header_timeout: Duration,

    /// A statement of the server's that waits longer than this for a lock (a job's row that
    /// somebody else's open transaction holds, say) gives up, and its request is answered
    /// 503: it then holds its pooled connection this long at most, not until the lock goes.
    /// Between 1s and 1h, and shorter than the request timeout (or the 408 is all a client
    /// hears). Set on each connection, over any `lock_timeout` of the database or role;
    /// migrations (`--migrate`) are not bounded.
    #[arg(long, env = "REBOUND_LOCK_TIMEOUT", default_value = "5s", value_parser = parse_second_to_hour)]
    pub lock_timeout: Duration,

    /// Size of the database connection pool.
    #[arg(long, env = "REBOUND_DB_POOL", default_value_t = 20)]
    pub db_pool: u32,

    /// How often the maintenance leader promotes due jobs, rescues expired claims and expires
    /// jobs past their TTL.
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    pub maintenance_interval: Duration,

    /// Do not run maintenance in this process (a worker does it).
    #[arg(long)]
    pub no_maintenance: bool,

    /// Run retention too (the pruner), as Rebound's workers do: for a deployment with no
    /// Rebound worker (OJS clients only), which otherwise keeps finished jobs, events and the
    /// audit log for ever. One process prunes at a time, elected as maintenance is; whichever
    /// leads applies its own retention, so give this server the workers' (`[prune]` in their
    /// configuration). Ages not given keep the workers' defaults.
    #[arg(long, env = "REBOUND_PRUNE")]
    pub prune: bool,

    /// With `--prune`: how long completed jobs are kept (default "1d"; "12h", "P7D", …).
    #[arg(long, env = "REBOUND_PRUNE_COMPLETED_AFTER", value_parser = parse_config_duration, value_name = "DURATION")]
    pub prune_completed_after: Option<Duration>,

    /// With `--prune`: how long cancelled jobs and plain discards are kept (default "7d").
    #[arg(long, env = "REBOUND_PRUNE_DISCARDED_AFTER", value_parser = parse_config_duration, value_name = "DURATION")]
    pub prune_discarded_after: Option<Duration>,

    /// With `--prune`: how long dead letters are kept (default "180d").
    #[arg(long, env = "REBOUND_PRUNE_DEAD_LETTERS_AFTER", value_parser = parse_config_duration, value_name = "DURATION")]
    pub prune_dead_letters_after: Option<Duration>,

    /// With `--prune`: dead letters kept per queue, the oldest beyond it pruned (default 10000).
    #[arg(long, env = "REBOUND_PRUNE_DEAD_LETTERS_PER_QUEUE", value_name = "COUNT")]
    pub prune_dead_letters_per_queue: Option<u32>,

    /// With `--prune`: how long audit-log entries are kept (default "365d").
    #[arg(long, env = "REBOUND_PRUNE_AUDIT_AFTER", value_parser = parse_config_duration, value_name = "DURATION")]
    pub prune_audit_after: Option<Duration>,

    /// With `--prune`: how long cron runs are kept (default "30d"; each cron keeps its latest).
    #[arg(long, env = "REBOUND_PRUNE_CRON_RUNS_AFTER", value_parser = parse_config_duration, value_name = "DURATION")]
    pub prune_cron_runs_after: Option<Duration>,

    /// With `--prune`: how long a silent worker stays in the worker list (default "1d").
    #[arg(long, env = "REBOUND_PRUNE_WORKERS_AFTER", value_parser = parse_config_duration, value_name = "DURATION")]
    pub prune_workers_after: Option<Duration>,

    /// End a dashboard session unused for this long (e.g. "30m", "PT30M"): a browser left
    /// signed in, or a stolen session cookie, stops working then. Whatever its use, a session
    /// ends 12 hours after sign-in.
    #[arg(long, env = "REBOUND_SESSION_IDLE_TIMEOUT", default_value = "30m", value_parser = parse_idle_timeout)]
    pub session_idle_timeout: Duration,

    /// Always mark the session cookie `Secure` (browsers then send it over HTTPS only). Without
    /// it the cookie is `Secure` only when the request says it came over HTTPS
    /// (`X-Forwarded-Proto: https`). Set it whenever the dashboard is reached over TLS.
    #[arg(long, env = "REBOUND_SECURE_COOKIES")]
    pub secure_cookies: bool,

    /// The server runs behind a reverse proxy that appends the client's address to
    /// `X-Forwarded-For`: sign-in throttling then counts per that address (the last one in the
    /// header) instead of the proxy's.
    #[arg(long, env = "REBOUND_BEHIND_PROXY")]
    pub behind_proxy: bool,

    /// Most Server-Sent Event streams open at once (server-wide); past it a new stream is
    /// refused with 429. Each open stream polls the database, so this bounds what streams take
    /// from the pool. 0 refuses every stream.
    #[arg(long, env = "REBOUND_MAX_EVENT_STREAMS", default_value_t = 64)]
    pub max_event_streams: usize,

    /// How long one event stream stays open; then it ends and the client resumes it with
    /// `Last-Event-ID` (e.g. "15m"). Bounds how long one client holds a stream.
    #[arg(long, env = "REBOUND_EVENT_STREAM_LIFETIME", default_value = "15m", value_parser = parse_duration)]
    pub event_stream_lifetime: Duration,

    /// OJS API requests a second each caller (an API token, or with `--api-auth none` a client
    /// address) may make, on average, on this server; past its burst a request is answered 429
    /// with `Retry-After`. Every answer carries `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    /// 0 turns the limit (and the headers) off. The default stops a client stuck in a loop, not
    /// a fleet: an OJS worker makes about two requests per job (its fetches take many), and
    /// every worker sharing a token, or an address without authentication (behind a proxy,
    /// give `--behind-proxy`), shares its bucket.
    #[arg(long, env = "REBOUND_API_RATE_LIMIT", default_value_t = 5000)]
    pub api_rate_limit: u32,

    /// How many requests a caller may make at once before the rate applies (0: twice the rate).
    #[arg(long, env = "REBOUND_API_RATE_BURST", default_value_t = 0)]
    pub api_rate_burst: u32,
}

/// A dashboard role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    Viewer,
    Operator,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create an operator, or reset an existing one's password and role. The password is read
    /// from REBOUND_PASSWORD, else from the first line of standard input.
    Add {
        username: String,
        #[arg(long, value_enum, default_value_t = RoleArg::Viewer)]
        role: RoleArg,
    },
    /// List operators.
    List,
    /// Disable an operator and end their sessions.
    Disable { username: String },
    /// Remove an operator for good and end their sessions (the audit log keeps their name).
    Remove { username: String },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it once; only its hash is stored.
    Create { name: String },
    /// Revoke a token by name.
    Revoke { name: String },
    /// List tokens (never their secrets).
    List,
}

impl ServeArgs {
    /// The retention `--prune` asks for, or `None` when this server does not prune. An age
    /// given without `--prune` (on the command line or in the environment, where
    /// `REBOUND_PRUNE=false` also counts as without) would do nothing: it is refused, naming it.
    pub fn retention(&self) -> Result<Option<PruneConfig>, String> {
        if !self.prune {
            let given = [
                ("--prune-completed-after", "REBOUND_PRUNE_COMPLETED_AFTER", self.prune_completed_after.is_some()),
                ("--prune-discarded-after", "REBOUND_PRUNE_DISCARDED_AFTER", self.prune_discarded_after.is_some()),
                ("--prune-dead-letters-after", "REBOUND_PRUNE_DEAD_LETTERS_AFTER", self.prune_dead_letters_after.is_some()),
                ("--prune-dead-letters-per-queue", "REBOUND_PRUNE_DEAD_LETTERS_PER_QUEUE", self.prune_dead_letters_per_queue.is_some()),
                ("--prune-audit-after", "REBOUND_PRUNE_AUDIT_AFTER", self.prune_audit_after.is_some()),
                ("--prune-cron-runs-after", "REBOUND_PRUNE_CRON_RUNS_AFTER", self.prune_cron_runs_after.is_some()),
                ("--prune-workers-after", "REBOUND_PRUNE_WORKERS_AFTER", self.prune_workers_after.is_some()),
            ];
            return match given.iter().find(|(_, _, set)| *set) {
                Some((flag, var, _)) => Err(format!("{flag} (or {var}) is set but this server does not prune: add --prune (or REBOUND_PRUNE=true), or leave the age to the workers' configuration")),
                None => Ok(None),
            };
        }
        let d = PruneConfig::default();
        Ok(Some(PruneConfig {
            completed_after: self.prune_completed_after.unwrap_or(d.completed_after),
            discarded_after: self.prune_discarded_after.unwrap_or(d.discarded_after),
            dead_letters_after: self.prune_dead_letters_after.unwrap_or(d.dead_letters_after),
            dead_letters_per_queue: self.prune_dead_letters_per_queue.map_or(d.dead_letters_per_queue, i64::from),
            workers_after: self.prune_workers_after.unwrap_or(d.workers_after),
            audit_after: self.prune_audit_after.unwrap_or(d.audit_after),
            cron_runs_after: self.prune_cron_runs_after.unwrap_or(d.cron_runs_after),
            batch: d.batch,
        }))
    }
}

/// A duration in jiff's friendly ("300s", "5m", "1h 30m") or ISO-8601 ("PT5M") form.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration = s.parse().map_err(|e| format!("{s:?} is not a duration such as \"30s\" or \"PT30S\": {e}"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?} must not be negative"))
}

/// A session idle timeout: a duration as [`parse_duration`] reads it, longer than zero (with
/// zero every session would end at once).
fn parse_idle_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() { Err(format!("{s:?} must be longer than zero")) } else { Ok(d) }
}

/// A header or lock timeout: between 1 s (a client on a slow link must get its head through)
/// and an hour (past that it bounds nothing).
fn parse_second_to_hour(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if (Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&d) { Ok(d) } else { Err(format!("{s:?} must be between 1s and 1h")) }
}

/// The settings the running server needs (the part of [`ServeArgs`] that is not about starting).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    pub api_auth: ApiAuth,
    /// See [`ServeArgs::public_metrics`].
    pub public_metrics: bool,
    pub test_mode: bool,
    pub visibility_timeout: Duration,
    pub max_body_bytes: usize,
    /// See [`ServeArgs::max_body_bytes_in_flight`].
    pub max_body_bytes_in_flight: usize,
    pub request_timeout: Duration,
    /// See [`ServeArgs::session_idle_timeout`].
    pub session_idle_timeout: Duration,
    /// Mark the session cookie `Secure` whatever the request says.
    pub secure_cookies: bool,
    /// Take the client's address from `X-Forwarded-For` (see [`ServeArgs::behind_proxy`]).
    pub behind_proxy: bool,
    /// See [`ServeArgs::max_event_streams`].
    pub max_event_streams: usize,
    /// See [`ServeArgs::api_rate_limit`].
    pub api_rate_limit: u32,
    /// See [`ServeArgs::api_rate_burst`].
    pub api_rate_burst: u32,
    /// See [`ServeArgs::event_stream_lifetime`].
    pub event_stream_lifetime: Duration,
    /// The retention this server prunes with (`--prune`), if it prunes.
    pub retention: Option<PruneConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_auth: ApiAuth::Token,
            public_metrics: false,
            test_mode: false,
            visibility_timeout: Duration::from_secs(300),
            max_body_bytes: 4 * 1024 * 1024,
            max_body_bytes_in_flight: 64 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            session_idle_timeout: Duration::from_secs(30 * 60),
            secure_cookies: false,
            behind_proxy: false,
            max_event_streams: 64,
            api_rate_limit: 5000,
            api_rate_burst: 0,
            event_stream_lifetime: Duration::from_secs(15 * 60),
            retention: None,
        }
    }
}

impl From<&ServeArgs> for ServerConfig {
    fn from(a: &ServeArgs) -> Self {
        ServerConfig {
            api_auth: a.api_auth,
            public_metrics: a.public_metrics,
            test_mode: a.test_mode,
            visibility_timeout: a.visibility_timeout,
            max_body_bytes: a.max_body_bytes,
            max_body_bytes_in_flight: a.max_body_bytes_in_flight,
            request_timeout: a.request_timeout,
            session_idle_timeout: a.session_idle_timeout,
            secure_cookies: a.secure_cookies,
            behind_proxy: a.behind_proxy,
            max_event_streams: a.max_event_streams,
            api_rate_limit: a.api_rate_limit,
            api_rate_burst: a.api_rate_burst,
            event_stream_lifetime: a.event_stream_lifetime,
            // An invalid combination never gets this far: `serve` refuses it first.
            retention: a.retention().ok().flatten(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_in_both_forms() {
        assert_eq!(parse_duration("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("PT5M"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn serve_defaults() {
        let cli = Cli::try_parse_from(["rebound-server", "serve"]).expect("parses");
        let Command::Serve(args) = cli.command else { panic!("not serve") };
        let cfg = ServerConfig::from(&*args);
        assert_eq!(cfg.api_auth, ApiAuth::Token);
        assert_eq!(cfg.visibility_timeout, Duration::from_secs(300));
        assert!(!cfg.test_mode);
        // The command line's defaults are the in-process ones the tests start from.
        assert_eq!((cfg.max_event_streams, cfg.event_stream_lifetime), (ServerConfig::default().max_event_streams, ServerConfig::default().event_stream_lifetime));
        assert_eq!((cfg.api_rate_limit, cfg.api_rate_burst), (ServerConfig::default().api_rate_limit, ServerConfig::default().api_rate_burst));
        assert_eq!(cfg.session_idle_timeout, Duration::from_secs(30 * 60));
        assert_eq!(cfg.session_idle_timeout, ServerConfig::default().session_idle_timeout);
        let cli = Cli::try_parse_from(["rebound-server", "serve", "--api-auth", "none", "--test-mode", "--listen", "127.0.0.1:0"])
            .expect("parses");
        let Command::Serve(args) = cli.command else { panic!("not serve") };
        assert_eq!((args.api_auth, args.test_mode), (ApiAuth::None, true));
        let cli = Cli::try_parse_from(["rebound-server", "serve", "--session-idle-timeout", "PT5M"]).expect("parses");
        let Command::Serve(args) = cli.command else { panic!("not serve") };
        assert_eq!(args.session_idle_timeout, Duration::from_secs(300));
        assert!(Cli::try_parse_from(["rebound-server", "serve", "--session-idle-timeout", "0s"]).is_err(), "a zero idle timeout is refused");
        let Command::Serve(args) = Cli::try_parse_from(["rebound-server", "serve"]).expect("parses").command else { panic!("not serve") };
        assert_eq!(args.lock_timeout, Duration::from_secs(5));
        assert!(args.lock_timeout < ServerConfig::default().request_timeout, "a lock wait is answered before the request times out");
        for refused in ["0s", "500ms", "2h"] {
            assert!(Cli::try_parse_from(["rebound-server", "serve", "--lock-timeout", refused]).is_err(), "lock timeout {refused}");
        }
    }

    fn serve(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let cli = Cli::try_parse_from(["rebound-server", "serve"].iter().chain(args))?;
        let Command::Serve(args) = cli.command else { panic!("not serve") };
        Ok(*args)
    }

    #[test]
    fn retention_only_with_prune_and_the_workers_defaults_unless_given() {
        assert_eq!(serve(&[]).expect("parses").retention(), Ok(None), "the server prunes only when asked");
        assert_eq!(serve(&["--prune"]).expect("parses").retention(), Ok(Some(PruneConfig::default())));
        let given = serve(&["--prune", "--prune-completed-after", "7d", "--prune-dead-letters-per-queue", "50", "--prune-audit-after", "P30D"])
            .expect("parses")
            .retention()
            .expect("valid")
            .expect("prunes");
        let day = Duration::from_secs(24 * 3600);
        assert_eq!((given.completed_after, given.dead_letters_per_queue, given.audit_after), (7 * day, 50, 30 * day));
        assert_eq!(given.discarded_after, PruneConfig::default().discarded_after);
        // An age without --prune would silently do nothing: refused, as are ages that are no ages.
        let refused = serve(&["--prune-audit-after", "7d"]).expect("parses").retention();
        assert!(refused.as_ref().is_err_and(|e| e.contains("--prune-audit-after") && e.contains("REBOUND_PRUNE_AUDIT_AFTER")), "{refused:?}");
        for bad in ["-1d", "1 month", "soon"] {
            assert!(serve(&["--prune", "--prune-completed-after", bad]).is_err(), "{bad}");
        }
        assert!(serve(&["--prune", "--prune-dead-letters-per-queue", "-1"]).is_err());
    }
}
