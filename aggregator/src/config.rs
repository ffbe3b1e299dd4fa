//! The aggregator's configuration: where it keeps its data (from the command line) and
//! everything else (from an optional TOML file), with a default for every field.
//!
//! ```toml
//! [rollup]
//! interval = "60s"     # how often closed days are rolled up
//! lateness = "1h"      # how long after a day ends its rollups may still change
//! days_per_pass = 1000 # dirty days rebuilt per pass at most
//!
//! [retention]
//! hourly = "35d"       # hourly rows older than this are deleted
//! rollups = "400d"     # daily rollups older than this are deleted
//!
//! [coverage]
//! retire_after = "7d"  # a server silent this long stops counting as missing
//!
//! [storage]
//! sync_writes = true   # fsync the WAL before acknowledging a push
//! block_cache_mib = 256
//! query_cache_mib = 64 # merged hours kept for queries (distinct series); 0: none
//!
//! [limits]
//! max_snapshots_per_push = 10000
//! max_live_hours_per_push = 10000
//! max_message_mib = 64
//! max_series_per_server = 100000 # series with data within retention.hourly
//! max_query_range = "400d"
//! max_query_fanout = 1000000 # series × servers × groups one query may merge
//!
//! [limits.max_sketch_kib]  # largest encoded sketch of each kind
//! distinct = 1024          # a dense p=18 UltraLogLog is 256 KiB (HyperLogLog 192 KiB)
//! frequency = 16384
//! membership = 16384
//! ```
//!
//! A `[cluster]` section makes the aggregator one node of a cluster on NATS JetStream;
//! its fields are documented in [`crate::cluster`].
//!
//! Durations are a whole number followed by a unit: `ms`, `s`, `m`, `h` or `d`.
//! [`Config::validate`] checks every bound and names the field that breaks it.

use hourglass_rpc::config::{FileError, read_file};
use hourglass_rpc::time::deserialize_duration;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

use crate::store::StoreOptions;

mod cluster;
pub(crate) use cluster::server_addrs;
pub use cluster::{ClusterConfig, DEFAULT_SUBJECTS};

const SECOND: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

/// Everything the aggregator process needs besides its listeners.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The RocksDB directory. Given on the command line (`--data-dir`), never in the file,
    /// so that one config file can serve several aggregators.
    #[serde(skip)]
    pub data_dir: PathBuf,
    /// When and how daily rollups are built.
    pub rollup: RollupConfig,
    /// How long data is kept.
    pub retention: RetentionConfig,
    /// How answers count missing server-hours.
    pub coverage: CoverageConfig,
    /// RocksDB tuning.
    pub storage: StorageConfig,
    /// Bounds on what one request may ask of the aggregator (DESIGN §8).
    pub limits: LimitsConfig,
    /// Bearer tokens and their roles; none means no authentication (module
    /// [`crate::auth`]).
    pub auth: crate::auth::AuthConfig,
    /// Cluster mode on NATS JetStream (module [`crate::cluster`]); a single aggregator
    /// without it.
    pub cluster: Option<ClusterConfig>,
}

/// `[rollup]`: the background builder of daily rollups.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RollupConfig {
    /// How often the background task looks for closed days to roll up and applies
    /// retention.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) interval: Duration,
    /// How long after a day ends snapshots of it are still expected; rollups are built
    /// for days whose end plus this has passed. Later snapshots still count: they mark
    /// the day dirty and its rollups are rebuilt.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) lateness: Duration,
    /// At most this many dirty (series, day) pairs are rebuilt per pass, so one pass
    /// after a long outage cannot run for hours.
    pub(crate) days_per_pass: usize,
}

impl Default for RollupConfig {
    fn default() -> Self {
        RollupConfig {
            interval: 60 * SECOND,
            lateness: HOUR,
            days_per_pass: 1000,
        }
    }
}

/// `[retention]`: age limits, each applied by the background task.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Hourly rows whose hour ended longer ago than this are deleted.
    #[serde(deserialize_with = "deserialize_duration")]
    pub hourly: Duration,
    /// Daily rollups whose day ended longer ago than this are deleted.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) rollups: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            hourly: 35 * DAY,
            rollups: 400 * DAY,
        }
    }
}

/// `[coverage]`: which server-hours an answer counts as missing.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoverageConfig {
    /// A server is expected from its first live hour until this long after its last one;
    /// hours outside that span are not missing. So a server added mid-range is not
    /// missing before it started, and one that has been silent this long (decommissioned)
    /// stops counting as missing, while a shorter outage is reported hour by hour.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) retire_after: Duration,
}

impl Default for CoverageConfig {
    fn default() -> Self {
        CoverageConfig {
            retire_after: 7 * DAY,
        }
    }
}

