//! ISO-8601 durations (`"PT1S"`, `"PT0.5S"`, `"P1D"`, `"PT1H30M"`) through jiff.
//!
//! OJS puts every policy duration on the wire in this form. Parsing uses jiff's strict
//! Temporal/ISO-8601 span parser (not jiff's "friendly" format, so `"1s"` is rejected) and
//! converts calendar days and weeks at 24 hours each; years and months have no fixed length
//! and are rejected. Relative forms such as `"+PT2S"` meaning "now + 2 s" are a timestamp
//! concern handled by the HTTP layer.

use std::time::Duration;

use jiff::SpanRelativeTo;
use jiff::fmt::temporal::{SpanParser, SpanPrinter};

static PARSER: SpanParser = SpanParser::new();
static PRINTER: SpanPrinter = SpanPrinter::new();

/// Formats `d` in the canonical form jiff prints: units up to hours, fractional seconds
/// when needed (`PT1S`, `PT5M`, `PT0.5S`, `PT24H`, `PT0S`).
pub fn format(d: Duration) -> String {
    PRINTER.unsigned_duration_to_string(&d)
}

/// Parses an ISO-8601 duration, treating a day as 24 h and a week as 7 days.
///
/// Errors (as a message without the field name, which the caller adds) for anything that
/// is not ISO-8601, for years/months, and for negative durations. Zero is accepted here;
/// policy fields additionally require a positive value.
pub fn parse(s: &str) -> Result<Duration, String> {
    let span = PARSER
        .parse_span(s)
        .map_err(|e| format!("must be an ISO-8601 duration such as \"PT1S\", got {s:?} ({e})"))?;
    if span.get_years() != 0 || span.get_months() != 0 {
        return Err(format!(
            "years and months have no fixed length; use days or smaller units, got {s:?}"
        ));
    }
    let signed = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|e| format!("duration out of range, got {s:?} ({e})"))?;
    if signed.is_negative() {
        return Err(format!("must not be negative, got {s:?}"));
    }
    Duration::try_from(signed).map_err(|e| format!("duration out of range, got {s:?} ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_ojs_forms() {
        assert_eq!(parse("PT1S"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("PT0.5S"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("P1D"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("P1W"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse("PT1H30M"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse("PT5M"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("P1DT2H"), Ok(Duration::from_secs(93_600)));
        assert_eq!(parse("PT0S"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_non_iso_and_negative() {
        for bad in ["1s", "", " PT1S", "PT", "P", "-PT1S", "P1Y", "P2M", "PT1X", "1000", "PT1S "] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(parse("-PT1S").is_err_and(|e| e.contains("negative")));
        assert!(parse("P1Y").is_err_and(|e| e.contains("years")));
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(format(Duration::from_secs(1)), "PT1S");
        assert_eq!(format(Duration::from_secs(300)), "PT5M");
        assert_eq!(format(Duration::from_millis(500)), "PT0.5S");
        assert_eq!(format(Duration::from_secs(5_400)), "PT1H30M");
        assert_eq!(format(Duration::ZERO), "PT0S");
    }

    #[test]
    fn round_trips() {
        for d in [
            Duration::from_nanos(1),
            Duration::from_millis(1_234),
            Duration::from_secs(86_400 * 365),
            Duration::new(3_600 * 17 + 61, 999_999_999),
        ] {
            assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
