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
//! Integers are little-endian. [`Table`](crate::table::Table) says which entries changed since the last
//! successful checkpoint and which version of each that checkpoint holds
//! ([`crate::table::Saved`]); a push sends only those versions.

mod format;
#[cfg(test)]
mod kept_frames_tests;
mod reader;
#[cfg(test)]
mod tests;
mod writer;

pub(crate) use self::format::LogPosition;
pub use self::format::{CheckpointError, Loaded, SavedEntry, path};
pub use self::reader::{decode, read};
pub(crate) use self::writer::Writer;
pub(crate) use self::writer::remove_leftovers;
pub use self::writer::write;
