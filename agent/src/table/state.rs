//! The table's state: its series, its (series, hour) entries and what each entry holds,
//! looked up by key. What is done with them is in the sibling files, one subject each.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use bytes::Bytes;
use hourglass_rpc::proto::v1;
use hourglass_rpc::series::Series;
use hourglass_sketch::Sketch;

use crate::config::{Config, MetricSpec};

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

/// What the checkpoint holds of an entry, so that a checkpoint writes only the entries
/// that changed since the last one, and a push sends only versions a checkpoint holds.
///
/// Changes are stamped with the table's checkpoint generation; a checkpoint taken at
/// generation `g` holds every change stamped `g` or earlier of the entries it wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Saved {
    /// The version the last successful checkpoint holds (0: none does).
    pub durable: u64,
    /// The generation of the last change of the sketches.
    pub(crate) content: u64,
    /// The generation of the last change of the version, acknowledgement or dirty flag.
    pub(crate) meta: u64,
    /// The generation through which a successful checkpoint holds this entry.
    pub(crate) through: u64,
}

/// A series the table holds.
#[derive(Debug)]
pub(crate) struct SeriesSlot {
    /// The series.
    pub(crate) series: Series,
    /// Its wire form, built once.
    pub(crate) wire: v1::Series,
    /// What it keeps.
    pub(crate) spec: Arc<MetricSpec>,
    /// Its open hours.
    pub(crate) hours: u32,
}

/// How a raw spelling resolves: the series and how many tags it drops.
#[derive(Debug, Clone, Copy)]
pub(super) struct Alias {
    /// The series.
    pub(super) id: u64,
    /// How many of its tags the metric does not allow.
    pub(super) dropped_tags: u32,
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
    pub(super) config: Arc<Config>,
    pub(super) epoch: u64,
    pub(super) specs: HashMap<String, Arc<MetricSpec>>,
    pub(super) default_spec: Arc<MetricSpec>,
    pub(super) series: IntMap<u64, SeriesSlot>,
    pub(super) by_series: HashMap<Series, u64>,
    pub(super) aliases: HashMap<Box<[u8]>, Alias>,
    pub(super) next_id: u64,
    pub(super) entries: IntMap<Key, Entry>,
    pub(super) live_hours: BTreeSet<u32>,
    pub(super) last_version: u64,
    pub(super) closed_through: Option<u32>,
    pub(super) scratch: Vec<u8>,
    /// The checkpoint generation changes are stamped with; a checkpoint takes the current
    /// one and starts the next.
    pub(super) generation: u64,
    /// Bytes of encoded frames kept since the last [`Table::drop_frames`].
    pub(super) frames_kept: usize,
    /// Entries removed since a checkpoint last recorded removals.
    pub(super) removed: Vec<(Series, u32)>,
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
