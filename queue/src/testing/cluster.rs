//! A Postgres cluster of a test's own, for tests that restart, stop or crash the server.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{is_root, pg_bin};

/// A cluster in a temporary directory on a free port, stopped (`-m immediate`) and deleted on
/// drop. Runs as the `postgres` user when the test runs as root (`initdb` refuses root).
pub struct PrivateCluster {
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl PrivateCluster {
    /// initdb + start. `settings` are extra `-c name=value` server settings.
    pub fn start(settings: &[&str]) -> PrivateCluster {
        let dir = std::env::temp_dir().join(format!("rebound-cluster-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).expect("create the cluster directory");
        let as_postgres = is_root();
        if as_postgres {
            let chown = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status();
            assert!(chown.is_ok_and(|s| s.success()), "chown the cluster directory");
        }
        let cluster = PrivateCluster { dir, port: free_port(), as_postgres };
        let data = cluster.data();
        let initdb = [pg_bin("initdb").display().to_string(), "-D".into(), data, "-A".into(), "trust".into(), "-U".into(), "postgres".into()];
        assert!(run(&initdb, as_postgres), "initdb failed");
        let extra: Vec<String> = settings.iter().map(|s| format!("-c {s}")).collect();
        cluster.pg_ctl_with(&extra.join(" "), &["start"]);
        cluster
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of `database` on this cluster.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Runs `pg_ctl <action…>` on the cluster (with its port and socket directory), waiting
    /// for the action to finish: `&["-m", "fast", "restart"]`, `&["-m", "immediate", "stop"]`,
    /// `&["start"]`. Panics if it fails.
    pub fn pg_ctl(&self, action: &[&str]) {
        self.pg_ctl_with("", action);
    }

    fn pg_ctl_with(&self, extra: &str, action: &[&str]) {
        let opts = format!("-p {} -k {} -c listen_addresses=127.0.0.1 {extra}", self.port, self.dir.display());
        let log = self.dir.join("pg.log").display().to_string();
        let mut args = vec![pg_bin("pg_ctl").display().to_string(), "-D".into(), self.data(), "-o".into(), opts, "-l".into(), log, "-w".into()];
        args.extend(action.iter().map(|a| a.to_string()));
        assert!(run(&args, self.as_postgres), "pg_ctl {action:?} failed (see {}/pg.log)", self.dir.display());
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let args = [pg_bin("pg_ctl").display().to_string(), "-D".into(), self.data(), "-m".into(), "immediate".into(), "-w".into(), "stop".into()];
        let _ = run(&args, self.as_postgres);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a Postgres program, as the `postgres` user if `as_postgres`; true if it succeeded.
pub(super) fn run(args: &[String], as_postgres: bool) -> bool {
    let status = if as_postgres {
        let line = args.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(" ");
        // initdb's progress report is noise in test output.
        Command::new("su").args(["postgres", "-s", "/bin/sh", "-c", &line]).stdout(Stdio::null()).status()
    } else {
        Command::new(&args[0]).args(&args[1..]).stdout(Stdio::null()).status()
    };
    status.is_ok_and(|s| s.success())
}

/// Gives a directory to the `postgres` user when we are root.
pub(super) fn own_for_postgres(dir: &Path) {
    if is_root() {
        let _ = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir).status();
    }
}
