//! The DogStatsD / StatsD line parser.
//!
//! A datagram holds one or more lines separated by `\n`. A line is
//! `metric:value|type[|@rate][|#k:v,k2:v2][|T<unix seconds>][|c:container]`. hourglass
//! counts sets: `visitors:user42|s|#country:de|T1700000000` adds `user42` to the sketches
//! of `visitors{country=de}` in the hour of 1700000000. Lines of other types (counters,
//! gauges, timers, histograms, distributions, service checks, events) are recognised and
//! reported as [`Parsed::Unsupported`]; anything else is a [`LineError`] naming what is
//! wrong. Parsing borrows from the datagram and never allocates.

/// What one line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A set line: an item for the metric's sketches.
    Set(SetLine<'a>),
    /// A well-formed line of a type hourglass does not count.
    Unsupported,
}

/// A `|s` line, borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetLine<'a> {
    /// The metric name, not yet validated.
    pub metric: &'a str,
    /// The item.
    pub item: &'a [u8],
    /// The tags as sent, without the `#`: `k:v,k2:v2`; empty if none.
    pub tags: &'a [u8],
    /// The event time (`|T`), in Unix seconds.
    pub(crate) timestamp: Option<i64>,
}

/// Why a line is malformed. [`LineError::reason`] is the label it is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineError {
    /// No `:` between metric and value.
    NoValue,
    /// No `|type` after the value.
    NoType,
    /// A type that is not a StatsD type.
    UnknownType,
    /// The metric name is empty or not UTF-8.
    BadMetric,
    /// A set line whose item is empty.
    EmptyItem,
    /// `|T` is not a whole number of seconds.
    BadTimestamp,
    /// `|@` is not a number.
    BadSampleRate,
    /// A section after the type that is none of `@`, `#`, `T`, `c:`.
    UnknownSection,
    /// A tag section that is not UTF-8.
    BadTags,
}

impl LineError {
    /// The counter label: short, stable, snake case.
    pub fn reason(self) -> &'static str {
        match self {
            LineError::NoValue => "no_value",
            LineError::NoType => "no_type",
            LineError::UnknownType => "unknown_type",
            LineError::BadMetric => "bad_metric",
            LineError::EmptyItem => "empty_item",
            LineError::BadTimestamp => "bad_timestamp",
            LineError::BadSampleRate => "bad_sample_rate",
            LineError::UnknownSection => "unknown_section",
            LineError::BadTags => "bad_tags",
        }
    }
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LineError::NoValue => "no ':' between metric and value",
            LineError::NoType => "no '|type' after the value",
            LineError::UnknownType => "unknown metric type",
            LineError::BadMetric => "metric name is empty or not UTF-8",
            LineError::EmptyItem => "set line with an empty item",
            LineError::BadTimestamp => "'|T' is not whole Unix seconds",
            LineError::BadSampleRate => "'|@' is not a number",
            LineError::UnknownSection => "unknown section after the type",
            LineError::BadTags => "tags are not UTF-8",
        })
    }
}

/// The lines of a datagram: split on `\n` (a trailing `\r` is dropped), empty lines
/// skipped.
pub fn lines(datagram: &[u8]) -> impl Iterator<Item = &[u8]> {
    datagram
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .filter(|line| !line.is_empty())
}

/// Parses one line.
pub fn parse_line(line: &[u8]) -> Result<Parsed<'_>, LineError> {
    // Service checks and events have their own grammar; they are StatsD, just not counted.
    if line.starts_with(b"_sc|") || line.starts_with(b"_e{") {
        return Ok(Parsed::Unsupported);
    }
    let colon = memchr(b':', line).ok_or(LineError::NoValue)?;
    let (metric, rest) = (&line[..colon], &line[colon + 1..]);
    let mut sections = rest.split(|&b| b == b'|');
    let value = sections.next().unwrap_or_default();
    let kind = sections.next().ok_or(LineError::NoType)?;
    match kind {
        b"s" => {}
        b"c" | b"g" | b"ms" | b"h" | b"d" => return Ok(Parsed::Unsupported),
        _ => return Err(LineError::UnknownType),
    }
    let metric = std::str::from_utf8(metric).map_err(|_| LineError::BadMetric)?;
    if metric.is_empty() {
        return Err(LineError::BadMetric);
    }
    if value.is_empty() {
        return Err(LineError::EmptyItem);
    }
    let mut tags: &[u8] = &[];
    let mut timestamp = None;
    for section in sections {
        match section.first() {
            Some(b'#') => {
                tags = &section[1..];
                if std::str::from_utf8(tags).is_err() {
                    return Err(LineError::BadTags);
                }
            }
            Some(b'T') => {
                let digits =
                    std::str::from_utf8(&section[1..]).map_err(|_| LineError::BadTimestamp)?;
                let t: i64 = digits.parse().map_err(|_| LineError::BadTimestamp)?;
                timestamp = Some(t);
            }
            Some(b'@') => {
                // A sample rate means nothing for a set (each item counts once); it is
                // checked so that a garbled line is not taken for a good one.
                let rate =
                    std::str::from_utf8(&section[1..]).map_err(|_| LineError::BadSampleRate)?;
                rate.parse::<f64>().map_err(|_| LineError::BadSampleRate)?;
            }
            // Container id and external data (DogStatsD 1.2+): not part of the series.
            Some(b'c') | Some(b'e') if section.get(1) == Some(&b':') => {}
            _ => return Err(LineError::UnknownSection),
        }
    }
    Ok(Parsed::Set(SetLine {
        metric,
        item: value,
        tags,
        timestamp,
    }))
}

