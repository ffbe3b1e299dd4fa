//! [`RocksStore`]: the [`Store`] on RocksDB, one database per aggregator.
//!
//! Three column families (docs/STORAGE.md explains every option chosen here):
//!
//! | column family | key | value |
//! |---|---|---|
//! | `hourly` | [`HourKey`], 20 bytes | `version (u64 BE) \| framed sketch` |
//! | `rollups` | [`DayKey`], 12 bytes | framed sketch |
//! | `meta` | named prefixes, below | small records |
//!
//! `meta` keys, each a readable prefix and big-endian ids so ranges list in id order:
//!
//! ```text
//! schema_version                   -> u32 BE (1)
//! series/name/<encoded name>       -> series id (u32 BE)
//! series/id/<series id>            -> encoded name
//! server/name/<name bytes>         -> server id (u32 BE)
//! server/id/<server id>            -> encoded name and labels
//! dirty/<day BE><series id BE>     -> mark (u64 BE) of the day's latest stored snapshot
//! built/<day BE><series id BE>     -> mark (u64 BE) the day's rollups were built from
//! live/<server id BE><hour BE>     -> empty: the server was up and ingesting that hour
//! cluster/position/<subject BE>    -> applied (u64 BE) | delivered (u64 BE) | consumer:
//!                                     cluster mode's position in a subject of the stream
//! ```
//!
//! A day is dirty while its dirty mark differs from its built mark (see [`super::DirtyDay`]).
//! Marks come from a counter seeded with the clock at open, so they never repeat across
//! restarts.
//!
//! Encoded names are length-prefixed (u32 BE length, then bytes) field by field, so two
//! different names never encode alike: `kind code (1) | metric | tag count (u32 BE) |
//! key | value | ...` for a series, `name | label count | key | value | ...` for a server.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use hourglass_sketch::Kind;
use rocksdb::properties::{
    ACTUAL_DELAYED_WRITE_RATE, CUR_SIZE_ALL_MEM_TABLES, ESTIMATE_LIVE_DATA_SIZE, ESTIMATE_NUM_KEYS,
    ESTIMATE_PENDING_COMPACTION_BYTES, IS_WRITE_STOPPED, NUM_RUNNING_COMPACTIONS,
    TOTAL_SST_FILES_SIZE,
};
use rocksdb::{
    BlockBasedOptions, BottommostLevelCompaction, Cache, ColumnFamily, ColumnFamilyDescriptor,
    CompactOptions, DB, DBCompressionType, DBRawIterator, ErrorKind, Options, ReadOptions,
    SliceTransform, WriteBatch, WriteOptions,
};

use super::rules::{LiveMasks, hour_bit, is_dirty, next_id, put_outcome};
use super::{
    Bytes, DayConflict, DayRecord, DayWrite, Dictionaries, DirtyDay, HourCache, Hourly, PutOutcome,
    Replica, Retention, Rollups, SCHEMA_UPGRADES_FROM, SCHEMA_VERSION, SeriesName, ServerEntry,
    ServerIndex, StoreError, StoredSketch, StreamPosition, check_frame, is_empty_range,
    sorted_labels,
};
use crate::keys::{
    Day, DayKey, Hour, HourKey, PREFIX_LEN, SeriesId, ServerId, day_range_bounds,
    hour_range_bounds, meta,
};

mod live;
mod options;
mod values;

use options::cf_options;
use values::*;

const CF_HOURLY: &str = "hourly";
const CF_ROLLUPS: &str = "rollups";
const CF_META: &str = "meta";
const COLUMN_FAMILIES: [&str; 3] = [CF_HOURLY, CF_ROLLUPS, CF_META];

/// Bytes of the version in front of every hourly value.
const VERSION_LEN: usize = 8;

/// Locks striping the read-modify-write of [`Hourly::put_hourly`]. A batch comes from one
/// agent, so one (server, epoch), so it nearly always takes a single stripe, and pushes
/// from different agents proceed (and share WAL syncs) in parallel.
const WRITE_STRIPES: usize = 64;

/// How a [`RocksStore`] is tuned. Each field is explained in docs/STORAGE.md.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreOptions {
    /// Sync the WAL before a write returns, so an acknowledged push survives a crash of
    /// the machine, not only of the process. Default true; off only for tests and
    /// throwaway stores.
    pub(crate) sync_writes: bool,
    /// Size of the LRU block cache shared by all column families, holding data blocks,
    /// indexes and Bloom filters. Default 256 MiB.
    pub(crate) block_cache_bytes: usize,
    /// Bloom filter bits per key: 10 gives about 1% false positives. Default 10.
    pub(crate) bloom_bits_per_key: f64,
    /// Compress what is stored with ZSTD at its fastest level: each hourly value as it is
    /// written, and the SST files of the other column families. Default true.
    pub(crate) compression: bool,
    /// Size of one memtable per column family before it is flushed. Default 64 MiB.
    pub(crate) write_buffer_bytes: usize,
    /// Bytes of merged hours the hour cache keeps for queries (`cache` module); 0 keeps
    /// none. Default 64 MiB.
    pub(crate) query_cache_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            sync_writes: true,
            block_cache_bytes: 256 << 20,
            bloom_bits_per_key: 10.0,
            compression: true,
            write_buffer_bytes: 64 << 20,
            query_cache_bytes: 64 << 20,
        }
    }
}

/// Size and health of one column family, for the admin `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CfStats {
    /// The column family (`hourly`, `rollups`, `meta`).
    pub name: &'static str,
    /// Bytes of its SST files on disk (`rocksdb.total-sst-files-size`).
    pub sst_bytes: u64,
    /// Estimated bytes of live data, without obsolete versions
    /// (`rocksdb.estimate-live-data-size`).
    pub(crate) live_data_bytes: u64,
    /// Bytes in its memtables, not yet flushed (`rocksdb.cur-size-all-mem-tables`).
    pub(crate) memtable_bytes: u64,
    /// Estimated number of keys (`rocksdb.estimate-num-keys`).
    pub(crate) estimated_keys: u64,
    /// Bytes compaction must rewrite to bring every level within its target size
    /// (`rocksdb.estimate-pending-compaction-bytes`); when it grows, writes get slowed.
    pub(crate) pending_compaction_bytes: u64,
}

