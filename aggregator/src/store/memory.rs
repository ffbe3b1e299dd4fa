//! [`MemoryStore`]: the [`Store`] semantics on ordered maps in memory, for tests of
//! everything above storage (the planner, the services) and as the reference the RocksDB
//! store is tested against.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use super::rules::{LiveMasks, hour_bit, is_dirty, next_id, put_outcome};
use super::{
    Bytes, DayConflict, DayRecord, DayWrite, Dictionaries, DirtyDay, HourCache, Hourly, PutOutcome,
    Replica, Retention, Rollups, SeriesName, ServerEntry, ServerIndex, StoreError, StoredSketch,
    StreamPosition, check_frame, is_empty_range, sorted_labels,
};
use crate::keys::{Day, DayKey, Hour, HourKey, SeriesId, ServerId};

/// A store that keeps everything in `BTreeMap`s behind one mutex. Nothing is persisted.
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    hour_cache: HourCache,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            inner: Mutex::default(),
            // The planner's tests run on this store: they exercise the cached path too.
            hour_cache: HourCache::new(16 << 20),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    hourly: BTreeMap<HourKey, StoredSketch>,
    rollups: BTreeMap<DayKey, Vec<u8>>,
    series_by_name: HashMap<SeriesName, SeriesId>,
    series_by_id: BTreeMap<SeriesId, SeriesName>,
    servers_by_name: HashMap<String, ServerId>,
    servers_by_id: BTreeMap<ServerId, ServerEntry>,
    // Ordered (day, series), like the RocksDB store's keys, so a take is oldest day first.
    /// (day, series) → the mark of its latest stored snapshot.
    dirty: BTreeMap<(Day, SeriesId), u64>,
    /// (day, series) → the mark its rollups were built from.
    built: BTreeMap<(Day, SeriesId), u64>,
    live: BTreeSet<(ServerId, Hour)>,
    /// (server, day) → bit mask of its live hours, for days past hourly retention.
    live_days: BTreeMap<(ServerId, Day), u32>,
    /// (day, series) → why its rollups could not be built.
    conflicts: BTreeMap<(Day, SeriesId), String>,
    /// (day, series) whose hourly rows retention deleted.
    expired: BTreeSet<(Day, SeriesId)>,
    /// (server, day, series) for every stored snapshot: [`ServerIndex::server_series`].
    server_series: BTreeSet<(ServerId, Day, SeriesId)>,
    /// Cluster mode: subject → [`Replica::stream_position`].
    positions: HashMap<u32, StreamPosition>,
    next_mark: u64,
}

impl Inner {
    fn mark(&mut self, series: SeriesId, day: Day) {
        self.next_mark += 1;
        self.dirty.insert((day, series), self.next_mark);
    }

    /// [`is_dirty`] of the (day, series) `key`.
    fn is_dirty(&self, key: &(Day, SeriesId)) -> bool {
        is_dirty(self.dirty.get(key).copied(), self.built.get(key).copied())
    }

    /// Records that `server` was live in `hours`, if a push says so.
    fn mark_live(&mut self, live: Option<(ServerId, &[Hour])>) {
        if let Some((server, hours)) = live {
            self.live.extend(hours.iter().map(|h| (server, *h)));
        }
    }

