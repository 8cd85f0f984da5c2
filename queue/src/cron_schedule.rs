//! Cron schedules (`ojs-cron.md` §3–5): a validated expression in an IANA time zone, and the
//! next time it fires. Pure: the clock is passed in.
//!
//! Expressions are parsed by the `croner` crate: the standard 5 fields, an optional leading
//! seconds field (6 fields, told apart by count), names (`JAN`, `MON`), `L`, `W`, `#`, and
//! the nicknames `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`,
//! `@hourly`. Times are evaluated in the schedule's zone with jiff, so a daylight-saving change
//! moves the UTC instant, not the wall-clock time.
//!
//! `@every <duration>` (§4.1: Go-style `30m`, `1h30m`, `45s`, parsed by jiff) is not a
//! calendar: it fires every interval from its anchor, the registration or the tick before.
//! Intervals run from [`MIN_EVERY`] to [`crate::bounds::MAX_INTERVAL`] (365 days).

use std::str::FromStr;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

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
    kind: Kind,
    zone: TimeZone,
    expression: String,
    timezone: String,
}

#[derive(Clone, Debug)]
enum Kind {
    Calendar(Box<Cron>),
    Every(SignedDuration),
}

/// How much of a schedule's text is checked: all of it when it is registered, only what it
/// needs to fire when an earlier registration's is read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strictness {
    Registering,
    Stored,
}

/// The shortest `@every` interval: due ticks are looked for once a second, so a shorter one
/// would silently fire at most once a second.
pub const MIN_EVERY: SignedDuration = SignedDuration::from_secs(1);

impl CronSchedule {
    /// Validates `expression` and `timezone` (a name the IANA tz database knows, spelled as it
    /// does: `"Europe/Berlin"`, `"Japan"`, `"UTC"`; fixed offsets and abbreviations like `"EST"`
    /// are refused, as OJS requires).
    pub fn new(expression: &str, timezone: &str) -> Result<CronSchedule, ScheduleError> {
        CronSchedule::parse(expression, timezone, Strictness::Registering)
    }

    /// A schedule as stored by an earlier registration, read back to fire it. Only what
    /// cannot work is refused: a zone name in another spelling than the database's, or an
    /// `@every` beyond the interval bound, was taken by earlier versions and still fires.
    pub fn stored(expression: &str, timezone: &str) -> Result<CronSchedule, ScheduleError> {
        CronSchedule::parse(expression, timezone, Strictness::Stored)
    }

    fn parse(expression: &str, timezone: &str, strictness: Strictness) -> Result<CronSchedule, ScheduleError> {
        let zone = match strictness {
            Strictness::Registering => parse_zone(timezone)?,
            Strictness::Stored if timezone == "UTC" => TimeZone::UTC,
            Strictness::Stored => TimeZone::get(timezone).map_err(|e| ScheduleError { field: "timezone", reason: format!("{timezone:?} is not a known IANA time zone: {e}") })?,
        };
        let kind = match every_interval(expression, strictness)? {
            Some(interval) => Kind::Every(interval),
            None => Kind::Calendar(Box::new(parse_expression(expression)?)),
        };
        Ok(CronSchedule { kind, zone, expression: expression.trim().to_owned(), timezone: timezone.to_owned() })
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
    /// A wall-clock time that a daylight-saving jump skips does not fire that day (OJS §5.2),
    /// so it is passed over here; [`CronSchedule::next_tick_after`] stops at it instead.
    ///
    /// An `@every` schedule fires one interval after `after`, its anchor.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let mut from = after;
        // A gap is passed over in one step; a few more guard against a zone with odd rules.
        for _ in 0..4 {
            let next = self.next_tick_after(from)?;
            if !self.skips_at(next) {
                return Some(next);
            }
            from = next;
        }
        None
    }

    /// The next time the firing pass looks at the schedule, strictly after `after`: a time it
    /// fires, or, where a daylight-saving jump swallowed one of its wall-clock times, the
    /// instant of the jump, which fires nothing and is recorded as a `dst_skip`
    /// ([`CronSchedule::skips_at`]; OJS §9.2: every occurrence that enqueues nothing is an
    /// event). One gap is one such tick, however many of the schedule's times it swallowed.
    /// When the schedule also names the wall-clock time the jump lands on (`0 2,3 * * *`
    /// jumping from 02:00 to 03:00), the skip is a microsecond before the jump and the jump
    /// itself fires: two ticks, one for each time.
    pub fn next_tick_after(&self, after: Timestamp) -> Option<Timestamp> {
        match &self.kind {
            Kind::Every(interval) => after.checked_add(*interval).ok(),
            Kind::Calendar(cron) => {
                // croner resolves some times inside a gap to the instant after it and passes
                // over others to the next day, so gaps are looked for here, in the zone's
                // transitions, rather than read from what it returns.
                let next = cron.find_next_occurrence(&after.to_zoned(self.zone.clone()), false).ok()?.timestamp();
                Some(match self.swallowing_gap(cron, after, next) {
                    Some(jump) => {
                        let skip = self.skip_tick(cron, jump);
                        if skip > after { skip } else { jump }
                    }
                    None => next,
                })
            }
        }
    }

