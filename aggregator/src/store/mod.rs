//! Storage of sketches behind the [`Store`] trait, so that the query planner and the
//! services can be tested on [`MemoryStore`] and RocksDB lives in one module,
//! [`RocksStore`].
//!
//! [`Store`] has no methods of its own: it is the sum of six capability traits, each a
//! part of what a store does, and every type with all six is a `Store` (so callers hold an
//! `Arc<dyn Store>` and reach every method through it):
//!
//! | trait | what it covers |
//! |---|---|
//! | [`Hourly`] | the hourly snapshots: a push's write (by version), liveness from pushes, scans, the hour cache |
//! | [`Rollups`] | the daily rollups, and the dirty days and conflicts by which they are rebuilt |
//! | [`Retention`] | deleting whole days of hourly rows, then of rollups; expired days |
//! | [`Dictionaries`] | the series dictionary and the server registry with its labels |
//! | [`ServerIndex`] | per server: the hours it was live and the series it holds |
//! | [`Replica`] | cluster mode only: stream positions, the live subject's index, copied days, write groups |
//!
//! The rules every engine follows (which version replaces, when a day is dirty, the next
//! id, how live hours count) are written once in `rules.rs`, and each engine calls them.
//! What is done around an engine's write (frames checked before it, the hour cache told
//! after it, what a rebuilt, unbuildable or copied day records) is written once in the
//! traits' provided methods, around the engine's own write ([`Hourly::write_push`],
//! [`Rollups::write_day`]).
//!
//! What a store holds (DESIGN §4):
//! - **hourly snapshots**, keyed by [`HourKey`], each with the version the agent gave it.
//!   A snapshot replaces the one held only if its version is newer, which is what makes
//!   retries, duplicates and reordering of pushes harmless (DESIGN §3).
//! - **daily rollups**, keyed by [`DayKey`], one per (series, day, server) and one per
//!   (series, day, [`ServerId::ALL`]).
//! - **metadata**: the series dictionary, the server registry with labels, and the set of
//!   *dirty days* whose rollups must be (re)built.
//!
//! Every stored value is a framed sketch (docs/FORMAT.md); stores check the frame on the
//! way in, so what they return was a valid frame when it was written.
//!
//! ## Dirty days
//!
//! Every hourly write that is stored marks its (series, day) dirty with a fresh mark *in
//! the same atomic write*. The rollup builder lists the dirty days that have closed
//! ([`Rollups::dirty_days`]), reads their hours, and replaces their rollups while recording
//! the mark it started from as built ([`Rollups::replace_rollups`]). A day is dirty while
//! its mark differs from its built mark, so a snapshot that lands during a rebuild is never
//! missed, and the planner ([`Rollups::is_day_dirty`]) never serves a rollup older than
//! the hours. A crash between a write and its mark is impossible: there is no between.

pub(crate) use hourglass_rpc::proto::Bytes;
use hourglass_sketch::Kind;
use hourglass_sketch::format::decode_frame;
use std::collections::BTreeSet;
use std::ops::Range;
use std::path::PathBuf;
use thiserror::Error;

use crate::keys::{Day, DayKey, Hour, HourKey, KeyLengthError, SeriesId, ServerId};

mod cache;
mod memory;
mod rocks;
mod rules;

use rules::written_hours;

pub use cache::{HourCache, HourCacheStats};
pub(crate) use cache::{HourMerge, HourSelection};

pub use memory::MemoryStore;
pub use rocks::{CfStats, RocksStore, StoreOptions, StoreStats};

/// The schema version this build writes into a new store and requires of an existing one.
/// Version 2: hourly values may be compressed (docs/STORAGE.md).
pub const SCHEMA_VERSION: u32 = 2;

/// The one older schema version this build opens, raising it to [`SCHEMA_VERSION`]: its
/// uncompressed hourly values read as they are.
pub const SCHEMA_UPGRADES_FROM: u32 = 1;

