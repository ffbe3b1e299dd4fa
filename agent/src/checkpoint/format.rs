//! What the writer and the reader share: the files, the magic numbers and record tags of
//! the layout (docs/FORMAT.md), and what a checkpoint held.

use std::path::{Path, PathBuf};

use hourglass_rpc::series::Series;

use crate::table::Entry;

pub(super) const MAGIC: &[u8; 4] = b"HGCP";
pub(super) const VERSION: u8 = 2;
pub(super) const LOG_MAGIC: &[u8; 4] = b"HGCL";
pub(super) const LOG_VERSION: u8 = 1;
/// Bytes of the log's header: magic, version, the base's checksum.
pub(super) const LOG_HEADER: usize = 4 + 1 + 8;
/// Bytes of a frame's header: payload length, flags, payload checksum, header check.
pub(super) const FRAME_HEADER: usize = 4 + 1 + 8 + 4;
/// A frame's payload, at most: a transaction is written in pieces this large, so it is
/// never held whole in memory.
pub(super) const FRAME_PAYLOAD: usize = 1 << 20;
/// The frame flag that ends a transaction.
pub(super) const COMMIT: u8 = 1;
/// The log is compacted into a new base once it is larger than the base and than this.
pub(super) const MIN_COMPACT_BYTES: u64 = 4 << 20;

/// Record tags.
pub(super) const RECORD_END: u8 = 0;
pub(super) const RECORD_ENTRY: u8 = 1;
pub(super) const RECORD_META: u8 = 2;
pub(super) const RECORD_REMOVED: u8 = 3;
pub(super) const RECORD_HEADER: u8 = 0x10;
/// Entries encoded per hold of the table's lock, so ingest waits at most that long.
pub(super) const ENTRIES_PER_LOCK: usize = 64;

/// The checkpoint's base file in `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint")
}

/// The checkpoint's log file in `data_dir`.
pub(crate) fn log_path(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint.log")
}

/// A checkpoint that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a whole, intact checkpoint.
    #[error("corrupt checkpoint: {0}")]
    Corrupt(String),
}

/// What a checkpoint held.
#[derive(Debug)]
pub struct Loaded {
    /// The server it belongs to.
    pub(crate) server: String,
    /// The epoch it belongs to.
    pub(crate) epoch: u64,
    /// Every hour up to this one was closed for good.
    pub(crate) closed_through: Option<u32>,
    /// The highest version given in the epoch.
    pub(crate) last_version: u64,
    /// Live hours not yet reported.
    pub(crate) live_hours: Vec<u32>,
    /// The entries.
    pub entries: Vec<SavedEntry>,
    /// Log transactions applied over the base.
    pub(crate) transactions: usize,
    /// Bytes at the end of the log that an unfinished transaction left (a crash during an
    /// append), ignored.
    pub(crate) torn_bytes: usize,
    /// Where a writer can go on appending to the log, when it follows this base.
    pub(crate) resume: Option<LogPosition>,
}

/// The end of the last whole transaction of a log that follows its base: a restarted
/// agent appends there instead of writing a whole new base first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogPosition {
    /// The checksum of the base the log follows.
    pub(crate) base_sum: u64,
    /// The base's length.
    pub(crate) base_len: u64,
    /// Where the last whole transaction ends.
    pub(crate) log_len: u64,
}

/// One (series, hour) entry as a checkpoint holds it.
#[derive(Debug)]
pub struct SavedEntry {
    /// The series.
    pub series: Series,
    /// The hour.
    pub(crate) hour: u32,
    /// Its sketches, version and acknowledgement.
    pub entry: Entry,
}