/// Storage statistics of a [`RocksStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreStats {
    /// One entry per column family.
    pub column_families: Vec<CfStats>,
    /// Bytes used in the shared block cache.
    pub(crate) block_cache_usage_bytes: u64,
    /// Capacity of the shared block cache.
    pub(crate) block_cache_capacity_bytes: u64,
    /// Compactions running now (`rocksdb.num-running-compactions`).
    pub(crate) running_compactions: u64,
    /// Write rate RocksDB currently throttles to, bytes/s; 0 when writes are not delayed
    /// (`rocksdb.actual-delayed-write-rate`).
    pub(crate) delayed_write_rate: u64,
    /// Whether writes are stopped until compaction catches up (`rocksdb.is-write-stopped`).
    pub(crate) write_stopped: bool,
    /// The hour cache's hits, misses and size.
    pub(crate) hour_cache: super::HourCacheStats,
}

/// The RocksDB store. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct RocksStore {
    db: DB,
    dir: PathBuf,
    cache: Cache,
    cache_capacity: usize,
    write_options: WriteOptions,
    /// The writes of a [`Replica::write_group`]: not synced one by one.
    group_write_options: WriteOptions,
    /// Whether writes are synced ([`StoreOptions::sync_writes`]); a write group syncs at
    /// its end only then.
    sync_writes: bool,
    write_stripes: Vec<Mutex<()>>,
    // Serialises id allocation and label updates of the dictionaries, whose
    // check-then-insert must not interleave.
    meta_lock: Mutex<()>,
    /// The dictionaries' ids by name key, as read or assigned ([`RocksStore::meta_id_of`]):
    /// a name's id never changes once assigned and is never deleted, and every push looks
    /// up each of its series (a read of the metadata column, whose memtable the positions
    /// and marks rewritten on every write keep large: 7% of a cluster node's CPU).
    ids: Mutex<HashMap<Box<[u8]>, u32>>,
    next_mark: AtomicU64,
    hour_cache: HourCache,
    live_cache: live::LiveCache,
    /// Compress each hourly value as it is written (`StoreOptions::compression`).
    compress_values: bool,
}

impl std::fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksStore")
            .field("dir", &self.dir)
            .finish()
    }
}

impl RocksStore {
    /// Opens the store in `dir`, creating it (and `dir`) if missing. Fails with
    /// [`StoreError::InUse`] if another process has it open, and with
    /// [`StoreError::SchemaVersion`] if it was written by an incompatible build.
    pub fn open(dir: impl AsRef<Path>, options: &StoreOptions) -> Result<RocksStore, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        // RocksDB creates only the last component of the path.
        std::fs::create_dir_all(&dir)
            .map_err(|e| StoreError::Io(format!("creating {}: {e}", dir.display())))?;
        let cache = Cache::new_lru_cache(options.block_cache_bytes);

        let mut db_options = Options::default();
        db_options.create_if_missing(true);
        db_options.create_missing_column_families(true);
        // The column families share one WAL; a WAL file can be deleted only once every
        // column family with data in it has flushed. `meta` is written rarely and would
        // keep old WAL files alive for ever; this cap forces its flush instead.
        db_options.set_max_total_wal_size(256 << 20);
        // RocksDB's info LOG otherwise keeps up to 1000 old files.
        db_options.set_keep_log_file_num(5);
        db_options.set_max_log_file_size(16 << 20);
        // Pushes are many concurrent synced writes: with pipelining, one group's memtable
        // inserts overlap the next group's WAL write and sync. Measured +5 to 8% pushes/s
        // (docs/BENCHMARKS.md); durability is unchanged.
        db_options.set_enable_pipelined_write(true);
        // No WAL compression: hourly values, nearly all that is written, are compressed
        // once as they are written (`hourly_value`), and compressing them again in the
        // WAL (ZSTD at level 3, fixed) was a quarter of the aggregator's ingest CPU
        // (docs/BENCHMARKS.md, "Ingest CPU").

        // An error here means there is no database yet: it will be created.
        let existing = DB::list_cf(&Options::default(), &dir).ok();
        if let Some(cfs) = &existing
            && !cfs.iter().any(|cf| cf == CF_META)
        {
            return Err(StoreError::NotAStore {
                dir,
                reason: format!("it has no `meta` column family (it has {cfs:?})"),
            });
        }

        let descriptors = COLUMN_FAMILIES
            .iter()
            .map(|name| ColumnFamilyDescriptor::new(*name, cf_options(name, options, &cache)));
        let db = DB::open_cf_descriptors(&db_options, &dir, descriptors)
            .map_err(|e| open_error(&dir, e))?;
        for name in COLUMN_FAMILIES {
            if db.cf_handle(name).is_none() {
                return Err(StoreError::Engine(format!(
                    "column family {name} missing after open of {}",
                    dir.display()
                )));
            }
        }

