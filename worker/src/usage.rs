//! What this process uses, for its heartbeats: resident memory, and CPU over the time since
//! the previous beat. Read from the kernel on each beat (a `getrusage` call and, on Linux,
//! `/proc/self/statm`), so it costs nothing between beats.

use std::time::{Duration, Instant};

use rebound_queue::store::ProcessUsage;

/// Turns successive readings of the process's CPU time into a percentage.
pub struct UsageMeter {
    last: Option<(Instant, Duration)>,
}

impl UsageMeter {
    /// A meter whose first reading covers the time since now.
    pub fn new() -> UsageMeter {
        UsageMeter { last: cpu_time().map(|cpu| (Instant::now(), cpu)) }
    }

    /// The usage now; CPU is the share of one core used since the previous reading.
    pub fn sample(&mut self) -> ProcessUsage {
        let now = Instant::now();
        let cpu = cpu_time();
        let cpu_percent = match (self.last, cpu) {
            (Some((then, used_then)), Some(used)) => {
                let wall = now.saturating_duration_since(then).as_secs_f64();
                (wall > 0.0).then(|| round1(used.saturating_sub(used_then).as_secs_f64() / wall * 100.0))
            }
            _ => None,
        };
        if let Some(cpu) = cpu {
            self.last = Some((now, cpu));
        }
        ProcessUsage { memory_mb: resident_mb().map(round1), cpu_percent }
    }
}

impl Default for UsageMeter {
    fn default() -> Self {
        UsageMeter::new()
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// User plus system CPU time of the whole process (every thread).
fn cpu_time() -> Option<Duration> {
    // SAFETY: getrusage only writes the struct it is given, which is plain data that zeroes
    // are a valid value of.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return None;
        }
        usage
    };
    let tv = |t: libc::timeval| -> Option<Duration> {
        Some(Duration::from_secs(u64::try_from(t.tv_sec).ok()?) + Duration::from_micros(u64::try_from(t.tv_usec).ok()?))
    };
    Some(tv(usage.ru_utime)? + tv(usage.ru_stime)?)
}

/// Resident memory now, in MiB: the second field of `/proc/self/statm`, in pages. (`getrusage`
/// has only the peak.) None where there is no procfs.
fn resident_mb() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system; it has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = u64::try_from(page).ok().filter(|p| *p > 0)?;
    Some((pages * page) as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let mut meter = UsageMeter::new();
        // Burn some CPU so the share is above zero on any machine.
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let usage = meter.sample();
        let memory = usage.memory_mb.expect("Linux has /proc/self/statm");
        assert!(memory > 1.0 && memory < 100_000.0, "resident memory {memory} MiB");
        let cpu = usage.cpu_percent.expect("getrusage works");
        // Above zero only: a starved machine can give a 50 ms busy loop little of a core.
        assert!(cpu > 0.0, "a busy loop used {cpu}% of a core");
        // The next reading covers only the time since this one.
        std::thread::sleep(Duration::from_millis(100));
        let idle = meter.sample().cpu_percent.expect("getrusage works");
        assert!(idle < cpu, "sleeping used {idle}%, the busy loop {cpu}%");
    }
}
