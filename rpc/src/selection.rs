//! What a question selects, as people write it: `hourglass query`'s flags and the
//! aggregator's HTTP query string (`/api/v1/distinct?metric=…&from=-7d&group_by=day`)
//! are both a [`Selection`], and [`Selection::selector`] is the one reading of it into the
//! wire's [`v1::Selector`]: the same defaults (the last 24 hours), the same time forms
//! ([`crate::time::parse_time`]), the same `key=value` pairs and groupings.
//!
//! The metric is passed on as given: the aggregator checks it (and every other field)
//! again, and its refusal is the answer the caller sees.

use chrono::{DateTime, Utc};
use thiserror::Error;

use crate::proto::v1;
use crate::series::parse_pair;
use crate::time::{TimeError, hour_of, hour_range, parse_time};

/// The start of a selection when none is given: 24 hours before now.
pub const DEFAULT_FROM: &str = "-24h";
/// The end of a selection when none is given: now (its hour included).
pub const DEFAULT_TO: &str = "now";

/// Which series, hours and servers to merge, and how to split the answer, in the text
/// forms users write; `hourglass query` takes it as flags.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Selection {
    /// The metric, such as `visitors`.
    #[arg(long, env = "HOURGLASS_METRIC")]
    pub metric: String,
    /// Only series with this tag (`key=value`); repeat for several.
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// Start of the range: RFC 3339, a date, `now`, or relative (`-7d`, `-36h`). Rounded
    /// down to its hour.
    #[arg(long, default_value = DEFAULT_FROM, allow_hyphen_values = true)]
    pub from: String,
    /// End of the range (exclusive), same forms; rounded up to its hour, so `now`
    /// includes the hour in progress.
    #[arg(long, default_value = DEFAULT_TO, allow_hyphen_values = true)]
    pub to: String,
    /// Only servers whose name matches this glob (`web-*`); repeat for several.
    #[arg(long = "server", value_name = "GLOB")]
    pub servers: Vec<String>,
    /// Only servers with this label (`region=eu`); repeat for several (all must match).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Split the answer: server, hour, day, or tag:KEY.
    #[arg(long, value_name = "server|hour|day|tag:KEY")]
    pub group_by: Option<String>,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            metric: String::new(),
            tags: Vec::new(),
            from: DEFAULT_FROM.to_string(),
            to: DEFAULT_TO.to_string(),
            servers: Vec::new(),
            labels: Vec::new(),
            group_by: None,
        }
    }
}

/// How the fields of a [`Selection`] are spelled where it was written, for errors that
/// name what to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// Command-line flags: `--from`, `--group-by`.
    Flags,
    /// Query-string parameters: `from`, `group_by`.
    Parameters,
}

/// A field of a [`Selection`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `metric`.
    Metric,
    /// `tag`.
    Tag,
    /// `from`.
    From,
    /// `to`.
    To,
    /// `server`.
    Server,
    /// `label`.
    Label,
    /// `group_by`.
    GroupBy,
}

impl Field {
    /// The field's name as `spelling` writes it.
    pub fn name(self, spelling: Spelling) -> &'static str {
        let (flag, parameter) = match self {
            Field::Metric => ("--metric", "metric"),
            Field::Tag => ("--tag", "tag"),
            Field::From => ("--from", "from"),
            Field::To => ("--to", "to"),
            Field::Server => ("--server", "server"),
            Field::Label => ("--label", "label"),
            Field::GroupBy => ("--group-by", "group_by"),
        };
        match spelling {
            Spelling::Flags => flag,
            Spelling::Parameters => parameter,
        }
    }
}

/// A field of a [`Selection`] that cannot be read; shows as `NAME: PROBLEM`, the name
/// spelled as the caller wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}: {problem}", field.name(*spelling))]
pub struct SelectionError {
    /// The field.
    pub field: Field,
    /// How the caller spells it.
    pub spelling: Spelling,
    /// What is wrong, quoting the value.
    pub problem: String,
}