        let mut write_options = WriteOptions::default();
        write_options.set_sync(options.sync_writes);
        // A write group's writes reach the WAL file unsynced; the group syncs it once.
        let mut group_write_options = WriteOptions::default();
        group_write_options.set_sync(false);
        let store = RocksStore {
            db,
            dir,
            cache,
            cache_capacity: options.block_cache_bytes,
            write_options,
            group_write_options,
            sync_writes: options.sync_writes,
            write_stripes: (0..WRITE_STRIPES).map(|_| Mutex::new(())).collect(),
            meta_lock: Mutex::new(()),
            ids: Mutex::new(HashMap::new()),
            next_mark: AtomicU64::new(
                (hourglass_rpc::time::since_unix_epoch().as_nanos() as u64).max(1),
            ),
            hour_cache: HourCache::new(options.query_cache_bytes),
            live_cache: live::LiveCache::default(),
            compress_values: options.compression,
        };
        store.check_schema()?;
        Ok(store)
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes every memtable to SST files. Not needed for durability (the WAL gives
    /// that); useful before measuring sizes or taking a checkpoint.
    pub fn flush(&self) -> Result<(), StoreError> {
        for name in COLUMN_FAMILIES {
            self.db.flush_cf(self.cf(name)).map_err(engine_error)?;
        }
        Ok(())
    }

    /// Compacts every column family fully, dropping deleted and replaced data now rather
    /// than when compaction gets there on its own. Expensive; for tests, measurements and
    /// operators reclaiming space after a large retention change.
    pub fn compact(&self) -> Result<(), StoreError> {
        let mut compact = CompactOptions::default();
        // Rewrite the bottommost level too: a plain compaction of a small database would
        // just move files down, keeping their old compression and range tombstones.
        compact.set_bottommost_level_compaction(BottommostLevelCompaction::ForceOptimized);
        for name in COLUMN_FAMILIES {
            self.db
                .compact_range_cf_opt(self.cf(name), None::<&[u8]>, None::<&[u8]>, &compact);
        }
        Ok(())
    }

    /// RocksDB's own account of the `hourly` column family (`rocksdb.cfstats`):
    /// compactions per level and write stalls, for benchmarks and investigations.
    pub fn engine_report(&self) -> String {
        self.db
            .property_value_cf(self.cf(CF_HOURLY), "rocksdb.cfstats")
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Sizes and health of the store, for the admin `/metrics`.
    pub fn stats(&self) -> Result<StoreStats, StoreError> {
        let mut column_families = Vec::with_capacity(COLUMN_FAMILIES.len());
        for name in COLUMN_FAMILIES {
            let cf = self.cf(name);
            let int = |property| -> Result<u64, StoreError> {
                Ok(self
                    .db
                    .property_int_value_cf(cf, property)
                    .map_err(engine_error)?
                    .unwrap_or(0))
            };
            column_families.push(CfStats {
                name,
                sst_bytes: int(TOTAL_SST_FILES_SIZE)?,
                live_data_bytes: int(ESTIMATE_LIVE_DATA_SIZE)?,
                memtable_bytes: int(CUR_SIZE_ALL_MEM_TABLES)?,
                estimated_keys: int(ESTIMATE_NUM_KEYS)?,
                pending_compaction_bytes: int(ESTIMATE_PENDING_COMPACTION_BYTES)?,
            });
        }
        let int = |property| -> Result<u64, StoreError> {
            Ok(self
                .db
                .property_int_value(property)
                .map_err(engine_error)?
                .unwrap_or(0))
        };
        Ok(StoreStats {
            column_families,
            block_cache_usage_bytes: self.cache.get_usage() as u64,
            block_cache_capacity_bytes: self.cache_capacity as u64,
            running_compactions: int(NUM_RUNNING_COMPACTIONS)?,
            delayed_write_rate: int(ACTUAL_DELAYED_WRITE_RATE)?,
            write_stopped: int(IS_WRITE_STOPPED)? != 0,
            hour_cache: self.hour_cache.stats(),
        })
    }

    /// After a write of `live` hours is in the store.
    fn live_written(&self, live: Option<(ServerId, &[Hour])>) {
        if let Some((server, hours)) = live
            && !hours.is_empty()
        {
            self.live_cache.written(server, hours);
        }
    }

    fn cf(&self, name: &str) -> &ColumnFamily {
        // `open` checked that all three exist, and column families are never dropped.
        self.db
            .cf_handle(name)
            .expect("column family checked at open")
    }

    /// A batch that replaces every rollup of `(series, day)` with `rollups` (their frames
    /// checked by the caller); none deletes them.
    fn rollups_batch(
        &self,
        series: SeriesId,
        day: Day,
        rollups: Vec<(DayKey, Vec<u8>)>,
    ) -> WriteBatch {
        let cf = self.cf(CF_ROLLUPS);
        let prefix = series_time_prefix(series.0, day.0);
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(cf, prefix.to_vec(), prefix_end(&prefix));
        for (key, sketch) in rollups {
            batch.put_cf(cf, key.encode(), sketch);
        }
        batch
    }

    fn write(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let options = match IN_WRITE_GROUP.get() {
            true => &self.group_write_options,
            false => &self.write_options,
        };
        self.db.write_opt(batch, options).map_err(engine_error)
    }

    /// Writes the schema version into a new store, or checks the one of an existing store.
    fn check_schema(&self) -> Result<(), StoreError> {
        let meta = self.cf(CF_META);
        match self
            .db
            .get_cf(meta, meta::SCHEMA_VERSION)
            .map_err(engine_error)?
        {
            Some(bytes) => {
                let found = u32::from_be_bytes(bytes.as_slice().try_into().map_err(|_| {
                    StoreError::BadValue {
                        column: CF_META,
                        key: meta::SCHEMA_VERSION.to_vec(),
                        reason: format!("schema version must be 4 bytes, found {}", bytes.len()),
                    }
                })?);
                if found == SCHEMA_VERSION {
                    return Ok(());
                }
                if found != SCHEMA_UPGRADES_FROM {
                    return Err(StoreError::SchemaVersion {
                        dir: self.dir.clone(),
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
                // Version 1 differs only in that its hourly values were never compressed:
                // this build reads those as they are, and marks the store so that an
                // older build, which cannot read compressed values, refuses it whole
                // instead of failing on them one query at a time.
                tracing::info!(
                    dir = %self.dir.display(),
                    from = found,
                    to = SCHEMA_VERSION,
                    "upgrading the store's schema version: hourly values written from now on are compressed; older ones are read as they are"
                );
                self.write_schema_version()
            }
            None => {
                // Only an empty database may be adopted: data without a schema version
                // was written by something else.
                for name in COLUMN_FAMILIES {
                    let mut it = self.db.raw_iterator_cf(self.cf(name));
                    it.seek_to_first();
                    if it.valid() {
                        return Err(StoreError::NotAStore {
                            dir: self.dir.clone(),
                            reason: format!("column family {name} has data but no schema version"),
                        });
                    }
                    it.status().map_err(engine_error)?;
                }
                self.write_schema_version()
            }
        }
    }

    /// Writes [`SCHEMA_VERSION`], synced: a store must never exist on disk without its
    /// version, nor hold compressed values under version 1.
    fn write_schema_version(&self) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        batch.put_cf(
            self.cf(CF_META),
            meta::SCHEMA_VERSION,
            SCHEMA_VERSION.to_be_bytes(),
        );
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        self.db.write_opt(batch, &sync).map_err(engine_error)
    }

    fn lock_stripes(&self, batch: &[(HourKey, u64, Bytes)]) -> Vec<MutexGuard<'_, ()>> {
        let mut stripes: Vec<usize> = batch.iter().map(|(key, _, _)| stripe_of(key)).collect();
        // Ascending order everywhere, so two batches can never wait on each other.
        stripes.sort_unstable();
        stripes.dedup();
        stripes
            .into_iter()
            .map(|i| lock_ignoring_poison(&self.write_stripes[i]))
            .collect()
    }

    /// The raw iterator used by scans: bounded to `[lo, hi)`, and in prefix mode when the
    /// whole range shares one 8-byte prefix, so RocksDB can skip every SST file whose
    /// prefix Bloom filter says the prefix is absent.
    fn bounded_iter(&self, cf: &str, lo: &[u8], hi: &[u8], one_prefix: bool) -> DBRawIterator<'_> {
        let mut read = ReadOptions::default();
        read.set_iterate_lower_bound(lo.to_vec());
        read.set_iterate_upper_bound(hi.to_vec());
        if one_prefix {
            read.set_prefix_same_as_start(true);
        } else {
            // With a prefix extractor configured, a seek may otherwise stop at the end of
            // the seek key's prefix; a multi-hour range must cross prefixes.
            read.set_total_order_seek(true);
        }
        let mut it = self.db.raw_iterator_cf_opt(self.cf(cf), read);
        it.seek(lo);
        it
    }

    /// The largest id under `prefix` in `meta`, if any.
    fn last_id(&self, prefix: &[u8]) -> Result<Option<u32>, StoreError> {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(prefix_end(prefix));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(CF_META), read);
        it.seek_to_last();
        if let Some(key) = it.key()
            && let Some(id) = key.strip_prefix(prefix)
        {
            return Ok(Some(meta_id(key, id)?));
        }
        it.status().map_err(engine_error)?;
        Ok(None)
    }

    /// The server ids with `meta` entries under `prefix` (keys `prefix | server | ...`),
    /// one seek per server.
    fn servers_under(&self, prefix: &[u8]) -> Result<Vec<u32>, StoreError> {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(prefix_end(prefix));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(CF_META), read);
        let mut servers = Vec::new();
        it.seek(prefix);
        while let Some(key) = it.key() {
            let server = meta_id(key, &key[prefix.len()..(prefix.len() + 4).min(key.len())])?;
            servers.push(server);
            match server.checked_add(1) {
                Some(next) => it.seek(meta::server_start(prefix, ServerId(next))),
                None => break,
            }
        }
        it.status().map_err(engine_error)?;
        Ok(servers)
    }

