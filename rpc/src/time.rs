//! Time rules shared by every part: sketches are per whole UTC hour, named by hours since
//! the Unix epoch, and taken from the event's own timestamp (DESIGN §2). Users write times
//! as RFC 3339, a date, `now`, or relative to now (`-7d`, `-36h`, `-90m`).

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use thiserror::Error;

/// Seconds in an hour.
pub const SECONDS_PER_HOUR: i64 = 3600;
/// Hours in a day.
pub const HOURS_PER_DAY: u32 = 24;

/// Why a time is not usable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TimeError {
    /// Not a form this module reads.
    #[error(
        "cannot read time {text:?}: expected RFC 3339 (2026-11-23T00:00:00Z), a date (2026-11-23), now, or relative to now (-7d, -36h, -90m)"
    )]
    Unparsable {
        /// The text given.
        text: String,
    },
    /// Before 1970 or after the last hour a u32 can name (year 491,936).
    #[error("time {text} is outside the range hourglass stores (1970 onwards)")]
    OutOfRange {
        /// The time, as given or computed.
        text: String,
    },
    /// The end of a range is not after its start.
    #[error("empty time range: the end ({to}) must be after the start ({from})")]
    EmptyRange {
        /// The start.
        from: String,
        /// The end.
        to: String,
    },
}

/// The hour (since the epoch) that contains `unix_seconds`, if it is representable.
pub fn hour_of(unix_seconds: i64) -> Option<u32> {
    if unix_seconds < 0 {
        return None;
    }
    u32::try_from(unix_seconds / SECONDS_PER_HOUR).ok()
}

/// The instant an hour starts.
pub fn hour_start(hour: u32) -> DateTime<Utc> {
    DateTime::from_timestamp(i64::from(hour) * SECONDS_PER_HOUR, 0)
        .expect("every u32 hour is a valid timestamp")
}

/// The UTC day (since the epoch) an hour belongs to.
pub fn day_of(hour: u32) -> u32 {
    hour / HOURS_PER_DAY
}

/// An hour as people read it: `2026-11-23T14:00Z`.
pub fn format_hour(hour: u32) -> String {
    hour_start(hour).format("%Y-%m-%dT%H:00Z").to_string()
}

/// A day as people read it: `2026-11-23`.
pub fn format_day(day: u32) -> String {
    hour_start(day * HOURS_PER_DAY)
        .format("%Y-%m-%d")
        .to_string()
}

/// `n` hours as a sentence says it: "1 hour", "168 hours".
pub fn hours_text(n: u32) -> String {
    if n == 1 {
        "1 hour".to_string()
    } else {
        format!("{n} hours")
    }
}

