//! Durations as operators write them: `"250ms"`, `"30s"`, `"5m"`, `"1h 30m"`, `"7d"` (a day is
//! 24 hours here), or ISO 8601 (`"PT30S"`, `"P180D"`).

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration read from the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

/// Parses a duration; the error says what is accepted.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let hint = "expected a duration such as \"250ms\", \"30s\", \"5m\", \"7d\" or \"PT30S\"";
    let span: jiff::Span = text.trim().parse().map_err(|_| format!("{text:?} is not a duration; {hint}"))?;
    let signed = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|_| format!("{text:?} uses months or years, whose length varies; use days or smaller units"))?;
    Duration::try_from(signed).map_err(|_| format!("{text:?} is negative; {hint}"))
}

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map(ConfigDuration).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
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
            assert_eq!(parse_duration(text), Ok(Duration::from_millis(ms)), "{text}");
        }
        for bad in ["", "soon", "30", "-5s", "1 month"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
