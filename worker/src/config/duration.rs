//! Durations as operators write them: `"250ms"`, `"30s"`, `"5m"`, `"1h 30m"`, `"7d"` (a day is
//! 24 hours here), or ISO 8601 (`"PT30S"`, `"P180D"`).

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration read from the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

/// Parses a duration; the error says what is accepted. The server reads its durations the
/// same way.
pub use rebound_queue::config_duration::parse_config_duration as parse_duration;

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map(ConfigDuration).map_err(serde::de::Error::custom)
    }
}