/// Reads a grouping as users write it: `server`, `hour`, `day`, `tag:KEY`, or `none`.
pub fn parse_group_by(text: &str) -> Result<(v1::GroupBy, String), String> {
    match text {
        "none" => Ok((v1::GroupBy::None, String::new())),
        "server" => Ok((v1::GroupBy::Server, String::new())),
        "hour" => Ok((v1::GroupBy::Hour, String::new())),
        "day" => Ok((v1::GroupBy::Day, String::new())),
        other => match other.strip_prefix("tag:") {
            Some(key) if !key.is_empty() => Ok((v1::GroupBy::Tag, key.to_string())),
            _ => Err(format!("{other:?}: expected server, hour, day or tag:KEY")),
        },
    }
}

impl Selection {
    /// The wire selector of this selection, relative times counted back from `now`; an
    /// error names the field as `spelling` writes it.
    pub fn selector(
        &self,
        now: DateTime<Utc>,
        spelling: Spelling,
    ) -> Result<v1::Selector, SelectionError> {
        let error = |field, problem: String| SelectionError {
            field,
            spelling,
            problem,
        };
        let pairs = |texts: &[String], field| -> Result<Vec<v1::Tag>, SelectionError> {
            texts
                .iter()
                .map(|t| {
                    let (key, value) = parse_pair(t).map_err(|e| error(field, e.to_string()))?;
                    Ok(v1::Tag { key, value })
                })
                .collect()
        };
        let from = parse_time(&self.from, now).map_err(|e| error(Field::From, e.to_string()))?;
        let to = parse_time(&self.to, now).map_err(|e| error(Field::To, e.to_string()))?;
        let hours = hour_range(from, to).map_err(|e| {
            // Out of range is whichever end is; an empty range is the end's fault.
            let field = match e {
                TimeError::OutOfRange { .. } if hour_of(from.timestamp()).is_none() => Field::From,
                _ => Field::To,
            };
            error(field, e.to_string())
        })?;
        let (group_by, group_tag) = match self.group_by.as_deref() {
            None => (v1::GroupBy::None, String::new()),
            Some(text) => parse_group_by(text).map_err(|e| error(Field::GroupBy, e))?,
        };
        Ok(v1::Selector {
            metric: self.metric.clone(),
            tags: pairs(&self.tags, Field::Tag)?,
            range: Some(v1::TimeRange {
                start_hour: hours.start,
                end_hour: hours.end,
            }),
            servers: self.servers.clone(),
            labels: pairs(&self.labels, Field::Label)?,
            group_by: group_by as i32,
            group_tag,
        })
    }
}

/// The hours of a retention period as users write it: `day`, `week`, or a number of
/// hours, days or weeks (`12h`, `2d`, `4w`).
pub fn parse_period(text: &str) -> Result<u32, String> {
    let bad = || {
        format!("{text:?}: expected day, week, or a number of hours, days or weeks (12h, 2d, 4w)")
    };
    let hours = match text {
        "day" => 24,
        "week" => 168,
        _ => {
            let split = text.len().checked_sub(1).ok_or_else(bad)?;
            if !text.is_char_boundary(split) {
                return Err(bad());
            }
            let (number, unit) = text.split_at(split);
            let unit_hours: u32 = match unit {
                "h" => 1,
                "d" => 24,
                "w" => 168,
                _ => return Err(bad()),
            };
            // Digits only: `u32`'s parser would take a leading `+` too.
            if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let n: u32 = number.parse().map_err(|_| bad())?;
            n.checked_mul(unit_hours).ok_or_else(bad)?
        }
    };
    if hours == 0 {
        return Err(bad());
    }
    Ok(hours)
}

/// Selection B of an overlap question: selection A with what these fields replace
/// (`hourglass query overlap --vs-from -14d --vs-to -7d`, `/api/v1/overlap?vs_server=api-*`).
#[derive(Debug, Default, Clone, PartialEq, Eq, clap::Args)]
pub struct VsSelection {
    /// overlap: B's metric (default: the --metric of A).
    #[arg(id = "vs_metric", long = "vs-metric", value_name = "METRIC")]
    pub metric: Option<String>,
    /// overlap: B's tags (`key=value`, repeat), in place of A's --tag.
    #[arg(id = "vs_tag", long = "vs-tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// overlap: B's start, in place of A's --from (same forms).
    #[arg(id = "vs_from", long = "vs-from", allow_hyphen_values = true)]
    pub from: Option<String>,
    /// overlap: B's end, in place of A's --to (same forms).
    #[arg(id = "vs_to", long = "vs-to", allow_hyphen_values = true)]
    pub to: Option<String>,
    /// overlap: B's server globs (repeat), in place of A's --server; `*` for every server.
    #[arg(id = "vs_server", long = "vs-server", value_name = "GLOB")]
    pub servers: Vec<String>,
    /// overlap: B's labels (`region=us`, repeat), in place of A's --label.
    #[arg(id = "vs_label", long = "vs-label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
}