/// A stored hourly snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSketch {
    /// The version the agent gave the snapshot; higher replaces lower.
    pub(crate) version: u64,
    /// The framed sketch (docs/FORMAT.md).
    pub(crate) sketch: Vec<u8>,
}

/// What [`Hourly::put_hourly`] did with one entry of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The snapshot was newer than what was held (or nothing was) and is now stored.
    Stored,
    /// A snapshot with this version or a newer one was already held; nothing changed.
    Stale {
        /// The version held.
        held: u64,
    },
}

/// A series as users name it: metric, tags, and the sketch kind kept for it. Each kind of a
/// metric is its own series with its own [`SeriesId`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesName {
    /// The metric name (`visitors`).
    pub(crate) metric: String,
    /// The tags, sorted by key then value. Stores sort a copy before use, so an unsorted
    /// list names the same series as its sorted form.
    pub(crate) tags: Vec<(String, String)>,
    /// The sketch kind.
    pub(crate) kind: Kind,
}

impl SeriesName {
    /// A series name with its tags sorted.
    pub fn new(metric: impl Into<String>, mut tags: Vec<(String, String)>, kind: Kind) -> Self {
        tags.sort();
        SeriesName {
            metric: metric.into(),
            tags,
            kind,
        }
    }

    /// This name with its tags sorted: the form the dictionary stores.
    pub fn canonical(&self) -> SeriesName {
        SeriesName::new(self.metric.clone(), self.tags.clone(), self.kind)
    }
}

impl From<&SeriesName> for hourglass_rpc::proto::v1::Series {
    fn from(name: &SeriesName) -> Self {
        hourglass_rpc::proto::v1::Series {
            metric: name.metric.clone(),
            tags: name
                .tags
                .iter()
                .map(|(key, value)| hourglass_rpc::proto::v1::Tag {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

impl std::fmt::Display for SeriesName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{{", self.metric)?;
        for (i, (k, v)) in self.tags.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        write!(f, "}} ({})", self.kind)
    }
}

/// A (series, day) whose rollups must be rebuilt, with the mark that made it dirty.
///
/// Every stored snapshot writes a fresh mark. A rebuild records the mark it started from
/// as *built*; the day is clean while the built mark equals the dirty one, so a snapshot
/// that lands during a rebuild leaves the day dirty, and no mark is ever deleted in a
/// race with a writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyDay {
    /// The series.
    pub(crate) series: SeriesId,
    /// The day.
    pub(crate) day: Day,
    /// The mark the day carries.
    pub(crate) mark: u64,
}

/// One atomic, durable write of the rollups of a (series, day), with what the day records
/// besides them: [`Rollups::write_day`], the one write behind [`Rollups::replace_rollups`],
/// [`Rollups::mark_day_conflict`] and [`Replica::put_copied_day`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayWrite<'a> {
    /// The series.
    pub(crate) series: SeriesId,
    /// The day.
    pub(crate) day: Day,
    /// The day's rollups, their frames checked, replacing every one it holds: none
    /// deletes them.
    pub(crate) rollups: Vec<(DayKey, Vec<u8>)>,
    /// What the day records with them.
    pub(crate) record: DayRecord<'a>,
}

/// What a [`DayWrite`] records of its day besides the rollups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DayRecord<'a> {
    /// Built from its hours up to this mark ([`Rollups::replace_rollups`]): a conflict
    /// recorded before is cleared.
    Built(u64),
    /// Its rollups cannot be built, for `reason`, and it is built up to `mark`
    /// ([`Rollups::mark_day_conflict`]).
    Conflict {
        /// The mark the day is built up to.
        mark: u64,
        /// Why, as the merge reported it.
        reason: &'a str,
    },
    /// Copied from another store whose retention deleted its hourly rows: expired
    /// ([`Replica::put_copied_day`]).
    Copied,
}

/// A registered server: its id, name and current labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    /// The id used in keys.
    pub(crate) id: ServerId,
    /// The agent's name (by default its hostname).
    pub(crate) name: String,
    /// Its labels, sorted by key then value.
    pub(crate) labels: Vec<(String, String)>,
}

/// Cluster mode: how far this store applied one subject of the cluster's stream (a
/// partition, or the live subject), as this node itself recorded it (DESIGN §10).
///
/// Written after the applies it describes and never synced on its own, so what a store
/// holds is only ever behind what it applied: a delivery applied again is harmless.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamPosition {
    /// The stream instance these sequences count in, named after its name and creation
    /// time: a stream deleted and made again starts its sequences again, so a position
    /// of another instance (or of none recorded) says nothing of this one.
    pub stream: String,
    /// The consumer instance whose deliveries [`StreamPosition::delivered`] counts, named
    /// after its name and creation time; empty when no instance is to be trusted.
    pub consumer: String,
    /// The consumer sequence of the last delivery of that instance this store received and
    /// applied; every earlier delivery of it was received and applied too.
    pub delivered: u64,
    /// Every message of the subject up to this stream sequence is in the store (applied,
    /// or copied from another node).
    pub applied: u64,
}

