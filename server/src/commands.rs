//! What each subcommand does: `serve`, `migrate`, `user …`, `token …`.

use std::io::BufRead;

use anyhow::{Context, bail};
use rebound_queue::Store;
use rebound_queue::store::{Actor, Role};

use crate::config::{ApiAuth, Cli, Command, RoleArg, ServeArgs, ServerConfig, TokenCommand, UserCommand};
use crate::connections::{self, ConnectionLimits};
use crate::{AppState, auth, maintenance, passwords, router};

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let url = cli
        .database_url
        .context("no database configured: set DATABASE_URL or pass --database-url postgres://user@host/db")?;
    match cli.command {
        Command::Serve(args) => serve(&url, *args).await,
        Command::Migrate => {
            let store = Store::connect(&url, 2).await.context("connecting to the database")?;
            store.migrate().await.context("applying migrations")?;
            println!("migrations applied");
            Ok(())
        }
        Command::User(cmd) => users(&url, cmd).await,
        Command::Token(cmd) => tokens(&url, cmd).await,
    }
}

/// Who ran a CLI command, for the audit log.
fn cli_actor() -> Actor {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    Actor::new(format!("cli:{user}"))
}

/// How long a stopping server waits for the store's background work (see
/// [`Store::settle_background`]), after its requests.
const BACKGROUND_GRACE: std::time::Duration = std::time::Duration::from_secs(15);
/// Beyond the request timeout, how long a stopping server waits for its connections.
const SHUTDOWN_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

async fn serve(url: &str, args: ServeArgs) -> anyhow::Result<()> {
    let retention = args.retention().map_err(anyhow::Error::msg)?;
    // Lazy: the server starts (and answers /healthz) while the database is still coming up.
    if args.lock_timeout >= args.request_timeout {
        anyhow::bail!(
            "--lock-timeout ({:?}) must be shorter than --request-timeout ({:?}): a request waiting for a lock would be answered 408 first",
            args.lock_timeout,
            args.request_timeout
        );
    }
    let store = Store::connect_lazy_bounded(url, args.db_pool, args.lock_timeout).context("parsing the database URL")?;
    if args.migrate {
        // Unbounded: a migration over a large table may rightly take longer than a request.
        let migrating = Store::connect_lazy(url, 2).context("parsing the database URL")?;
        migrating.migrate().await.context("applying migrations (--migrate)")?;
        migrating.pool().close().await;
        tracing::info!("migrations applied");
    } else {
        // Said once the database answers (it may still be starting): a schema behind this
        // server fails pages and API calls with bare request ids. /readyz says so too.
        let store = store.clone();
        tokio::spawn(async move {
            let never = tokio_util::sync::CancellationToken::new();
            if let Some(message) = store.schema_behind_once_up("server", std::time::Duration::from_secs(2), &never).await {
                tracing::error!("{message}");
            }
        });
    }
    if args.api_auth == ApiAuth::None {
        tracing::warn!(
            listen = %args.listen,
            "API AUTHENTICATION IS OFF (--api-auth none): anyone who can reach this address can enqueue, fetch, cancel \
             and delete jobs. Use it only on loopback or for the conformance run."
        );
        if !args.listen.ip().is_loopback() {
            tracing::warn!(listen = %args.listen, "--api-auth none on a non-loopback address exposes the API to the network");
        }
    }
    if args.test_mode {
        tracing::warn!("TEST MODE: POST /ojs/v1/admin/reset wipes every job; never run this against real data");
    }
    let state = AppState::new(store.clone(), ServerConfig::from(&args));
    let shutdown = state.shutdown.clone();
    let pruning = retention.map(|retention| {
        tracing::info!(completed_after = ?retention.completed_after, "this server prunes when it leads pruning (--prune)");
        tokio::spawn(maintenance::run_pruning(store.clone(), retention, shutdown.clone()))
    });
    let maintenance = (!args.no_maintenance).then(|| {
        tokio::spawn(maintenance::run(store, state.metrics.clone(), args.maintenance_interval, shutdown.clone()))
    });
    let listener = tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(addr = %listener.local_addr().context("reading the bound address")?, "rebound-server listening");
    let stop = shutdown.clone();
    let (tasks, request_timeout, settling) = (state.request_tasks.clone(), state.config.request_timeout, state.store.clone());
    // A stopping server lets open connections finish their answers: a request still running
    // is answered 408 at its timeout, so that plus a margin bounds the wait.
    let max_open = connections::fit_to_file_limit(args.max_connections, args.db_pool);
    let limits = ConnectionLimits { max_open, header_timeout: args.header_timeout, shutdown_grace: request_timeout + SHUTDOWN_MARGIN };
    // The peer address reaches handlers (sign-in throttling counts per client address).
    connections::serve(listener, router(state), limits, async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        stop.cancel();
    })
    .await;
    // Handlers whose callers left (or were answered 408) are still finishing their work:
    // exiting under them would cut them off mid-transaction.
    tasks.drain(request_timeout).await;
    // Then the store's own: an unanswered fetch's hand-back, cut off by the exit, would leave
    // its jobs to be charged when their locks lapse.
    if !settling.settle_background(BACKGROUND_GRACE).await {
        tracing::warn!(grace_s = BACKGROUND_GRACE.as_secs(), "a hand-back of an unanswered fetch was still waiting for the database at exit; its jobs are charged when their locks lapse");
    }
    shutdown.cancel();
    for handle in [maintenance, pruning].into_iter().flatten() {
        let _ = handle.await;
    }
    Ok(())
}

