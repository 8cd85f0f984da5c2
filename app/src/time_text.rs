//! How durations and instants are written on the pages: short, exact enough to act on, and
//! always in UTC so two operators on a call read the same time.

use serde::{Deserialize, Serialize};

/// A duration in milliseconds as people read it: `850ms`, `1.5s`, `2m 30s`, `1h 05m`, `3d 4h`.
pub fn duration_text(ms: u64) -> String {
    const S: u64 = 1_000;
    const M: u64 = 60 * S;
    const H: u64 = 60 * M;
    const D: u64 = 24 * H;
    match ms {
        0..S => format!("{ms}ms"),
        S..M if ms.is_multiple_of(S) => format!("{}s", ms / S),
        S..M => format!("{:.1}s", ms as f64 / S as f64),
        M..H if (ms % M) / S == 0 => format!("{}m", ms / M),
        M..H => format!("{}m {}s", ms / M, (ms % M) / S),
        H..D if (ms % H) / M == 0 => format!("{}h", ms / H),
        H..D => format!("{}h {:02}m", ms / H, (ms % H) / M),
        _ if ms >= 10_000 * D => format!("{} years", ms / (365 * D)),
        _ if (ms % D) / H == 0 => format!("{}d", ms / D),
        _ => format!("{}d {}h", ms / D, (ms % D) / H),
    }
}

/// An instant: absolute (UTC, to the second) and relative to when the page was rendered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct When {
    /// `2026-11-22 14:09:03`
    pub at: String,
    /// `in 3m 2s`, `5m ago`, `now`
    pub relative: String,
}

#[cfg(feature = "ssr")]
impl When {
    pub fn of(t: jiff::Timestamp, now: jiff::Timestamp) -> When {
        let at = t.strftime("%Y-%m-%d %H:%M:%S").to_string();
        let diff_ms = t.as_millisecond() - now.as_millisecond();
        let relative = if diff_ms.abs() < 1_000 {
            "now".to_string()
        } else if diff_ms > 0 {
            format!("in {}", duration_text(diff_ms.unsigned_abs() / 1_000 * 1_000))
        } else {
            format!("{} ago", duration_text(diff_ms.unsigned_abs() / 1_000 * 1_000))
        };
        When { at, relative }
    }
}

/// A count with thin groups of thousands, as the pages print counts: `20 000`.
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration_text(0), "0ms");
        assert_eq!(duration_text(850), "850ms");
        assert_eq!(duration_text(1_000), "1s");
        assert_eq!(duration_text(1_500), "1.5s");
        assert_eq!(duration_text(120_000), "2m");
        assert_eq!(duration_text(150_000), "2m 30s");
        assert_eq!(duration_text(3_600_000), "1h");
        assert_eq!(duration_text(3_900_000), "1h 05m");
        assert_eq!(duration_text(86_400_000 * 3 + 3_600_000 * 4), "3d 4h");
        assert_eq!(duration_text(86_400_000 * 2), "2d");
        assert_eq!(duration_text(u64::MAX), "584942417 years");
    }

    #[cfg(feature = "ssr")]
    #[test]
    fn instants_are_absolute_and_relative() {
        let now: jiff::Timestamp = "2026-11-22T14:00:00Z".parse().unwrap();
        let later: jiff::Timestamp = "2026-11-22T14:03:02Z".parse().unwrap();
        assert_eq!(When::of(later, now), When { at: "2026-11-22 14:03:02".into(), relative: "in 3m 2s".into() });
        assert_eq!(When::of(now, later).relative, "3m 2s ago");
        assert_eq!(When::of(now, now).relative, "now");
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(20_000), "20 000");
        assert_eq!(thousands(-1_234_567), "-1 234 567");
    }
}