/// Why a store operation failed. Each variant says what is wrong and, where there is one,
/// what to do about it.
#[derive(Debug, Error)]
pub enum StoreError {
    /// Another process (or another store in this one) holds the database's lock.
    #[error("data dir {} is in use by another process ({detail})", dir.display())]
    InUse {
        /// The data directory.
        dir: PathBuf,
        /// RocksDB's message.
        detail: String,
    },
    /// The database was written by a schema this build does not read.
    #[error(
        "data dir {} was written by schema version {found}, this build reads {supported}",
        dir.display()
    )]
    SchemaVersion {
        /// The data directory.
        dir: PathBuf,
        /// The schema version stored in it.
        found: u32,
        /// The schema version this build reads ([`SCHEMA_VERSION`]).
        supported: u32,
    },
    /// The directory holds a database that is not an hourglass store.
    #[error("data dir {} holds a database that is not an hourglass store: {reason}", dir.display())]
    NotAStore {
        /// The data directory.
        dir: PathBuf,
        /// What gave it away.
        reason: String,
    },
    /// RocksDB found damaged data (a bad block checksum, a truncated file).
    #[error("storage corruption: {0}")]
    Corruption(String),
    /// Reading or writing the data directory failed (disk full, permissions, ...).
    #[error("storage I/O error: {0}")]
    Io(String),
    /// Any other error reported by the storage engine.
    #[error("storage engine error: {0}")]
    Engine(String),
    /// A stored key does not decode: the data is corrupt or from another program.
    #[error("bad key in {column}: {source}")]
    BadKey {
        /// Which part of the store (`hourly`, `rollups`, `meta`).
        column: &'static str,
        /// What is wrong with the key.
        source: KeyLengthError,
    },
    /// A stored value does not decode: the data is corrupt or from another program.
    #[error("bad value in {column} under key {key:02x?}: {reason}")]
    BadValue {
        /// Which part of the store.
        column: &'static str,
        /// The key the value is stored under.
        key: Vec<u8>,
        /// What is wrong with it.
        reason: String,
    },
    /// A sketch given to the store is not a valid framed sketch; nothing was written.
    #[error("refusing to store an invalid sketch ({what}): {source}")]
    InvalidSketch {
        /// Which entry: `hourly batch entry 3`, `rollup for series 7 day 19675 ...`.
        what: String,
        /// Why the frame is invalid.
        source: hourglass_sketch::DecodeError,
    },
    /// All ids of a dictionary are taken.
    #[error("no {what} ids left: all {limit} are assigned")]
    IdsExhausted {
        /// `series` or `server`.
        what: &'static str,
        /// How many ids there are.
        limit: u64,
    },
}

/// Every capability of a store, the one bound the services, the planner and the cluster
/// hold a store by (`Arc<dyn Store>`). It has no methods of its own: each comes from one
/// of the capability traits, and every type that has them all is a `Store`.
///
/// Implementations are safe to share between threads; every method is a complete operation
/// (no transactions span calls). Every capability trait is object-safe, so `dyn Store` is.
pub trait Store:
    Hourly + Rollups + Retention + Dictionaries + ServerIndex + Replica + Send + Sync + 'static
{
}