/// SIGINT or SIGTERM.
async fn wait_for_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// The new operator's password: `REBOUND_PASSWORD`, else the first line of standard input
/// (never a command-line argument, which other users could read in the process list).
fn read_password() -> anyhow::Result<String> {
    if let Ok(p) = std::env::var("REBOUND_PASSWORD") {
        return Ok(p);
    }
    eprintln!("password (one line on standard input):");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("reading the password from standard input")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

async fn users(url: &str, cmd: UserCommand) -> anyhow::Result<()> {
    let store = Store::connect(url, 2).await.context("connecting to the database")?;
    match cmd {
        UserCommand::Add { username, role } => {
            let hash = passwords::hash_password(&read_password()?)?;
            let role = match role {
                RoleArg::Viewer => Role::Viewer,
                RoleArg::Operator => Role::Operator,
            };
            let op = store.upsert_operator(&username, &hash, role, &cli_actor()).await.context("saving the operator")?;
            println!("operator {} saved with role {}; any sessions they had are ended", op.username, op.role.as_str());
        }
        UserCommand::List => {
            println!("{:<32} {:<9} {:<9} last login", "username", "role", "status");
            for op in store.operators().await.context("listing operators")? {
                let status = if op.disabled { "disabled" } else { "active" };
                let last = op.last_login_at.map_or_else(|| "never".to_owned(), |t| t.to_string());
                println!("{:<32} {:<9} {:<9} {last}", op.username, op.role.as_str(), status);
            }
        }
        UserCommand::Disable { username } => {
            if !store.disable_operator(&username, &cli_actor()).await.context("disabling the operator")? {
                bail!("no operator named {username:?}");
            }
            println!("operator {username} disabled; their sessions are ended");
        }
        UserCommand::Remove { username } => {
            if !store.remove_operator(&username, &cli_actor()).await.context("removing the operator")? {
                bail!("no operator named {username:?}");
            }
            println!("operator {username} removed; their sessions are ended");
        }
    }
    Ok(())
}

async fn tokens(url: &str, cmd: TokenCommand) -> anyhow::Result<()> {
    let store = Store::connect(url, 2).await.context("connecting to the database")?;
    match cmd {
        TokenCommand::Create { name } => {
            if name.trim().is_empty() || name.chars().count() > 64 {
                bail!("a token name must be 1 to 64 characters");
            }
            let token = auth::generate_token().map_err(|e| anyhow::anyhow!("reading randomness from the OS: {e}"))?;
            store.create_token(&name, &auth::hash_token(&token), &cli_actor()).await.with_context(|| format!("creating token {name:?}"))?;
            eprintln!("token {name:?} created; it is shown only now. Send it as: Authorization: Bearer <token>");
            println!("{token}");
        }
        TokenCommand::Revoke { name } => {
            if !store.revoke_token(&name, &cli_actor()).await.context("revoking the token")? {
                bail!("no live token named {name:?}");
            }
            println!("token {name} revoked");
        }
        TokenCommand::List => {
            println!("{:<32} {:<8} {:<30} last used", "name", "status", "created");
            for t in store.tokens().await.context("listing tokens")? {
                let status = if t.revoked_at.is_some() { "revoked" } else { "live" };
                let used = t.last_used_at.map_or_else(|| "never".to_owned(), |t| t.to_string());
                println!("{:<32} {:<8} {:<30} {used}", t.name, status, t.created_at.to_string());
            }
        }
    }
    Ok(())
}
