//! The agent's sketches: one cumulative sketch per kind for every open (series, hour),
//! and the bookkeeping of DESIGN §3 that makes shipping effectively once.
//!
//! Every (series, hour) entry has a `version`, the highest it has been given, and `acked`,
//! the highest the aggregator acknowledged; `dirty` says it changed since it was last
//! given a version. A flush gives every dirty entry the next version, checkpoints, then
//! sends every entry whose `acked` is behind the version the last successful checkpoint
//! holds of it ([`Saved::durable`], its `version` unless checkpoints fail) — the whole
//! current sketch, never a delta. A failed send leaves the entry behind, so the next flush sends it again;
//! the backlog is therefore at most one snapshot per (series, hour), however long the
//! aggregator is away.
//!
//! Series are looked up by the raw bytes they arrived as (`metric` and tags as sent), so
//! the common case — an application sending the same tags in the same order — costs one
//! hash lookup; only a new spelling is parsed, validated and sorted into a [`Series`].

mod backlog;
mod checkpointing;
mod encoding;
mod reject;
mod series;
mod sketches;
#[cfg(test)]
mod testing;
mod versions;

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use hourglass_rpc::series::Series;
use hourglass_sketch::Sketch;

use crate::config::{Config, MetricSpec};

pub(crate) use self::backlog::{Backlog, BloomFill, Dropped};
pub use self::checkpointing::Saved;
#[cfg(test)]
pub(crate) use self::encoding::MAX_FRAMES_KEPT;
pub(crate) use self::encoding::Sent;
pub(crate) use self::reject::{IngestStats, Reject};
use self::series::{Alias, SeriesSlot};

/// Locks the table. A panic elsewhere while it was held leaves at worst one entry with
/// part of one event; serving on beats stopping every ingest path for good.
pub fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A key of the table: a series (its id here) and an hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    /// The series' id in this table.
    pub(crate) series: u64,
    /// The hour, counted from 1970.
    pub(crate) hour: u32,
}

/// One open (series, hour).
#[derive(Debug, Clone, Default)]
pub struct Entry {
    /// One sketch per kind the series keeps.
    pub sketches: Vec<Sketch>,
    /// The highest version given.
    pub(crate) version: u64,
    /// The highest version the aggregator acknowledged.
    pub(crate) acked: u64,
    /// Changed since it was last given a version.
    pub(crate) dirty: bool,
    /// What the checkpoint holds of this entry.
    pub(crate) saved: Saved,
    /// The sketches' encoded frames as they are now, kept from the checkpoint that
    /// encoded them for the push of the same flush ([`Table::encoded`]); cleared when
    /// the sketches change, taken by the push, and dropped at the end of the flush.
    pub(crate) frames: Option<Vec<Bytes>>,
}

impl Entry {
    /// Whether the aggregator lacks something this entry holds.
    pub fn pending(&self) -> bool {
        self.dirty || self.acked < self.version
    }
}

/// A fast hasher for integer keys (a multiply-xorshift of the written words); the keys
/// are ours, not an attacker's.
#[derive(Default)]
pub(crate) struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(23) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// The sketches of one agent.
pub struct Table {
    config: Arc<Config>,
    epoch: u64,
    specs: HashMap<String, Arc<MetricSpec>>,
    default_spec: Arc<MetricSpec>,
    series: IntMap<u64, SeriesSlot>,
    by_series: HashMap<Series, u64>,
    aliases: HashMap<Box<[u8]>, Alias>,
    next_id: u64,
    entries: IntMap<Key, Entry>,
    live_hours: BTreeSet<u32>,
    last_version: u64,
    closed_through: Option<u32>,
    scratch: Vec<u8>,
    /// The checkpoint generation changes are stamped with; a checkpoint takes the current
    /// one and starts the next.
    generation: u64,
    /// Bytes of encoded frames kept since the last [`Table::drop_frames`].
    frames_kept: usize,
    /// Entries removed since a checkpoint last recorded removals.
    removed: Vec<(Series, u32)>,
}

impl Table {
    /// An empty table for `epoch`.
    pub fn new(config: Arc<Config>, epoch: u64) -> Table {
        // Every spec is built here, once: looking one up never allocates, so metric names
        // nobody configured share one spec however many arrive.
        let build = |metric: &str| {
            Arc::new(
                config
                    .spec_for(metric)
                    .expect("a validated config builds every metric's sketches"),
            )
        };
        let specs = config
            .metrics
            .keys()
            .map(|m| (m.clone(), build(m)))
            .collect();
        let default_spec = build("");
        Table {
            specs,
            default_spec,
            config,
            epoch,
            series: IntMap::default(),
            by_series: HashMap::new(),
            aliases: HashMap::new(),
            next_id: 1,
            entries: IntMap::default(),
            live_hours: BTreeSet::new(),
            last_version: 0,
            closed_through: None,
            scratch: Vec::new(),
            generation: 1,
            frames_kept: 0,
            removed: Vec::new(),
        }
    }

    /// The epoch of this table's state.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Series held.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// Every entry's key.
    pub fn keys(&self) -> Vec<Key> {
        self.entries.keys().copied().collect()
    }

    /// The series and entry of `key`, for the checkpoint writer.
    pub fn get(&self, key: Key) -> Option<(&Series, &Entry)> {
        Some((
            &self.series.get(&key.series)?.series,
            self.entries.get(&key)?,
        ))
    }

    /// The entry of `series` (its text) in `hour`, for tests.
    #[cfg(test)]
    pub fn entry(&self, series: &str, hour: u32) -> Option<&Entry> {
        let id = self.by_series.get(&Series::parse(series).ok()?)?;
        self.entries.get(&Key { series: *id, hour })
    }
}