    /// Visits every `meta` entry under `prefix`, in key order.
    fn scan_meta(
        &self,
        prefix: &[u8],
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(prefix_end(prefix));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(CF_META), read);
        it.seek(prefix);
        while let Some((key, value)) = it.item() {
            visit(&key[prefix.len()..], value)?;
            it.next();
        }
        it.status().map_err(engine_error)
    }

    /// An iterator over all of `cf` for a retention pass: in total order, and without
    /// filling the block cache (a pass reads cold data once; it must not evict the hot
    /// blocks queries and writes use).
    fn retention_iterator(&self, cf: &ColumnFamily) -> DBRawIterator<'_> {
        let mut read = ReadOptions::default();
        read.set_total_order_seek(true);
        read.fill_cache(false);
        self.db.raw_iterator_cf_opt(cf, read)
    }

    /// Retention for one column family whose keys start `series(4) | time(4)`: one range
    /// tombstone `[series|0, series|cutoff)` for each series that has data before the
    /// cutoff. Returns how many keys the tombstones cover, counted just before.
    fn delete_before(&self, cf_name: &'static str, cutoff: u32) -> Result<u64, StoreError> {
        let cf = self.cf(cf_name);
        let mut it = self.retention_iterator(cf);
        let mut batch = WriteBatch::default();
        let mut deleted = 0u64;
        it.seek_to_first();
        while let Some(key) = it.key() {
            let (series, time) = series_and_time(cf_name, key)?;
            let lo = series_time_prefix(series, 0);
            let hi = series_time_prefix(series, cutoff);
            if time < cutoff {
                // Keys sort by time within a series, so everything from here to the
                // cutoff is expired.
                while let Some(key) = it.key() {
                    if key >= hi.as_slice() {
                        break;
                    }
                    deleted += 1;
                    it.next();
                }
                batch.delete_range_cf(cf, lo, hi);
            }
            // Skip the rest of this series: its data at or after the cutoff stays.
            match series.checked_add(1) {
                Some(next) => it.seek(series_time_prefix(next, 0)),
                None => break,
            }
        }
        it.status().map_err(engine_error)?;
        if !batch.is_empty() {
            self.write(batch)?;
        }
        Ok(deleted)
    }
}

impl RocksStore {
    /// Hourly retention by whole days: range tombstones over the hourly rows of every
    /// (series, day) before `day` not in `keep`, adjacent days in one range, and an
    /// expiry record for each, in a batch for the caller to finish and write. Returns it
    /// with how many rows the tombstones cover, counted just before.
    fn expire_hourly_days(
        &self,
        day: Day,
        keep: &BTreeSet<(SeriesId, Day)>,
    ) -> Result<(WriteBatch, u64), StoreError> {
        let cf = self.cf(CF_HOURLY);
        let meta = self.cf(CF_META);
        let mut it = self.retention_iterator(cf);
        let mut batch = WriteBatch::default();
        let mut deleted = 0u64;
        let cutoff = day.first_hour().0;
        it.seek_to_first();
        while let Some(key) = it.key() {
            let (series, _) = series_and_time(CF_HOURLY, key)?;
            // The open range of deletable days: [start, the day being read).
            let mut open: Option<u32> = None;
            while let Some(key) = it.key() {
                let (key_series, hour) = series_and_time(CF_HOURLY, key)?;
                if key_series != series || hour >= cutoff {
                    break;
                }
                let row_day = Hour(hour).day();
                let day_end = row_day.next().first_hour().0;
                if keep.contains(&(SeriesId(series), row_day)) {
                    if let Some(start) = open.take() {
                        let from = series_time_prefix(series, start);
                        let to = series_time_prefix(series, row_day.first_hour().0);
                        batch.delete_range_cf(cf, from, to);
                    }
                    it.seek(series_time_prefix(series, day_end));
                    continue;
                }
                open.get_or_insert(row_day.first_hour().0);
                batch.put_cf(
                    meta,
                    meta::day_series(meta::EXPIRED, SeriesId(series), row_day),
                    [],
                );
                // Count the day's rows, then go on from the next day.
                let end = series_time_prefix(series, day_end);
                while let Some(key) = it.key() {
                    if key >= end.as_slice() {
                        break;
                    }
                    deleted += 1;
                    it.next();
                }
            }
            if let Some(start) = open {
                let from = series_time_prefix(series, start);
                batch.delete_range_cf(cf, from, series_time_prefix(series, cutoff));
            }
            // Skip the rest of this series: its data at or after the cutoff stays.
            match series.checked_add(1) {
                Some(next) => it.seek(series_time_prefix(next, 0)),
                None => break,
            }
        }
        it.status().map_err(engine_error)?;
        Ok((batch, deleted))
    }
}

