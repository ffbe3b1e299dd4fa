//! The hour cache: the merge of one hour's rows of one series over one server selection,
//! kept in memory and used only while no write has touched that hour since it was
//! merged.
//!
//! Why: a range a user types (`--from -7d`) rarely starts at midnight, so besides its
//! whole days, which daily rollups answer, it has up to 46 hours at its edges, and the
//! last day is still open, so it has no rollup at all. Over 100 servers that was about
//! 2,400 hourly rows to read, decode and merge for every question. With the cache, a
//! question asked again merges one sketch per edge hour (docs/BENCHMARKS.md).
//!
//! **Validity.** The store keeps a generation per (series, hour) — a counter in one of
//! [`SLOTS`] slots chosen by hash, plus one counter for the whole store — and raises it
//! *after* every write that changes that hour's rows ([`HourCache::written`]) or may have
//! changed any hour's ([`HourCache::written_everywhere`]: retention's deletes). A reader
//! takes the generation *before* it reads the rows and files the merge under it; an entry
//! is used only if the generation is still the same. So a merge that may have missed a
//! write is never used once that write is acknowledged: if the write landed before the
//! reader took the generation, the rows it read include it; if after, the generation
//! moved on. Two hours that share a slot only invalidate each other more often.
//!
//! **What is cached.** Only kinds whose merge gives the same bytes in any order (distinct
//! sketches: register maxima), so that a merge of cached hours is the merge of the rows
//! in the planner's canonical order (`planner` module docs). Frequent-items summaries
//! are not associative byte for byte and are never cached.
//!
//! **Memory.** Bounded by `storage.query_cache_mib` (the sketches' own sizes and the keys'
//! server lists); past it the least recently used entries go until a quarter is free.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hourglass_sketch::Sketch;

use crate::keys::{Hour, SeriesId, ServerId};

/// Generation slots: 65,536 counters (512 KiB).
pub(crate) const SLOTS: usize = 1 << 16;

/// Which rows of an hour a cached merge is of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HourSelection {
    /// The series.
    pub(crate) series: SeriesId,
    /// The hour.
    pub(crate) hour: Hour,
    /// The servers whose rows are merged, in id order: the selection's servers as the
    /// registry listed them, also when it selects all of them (a server registered since
    /// makes a new selection, so rows the registry did not list then are never left out).
    pub(crate) servers: Arc<[ServerId]>,
}

/// A cached merge: the sketch (none if the hour has no rows of the selection) and how
/// many rows went into it, which the answer reports as merged.
#[derive(Debug, Clone)]
pub(crate) struct HourMerge {
    /// The merge of the rows.
    pub(crate) sketch: Option<Sketch>,
    /// Rows merged.
    pub(crate) rows: u64,
}

struct Entry {
    generation: u64,
    merge: HourMerge,
    bytes: usize,
    used: u64,
}

#[derive(Default)]
struct Entries {
    map: HashMap<HourSelection, Entry>,
    bytes: usize,
    clock: u64,
}

/// How often the cache answered, for the admin `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HourCacheStats {
    /// Hours answered from the cache.
    pub hits: u64,
    /// Hours merged from their rows (absent, or written since).
    pub misses: u64,
    /// Bytes of sketches held.
    pub bytes: u64,
}

/// The hour cache of one store (module docs).
pub struct HourCache {
    slots: Box<[AtomicU64]>,
    everything: AtomicU64,
    capacity: usize,
    entries: Mutex<Entries>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for HourCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HourCache")
            .field("capacity", &self.capacity)
            .finish()
    }
}

fn slot(series: SeriesId, hour: Hour) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (series.0, hour.0).hash(&mut h);
    (h.finish() as usize) & (SLOTS - 1)
}

