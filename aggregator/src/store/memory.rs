//! [`MemoryStore`]: the [`Store`] semantics on ordered maps in memory, for tests of
//! everything above storage (the planner, the services) and as the reference the RocksDB
//! store is tested against.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use super::{
    Bytes, DayConflict, DirtyDay, HourCache, PutOutcome, SeriesName, ServerEntry, Store,
    StoreError, StoredSketch, StreamPosition, check_frame, check_hourly_batch, check_rollups,
    is_empty_range, mask_span, mask_within, sorted_labels, span_union,
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
    /// (server, day, series) for every stored snapshot: [`Store::server_series`].
    server_series: BTreeSet<(ServerId, Day, SeriesId)>,
    /// Cluster mode: subject → [`Store::stream_position`].
    positions: HashMap<u32, StreamPosition>,
    next_mark: u64,
}

impl Inner {
    fn mark(&mut self, series: SeriesId, day: Day) {
        self.next_mark += 1;
        self.dirty.insert((day, series), self.next_mark);
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
}

impl Store for MemoryStore {
    fn put_index(
        &self,
        live: Option<(ServerId, &[Hour])>,
        server: ServerId,
        held: &[(SeriesId, Day)],
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if let Some((server, hours)) = live {
            inner.live.extend(hours.iter().map(|h| (server, *h)));
        }
        for (series, day) in held {
            inner.server_series.insert((server, *day, *series));
        }
        Ok(())
    }

    fn hour_cache(&self) -> Option<&HourCache> {
        Some(&self.hour_cache)
    }

    fn put_push(
        &self,
        live: Option<(ServerId, &[Hour])>,
        batch: &[(HourKey, u64, Bytes)],
    ) -> Result<Vec<PutOutcome>, StoreError> {
        check_hourly_batch(batch)?;
        let mut inner = self.lock();
        if let Some((server, hours)) = live {
            inner.live.extend(hours.iter().map(|h| (server, *h)));
        }
        let mut outcomes = Vec::with_capacity(batch.len());
        for (key, version, sketch) in batch {
            let held = inner.hourly.get(key).map(|s| s.version);
            inner
                .server_series
                .insert((key.server, key.hour.day(), key.series));
            match held {
                Some(held) if held >= *version => outcomes.push(PutOutcome::Stale { held }),
                _ => {
                    inner.hourly.insert(
                        *key,
                        StoredSketch {
                            version: *version,
                            sketch: sketch.to_vec(),
                        },
                    );
                    inner.mark(key.series, key.hour.day());
                    outcomes.push(PutOutcome::Stored);
                }
            }
        }
        drop(inner);
        for ((key, _, _), outcome) in batch.iter().zip(&outcomes) {
            if *outcome == PutOutcome::Stored {
                self.hour_cache.written(key.series, key.hour);
            }
        }
        Ok(outcomes)
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
        // Copy out first: `visit` may call back into the store, which would deadlock on
        // the mutex if it were still held.
        let rows: Vec<(HourKey, StoredSketch)> = {
            let inner = self.lock();
            inner
                .hourly
                .range(HourKey::first_of(series, hours.start)..HourKey::first_of(series, hours.end))
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        };
        for (key, stored) in &rows {
            if !visit(*key, stored) {
                break;
            }
        }
        Ok(())
    }

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
        let rows: Vec<(DayKey, Vec<u8>)> = {
            let inner = self.lock();
            inner
                .rollups
                .range(first(days.start)..first(days.end))
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        };
        for (key, sketch) in &rows {
            if !visit(*key, sketch) {
                break;
            }
        }
        Ok(())
    }

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
            let bit = 1u32 << (hour.0 - hour.day().first_hour().0);
            *inner.live_days.entry((server, hour.day())).or_default() |= bit;
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