impl<T> Store for T where
    T: Hourly + Rollups + Retention + Dictionaries + ServerIndex + Replica + Send + Sync + 'static
{
}

/// The hourly snapshots: what a push writes and a query reads.
pub trait Hourly {
    /// Upserts a batch of hourly snapshots by version: each entry is written only if its
    /// version is newer than the one held for its key (including earlier entries of the
    /// same batch; the rule is `rules::put_outcome`). Returns one outcome per entry, in
    /// order. The whole batch is one atomic write, durable (WAL synced, unless the store
    /// was opened with sync off) before this returns; each stored entry also marks its
    /// (series, day) dirty in that write.
    ///
    /// The read of the held versions and the write are atomic with respect to every other
    /// writer of the same keys. An entry whose sketch is not a valid frame fails the whole
    /// batch with [`StoreError::InvalidSketch`] before anything is written.
    ///
    /// Each entry, stored or stale, also records in the same write that its server holds
    /// its series on its day ([`ServerIndex::server_series`]).
    fn put_hourly(&self, batch: &[(HourKey, u64, Bytes)]) -> Result<Vec<PutOutcome>, StoreError> {
        self.put_push(None, batch)
    }

    /// One push: [`Hourly::mark_live`] for `live` (a server and the hours it declares live)
    /// and [`Hourly::put_hourly`] for `batch`, in one atomic, durable write, so a push
    /// costs one WAL sync, not two.
    ///
    /// Every store follows the same rules around its own write ([`Hourly::write_push`]):
    /// every frame is checked before anything is written, and the hour cache learns the
    /// hours of the stored entries after the write, never before.
    fn put_push(
        &self,
        live: Option<(ServerId, &[Hour])>,
        batch: &[(HourKey, u64, Bytes)],
    ) -> Result<Vec<PutOutcome>, StoreError> {
        check_hourly_batch(batch)?;
        let outcomes = self.write_push(live, batch)?;
        if let Some(cache) = self.hour_cache() {
            written_hours(cache, batch, &outcomes);
        }
        Ok(outcomes)
    }

    /// The store's own write of a push whose frames [`Hourly::put_push`] checked: the live
    /// hours and each entry by version, with its dirty mark and series index, in one
    /// atomic, durable write. Returns one outcome per entry, in order.
    fn write_push(
        &self,
        live: Option<(ServerId, &[Hour])>,
        batch: &[(HourKey, u64, Bytes)],
    ) -> Result<Vec<PutOutcome>, StoreError>;

    /// Records that `server` was up and ingesting during `hours` (from pushes).
    fn mark_live(&self, server: ServerId, hours: &[Hour]) -> Result<(), StoreError> {
        self.put_push(Some((server, hours)), &[]).map(drop)
    }

    /// The version held at each of `keys`, in order (`None` where nothing is): a point
    /// lookup of each, its sketch left packed. What an owner answers the entry of a push
    /// with in cluster mode, for every push: a scan of the (series, hour) would read (and
    /// unpack) every server's row before reaching this one's.
    fn hourly_versions(&self, keys: &[HourKey]) -> Result<Vec<Option<u64>>, StoreError>;

    /// Visits the snapshots of `series` in `hours`, across all servers and epochs, in key
    /// order (hour, then server, then epoch), until `visit` returns false.
    fn scan_hourly(
        &self,
        series: SeriesId,
        hours: Range<Hour>,
        visit: &mut dyn FnMut(HourKey, &StoredSketch) -> bool,
    ) -> Result<(), StoreError>;

    /// The store's hour cache (`cache` module), whose generations it raises after every
    /// write that changes hourly rows; `None` for a store that keeps none.
    fn hour_cache(&self) -> Option<&HourCache> {
        None
    }
}