/// The instant an hour starts, in RFC 3339 to the second: `2026-11-23T14:00:00Z`.
pub fn rfc3339_hour(hour: u32) -> String {
    hour_start(hour).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The hour [`format_hour`] wrote, read back.
pub fn parse_hour(text: &str) -> Option<u32> {
    let t = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%MZ").ok()?;
    hour_of(t.and_utc().timestamp())
}

/// The day [`format_day`] wrote, read back.
pub fn parse_day(text: &str) -> Option<u32> {
    let date = NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
    let hour = hour_of(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp())?;
    Some(day_of(hour))
}

/// Reads a time as users write it, relative forms counted back from `now`.
pub fn parse_time(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, TimeError> {
    let unparsable = || TimeError::Unparsable {
        text: text.to_string(),
    };
    let text_trimmed = text.trim();
    if text_trimmed == "now" {
        return Ok(now);
    }
    if let Some(rest) = text_trimmed.strip_prefix('-') {
        let split = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(unparsable)?;
        let (digits, unit) = rest.split_at(split);
        let amount: i64 = digits.parse().map_err(|_| unparsable())?;
        let delta = match unit {
            "d" => TimeDelta::try_days(amount),
            "h" => TimeDelta::try_hours(amount),
            "m" => TimeDelta::try_minutes(amount),
            "s" => TimeDelta::try_seconds(amount),
            _ => None,
        }
        .ok_or_else(unparsable)?;
        return now
            .checked_sub_signed(delta)
            .ok_or_else(|| TimeError::OutOfRange {
                text: text.to_string(),
            });
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(text_trimmed) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(date) = NaiveDate::parse_from_str(text_trimmed, "%Y-%m-%d") {
        return Ok(date
            .and_hms_opt(0, 0, 0)
            .expect("midnight exists")
            .and_utc());
    }
    Err(unparsable())
}

/// The whole hours `[start, end)` that cover `from .. to`: `from` rounds down to its hour
/// and `to` up, so a range ending `now` includes the hour in progress.
pub fn hour_range(
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<std::ops::Range<u32>, TimeError> {
    let out_of_range = |t: DateTime<Utc>| TimeError::OutOfRange {
        text: t.to_rfc3339(),
    };
    let start = hour_of(from.timestamp()).ok_or_else(|| out_of_range(from))?;
    let to_secs = to.timestamp();
    let end_secs = to_secs
        .checked_add(SECONDS_PER_HOUR - 1)
        .ok_or_else(|| out_of_range(to))?;
    let end = hour_of(end_secs).ok_or_else(|| out_of_range(to))?;
    if end <= start {
        return Err(TimeError::EmptyRange {
            from: from.to_rfc3339(),
            to: to.to_rfc3339(),
        });
    }
    Ok(start..end)
}

/// Time since the Unix epoch, now; zero on a clock set before 1970.
pub fn since_unix_epoch() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> i64 {
    since_unix_epoch().as_secs() as i64
}

/// A duration field of a configuration file, written as [`parse_duration`] reads it
/// (`#[serde(deserialize_with = "...")]`); the error names the text and what is wrong.
pub fn deserialize_duration<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<std::time::Duration, D::Error> {
    let text = <String as serde::Deserialize>::deserialize(deserializer)?;
    parse_duration(&text).map_err(serde::de::Error::custom)
}

/// Why a duration does not parse; each message quotes the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Digits only, or nothing at all.
    #[error("duration {0:?} has no unit: add ms, s, m, h or d")]
    NoUnit(String),
    /// The text does not start with a whole number (or it overflows 64 bits).
    #[error("duration {0:?} must start with a whole number")]
    NotANumber(String),
    /// A unit other than ms, s, m, h and d.
    #[error("duration {0:?}: unit must be ms, s, m, h or d")]
    BadUnit(String),
    /// More milliseconds than 64 bits hold.
    #[error("duration {0:?} is too long")]
    TooLong(String),
}

/// Parses a duration as a whole number and one unit: `250ms`, `90s`, `15m`, `1h`, `35d`.
/// Used by both processes' flags and config files.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, DurationError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| DurationError::NoUnit(text.to_string()))?;
    let (digits, unit) = text.split_at(split);
    let amount: u64 = digits
        .parse()
        .map_err(|_| DurationError::NotANumber(text.to_string()))?;
    let millis_per = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(DurationError::BadUnit(text.to_string())),
    };
    amount
        .checked_mul(millis_per)
        .map(std::time::Duration::from_millis)
        .ok_or_else(|| DurationError::TooLong(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_are_counted_as_a_sentence_counts_them() {
        assert_eq!(hours_text(1), "1 hour");
        assert_eq!(hours_text(0), "0 hours");
        assert_eq!(hours_text(168), "168 hours");
    }

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn hours_are_whole_utc_hours_since_the_epoch() {
        assert_eq!(hour_of(0), Some(0));
        assert_eq!(hour_of(3599), Some(0));
        assert_eq!(hour_of(3600), Some(1));
        assert_eq!(hour_of(-1), None);
        // 2023-11-14T22:13:20Z
        assert_eq!(hour_of(1_700_000_000), Some(472_222));
        assert_eq!(format_hour(472_222), "2023-11-14T22:00Z");
        assert_eq!(day_of(472_222), 19_675);
        assert_eq!(format_day(19_675), "2023-11-14");
        assert_eq!(rfc3339_hour(472_222), "2023-11-14T22:00:00Z");
        assert_eq!(parse_hour("2023-11-14T22:00Z"), Some(472_222));
        assert_eq!(parse_day("2023-11-14"), Some(19_675));
        assert_eq!(parse_hour("2023-11-14"), None);
        assert_eq!(parse_day("1969-12-31"), None);
    }

    #[test]
    fn every_documented_form_parses() {
        let now = at("2026-11-30T05:45:10Z");
        assert_eq!(parse_time("now", now).unwrap(), now);
        assert_eq!(parse_time("-7d", now).unwrap(), at("2026-11-23T05:45:10Z"));
        assert_eq!(parse_time("-36h", now).unwrap(), at("2026-11-28T17:45:10Z"));
        assert_eq!(parse_time("-90m", now).unwrap(), at("2026-11-30T04:15:10Z"));
        assert_eq!(
            parse_time("2026-11-23T01:30:00+01:00", now).unwrap(),
            at("2026-11-23T00:30:00Z")
        );
        assert_eq!(
            parse_time("2026-11-23", now).unwrap(),
            at("2026-11-23T00:00:00Z")
        );
        for bad in ["yesterday", "-7", "-d", "-7w", "2026-13-01", ""] {
            assert!(
                matches!(parse_time(bad, now), Err(TimeError::Unparsable { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn ranges_cover_the_partial_hours_at_both_ends() {
        let r = hour_range(at("2026-11-23T05:45:10Z"), at("2026-11-30T05:45:10Z")).unwrap();
        assert_eq!(r.end - r.start, 7 * 24 + 1);
        assert_eq!(format_hour(r.start), "2026-11-23T05:00Z");
        assert_eq!(format_hour(r.end), "2026-11-30T06:00Z");
        // Aligned ends stay where they are.
        let r = hour_range(at("2026-11-23T00:00:00Z"), at("2026-11-24T00:00:00Z")).unwrap();
        assert_eq!(r.end - r.start, 24);
        assert!(matches!(
            hour_range(at("2026-11-24T00:00:00Z"), at("2026-11-23T00:00:00Z")),
            Err(TimeError::EmptyRange { .. })
        ));
        assert!(matches!(
            hour_range(at("1960-01-01T00:00:00Z"), at("2026-11-23T00:00:00Z")),
            Err(TimeError::OutOfRange { .. })
        ));
    }

    #[test]
    fn durations_parse_with_one_unit() {
        use std::time::Duration;
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(
            parse_duration("2d").unwrap(),
            Duration::from_secs(2 * 86_400)
        );
        for bad in ["", "h", "10", "1.5h", "-1h", "1hh", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