impl VsSelection {
    /// Whether this replaces nothing (B would be A).
    pub fn is_empty(&self) -> bool {
        *self == VsSelection::default()
    }

    /// Selection B: `a` with what this replaces, ungrouped.
    pub fn apply(&self, a: &Selection) -> Selection {
        let replaced = |theirs: &Vec<String>, ours: &Vec<String>| {
            if theirs.is_empty() {
                ours.clone()
            } else {
                theirs.clone()
            }
        };
        Selection {
            metric: self.metric.clone().unwrap_or_else(|| a.metric.clone()),
            tags: replaced(&self.tags, &a.tags),
            from: self.from.clone().unwrap_or_else(|| a.from.clone()),
            to: self.to.clone().unwrap_or_else(|| a.to.clone()),
            servers: replaced(&self.servers, &a.servers),
            labels: replaced(&self.labels, &a.labels),
            group_by: None,
        }
    }

    /// Selection B's wire selector; an error names B's field as `spelling` writes it
    /// (`--vs-from`, `vs_from`), the field a caller changes for B.
    pub fn selector(
        &self,
        a: &Selection,
        now: DateTime<Utc>,
        spelling: Spelling,
    ) -> Result<v1::Selector, String> {
        self.apply(a).selector(now, spelling).map_err(|e| {
            let name = e.field.name(spelling);
            let vs = match spelling {
                Spelling::Flags => format!("--vs-{}", name.trim_start_matches("--")),
                Spelling::Parameters => format!("vs_{name}"),
            };
            format!("{vs}: {}", e.problem)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().expect("an RFC 3339 time")
    }

    #[test]
    fn defaults_are_the_last_24_hours_ungrouped() {
        let now = at("2026-12-01T10:30:00Z");
        let s = Selection {
            metric: "visitors".into(),
            ..Selection::default()
        }
        .selector(now, Spelling::Flags)
        .unwrap();
        let range = s.range.unwrap();
        // -24h rounds down to 10:00 the day before, now up to 11:00.
        assert_eq!(range.end_hour - range.start_hour, 25);
        assert_eq!(
            crate::time::format_hour(range.start_hour),
            "2026-11-30T10:00Z"
        );
        assert_eq!(s.group_by, v1::GroupBy::None as i32);
        assert_eq!(s.metric, "visitors");
    }

    #[test]
    fn every_field_converts() {
        let s = Selection {
            metric: "pages".into(),
            tags: vec!["device=mobile".into()],
            from: "2026-11-23".into(),
            to: "2026-11-24T00:00:00Z".into(),
            servers: vec!["web-*".into()],
            labels: vec!["region=eu".into()],
            group_by: Some("tag:device".into()),
        }
        .selector(at("2026-12-01T00:00:00Z"), Spelling::Parameters)
        .unwrap();
        assert_eq!(s.tags[0].key, "device");
        assert_eq!(s.labels[0].value, "eu");
        assert_eq!(s.servers, vec!["web-*".to_string()]);
        let range = s.range.unwrap();
        assert_eq!(range.end_hour - range.start_hour, 24);
        assert_eq!((s.group_by, s.group_tag.as_str()), (4, "device"));
        for (text, grouping) in [
            ("none", v1::GroupBy::None),
            ("server", v1::GroupBy::Server),
            ("hour", v1::GroupBy::Hour),
            ("day", v1::GroupBy::Day),
        ] {
            assert_eq!(parse_group_by(text).unwrap(), (grouping, String::new()));
        }
    }

    #[test]
    fn periods_read_as_hours() {
        assert_eq!(parse_period("day"), Ok(24));
        assert_eq!(parse_period("week"), Ok(168));
        assert_eq!(parse_period("12h"), Ok(12));
        assert_eq!(parse_period("2d"), Ok(48));
        assert_eq!(parse_period("4w"), Ok(672));
        for bad in [
            "",
            "0h",
            "h",
            "month",
            "-1d",
            "+1d",
            "99999999999h",
            "1y",
            "1é",
        ] {
            let e = parse_period(bad).unwrap_err();
            assert!(e.contains("expected day, week"), "{bad}: {e}");
        }
    }

    #[test]
    fn b_is_a_with_what_vs_replaces_and_its_errors_name_the_vs_field() {
        let a = Selection {
            metric: "visitors".into(),
            tags: vec!["page=home".into()],
            from: "-7d".into(),
            to: "now".into(),
            servers: vec!["web-*".into()],
            labels: vec!["region=eu".into()],
            group_by: Some("day".into()),
        };
        let vs = VsSelection {
            from: Some("-14d".into()),
            to: Some("-7d".into()),
            servers: vec!["api-*".into()],
            ..VsSelection::default()
        };
        assert!(!vs.is_empty() && VsSelection::default().is_empty());
        let b = vs.apply(&a);
        assert_eq!(b.metric, "visitors");
        assert_eq!(b.tags, a.tags);
        assert_eq!((b.from.as_str(), b.to.as_str()), ("-14d", "-7d"));
        assert_eq!(b.servers, vec!["api-*".to_string()]);
        assert_eq!(b.labels, a.labels);
        assert_eq!(b.group_by, None);
        let now = at("2026-12-01T00:00:00Z");
        let b = vs.selector(&a, now, Spelling::Flags).unwrap();
        assert_eq!(
            b.range.unwrap().end_hour - b.range.unwrap().start_hour,
            7 * 24
        );
        let bad = VsSelection {
            from: Some("yesterday".into()),
            ..VsSelection::default()
        };
        let e = bad.selector(&a, now, Spelling::Flags).unwrap_err();
        assert!(e.starts_with("--vs-from: cannot read time"), "{e}");
        let e = bad.selector(&a, now, Spelling::Parameters).unwrap_err();
        assert!(e.starts_with("vs_from: cannot read time"), "{e}");
    }

    #[test]
    fn errors_name_the_field_as_the_caller_spells_it() {
        let now = at("2026-12-01T00:00:00Z");
        let bad = |edit: &dyn Fn(&mut Selection), spelling| {
            let mut s = Selection {
                metric: "visitors".into(),
                ..Selection::default()
            };
            edit(&mut s);
            s.selector(now, spelling).unwrap_err().to_string()
        };
        let e = bad(&|s| s.from = "yesterday".into(), Spelling::Flags);
        assert!(
            e.starts_with("--from: cannot read time \"yesterday\""),
            "{e}"
        );
        let e = bad(&|s| s.from = "yesterday".into(), Spelling::Parameters);
        assert!(e.starts_with("from: cannot read time"), "{e}");
        let e = bad(&|s| s.group_by = Some("week".into()), Spelling::Flags);
        assert!(e.starts_with("--group-by: \"week\": expected"), "{e}");
        let e = bad(&|s| s.group_by = Some("tag:".into()), Spelling::Parameters);
        assert!(e.starts_with("group_by: "), "{e}");
        let e = bad(&|s| s.tags.push("nokey".into()), Spelling::Parameters);
        assert!(e.starts_with("tag: cannot parse \"nokey\""), "{e}");
        let e = bad(&|s| s.labels.push("a b=c".into()), Spelling::Flags);
        assert!(e.starts_with("--label: tag key \"a b\""), "{e}");
        let e = bad(
            &|s| {
                s.from = "2026-11-24".into();
                s.to = "2026-11-23".into();
            },
            Spelling::Parameters,
        );
        assert!(e.starts_with("to: empty time range: the end ("), "{e}");
        let e = bad(&|s| s.from = "1960-01-01".into(), Spelling::Flags);
        assert!(e.starts_with("--from: time "), "{e}");
    }
}