impl RocksStore {
    /// Adds `batch` to `write`, for [`Hourly::put_push`] with the batch's stripes held:
    /// each entry that replaces the version held (`rules::put_outcome`, against what is
    /// on disk or an earlier entry of the batch) with its dirty mark, and every entry's
    /// series index. Returns one outcome per entry, in order.
    fn add_hourly(
        &self,
        write: &mut WriteBatch,
        batch: &[(HourKey, u64, Bytes)],
    ) -> Result<Vec<PutOutcome>, StoreError> {
        let hourly = self.cf(CF_HOURLY);
        let meta = self.cf(CF_META);
        let keys: Vec<[u8; HourKey::LEN]> = batch.iter().map(|(key, _, _)| key.encode()).collect();
        let hour_keys: Vec<HourKey> = batch.iter().map(|(key, _, _)| *key).collect();
        let held = self.hourly_versions(&hour_keys)?;

        let mark = self.next_mark.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        let mut outcomes = Vec::with_capacity(batch.len());
        // Versions written earlier in this batch: a later entry for the same key competes
        // with them, not with what was on disk.
        let mut in_batch: HashMap<[u8; HourKey::LEN], u64> = HashMap::new();
        for (((hour_key, version, sketch), key), held) in batch.iter().zip(&keys).zip(held) {
            let held_version = in_batch.get(key).copied().or(held);
            let outcome = put_outcome(held_version, *version);
            if outcome == PutOutcome::Stored {
                write.put_cf(
                    hourly,
                    key,
                    hourly_value(*version, sketch, self.compress_values),
                );
                write.put_cf(
                    meta,
                    meta::day_series(meta::DIRTY, hour_key.series, hour_key.hour.day()),
                    mark,
                );
                in_batch.insert(*key, *version);
            }
            // Stale or not, the server holds the series that day: a store from before the
            // index learns it from the agent's next resend.
            write.put_cf(
                meta,
                meta::server_series(hour_key.server, hour_key.hour.day(), hour_key.series),
                [],
            );
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }
}

/// Adds the live hours of `live` (a server and the hours it declared) to `write`.
fn put_live(write: &mut WriteBatch, meta: &ColumnFamily, live: Option<(ServerId, &[Hour])>) {
    if let Some((server, hours)) = live {
        for hour in hours {
            write.put_cf(meta, meta::live(server, *hour), []);
        }
    }
}

/// Raises the caches' generations when dropped, at the end of a retention pass, whether
/// it wrote all it meant to, part of it (several writes) or nothing: rows and live records
/// it deleted must not be answered from memory.
struct RetentionEnd<'a>(&'a RocksStore);

impl Drop for RetentionEnd<'_> {
    fn drop(&mut self) {
        self.0.hour_cache.written_everywhere();
        self.0.live_cache.forget();
    }
}

