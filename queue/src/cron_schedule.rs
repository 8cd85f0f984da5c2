//! Cron schedules (`ojs-cron.md` §3–5): a validated expression in an IANA time zone, and the
//! next time it fires. Pure: the clock is passed in.
//!
//! Expressions are parsed by the `croner` crate: the standard 5 fields, an optional leading
//! seconds field (6 fields, told apart by count), names (`JAN`, `MON`), `L`, `W`, `#`, and
//! the nicknames `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`,
//! `@hourly`. Times are evaluated in the schedule's zone with jiff, so a daylight-saving change
//! moves the UTC instant, not the wall-clock time.

use std::str::FromStr;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// A schedule that cannot be used, with the field at fault (`expression` or `timezone`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ScheduleError {
    pub field: &'static str,
    pub reason: String,
}

/// A cron expression in a time zone.
#[derive(Clone, Debug)]
pub struct CronSchedule {
    cron: Cron,
    zone: TimeZone,
    expression: String,
    timezone: String,
}

impl CronSchedule {
    /// Validates `expression` and `timezone` (an IANA name such as `"Europe/Berlin"`, or
    /// `"UTC"`; fixed offsets and abbreviations like `"EST"` are refused, as OJS requires).
    pub fn new(expression: &str, timezone: &str) -> Result<CronSchedule, ScheduleError> {
        let zone = parse_zone(timezone)?;
        let cron = parse_expression(expression)?;
        Ok(CronSchedule { cron, zone, expression: expression.trim().to_owned(), timezone: timezone.to_owned() })
    }

    pub fn expression(&self) -> &str {
        &self.expression
    }

    pub fn timezone(&self) -> &str {
        &self.timezone
    }

    /// The first time the schedule fires strictly after `after`; `None` if it never does
    /// (e.g. `0 0 30 2 *`, February 30th).
    ///
    /// A wall-clock time that a daylight-saving jump skips does not fire that day (OJS): croner
    /// would run it at the first time after the gap, whose wall clock does not match the
    /// expression, so such a time is passed over.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let mut from = after.to_zoned(self.zone.clone());
        // A gap is passed over in one step; a few more guard against a zone with odd rules.
        for _ in 0..4 {
            let next = self.cron.find_next_occurrence(&from, false).ok()?;
            if self.cron.is_time_matching(&next).unwrap_or(false) {
                return Some(next.timestamp());
            }
            from = next;
        }
        None
    }
}

fn parse_expression(expression: &str) -> Result<Cron, ScheduleError> {
    let err = |reason: String| ScheduleError { field: "expression", reason };
    let trimmed = expression.trim();
    if trimmed.is_empty() {
        return Err(err("is empty; give a cron expression such as \"*/5 * * * *\" or \"@hourly\"".into()));
    }
    if !trimmed.starts_with('@') {
        let fields = trimmed.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(err(format!("{trimmed:?} has {fields} fields; use 5 (minute hour day month weekday) or 6 (with seconds first)")));
        }
    } else if trimmed.eq_ignore_ascii_case("@midnight") {
        return parse_expression("@daily");
    }
    let parser = CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).build();
    let cron = parser.parse(trimmed).map_err(|e| err(format!("{trimmed:?} is not a valid cron expression: {e}")))?;
    // croner accepts `*/0`-like steps as errors already; a pattern that can never match (Feb
    // 30th) parses but is refused here so it does not sit registered and silent.
    if cron.find_next_occurrence(&Timestamp::UNIX_EPOCH.to_zoned(TimeZone::UTC), false).is_err() {
        return Err(err(format!("{trimmed:?} never matches a real date")));
    }
    Ok(cron)
}

fn parse_zone(name: &str) -> Result<TimeZone, ScheduleError> {
    let err = |reason: String| ScheduleError { field: "timezone", reason };
    let iana_shaped = name == "UTC" || (name.contains('/') && !name.starts_with("Etc/GMT") && name.chars().next().is_some_and(|c| c.is_ascii_uppercase()));
    if !iana_shaped {
        return Err(err(format!(
            "{name:?} is not an IANA time zone name; use e.g. \"UTC\", \"Europe/Berlin\" or \"America/New_York\" (offsets and abbreviations do not follow daylight saving)"
        )));
    }
    TimeZone::get(name).map_err(|e| err(format!("{name:?} is not a known IANA time zone: {e}")))
}

