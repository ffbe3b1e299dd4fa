//! The agent's configuration: identity and listeners from the command line, everything
//! else from an optional TOML file, with a default for every field.
//!
//! ```toml
//! flush_interval = "10s"                   # how often changed sketches are shipped and checkpointed
//! lateness = "1h"                          # how long an hour stays open after it ends
//! default_kinds = ["distinct", "frequency"] # kinds of metrics not listed under [metrics]
//!
//! [defaults]              # parameters of each kind, unless a metric says otherwise
//! distinct_form = "ull"   # distinct: "ull" (UltraLogLog: RSE 0.761/sqrt(2^p), 2^p bytes) or "hll" (HyperLogLog: RSE 1.04/sqrt(2^p), 0.75·2^p bytes)
//! # precision = 13        # distinct: precision p (4..=18); unset (the default), 13 for ull (0.84%, 8 KiB) and 14 for hll (0.81%, 12 KiB)
//! epsilon = 0.001         # frequency: overcount at most epsilon·N ...
//! delta = 0.01            # ... with probability 1 - delta
//! capacity = 100000       # membership: items per (series, hour) the Bloom filter is sized for
//! fpr = 0.01              # membership: false-positive rate at that capacity
//!
//! [metrics.visitors]      # per-metric settings; every field optional
//! kinds = ["distinct", "membership"]
//! distinct_form = "hll"   # rows already stored as HyperLogLog merge with UltraLogLog ones either way
//! precision = 16
//! allowed_tags = ["country", "device"] # other tag keys are dropped (and counted)
//!
//! [metrics.users]         # membership sized for the question, not the filter:
//! kinds = ["membership"]
//! capacity = 2000         # distinct items per server-hour
//! membership_range = "7d" # the range "was it seen?" asks about (whole hours)
//! membership_servers = 6  # servers it asks over
//! membership_range_fpr = 0.05 # chance that an item seen nowhere in that range comes back "maybe"
//!
//! [limits]
//! max_series = 10000      # active series held at once
//! max_tags = 16           # tags per series
//! max_item_len = 1024     # bytes per item
//! max_metric_len = 200    # bytes per metric name
//! max_events_per_request = 100000 # events per Ingest call
//! max_future = "5m"       # events further ahead of the clock are rejected
//!
//! [shipping]
//! max_batch_mib = 4       # encoded sketches per Push, at most (up to 64, the aggregator's default message limit)
//! max_snapshots_per_push = 1000 # snapshots per Push, at most (the aggregator refuses more than its limit)
//! max_live_hours_per_push = 10000 # live hours per Push, at most (fewer are sent while the aggregator refuses that many)
//! push_timeout = "30s"    # one Push call, at most
//! backoff_initial = "1s"  # first retry delay after a failed push ...
//! backoff_max = "60s"     # ... doubling up to this, with jitter
//! shutdown_timeout = "10s" # the final flush on SIGTERM, at most
//! max_backlog_mib = 256   # unacknowledged sketches of closed hours held, at most; beyond it the oldest are dropped (and counted)
//! compression = "none"    # pushes on the wire: "none", or "zstd" (about half the bytes, for a WAN or metered link)
//! ```
//!
//! Durations are a whole number and a unit: `ms`, `s`, `m`, `h` or `d`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use hourglass_rpc::config::{FileError, read_file};
use hourglass_rpc::series::{MAX_METRIC_LEN, MAX_TAGS};
use hourglass_rpc::time::deserialize_duration;
use hourglass_sketch::Sketch;
use hourglass_sketch::bloom::Bloom;
use hourglass_sketch::distinct::{Distinct, DistinctForm};
use hourglass_sketch::format::Kind;
use hourglass_sketch::frequency::{Frequency, FrequencyParams};
use hourglass_sketch::frequent::MAX_ITEM_LEN;
use hourglass_sketch::membership::RangeSizing;
use serde::{Deserialize, Deserializer};
use thiserror::Error;