/// `[storage]`: the RocksDB options an operator may want to change.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Sync the WAL before acknowledging a push, so acknowledged snapshots survive a
    /// machine crash, not only a process crash.
    pub(crate) sync_writes: bool,
    /// The RocksDB block cache, in MiB.
    pub(crate) block_cache_mib: usize,
    /// The hour cache of merged hourly rows, for queries, in MiB; 0 keeps none.
    pub(crate) query_cache_mib: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        let defaults = StoreOptions::default();
        StorageConfig {
            sync_writes: defaults.sync_writes,
            block_cache_mib: defaults.block_cache_bytes >> 20,
            query_cache_mib: defaults.query_cache_bytes >> 20,
        }
    }
}

/// `[limits]`: request bounds. Each refusal names the bound and the value.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Most snapshots in one push.
    pub(crate) max_snapshots_per_push: usize,
    /// Most distinct live hours declared in one push.
    pub(crate) max_live_hours_per_push: usize,
    /// Largest gRPC message accepted after decompression, in MiB.
    pub(crate) max_message_mib: usize,
    /// Largest encoded sketch in a snapshot, per kind, in KiB.
    pub(crate) max_sketch_kib: SketchSizeLimits,
    /// Deprecated: one bound in MiB for every kind, from before `max_sketch_kib`. Still
    /// read, so that an existing config file keeps working; when set it is the bound for
    /// every kind and `Config::deprecations` says so at start.
    pub(crate) max_sketch_mib: Option<usize>,
    /// Most series one server may hold with data within `retention.hourly`. Each kind
    /// of a metric and tags is its own series. A snapshot of a series beyond the bound is
    /// rejected; series whose last data has aged out of retention stop counting.
    pub(crate) max_series_per_server: usize,
    /// Longest time range one query may span.
    #[serde(deserialize_with = "deserialize_duration")]
    pub(crate) max_query_range: Duration,
    /// Most series × servers × groups (hours or days when grouped by them) one query may
    /// merge.
    pub(crate) max_query_fanout: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_snapshots_per_push: 10_000,
            max_live_hours_per_push: 10_000,
            max_message_mib: 64,
            max_sketch_kib: SketchSizeLimits::default(),
            max_sketch_mib: None,
            max_series_per_server: 100_000,
            max_query_range: 400 * DAY,
            max_query_fanout: 1_000_000,
        }
    }
}

impl LimitsConfig {
    /// [`LimitsConfig::max_message_mib`] in bytes.
    pub(crate) fn max_message_bytes(&self) -> usize {
        self.max_message_mib.saturating_mul(1 << 20)
    }

    /// The largest encoded sketch of `kind` accepted, in bytes, and the setting that
    /// says so.
    pub(crate) fn max_sketch_bytes(&self, kind: hourglass_sketch::Kind) -> (usize, &'static str) {
        if let Some(mib) = self.max_sketch_mib {
            return (mib.saturating_mul(1 << 20), "limits.max_sketch_mib");
        }
        let (kib, setting) = match kind {
            hourglass_sketch::Kind::Distinct => (
                self.max_sketch_kib.distinct,
                "limits.max_sketch_kib.distinct",
            ),
            hourglass_sketch::Kind::Frequency => (
                self.max_sketch_kib.frequency,
                "limits.max_sketch_kib.frequency",
            ),
            hourglass_sketch::Kind::Membership => (
                self.max_sketch_kib.membership,
                "limits.max_sketch_kib.membership",
            ),
        };
        (kib.saturating_mul(1 << 10), setting)
    }

    /// [`LimitsConfig::max_query_range`] in whole hours.
    pub(crate) fn max_query_hours(&self) -> u64 {
        self.max_query_range.as_secs() / 3600
    }
}

/// `[limits.max_sketch_kib]`: the largest encoded sketch of each kind, in KiB. A sketch's
/// size follows from its parameters, so each bound says which parameters an agent may use.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SketchSizeLimits {
    /// UltraLogLog or HyperLogLog. The largest precision, p = 18, is 256 KiB dense
    /// (UltraLogLog; 192 KiB HyperLogLog).
    pub(crate) distinct: usize,
    /// Count-Min plus frequent items. Width × depth × 8 bytes, plus the items.
    pub(crate) frequency: usize,
    /// Bloom filter. Its bits / 8.
    pub(crate) membership: usize,
}

impl Default for SketchSizeLimits {
    fn default() -> Self {
        SketchSizeLimits {
            distinct: 1 << 10,
            frequency: 16 << 10,
            membership: 16 << 10,
        }
    }
}

