//! `rebound-worker`: runs Rebound jobs on this host. See `rebound-worker --help`, the example
//! config `worker/worker.example.toml` and the systemd unit `worker/systemd/rebound-worker.service`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use rebound_queue::Store;
use rebound_worker::config::{ConfigError, LogFormat, Overrides, WorkerConfig, parse_duration};
use rebound_worker::handlers::demo;
use rebound_worker::outage::OutageBackoff;
use rebound_worker::{Worker, systemd};
use tokio_util::sync::CancellationToken;

// A job's life is a burst of short-lived allocations (its row, its args, its result and the
// batches they travel in); under glibc's allocator a fifth of the worker's CPU went to malloc
// and free, chunk consolidation included (perf, a 100 000-job fail-once run).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code for a configuration the worker cannot run with (what sysexits calls EX_USAGE is
/// 64; 2 is what clap and most Unix tools use for usage errors, and what the unit file's
/// `RestartPreventExitStatus` names so systemd does not restart into the same mistake).
const EXIT_CONFIG: u8 = 2;

#[derive(Parser, Debug)]
#[command(name = "rebound-worker", version, about = "Runs Rebound jobs out of Postgres")]
struct Cli {
    /// TOML config file. Without one: queue `default` (10 slots) and the demo.* handlers.
    #[arg(long, short = 'c', value_name = "PATH")]
    config: Option<PathBuf>,
    /// Postgres URL; wins over the config file.
    #[arg(long, env = "DATABASE_URL", value_name = "URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Check the config (and that a database URL is set), print a summary and exit.
    #[arg(long)]
    check_config: bool,
    /// Apply database migrations before starting.
    #[arg(long)]
    migrate: bool,
    /// Work this queue with this many slots (NAME=CONCURRENCY, repeatable); replaces [queues].
    #[arg(long = "queue", value_name = "NAME=N")]
    queues: Vec<String>,
    /// This worker's id (default: host:pid:random).
    #[arg(long)]
    worker_id: Option<String>,
    /// `plain` (default) or `json`.
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
    /// How long running jobs may take to finish on shutdown, e.g. 25s.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    shutdown_grace: Option<Duration>,
    /// Attempt each storage operation once (loops still wait out outages).
    #[arg(long)]
    disable_retry: bool,
    /// Storage-operation attempts (complete, fail, heartbeat), default 5.
    #[arg(long, value_name = "N")]
    retry_attempts: Option<i64>,
    /// First storage-retry wait, default 100ms.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    retry_initial_backoff: Option<Duration>,
    /// Longest storage-retry wait, default 5s.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    retry_max_backoff: Option<Duration>,
    /// Storage-retry jitter fraction, default 0.1.
    #[arg(long, value_name = "FRACTION")]
    retry_jitter: Option<f64>,
    /// Claim attempts, default 3.
    #[arg(long, value_name = "N")]
    claim_retry_attempts: Option<i64>,
    /// First claim-retry wait, default 500ms.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    claim_retry_initial_backoff: Option<Duration>,
    /// Longest claim-retry wait, default 10s.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    claim_retry_max_backoff: Option<Duration>,
    /// Claim-retry jitter fraction, default 0.2.
    #[arg(long, value_name = "FRACTION")]
    claim_retry_jitter: Option<f64>,
}

impl Cli {
    fn overrides(&self) -> Overrides {
        Overrides {
            database_url: self.database_url.clone().filter(|u| !u.is_empty()),
            worker_id: self.worker_id.clone(),
            log_format: self.log_format.clone(),
            queues: self.queues.clone(),
            disable_retry: self.disable_retry,
            retry_attempts: self.retry_attempts,
            retry_initial_backoff: self.retry_initial_backoff,
            retry_max_backoff: self.retry_max_backoff,
            retry_jitter: self.retry_jitter,
            claim_retry_attempts: self.claim_retry_attempts,
            claim_retry_initial_backoff: self.claim_retry_initial_backoff,
            claim_retry_max_backoff: self.claim_retry_max_backoff,
            claim_retry_jitter: self.claim_retry_jitter,
            shutdown_grace: self.shutdown_grace,
        }
    }
}