/// Everything the agent reads from its file (the command line overrides some fields).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// How often changed sketches are shipped and the checkpoint written.
    #[serde(deserialize_with = "deserialize_duration")]
    pub flush_interval: Duration,
    /// How long an hour accepts events after it ends.
    #[serde(deserialize_with = "deserialize_duration")]
    pub lateness: Duration,
    /// Kinds kept for metrics that `metrics` does not list.
    #[serde(deserialize_with = "kinds")]
    pub default_kinds: Vec<Kind>,
    /// Parameters of each kind when a metric does not set them.
    pub defaults: KindParams,
    /// Per-metric settings.
    pub metrics: BTreeMap<String, MetricConfig>,
    /// Bounds on what the agent accepts.
    pub limits: Limits,
    /// How snapshots travel to the aggregator.
    pub shipping: Shipping,
}

/// The parameters of the three kinds.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KindParams {
    /// Distinct: which sketch new distinct series keep, `"ull"` (UltraLogLog, the
    /// default: about 28% fewer bytes than HyperLogLog at the same error) or `"hll"`
    /// (HyperLogLog). Changing it is safe: the aggregator merges rows of both forms, a
    /// range that holds any HyperLogLog row answering as HyperLogLog (with its error).
    #[serde(deserialize_with = "distinct_form")]
    pub distinct_form: DistinctForm,
    /// Distinct: precision p of either form (`2^p` registers). Unset, the form's own
    /// ([`DistinctForm::default_precision`]: 13 for UltraLogLog, 14 for HyperLogLog,
    /// about the same error).
    pub precision: Option<u8>,
    /// Frequency: relative error ε.
    pub epsilon: f64,
    /// Frequency: failure probability δ.
    pub delta: f64,
    /// Membership: designed capacity per (series, hour).
    pub capacity: u64,
    /// Membership: false-positive rate at capacity.
    pub fpr: f64,
}

impl Default for KindParams {
    fn default() -> Self {
        KindParams {
            distinct_form: DistinctForm::Ull,
            precision: None,
            epsilon: hourglass_sketch::frequency::DEFAULT_EPSILON,
            delta: hourglass_sketch::frequency::DEFAULT_DELTA,
            capacity: 100_000,
            fpr: 0.01,
        }
    }
}

/// `[metrics.NAME]`: what one metric keeps. Unset fields fall back to the defaults.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricConfig {
    /// Kinds kept; `default_kinds` if unset.
    #[serde(deserialize_with = "some_kinds")]
    pub(crate) kinds: Option<Vec<Kind>>,
    /// Distinct: the sketch's form, `"ull"` or `"hll"`.
    #[serde(deserialize_with = "some_distinct_form")]
    pub(crate) distinct_form: Option<DistinctForm>,
    /// Distinct: precision.
    pub(crate) precision: Option<u8>,
    /// Frequency ε.
    pub(crate) epsilon: Option<f64>,
    /// Frequency δ.
    pub(crate) delta: Option<f64>,
    /// Bloom capacity.
    pub(crate) capacity: Option<u64>,
    /// Bloom false-positive rate.
    pub(crate) fpr: Option<f64>,
    /// Tag keys kept; any key if unset. Other keys are dropped from the event (and
    /// counted), so the event still counts in the coarser series.
    pub(crate) allowed_tags: Option<Vec<String>>,
    /// Membership: the range a lookup spans. With it, the Bloom filters are sized so
    /// that a lookup over `membership_servers` × the range's hours filters (one per
    /// server-hour, never merged: docs/DESIGN.md §5) answers "maybe" for an item seen
    /// nowhere with probability at most `membership_range_fpr`, each filter holding
    /// `capacity` items ([`RangeSizing::for_range`]).
    #[serde(deserialize_with = "some_duration")]
    pub(crate) membership_range: Option<Duration>,
    /// Membership: servers a lookup spans (default 1), with `membership_range`.
    pub(crate) membership_servers: Option<u64>,
    /// Membership: the false-positive probability of a whole range lookup (default
    /// 0.05), with `membership_range`.
    pub(crate) membership_range_fpr: Option<f64>,
}

/// The range a metric's membership lookups span, from `[metrics.NAME]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MembershipRange {
    /// Hours of the range.
    pub(crate) hours: u64,
    /// Servers.
    pub(crate) servers: u64,
    /// False-positive probability of a lookup over all of them.
    pub(crate) range_fpr: f64,
}

