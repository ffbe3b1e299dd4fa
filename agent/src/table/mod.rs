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
//! hash lookup; only a new spelling is parsed, validated and sorted into a [`Series`](hourglass_rpc::series::Series).

mod backlog;
mod checkpointing;
mod encoding;
mod reject;
mod series;
mod sketches;
mod state;
#[cfg(test)]
mod testing;
mod versions;

use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) use self::backlog::{Backlog, BloomFill, Dropped};
#[cfg(test)]
pub(crate) use self::encoding::MAX_FRAMES_KEPT;
pub(crate) use self::encoding::Sent;
pub(crate) use self::reject::{IngestStats, Reject};
pub use self::state::{Entry, Key, Saved, Table};

/// Locks the table. A panic elsewhere while it was held leaves at worst one entry with
/// part of one event; serving on beats stopping every ingest path for good.
pub fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}
