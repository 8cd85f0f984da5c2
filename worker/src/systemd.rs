//! systemd integration for `Type=notify` units: `READY=1` once connected, `WATCHDOG=1` at half
//! the unit's `WatchdogSec`, `STOPPING=1` when asked to stop. Every call is a no-op outside
//! systemd (no `NOTIFY_SOCKET`), so the same binary runs by hand, in containers and in tests.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

fn send(state: &[NotifyState<'_>]) {
    // `false`: keep NOTIFY_SOCKET, later notifications need it. Child processes do not
    // inherit it (the exec handler removes it from their environment).
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!(error = %e, "could not notify systemd");
    }
}

/// Startup is finished: connected and registered.
pub fn notify_ready() {
    send(&[NotifyState::Ready, NotifyState::Status("running")]);
}

/// Shutdown has begun.
pub fn notify_stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping: finishing running jobs")]);
}

/// A free-form status line for `systemctl status`.
pub fn notify_status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// How often to ping the watchdog, if the unit enabled it: half of `WATCHDOG_USEC`, as
/// sd_watchdog_enabled(3) recommends. `WATCHDOG_PID`, when set, must be this process.
pub fn watchdog_interval() -> Option<Duration> {
    watchdog_interval_from(std::env::var("WATCHDOG_USEC").ok().as_deref(), std::env::var("WATCHDOG_PID").ok().as_deref(), std::process::id())
}

fn watchdog_interval_from(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    Some(Duration::from_micros(usec / 2))
}

/// Pings the watchdog until `stop` fires. The pings come from the runtime's own task, so they
/// stop if the runtime wedges, and systemd restarts a worker that hangs.
pub async fn run_watchdog(interval: Duration, stop: CancellationToken) {
    loop {
        send(&[NotifyState::Watchdog]);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_interval_is_half_of_usec_for_this_pid() {
        assert_eq!(watchdog_interval_from(Some("10000000"), None, 7), Some(Duration::from_secs(5)));
        assert_eq!(watchdog_interval_from(Some("10000000"), Some("7"), 7), Some(Duration::from_secs(5)));
        assert_eq!(watchdog_interval_from(Some("10000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval_from(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval_from(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval_from(None, Some("7"), 7), None);
    }
}