/// The default `membership_range_fpr`.
pub const DEFAULT_MEMBERSHIP_RANGE_FPR: f64 = 0.05;

impl MetricConfig {
    /// The membership range, if set; an error names the field at fault (relative to
    /// `[metrics.NAME]`) and what to write instead.
    pub(crate) fn membership_range(&self) -> Result<Option<MembershipRange>, (String, String)> {
        let err = |field: &str, message: String| Err((field.to_string(), message));
        let Some(range) = self.membership_range else {
            for (field, set) in [
                ("membership_servers", self.membership_servers.is_some()),
                ("membership_range_fpr", self.membership_range_fpr.is_some()),
            ] {
                if set {
                    return err(
                        field,
                        "needs membership_range: the range lookups span (e.g. \"7d\")".into(),
                    );
                }
            }
            return Ok(None);
        };
        let secs = range.as_secs();
        if range.subsec_nanos() != 0 || secs == 0 || !secs.is_multiple_of(3600) {
            return err(
                "membership_range",
                format!("is {range:?}; it must be a whole number of hours, at least 1h"),
            );
        }
        let hours = secs / 3600;
        if hours > 400 * 24 {
            return err("membership_range", format!("is {range:?}; at most 400d"));
        }
        let servers = self.membership_servers.unwrap_or(1);
        if !(1..=100_000).contains(&servers) {
            return err(
                "membership_servers",
                format!("is {servers}; it must be between 1 and 100000"),
            );
        }
        let range_fpr = self
            .membership_range_fpr
            .unwrap_or(DEFAULT_MEMBERSHIP_RANGE_FPR);
        if !(range_fpr > 0.0 && range_fpr < 1.0) {
            return err(
                "membership_range_fpr",
                format!("is {range_fpr}; it must be strictly between 0 and 1"),
            );
        }
        if self.fpr.is_some() {
            return err(
                "fpr",
                "is one filter's rate, which membership_range sets: give membership_range_fpr, the rate of a whole range lookup, instead".into(),
            );
        }
        if self
            .kinds
            .as_ref()
            .is_some_and(|k| !k.contains(&Kind::Membership))
        {
            return err(
                "membership_range",
                "is set but kinds does not keep membership".into(),
            );
        }
        Ok(Some(MembershipRange {
            hours,
            servers,
            range_fpr,
        }))
    }
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Series held at once.
    pub max_series: usize,
    /// Tags per series.
    pub(crate) max_tags: usize,
    /// Bytes per item.
    pub(crate) max_item_len: usize,
    /// Bytes per metric name.
    pub(crate) max_metric_len: usize,
    /// Events per Ingest request.
    pub(crate) max_events_per_request: usize,
    /// How far ahead of the clock an event may be.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) max_future: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_series: 10_000,
            max_tags: MAX_TAGS,
            max_item_len: 1024,
            max_metric_len: MAX_METRIC_LEN,
            max_events_per_request: 100_000,
            max_future: Duration::from_secs(300),
        }
    }
}

/// `[shipping]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Shipping {
    /// Encoded sketch bytes per Push.
    pub(crate) max_batch_mib: usize,
    /// Snapshots per Push.
    pub(crate) max_snapshots_per_push: usize,
    /// Live hours declared per Push; at most the aggregator's
    /// `limits.max_live_hours_per_push`, or pushes are refused and sent again smaller.
    pub(crate) max_live_hours_per_push: usize,
    /// Deadline of one Push.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) push_timeout: Duration,
    /// First retry delay.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) backoff_initial: Duration,
    /// Longest retry delay.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) backoff_max: Duration,
    /// Longest final flush at shutdown.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) shutdown_timeout: Duration,
    /// MiB of sketches of closed hours the aggregator has not acknowledged that the agent
    /// holds (and checkpoints) while the aggregator is away. Beyond it, entries are
    /// dropped oldest hour first, counted in `snapshots_dropped_total{reason="backlog_full"}`
    /// and logged once per episode. Open hours are bounded by `limits.max_series` instead.
    pub(crate) max_backlog_mib: u64,
    /// Compression of pushes (and of their replies) on the wire.
    pub(crate) compression: PushCompression,
}

