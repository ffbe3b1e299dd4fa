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

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use hourglass_rpc::proto::v1;
use hourglass_rpc::series::{NameError, Series};
use hourglass_rpc::time::SECONDS_PER_HOUR;
use hourglass_sketch::Sketch;

use crate::config::{Config, MetricSpec};

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

/// A Bloom filter more than half full, as the table reports it for the admin port.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BloomFill {
    /// The series, as its canonical text.
    pub(crate) series: String,
    /// The hour.
    pub(crate) hour: u32,
    /// The fraction of its bits set.
    pub(crate) fill: f64,
}

/// One entry a push carries, as the table encodes a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    /// The entry.
    pub(crate) key: Key,
    /// The version its snapshots carry.
    pub(crate) version: u64,
    /// How many snapshots (one per sketch kind) it put in the push.
    pub(crate) snapshots: usize,
}

/// Why an event was not added. [`Reject::reason`] is its counter label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reject {
    /// The metric name or a tag breaks a naming rule.
    Name(NameError),
    /// The metric name is longer than `limits.max_metric_len`.
    MetricTooLong(usize),
    /// More tags than `limits.max_tags`.
    TooManyTags(usize),
    /// The item is longer than `limits.max_item_len`.
    ItemTooLong(usize),
    /// The item is empty.
    EmptyItem,
    /// The event's hour closed (its end plus the lateness) before it arrived.
    TooLate {
        /// The event time.
        time: i64,
    },
    /// The event is further in the future than `limits.max_future`.
    TooFarAhead {
        /// The event time.
        time: i64,
    },
    /// A new series beyond `limits.max_series`.
    SeriesLimit(usize),
}

impl Reject {
    /// The counter label.
    pub fn reason(&self) -> &'static str {
        match self {
            Reject::Name(NameError::TooManyTags { .. }) | Reject::TooManyTags(_) => "too_many_tags",
            Reject::Name(NameError::BadTagKey { .. } | NameError::BadTagValue { .. }) => "bad_tag",
            Reject::Name(NameError::DuplicateTag { .. }) => "duplicate_tag",
            Reject::Name(_) => "bad_metric",
            Reject::MetricTooLong(_) => "metric_too_long",
            Reject::ItemTooLong(_) => "item_too_long",
            Reject::EmptyItem => "empty_item",
            Reject::TooLate { .. } => "too_late",
            Reject::TooFarAhead { .. } => "too_far_ahead",
            Reject::SeriesLimit(_) => "series_limit",
        }
    }
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reject::Name(e) => write!(f, "{e}"),
            Reject::MetricTooLong(n) => {
                write!(f, "metric name is {n} bytes, above limits.max_metric_len")
            }
            Reject::TooManyTags(n) => write!(f, "{n} tags, above limits.max_tags"),
            Reject::ItemTooLong(n) => write!(f, "item is {n} bytes, above limits.max_item_len"),
            Reject::EmptyItem => write!(f, "item is empty"),
            Reject::TooLate { time } => write!(
                f,
                "event time {time} is in an hour that closed (its end plus the lateness window is past)"
            ),
            Reject::TooFarAhead { time } => {
                write!(
                    f,
                    "event time {time} is further ahead of the clock than limits.max_future"
                )
            }
            Reject::SeriesLimit(n) => {
                write!(
                    f,
                    "a new series would exceed limits.max_series ({n} series held)"
                )
            }
        }
    }
}

/// The most bytes of encoded frames a checkpoint keeps for the push of the same flush
/// ([`Table::encoded`]); entries past it are encoded again by the push.
pub(crate) const MAX_FRAMES_KEPT: usize = 16 << 20;

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

impl Entry {
    /// The sketches' encoded frames: the kept ones, or encoded now.
    fn encode(&self) -> Vec<Bytes> {
        match &self.frames {
            Some(frames) => frames.clone(),
            None => self
                .sketches
                .iter()
                .map(|s| Bytes::from(s.encode()))
                .collect(),
        }
    }

    /// Whether the aggregator lacks something this entry holds.
    pub fn pending(&self) -> bool {
        self.dirty || self.acked < self.version
    }

    /// Whether a checkpoint must write this entry again: its sketches (`Some(true)`), or
    /// only its version, acknowledgement and flag (`Some(false)`).
    pub(crate) fn unsaved(&self) -> Option<bool> {
        if self.saved.content > self.saved.through {
            Some(true)
        } else if self.saved.meta > self.saved.through {
            Some(false)
        } else {
            None
        }
    }
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
struct Alias {
    id: u64,
    dropped_tags: u32,
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

/// Counts of what a batch of events did, added to the metrics once per batch.
#[derive(Debug, Default, Clone)]
pub(crate) struct IngestStats {
    /// Events added.
    pub(crate) accepted: u64,
    /// Events refused, by reason.
    pub(crate) rejected: Vec<(&'static str, u64)>,
    /// Tags dropped because the metric does not allow their key.
    pub(crate) dropped_tags: u64,
}

impl IngestStats {
    /// Counts one refusal.
    pub fn reject(&mut self, reason: &'static str) {
        match self.rejected.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => self.rejected.push((reason, 1)),
        }
    }

    /// Events refused, all reasons.
    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().map(|(_, n)| n).sum()
    }
}

/// What the aggregator is missing, for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Backlog {
    /// Snapshots not yet acknowledged (one per kind of each pending entry).
    pub(crate) snapshots: u64,
    /// Bytes of those sketches in memory.
    pub(crate) bytes: u64,
    /// The oldest hour with something unacknowledged.
    pub(crate) oldest_hour: Option<u32>,
    /// Open (series, hour) entries.
    pub(crate) entries: u64,
    /// Series held.
    pub(crate) series: u64,
    /// Bytes of all sketches held.
    pub(crate) sketch_bytes: u64,
    /// Bytes of the unacknowledged sketches of closed hours: what `shipping.max_backlog_mib`
    /// bounds.
    pub(crate) closed_bytes: u64,
    /// Entries whose latest version no successful checkpoint holds yet: they are not
    /// pushed until one does.
    pub(crate) awaiting_checkpoint: u64,
}

