//! Who this worker is: the id it claims jobs under, and what it registers about itself.

/// This machine's host name, or `"unknown"`.
pub fn host_name() -> String {
    // /proc is always there on Linux and saves a dependency for one syscall.
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_string())
}

/// A fresh worker id: `host:pid:suffix`. The random suffix keeps ids unique when a pid is
/// reused on the same host (containers restarting as pid 1, say).
pub fn new_worker_id() -> String {
    let suffix = &uuid::Uuid::now_v7().simple().to_string()[24..];
    format!("{}:{}:{}", host_name(), std::process::id(), suffix)
}

/// The version reported in the workers table.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_the_host_and_pid_and_differ() {
        let (a, b) = (new_worker_id(), new_worker_id());
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("{}:{}:", host_name(), std::process::id())), "{a}");
    }
}