/// How pushes travel: as they are, or zstd-compressed by gRPC.
///
/// None by default: the aggregator usually runs in the agents' own cluster, where the
/// bytes cost little and the agent's CPU is what every node pays. Measured with
/// `cargo bench --bench vs_redis` (docs/BENCHMARKS.md): compressing took 13% of the
/// agents' CPU, zstd at gRPC's level 3 with a new context per message, and the
/// aggregator's decompression more; it about halves the bytes of a dense sketch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PushCompression {
    /// As encoded: the default.
    #[default]
    None,
    /// zstd at gRPC's level, replies too.
    Zstd,
}

impl Default for Shipping {
    fn default() -> Self {
        Shipping {
            max_batch_mib: 4,
            max_snapshots_per_push: 1000,
            max_live_hours_per_push: 10_000,
            push_timeout: Duration::from_secs(30),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(10),
            max_backlog_mib: 256,
            compression: PushCompression::None,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            flush_interval: Duration::from_secs(10),
            lateness: Duration::from_secs(3600),
            default_kinds: vec![Kind::Distinct, Kind::Frequency],
            defaults: KindParams::default(),
            metrics: BTreeMap::new(),
            limits: Limits::default(),
            shipping: Shipping::default(),
        }
    }
}

/// A config file that cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file cannot be read, or is not valid TOML for this schema.
    #[error(transparent)]
    File(#[from] FileError),
    /// A field is out of its bounds.
    #[error("config: {field} {message}")]
    Invalid {
        /// The field, as written in the file.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// What a series of one metric keeps: the kinds and a ready sketch of each, cloned for
/// every new (series, hour).
#[derive(Debug, Clone)]
pub(crate) struct MetricSpec {
    /// One empty sketch per kind, in kind order.
    pub(crate) empty: Vec<Sketch>,
    /// Tag keys kept, sorted; `None` keeps all.
    pub(crate) allowed_tags: Option<Vec<String>>,
}

impl Config {
    /// Reads a TOML file; fields it leaves out keep their defaults.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        Ok(read_file(path, |text| toml::from_str(text))?)
    }

    /// Checks every field, including that every metric's sketches can be built.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_timing()?;
        self.limits.validate()?;
        self.shipping.validate_bounds()?;
        // Checked between the shipping bounds and their relations, as it always was, so
        // a config with several mistakes names the same one first.
        at_most(
            "limits.max_future",
            self.limits.max_future,
            Duration::from_secs(86_400),
        )?;
        self.shipping.validate_relations()?;
        self.validate_sketches()
    }

    /// The flush interval and the lateness window.
    fn validate_timing(&self) -> Result<(), ConfigError> {
        if self.flush_interval < Duration::from_millis(100) || self.flush_interval > HOUR {
            return Err(invalid(
                "flush_interval",
                format!(
                    "is {:?}; it must be between 100ms and 1h",
                    self.flush_interval
                ),
            ));
        }
        if self.lateness > Duration::from_secs(400 * 86_400) {
            return Err(invalid(
                "lateness",
                format!("is {:?}; at most 400d", self.lateness),
            ));
        }
        Ok(())
    }

    /// The default kinds, and that the defaults and every metric's settings make sketches.
    fn validate_sketches(&self) -> Result<(), ConfigError> {
        if self.default_kinds.is_empty() {
            return Err(invalid(
                "default_kinds",
                "must name at least one kind".into(),
            ));
        }
        self.spec_for("(defaults)")
            .map_err(|m| invalid("defaults", m))?;
        for (name, metric) in &self.metrics {
            hourglass_rpc::series::validate_metric(name)
                .map_err(|e| invalid(&format!("metrics.{name}"), e.to_string()))?;
            metric
                .membership_range()
                .map_err(|(field, m)| invalid(&format!("metrics.{name}.{field}"), m))?;
            self.spec_for(name)
                .map_err(|m| invalid(&format!("metrics.{name}"), m))?;
        }
        Ok(())
    }

    /// The batch byte bound in bytes.
    pub(crate) fn max_batch_bytes(&self) -> usize {
        self.shipping.max_batch_mib << 20
    }

    /// The backlog bound in bytes.
    pub(crate) fn max_backlog_bytes(&self) -> u64 {
        self.shipping.max_backlog_mib << 20
    }

    /// What series of `metric` keep; an error names the parameter that cannot be used.
    pub(crate) fn spec_for(&self, metric: &str) -> Result<MetricSpec, String> {
        let m = self.metrics.get(metric);
        let d = &self.defaults;
        let get =
            |f: fn(&MetricConfig) -> Option<f64>, default: f64| m.and_then(f).unwrap_or(default);
        let mut kinds = m
            .and_then(|m| m.kinds.clone())
            .unwrap_or_else(|| self.default_kinds.clone());
        kinds.sort_by_key(|k| *k as u8);
        kinds.dedup();
        if kinds.is_empty() {
            return Err("kinds must name at least one kind".into());
        }
        let mut empty = Vec::with_capacity(kinds.len());
        for kind in kinds {
            let sketch = match kind {
                Kind::Distinct => Sketch::Distinct({
                    let form = m.and_then(|m| m.distinct_form).unwrap_or(d.distinct_form);
                    Distinct::new(
                        form,
                        m.and_then(|m| m.precision)
                            .or(d.precision)
                            .unwrap_or(form.default_precision()),
                    )
                    .map_err(|e| e.to_string())?
                }),
                Kind::Frequency => {
                    let params = FrequencyParams::from_error(
                        get(|m| m.epsilon, d.epsilon),
                        get(|m| m.delta, d.delta),
                    )
                    .map_err(|e| e.to_string())?;
                    Sketch::Frequency(Frequency::new(params).map_err(|e| e.to_string())?)
                }
                Kind::Membership => {
                    let capacity = m.and_then(|m| m.capacity).unwrap_or(d.capacity);
                    let range = match m {
                        Some(m) => m
                            .membership_range()
                            .map_err(|(field, message)| format!("{field} {message}"))?,
                        None => None,
                    };
                    let filter = match range {
                        // Sized for the question: N = servers × hours filters per lookup.
                        Some(r) => RangeSizing::for_range(
                            r.servers.saturating_mul(r.hours),
                            capacity,
                            r.range_fpr,
                        )
                        .and_then(|sizing| sizing.new_filter()),
                        None => Bloom::new(capacity, get(|m| m.fpr, d.fpr)),
                    };
                    Sketch::Membership(filter.map_err(|e| e.to_string())?)
                }
            };
            empty.push(sketch);
        }
        let allowed_tags = m.and_then(|m| m.allowed_tags.clone()).map(|mut keys| {
            keys.sort();
            keys.dedup();
            keys
        });
        Ok(MetricSpec {
            empty,
            allowed_tags,
        })
    }
}