thread_local! {
    /// Whether this thread runs a [`Replica::write_group`] of a [`RocksStore`]: its writes
    /// are then not synced one by one.
    static IN_WRITE_GROUP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Ends a write group on this thread however the group ends (a panic too).
struct GroupEnd;

impl Drop for GroupEnd {
    fn drop(&mut self) {
        IN_WRITE_GROUP.set(false);
    }
}

impl Hourly for RocksStore {
    fn write_push(
        &self,
        live: Option<(ServerId, &[Hour])>,
        batch: &[(HourKey, u64, Bytes)],
    ) -> Result<Vec<PutOutcome>, StoreError> {
        let mut write = WriteBatch::default();
        put_live(&mut write, self.cf(CF_META), live);
        if batch.is_empty() {
            if !write.is_empty() {
                self.write(write)?;
                self.live_written(live);
            }
            return Ok(Vec::new());
        }
        let _guards = self.lock_stripes(batch);
        let outcomes = self.add_hourly(&mut write, batch)?;
        if !write.is_empty() {
            self.write(write)?;
        }
        // After the write, not before: the live cache's rule of validity (`put_push` tells
        // the hour cache).
        self.live_written(live);
        Ok(outcomes)
    }

    fn hourly_versions(&self, keys: &[HourKey]) -> Result<Vec<Option<u64>>, StoreError> {
        let hourly = self.cf(CF_HOURLY);
        let keys: Vec<[u8; HourKey::LEN]> = keys.iter().map(HourKey::encode).collect();
        let values = self
            .db
            .multi_get_cf(keys.iter().map(|key| (hourly, key.as_slice())));
        keys.iter()
            .zip(values)
            .map(|(key, value)| match value.map_err(engine_error)? {
                Some(value) => stored_version(key, &value).map(Some),
                None => Ok(None),
            })
            .collect()
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
        let one_hour = hours.start.next() == hours.end;
        let (lo, hi) = hour_range_bounds(series, hours);
        let mut it = self.bounded_iter(CF_HOURLY, &lo, &hi, one_hour);
        while let Some((key, value)) = it.item() {
            let hour_key = HourKey::decode(key).map_err(|source| StoreError::BadKey {
                column: CF_HOURLY,
                source,
            })?;
            let stored = StoredSketch {
                version: stored_version(key, value)?,
                sketch: match hourly_sketch(key, value) {
                    Ok(sketch) => sketch,
                    Err(e) => {
                        // Passed on as stored, as a damaged uncompressed frame would be:
                        // it does not start with a sketch's magic, so whoever decodes it
                        // refuses it as corrupt, and a rollup pass or a query treats it
                        // as any sketch that does not decode (a conflict, counted), while
                        // readers that never decode it (a server left out) go on.
                        tracing::warn!(error = %e, "an hourly value does not unpack");
                        value.get(VERSION_LEN..).unwrap_or_default().to_vec()
                    }
                },
            };
            if !visit(hour_key, &stored) {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(engine_error)
    }

    fn hour_cache(&self) -> Option<&HourCache> {
        Some(&self.hour_cache)
    }
}

impl Rollups for RocksStore {
    fn put_rollup(&self, key: DayKey, sketch: Vec<u8>) -> Result<(), StoreError> {
        check_frame(&sketch, || format!("rollup {key:?}"))?;
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_ROLLUPS), key.encode(), sketch);
        self.write(batch)
    }

    fn get_rollup(&self, key: DayKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.db
            .get_cf(self.cf(CF_ROLLUPS), key.encode())
            .map_err(engine_error)
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
        let (lo, hi) = day_range_bounds(series, days);
        // `rollups` has no prefix extractor, so there is no prefix mode to choose.
        let mut it = self.bounded_iter(CF_ROLLUPS, &lo, &hi, false);
        while let Some((key, value)) = it.item() {
            let day_key = DayKey::decode(key).map_err(|source| StoreError::BadKey {
                column: CF_ROLLUPS,
                source,
            })?;
            if !visit(day_key, value) {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(engine_error)
    }

    fn mark_day_dirty(&self, series: SeriesId, day: Day) -> Result<(), StoreError> {
        let mark = self.next_mark.fetch_add(1, Ordering::Relaxed);
        let mut batch = WriteBatch::default();
        batch.put_cf(
            self.cf(CF_META),
            meta::day_series(meta::DIRTY, series, day),
            mark.to_be_bytes(),
        );
        self.write(batch)
    }

    fn dirty_days(&self, before: Day, limit: usize) -> Result<Vec<DirtyDay>, StoreError> {
        let meta = self.cf(CF_META);
        let mut found = Vec::new();
        let end = meta::day_start(meta::DIRTY, before);
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(end);
        let mut it = self.db.raw_iterator_cf_opt(meta, read);
        it.seek(meta::DIRTY);
        while found.len() < limit
            && let Some((key, value)) = it.item()
        {
            let (series, day) = day_series_fields(meta::DIRTY, key)?;
            let mark = mark_value(key, value)?;
            if is_dirty(Some(mark), self.built_mark(series, day)?) {
                found.push(DirtyDay { series, day, mark });
            }
            it.next();
        }
        it.status().map_err(engine_error)?;
        Ok(found)
    }

    fn is_day_dirty(&self, series: SeriesId, day: Day) -> Result<bool, StoreError> {
        let key = meta::day_series(meta::DIRTY, series, day);
        let dirty = match self
            .db
            .get_cf(self.cf(CF_META), &key)
            .map_err(engine_error)?
        {
            Some(value) => Some(mark_value(&key, &value)?),
            None => None,
        };
        // A day never marked needs no read of a built mark.
        let built = match dirty {
            Some(_) => self.built_mark(series, day)?,
            None => None,
        };
        Ok(is_dirty(dirty, built))
    }

    fn write_day(&self, write: DayWrite<'_>) -> Result<(), StoreError> {
        let DayWrite {
            series,
            day,
            rollups,
            record,
        } = write;
        let meta = self.cf(CF_META);
        let key = |prefix| meta::day_series(prefix, series, day);
        let mut batch = self.rollups_batch(series, day, rollups);
        match record {
            DayRecord::Built(mark) => {
                batch.put_cf(meta, key(meta::BUILT), mark.to_be_bytes());
                batch.delete_cf(meta, key(meta::CONFLICT));
            }
            DayRecord::Conflict { mark, reason } => {
                batch.put_cf(meta, key(meta::CONFLICT), reason.as_bytes());
                batch.put_cf(meta, key(meta::BUILT), mark.to_be_bytes());
            }
            DayRecord::Copied => batch.put_cf(meta, key(meta::EXPIRED), []),
        }
        self.write(batch)
    }

    fn day_conflicts(&self) -> Result<Vec<DayConflict>, StoreError> {
        let mut out = Vec::new();
        self.scan_meta(meta::CONFLICT, |fields, value| {
            let key = || [meta::CONFLICT, fields].concat();
            let (series, day) = day_series_fields(meta::CONFLICT, &key())?;
            let reason = String::from_utf8(value.to_vec()).map_err(|_| StoreError::BadValue {
                column: CF_META,
                key: key(),
                reason: "a conflict's reason must be UTF-8".into(),
            })?;
            out.push(DayConflict {
                series,
                day,
                reason,
            });
            Ok(())
        })?;
        Ok(out)
    }
}

impl Retention for RocksStore {
    fn delete_hourly_before(
        &self,
        day: Day,
        keep: &BTreeSet<(SeriesId, Day)>,
    ) -> Result<u64, StoreError> {
        let _after = RetentionEnd(self);
        let (mut batch, deleted) = self.expire_hourly_days(day, keep)?;
        let meta = self.cf(CF_META);
        // Liveness of those days folds into one mask per (server, day).
        let cutoff = day.first_hour();
        for server in self.servers_under(meta::LIVE)? {
            let id = ServerId(server);
            let mut masks: BTreeMap<Day, u32> = BTreeMap::new();
            let mut read = ReadOptions::default();
            read.set_iterate_upper_bound(meta::live(id, cutoff));
            let mut it = self.db.raw_iterator_cf_opt(meta, read);
            it.seek(meta::live(id, Hour(0)));
            while let Some(key) = it.key() {
                let hour = Hour(meta_id(key, after(key, meta::LIVE.len() + 4))?);
                *masks.entry(hour.day()).or_default() |= hour_bit(hour);
                it.next();
            }
            it.status().map_err(engine_error)?;
            for (live_day, mask) in masks {
                let key = meta::live_day(id, live_day);
                let held = match self.db.get_cf(meta, &key).map_err(engine_error)? {
                    Some(value) => live_mask(&key, &value)?,
                    None => 0,
                };
                batch.put_cf(meta, key, (held | mask).to_be_bytes());
            }
            batch.delete_range_cf(meta, meta::live(id, Hour(0)), meta::live(id, cutoff));
        }
        // The series index of those days goes.
        for server in self.servers_under(meta::SERVER_SERIES)? {
            let id = ServerId(server);
            batch.delete_range_cf(
                meta,
                meta::server_start(meta::SERVER_SERIES, id),
                meta::server_series_from(id, day),
            );
        }
        self.write(batch)?;
        Ok(deleted)
    }

    fn delete_rollups_before(&self, day: Day) -> Result<u64, StoreError> {
        let _after = RetentionEnd(self);
        let deleted = self.delete_before(CF_ROLLUPS, day.0)?;
        // Hourly rows kept past hourly retention (their day never rolled up) go with it.
        self.delete_before(CF_HOURLY, day.first_hour().0)?;
        let meta = self.cf(CF_META);
        let mut batch = WriteBatch::default();
        // Day-first keys: one range each. A dirty mark for a day past rollup retention
        // would build a rollup only to delete it.
        for prefix in [meta::DIRTY, meta::BUILT, meta::CONFLICT, meta::EXPIRED] {
            batch.delete_range_cf(meta, prefix.to_vec(), meta::day_start(prefix, day));
        }
        // Server-first keys: one range per server.
        for server in self.servers_under(meta::LIVE_DAY)? {
            let id = ServerId(server);
            batch.delete_range_cf(meta, meta::live_day(id, Day(0)), meta::live_day(id, day));
        }
        for server in self.servers_under(meta::LIVE)? {
            let id = ServerId(server);
            batch.delete_range_cf(
                meta,
                meta::live(id, Hour(0)),
                meta::live(id, day.first_hour()),
            );
        }
        self.write(batch)?;
        Ok(deleted)
    }

    fn is_day_expired(&self, series: SeriesId, day: Day) -> Result<bool, StoreError> {
        let key = meta::day_series(meta::EXPIRED, series, day);
        Ok(self
            .db
            .get_cf(self.cf(CF_META), key)
            .map_err(engine_error)?
            .is_some())
    }
}

impl Dictionaries for RocksStore {
    fn series_id(&self, series: &SeriesName) -> Result<Option<SeriesId>, StoreError> {
        let name_key = meta::by_name(meta::SERIES_BY_NAME, &encode_series_name(series));
        Ok(self.meta_id_of(&name_key)?.map(SeriesId))
    }

    fn series_id_or_create(&self, series: &SeriesName) -> Result<SeriesId, StoreError> {
        let meta = self.cf(CF_META);
        let name_key = meta::by_name(meta::SERIES_BY_NAME, &encode_series_name(series));
        if let Some(id) = self.meta_id_of(&name_key)? {
            return Ok(SeriesId(id));
        }
        let _meta = lock_ignoring_poison(&self.meta_lock);
        // Another caller may have created it between the lookup and the lock.
        if let Some(id) = self.meta_id_of(&name_key)? {
            return Ok(SeriesId(id));
        }
        let id = next_id(self.last_id(meta::SERIES_BY_ID)?, "series")?;
        let mut batch = WriteBatch::default();
        batch.put_cf(meta, &name_key, id.to_be_bytes());
        batch.put_cf(
            meta,
            meta::by_id(meta::SERIES_BY_ID, id),
            encode_series_name(series),
        );
        self.write(batch)?;
        self.remember_id(&name_key, id);
        Ok(SeriesId(id))
    }

    fn list_series(&self) -> Result<Vec<(SeriesId, SeriesName)>, StoreError> {
        let mut out = Vec::new();
        self.scan_meta(meta::SERIES_BY_ID, |id, value| {
            let id = meta_id(id, id)?;
            let name = decode_series_name(value).map_err(|reason| StoreError::BadValue {
                column: CF_META,
                key: meta::by_id(meta::SERIES_BY_ID, id),
                reason,
            })?;
            out.push((SeriesId(id), name));
            Ok(())
        })?;
        Ok(out)
    }

    fn server_id(&self, name: &str) -> Result<Option<ServerId>, StoreError> {
        let name_key = meta::by_name(meta::SERVER_BY_NAME, name.as_bytes());
        Ok(self.meta_id_of(&name_key)?.map(ServerId))
    }

    fn register_server(
        &self,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<ServerId, StoreError> {
        let meta = self.cf(CF_META);
        let name_key = meta::by_name(meta::SERVER_BY_NAME, name.as_bytes());
        let labels = sorted_labels(labels);
        let _meta = lock_ignoring_poison(&self.meta_lock);
        let entry = encode_server(name, &labels);
        match self.meta_id_of(&name_key)? {
            Some(id) => {
                let id_key = meta::by_id(meta::SERVER_BY_ID, id);
                let held = self.db.get_cf(meta, &id_key).map_err(engine_error)?;
                if held.as_deref() != Some(entry.as_slice()) {
                    let mut batch = WriteBatch::default();
                    batch.put_cf(meta, id_key, entry);
                    self.write(batch)?;
                }
                Ok(ServerId(id))
            }
            None => {
                let id = next_id(self.last_id(meta::SERVER_BY_ID)?, "server")?;
                let mut batch = WriteBatch::default();
                batch.put_cf(meta, &name_key, id.to_be_bytes());
                batch.put_cf(meta, meta::by_id(meta::SERVER_BY_ID, id), entry);
                self.write(batch)?;
                Ok(ServerId(id))
            }
        }
    }

    fn list_servers(&self) -> Result<Vec<ServerEntry>, StoreError> {
        let mut out = Vec::new();
        self.scan_meta(meta::SERVER_BY_ID, |id, value| {
            let id = meta_id(id, id)?;
            let (name, labels) = decode_server(value).map_err(|reason| StoreError::BadValue {
                column: CF_META,
                key: meta::by_id(meta::SERVER_BY_ID, id),
                reason,
            })?;
            out.push(ServerEntry {
                id: ServerId(id),
                name,
                labels,
            });
            Ok(())
        })?;
        Ok(out)
    }
}

impl ServerIndex for RocksStore {
    fn server_series(
        &self,
        server: ServerId,
        since: Day,
    ) -> Result<Vec<(SeriesId, Day)>, StoreError> {
        let prefix = meta::server_start(meta::SERVER_SERIES, server);
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(prefix_end(&prefix));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(CF_META), read);
        it.seek(meta::server_series_from(server, since));
        // Keys run day by day, so a later day overwrites an earlier one.
        let mut latest = HashMap::new();
        while let Some(key) = it.key() {
            // `day | series`, each checked to be 4 bytes by `meta_id`.
            let fields = &key[prefix.len()..];
            let (day, series) = fields.split_at(fields.len().min(4));
            let (day, series) = (meta_id(key, day)?, meta_id(key, series)?);
            latest.insert(SeriesId(series), Day(day));
            it.next();
        }
        it.status().map_err(engine_error)?;
        let mut latest: Vec<(SeriesId, Day)> = latest.into_iter().collect();
        latest.sort_unstable();
        Ok(latest)
    }

    fn live_hours(&self, server: ServerId, hours: Range<Hour>) -> Result<u64, StoreError> {
        if is_empty_range(&hours) {
            return Ok(0);
        }
        // `live/` and `liveday/` records alike, one mask per day, so an hour in both
        // counts once (live.rs).
        self.with_live(server, |masks| masks.count(&hours))
    }

    fn live_span(&self, server: ServerId) -> Result<Option<Range<Hour>>, StoreError> {
        self.with_live(server, LiveMasks::span)
    }
}

impl Replica for RocksStore {
    fn put_index(
        &self,
        live: Option<(ServerId, &[Hour])>,
        server: ServerId,
        held: &[(SeriesId, Day)],
    ) -> Result<(), StoreError> {
        let meta = self.cf(CF_META);
        let mut write = WriteBatch::default();
        put_live(&mut write, meta, live);
        for (series, day) in held {
            write.put_cf(meta, meta::server_series(server, *day, *series), []);
        }
        if !write.is_empty() {
            self.write(write)?;
            self.live_written(live);
        }
        Ok(())
    }

    fn unexpire_day(&self, series: SeriesId, day: Day) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        batch.delete_cf(
            self.cf(CF_META),
            meta::day_series(meta::EXPIRED, series, day),
        );
        self.write(batch)
    }

    fn stream_position(&self, subject: u32) -> Result<Option<StreamPosition>, StoreError> {
        let key = stream_position_key(subject);
        match self
            .db
            .get_cf(self.cf(CF_META), &key)
            .map_err(engine_error)?
        {
            Some(value) => Ok(Some(decode_stream_position(&key, &value)?)),
            None => Ok(None),
        }
    }

    fn put_stream_position(
        &self,
        subject: u32,
        position: &StreamPosition,
    ) -> Result<(), StoreError> {
        // Into the WAL, not synced: a position only ever lags what was applied.
        self.db
            .put_cf_opt(
                self.cf(CF_META),
                stream_position_key(subject),
                encode_stream_position(position),
                &WriteOptions::default(),
            )
            .map_err(engine_error)
    }

    fn write_group(
        &self,
        writes: &mut dyn FnMut() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let outer = IN_WRITE_GROUP.replace(true);
        let result = {
            // Not `then_some`: it would make (and at once drop) a GroupEnd inside a group,
            // ending the outer group's flag.
            let _end = if outer { None } else { Some(GroupEnd) };
            writes()
        };
        // A group inside a group is synced by the outer one.
        if !outer && self.sync_writes {
            // RocksDB syncs every WAL file not yet synced, those a memtable switch
            // closed during the group included.
            self.db.flush_wal(true).map_err(engine_error)?;
        }
        result
    }
}

fn stripe_of(key: &HourKey) -> usize {
    // Fibonacci hashing of (server, epoch): one agent's keys share a stripe.
    let mixed = ((u64::from(key.server.0) << 32) ^ key.epoch.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> 58) as usize % WRITE_STRIPES
}

fn lock_ignoring_poison(lock: &Mutex<()>) -> MutexGuard<'_, ()> {
    // The mutexes guard no data, only the order of RocksDB reads and writes; a panic in
    // another holder leaves nothing inconsistent behind.
    lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The most dictionary ids a store keeps in memory (series and servers): about 40 MB
/// with names of 100 bytes.
const MAX_REMEMBERED_IDS: usize = 1 << 18;

impl RocksStore {
    /// The id stored under a dictionary's name key; `None` if there is none.
    /// Remembered from then on ([`RocksStore::remember_id`]); a name without one is read
    /// again at its next lookup, since it may be assigned meanwhile.
    fn meta_id_of(&self, name_key: &[u8]) -> Result<Option<u32>, StoreError> {
        if let Some(&id) = self.remembered_ids().get(name_key) {
            return Ok(Some(id));
        }
        match self
            .db
            .get_cf(self.cf(CF_META), name_key)
            .map_err(engine_error)?
        {
            Some(id) => {
                let id = meta_id(name_key, &id)?;
                self.remember_id(name_key, id);
                Ok(Some(id))
            }
            None => Ok(None),
        }
    }

    /// The ids remembered. Each entry was read from the store or written to it, so a
    /// panic in another holder leaves none wrong.
    fn remembered_ids(&self) -> MutexGuard<'_, HashMap<Box<[u8]>, u32>> {
        self.ids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Remembers that `name_key` is `id`'s. At most [`MAX_REMEMBERED_IDS`] are: past
    /// that they are all forgotten and read again as they are asked for.
    fn remember_id(&self, name_key: &[u8], id: u32) {
        let mut ids = self.remembered_ids();
        if ids.len() >= MAX_REMEMBERED_IDS {
            ids.clear();
        }
        ids.insert(name_key.into(), id);
    }

    fn built_mark(&self, series: SeriesId, day: Day) -> Result<Option<u64>, StoreError> {
        let key = meta::day_series(meta::BUILT, series, day);
        match self
            .db
            .get_cf(self.cf(CF_META), &key)
            .map_err(engine_error)?
        {
            Some(value) => Ok(Some(mark_value(&key, &value)?)),
            None => Ok(None),
        }
    }
}

/// Maps an error of `DB::open`, recognising RocksDB's lock error: it is the one every
/// operator meets (a second aggregator on the same volume) and must say so plainly.
fn open_error(dir: &Path, e: rocksdb::Error) -> StoreError {
    let message = e.as_ref().to_string();
    // From another process: "IO error: While lock file: DIR/LOCK: Resource temporarily
    // unavailable". From this process: "IO error: lock hold by current process ...
    // DIR/LOCK: No locks available".
    if e.kind() == ErrorKind::IOError && message.contains("LOCK") {
        return StoreError::InUse {
            dir: dir.to_path_buf(),
            detail: message,
        };
    }
    engine_error(e)
}

fn engine_error(e: rocksdb::Error) -> StoreError {
    let kind = e.kind();
    let message = e.into_string();
    match kind {
        ErrorKind::Corruption => StoreError::Corruption(message),
        ErrorKind::IOError => StoreError::Io(message),
        _ => StoreError::Engine(message),
    }
}

#[cfg(test)]
pub(super) mod testing {
    //! Ways to damage a store that only tests need.
    use super::*;

    /// The raw bytes under a raw key of a column family.
    pub(crate) fn get_raw(store: &RocksStore, cf: &str, key: &[u8]) -> Option<Vec<u8>> {
        store.db.get_cf(store.cf(cf), key).unwrap()
    }

    /// Writes raw bytes under a raw key of a column family, bypassing every check.
    pub(crate) fn put_raw(store: &RocksStore, cf: &str, key: &[u8], value: &[u8]) {
        store.db.put_cf(store.cf(cf), key, value).unwrap();
        store.hour_cache.written_everywhere();
        store.live_cache.forget();
    }

    /// Deletes every `meta` key of the series-per-server index, as in a store written
    /// before the index existed.
    pub(crate) fn drop_server_series_index(store: &RocksStore) {
        let meta = store.cf(CF_META);
        store
            .db
            .delete_range_cf(
                meta,
                meta::SERVER_SERIES,
                &prefix_end(meta::SERVER_SERIES)[..],
            )
            .unwrap();
    }
}

#[cfg(test)]
mod write_group_tests;

#[cfg(test)]
mod live_tests;

#[cfg(test)]
mod values_tests;

#[cfg(test)]
mod compressor_tests;

#[cfg(test)]
mod options_tests;