    fn mark_day_conflict(
        &self,
        series: SeriesId,
        day: Day,
        mark: u64,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        inner
            .rollups
            .retain(|k, _| !(k.series == series && k.day == day));
        inner.conflicts.insert((day, series), reason.to_string());
        inner.built.insert((day, series), mark);
        Ok(inner.dirty.get(&(day, series)) == Some(&mark))
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

    fn mark_day_dirty(&self, series: SeriesId, day: Day) -> Result<(), StoreError> {
        self.lock().mark(series, day);
        Ok(())
    }

    fn dirty_days(&self, before: Day, limit: usize) -> Result<Vec<DirtyDay>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .dirty
            .range(..(before, SeriesId(0)))
            .filter(|(key, mark)| inner.built.get(key) != Some(mark))
            .take(limit)
            .map(|(&(day, series), &mark)| DirtyDay { series, day, mark })
            .collect())
    }

    fn is_day_dirty(&self, series: SeriesId, day: Day) -> Result<bool, StoreError> {
        let inner = self.lock();
        let key = (day, series);
        Ok(inner
            .dirty
            .get(&key)
            .is_some_and(|m| inner.built.get(&key) != Some(m)))
    }

    fn replace_rollups(
        &self,
        series: SeriesId,
        day: Day,
        rollups: Vec<(DayKey, Vec<u8>)>,
        mark: u64,
    ) -> Result<bool, StoreError> {
        check_rollups(&rollups)?;
        let mut inner = self.lock();
        inner
            .rollups
            .retain(|k, _| !(k.series == series && k.day == day));
        inner.rollups.extend(rollups);
        inner.conflicts.remove(&(day, series));
        inner.built.insert((day, series), mark);
        Ok(inner.dirty.get(&(day, series)) == Some(&mark))
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

    fn put_copied_day(
        &self,
        series: SeriesId,
        day: Day,
        rollups: Vec<(DayKey, Vec<u8>)>,
    ) -> Result<(), StoreError> {
        check_rollups(&rollups)?;
        let mut inner = self.lock();
        inner
            .rollups
            .retain(|k, _| !(k.series == series && k.day == day));
        inner.rollups.extend(rollups);
        inner.expired.insert((day, series));
        Ok(())
    }

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
        // One mask per day, from hourly records and summaries alike, so an hour in both
        // counts once.
        let mut masks: BTreeMap<Day, u32> = BTreeMap::new();
        for (_, hour) in inner.live.range((server, hours.start)..(server, hours.end)) {
            *masks.entry(hour.day()).or_default() |= 1 << (hour.0 - hour.day().first_hour().0);
        }
        let last_day = Hour(hours.end.0 - 1).day();
        for (&(_, day), &mask) in inner
            .live_days
            .range((server, hours.start.day())..=(server, last_day))
        {
            *masks.entry(day).or_default() |= mask_within(day, mask, &hours);
        }
        Ok(masks.values().map(|m| u64::from(m.count_ones())).sum())
    }

    fn live_span(&self, server: ServerId) -> Result<Option<Range<Hour>>, StoreError> {
        let inner = self.lock();
        let all = (server, Hour(0))..=(server, Hour(u32::MAX));
        let mut hours = inner.live.range(all);
        let hourly = hours
            .next()
            .map(|&(_, first)| first..Hour(hours.next_back().map_or(first, |l| l.1).0 + 1));
        let days = (server, Day(0))..=(server, Day(u32::MAX));
        let mut summaries = inner.live_days.range(days);
        let first = summaries.next().and_then(|(&(_, d), &m)| mask_span(d, m));
        let last = summaries
            .next_back()
            .and_then(|(&(_, d), &m)| mask_span(d, m));
        Ok(span_union(hourly, span_union(first, last)))
    }
}

/// The id after `last` (ids start at 1; 0 is never assigned, so a zeroed key field is never
/// a real series or server). `u32::MAX` is reserved for [`ServerId::ALL`].
pub(super) fn next_id(last: Option<u32>, what: &'static str) -> Result<u32, StoreError> {
    match last {
        None => Ok(1),
        Some(last) if last < u32::MAX - 1 => Ok(last + 1),
        Some(_) => Err(StoreError::IdsExhausted {
            what,
            limit: u64::from(u32::MAX - 1),
        }),
    }
}