impl Limits {
    fn validate(&self) -> Result<(), ConfigError> {
        within("limits.max_series", self.max_series, 1..=10_000_000)?;
        within("limits.max_tags", self.max_tags, 0..=MAX_TAGS)?;
        within("limits.max_item_len", self.max_item_len, 1..=MAX_ITEM_LEN)?;
        within(
            "limits.max_metric_len",
            self.max_metric_len,
            1..=MAX_METRIC_LEN,
        )?;
        within(
            "limits.max_events_per_request",
            self.max_events_per_request,
            1..=10_000_000,
        )
    }
}

impl Shipping {
    /// Each shipping setting within its bounds.
    fn validate_bounds(&self) -> Result<(), ConfigError> {
        within("shipping.max_batch_mib", self.max_batch_mib, 1..=64)?;
        within(
            "shipping.max_snapshots_per_push",
            self.max_snapshots_per_push,
            1..=10_000,
        )?;
        within(
            "shipping.max_live_hours_per_push",
            self.max_live_hours_per_push,
            1..=1_000_000,
        )?;
        if !(1..=1 << 20).contains(&self.max_backlog_mib) {
            return Err(invalid(
                "shipping.max_backlog_mib",
                format!(
                    "is {}; it must be between 1 and 1048576 (1 TiB)",
                    self.max_backlog_mib
                ),
            ));
        }
        at_most("shipping.push_timeout", self.push_timeout, HOUR)?;
        at_most(
            "shipping.shutdown_timeout",
            self.shutdown_timeout,
            Duration::from_secs(600),
        )?;
        at_most("shipping.backoff_max", self.backoff_max, HOUR)
    }