/// What keeping the backlog under `shipping.max_backlog_mib` dropped in one flush.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// (series, hour) entries dropped.
    pub(crate) entries: u64,
    /// Their snapshots (one per kind).
    pub(crate) snapshots: u64,
    /// Bytes of their sketches.
    pub(crate) bytes: u64,
    /// The oldest hour dropped from.
    pub(crate) first_hour: u32,
    /// The newest hour dropped from.
    pub(crate) last_hour: u32,
    /// Hours dropped from that were still to be declared live: they no longer are, so the
    /// aggregator counts them as missing instead of complete.
    pub(crate) undeclared_hours: u64,
}

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

/// Raw spellings longer than this are resolved every time instead of remembered, so a
/// sender of huge tag lists cannot fill memory with cache keys.
const MAX_ALIAS_KEY: usize = 1024;
/// Tags an event may carry before the metric's allowed keys filter them.
pub(crate) const MAX_RAW_TAGS: usize = 64;

/// The most hours kept in the set of live hours not yet reported (about 14 months).
const MAX_LIVE_HOURS: usize = 10_000;

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

    /// The series of a DogStatsD line: `tags` as sent (`k:v,k2:v2`).
    pub(crate) fn resolve_statsd(
        &mut self,
        metric: &str,
        tags: &str,
        stats: &mut IngestStats,
    ) -> Result<u64, Reject> {
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        key.push(b's');
        key.extend_from_slice(metric.as_bytes());
        key.push(b'|');
        key.extend_from_slice(tags.as_bytes());
        let result = self.resolve(&key, metric, || crate::statsd::tag_pairs(tags), stats);
        self.scratch = key;
        result
    }

    /// The series of an Ingest event.
    pub(crate) fn resolve_tags(
        &mut self,
        metric: &str,
        tags: &[v1::Tag],
        stats: &mut IngestStats,
    ) -> Result<u64, Reject> {
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        key.push(b'g');
        key.extend_from_slice(metric.as_bytes());
        for t in tags {
            key.push(0);
            key.extend_from_slice(t.key.as_bytes());
            key.push(0);
            key.extend_from_slice(t.value.as_bytes());
        }
        let pairs = || tags.iter().map(|t| (t.key.as_str(), t.value.as_str()));
        let result = self.resolve(&key, metric, pairs, stats);
        self.scratch = key;
        result
    }

    fn resolve<'t, I: Iterator<Item = (&'t str, &'t str)>>(
        &mut self,
        key: &[u8],
        metric: &str,
        pairs: impl Fn() -> I,
        stats: &mut IngestStats,
    ) -> Result<u64, Reject> {
        if let Some(alias) = self.aliases.get(key) {
            stats.dropped_tags += u64::from(alias.dropped_tags);
            return Ok(alias.id);
        }
        let config = Arc::clone(&self.config);
        let limits = &config.limits;
        if metric.len() > limits.max_metric_len {
            return Err(Reject::MetricTooLong(metric.len()));
        }
        hourglass_rpc::series::validate_metric(metric).map_err(Reject::Name)?;
        let spec = self.spec(metric);
        let mut tags = Vec::new();
        let mut dropped = 0u32;
        let raw = pairs().count();
        if raw > MAX_RAW_TAGS {
            return Err(Reject::TooManyTags(raw));
        }
        for (k, v) in pairs() {
            let allowed = spec
                .allowed_tags
                .as_ref()
                .is_none_or(|keys| keys.binary_search_by(|a| a.as_str().cmp(k)).is_ok());
            if allowed {
                tags.push((k.to_string(), v.to_string()));
            } else {
                dropped += 1;
            }
        }
        if tags.len() > limits.max_tags {
            return Err(Reject::TooManyTags(tags.len()));
        }
        let series = Series::new(metric, tags).map_err(Reject::Name)?;
        let id = match self.by_series.get(&series) {
            Some(&id) => id,
            None => {
                if self.series.len() >= limits.max_series {
                    return Err(Reject::SeriesLimit(self.series.len()));
                }
                self.insert_series(series, spec)
            }
        };
        stats.dropped_tags += u64::from(dropped);
        if key.len() > MAX_ALIAS_KEY {
            return Ok(id);
        }
        // A sender that varies its spelling endlessly must not grow memory without bound.
        if self.aliases.len() >= 4 * limits.max_series + 1024 {
            self.aliases.clear();
        }
        self.aliases.insert(
            key.into(),
            Alias {
                id,
                dropped_tags: dropped,
            },
        );
        Ok(id)
    }

    fn spec(&self, metric: &str) -> Arc<MetricSpec> {
        Arc::clone(self.specs.get(metric).unwrap_or(&self.default_spec))
    }

    fn insert_series(&mut self, series: Series, spec: Arc<MetricSpec>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.by_series.insert(series.clone(), id);
        self.series.insert(
            id,
            SeriesSlot {
                wire: v1::Series::from(&series),
                series,
                spec,
                hours: 0,
            },
        );
        id
    }

    /// Checks an event's time against the open hours: its hour, or why not.
    pub(crate) fn hour_for(&self, time: i64, now: i64) -> Result<u32, Reject> {
        let lateness = i64::try_from(self.config.lateness.as_secs()).unwrap_or(i64::MAX);
        let future = i64::try_from(self.config.limits.max_future.as_secs()).unwrap_or(i64::MAX);
        if time > now.saturating_add(future) {
            return Err(Reject::TooFarAhead { time });
        }
        let hour = hourglass_rpc::time::hour_of(time).ok_or(Reject::TooLate { time })?;
        let hour_end = (i64::from(hour) + 1) * SECONDS_PER_HOUR;
        // An hour once closed stays closed, even if the clock steps back or the lateness
        // grows across a restart: its final snapshot may be acknowledged and freed, and a
        // new sketch of it would replace, not add to, what the aggregator holds.
        if hour_end.saturating_add(lateness) <= now
            || self.closed_through.is_some_and(|c| hour <= c)
        {
            return Err(Reject::TooLate { time });
        }
        Ok(hour)
    }

    /// Checks an event before its series is looked up, so that events refused anyway
    /// never make a series: the item's length and the event's hour.
    pub(crate) fn check(&self, item: &[u8], time: i64, now: i64) -> Result<u32, Reject> {
        self.check_item(item)?;
        self.hour_for(time, now)
    }

    /// The item's part of [`Table::check`]: not empty, and not above `limits.max_item_len`.
    pub(crate) fn check_item(&self, item: &[u8]) -> Result<(), Reject> {
        if item.is_empty() {
            return Err(Reject::EmptyItem);
        }
        if item.len() > self.config.limits.max_item_len {
            return Err(Reject::ItemTooLong(item.len()));
        }
        Ok(())
    }

    /// Every hour up to this one is closed for good, if any is.
    pub(crate) fn closed_through(&self) -> Option<u32> {
        self.closed_through
    }

    /// Closes every hour up to `hour` for good (when restoring a checkpoint).
    pub(crate) fn close_through(&mut self, hour: u32) {
        self.closed_through = Some(self.closed_through.map_or(hour, |c| c.max(hour)));
    }

    /// Adds `item` (`weight` times, for frequency) to series `id` in the hour of `time`.
    #[cfg(test)]
    pub(crate) fn insert(
        &mut self,
        id: u64,
        time: i64,
        now: i64,
        item: &[u8],
        weight: u64,
    ) -> Result<(), Reject> {
        let hour = self.check(item, time, now)?;
        self.insert_at(id, hour, item, weight);
        Ok(())
    }

    /// Adds an item that [`Table::check`] passed to series `id` in `hour`.
    pub(crate) fn insert_at(&mut self, id: u64, hour: u32, item: &[u8], weight: u64) {
        self.insert_run(id, hour, &[(item, weight)]);
    }

    /// Adds items that [`Table::check`] passed, with their weights (for frequency), to
    /// series `id` in `hour`: the entry is looked up once, and each sketch takes the
    /// whole run in turn.
    pub(crate) fn insert_run(&mut self, id: u64, hour: u32, items: &[(&[u8], u64)]) {
        if items.is_empty() {
            return;
        }
        let generation = self.generation;
        let entry = match self.entries.get_mut(&Key { series: id, hour }) {
            Some(entry) => entry,
            None => {
                // An hour the agent holds events for is one it ingested for, even when
                // they arrive late (a backfill, a replay): it is live for the aggregator.
                if !self.live_hours.contains(&hour) {
                    self.mark_live(hour);
                }
                let slot = self.series.get_mut(&id).expect("resolved series are held");
                slot.hours += 1;
                self.entries
                    .entry(Key { series: id, hour })
                    .or_insert(Entry {
                        sketches: slot.spec.empty.clone(),
                        dirty: true,
                        ..Entry::default()
                    })
            }
        };
        for sketch in &mut entry.sketches {
            match sketch {
                Sketch::Distinct(h) => h.insert_all(items.iter().map(|(item, _)| *item)),
                // The item length was checked against a limit at most MAX_ITEM_LEN.
                Sketch::Frequency(f) => items.iter().for_each(|(item, weight)| {
                    f.insert_weighted(item, (*weight).max(1))
                        .expect("items within limits.max_item_len fit the frequent-items summary")
                }),
                Sketch::Membership(b) => items.iter().for_each(|(item, _)| b.insert(item)),
            }
        }
        entry.dirty = true;
        entry.saved.content = generation;
        entry.frames = None;
    }

    /// The times that fall in `hour`, an hour [`Table::hour_for`] accepted at `now`, and
    /// that it accepts without a look: from the hour's start to its end or to the furthest
    /// ahead of `now` accepted, whichever comes first. Nothing else of an event's check
    /// depends on its time.
    pub(crate) fn accepted_times(&self, hour: u32, now: i64) -> std::ops::Range<i64> {
        let future = i64::try_from(self.config.limits.max_future.as_secs()).unwrap_or(i64::MAX);
        let start = i64::from(hour) * SECONDS_PER_HOUR;
        let end = (start + SECONDS_PER_HOUR).min(now.saturating_add(future).saturating_add(1));
        start..end
    }

    /// Records that the agent is up during `hour`.
    pub fn mark_live(&mut self, hour: u32) {
        self.live_hours.insert(hour);
        while self.live_hours.len() > MAX_LIVE_HOURS {
            self.live_hours.pop_first();
        }
    }

    /// Live hours not yet reported to the aggregator.
    pub fn live_hours(&self) -> Vec<u32> {
        self.live_hours.iter().copied().collect()
    }

    /// Forgets live hours the aggregator acknowledged.
    pub(crate) fn live_hours_acked(&mut self, hours: &[u32]) {
        for h in hours {
            self.live_hours.remove(h);
        }
    }

    /// Forgets live hours the aggregator refused for good (the caller counts them), so
    /// they are not sent again every flush.
    pub(crate) fn drop_live_hours(&mut self, hours: &[u32]) {
        for h in hours {
            self.live_hours.remove(h);
        }
    }

    /// The highest version given to any entry of this epoch.
    pub(crate) fn last_version(&self) -> u64 {
        self.last_version
    }

    /// Raises the version counter to at least `version` (when restoring a checkpoint).
    pub(crate) fn raise_last_version(&mut self, version: u64) {
        self.last_version = self.last_version.max(version);
    }

    /// Gives every changed entry the next version of the epoch; returns how many changed.
    ///
    /// Versions come from one counter for the whole epoch, not one per entry: an entry
    /// that is freed and made again for the same hour (a clock stepped back, a lateness
    /// raised across a restart) still gets a version above any the aggregator holds for
    /// it, so its snapshot is stored, not taken for a stale duplicate.
    pub(crate) fn assign_versions(&mut self) -> usize {
        let mut changed = 0;
        let version = self.last_version + 1;
        for entry in self.entries.values_mut() {
            if entry.dirty {
                entry.version = version;
                entry.dirty = false;
                entry.saved.meta = self.generation;
                changed += 1;
            }
        }
        if changed > 0 {
            self.last_version = version;
        }
        changed
    }

    /// Entries the aggregator has not acknowledged at the version the last successful
    /// checkpoint holds, oldest hour first: what a push may send. A version no checkpoint
    /// holds waits, since a restarted agent could give it to other content.
    pub(crate) fn unacked(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .entries
            .iter()
            .filter(|(_, e)| e.acked < e.saved.durable)
            .map(|(k, _)| *k)
            .collect();
        keys.sort_by_key(|k| (k.hour, k.series));
        keys
    }

    /// Every entry's key.
    pub fn keys(&self) -> Vec<Key> {
        self.entries.keys().copied().collect()
    }

    /// Encodes the snapshots of `keys` from `start` on, stopping before `max_bytes` of
    /// sketches or `max_snapshots` snapshots (at least one entry per call). Returns the
    /// snapshots, the (key, version, snapshot count) of each entry sent, and the index to
    /// continue from.
    ///
    /// The version sent is the one the last successful checkpoint holds. It is the
    /// entry's own unless checkpoints are failing; then the current sketch goes out under
    /// the older version, as an event taken between a checkpoint and the push after it
    /// always has (docs/FORMAT.md), and it is replaced at the aggregator once a checkpoint
    /// holds the entry's newer version.
    pub(crate) fn encode_batch(
        &mut self,
        keys: &[Key],
        start: usize,
        max_bytes: usize,
        max_snapshots: usize,
    ) -> (Vec<v1::Snapshot>, Vec<Sent>, usize) {
        let mut snapshots = Vec::new();
        let mut sent = Vec::new();
        let mut bytes = 0usize;
        let mut next = start;
        while next < keys.len() {
            let key = keys[next];
            let (Some(entry), Some(slot)) =
                (self.entries.get_mut(&key), self.series.get(&key.series))
            else {
                next += 1;
                continue;
            };
            let size: usize = entry.sketches.iter().map(Sketch::size_bytes).sum();
            if !sent.is_empty()
                && (bytes + size > max_bytes
                    || snapshots.len() + entry.sketches.len() > max_snapshots)
            {
                break;
            }
            bytes += size;
            // Encoded by this flush's checkpoint, nearly always: taken, not kept for
            // another push.
            let frames = match entry.frames.take() {
                Some(frames) => frames,
                None => entry.encode(),
            };
            for (sketch, data) in entry.sketches.iter().zip(frames) {
                snapshots.push(v1::Snapshot {
                    series: Some(slot.wire.clone()),
                    hour: key.hour,
                    epoch: self.epoch,
                    version: entry.saved.durable,
                    sketch: Some(v1::EncodedSketch {
                        kind: v1::SketchKind::from(sketch.kind()) as i32,
                        data,
                    }),
                });
            }
            sent.push(Sent {
                key,
                version: entry.saved.durable,
                snapshots: entry.sketches.len(),
            });
            next += 1;
        }
        (snapshots, sent, next)
    }

    /// Marks `key` changed, so the next flush gives it a new version and sends it again
    /// (when the aggregator holds a later version of it than this agent gave, with other
    /// content). Nothing happens if the table does not hold `key`.
    pub(crate) fn mark_dirty(&mut self, key: Key) {
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.dirty = true;
            entry.saved.meta = self.generation;
        }
    }

    /// Records that the aggregator holds `version` of `key` (or a newer one).
    pub(crate) fn ack(&mut self, key: Key, version: u64) {
        if let Some(entry) = self.entries.get_mut(&key)
            && version > entry.acked
        {
            entry.acked = version;
            entry.saved.meta = self.generation;
        }
    }

    /// Frees the entries of closed hours whose final snapshot is acknowledged, and the
    /// series left without hours. Returns how many entries were freed.
    pub(crate) fn free_closed(&mut self, now: i64) -> usize {
        let lateness = i64::try_from(self.config.lateness.as_secs()).unwrap_or(i64::MAX);
        let closed =
            |hour: u32| ((i64::from(hour) + 1) * SECONDS_PER_HOUR).saturating_add(lateness) <= now;
        // The last hour that is closed now: (h + 1)·3600 + lateness ≤ now.
        let last_closed = now.saturating_sub(lateness).div_euclid(SECONDS_PER_HOUR) - 1;
        if let Ok(hour) = u32::try_from(last_closed) {
            self.close_through(hour);
        }
        let freed: Vec<Key> = self
            .entries
            .iter()
            .filter(|(k, e)| closed(k.hour) && !e.pending())
            .map(|(k, _)| *k)
            .collect();
        let mut emptied = false;
        for key in &freed {
            emptied |= self.remove_entry(*key);
        }
        // Series whose every event was refused hold no hour: let them go too.
        let idle: Vec<u64> = self
            .series
            .iter()
            .filter(|(_, slot)| slot.hours == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            let slot = self.series.remove(&id).expect("just seen");
            self.by_series.remove(&slot.series);
            emptied = true;
        }
        if emptied {
            // Aliases may name a freed series; they are rebuilt on the next event.
            self.aliases.clear();
        }
        freed.len()
    }

    /// Removes an entry, and its series when it was the series' last hour; true if a
    /// series went.
    fn remove_entry(&mut self, key: Key) -> bool {
        if self.entries.remove(&key).is_none() {
            return false;
        }
        let Some(slot) = self.series.get_mut(&key.series) else {
            return false;
        };
        // A checkpoint may hold it: the next one says it is gone.
        self.removed.push((slot.series.clone(), key.hour));
        slot.hours -= 1;
        if slot.hours > 0 {
            return false;
        }
        let slot = self.series.remove(&key.series).expect("just seen");
        self.by_series.remove(&slot.series);
        true
    }

    /// Whether `hour` is closed for good (as of the last [`Table::free_closed`]).
    fn is_closed(&self, hour: u32) -> bool {
        self.closed_through.is_some_and(|c| hour <= c)
    }

    /// Keeps the unacknowledged sketches of closed hours within `max_bytes` by dropping
    /// entries, oldest hour first (and within an hour, oldest series first), until they fit.
    /// Open hours are never dropped: `limits.max_series` and the lateness bound them, and a
    /// dropped open entry would come back with the next event and replace at the
    /// aggregator what it had of the hour.
    ///
    /// An hour dropped from is taken out of the live hours still to be declared, so the
    /// aggregator counts it missing rather than complete; the caller counts the drop.
    pub(crate) fn enforce_backlog(&mut self, max_bytes: u64) -> Dropped {
        let mut closed: Vec<(Key, u64, u64)> = self
            .entries
            .iter()
            .filter(|(k, e)| self.is_closed(k.hour) && e.pending())
            .map(|(k, e)| {
                let bytes = e.sketches.iter().map(|s| s.size_bytes() as u64).sum();
                (*k, bytes, e.sketches.len() as u64)
            })
            .collect();
        let mut total: u64 = closed.iter().map(|c| c.1).sum();
        let mut dropped = Dropped::default();
        if total <= max_bytes {
            return dropped;
        }
        closed.sort_unstable_by_key(|&(key, _, _)| (key.hour, key.series));
        let mut emptied = false;
        let mut hours = BTreeSet::new();
        for (key, bytes, snapshots) in closed {
            if total <= max_bytes {
                break;
            }
            emptied |= self.remove_entry(key);
            total -= bytes;
            hours.insert(key.hour);
            dropped.entries += 1;
            dropped.snapshots += snapshots;
            dropped.bytes += bytes;
        }
        if emptied {
            self.aliases.clear();
        }
        dropped.first_hour = hours.first().copied().unwrap_or(0);
        dropped.last_hour = hours.last().copied().unwrap_or(0);
        for hour in hours {
            if self.live_hours.remove(&hour) {
                dropped.undeclared_hours += 1;
            }
        }
        dropped
    }

    /// What the aggregator is missing, and what the table holds.
    pub(crate) fn backlog(&self) -> Backlog {
        let mut b = Backlog {
            entries: self.entries.len() as u64,
            series: self.series.len() as u64,
            ..Backlog::default()
        };
        for (key, entry) in &self.entries {
            let bytes: u64 = entry.sketches.iter().map(|s| s.size_bytes() as u64).sum();
            b.sketch_bytes += bytes;
            if entry.saved.durable < entry.version {
                b.awaiting_checkpoint += 1;
            }
            if entry.pending() {
                b.snapshots += entry.sketches.len() as u64;
                b.bytes += bytes;
                if self.is_closed(key.hour) {
                    b.closed_bytes += bytes;
                }
                b.oldest_hour = Some(b.oldest_hour.map_or(key.hour, |h| h.min(key.hour)));
            }
        }
        b
    }

    /// Bloom filters more than half full: (series, hour, fill ratio).
    pub(crate) fn bloom_fill_above_half(&self) -> Vec<BloomFill> {
        let mut out = Vec::new();
        for (key, entry) in &self.entries {
            for sketch in &entry.sketches {
                if let Sketch::Membership(b) = sketch {
                    let fill = b.fill_ratio();
                    if fill > 0.5 {
                        let name = self.series.get(&key.series).map(|s| s.series.to_string());
                        out.push(BloomFill {
                            series: name.unwrap_or_default(),
                            hour: key.hour,
                            fill,
                        });
                    }
                }
            }
        }
        out
    }

    /// Starts a checkpoint: returns the generation it holds the changes of (every change
    /// from now on is stamped with the next), and how many removals it records.
    pub(crate) fn begin_checkpoint(&mut self) -> (u64, usize) {
        let generation = self.generation;
        self.generation += 1;
        (generation, self.removed.len())
    }

    /// The removals a checkpoint records: every one since the last recorded, first `n`.
    pub fn removed(&self, n: usize) -> &[(Series, u32)] {
        &self.removed[..n.min(self.removed.len())]
    }

    /// Entries the next checkpoint must write again, in no order.
    pub(crate) fn unsaved_keys(&self) -> Vec<Key> {
        self.entries
            .iter()
            .filter(|(_, e)| e.unsaved().is_some())
            .map(|(k, _)| *k)
            .collect()
    }

    /// A checkpoint begun at `generation` is durable: it holds the `written` entries at
    /// the given versions, and the first `removals` removals.
    pub(crate) fn checkpoint_done(
        &mut self,
        generation: u64,
        written: &[(Key, u64)],
        removals: usize,
    ) {
        for &(key, version) in written {
            if let Some(entry) = self.entries.get_mut(&key) {
                entry.saved.durable = entry.saved.durable.max(version);
                entry.saved.through = entry.saved.through.max(generation);
            }
        }
        self.removed.drain(..removals.min(self.removed.len()));
    }

    /// The series of `key`, and its entry's encoded frames, for the checkpoint writer.
    /// An entry the aggregator lacks keeps them, for the push of this flush to send
    /// rather than encode the sketches again.
    ///
    /// At most [`MAX_FRAMES_KEPT`] bytes of them are kept between two
    /// [`Table::drop_frames`], so that a flush of a large backlog does not hold it twice.
    pub(crate) fn encoded(&mut self, key: Key) -> Option<(&Series, &Entry, Vec<Bytes>)> {
        let series = &self.series.get(&key.series)?.series;
        let entry = self.entries.get_mut(&key)?;
        let frames = entry.encode();
        let size: usize = frames.iter().map(Bytes::len).sum();
        if entry.pending() && entry.frames.is_none() && self.frames_kept + size <= MAX_FRAMES_KEPT {
            self.frames_kept += size;
            entry.frames = Some(frames.clone());
        }
        Some((series, entry, frames))
    }

    /// Drops the encoded frames a push did not take: they live within one flush.
    pub(crate) fn drop_frames(&mut self) {
        if self.frames_kept > 0 {
            for entry in self.entries.values_mut() {
                entry.frames = None;
            }
            self.frames_kept = 0;
        }
    }

    /// The series and entry of `key`, for the checkpoint writer.
    pub fn get(&self, key: Key) -> Option<(&Series, &Entry)> {
        Some((
            &self.series.get(&key.series)?.series,
            self.entries.get(&key)?,
        ))
    }

    /// Puts back an entry read from a checkpoint. Restored entries are sent again unless
    /// the checkpoint shows the aggregator had their current state.
    pub(crate) fn restore(&mut self, series: Series, hour: u32, mut entry: Entry) {
        self.raise_last_version(entry.version);
        // The checkpoint it came from holds it as it is.
        entry.saved = Saved {
            durable: entry.version,
            content: 0,
            meta: 0,
            through: 0,
        };
        let id = match self.by_series.get(&series) {
            Some(&id) => id,
            None => {
                let spec = self.spec(series.metric());
                self.insert_series(series, spec)
            }
        };
        let slot = self.series.get_mut(&id).expect("just inserted");
        if self
            .entries
            .insert(Key { series: id, hour }, entry)
            .is_none()
        {
            slot.hours += 1;
        }
    }

    /// Marks every entry as a successful checkpoint would, for tests of what follows one.
    #[cfg(test)]
    pub(crate) fn checkpointed(&mut self) {
        let (generation, removals) = self.begin_checkpoint();
        let written: Vec<(Key, u64)> = self.entries.iter().map(|(k, e)| (*k, e.version)).collect();
        self.checkpoint_done(generation, &written, removals);
    }

    /// Sum over held entries of a closure, for tests.
    #[cfg(test)]
    pub fn entry(&self, series: &str, hour: u32) -> Option<&Entry> {
        let id = self.by_series.get(&Series::parse(series).ok()?)?;
        self.entries.get(&Key { series: *id, hour })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hourglass_sketch::format::Kind;

    const NOW: i64 = 1_764_000_000; // some hour of 2025
    fn hour(t: i64) -> u32 {
        (t / 3600) as u32
    }

    fn table() -> Table {
        let mut config = Config::default();
        config.limits.max_series = 3;
        config.metrics.insert(
            "pages".into(),
            crate::config::MetricConfig {
                kinds: Some(vec![Kind::Membership]),
                allowed_tags: Some(vec!["region".into()]),
                ..Default::default()
            },
        );
        Table::new(Arc::new(config), 7)
    }

    /// An event as the ingest paths add it: checked, then its series found, then added.
    fn add(t: &mut Table, metric: &str, tags: &str, item: &str, time: i64) -> Result<(), Reject> {
        let mut stats = IngestStats::default();
        let hour = t.check(item.as_bytes(), time, NOW)?;
        let id = t.resolve_statsd(metric, tags, &mut stats)?;
        t.insert_at(id, hour, item.as_bytes(), 1);
        Ok(())
    }

    #[test]
    fn tags_in_any_order_are_one_series() {
        let mut t = table();
        add(&mut t, "visitors", "b:2,a:1", "u1", NOW).unwrap();
        add(&mut t, "visitors", "a:1,b:2", "u2", NOW).unwrap();
        assert_eq!(t.series_count(), 1);
        let e = t.entry("visitors{a=1,b=2}", hour(NOW)).unwrap();
        let kinds: Vec<Kind> = e.sketches.iter().map(Sketch::kind).collect();
        assert_eq!(kinds, vec![Kind::Distinct, Kind::Frequency]);
        match &e.sketches[0] {
            Sketch::Distinct(d) => assert_eq!(d.estimate().estimate.round(), 2.0),
            _ => unreachable!(),
        }
    }

    #[test]
    fn disallowed_tags_are_dropped_and_counted() {
        let mut t = table();
        let mut stats = IngestStats::default();
        let a = t
            .resolve_statsd("pages", "region:eu,user:42", &mut stats)
            .unwrap();
        let b = t
            .resolve_statsd("pages", "region:eu,user:42", &mut stats)
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(stats.dropped_tags, 2, "counted per event, also when cached");
        t.insert(a, NOW, NOW, b"/cart", 1).unwrap();
        let e = t.entry("pages{region=eu}", hour(NOW)).unwrap();
        assert!(matches!(&e.sketches[..], [Sketch::Membership(b)] if b.contains(b"/cart")));
    }

    #[test]
    fn events_land_in_their_own_hour_within_the_window() {
        let mut t = table();
        let hour_start = NOW - NOW % 3600;
        add(&mut t, "v", "", "a", hour_start - 1).unwrap(); // previous hour, within 1h lateness
        add(&mut t, "v", "", "b", NOW + 299).unwrap();
        assert!(t.entry("v", hour(hour_start - 1)).is_some());
        // The hour before last ended more than an hour ago.
        let e = add(&mut t, "v", "", "c", hour_start - 3601 - (NOW - hour_start)).unwrap_err();
        assert_eq!(e.reason(), "too_late");
        let e = add(&mut t, "v", "", "d", NOW + 301).unwrap_err();
        assert_eq!(e.reason(), "too_far_ahead");
        assert_eq!(
            add(&mut t, "v", "", "", NOW).unwrap_err(),
            Reject::EmptyItem
        );
        let long = "x".repeat(1025);
        assert_eq!(
            add(&mut t, "v", "", &long, NOW).unwrap_err().reason(),
            "item_too_long"
        );
    }

    #[test]
    fn limits_and_names_are_enforced() {
        let mut t = table();
        for m in ["a", "b", "c"] {
            add(&mut t, m, "", "x", NOW).unwrap();
        }
        assert_eq!(
            add(&mut t, "d", "", "x", NOW).unwrap_err(),
            Reject::SeriesLimit(3)
        );
        // Known series still take events.
        add(&mut t, "a", "", "y", NOW).unwrap();
        assert_eq!(
            add(&mut t, "9bad", "", "x", NOW).unwrap_err().reason(),
            "bad_metric"
        );
        assert_eq!(
            add(&mut t, "a", "k:1,k:2", "x", NOW).unwrap_err().reason(),
            "duplicate_tag"
        );
        let many: Vec<String> = (0..17).map(|i| format!("k{i}:v")).collect();
        assert_eq!(
            add(&mut t, "a", &many.join(","), "x", NOW)
                .unwrap_err()
                .reason(),
            "too_many_tags"
        );
    }

    /// The frames a checkpoint encodes are what the push of the same flush sends, unless
    /// an event changed the sketches in between: then the push sends them as they are
    /// now. Only entries the aggregator lacks keep frames, and only until the flush ends.
    #[test]
    fn a_push_sends_the_sketches_as_they_are_now_not_as_checkpointed() {
        let encoded = |t: &Table, key: Key| -> Vec<Vec<u8>> {
            t.get(key)
                .unwrap()
                .1
                .sketches
                .iter()
                .map(Sketch::encode)
                .collect()
        };
        let sent = |t: &mut Table, key: Key| -> Vec<Vec<u8>> {
            let (snaps, _, _) = t.encode_batch(&[key], 0, usize::MAX, 1000);
            snaps
                .into_iter()
                .map(|s| s.sketch.unwrap().data.to_vec())
                .collect()
        };
        let mut t = table();
        add(&mut t, "v", "", "a", NOW).unwrap();
        add(&mut t, "w", "", "a", NOW).unwrap();
        t.assign_versions();
        let mut keys = t.keys();
        keys.sort_by_key(|k| t.get(*k).unwrap().0.to_string());
        let (v, w) = (keys[0], keys[1]);
        for key in [v, w] {
            let (_, _, frames) = t.encoded(key).unwrap();
            assert_eq!(
                frames.iter().map(|f| f.to_vec()).collect::<Vec<_>>(),
                encoded(&t, key)
            );
            assert!(t.get(key).unwrap().1.frames.is_some(), "pending: kept");
        }
        // An event between the checkpoint and the push: `v` is sent as it is now.
        add(&mut t, "v", "", "b", NOW).unwrap();
        assert!(t.get(v).unwrap().1.frames.is_none());
        let now = sent(&mut t, v);
        assert_eq!(now, encoded(&t, v));
        assert_ne!(now, {
            let mut one = table();
            add(&mut one, "v", "", "a", NOW).unwrap();
            let key = one.keys()[0];
            encoded(&one, key)
        });
        // `w` unchanged: its kept frames go, taken.
        assert_eq!(sent(&mut t, w), encoded(&t, w));
        assert!(t.get(w).unwrap().1.frames.is_none(), "taken by the push");
        // Acknowledged entries keep nothing; what a push did not take goes at the flush's end.
        t.encoded(v).unwrap();
        t.ack(w, t.get(w).unwrap().1.version);
        t.encoded(w).unwrap();
        assert!(t.get(v).unwrap().1.frames.is_some());
        assert!(t.get(w).unwrap().1.frames.is_none(), "not pending");
        t.drop_frames();
        assert!(t.get(v).unwrap().1.frames.is_none());
    }

    #[test]
    fn versions_acks_and_freeing_follow_the_protocol() {
        let mut t = table();
        add(&mut t, "v", "", "a", NOW).unwrap();
        assert_eq!(t.assign_versions(), 1);
        assert_eq!(t.assign_versions(), 0, "nothing changed since");
        t.checkpointed();
        let keys = t.unacked();
        assert_eq!(keys.len(), 1);
        let (snaps, sent, next) = t.encode_batch(&keys, 0, 1 << 20, 1000);
        assert_eq!((snaps.len(), next), (2, 1), "one snapshot per kind");
        assert!(snaps.iter().all(|s| s.version == 1 && s.epoch == 7));
        // Not acknowledged: still owed, and a change makes the next version.
        add(&mut t, "v", "", "b", NOW).unwrap();
        assert_eq!(t.assign_versions(), 1);
        t.checkpointed();
        assert_eq!(t.backlog().snapshots, 2);
        t.ack(sent[0].key, sent[0].version);
        assert_eq!(
            t.unacked().len(),
            1,
            "version 1 acked, version 2 still owed"
        );
        t.ack(keys[0], 2);
        assert!(t.unacked().is_empty());
        assert_eq!(t.backlog().snapshots, 0);
        // Open hours are kept; closed and acknowledged ones are freed with their series.
        assert_eq!(t.free_closed(NOW), 0);
        assert_eq!(t.free_closed(NOW + 3 * 3600), 1);
        assert_eq!(t.series_count(), 0);
        // A freed series comes back with its next event.
        let later = NOW + 3 * 3600;
        let id = t
            .resolve_statsd("v", "", &mut IngestStats::default())
            .unwrap();
        t.insert(id, later, later, b"c", 1).unwrap();
        assert_eq!(t.series_count(), 1);
    }

    #[test]
    fn an_entry_marked_dirty_is_sent_again_above_a_raised_counter() {
        let mut t = table();
        add(&mut t, "v", "", "a", NOW).unwrap();
        add(&mut t, "w", "", "a", NOW).unwrap();
        assert_eq!(t.assign_versions(), 2);
        t.checkpointed();
        let keys = t.unacked();
        for &k in &keys {
            t.ack(k, 1);
        }
        assert!(t.unacked().is_empty());
        // The aggregator holds version 5 of "v": continue above it, and owe "v" again.
        let v = t.get(keys[0]).map(|(s, _)| s.to_string()).unwrap();
        t.raise_last_version(5);
        t.mark_dirty(keys[0]);
        t.mark_dirty(Key {
            series: 999,
            hour: 1,
        }); // not held: nothing happens
        assert!(t.entry(&v, hour(NOW)).unwrap().pending());
        assert_eq!(t.backlog().snapshots, 2, "one entry, two kinds");
        assert_eq!(t.assign_versions(), 1, "only the marked entry");
        t.checkpointed();
        assert_eq!(t.entry(&v, hour(NOW)).unwrap().version, 6);
        assert_eq!(t.unacked(), vec![keys[0]]);
    }

    #[test]
    fn live_hours_are_forgotten_when_acknowledged_or_dropped() {
        let mut t = table();
        for h in [10, 11, 12, 13] {
            t.mark_live(h);
        }
        t.live_hours_acked(&[10, 11]);
        t.drop_live_hours(&[13]);
        assert_eq!(t.live_hours(), vec![12]);
    }

    #[test]
    fn a_closed_hour_stays_closed_and_versions_only_grow() {
        let mut t = table();
        add(&mut t, "v", "", "a", NOW).unwrap();
        add(&mut t, "w", "", "a", NOW).unwrap();
        t.assign_versions();
        add(&mut t, "w", "", "b", NOW).unwrap();
        t.assign_versions();
        t.checkpointed();
        let versions = (
            t.entry("v", hour(NOW)).unwrap().version,
            t.entry("w", hour(NOW)).unwrap().version,
        );
        assert_eq!(versions, (1, 2), "one counter for the epoch");
        for k in t.unacked() {
            t.ack(k, 2);
        }
        assert_eq!(t.free_closed(NOW + 3 * 3600), 2);
        // The clock steps back: the freed hour must not open again, or a new sketch of a
        // few late events would replace the whole hour at the aggregator.
        assert_eq!(
            add(&mut t, "v", "", "c", NOW).unwrap_err().reason(),
            "too_late"
        );
        assert_eq!(t.series_count(), 0, "refused events make no series");
        assert!(t.closed_through().unwrap() >= hour(NOW));
    }

    #[test]
    fn series_that_never_got_an_event_are_let_go() {
        let mut t = table();
        let mut stats = IngestStats::default();
        t.resolve_statsd("a", "", &mut stats).unwrap();
        t.resolve_statsd("b", "", &mut stats).unwrap();
        assert_eq!(t.series_count(), 2);
        t.free_closed(NOW);
        assert_eq!(t.series_count(), 0);
        let many: Vec<String> = (0..65).map(|i| format!("k{i}:v")).collect();
        let e = t
            .resolve_statsd("pages", &many.join(","), &mut stats)
            .unwrap_err();
        assert_eq!(
            e,
            Reject::TooManyTags(65),
            "checked before the allowed keys filter"
        );
    }

    #[test]
    fn the_backlog_bound_drops_oldest_closed_hours_first_and_never_open_ones() {
        let mut t = table();
        let start = NOW - NOW % 3600;
        // Three hours of "a" and "b", each given a version the aggregator never acknowledged
        // (it is away); the hour of NOW is open.
        for back in [2, 1, 0] {
            let time = start - back * 3600 + 10;
            for m in ["a", "b"] {
                let id = t
                    .resolve_statsd(m, "", &mut IngestStats::default())
                    .unwrap();
                let hour = hour(time);
                t.insert_at(id, hour, b"x", 1);
            }
        }
        t.assign_versions();
        let entry_bytes = t.backlog().bytes / 6;
        // Three hours after NOW's hour ended, its lateness too: all three hours are closed.
        let later = start + 3 * 3600 + 10;
        t.free_closed(later);
        assert_eq!(t.backlog().closed_bytes, 6 * entry_bytes);
        t.mark_live(hour(start) - 2);
        t.live_hours_acked(&[hour(start) - 1]);
        // Room for three entries and a half: the oldest hour and one series of the next go.
        let dropped = t.enforce_backlog(3 * entry_bytes + entry_bytes / 2);
        assert_eq!(
            dropped,
            Dropped {
                entries: 3,
                snapshots: 6,
                bytes: 3 * entry_bytes,
                first_hour: hour(start) - 2,
                last_hour: hour(start) - 1,
                undeclared_hours: 1,
            }
        );
        assert!(t.entry("a", hour(start) - 2).is_none());
        assert!(t.entry("b", hour(start) - 2).is_none());
        assert_eq!(
            t.entry("a", hour(start) - 1).is_some() as u8
                + t.entry("b", hour(start) - 1).is_some() as u8,
            1
        );
        assert!(t.entry("a", hour(start)).is_some() && t.entry("b", hour(start)).is_some());
        assert_eq!(t.backlog().closed_bytes, 3 * entry_bytes);
        assert!(
            !t.live_hours().contains(&(hour(start) - 2)),
            "a dropped hour is not declared live"
        );
        assert_eq!(t.enforce_backlog(3 * entry_bytes), Dropped::default());

        // Open hours are never dropped, however small the bound.
        let mut t = table();
        add(&mut t, "a", "", "x", NOW).unwrap();
        t.assign_versions();
        t.free_closed(NOW);
        assert_eq!(t.enforce_backlog(0), Dropped::default());
        assert!(t.entry("a", hour(NOW)).is_some());
    }

    #[test]
    fn batches_respect_the_byte_bound() {
        let mut t = table();
        for m in ["a", "b", "c"] {
            add(&mut t, m, "", "x", NOW).unwrap();
        }
        t.assign_versions();
        t.checkpointed();
        let keys = t.unacked();
        let one: usize = t
            .get(keys[0])
            .unwrap()
            .1
            .sketches
            .iter()
            .map(Sketch::size_bytes)
            .sum();
        let (_, sent, next) = t.encode_batch(&keys, 0, one, 1000);
        assert_eq!((sent.len(), next), (1, 1));
        let (_, sent, next) = t.encode_batch(&keys, 1, 10 * one, 1000);
        assert_eq!((sent.len(), next), (2, 3));
        // Two kinds, two snapshots an entry: a bound of 3 snapshots takes one entry.
        let (snaps, sent, _) = t.encode_batch(&keys, 0, usize::MAX, 3);
        assert_eq!((snaps.len(), sent.len()), (2, 1));
    }
}
