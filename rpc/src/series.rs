//! Naming rules shared by the agent, the aggregator and the command line: what a metric
//! name, a tag and a series are, and their one canonical text form.
//!
//! A series is a metric plus its tags, sorted by key: `visitors{country=de,device=mobile}`.
//! Tags are fixed at ingest (DESIGN §2), so the same events always land in the same series
//! whatever order the tags arrived in. Every rule here is checked where input enters the
//! system, and each violation is an error that names the bound and the value.

use crate::proto::v1;
use thiserror::Error;

/// Longest metric name, in bytes.
pub const MAX_METRIC_LEN: usize = 200;
/// Longest tag key, in bytes.
pub(crate) const MAX_TAG_KEY_LEN: usize = 64;
/// Longest tag value, in bytes.
pub(crate) const MAX_TAG_VALUE_LEN: usize = 256;
/// Most tags on one series.
pub const MAX_TAGS: usize = 16;
/// Longest server name, in bytes: a DNS name's limit, since the default is the hostname.
pub const MAX_SERVER_NAME_LEN: usize = 253;

/// Why a metric name, tag or series is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// The metric name is empty.
    #[error("metric name is empty")]
    EmptyMetric,
    /// The metric name is longer than [`MAX_METRIC_LEN`].
    #[error("metric name is {len} bytes, longer than the limit of {MAX_METRIC_LEN}")]
    MetricTooLong {
        /// Its length.
        len: usize,
    },
    /// The metric name has a character outside `[A-Za-z0-9_.:-]` or starts with a
    /// non-letter.
    #[error(
        "metric name {name:?} is invalid: it must start with a letter or '_' and contain only letters, digits, '_', '.', ':' or '-'"
    )]
    BadMetric {
        /// The name given.
        name: String,
    },
    /// A tag key is empty, too long, or has a character outside `[A-Za-z0-9_.-]`.
    #[error(
        "tag key {key:?} is invalid: 1 to {MAX_TAG_KEY_LEN} bytes of letters, digits, '_', '.' or '-'"
    )]
    BadTagKey {
        /// The key given.
        key: String,
    },
    /// A tag value is too long or holds a character that the text forms use as a
    /// separator (`,` `|` `{` `}` `=`) or a control character.
    #[error(
        "tag value {value:?} of {key:?} is invalid: at most {MAX_TAG_VALUE_LEN} bytes, without ',', '|', '{{', '}}', '=' or control characters"
    )]
    BadTagValue {
        /// The tag's key.
        key: String,
        /// The value given.
        value: String,
    },
    /// The same tag key appears twice.
    #[error("tag {key:?} appears more than once")]
    DuplicateTag {
        /// The repeated key.
        key: String,
    },
    /// More than [`MAX_TAGS`] tags.
    #[error("{count} tags, more than the limit of {MAX_TAGS}")]
    TooManyTags {
        /// How many were given.
        count: usize,
    },
    /// A server name is empty, longer than [`MAX_SERVER_NAME_LEN`], or holds a control
    /// character or a separator of the text forms (`,` `|` `{` `}` `=`).
    #[error(
        "server name {name:?} is invalid: 1 to {MAX_SERVER_NAME_LEN} bytes (it is {len}), without ',', '|', '{{', '}}', '=' or control characters"
    )]
    BadServerName {
        /// The name given.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A `k=v` pair without `=`, or a series text form that does not parse.
    #[error("cannot parse {text:?}: {reason}")]
    Syntax {
        /// The text given.
        text: String,
        /// What was expected.
        reason: &'static str,
    },
}

/// Checks a metric name.
pub fn validate_metric(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::EmptyMetric);
    }
    if name.len() > MAX_METRIC_LEN {
        return Err(NameError::MetricTooLong { len: name.len() });
    }
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(NameError::BadMetric {
            name: name.to_string(),
        })
    }
}