impl FromStr for CronSchedule {
    type Err = ScheduleError;

    /// An expression in UTC.
    fn from_str(expression: &str) -> Result<Self, Self::Err> {
        CronSchedule::new(expression, "UTC")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn standard_special_and_seconds_expressions() {
        let every_5 = CronSchedule::new("*/5 * * * *", "UTC").unwrap();
        assert_eq!(every_5.next_after(ts("2026-01-01T10:02:30Z")), Some(ts("2026-01-01T10:05:00Z")));
        let hourly = CronSchedule::new("@hourly", "UTC").unwrap();
        assert_eq!(hourly.next_after(ts("2026-01-01T10:00:00Z")), Some(ts("2026-01-01T11:00:00Z")));
        let midnight = CronSchedule::new("@midnight", "UTC").unwrap();
        assert_eq!(midnight.next_after(ts("2026-01-01T10:00:00Z")), Some(ts("2026-01-02T00:00:00Z")));
        let weekly = CronSchedule::new("@weekly", "UTC").unwrap();
        assert_eq!(weekly.next_after(ts("2026-01-01T10:00:00Z")), Some(ts("2026-01-04T00:00:00Z")), "Sunday");
        let names = CronSchedule::new("0 9 * JAN mon-fri", "UTC").unwrap();
        assert_eq!(names.next_after(ts("2026-01-03T00:00:00Z")), Some(ts("2026-01-05T09:00:00Z")), "Saturday to Monday");
        let every_2s = CronSchedule::new("*/2 * * * * *", "UTC").unwrap();
        assert_eq!(every_2s.next_after(ts("2026-01-01T10:00:01Z")), Some(ts("2026-01-01T10:00:02Z")));
        let last_day = CronSchedule::new("0 23 L * *", "UTC").unwrap();
        assert_eq!(last_day.next_after(ts("2026-02-03T00:00:00Z")), Some(ts("2026-02-28T23:00:00Z")));
    }

    #[test]
    fn time_zones_move_the_instant_with_daylight_saving() {
        let nine = CronSchedule::new("0 9 * * *", "America/New_York").unwrap();
        assert_eq!(nine.next_after(ts("2026-01-10T00:00:00Z")), Some(ts("2026-01-10T14:00:00Z")), "EST");
        assert_eq!(nine.next_after(ts("2026-07-10T00:00:00Z")), Some(ts("2026-07-10T13:00:00Z")), "EDT");
    }

    #[test]
    fn invalid_expressions_and_zones_name_the_field() {
        for bad in ["", "not a valid cron", "0 0 0 0 0 0 0", "99 25 32 13 8", "*/0 * * * *", "60 * * * *", "0 0 30 2 *", "@sometimes"] {
            let e = CronSchedule::new(bad, "UTC").expect_err(bad);
            assert_eq!(e.field, "expression", "{bad}: {e}");
        }
        for bad in ["EST", "+05:00", "UTC+5", "Etc/GMT+5", "Mars/Olympus", "america/new_york", ""] {
            let e = CronSchedule::new("* * * * *", bad).expect_err(bad);
            assert_eq!(e.field, "timezone", "{bad}: {e}");
        }
    }
}

#[cfg(test)]
mod dst_tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn spring_forward_skips_the_missing_time_and_fall_back_fires_once() {
        // 2026-03-08: New York jumps from 02:00 to 03:00; 02:30 does not exist that day.
        let half_two = CronSchedule::new("30 2 * * *", "America/New_York").unwrap();
        let next = half_two.next_after(ts("2026-03-08T05:00:00Z")); // 00:00 EST
        assert_eq!(next, Some(ts("2026-03-09T06:30:00Z")), "no run on the 8th; 02:30 EDT on the 9th");
        // 2026-11-01: 01:00-02:00 happens twice; 01:30 fires once, in the first (EDT) pass.
        let half_one = CronSchedule::new("30 1 * * *", "America/New_York").unwrap();
        let first = half_one.next_after(ts("2026-11-01T04:00:00Z")).unwrap(); // 00:00 EDT
        assert_eq!(first, ts("2026-11-01T05:30:00Z"), "01:30 EDT");
        assert_eq!(half_one.next_after(first), Some(ts("2026-11-02T06:30:00Z")), "not again at 01:30 EST");
    }
}