impl LimitsConfig {
    /// Every limit against its bounds.
    fn validate(&self) -> Result<(), ConfigError> {
        let l = self;
        check(
            (1..=1_000_000).contains(&l.max_snapshots_per_push),
            "limits.max_snapshots_per_push",
            l.max_snapshots_per_push,
            "must be between 1 and 1000000",
        )?;
        check(
            (1..=1_000_000).contains(&l.max_live_hours_per_push),
            "limits.max_live_hours_per_push",
            l.max_live_hours_per_push,
            "must be between 1 and 1000000",
        )?;
        check(
            (1..=4096).contains(&l.max_message_mib),
            "limits.max_message_mib",
            l.max_message_mib,
            "must be between 1 and 4096",
        )?;
        for kind in hourglass_sketch::Kind::ALL {
            let (bytes, setting) = l.max_sketch_bytes(kind);
            // No tie to max_message_mib: a sketch larger than the message cannot arrive,
            // so lowering the message bound needs no change here.
            check(
                (1 << 10..=4 << 30).contains(&bytes),
                setting,
                bytes >> 10,
                "must be between 1 and 4194304 (4 GiB)",
            )?;
        }
        if let Some(mib) = l.max_sketch_mib {
            check(
                (1..=4096).contains(&mib),
                "limits.max_sketch_mib",
                mib,
                "must be between 1 and 4096",
            )?;
        }
        check(
            (1..=100_000_000).contains(&l.max_series_per_server),
            "limits.max_series_per_server",
            l.max_series_per_server,
            "must be between 1 and 100000000",
        )?;
        check(
            l.max_query_range >= HOUR,
            "limits.max_query_range",
            l.max_query_range,
            "must be at least 1h",
        )?;
        check(
            (1..=1_000_000_000).contains(&l.max_query_fanout),
            "limits.max_query_fanout",
            l.max_query_fanout,
            "must be between 1 and 1000000000",
        )?;
        Ok(())
    }
}

/// `Ok` when `ok`, else the error that `field` (now `value`) breaks `rule`.
fn check(
    ok: bool,
    field: &'static str,
    value: impl std::fmt::Debug,
    rule: &'static str,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            field,
            value: format!("{value:?}"),
            rule,
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./hourglass-data"),
            rollup: RollupConfig::default(),
            retention: RetentionConfig::default(),
            coverage: CoverageConfig::default(),
            storage: StorageConfig::default(),
            limits: LimitsConfig::default(),
            auth: crate::auth::AuthConfig::default(),
            cluster: None,
        }
    }
}

/// Why a configuration cannot be used. Every variant names the field, or the file.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read, or is not valid TOML or has an unknown or mistyped
    /// field.
    #[error(transparent)]
    File(#[from] FileError),
    /// A field is outside its allowed range.
    #[error("config field {field} = {value}: {rule}")]
    Invalid {
        /// The field, as `section.key`.
        field: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        rule: &'static str,
    },
}