/// The daily rollups, and the dirty days and conflicts by which the rollup builder keeps
/// them up with the hours (module docs, "Dirty days").
pub trait Rollups {
    /// Stores (replacing) a daily rollup. Rollups are rebuilt from the hours, never
    /// merged in place, so there is no version. Durable before it returns, like
    /// [`Hourly::put_hourly`].
    fn put_rollup(&self, key: DayKey, sketch: Vec<u8>) -> Result<(), StoreError>;

    /// The rollup stored under `key`, if any.
    fn get_rollup(&self, key: DayKey) -> Result<Option<Vec<u8>>, StoreError>;

    /// Visits the rollups of `series` in `days`, in key order (day, then server, with
    /// [`ServerId::ALL`] last in each day), until `visit` returns false.
    fn scan_rollups(
        &self,
        series: SeriesId,
        days: Range<Day>,
        visit: &mut dyn FnMut(DayKey, &[u8]) -> bool,
    ) -> Result<(), StoreError>;

    /// Marks the rollups of `(series, day)` for (re)building. [`Hourly::put_hourly`] does
    /// this itself; this is for rebuilds asked for by other means (an operator, a repair).
    fn mark_day_dirty(&self, series: SeriesId, day: Day) -> Result<(), StoreError>;

    /// Up to `limit` dirty (series, day) pairs with a day before `before`, oldest day
    /// first, each with the mark it carries now. Days at or after `before` (still open to
    /// late snapshots) are not listed. Nothing is removed: see
    /// [`Rollups::replace_rollups`].
    fn dirty_days(&self, before: Day, limit: usize) -> Result<Vec<DirtyDay>, StoreError>;

    /// Whether the rollups of `(series, day)` are missing or older than its hourly rows
    /// (`rules::is_dirty`): the planner then reads the hours.
    fn is_day_dirty(&self, series: SeriesId, day: Day) -> Result<bool, StoreError>;

    /// Replaces every rollup of `(series, day)` with `rollups`, built from the hours read
    /// after `mark` was listed, and records that the day is built up to `mark`, in one
    /// atomic, durable write. Returns whether the day is now clean: false if a snapshot
    /// re-marked it meanwhile (it stays dirty and is rebuilt later).
    fn replace_rollups(
        &self,
        series: SeriesId,
        day: Day,
        rollups: Vec<(DayKey, Vec<u8>)>,
        mark: u64,
    ) -> Result<bool, StoreError> {
        check_rollups(&rollups)?;
        let record = DayRecord::Built(mark);
        self.write_day(DayWrite {
            series,
            day,
            rollups,
            record,
        })?;
        Ok(!self.is_day_dirty(series, day)?)
    }

    /// Records that the rollups of `(series, day)` cannot be built, and why, with the
    /// day built up to `mark` (so the builder does not retry it until a new snapshot
    /// arrives) and its old rollups deleted (so queries read its hourly rows and report
    /// the cause), in one atomic, durable write. Returns whether the day is now clean, as
    /// [`Rollups::replace_rollups`] does. A later successful rebuild clears the record.
    fn mark_day_conflict(
        &self,
        series: SeriesId,
        day: Day,
        mark: u64,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let record = DayRecord::Conflict { mark, reason };
        self.write_day(DayWrite {
            series,
            day,
            rollups: Vec::new(),
            record,
        })?;
        Ok(!self.is_day_dirty(series, day)?)
    }

    /// The store's own write of a day's rollups and record ([`DayWrite`]), in one atomic,
    /// durable write; the rollups' frames were checked by the caller.
    fn write_day(&self, write: DayWrite<'_>) -> Result<(), StoreError>;

    /// Every day whose rollups could not be built, in (day, series) order.
    fn day_conflicts(&self) -> Result<Vec<DayConflict>, StoreError>;
}

/// Retention: whole days of hourly rows, then of rollups, deleted without blocking
/// writers.
pub trait Retention {
    /// Hourly retention, in whole days: deletes every hourly snapshot of a day before
    /// `day`, of every series, except the (series, day) pairs in `keep` (days not yet
    /// rolled up, days whose rollups could not be built). Returns how many were deleted.
    /// Does not block writers.
    ///
    /// Each (series, day) whose rows it deletes is recorded as expired
    /// ([`Retention::is_day_expired`]) in the same write, so no later rebuild replaces its
    /// rollups with what a late row alone holds. Liveness of those days is folded into
    /// one summary per (server, day), kept until rollup retention, so coverage stays
    /// right for as long as rollups answer; [`ServerIndex::server_series`] entries of
    /// those days go.
    fn delete_hourly_before(
        &self,
        day: Day,
        keep: &BTreeSet<(SeriesId, Day)>,
    ) -> Result<u64, StoreError>;

