//! The agent's checkpoint: its open and unacknowledged sketches, kept in the data dir at
//! every flush and at shutdown, and read back at start (DESIGN §3). Two files, layouts in
//! docs/FORMAT.md:
//!
//! - `checkpoint`, the base: the whole state, written to a fresh `checkpoint.tmp-…`,
//!   fsynced, renamed over the old one, and the directory fsynced, so a crash leaves the
//!   old file or the new one, never a mix.
//! - `checkpoint.log`: transactions appended after the base, each holding what changed
//!   since the one before (the entries whose sketches changed, whole; the version,
//!   acknowledgement and flag of those where only that changed; the entries freed or
//!   dropped; the header fields) and fsynced before the flush pushes anything. The log
//!   names the base it follows by the base's checksum, so a log left from an older base
//!   is ignored.
//!
//! ```text
//! base: "HGCP" | format version u8 = 2 | server name len u16 | server name | epoch u64
//!       | last version u64 | closed flag u8 | closed through hour u32
//!       | live hour count u32 | live hours u32…
//!       entries: 0x01 | series text len u16 | series text | hour u32 | version u64
//!                | acked u64 | dirty u8 | sketch count u8 | (frame len u32 | framed sketch)…
//!       end:     0x00 | xxh3-64 of every byte before it
//! log:  "HGCL" | log version u8 = 1 | the base's xxh3-64
//!       frames: payload len u32 | flags u8 (1: commits the transaction) | payload xxh3-64
//!               | header check u32 | payload
//!       a transaction's payloads, joined: 0x10 header | 0x03 removals… | 0x01 entries
//!               and 0x02 (series, hour, version, acked, dirty) records…
//! ```
//!
//! Steady-state I/O is therefore what changed, not the whole table, and a restart
//! appends after the last whole transaction it read instead of writing a base. When the log grows
//! larger than the base (and past 4 MiB), the next checkpoint compacts: a new base, and a
//! new empty log. A checkpoint that cannot write its log transaction truncates the log back
//! to where the transaction began, so a later one is never appended after garbage.
//!
//! Reading checks every checksum before using a byte: a damaged base or log is an error,
//! never a panic. The one damage that is not an error is a log ending inside its last
//! transaction, the mark of a crash during an append whose fsync never returned: that
//! transaction is ignored, and nothing was pushed under it.
//!
//! Integers are little-endian. [`Table`] says which entries changed since the last
//! successful checkpoint and which version of each that checkpoint holds
//! ([`crate::table::Saved`]); a push sends only those versions.

#[cfg(test)]
mod kept_frames_tests;
mod reader;
#[cfg(test)]
mod tests;
mod writer;

use std::path::{Path, PathBuf};

pub use self::reader::{SavedEntry, decode, read};
pub(crate) use self::writer::Writer;
pub use self::writer::write;

const MAGIC: &[u8; 4] = b"HGCP";
const VERSION: u8 = 2;
const LOG_MAGIC: &[u8; 4] = b"HGCL";
const LOG_VERSION: u8 = 1;
/// Bytes of the log's header: magic, version, the base's checksum.
const LOG_HEADER: usize = 4 + 1 + 8;
/// Bytes of a frame's header: payload length, flags, payload checksum, header check.
const FRAME_HEADER: usize = 4 + 1 + 8 + 4;
/// A frame's payload, at most: a transaction is written in pieces this large, so it is
/// never held whole in memory.
const FRAME_PAYLOAD: usize = 1 << 20;
/// The frame flag that ends a transaction.
const COMMIT: u8 = 1;
/// The log is compacted into a new base once it is larger than the base and than this.
const MIN_COMPACT_BYTES: u64 = 4 << 20;

/// Record tags.
const RECORD_END: u8 = 0;
const RECORD_ENTRY: u8 = 1;
const RECORD_META: u8 = 2;
const RECORD_REMOVED: u8 = 3;
const RECORD_HEADER: u8 = 0x10;
/// Entries encoded per hold of the table's lock, so ingest waits at most that long.
const ENTRIES_PER_LOCK: usize = 64;

/// The checkpoint's base file in `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint")
}

/// The checkpoint's log file in `data_dir`.
pub(crate) fn log_path(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint.log")
}

/// The prefix of the temporary files a checkpoint is written to before the rename.
const TMP_PREFIX: &str = "checkpoint.tmp-";

/// Removes the temporary files a checkpoint writer left when the agent was killed
/// mid-write; returns how many. Only for a data dir this process holds the lock of: no
/// writer of another agent can be using them.
pub(crate) fn remove_leftovers(data_dir: &Path) -> std::io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(data_dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| n.starts_with(TMP_PREFIX)) && entry.file_type()?.is_file()
        {
            std::fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
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