    /// The tick that records the skip of a gap ending at `jump`: the jump itself, or a
    /// microsecond (the database's precision) before it when the schedule fires at the jump.
    fn skip_tick(&self, cron: &Cron, jump: Timestamp) -> Timestamp {
        if cron.is_time_matching(&jump.to_zoned(self.zone.clone())).unwrap_or(false) {
            jump.checked_sub(SignedDuration::from_micros(1)).unwrap_or(jump)
        } else {
            jump
        }
    }

    /// Whether `at`, a tick from [`CronSchedule::next_tick_after`], stands for a wall-clock
    /// time that a daylight-saving jump swallowed (the skip tick of a gap that swallowed one
    /// of the schedule's times: the jump, or a microsecond before it when the schedule names
    /// the jump's own time): such a tick fires nothing.
    pub fn skips_at(&self, at: Timestamp) -> bool {
        match &self.kind {
            Kind::Every(_) => false,
            Kind::Calendar(cron) => {
                let (Ok(just_before), Ok(until)) = (at.checked_sub(SignedDuration::from_nanos(1)), at.checked_add(SignedDuration::from_micros(1))) else {
                    return false;
                };
                // Whatever `at` itself reads as: croner matches whole seconds, so a per-second
                // schedule names the microsecond before a jump too.
                self.swallowing_gap(cron, just_before, until).is_some_and(|jump| self.skip_tick(cron, jump) == at)
            }
        }
    }

    /// The end of the first daylight-saving gap after `after` and not after `until` whose
    /// missing wall-clock times include one that `cron` names: the instant the clock jumps.
    fn swallowing_gap(&self, cron: &Cron, after: Timestamp, until: Timestamp) -> Option<Timestamp> {
        // Real gaps are an hour or so (Samoa once skipped a day); a longer one is checked
        // only so far, a bound on the work rather than a rule.
        const LONGEST: i64 = 2 * 86_400;
        for transition in self.zone.following(after) {
            let at = transition.timestamp();
            if at > until {
                break;
            }
            let before = self.zone.to_offset(at.checked_sub(SignedDuration::from_nanos(1)).ok()?);
            let jump = before.duration_until(transition.offset()).as_secs();
            if jump <= 0 {
                continue;
            }
            // The wall clock skips from `at` read in the old offset to `at` in the new one;
            // those civil times are matched as plain fields (a UTC reading of the same clock).
            let first = at.to_zoned(TimeZone::fixed(before)).datetime();
            let swallowed = (0..jump.min(LONGEST)).any(|s| {
                first
                    .checked_add(SignedDuration::from_secs(s))
                    .ok()
                    .and_then(|civil| civil.to_zoned(TimeZone::UTC).ok())
                    .is_some_and(|z| cron.is_time_matching(&z).unwrap_or(false))
            });
            if swallowed {
                return Some(at);
            }
        }
        None
    }

    /// The tick after `tick`, fired at `now` (a tick as [`CronSchedule::next_tick_after`]
    /// means it): the first one strictly after `now`, so missed ticks fire once, not once each. An `@every` schedule stays on its anchor's cadence
    /// (a tick fired late does not push the next ones later).
    pub fn tick_after(&self, tick: Timestamp, now: Timestamp) -> Option<Timestamp> {
        match &self.kind {
            Kind::Every(interval) => {
                let behind = now.duration_since(tick).max(SignedDuration::ZERO).as_nanos();
                let step = interval.as_nanos().max(1);
                let steps = i32::try_from(behind / step + 1).ok()?;
                tick.checked_add(interval.checked_mul(steps)?).ok()
            }
            Kind::Calendar(_) => self.next_tick_after(if tick > now { tick } else { now }),
        }
    }
}

