//! Durations as operators write them in configuration files and on command lines, read the
//! same way by the worker and the server.

use std::time::Duration;

/// Parses a duration as operators write one in configuration: `"250ms"`, `"30s"`, `"5m"`,
/// `"1h 30m"`, `"7d"` (a day is 24 hours here), or ISO 8601 (`"PT30S"`, `"P180D"`). Months and
/// years are refused (their length varies), as are negative durations; the error says what
/// is accepted.
pub fn parse_config_duration(text: &str) -> Result<Duration, String> {
    let hint = "expected a duration such as \"250ms\", \"30s\", \"5m\", \"7d\" or \"PT30S\"";
    let span: jiff::Span = text.trim().parse().map_err(|_| format!("{text:?} is not a duration; {hint}"))?;
    let signed = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|_| format!("{text:?} uses months or years, whose length varies; use days or smaller units"))?;
    Duration::try_from(signed).map_err(|_| format!("{text:?} is negative; {hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_operators_write_them() {
        for (text, ms) in [
            ("250ms", 250),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h 30m", 5_400_000),
            ("7d", 604_800_000),
            ("PT0.1S", 100),
            ("P180D", 15_552_000_000),
            ("0s", 0),
        ] {
            assert_eq!(parse_config_duration(text), Ok(Duration::from_millis(ms)), "{text}");
        }
        for bad in ["", "soon", "30", "-5s", "1 month"] {
            assert!(parse_config_duration(bad).is_err(), "{bad}");
        }
    }
}