    /// How the shipping settings must relate: backoff bounds in order, a push timeout.
    fn validate_relations(&self) -> Result<(), ConfigError> {
        if self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return Err(invalid(
                "shipping.backoff_max",
                "must be at least shipping.backoff_initial, which must be above zero".into(),
            ));
        }
        if self.push_timeout.is_zero() {
            return Err(invalid(
                "shipping.push_timeout",
                "must be above zero".into(),
            ));
        }
        Ok(())
    }
}

/// The error for `field`, saying what is wrong with its value.
fn invalid(field: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        message,
    }
}

/// `value` of `field` must lie in `range`.
fn within<T>(field: &str, value: T, range: std::ops::RangeInclusive<T>) -> Result<(), ConfigError>
where
    T: PartialOrd + std::fmt::Display,
{
    if range.contains(&value) {
        return Ok(());
    }
    Err(invalid(
        field,
        format!(
            "is {value}; it must be between {} and {}",
            range.start(),
            range.end()
        ),
    ))
}

/// Duration `value` of `field` must be at most `max`.
fn at_most(field: &str, value: Duration, max: Duration) -> Result<(), ConfigError> {
    if value > max {
        return Err(invalid(field, format!("is {value:?}; at most {max:?}")));
    }
    Ok(())
}

const HOUR: Duration = Duration::from_secs(3600);

/// Parses `distinct,frequency,membership` (as given to `--default-kinds`).
pub(crate) fn parse_kinds(text: &str) -> Result<Vec<Kind>, String> {
    text.split(',')
        .map(|name| parse_kind(name.trim()))
        .collect()
}

fn parse_kind(name: &str) -> Result<Kind, String> {
    match name {
        "distinct" => Ok(Kind::Distinct),
        "frequency" => Ok(Kind::Frequency),
        "membership" => Ok(Kind::Membership),
        other => Err(format!(
            "unknown sketch kind {other:?}: expected distinct, frequency or membership"
        )),
    }
}

fn kinds<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Kind>, D::Error> {
    let names = Vec::<String>::deserialize(deserializer)?;
    names
        .iter()
        .map(|n| parse_kind(n))
        .collect::<Result<_, _>>()
        .map_err(serde::de::Error::custom)
}

fn some_kinds<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Vec<Kind>>, D::Error> {
    kinds(deserializer).map(Some)
}

/// `"ull"` or `"hll"`; anything else is an error that says which names are accepted.
fn distinct_form<'de, D: Deserializer<'de>>(deserializer: D) -> Result<DistinctForm, D::Error> {
    let name = String::deserialize(deserializer)?;
    name.parse().map_err(serde::de::Error::custom)
}

fn some_distinct_form<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<DistinctForm>, D::Error> {
    distinct_form(deserializer).map(Some)
}