fn config_failure(e: &ConfigError) -> ExitCode {
    eprintln!("rebound-worker: invalid configuration: {e}");
    ExitCode::from(EXIT_CONFIG)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match WorkerConfig::load(cli.config.as_deref(), &cli.overrides()) {
        Ok(c) => c,
        Err(e) => return config_failure(&e),
    };
    let url = match config.require_database_url() {
        Ok(u) => u.to_string(),
        Err(e) => return config_failure(&e),
    };
    if cli.check_config {
        println!("configuration OK");
        println!("  queues: {}", config.queues.iter().map(|(q, n)| format!("{q}={n}")).collect::<Vec<_>>().join(", "));
        for h in &config.handlers {
            println!("  handler {} → {}", h.pattern, h.handler.kind());
        }
        println!("  maintenance: {}", if config.settings.maintenance.is_some() { "on (when elected)" } else { "off" });
        return ExitCode::SUCCESS;
    }
    init_logging(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rebound-worker: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(cli, config, url));
    // Tasks still waiting on an unreachable database must not hold up the exit.
    runtime.shutdown_timeout(Duration::from_millis(500));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        // journald adds its own timestamps and shows escape codes literally: plain text
        // unless a person is watching a terminal.
        LogFormat::Plain => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

async fn run(cli: Cli, config: WorkerConfig, url: String) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone())?;
    let watchdog_stop = CancellationToken::new();
    if let Some(interval) = systemd::watchdog_interval() {
        tracing::info!(interval_ms = interval.as_millis() as u64, "systemd watchdog enabled");
        tokio::spawn(systemd::run_watchdog(interval, watchdog_stop.clone()));
    }

    // Lazy: the worker starts even while the database is down and waits for it.
    let store = Store::connect_lazy(&url, config.max_connections).context("database.url: cannot use this URL")?;
    if cli.migrate && !until_done("migrate", &config, &shutdown, || store.migrate()).await {
        return Ok(());
    }
    // A worker newer than its database's schema would fail every claim: once the database
    // answers, such a worker stops (gracefully, before it has claimed much) and says why.
    let behind: Arc<OnceLock<String>> = Arc::default();
    if !cli.migrate {
        let (store, behind, shutdown) = (store.clone(), behind.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Some(message) = store.schema_behind_once_up("worker", Duration::from_secs(2), &shutdown).await {
                let _ = behind.set(message);
                shutdown.cancel();
            }
        });
    }
    let demo_types = config.demo_types();
    if !demo_types.is_empty() {
        // In the background, so a database that is still down delays neither startup nor
        // shutdown; until then the demo types simply use the default policy.
        let (store, config, shutdown) = (store.clone(), config.clone(), shutdown.clone());
        tokio::spawn(async move {
            let seeded = until_done("install demo retry policies", &config, &shutdown, || async {
                let seeded = demo::seed_policies(&store, &demo_types).await?;
                if !seeded.is_empty() {
                    tracing::info!(types = ?seeded, "installed demo retry policies");
                }
                Ok(())
            });
            seeded.await;
        });
    }

    let http_client = reqwest::Client::builder().user_agent(concat!("rebound-worker/", env!("CARGO_PKG_VERSION"))).build().context("building the HTTP client")?;
    let mut builder = Worker::builder(store).settings(config.settings.clone());
    for (queue, concurrency) in &config.queues {
        builder = builder.queue(queue.clone(), *concurrency);
    }
    for mapping in &config.handlers {
        builder = builder.handler_arc(&mapping.pattern, mapping.handler.build(&http_client), mapping.timeout);
    }
    let worker = builder.on_ready(systemd::notify_ready).build().context("configuring the worker")?;
    spawn_quiet_handler(worker.quiet_token(), shutdown.clone())?;
    {
        // However shutdown begins (a signal, or an operator's terminate heard by the
        // heartbeat), systemd hears STOPPING; a second notice is harmless.
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            systemd::notify_stopping();
        });
    }
    let report = worker.run(shutdown).await;
    watchdog_stop.cancel();
    if let Some(why) = behind.get() {
        bail!("{why}");
    }
    if report.results.unwritten > 0 {
        tracing::warn!(unwritten = report.results.unwritten, "some results were not written; those jobs will be rescued");
    }
    Ok(())
}

/// Retries a startup step through outages until it succeeds; false on shutdown.
async fn until_done<F, Fut>(what: &str, config: &WorkerConfig, shutdown: &CancellationToken, mut op: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), rebound_queue::StoreError>>,
{
    let retry = &config.settings.storage_retry;
    let mut outage = OutageBackoff::like(retry);
    loop {
        match retry.run(what, shutdown, &mut op).await {
            Ok(()) => return true,
            Err(rebound_queue::StoreError::Cancelled) => return false,
            Err(e) => {
                if !outage.wait_logged(what, &e, shutdown).await {
                    return false;
                }
            }
        }
    }
}

/// SIGTSTP: go quiet (claim nothing more; running jobs finish), as Sidekiq's TSTP does, so a
/// deploy can drain a worker before stopping it.
fn spawn_quiet_handler(quiet: CancellationToken, shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut tstp = signal(SignalKind::from_raw(libc::SIGTSTP)).context("installing the SIGTSTP handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tstp.recv() => {
                tracing::warn!(signal = "SIGTSTP", "going quiet: no more claims; running jobs finish; stop the worker when they have");
                quiet.cancel();
            }
            _ = shutdown.cancelled() => {}
        }
    });
    Ok(())
}

/// SIGTERM / SIGINT: tell systemd we are stopping and begin the graceful shutdown. A second
/// signal exits at once; unfinished jobs are then rescued after their visibility timeout.
fn spawn_signal_handler(shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stopping");
        systemd::notify_stopping();
        shutdown.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal: exiting now without waiting for running jobs");
        std::process::exit(1);
    });
    Ok(())
}