    /// Rollup retention: deletes every rollup of a day before `day`, and with them
    /// everything else kept about those days: hourly rows kept past hourly retention,
    /// liveness summaries, conflict and expiry records, dirty marks. Returns how many
    /// rollups.
    fn delete_rollups_before(&self, day: Day) -> Result<u64, StoreError>;

    /// Whether hourly retention has deleted the rows of `(series, day)`.
    fn is_day_expired(&self, series: SeriesId, day: Day) -> Result<bool, StoreError>;
}

/// The dictionaries: series names to ids, and the server registry with its labels.
pub trait Dictionaries {
    /// The id of a known series; `None` for a series the store has never held. Tags are
    /// compared in sorted order.
    fn series_id(&self, series: &SeriesName) -> Result<Option<SeriesId>, StoreError>;

    /// The id of a series, a series not yet known getting the next free id
    /// (`rules::next_id`). Ids are stable for the life of the store. Tags are compared
    /// in sorted order.
    fn series_id_or_create(&self, series: &SeriesName) -> Result<SeriesId, StoreError>;

    /// Every known series with its id, in id order. Names have sorted tags.
    fn list_series(&self) -> Result<Vec<(SeriesId, SeriesName)>, StoreError>;

    /// The id of the known server called `name`; `None` for a server never registered.
    fn server_id(&self, name: &str) -> Result<Option<ServerId>, StoreError>;

    /// The id of the server called `name`: an unknown server is registered with `labels`,
    /// and a known one whose labels differ gets `labels` as its new ones. Ids are stable
    /// for the life of the store and never [`ServerId::ALL`].
    fn register_server(
        &self,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<ServerId, StoreError>;

    /// Every registered server, in id order.
    fn list_servers(&self) -> Result<Vec<ServerEntry>, StoreError>;
}

/// What is known of each server beyond its snapshots: the hours it was live (for the
/// coverage of every answer) and the series it holds (for the collector's bound).
pub trait ServerIndex {
    /// The series `server` has stored snapshots of on a day from `since` on, each with the
    /// latest such day, in series order. This is the index the collector bounds the series
    /// per server with (`limits.max_series_per_server`); hourly retention trims it.
    fn server_series(
        &self,
        server: ServerId,
        since: Day,
    ) -> Result<Vec<(SeriesId, Day)>, StoreError>;

    /// How many hours of `hours` `server` was recorded live.
    fn live_hours(&self, server: ServerId, hours: Range<Hour>) -> Result<u64, StoreError>;

    /// From the first to the last hour `server` was recorded live (`last + 1` as the
    /// end), or `None` if it never was (or all of it is past retention).
    fn live_span(&self, server: ServerId) -> Result<Option<Range<Hour>>, StoreError>;
}

/// What only cluster mode asks of a store (DESIGN §10): its position in each subject of
/// the cluster's stream, the writes of the live subject and of catch-up copies, and write
/// groups for the apply of a batch of messages. A replica's copied days are written as
/// every day's rollups are ([`Rollups::write_day`]).
pub trait Replica: Rollups {
    /// Cluster mode's live subject: [`Hourly::mark_live`] for `live`, and that `server`
    /// holds each of `held`'s series on its day (the index of
    /// [`ServerIndex::server_series`]), in one atomic, durable write that stores no
    /// sketch: every node keeps every server's series index, also of partitions it does
    /// not own.
    fn put_index(
        &self,
        live: Option<(ServerId, &[Hour])>,
        server: ServerId,
        held: &[(SeriesId, Day)],
    ) -> Result<(), StoreError>;