/// The interval of an `@every <duration>` expression; `None` for anything else.
fn every_interval(expression: &str, strictness: Strictness) -> Result<Option<SignedDuration>, ScheduleError> {
    let err = |reason: String| ScheduleError { field: "expression", reason };
    let trimmed = expression.trim();
    let Some(rest) = trimmed.get(..6).filter(|p| p.eq_ignore_ascii_case("@every")).map(|_| &trimmed[6..]) else {
        return Ok(None);
    };
    let text = rest.trim();
    if text.is_empty() || !rest.starts_with(char::is_whitespace) {
        return Err(err(format!("{trimmed:?} needs a duration after \"@every \", such as \"@every 30m\" or \"@every 1h30m\"")));
    }
    let interval: SignedDuration = text
        .parse()
        .map_err(|e| err(format!("{text:?} is not a duration such as \"30m\", \"1h30m\" or \"45s\": {e}")))?;
    if interval < MIN_EVERY {
        return Err(err(format!("@every {text} is shorter than 1s; due ticks are looked for once a second")));
    }
    // Without a ceiling, an interval whose next tick overflows the time range is accepted as
    // active and never fires; the project's interval bound keeps it far inside that range.
    if strictness == Strictness::Registering {
        crate::bounds::check_interval(interval.unsigned_abs()).map_err(|r| err(format!("@every {text}: the interval {r}")))?;
    }
    Ok(Some(interval))
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

/// Zone names in the IANA database that OJS refuses anyway (§5.1): abbreviations, whose
/// meaning depends on where the reader lives, and POSIX-style rules and machine-local aliases
/// that are not zone names. `Etc/GMT±N` (fixed offsets) are refused by prefix.
const REFUSED_ZONES: [&str; 14] = [
    "EST", "MST", "HST", "CET", "EET", "MET", "WET", "EST5EDT", "CST6CDT", "MST7MDT", "PST8PDT", "localtime", "posixrules", "Factory",
];

/// An IANA zone, as the tz database knows it. The database, not the shape of the name, decides:
/// `Japan`, `Singapore` and `Cuba` are IANA names without a slash.
fn parse_zone(name: &str) -> Result<TimeZone, ScheduleError> {
    let err = |reason: String| ScheduleError { field: "timezone", reason };
    // The default zone works even on a host without a tz database.
    if name == "UTC" {
        return Ok(TimeZone::UTC);
    }
    let fixed_offset = name.strip_prefix("Etc/GMT").is_some_and(|rest| rest.starts_with(['+', '-']));
    if fixed_offset || REFUSED_ZONES.contains(&name) {
        return Err(err(format!(
            "{name:?} is an abbreviation or a fixed offset, which does not follow daylight saving; use an IANA zone name such as \"UTC\", \"Europe/Berlin\" or \"America/New_York\""
        )));
    }
    let zone = TimeZone::get(name).map_err(|e| {
        err(format!("{name:?} is not a known IANA time zone (use e.g. \"UTC\", \"Europe/Berlin\" or \"America/New_York\"; offsets and abbreviations are refused): {e}"))
    })?;
    // jiff looks names up case-insensitively; the stored name is echoed and compared on
    // re-registration, so only the database's own spelling is taken.
    match zone.iana_name() {
        Some(canonical) if canonical == name => Ok(zone),
        Some(canonical) => Err(err(format!("{name:?} is spelled {canonical:?} in the IANA time zone database"))),
        None => Err(err(format!("{name:?} is not an IANA time zone name"))),
    }
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
    fn every_fires_by_interval_from_its_anchor() {
        for (expression, secs) in [("@every 30m", 1800), ("@every 2h", 7200), ("@every 1h30m", 5400), ("@every 45s", 45), ("@EVERY  2h45m30s", 9930)] {
            let s = CronSchedule::new(expression, "UTC").expect(expression);
            let anchor = ts("2026-01-01T10:00:07Z");
            assert_eq!(s.next_after(anchor), Some(anchor + SignedDuration::from_secs(secs)), "{expression}");
        }
        let s = CronSchedule::new("@every 30m", "Europe/Berlin").unwrap();
        let tick = ts("2026-01-01T10:00:00Z");
        assert_eq!(s.tick_after(tick, ts("2026-01-01T10:00:01Z")), Some(ts("2026-01-01T10:30:00Z")), "fired late: the cadence holds");
        assert_eq!(s.tick_after(tick, ts("2026-01-01T11:40:00Z")), Some(ts("2026-01-01T12:00:00Z")), "missed ticks fire once");
        assert_eq!(s.tick_after(tick, ts("2026-01-01T10:30:00Z")), Some(ts("2026-01-01T11:00:00Z")), "strictly after now");
        let year = CronSchedule::new("@every 8760h", "UTC").expect("365 days is within the bound");
        assert_eq!(year.next_after(ts("2026-01-01T00:00:00Z")), Some(ts("2027-01-01T00:00:00Z")));
        let calendar = CronSchedule::new("*/5 * * * *", "UTC").unwrap();
        assert_eq!(calendar.tick_after(ts("2026-01-01T10:00:00Z"), ts("2026-01-01T10:17:00Z")), Some(ts("2026-01-01T10:20:00Z")));
    }

    #[test]
    fn time_zones_move_the_instant_with_daylight_saving() {
        let nine = CronSchedule::new("0 9 * * *", "America/New_York").unwrap();
        assert_eq!(nine.next_after(ts("2026-01-10T00:00:00Z")), Some(ts("2026-01-10T14:00:00Z")), "EST");
        assert_eq!(nine.next_after(ts("2026-07-10T00:00:00Z")), Some(ts("2026-07-10T13:00:00Z")), "EDT");
    }

    #[test]
    fn invalid_expressions_and_zones_name_the_field() {
        for bad in [
            "",
            "not a valid cron",
            "0 0 0 0 0 0 0",
            "99 25 32 13 8",
            "*/0 * * * *",
            "60 * * * *",
            "0 0 30 2 *",
            "@sometimes",
            "@every",
            "@every30m",
            "@every banana",
            "@every 500ms",
            "@every 0s",
            "@every -5m",
            "@every 8761h",
            "@every 100000000h",
        ] {
            let e = CronSchedule::new(bad, "UTC").expect_err(bad);
            assert_eq!(e.field, "expression", "{bad}: {e}");
        }
        for bad in ["EST", "+05:00", "UTC+5", "Etc/GMT+5", "Etc/GMT-14", "Mars/Olympus", "america/new_york", "", "PST8PDT", "CET", "localtime", "../UTC", "Japan/"] {
            let e = CronSchedule::new("* * * * *", bad).expect_err(bad);
            assert_eq!(e.field, "timezone", "{bad}: {e}");
        }
        let e = CronSchedule::new("* * * * *", "asia/tokyo").expect_err("lowercase");
        assert!(e.reason.contains("\"Asia/Tokyo\""), "names the database's spelling: {e}");
    }

    #[test]
    fn schedules_stored_by_earlier_versions_still_fire() {
        // Taken before the spelling check and the interval bound: refused if registered now,
        // read back and fired as stored.
        for (expression, zone) in [("0 9 * * *", "america/new_york"), ("@every 9000h", "UTC")] {
            assert!(CronSchedule::new(expression, zone).is_err(), "{expression} {zone}");
            let stored = CronSchedule::stored(expression, zone).unwrap_or_else(|e| panic!("{expression} {zone}: {}", e.reason));
            assert!(stored.next_after(ts("2026-01-01T00:00:00Z")).is_some());
        }
        assert_eq!(
            CronSchedule::stored("0 9 * * *", "america/new_york").unwrap().next_after(ts("2026-01-01T00:00:00Z")),
            Some(ts("2026-01-01T14:00:00Z"))
        );
        assert!(CronSchedule::stored("0 9 * * *", "Not/AZone").is_err());
    }

    #[test]
    fn iana_names_without_a_slash_are_zones() {
        for name in ["UTC", "Japan", "Singapore", "Cuba", "Etc/UTC", "US/Eastern", "Asia/Tokyo", "America/Argentina/Buenos_Aires"] {
            let s = CronSchedule::new("0 9 * * *", name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.timezone(), name);
        }
        let japan = CronSchedule::new("0 9 * * *", "Japan").unwrap();
        assert_eq!(japan.next_after(ts("2026-01-10T01:00:00Z")), Some(ts("2026-01-11T00:00:00Z")), "09:00 JST is 00:00 UTC");
        let utc = CronSchedule::new("0 9 * * *", "UTC").unwrap();
        assert_eq!(utc.next_after(ts("2026-01-10T01:00:00Z")), Some(ts("2026-01-10T09:00:00Z")));
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
        assert!(!half_one.skips_at(first));
    }

    #[test]
    fn a_time_swallowed_by_a_gap_is_one_tick_that_does_not_fire() {
        let half_two = CronSchedule::new("30 2 * * *", "America/New_York").unwrap();
        let gap = half_two.next_tick_after(ts("2026-03-08T05:00:00Z")).expect("a tick on the 8th");
        assert_eq!(gap, ts("2026-03-08T07:00:00Z"), "the instant of the jump, 03:00 EDT");
        assert!(half_two.skips_at(gap), "the gap's tick is a skip");
        assert_eq!(half_two.next_tick_after(gap), Some(ts("2026-03-09T06:30:00Z")), "then the next day's run");
        assert_eq!(half_two.tick_after(ts("2026-03-07T07:30:00Z"), ts("2026-03-07T07:30:01Z")), Some(gap), "the firing pass stops at the gap");
        // Every minute of the missing hour: one skip, not sixty.
        let hour_two = CronSchedule::new("* 2 * * *", "America/New_York").unwrap();
        let gap = hour_two.next_tick_after(ts("2026-03-08T06:59:00Z")).expect("a tick");
        assert_eq!(gap, ts("2026-03-08T07:00:00Z"));
        assert!(hour_two.skips_at(gap));
        assert_eq!(hour_two.next_tick_after(gap), Some(ts("2026-03-09T06:00:00Z")));
        // A time the jump does not swallow (03:30 exists) is no skip.
        let half_three = CronSchedule::new("30 3 * * *", "America/New_York").unwrap();
        assert_eq!(half_three.next_tick_after(ts("2026-03-08T05:00:00Z")), Some(ts("2026-03-08T07:30:00Z")));
        // Falling back swallows nothing.
        assert_eq!(half_three.next_tick_after(ts("2026-11-01T04:00:00Z")), Some(ts("2026-11-01T08:30:00Z")));
        // In UTC nothing is swallowed.
        let utc = CronSchedule::new("30 2 * * *", "UTC").unwrap();
        let t = utc.next_tick_after(ts("2026-03-08T00:00:00Z")).unwrap();
        assert!(!utc.skips_at(t));
        assert!(!CronSchedule::new("@every 1h", "UTC").unwrap().skips_at(t));
        // A tick set off the schedule by hand (not a jump) still fires.
        assert!(!half_two.skips_at(ts("2026-03-08T07:01:00Z")));
        assert!(!CronSchedule::new("@hourly", "America/New_York").unwrap().skips_at(ts("2026-03-08T07:00:00Z")), "03:00 EDT is a time @hourly names");
    }

    #[test]
    fn a_gap_landing_on_a_named_time_skips_the_swallowed_one_and_fires_the_other() {
        // 02:00 does not exist on 2026-03-08 in New York; 03:00 EDT does, and is named too.
        let two_and_three = CronSchedule::new("0 2,3 * * *", "America/New_York").unwrap();
        let skip = two_and_three.next_tick_after(ts("2026-03-08T05:00:00Z")).expect("a tick");
        assert_eq!(skip, ts("2026-03-08T06:59:59.999999Z"), "the skip, a microsecond before the jump");
        assert!(two_and_three.skips_at(skip), "02:00 is recorded as skipped");
        let fire = two_and_three.next_tick_after(skip).expect("a tick");
        assert_eq!(fire, ts("2026-03-08T07:00:00Z"), "03:00 EDT");
        assert!(!two_and_three.skips_at(fire), "and fires");
        assert_eq!(two_and_three.next_tick_after(fire), Some(ts("2026-03-09T06:00:00Z")), "then 02:00 EDT the next day");
        assert_eq!(two_and_three.next_after(ts("2026-03-08T05:00:00Z")), Some(fire), "the next firing passes over the skip");
        assert_eq!(two_and_three.tick_after(ts("2026-03-07T08:00:00Z"), ts("2026-03-07T08:00:01Z")), Some(skip), "the firing pass stops at the skip");
        // @hourly names every hour: the swallowed 02:00 is a skip, 03:00 fires.
        let hourly = CronSchedule::new("@hourly", "America/New_York").unwrap();
        assert_eq!(hourly.next_tick_after(ts("2026-03-08T06:00:00Z")), Some(skip));
        assert!(hourly.skips_at(skip));
        assert_eq!(hourly.next_tick_after(skip), Some(fire));
        // A microsecond before a jump whose own time is not named is no tick of anything.
        let half_two = CronSchedule::new("30 2 * * *", "America/New_York").unwrap();
        assert!(!half_two.skips_at(skip));
        // Every second: 01:59:59 EST fires, the gap is one skip (croner reads the skip tick as
        // 01:59:59 too, which this schedule names), then 03:00:00 EDT fires.
        let every_second = CronSchedule::new("* * * * * *", "America/New_York").unwrap();
        let last = every_second.next_tick_after(ts("2026-03-08T06:59:58Z")).expect("a tick");
        assert_eq!(last, ts("2026-03-08T06:59:59Z"));
        assert!(!every_second.skips_at(last));
        assert_eq!(every_second.next_tick_after(last), Some(skip));
        assert!(every_second.skips_at(skip), "a skip, not a second run of 01:59:59");
        assert_eq!(every_second.next_tick_after(skip), Some(fire));
        assert!(!every_second.skips_at(fire));
        assert_eq!(every_second.next_after(last), Some(fire));
    }
}