    /// Replaces every rollup of `(series, day)` with `rollups` (none: deletes them).
    fn replace_day(&mut self, series: SeriesId, day: Day, rollups: Vec<(DayKey, Vec<u8>)>) {
        self.rollups
            .retain(|k, _| !(k.series == series && k.day == day));
        self.rollups.extend(rollups);
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// An empty store whose hour cache keeps at most `bytes` (0: none), for tests that
    /// compare answers with and without it.
    pub fn with_query_cache(bytes: usize) -> Self {
        MemoryStore {
            inner: Mutex::default(),
            hour_cache: HourCache::new(bytes),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied write: every method
        // validates before it mutates. So a poisoned lock still guards consistent maps.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Visits the rows of one of the maps (`map`) in `range`, in key order, until `visit`
    /// returns false. The rows are copied out first: `visit` may call back into the store,
    /// which would deadlock on the mutex if it were still held.
    fn visit_copied<K: Ord + Copy, V: Clone>(
        &self,
        map: fn(&Inner) -> &BTreeMap<K, V>,
        range: Range<K>,
        mut visit: impl FnMut(K, &V) -> bool,
    ) {
        let inner = self.lock();
        let rows: Vec<(K, V)> = map(&inner)
            .range(range)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        drop(inner);
        for (key, value) in &rows {
            if !visit(*key, value) {
                break;
            }
        }
    }
}

impl Hourly for MemoryStore {
    fn write_push(
        &self,
        live: Option<(ServerId, &[Hour])>,
        batch: &[(HourKey, u64, Bytes)],
    ) -> Result<Vec<PutOutcome>, StoreError> {
        let mut inner = self.lock();
        inner.mark_live(live);
        let mut outcomes = Vec::with_capacity(batch.len());
        for (key, version, sketch) in batch {
            let held = inner.hourly.get(key).map(|s| s.version);
            inner
                .server_series
                .insert((key.server, key.hour.day(), key.series));
            let outcome = put_outcome(held, *version);
            if outcome == PutOutcome::Stored {
                inner.hourly.insert(
                    *key,
                    StoredSketch {
                        version: *version,
                        sketch: sketch.to_vec(),
                    },
                );
                inner.mark(key.series, key.hour.day());
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    fn hourly_versions(&self, keys: &[HourKey]) -> Result<Vec<Option<u64>>, StoreError> {
        let inner = self.lock();
        Ok(keys
            .iter()
            .map(|key| inner.hourly.get(key).map(|s| s.version))
            .collect())
    }

    fn scan_hourly(
        &self,
        series: SeriesId,
        hours: Range<Hour>,
        visit: &mut dyn FnMut(HourKey, &StoredSketch) -> bool,
    ) -> Result<(), StoreError> {
        if is_empty_range(&hours) {
            return Ok(());
        }
        let first = |hour| HourKey::first_of(series, hour);
        self.visit_copied(
            |inner| &inner.hourly,
            first(hours.start)..first(hours.end),
            visit,
        );
        Ok(())
    }

    fn hour_cache(&self) -> Option<&HourCache> {
        Some(&self.hour_cache)
    }
}

impl Rollups for MemoryStore {
    fn put_rollup(&self, key: DayKey, sketch: Vec<u8>) -> Result<(), StoreError> {
        check_frame(&sketch, || format!("rollup {key:?}"))?;
        self.lock().rollups.insert(key, sketch);
        Ok(())
    }

    fn get_rollup(&self, key: DayKey) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().rollups.get(&key).cloned())
    }

    fn scan_rollups(
        &self,
        series: SeriesId,
        days: Range<Day>,
        visit: &mut dyn FnMut(DayKey, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        if is_empty_range(&days) {
            return Ok(());
        }
        let first = |day| DayKey {
            series,
            day,
            server: ServerId(0),
        };
        self.visit_copied(
            |inner| &inner.rollups,
            first(days.start)..first(days.end),
            |key, sketch| visit(key, sketch),
        );
        Ok(())
    }

    fn mark_day_dirty(&self, series: SeriesId, day: Day) -> Result<(), StoreError> {
        self.lock().mark(series, day);
        Ok(())
    }

    fn dirty_days(&self, before: Day, limit: usize) -> Result<Vec<DirtyDay>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .dirty
            .range(..(before, SeriesId(0)))
            .filter(|(key, _)| inner.is_dirty(key))
            .take(limit)
            .map(|(&(day, series), &mark)| DirtyDay { series, day, mark })
            .collect())
    }

    fn is_day_dirty(&self, series: SeriesId, day: Day) -> Result<bool, StoreError> {
        Ok(self.lock().is_dirty(&(day, series)))
    }

    fn write_day(&self, write: DayWrite<'_>) -> Result<(), StoreError> {
        let key = (write.day, write.series);
        let mut inner = self.lock();
        inner.replace_day(write.series, write.day, write.rollups);
        match write.record {
            DayRecord::Built(mark) => {
                inner.conflicts.remove(&key);
                inner.built.insert(key, mark);
            }
            DayRecord::Conflict { mark, reason } => {
                inner.conflicts.insert(key, reason.to_string());
                inner.built.insert(key, mark);
            }
            DayRecord::Copied => {
                inner.expired.insert(key);
            }
        }
        Ok(())
    }

    fn day_conflicts(&self) -> Result<Vec<DayConflict>, StoreError> {
        Ok(self
            .lock()
            .conflicts
            .iter()
            .map(|(&(day, series), reason)| DayConflict {
                series,
                day,
                reason: reason.clone(),
            })
            .collect())
    }
}

impl Retention for MemoryStore {
    fn delete_hourly_before(
        &self,
        day: Day,
        keep: &BTreeSet<(SeriesId, Day)>,
    ) -> Result<u64, StoreError> {
        let mut inner = self.lock();
        let cutoff = day.first_hour();
        let gone: BTreeSet<(Day, SeriesId)> = inner
            .hourly
            .keys()
            .filter(|k| k.hour < cutoff && !keep.contains(&(k.series, k.hour.day())))
            .map(|k| (k.hour.day(), k.series))
            .collect();
        let before = inner.hourly.len();
        inner
            .hourly
            .retain(|k, _| !gone.contains(&(k.hour.day(), k.series)));
        let deleted = (before - inner.hourly.len()) as u64;
        inner.expired.extend(gone);
        let old: Vec<(ServerId, Hour)> = inner
            .live
            .range(..)
            .filter(|(_, h)| *h < cutoff)
            .copied()
            .collect();
        for (server, hour) in old {
            inner.live.remove(&(server, hour));
            *inner.live_days.entry((server, hour.day())).or_default() |= hour_bit(hour);
        }
        inner.server_series.retain(|(_, d, _)| *d >= day);
        drop(inner);
        self.hour_cache.written_everywhere();
        Ok(deleted)
    }

    fn delete_rollups_before(&self, day: Day) -> Result<u64, StoreError> {
        let mut inner = self.lock();
        let before = inner.rollups.len();
        inner.rollups.retain(|k, _| k.day >= day);
        // A dirty mark for a day past rollup retention would build a rollup only to
        // delete it.
        inner.dirty.retain(|(dirty_day, _), _| *dirty_day >= day);
        inner.built.retain(|(built_day, _), _| *built_day >= day);
        inner.hourly.retain(|k, _| k.hour >= day.first_hour());
        inner.live.retain(|(_, h)| *h >= day.first_hour());
        inner.live_days.retain(|(_, d), _| *d >= day);
        inner.conflicts.retain(|(d, _), _| *d >= day);
        inner.expired.retain(|(d, _)| *d >= day);
        let deleted = (before - inner.rollups.len()) as u64;
        drop(inner);
        self.hour_cache.written_everywhere();
        Ok(deleted)
    }

    fn is_day_expired(&self, series: SeriesId, day: Day) -> Result<bool, StoreError> {
        Ok(self.lock().expired.contains(&(day, series)))
    }
}

impl Dictionaries for MemoryStore {
    fn series_id(&self, series: &SeriesName) -> Result<Option<SeriesId>, StoreError> {
        Ok(self.lock().series_by_name.get(&series.canonical()).copied())
    }

    fn series_id_or_create(&self, series: &SeriesName) -> Result<SeriesId, StoreError> {
        let series = series.canonical();
        let mut inner = self.lock();
        if let Some(id) = inner.series_by_name.get(&series) {
            return Ok(*id);
        }
        let id = next_id(inner.series_by_id.keys().next_back().map(|s| s.0), "series")?;
        let id = SeriesId(id);
        inner.series_by_name.insert(series.clone(), id);
        inner.series_by_id.insert(id, series);
        Ok(id)
    }

    fn list_series(&self) -> Result<Vec<(SeriesId, SeriesName)>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .series_by_id
            .iter()
            .map(|(id, name)| (*id, name.clone()))
            .collect())
    }

    fn server_id(&self, name: &str) -> Result<Option<ServerId>, StoreError> {
        Ok(self.lock().servers_by_name.get(name).copied())
    }

    fn register_server(
        &self,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<ServerId, StoreError> {
        let mut inner = self.lock();
        if let Some(&id) = inner.servers_by_name.get(name) {
            let labels = sorted_labels(labels);
            if let Some(entry) = inner.servers_by_id.get_mut(&id)
                && entry.labels != labels
            {
                entry.labels = labels;
            }
            return Ok(id);
        }
        let id = ServerId(next_id(
            inner.servers_by_id.keys().next_back().map(|s| s.0),
            "server",
        )?);
        inner.servers_by_name.insert(name.to_string(), id);
        inner.servers_by_id.insert(
            id,
            ServerEntry {
                id,
                name: name.to_string(),
                labels: sorted_labels(labels),
            },
        );
        Ok(id)
    }

    fn list_servers(&self) -> Result<Vec<ServerEntry>, StoreError> {
        Ok(self.lock().servers_by_id.values().cloned().collect())
    }
}

impl ServerIndex for MemoryStore {
    fn server_series(
        &self,
        server: ServerId,
        since: Day,
    ) -> Result<Vec<(SeriesId, Day)>, StoreError> {
        let inner = self.lock();
        let mut latest = BTreeMap::new();
        for (_, day, series) in inner
            .server_series
            .range((server, since, SeriesId(0))..)
            .take_while(|(s, _, _)| *s == server)
        {
            latest.insert(*series, *day);
        }
        Ok(latest.into_iter().collect())
    }

    fn live_hours(&self, server: ServerId, hours: Range<Hour>) -> Result<u64, StoreError> {
        if is_empty_range(&hours) {
            return Ok(0);
        }
        let inner = self.lock();
        let last_day = Hour(hours.end.0 - 1).day();
        let live = inner.live.range((server, hours.start)..(server, hours.end));
        let summaries = inner
            .live_days
            .range((server, hours.start.day())..=(server, last_day));
        Ok(live_masks(live, summaries).count(&hours))
    }

    fn live_span(&self, server: ServerId) -> Result<Option<Range<Hour>>, StoreError> {
        let inner = self.lock();
        let live = inner
            .live
            .range((server, Hour(0))..=(server, Hour(u32::MAX)));
        let summaries = inner
            .live_days
            .range((server, Day(0))..=(server, Day(u32::MAX)));
        Ok(live_masks(live, summaries).span())
    }
}

impl Replica for MemoryStore {
    fn put_index(
        &self,
        live: Option<(ServerId, &[Hour])>,
        server: ServerId,
        held: &[(SeriesId, Day)],
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.mark_live(live);
        for (series, day) in held {
            inner.server_series.insert((server, *day, *series));
        }
        Ok(())
    }

    fn unexpire_day(&self, series: SeriesId, day: Day) -> Result<(), StoreError> {
        self.lock().expired.remove(&(day, series));
        Ok(())
    }

    fn stream_position(&self, subject: u32) -> Result<Option<StreamPosition>, StoreError> {
        Ok(self.lock().positions.get(&subject).cloned())
    }

    fn put_stream_position(
        &self,
        subject: u32,
        position: &StreamPosition,
    ) -> Result<(), StoreError> {
        self.lock().positions.insert(subject, position.clone());
        Ok(())
    }
}

/// One server's live hours and day summaries as one mask per day, so an hour in both
/// counts once.
fn live_masks<'a>(
    live: impl Iterator<Item = &'a (ServerId, Hour)>,
    summaries: impl Iterator<Item = (&'a (ServerId, Day), &'a u32)>,
) -> LiveMasks {
    let mut masks = LiveMasks::default();
    for (_, hour) in live {
        masks.add(hour.day(), hour_bit(*hour));
    }
    for (&(_, day), &mask) in summaries {
        masks.add(day, mask);
    }
    masks
}