/// Checks one tag.
pub fn validate_tag(key: &str, value: &str) -> Result<(), NameError> {
    let key_ok = !key.is_empty()
        && key.len() <= MAX_TAG_KEY_LEN
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !key_ok {
        return Err(NameError::BadTagKey {
            key: key.to_string(),
        });
    }
    let value_ok = value.len() <= MAX_TAG_VALUE_LEN
        && !value
            .chars()
            .any(|c| c.is_control() || matches!(c, ',' | '|' | '{' | '}' | '='));
    if !value_ok {
        return Err(NameError::BadTagValue {
            key: key.to_string(),
            value: value.to_string(),
        });
    }
    Ok(())
}

/// Checks a server name: the one rule for the agent (at start, for `--server-name` or
/// the hostname) and the aggregator (for every push), so a name one accepts the other
/// never refuses.
pub fn validate_server_name(name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SERVER_NAME_LEN
        && !name
            .chars()
            .any(|c| c.is_control() || matches!(c, ',' | '|' | '{' | '}' | '='));
    if ok {
        Ok(())
    } else {
        Err(NameError::BadServerName {
            name: name.to_string(),
            len: name.len(),
        })
    }
}

/// Parses `key=value` (as given to `--tag` and `--label`).
pub fn parse_pair(text: &str) -> Result<(String, String), NameError> {
    let (key, value) = text.split_once('=').ok_or_else(|| NameError::Syntax {
        text: text.to_string(),
        reason: "expected key=value",
    })?;
    validate_tag(key, value)?;
    Ok((key.to_string(), value.to_string()))
}

/// A metric and its tags, sorted by key: the identity of what a sketch counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Series {
    metric: String,
    tags: Vec<(String, String)>,
}

impl Series {
    /// A series from a metric and tags in any order; checks every rule.
    pub fn new(
        metric: impl Into<String>,
        tags: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Series, NameError> {
        let metric = metric.into();
        validate_metric(&metric)?;
        let mut tags: Vec<(String, String)> = tags.into_iter().collect();
        if tags.len() > MAX_TAGS {
            return Err(NameError::TooManyTags { count: tags.len() });
        }
        for (k, v) in &tags {
            validate_tag(k, v)?;
        }
        tags.sort();
        if let Some(w) = tags.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(NameError::DuplicateTag {
                key: w[0].0.clone(),
            });
        }
        Ok(Series { metric, tags })
    }

    /// The metric name.
    pub fn metric(&self) -> &str {
        &self.metric
    }

    /// The tags, sorted by key, each key once.
    pub fn tags(&self) -> &[(String, String)] {
        &self.tags
    }

    /// The value of one tag, if the series has it.
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| self.tags[i].1.as_str())
    }

    /// Whether the series has every one of `filters` with the same value.
    pub fn matches(&self, filters: &[(String, String)]) -> bool {
        filters.iter().all(|(k, v)| self.tag(k) == Some(v.as_str()))
    }

    /// Parses the canonical text form, `metric` or `metric{k=v,k2=v2}`.
    pub fn parse(text: &str) -> Result<Series, NameError> {
        let syntax = |reason| NameError::Syntax {
            text: text.to_string(),
            reason,
        };
        let Some((metric, rest)) = text.split_once('{') else {
            return Series::new(text, []);
        };
        let inner = rest
            .strip_suffix('}')
            .ok_or_else(|| syntax("expected '}' at the end"))?;
        let tags = if inner.is_empty() {
            Vec::new()
        } else {
            inner
                .split(',')
                .map(parse_pair)
                .collect::<Result<Vec<_>, _>>()?
        };
        Series::new(metric, tags)
    }
}

impl std::fmt::Display for Series {
    /// The canonical text form: `visitors{country=de,device=mobile}`, or the bare metric
    /// without tags. Parsing it gives the same series back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.metric)?;
        if !self.tags.is_empty() {
            f.write_str("{")?;
            for (i, (k, v)) in self.tags.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{k}={v}")?;
            }
            f.write_str("}")?;
        }
        Ok(())
    }
}