impl Config {
    /// Reads a TOML config file; fields it leaves out keep their defaults. The result is
    /// not yet validated, since the command line still sets the data dir.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        Ok(read_file(path, Config::from_toml)?)
    }

    /// Parses TOML text; the error is the parser's message.
    fn from_toml(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())
    }

    /// Settings still read but replaced, each with what replaces it: for a warning at start.
    pub(crate) fn deprecations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(mib) = self.limits.max_sketch_mib {
            out.push(format!(
                "limits.max_sketch_mib = {mib} is deprecated: it bounds sketches of every kind and \
                 overrides [limits.max_sketch_kib]; set distinct, frequency and membership there instead"
            ));
        }
        out
    }

    /// Checks every field against its bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            !self.data_dir.as_os_str().is_empty(),
            "data_dir",
            &self.data_dir,
            "must not be empty",
        )?;
        self.validate_time()?;
        let s = &self.storage;
        check(
            (1..=1 << 20).contains(&s.block_cache_mib),
            "storage.block_cache_mib",
            s.block_cache_mib,
            "must be between 1 and 1048576",
        )?;
        check(
            s.query_cache_mib <= 1 << 20,
            "storage.query_cache_mib",
            s.query_cache_mib,
            "must be between 0 and 1048576",
        )?;
        if let Some(cluster) = &self.cluster {
            cluster.validate()?;
        }
        self.limits.validate()
    }

    /// Rollups, retention and coverage: the settings in time, and how they must relate.
    fn validate_time(&self) -> Result<(), ConfigError> {
        let r = &self.rollup;
        check(
            r.interval >= SECOND && r.interval <= DAY,
            "rollup.interval",
            r.interval,
            "must be between 1s and 1d",
        )?;
        check(
            r.lateness <= 7 * DAY,
            "rollup.lateness",
            r.lateness,
            "must be at most 7d",
        )?;
        check(
            r.days_per_pass >= 1,
            "rollup.days_per_pass",
            r.days_per_pass,
            "must be at least 1",
        )?;
        let t = &self.retention;
        // Retention shorter than the lateness window would delete hours before their
        // final snapshot could arrive.
        check(
            t.hourly >= DAY && t.hourly >= r.lateness,
            "retention.hourly",
            t.hourly,
            "must be at least 1d and at least rollup.lateness",
        )?;
        // Rollups answer whole days once hourly rows are gone; deleting them first would
        // leave days that nothing answers.
        check(
            t.rollups >= t.hourly,
            "retention.rollups",
            t.rollups,
            "must be at least retention.hourly",
        )?;
        check(
            self.coverage.retire_after >= HOUR,
            "coverage.retire_after",
            self.coverage.retire_after,
            "must be at least 1h",
        )?;
        Ok(())
    }

    /// The RocksDB options this configuration asks for.
    pub(crate) fn store_options(&self) -> StoreOptions {
        StoreOptions {
            sync_writes: self.storage.sync_writes,
            block_cache_bytes: self.storage.block_cache_mib << 20,
            query_cache_bytes: self.storage.query_cache_mib << 20,
            ..StoreOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_documentation() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.rollup.lateness, HOUR);
        assert_eq!(c.rollup.interval, 60 * SECOND);
        assert_eq!(c.retention.hourly, 35 * DAY);
        assert_eq!(c.retention.rollups, 400 * DAY);
        assert!(c.storage.sync_writes);
        assert_eq!(c.limits.max_snapshots_per_push, 10_000);
        assert_eq!(c.limits.max_message_bytes(), 64 << 20);
        assert_eq!(
            c.limits.max_sketch_bytes(hourglass_sketch::Kind::Distinct),
            (1 << 20, "limits.max_sketch_kib.distinct")
        );
        assert_eq!(
            c.limits
                .max_sketch_bytes(hourglass_sketch::Kind::Membership)
                .0,
            16 << 20
        );
        assert_eq!(c.limits.max_series_per_server, 100_000);
        assert_eq!(c.limits.max_query_hours(), 400 * 24);
        // The example in the module docs is the defaults, spelled out.
        let documented = Config::from_toml(
            r#"
            [rollup]
            interval = "60s"
            lateness = "1h"
            days_per_pass = 1000
            [retention]
            hourly = "35d"
            rollups = "400d"
            [storage]
            sync_writes = true
            block_cache_mib = 256
            [limits]
            max_snapshots_per_push = 10000
            max_live_hours_per_push = 10000
            max_message_mib = 64
            max_series_per_server = 100000
            max_query_range = "400d"
            max_query_fanout = 1000000
            [limits.max_sketch_kib]
            distinct = 1024
            frequency = 16384
            membership = 16384
            "#,
        )
        .unwrap();
        assert_eq!(documented, Config::default());
    }

    #[test]
    fn the_deprecated_single_sketch_bound_still_reads_and_applies_to_every_kind() {
        let c = Config::from_toml("[limits]\nmax_sketch_mib = 2\n").unwrap();
        c.validate().unwrap();
        for kind in hourglass_sketch::Kind::ALL {
            assert_eq!(
                c.limits.max_sketch_bytes(kind),
                (2 << 20, "limits.max_sketch_mib")
            );
        }
        let warnings = c.deprecations();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("max_sketch_kib"), "{warnings:?}");
        assert!(Config::default().deprecations().is_empty());
        let mut c = c;
        c.limits.max_sketch_mib = Some(0);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("limits.max_sketch_mib"), "{e}");
    }

    #[test]
    fn a_partial_file_keeps_other_defaults() {
        let c = Config::from_toml("[rollup]\nlateness = \"3h\"\n").unwrap();
        assert_eq!(c.rollup.lateness, 3 * HOUR);
        assert_eq!(c.rollup.interval, 60 * SECOND);
        assert_eq!(c.limits, LimitsConfig::default());
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
    }

    #[test]
    fn errors_name_the_field() {
        let unknown = Config::from_toml("[rollup]\nlatenes = \"3h\"\n").unwrap_err();
        assert!(unknown.contains("latenes"), "{unknown}");
        let bad_unit = Config::from_toml("[rollup]\nlateness = \"3w\"\n").unwrap_err();
        assert!(
            bad_unit.contains("lateness") && bad_unit.contains("unit"),
            "{bad_unit}"
        );

        let mut c = Config::default();
        c.limits.max_snapshots_per_push = 0;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("limits.max_snapshots_per_push"), "{e}");

        let mut c = Config::default();
        c.retention.rollups = 10 * DAY;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("retention.rollups"), "{e}");

        let mut c = Config::default();
        c.limits.max_sketch_kib.frequency = 0;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("limits.max_sketch_kib.frequency"), "{e}");

        let mut c = Config::default();
        c.limits.max_series_per_server = 0;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("limits.max_series_per_server"), "{e}");
    }
}