    /// A day copied from another store (cluster catch-up) whose hourly rows that store's
    /// retention deleted: replaces the rollups of `(series, day)` with `rollups` and
    /// records the day expired ([`Retention::is_day_expired`]), in one atomic, durable
    /// write, as if this store had built and then expired it itself.
    fn put_copied_day(
        &self,
        series: SeriesId,
        day: Day,
        rollups: Vec<(DayKey, Vec<u8>)>,
    ) -> Result<(), StoreError> {
        check_rollups(&rollups)?;
        let record = DayRecord::Copied;
        self.write_day(DayWrite {
            series,
            day,
            rollups,
            record,
        })
    }

    /// Forgets that hourly retention expired `(series, day)`: its hourly rows are back
    /// (copied whole from another store), so its rollups are built from them again.
    fn unexpire_day(&self, series: SeriesId, day: Day) -> Result<(), StoreError>;

    /// This store's [`StreamPosition`] in `subject` of the cluster's stream (a
    /// partition's number, or `u32::MAX` for the live subject); `None` while none was
    /// recorded.
    fn stream_position(&self, subject: u32) -> Result<Option<StreamPosition>, StoreError>;

    /// Records `position` as this store's in `subject`, replacing the one held. Not synced:
    /// a crash may lose it, leaving the one before, which is behind it.
    fn put_stream_position(
        &self,
        subject: u32,
        position: &StreamPosition,
    ) -> Result<(), StoreError>;

    /// Runs `writes` (this store's writes, on this thread) as one group made durable by
    /// one sync at its end instead of one per write: when this returns `Ok`, everything
    /// `writes` wrote is as durable as a synced write makes it; when it returns an error,
    /// any of it may be lost to a crash. A write group is for work that answers no one
    /// before it ends (cluster mode's apply of a batch of messages, acknowledged after);
    /// every other write syncs by itself. An error of `writes` is returned as is, after
    /// the sync of what it wrote.
    fn write_group(
        &self,
        writes: &mut dyn FnMut() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        writes()
    }
}

/// A day whose rollups could not be built: its rows do not merge (a metric's parameters
/// changed within the day) or one does not decode. Its hourly rows are kept until rollup
/// retention, and queries over it read them and report the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayConflict {
    /// The series.
    pub(crate) series: SeriesId,
    /// The day.
    pub(crate) day: Day,
    /// Why, as the merge reported it.
    pub(crate) reason: String,
}

/// Checks that `sketch` is a valid frame before a store writes it.
fn check_frame(sketch: &[u8], what: impl FnOnce() -> String) -> Result<(), StoreError> {
    decode_frame(sketch)
        .map(|_| ())
        .map_err(|source| StoreError::InvalidSketch {
            what: what(),
            source,
        })
}

/// Checks every frame of an hourly batch, so a bad entry fails it before anything is written.
fn check_hourly_batch(batch: &[(HourKey, u64, Bytes)]) -> Result<(), StoreError> {
    for (i, (key, _, sketch)) in batch.iter().enumerate() {
        check_frame(sketch, || format!("hourly batch entry {i}, {key:?}"))?;
    }
    Ok(())
}

/// Checks every frame of a set of rollups before any is written.
fn check_rollups(rollups: &[(DayKey, Vec<u8>)]) -> Result<(), StoreError> {
    for (key, sketch) in rollups {
        check_frame(sketch, || format!("rollup {key:?}"))?;
    }
    Ok(())
}

/// Sorted labels, the form the registry stores and compares.
fn sorted_labels(labels: &[(String, String)]) -> Vec<(String, String)> {
    let mut labels = labels.to_vec();
    labels.sort();
    labels
}

/// An empty or reversed range selects nothing; `BTreeMap::range` and RocksDB bounds
/// must not be handed one.
fn is_empty_range<T: PartialOrd>(range: &Range<T>) -> bool {
    range.start >= range.end
}

#[cfg(test)]
mod tests;