fn some_duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    deserialize_duration(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_documentation() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.flush_interval, Duration::from_secs(10));
        assert_eq!(c.lateness, HOUR);
        assert_eq!(c.default_kinds, vec![Kind::Distinct, Kind::Frequency]);
        // The aggregator's default limits.max_live_hours_per_push.
        assert_eq!(c.shipping.max_live_hours_per_push, 10_000);
        let spec = c.spec_for("anything").unwrap();
        let kinds: Vec<Kind> = spec.empty.iter().map(Sketch::kind).collect();
        assert_eq!(kinds, vec![Kind::Distinct, Kind::Frequency]);
        assert!(spec.allowed_tags.is_none());
        // The module documentation's example is the defaults plus one metric.
        let doc = include_str!("config.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .filter_map(|l| l.strip_prefix("//! "))
            .skip_while(|l| !l.starts_with("```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("```"))
            .collect::<Vec<_>>()
            .join("\n");
        let parsed: Config = toml::from_str(&doc).unwrap();
        let mut expected = Config::default();
        expected.metrics.insert(
            "visitors".into(),
            MetricConfig {
                kinds: Some(vec![Kind::Distinct, Kind::Membership]),
                distinct_form: Some(DistinctForm::Hll),
                precision: Some(16),
                allowed_tags: Some(vec!["country".into(), "device".into()]),
                ..MetricConfig::default()
            },
        );
        expected.metrics.insert(
            "users".into(),
            MetricConfig {
                kinds: Some(vec![Kind::Membership]),
                capacity: Some(2000),
                membership_range: Some(Duration::from_secs(7 * 86_400)),
                membership_servers: Some(6),
                membership_range_fpr: Some(0.05),
                ..MetricConfig::default()
            },
        );
        assert_eq!(parsed, expected);
        parsed.validate().unwrap();
    }

    #[test]
    fn a_membership_range_sizes_the_filters_for_the_whole_lookup() {
        let c: Config = toml::from_str(
            "[metrics.users]\nkinds = [\"membership\"]\ncapacity = 1300\nmembership_range = \"7d\"\nmembership_servers = 6\nmembership_range_fpr = 0.05\n",
        )
        .unwrap();
        c.validate().unwrap();
        let spec = c.spec_for("users").unwrap();
        let want = RangeSizing::for_range(6 * 168, 1300, 0.05).unwrap();
        match &spec.empty[..] {
            [Sketch::Membership(b)] => {
                assert_eq!((b.bits(), b.hashes()), (want.bits, want.hashes));
                assert_eq!(b.capacity(), 1300);
                // About 5.1e-5 per filter: 1 − 0.95^(1/1008).
                assert!(b.target_fpr() < 5.1e-5, "{}", b.target_fpr());
            }
            other => panic!("unexpected kinds {other:?}"),
        }
        // Servers default to 1 and the range rate to 5%.
        let c: Config = toml::from_str(
            "[metrics.u]\nkinds = [\"membership\"]\ncapacity = 100\nmembership_range = \"24h\"\n",
        )
        .unwrap();
        let spec = c.spec_for("u").unwrap();
        let want = RangeSizing::for_range(24, 100, DEFAULT_MEMBERSHIP_RANGE_FPR).unwrap();
        assert!(matches!(&spec.empty[..], [Sketch::Membership(b)] if b.bits() == want.bits));
    }

    #[test]
    fn membership_range_errors_name_the_field() {
        for (toml, field) in [
            ("membership_range = \"90m\"", "metrics.u.membership_range"),
            ("membership_range = \"0h\"", "metrics.u.membership_range"),
            (
                "membership_range = \"7d\"\nmembership_servers = 0",
                "metrics.u.membership_servers",
            ),
            (
                "membership_range = \"7d\"\nmembership_range_fpr = 1.0",
                "metrics.u.membership_range_fpr",
            ),
            (
                "membership_range = \"7d\"\nmembership_range_fpr = 0",
                "metrics.u.membership_range_fpr",
            ),
            ("membership_servers = 6", "metrics.u.membership_servers"),
            (
                "membership_range_fpr = 0.05",
                "metrics.u.membership_range_fpr",
            ),
            ("membership_range = \"7d\"\nfpr = 0.01", "metrics.u.fpr"),
        ] {
            let c: Config =
                toml::from_str(&format!("[metrics.u]\nkinds = [\"membership\"]\n{toml}\n"))
                    .unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{toml}: {e}");
        }
        let c: Config =
            toml::from_str("[metrics.u]\nkinds = [\"distinct\"]\nmembership_range = \"7d\"\n")
                .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("metrics.u.membership_range") && e.contains("kinds"),
            "{e}"
        );
        // A range too fine for a filter: the sizing's error, under the metric.
        let c: Config = toml::from_str(
            "[metrics.u]\nkinds = [\"membership\"]\ncapacity = 100000000\nmembership_range = \"400d\"\nmembership_servers = 100000\nmembership_range_fpr = 0.000001\n",
        )
        .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("metrics.u"), "{e}");
    }

    #[test]
    fn per_metric_settings_override_defaults() {
        let c: Config = toml::from_str(
            "[metrics.pages]\nkinds = [\"membership\", \"frequency\"]\nepsilon = 0.01\nfpr = 0.001\nallowed_tags = [\"b\", \"a\"]\n",
        )
        .unwrap();
        c.validate().unwrap();
        let spec = c.spec_for("pages").unwrap();
        match &spec.empty[..] {
            [Sketch::Frequency(f), Sketch::Membership(b)] => {
                assert_eq!(f.params(), FrequencyParams::from_error(0.01, 0.01).unwrap());
                assert_eq!(b.target_fpr(), 0.001);
            }
            other => panic!("unexpected kinds {other:?}"),
        }
        assert_eq!(spec.allowed_tags, Some(vec!["a".into(), "b".into()]));
    }

    #[test]
    fn distinct_form_defaults_to_ull_and_is_set_per_metric() {
        let form = |c: &Config, metric: &str| match &c.spec_for(metric).unwrap().empty[0] {
            Sketch::Distinct(d) => (d.form(), d.precision()),
            other => panic!("not distinct: {other:?}"),
        };
        let c = Config::default();
        assert_eq!(c.defaults.distinct_form, DistinctForm::Ull);
        assert_eq!(form(&c, "anything"), (DistinctForm::Ull, 13));
        let c: Config = toml::from_str(
            "[defaults]\ndistinct_form = \"hll\"\n[metrics.new]\ndistinct_form = \"ull\"\nprecision = 12\n[metrics.old]\nprecision = 16\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(form(&c, "new"), (DistinctForm::Ull, 12));
        assert_eq!(form(&c, "old"), (DistinctForm::Hll, 16));
        assert_eq!(form(&c, "unlisted"), (DistinctForm::Hll, 14));
        // An unknown form is refused at parse time, on its line, with the names accepted.
        for text in [
            "[defaults]\ndistinct_form = \"ultraloglog\"",
            "[metrics.v]\ndistinct_form = \"HLL\"",
        ] {
            let e = toml::from_str::<Config>(text).unwrap_err().to_string();
            assert!(
                e.contains("distinct_form")
                    && e.contains("expected \"hll\" (HyperLogLog) or \"ull\""),
                "{e}"
            );
        }
        assert!(toml::from_str::<Config>("[defaults]\ndistinct_form = 3").is_err());
    }

    #[test]
    fn errors_name_the_field() {
        let e = toml::from_str::<Config>("default_kinds = [\"sets\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown sketch kind \"sets\""), "{e}");
        let c: Config = toml::from_str("[metrics.v]\nprecision = 30").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("metrics.v") && e.contains("precision"), "{e}");
        let c: Config = toml::from_str("[limits]\nmax_item_len = 0").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("limits.max_item_len"), "{e}");
        for bad in [0, 1_000_001] {
            let c: Config =
                toml::from_str(&format!("[shipping]\nmax_live_hours_per_push = {bad}")).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("shipping.max_live_hours_per_push"), "{e}");
        }
        let c: Config = toml::from_str("[shipping]\nmax_backlog_mib = 0").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("shipping.max_backlog_mib"), "{e}");
        let c: Config = toml::from_str("[shipping]\nmax_live_hours_per_push = 3").unwrap();
        c.validate().unwrap();
        let c: Config = toml::from_str("[shipping]\ncompression = \"zstd\"").unwrap();
        assert_eq!(c.shipping.compression, PushCompression::Zstd);
        let e = toml::from_str::<Config>("[shipping]\ncompression = \"lz4\"").unwrap_err();
        assert!(
            e.to_string().contains("none") && e.to_string().contains("zstd"),
            "{e}"
        );
        let c: Config = toml::from_str("flush_interval = \"10ms\"").unwrap();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("flush_interval")
        );
        assert!(toml::from_str::<Config>("bogus = 1").is_err());
        assert_eq!(
            parse_kinds("distinct, membership").unwrap(),
            vec![Kind::Distinct, Kind::Membership]
        );
        assert!(parse_kinds("distinct,").is_err());
    }

    /// limits.max_future is checked after the shipping bounds and before their relations,
    /// as it always was: with two fields wrong, the same one is named first.
    #[test]
    fn max_future_is_checked_after_the_shipping_bounds_as_before() {
        let c: Config =
            toml::from_str("[limits]\nmax_future = \"2d\"\n[shipping]\nmax_batch_mib = 0\n")
                .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("shipping.max_batch_mib"), "{e}");
        let c: Config =
            toml::from_str("[limits]\nmax_future = \"2d\"\n[shipping]\npush_timeout = \"2h\"\n")
                .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("shipping.push_timeout"), "{e}");
    }
}