impl From<&Series> for v1::Series {
    fn from(s: &Series) -> Self {
        v1::Series {
            metric: s.metric.clone(),
            tags: s
                .tags
                .iter()
                .map(|(key, value)| v1::Tag {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

impl TryFrom<&v1::Series> for Series {
    type Error = NameError;

    fn try_from(s: &v1::Series) -> Result<Self, Self::Error> {
        Series::new(
            s.metric.clone(),
            s.tags.iter().map(|t| (t.key.clone(), t.value.clone())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_have_one_rule() {
        for good in [
            "web-1",
            "ip-10-0-0-1.eu-west-1.compute.internal",
            "a",
            &"x".repeat(253),
        ] {
            assert_eq!(validate_server_name(good), Ok(()), "{good:?}");
        }
        // 254 to 256 bytes passed the agent's old tag-value rule and were refused by the
        // aggregator on every push.
        for len in [254, 255, 256, 300] {
            let e = validate_server_name(&"x".repeat(len)).unwrap_err();
            assert!(e.to_string().contains(&format!("it is {len}")), "{e}");
        }
        for bad in ["", "a,b", "a|b", "a{b", "a}b", "a=b", "a\nb", "a\u{7f}"] {
            assert!(validate_server_name(bad).is_err(), "{bad:?}");
        }
    }

    fn tags(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn tags_are_sorted_so_order_does_not_matter() {
        let a = Series::new("visitors", tags(&[("device", "mobile"), ("country", "de")])).unwrap();
        let b = Series::new("visitors", tags(&[("country", "de"), ("device", "mobile")])).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "visitors{country=de,device=mobile}");
        assert_eq!(a.tag("device"), Some("mobile"));
        assert_eq!(a.tag("os"), None);
        assert!(a.matches(&tags(&[("country", "de")])));
        assert!(!a.matches(&tags(&[("country", "fr")])));
        assert!(a.matches(&[]));
    }

    #[test]
    fn text_form_round_trips() {
        for text in ["visitors", "http.requests{method=GET,path=/cart}", "x{a=}"] {
            let s = Series::parse(text).unwrap();
            assert_eq!(s.to_string(), text);
            let wire = v1::Series::from(&s);
            assert_eq!(Series::try_from(&wire).unwrap(), s);
        }
        assert_eq!(Series::parse("m{}").unwrap().to_string(), "m");
    }

    #[test]
    fn every_rule_names_what_is_wrong() {
        assert_eq!(validate_metric(""), Err(NameError::EmptyMetric));
        assert!(matches!(
            validate_metric(&"a".repeat(201)),
            Err(NameError::MetricTooLong { len: 201 })
        ));
        assert!(matches!(
            validate_metric("9lives"),
            Err(NameError::BadMetric { .. })
        ));
        assert!(matches!(
            validate_metric("a b"),
            Err(NameError::BadMetric { .. })
        ));
        assert!(validate_metric("_ok.name:sub-1").is_ok());
        assert!(matches!(
            validate_tag("", "v"),
            Err(NameError::BadTagKey { .. })
        ));
        assert!(matches!(
            validate_tag("k", "a,b"),
            Err(NameError::BadTagValue { .. })
        ));
        assert!(matches!(
            validate_tag("k", "a\nb"),
            Err(NameError::BadTagValue { .. })
        ));
        let dup = Series::new("m", tags(&[("a", "1"), ("a", "2")])).unwrap_err();
        assert_eq!(dup.to_string(), "tag \"a\" appears more than once");
        let many: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(
            Series::new("m", many).unwrap_err(),
            NameError::TooManyTags { count: 17 }
        );
        assert!(matches!(
            parse_pair("novalue"),
            Err(NameError::Syntax { .. })
        ));
        assert!(matches!(
            Series::parse("m{a=1"),
            Err(NameError::Syntax { .. })
        ));
    }
}