impl HourCache {
    /// A cache holding at most `capacity` bytes of sketches; 0 keeps none (the
    /// generations are still kept, and cost nothing to raise).
    pub(crate) fn new(capacity: usize) -> HourCache {
        HourCache {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            everything: AtomicU64::new(0),
            capacity,
            entries: Mutex::new(Entries::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Whether entries are kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// The generation of `(series, hour)`: take it before reading the hour's rows.
    pub(crate) fn generation(&self, series: SeriesId, hour: Hour) -> u64 {
        // Both counters only grow, so their sum moves whenever either does.
        self.everything.load(Ordering::SeqCst)
            + self.slots[slot(series, hour)].load(Ordering::SeqCst)
    }

    /// Call after a write that changed rows of `(series, hour)` is in the store.
    pub(crate) fn written(&self, series: SeriesId, hour: Hour) {
        self.slots[slot(series, hour)].fetch_add(1, Ordering::SeqCst);
    }

    /// Call after a write that may have changed the rows of any hour is in the store.
    pub(crate) fn written_everywhere(&self) {
        self.everything.fetch_add(1, Ordering::SeqCst);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // The entries are a cache: one left half-updated by a panic is still a map of
        // valid entries (each is replaced whole).
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The merge filed under `selection` if it was made at `generation`.
    pub(crate) fn get(&self, selection: &HourSelection, generation: u64) -> Option<HourMerge> {
        let mut entries = self.lock();
        entries.clock += 1;
        let clock = entries.clock;
        let found = match entries.map.get_mut(selection) {
            Some(entry) if entry.generation == generation => {
                entry.used = clock;
                Some(entry.merge.clone())
            }
            Some(_) => {
                let stale = entries.map.remove(selection).expect("just found");
                entries.bytes -= stale.bytes;
                None
            }
            None => None,
        };
        drop(entries);
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Files `merge`, made from rows read after taking `generation`.
    pub(crate) fn put(&self, selection: HourSelection, generation: u64, merge: HourMerge) {
        // The key's server list counts too (shared between a query's hours, so this
        // overcounts: the bound holds).
        let bytes = merge.sketch.as_ref().map_or(0, Sketch::size_bytes)
            + selection.servers.len() * size_of::<ServerId>()
            + 64;
        if bytes > self.capacity / 4 {
            return;
        }
        let mut entries = self.lock();
        entries.clock += 1;
        let used = entries.clock;
        if let Some(old) = entries.map.insert(
            selection,
            Entry {
                generation,
                merge,
                bytes,
                used,
            },
        ) {
            entries.bytes -= old.bytes;
        }
        entries.bytes += bytes;
        if entries.bytes > self.capacity {
            // Least recently used first, until a quarter of the capacity is free.
            let mut by_use: Vec<(u64, HourSelection)> = entries
                .map
                .iter()
                .map(|(k, e)| (e.used, k.clone()))
                .collect();
            by_use.sort_unstable_by_key(|(used, _)| *used);
            for (_, key) in by_use {
                if entries.bytes <= self.capacity / 4 * 3 {
                    break;
                }
                if let Some(gone) = entries.map.remove(&key) {
                    entries.bytes -= gone.bytes;
                }
            }
        }
    }

    /// Hits, misses and bytes held.
    pub(crate) fn stats(&self) -> HourCacheStats {
        HourCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes: self.lock().bytes as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hourglass_sketch::distinct::Distinct;
    use hourglass_sketch::ull::Ull;

    fn sketch(items: u32) -> Sketch {
        let mut s = Ull::new(10).unwrap();
        (0..items).for_each(|i| s.insert(&i.to_le_bytes()));
        Sketch::Distinct(Distinct::from(s))
    }

    fn at(hour: u32) -> HourSelection {
        HourSelection {
            series: SeriesId(1),
            hour: Hour(hour),
            servers: Arc::from(vec![ServerId(1)]),
        }
    }

    fn merge(items: u32) -> HourMerge {
        HourMerge {
            sketch: Some(sketch(items)),
            rows: 1,
        }
    }

    #[test]
    fn an_entry_is_used_only_at_its_generation() {
        let cache = HourCache::new(1 << 20);
        let g = cache.generation(SeriesId(1), Hour(5));
        cache.put(at(5), g, merge(3));
        assert!(cache.get(&at(5), g).is_some());
        cache.written(SeriesId(1), Hour(5));
        let after = cache.generation(SeriesId(1), Hour(5));
        assert_ne!(after, g);
        assert!(
            cache.get(&at(5), after).is_none(),
            "a write makes the entry stale"
        );
        // The stale entry was dropped, not kept for the old generation.
        assert!(cache.get(&at(5), g).is_none());
        let g6 = cache.generation(SeriesId(1), Hour(6));
        cache.put(at(6), g6, merge(3));
        cache.written_everywhere();
        assert!(
            cache
                .get(&at(6), cache.generation(SeriesId(1), Hour(6)))
                .is_none()
        );
        assert_eq!(cache.stats().hits, 1);
    }

    #[test]
    fn selections_of_different_servers_are_different_entries() {
        let cache = HourCache::new(1 << 20);
        let g = cache.generation(SeriesId(1), Hour(5));
        let some = HourSelection {
            servers: Arc::from(vec![ServerId(1), ServerId(2)]),
            ..at(5)
        };
        cache.put(some.clone(), g, merge(3));
        assert!(cache.get(&at(5), g).is_none());
        assert!(cache.get(&some, g).is_some());
    }

    #[test]
    fn memory_stays_within_the_capacity() {
        let one = sketch(2000).size_bytes() + size_of::<ServerId>() + 64;
        let cache = HourCache::new(one * 10);
        for hour in 0..100 {
            let g = cache.generation(SeriesId(1), Hour(hour));
            cache.put(at(hour), g, merge(2000));
            assert!(cache.stats().bytes as usize <= one * 10);
        }
        // The most recent entries are the ones kept.
        let g = cache.generation(SeriesId(1), Hour(99));
        assert!(cache.get(&at(99), g).is_some());
        let g = cache.generation(SeriesId(1), Hour(0));
        assert!(cache.get(&at(0), g).is_none());
        // Nothing is kept at capacity 0.
        let none = HourCache::new(0);
        none.put(at(1), 0, merge(1));
        assert!(none.get(&at(1), 0).is_none());
    }

    /// The cache's bound counts each entry's key too, not only its sketch plus 64 bytes: the
    /// server list (`Arc<[ServerId]>`) of a selection by name or label. Each entry keeps the
    /// list of the query that filed it (a stale entry is removed by `get` and refiled by the
    /// next query with that query's own list), so with a large selection and small or empty
    /// hours the memory held would otherwise be many times `query_cache_mib`.
    #[test]
    fn server_lists_in_keys_count_against_capacity() {
        let capacity = 1 << 20;
        let cache = HourCache::new(capacity);
        let servers_per_selection = 20_000usize;
        let key_bytes = servers_per_selection * std::mem::size_of::<ServerId>();
        let mut kept = Vec::new();
        for hour in 0..64u32 {
            // One query each, over the same 20,000 servers (a label selection).
            let servers: Arc<[ServerId]> =
                (0..servers_per_selection as u32).map(ServerId).collect();
            let selection = HourSelection {
                series: SeriesId(1),
                hour: Hour(hour),
                servers,
            };
            let g = cache.generation(SeriesId(1), Hour(hour));
            cache.put(
                selection.clone(),
                g,
                HourMerge {
                    sketch: None,
                    rows: 0,
                },
            );
            kept.push((selection, g));
        }
        let held = kept
            .iter()
            .filter(|(s, g)| cache.get(s, *g).is_some())
            .count();
        let key_memory = held * key_bytes;
        assert!(
            key_memory <= capacity,
            "{held} entries hold {key_memory} bytes of server lists in a cache of {capacity} bytes \
             that reports {} bytes",
            cache.stats().bytes
        );
    }

    /// An older merge filed after a newer one (two queries racing across a write) replaces
    /// it, but is never used at the newer generation: only a miss follows.
    #[test]
    fn an_older_merge_filed_late_is_never_used() {
        let cache = HourCache::new(1 << 20);
        let at = HourSelection {
            series: SeriesId(3),
            hour: Hour(9),
            servers: Arc::from(vec![ServerId(1), ServerId(4)]),
        };
        let merge = |n: u32| HourMerge {
            sketch: Some(sketch(n)),
            rows: u64::from(n),
        };
        let old = cache.generation(SeriesId(3), Hour(9));
        cache.written(SeriesId(3), Hour(9));
        let new = cache.generation(SeriesId(3), Hour(9));
        cache.written_everywhere();
        let newest = cache.generation(SeriesId(3), Hour(9));
        assert!(old < new && new < newest);
        cache.put(at.clone(), newest, merge(5));
        cache.put(at.clone(), old, merge(1));
        assert!(cache.get(&at, newest).is_none());
        cache.put(at.clone(), newest, merge(5));
        assert_eq!(cache.get(&at, newest).map(|m| m.rows), Some(5));
    }
}