/// The `key:value` pairs of a tag section; a tag without `:` has an empty value.
pub fn tag_pairs(tags: &str) -> impl Iterator<Item = (&str, &str)> {
    tags.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| t.split_once(':').unwrap_or((t, "")))
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(line: &str) -> SetLine<'_> {
        match parse_line(line.as_bytes()) {
            Ok(Parsed::Set(s)) => s,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn set_lines_with_every_section() {
        let s = set("visitors:user42|s|#country:de,device:mobile|T1700000000");
        assert_eq!(s.metric, "visitors");
        assert_eq!(s.item, b"user42");
        assert_eq!(s.tags, b"country:de,device:mobile");
        assert_eq!(s.timestamp, Some(1_700_000_000));
        let s = set("pages:/cart|s|@0.5|c:abc123|#prod");
        assert_eq!(s.item, b"/cart");
        assert_eq!(s.tags, b"prod");
        assert_eq!(s.timestamp, None);
        // The item is everything between the first ':' and the first '|'.
        assert_eq!(set("urls:http://x.io:80/a|s").item, b"http://x.io:80/a");
    }

    #[test]
    fn other_types_are_unsupported_not_errors() {
        for line in [
            "hits:1|c",
            "temp:21.5|g|#room:a",
            "latency:12|ms",
            "size:3|h",
            "d:1|d",
            "_sc|db|0",
            "_e{5,4}:title|text",
        ] {
            assert_eq!(
                parse_line(line.as_bytes()),
                Ok(Parsed::Unsupported),
                "{line}"
            );
        }
    }

    #[test]
    fn malformed_lines_name_the_problem() {
        let cases = [
            ("visitors", LineError::NoValue),
            ("visitors:user", LineError::NoType),
            ("visitors:user|x", LineError::UnknownType),
            (":user|s", LineError::BadMetric),
            ("visitors:|s", LineError::EmptyItem),
            ("visitors:u|s|Tsoon", LineError::BadTimestamp),
            ("visitors:u|s|@fast", LineError::BadSampleRate),
            ("visitors:u|s|zzz", LineError::UnknownSection),
            ("visitors:u|s|", LineError::UnknownSection),
        ];
        for (line, want) in cases {
            assert_eq!(parse_line(line.as_bytes()), Err(want), "{line}");
            assert!(!want.reason().is_empty());
        }
        assert_eq!(parse_line(b"v\xff:u|s"), Err(LineError::BadMetric));
        assert_eq!(parse_line(b"v:u|s|#\xff"), Err(LineError::BadTags));
    }

    #[test]
    fn datagrams_split_into_lines() {
        let got: Vec<&[u8]> = lines(b"a:1|s\n\nb:2|s\r\nc:3|s\n").collect();
        assert_eq!(got, vec![&b"a:1|s"[..], b"b:2|s", b"c:3|s"]);
        let pairs: Vec<_> = tag_pairs("country:de,prod,,url:http://x").collect();
        assert_eq!(
            pairs,
            vec![("country", "de"), ("prod", ""), ("url", "http://x")]
        );
    }

    proptest! {
        /// Whatever arrives, parsing is a line or an error, never a panic.
        #[test]
        fn any_bytes_parse_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            for line in lines(&bytes) {
                let _ = parse_line(line);
            }
        }
    }
}
