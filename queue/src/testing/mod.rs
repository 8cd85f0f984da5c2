//! Real Postgres databases for tests: a fresh database per test, copied from a migrated
//! template so creating one costs milliseconds rather than a migration run.
//!
//! Where the server comes from: `DATABASE_URL` if set (its database name is ignored), else
//! 127.0.0.1:5432 if it answers, else a private cluster started with `initdb`/`pg_ctl` in a
//! temporary directory (shared by every test process of the run; `initdb` refuses root, so it
//! runs as the `postgres` user when we are root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use crate::store::{MIGRATOR, Store};

mod cluster;
mod fault_proxy;

pub use cluster::PrivateCluster;
pub use fault_proxy::{Fault, FaultHits, FaultPoint, FaultProxy};

/// A database that exists for one test and is dropped after it.
pub struct TestDb {
    pub url: String,
    pub name: String,
    admin: PgConnectOptions,
    pub store: Store,
}

impl TestDb {
    /// Creates a fresh, migrated database.
    pub async fn new() -> TestDb {
        let admin = admin_options().await;
        let template = ensure_template(&admin).await;
        let name = format!("rebound_test_{}", uuid::Uuid::now_v7().simple());
        let mut conn = PgConnection::connect_with(&admin).await.expect("connect to test server");
        let sql = format!("CREATE DATABASE {name} TEMPLATE {template}");
        let mut tries = 0;
        loop {
            match sqlx::query(sqlx::AssertSqlSafe(sql.clone())).execute(&mut conn).await {
                Ok(_) => break,
                // Another test may be copying the same template at this instant.
                Err(e) if tries < 50 && e.to_string().contains("is being accessed by other users") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("create test database: {e}"),
            }
        }
        let opts = admin.clone().database(&name);
        let url = url_of(&opts, &name);
        let store = Store::connect(&url, 10).await.expect("connect to test database");
        TestDb { url, name, admin, store }
    }

    /// Waits (up to ten seconds, else panics) until some session of this database waits for
    /// a lock: a statement under test has reached a row another transaction holds.
    pub async fn until_a_statement_waits_for_a_lock(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
                .fetch_one(self.store.pool())
                .await
                .expect("read pg_stat_activity");
            if waiting > 0 {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "no statement came to wait for a lock");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The connection URL of the server (not of this database), e.g. for spawning processes
    /// that create databases of their own.
    pub fn server_url(&self) -> String {
        url_of(&self.admin, "postgres")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.name.clone();
        // Drop is synchronous; do the async cleanup on a thread of its own. The pool is not
        // closed first: its connections live on the test's runtime, which this thread blocks.
        // WITH (FORCE) ends them server-side instead.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                if let Ok(mut conn) = PgConnection::connect_with(&admin).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await;
                }
            });
        })
        .join();
    }
}

fn url_of(opts: &PgConnectOptions, db: &str) -> String {
    format!("postgres://{}@{}:{}/{}", opts.get_username(), opts.get_host(), opts.get_port(), db)
}

async fn answers(opts: &PgConnectOptions) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(3), PgConnection::connect_with(opts)).await,
        Ok(Ok(_))
    )
}

/// Options for the maintenance database of the server tests use.
async fn admin_options() -> PgConnectOptions {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let opts: PgConnectOptions = url.parse().expect("DATABASE_URL must be a postgres:// URL");
        return opts.database("postgres");
    }
    let local = PgConnectOptions::new().host("127.0.0.1").port(5432).username("postgres").database("postgres");
    if answers(&local).await {
        return local;
    }
    private_cluster().await
}

/// Starts (once per machine and run) a private cluster on port 55433.
async fn private_cluster() -> PgConnectOptions {
    let port = 55433;
    let opts = PgConnectOptions::new().host("127.0.0.1").port(port).username("postgres").database("postgres");
    if answers(&opts).await {
        return opts;
    }
    let dir = std::env::temp_dir().join("rebound-test-pg");
    // mkdir is atomic: exactly one test process sets the cluster up, the others wait for it.
    if std::fs::create_dir(&dir).is_ok() {
        let _ = tokio::task::spawn_blocking(move || start_cluster(&dir, port)).await;
    }
    for _ in 0..600 {
        if answers(&opts).await {
            return opts;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no Postgres: set DATABASE_URL, run one on 127.0.0.1:5432, or install initdb/pg_ctl");
}

/// A Postgres program (`initdb`, `pg_ctl`, …): from `PATH`, else the newest
/// `/usr/lib/postgresql/*/bin`, else the bare name.
pub fn pg_bin(name: &str) -> PathBuf {
    if let Ok(out) = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output() {
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !p.is_empty() {
            return PathBuf::from(p);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin").join(name))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| PathBuf::from(name))
}

fn start_cluster(dir: &Path, port: u16) {
    let data = dir.join("data").display().to_string();
    let as_postgres = is_root();
    cluster::own_for_postgres(dir);
    let initdb = [pg_bin("initdb").display().to_string(), "-D".into(), data.clone(), "-A".into(), "trust".into(), "-U".into(), "postgres".into()];
    cluster::run(&initdb, as_postgres);
    let start = [
        pg_bin("pg_ctl").display().to_string(),
        "-D".into(),
        data,
        "-o".into(),
        format!("-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", dir.display()),
        "-l".into(),
        dir.join("pg.log").display().to_string(),
        "-w".into(),
        "start".into(),
    ];
    cluster::run(&start, as_postgres);
}

/// Whether this process runs as root (`initdb` refuses root: clusters are then run as `postgres`).
pub fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

/// The migrated template for the current migrations, created once per server.
async fn ensure_template(admin: &PgConnectOptions) -> String {
    let mut hasher = Sha256::new();
    for m in MIGRATOR.iter() {
        hasher.update(m.version.to_le_bytes());
        hasher.update(&*m.checksum);
    }
    let template = format!("rebound_tpl_{}", &hex::encode(hasher.finalize())[..16]);
    let mut conn = PgConnection::connect_with(admin).await.expect("connect to test server");
    // One process builds the template; the rest wait on the lock and then find it.
    sqlx::query("SELECT pg_advisory_lock(727274)").execute(&mut conn).await.expect("lock");
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(&template)
        .fetch_one(&mut conn)
        .await
        .expect("query pg_database");
    if !exists {
        let tmp = format!("{template}_build");
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {tmp} WITH (FORCE)"))).execute(&mut conn).await;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {tmp}"))).execute(&mut conn).await.expect("create template");
        {
            let mut c = PgConnection::connect_with(&admin.clone().database(&tmp)).await.expect("connect template");
            MIGRATOR.run(&mut c).await.expect("migrate template");
            c.close().await.ok();
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("ALTER DATABASE {tmp} RENAME TO {template}")))
            .execute(&mut conn)
            .await
            .expect("rename template");
    }
    sqlx::query("SELECT pg_advisory_unlock(727274)").execute(&mut conn).await.ok();
    template
}
