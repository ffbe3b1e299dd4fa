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

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use hourglass_rpc::series::Series;
use hourglass_sketch::Sketch;
use xxhash_rust::xxh3::Xxh3;

use crate::table::{Entry, Key, Table};

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

/// Hashes and counts what passes through to the file.
struct Hashing<W: Write> {
    inner: W,
    hasher: Xxh3,
    written: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a whole new base of the table's state to `data_dir` (and an empty log after
/// it); returns the bytes written.
pub fn write(table: &Mutex<Table>, data_dir: &Path, server: &str) -> Result<u64, CheckpointError> {
    Writer::new(data_dir, server)
        .write_full(table)
        .map(|w| w.bytes)
}

/// What one checkpoint wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    /// Bytes written (and fsynced) by this checkpoint.
    pub(crate) bytes: u64,
    /// A whole new base (true) or a log transaction (false).
    pub(crate) full: bool,
    /// Bytes of the checkpoint on disk now, base and log.
    pub(crate) on_disk: u64,
}

/// The log being appended to.
struct Log {
    file: File,
    len: u64,
}

/// Writes the checkpoints of one data dir: a log transaction of what changed, or a whole
/// new base when there is no log to append to (a new data dir, or a start that could
/// not resume the log it read) or the log has grown larger than the
/// base.
pub(crate) struct Writer {
    dir: PathBuf,
    server: String,
    log: Option<Log>,
    base_len: u64,
    /// The log length at which the next checkpoint compacts.
    compact_at: u64,
}

impl Writer {
    /// A writer of `data_dir`'s checkpoint for `server`; its first checkpoint is a base
    /// unless it resumes a log.
    pub fn new(data_dir: &Path, server: &str) -> Writer {
        Writer {
            dir: data_dir.to_path_buf(),
            server: server.to_string(),
            log: None,
            base_len: 0,
            compact_at: 0,
        }
    }

    /// Writes one checkpoint of `table`. A compaction that fails (the disk is full, say)
    /// falls back to appending what changed, which is smaller, and is tried again only
    /// once the log has grown by as much again.
    pub fn write(&mut self, table: &Mutex<Table>) -> Result<Written, CheckpointError> {
        let compact = self.log.as_ref().is_none_or(|l| l.len >= self.compact_at);
        if !compact {
            return self.append(table);
        }
        match self.write_full(table) {
            Ok(written) => Ok(written),
            Err(e) => match &self.log {
                Some(log) => {
                    self.compact_at = log.len + self.base_len.max(MIN_COMPACT_BYTES);
                    tracing::warn!(error = %e, "compacting the checkpoint failed; appending to its log instead");
                    self.append(table)
                }
                None => Err(e),
            },
        }
    }

    /// Goes on appending to the log a restarted agent read its state from (`position`,
    /// from [`read`]), instead of writing a whole base first: the table must hold exactly
    /// what was read. The unfinished transaction of a crash, if any, is cut off first, so
    /// nothing is appended after it.
    pub(crate) fn resume(&mut self, position: LogPosition) -> Result<(), CheckpointError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(log_path(&self.dir))?;
        let mut header = [0u8; LOG_HEADER];
        file.read_exact_at(&mut header, 0)?;
        let names_base = u64::from_le_bytes(header[5..13].try_into().expect("8 bytes"));
        if names_base != position.base_sum || file.metadata()?.len() < position.log_len {
            return Err(CheckpointError::Corrupt(
                "the checkpoint log changed since it was read".into(),
            ));
        }
        file.set_len(position.log_len)?;
        file.sync_data()?;
        self.base_len = position.base_len;
        self.compact_at = position.base_len.max(MIN_COMPACT_BYTES);
        self.log = Some(Log {
            file,
            len: position.log_len,
        });
        Ok(())
    }

    fn on_disk(&self) -> u64 {
        self.base_len + self.log.as_ref().map_or(0, |l| l.len)
    }

    /// Writes a whole new base, then a new empty log after it.
    pub(crate) fn write_full(&mut self, table: &Mutex<Table>) -> Result<Written, CheckpointError> {
        // A name of its own: a writer still running from a flush that was given up on can
        // never write into this one's file.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{TMP_PREFIX}{}-{n}", std::process::id()));
        let (generation, removals) = crate::table::lock(table).begin_checkpoint();
        let (bytes, checksum, written) = match write_base(table, &self.dir, &self.server, &tmp) {
            Ok(done) => done,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        // The new base is in place: the old log, if any, names the old base and a reader
        // ignores it from now on, so nothing may be appended to it, even if the
        // directory's fsync fails (the next checkpoint then writes a base again).
        self.log = None;
        let synced = (|| {
            #[cfg(test)]
            if tests::FAIL_DIR_SYNC.with(|f| f.take()) {
                return Err(std::io::Error::other(
                    "injected: fsync of the data dir failed",
                ));
            }
            File::open(&self.dir)?.sync_all()
        })();
        synced?;
        // The base is durable: every entry written is held at the version written.
        crate::table::lock(table).checkpoint_done(generation, &written, removals);
        self.base_len = bytes;
        self.compact_at = bytes.max(MIN_COMPACT_BYTES);
        self.log = None;
        let mut total = bytes;
        match create_log(&self.dir, checksum, n) {
            Ok(log) => {
                total += log.len;
                self.log = Some(log);
            }
            // The base holds everything; the next checkpoint writes a base again.
            Err(e) => tracing::warn!(error = %e, "creating the checkpoint log failed"),
        }
        Ok(Written {
            bytes: total,
            full: true,
            on_disk: self.on_disk(),
        })
    }

    /// Appends one transaction of what changed since the last checkpoint to the log.
    fn append(&mut self, table: &Mutex<Table>) -> Result<Written, CheckpointError> {
        let log = self.log.as_mut().expect("appending needs a log");
        let start = log.len;
        let (generation, removals) = crate::table::lock(table).begin_checkpoint();
        match write_transaction(table, &log.file, start, removals) {
            Ok((end, written)) => {
                log.len = end;
                crate::table::lock(table).checkpoint_done(generation, &written, removals);
                Ok(Written {
                    bytes: end - start,
                    full: false,
                    on_disk: self.on_disk(),
                })
            }
            Err(e) => {
                // Never append after a torn transaction: a reader would stop there.
                let undone = log.file.set_len(start).and_then(|()| log.file.sync_data());
                if let Err(undo) = undone {
                    tracing::warn!(error = %undo, "truncating the checkpoint log failed; the next checkpoint writes a new base");
                    self.log = None;
                }
                Err(e)
            }
        }
    }
}

/// Writes the base to `tmp` and renames it into place; returns its length, its checksum
/// and the entries written with their versions.
#[allow(clippy::type_complexity)]
fn write_base(
    table: &Mutex<Table>,
    data_dir: &Path,
    server: &str,
    tmp: &Path,
) -> Result<(u64, u64, Vec<(Key, u64)>), CheckpointError> {
    let file = File::create(tmp)?;
    let mut out = Hashing {
        inner: BufWriter::with_capacity(1 << 20, file),
        hasher: Xxh3::new(),
        written: 0,
    };
    let (epoch, last_version, closed, live, keys) = {
        let t = crate::table::lock(table);
        (
            t.epoch(),
            t.last_version(),
            t.closed_through(),
            t.live_hours(),
            t.keys(),
        )
    };
    out.write_all(MAGIC)?;
    out.write_all(&[VERSION])?;
    let server = &server.as_bytes()[..server.len().min(u16::MAX as usize)];
    out.write_all(&(server.len() as u16).to_le_bytes())?;
    out.write_all(server)?;
    out.write_all(&epoch.to_le_bytes())?;
    out.write_all(&last_version.to_le_bytes())?;
    out.write_all(&[u8::from(closed.is_some())])?;
    out.write_all(&closed.unwrap_or(0).to_le_bytes())?;
    out.write_all(&(live.len() as u32).to_le_bytes())?;
    for h in &live {
        out.write_all(&h.to_le_bytes())?;
    }
    let mut buf = Vec::new();
    let mut written = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(ENTRIES_PER_LOCK) {
        buf.clear();
        {
            let mut t = crate::table::lock(table);
            for &key in chunk {
                // Freed since the keys were listed: nothing left to keep.
                let Some((series, entry, sketches)) = t.encoded(key) else {
                    continue;
                };
                encode_entry(&mut buf, series, key.hour, entry, &sketches);
                written.push((key, entry.version));
            }
        }
        out.write_all(&buf)?;
    }
    out.write_all(&[RECORD_END])?;
    let sum = out.hasher.digest();
    out.write_all(&sum.to_le_bytes())?;
    let bytes = out.written;
    let file = out
        .inner
        .into_inner()
        .map_err(|e| CheckpointError::Io(e.into_error()))?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(tmp, path(data_dir))?;
    // The caller fsyncs the directory: once the rename is done, the old log is dead
    // whether or not that succeeds.
    Ok((bytes, sum, written))
}

/// Creates an empty log naming the base of checksum `base_sum`, atomically like the base.
fn create_log(data_dir: &Path, base_sum: u64, n: u64) -> Result<Log, CheckpointError> {
    let tmp = data_dir.join(format!("{TMP_PREFIX}log-{}-{n}", std::process::id()));
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut header = Vec::with_capacity(LOG_HEADER);
        header.extend_from_slice(LOG_MAGIC);
        header.push(LOG_VERSION);
        header.extend_from_slice(&base_sum.to_le_bytes());
        file.write_all_at(&header, 0)?;
        file.sync_all()?;
        std::fs::rename(&tmp, log_path(data_dir))?;
        File::open(data_dir)?.sync_all()?;
        Ok(Log {
            file,
            len: LOG_HEADER as u64,
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes a transaction's payload in frames from `at`, the last one marked as committing.
struct Frames<'f> {
    file: &'f File,
    at: u64,
    payload: Vec<u8>,
}

impl Frames<'_> {
    fn push(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.payload.extend_from_slice(bytes);
        if self.payload.len() >= FRAME_PAYLOAD {
            self.emit(0)?;
        }
        Ok(())
    }

    fn emit(&mut self, flags: u8) -> std::io::Result<()> {
        let mut frame = Vec::with_capacity(FRAME_HEADER + self.payload.len());
        frame.extend_from_slice(&(self.payload.len() as u32).to_le_bytes());
        frame.push(flags);
        frame.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&self.payload).to_le_bytes());
        let check = xxhash_rust::xxh3::xxh3_64(&frame) as u32;
        frame.extend_from_slice(&check.to_le_bytes());
        frame.extend_from_slice(&self.payload);
        self.file.write_all_at(&frame, self.at)?;
        self.at += frame.len() as u64;
        self.payload.clear();
        Ok(())
    }
}

/// Writes one transaction at `start` of the log and fsyncs it; returns where it ends and
/// the entries written with their versions.
fn write_transaction(
    table: &Mutex<Table>,
    file: &File,
    start: u64,
    removals: usize,
) -> Result<(u64, Vec<(Key, u64)>), CheckpointError> {
    let mut frames = Frames {
        file,
        at: start,
        payload: Vec::new(),
    };
    let mut buf = Vec::new();
    let keys = {
        let t = crate::table::lock(table);
        buf.push(RECORD_HEADER);
        buf.extend_from_slice(&t.last_version().to_le_bytes());
        let closed = t.closed_through();
        buf.push(u8::from(closed.is_some()));
        buf.extend_from_slice(&closed.unwrap_or(0).to_le_bytes());
        let live = t.live_hours();
        buf.extend_from_slice(&(live.len() as u32).to_le_bytes());
        for h in &live {
            buf.extend_from_slice(&h.to_le_bytes());
        }
        for (series, hour) in t.removed(removals) {
            buf.push(RECORD_REMOVED);
            encode_key(&mut buf, series, *hour);
        }
        t.unsaved_keys()
    };
    frames.push(&buf)?;
    let mut written = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(ENTRIES_PER_LOCK) {
        buf.clear();
        {
            let mut t = crate::table::lock(table);
            for &key in chunk {
                let Some((series, entry)) = t.get(key) else {
                    continue;
                };
                let version = entry.version;
                match entry.unsaved() {
                    Some(true) => {
                        let Some((series, entry, sketches)) = t.encoded(key) else {
                            continue;
                        };
                        encode_entry(&mut buf, series, key.hour, entry, &sketches);
                    }
                    Some(false) => {
                        buf.push(RECORD_META);
                        encode_key(&mut buf, series, key.hour);
                        buf.extend_from_slice(&entry.version.to_le_bytes());
                        buf.extend_from_slice(&entry.acked.to_le_bytes());
                        buf.push(u8::from(entry.dirty));
                    }
                    None => continue,
                }
                written.push((key, version));
            }
        }
        frames.push(&buf)?;
    }
    frames.emit(COMMIT)?;
    file.sync_data()?;
    Ok((frames.at, written))
}

fn encode_key(buf: &mut Vec<u8>, series: &Series, hour: u32) {
    let text = series.to_string();
    buf.extend_from_slice(&(text.len() as u16).to_le_bytes());
    buf.extend_from_slice(text.as_bytes());
    buf.extend_from_slice(&hour.to_le_bytes());
}

/// An entry record: its key, version, acknowledgement, flag, and its sketches' `frames`.
fn encode_entry(buf: &mut Vec<u8>, series: &Series, hour: u32, entry: &Entry, frames: &[Bytes]) {
    buf.push(RECORD_ENTRY);
    encode_key(buf, series, hour);
    buf.extend_from_slice(&entry.version.to_le_bytes());
    buf.extend_from_slice(&entry.acked.to_le_bytes());
    buf.push(u8::from(entry.dirty));
    buf.push(frames.len() as u8);
    for frame in frames {
        buf.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        buf.extend_from_slice(frame);
    }
}

/// Reads the checkpoint of `data_dir`, its base and the log after it: `Ok(None)` if there
/// is no base (a log without its base is of no use).
pub fn read(data_dir: &Path) -> Result<Option<Loaded>, CheckpointError> {
    let bytes = match std::fs::read(path(data_dir)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut loaded = decode(&bytes)?;
    let base_sum = u64::from_le_bytes(bytes[bytes.len() - 8..].try_into().expect("8 bytes"));
    let base_len = bytes.len() as u64;
    drop(bytes);
    match std::fs::read(log_path(data_dir)) {
        Ok(log) => {
            if apply_log(&mut loaded, base_sum, &log)? {
                loaded.resume = Some(LogPosition {
                    base_sum,
                    base_len,
                    log_len: (log.len() - loaded.torn_bytes) as u64,
                });
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Some(loaded))
}

/// Applies the log `log` to `loaded`, the base of checksum `base_sum`; false if the log
/// names another base (one left from before the last compaction), and changes nothing.
pub(crate) fn apply_log(
    loaded: &mut Loaded,
    base_sum: u64,
    log: &[u8],
) -> Result<bool, CheckpointError> {
    let corrupt = |what: String| CheckpointError::Corrupt(format!("checkpoint log: {what}"));
    if log.len() < LOG_HEADER || &log[..4] != LOG_MAGIC {
        return Err(corrupt(
            "not a checkpoint log (bad magic or too short)".into(),
        ));
    }
    if log[4] != LOG_VERSION {
        return Err(corrupt(format!(
            "format version {}, this agent reads {LOG_VERSION}",
            log[4]
        )));
    }
    if u64::from_le_bytes(log[5..13].try_into().expect("8 bytes")) != base_sum {
        return Ok(false);
    }
    let mut entries: BTreeMap<(String, u32), (Series, Entry)> = std::mem::take(&mut loaded.entries)
        .into_iter()
        .map(|e| ((e.series.to_string(), e.hour), (e.series, e.entry)))
        .collect();
    let mut at = LOG_HEADER;
    let mut transaction = Vec::new();
    let mut committed_at = at;
    while at < log.len() {
        let rest = &log[at..];
        if rest.len() < FRAME_HEADER {
            break; // torn: the file ends inside a frame header
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let flags = rest[4];
        let sum = u64::from_le_bytes(rest[5..13].try_into().expect("8 bytes"));
        let check = u32::from_le_bytes(rest[13..17].try_into().expect("4 bytes"));
        if xxhash_rust::xxh3::xxh3_64(&rest[..13]) as u32 != check || flags & !COMMIT != 0 {
            return Err(corrupt(format!("damaged frame header at offset {at}")));
        }
        if rest.len() - FRAME_HEADER < len {
            break; // torn: the file ends inside the payload
        }
        let payload = &rest[FRAME_HEADER..FRAME_HEADER + len];
        if xxhash_rust::xxh3::xxh3_64(payload) != sum {
            return Err(corrupt(format!("damaged frame at offset {at}")));
        }
        transaction.extend_from_slice(payload);
        at += FRAME_HEADER + len;
        if flags & COMMIT != 0 {
            apply_transaction(loaded, &mut entries, &transaction)
                .map_err(|e| corrupt(format!("transaction ending at offset {at}: {e}")))?;
            loaded.transactions += 1;
            transaction.clear();
            committed_at = at;
        }
    }
    loaded.torn_bytes = log.len() - committed_at;
    loaded.entries = entries
        .into_iter()
        .map(|((_, hour), (series, entry))| SavedEntry {
            series,
            hour,
            entry,
        })
        .collect();
    Ok(true)
}

/// Applies one transaction's records.
fn apply_transaction(
    loaded: &mut Loaded,
    entries: &mut BTreeMap<(String, u32), (Series, Entry)>,
    bytes: &[u8],
) -> Result<(), CheckpointError> {
    let mut r = Reader { bytes, at: 0 };
    if r.u8()? != RECORD_HEADER {
        return Err(CheckpointError::Corrupt(
            "does not begin with its header".into(),
        ));
    }
    loaded.last_version = r.u64()?;
    let closed_flag = r.u8()?;
    let closed_hour = r.u32()?;
    loaded.closed_through = (closed_flag != 0).then_some(closed_hour);
    loaded.live_hours = read_live_hours(&mut r)?;
    while r.remaining() > 0 {
        match r.u8()? {
            RECORD_REMOVED => {
                let (series, hour) = decode_key(&mut r)?;
                entries.remove(&(series.to_string(), hour));
            }
            RECORD_ENTRY => {
                let e = decode_entry(&mut r)?;
                entries.insert((e.series.to_string(), e.hour), (e.series, e.entry));
            }
            RECORD_META => {
                let (series, hour) = decode_key(&mut r)?;
                let Some((_, entry)) = entries.get_mut(&(series.to_string(), hour)) else {
                    return Err(CheckpointError::Corrupt(format!(
                        "a version record for {series} at hour {hour}, which the checkpoint does not hold"
                    )));
                };
                entry.version = r.u64()?;
                entry.acked = r.u64()?;
                entry.dirty = r.u8()? != 0;
            }
            tag => {
                return Err(CheckpointError::Corrupt(format!(
                    "unknown record tag {tag}"
                )));
            }
        }
    }
    Ok(())
}

fn read_live_hours(r: &mut Reader<'_>) -> Result<Vec<u32>, CheckpointError> {
    let live_count = r.u32()? as usize;
    if live_count > r.remaining() / 4 {
        return Err(CheckpointError::Corrupt(
            "live hour count exceeds the file".into(),
        ));
    }
    (0..live_count).map(|_| r.u32()).collect()
}

fn decode_key(r: &mut Reader<'_>) -> Result<(Series, u32), CheckpointError> {
    let len = r.u16()? as usize;
    let text = std::str::from_utf8(r.take(len)?)
        .map_err(|_| CheckpointError::Corrupt("series is not UTF-8".into()))?;
    let series = Series::parse(text)
        .map_err(|e| CheckpointError::Corrupt(format!("series {text:?}: {e}")))?;
    Ok((series, r.u32()?))
}

fn decode_entry(r: &mut Reader<'_>) -> Result<SavedEntry, CheckpointError> {
    let (series, hour) = decode_key(r)?;
    let version = r.u64()?;
    let acked = r.u64()?;
    let dirty = r.u8()? != 0;
    let count = r.u8()?;
    let mut sketches = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let len = r.u32()? as usize;
        let sketch = Sketch::decode(r.take(len)?).map_err(|e| {
            CheckpointError::Corrupt(format!("sketch of {series} at hour {hour}: {e}"))
        })?;
        sketches.push(sketch);
    }
    let entry = Entry {
        sketches,
        version,
        acked,
        dirty,
        ..Entry::default()
    };
    Ok(SavedEntry {
        series,
        hour,
        entry,
    })
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

/// Decodes a checkpoint's bytes.
pub fn decode(bytes: &[u8]) -> Result<Loaded, CheckpointError> {
    let corrupt = |what: &str| CheckpointError::Corrupt(what.to_string());
    if bytes.len() < MAGIC.len() + 1 + 2 + 8 + 8 + 5 + 4 + 1 + 8 {
        return Err(corrupt("file is shorter than an empty checkpoint"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    let sum = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
    if xxhash_rust::xxh3::xxh3_64(body) != sum {
        return Err(corrupt(
            "checksum mismatch (the file is truncated or damaged)",
        ));
    }
    let mut r = Reader { bytes: body, at: 0 };
    if r.take(4)? != MAGIC {
        return Err(corrupt("not a checkpoint (bad magic)"));
    }
    let version = r.u8()?;
    if version != VERSION {
        return Err(CheckpointError::Corrupt(format!(
            "format version {version}, this agent reads {VERSION}"
        )));
    }
    let server_len = r.u16()? as usize;
    let server = std::str::from_utf8(r.take(server_len)?)
        .map_err(|_| corrupt("server name is not UTF-8"))?
        .to_string();
    let epoch = r.u64()?;
    let last_version = r.u64()?;
    let closed_flag = r.u8()?;
    let closed_hour = r.u32()?;
    let closed_through = (closed_flag != 0).then_some(closed_hour);
    let live_hours = read_live_hours(&mut r)?;
    let mut entries = Vec::new();
    loop {
        match r.u8()? {
            RECORD_END => break,
            RECORD_ENTRY => entries.push(decode_entry(&mut r)?),
            tag => {
                return Err(CheckpointError::Corrupt(format!(
                    "unknown record tag {tag}"
                )));
            }
        }
    }
    if r.remaining() != 0 {
        return Err(corrupt("bytes after the end record"));
    }
    Ok(Loaded {
        server,
        epoch,
        closed_through,
        last_version,
        live_hours,
        entries,
        transactions: 0,
        torn_bytes: 0,
        resume: None,
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], CheckpointError> {
        if n > self.remaining() {
            return Err(CheckpointError::Corrupt(format!(
                "a field of {n} bytes at offset {} runs past the end",
                self.at
            )));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, CheckpointError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, CheckpointError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, CheckpointError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, CheckpointError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::table::IngestStats;
    use proptest::prelude::*;
    use std::sync::Arc;

    const NOW: i64 = 1_764_000_000;

    thread_local! {
        /// Makes the next base write fail after its rename, at the directory's fsync (as
        /// EIO, or EMFILE opening the directory, would).
        pub(super) static FAIL_DIR_SYNC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// DEFECT: a compaction whose base is renamed into place but whose directory fsync
    /// then fails returns an error, and `Writer::write` falls back to appending to the
    /// log it had — a log naming the *old* base. On disk the new base is in place, so a
    /// reader ignores that log: every transaction appended to it (until the next
    /// compaction succeeds) is reported durable, its versions pushed, and none of it is
    /// read back after a restart, which then reuses those versions for other content.
    #[test]
    fn a_compaction_that_fails_after_its_rename_never_appends_to_the_old_log() {
        let dir = tempfile::tempdir().unwrap();
        let table = Mutex::new(filled());
        let mut writer = Writer::new(dir.path(), "web-1");
        writer.write(&table).unwrap();
        add(&table, "visitors", "x", NOW);
        crate::table::lock(&table).assign_versions();
        assert!(!writer.write(&table).unwrap().full);
        // The log is due for compaction; the new base's directory fsync fails.
        writer.compact_at = 0;
        add(&table, "visitors", "y", NOW);
        crate::table::lock(&table).assign_versions();
        FAIL_DIR_SYNC.with(|f| f.set(true));
        let written = writer.write(&table);
        if written.is_ok() {
            // Reported durable: the shipper now pushes these versions.
            let t = crate::table::lock(&table);
            assert!(t.keys().iter().all(|&k| {
                let e = t.get(k).unwrap().1;
                e.saved.durable == e.version
            }));
        }
        // The next checkpoints: a new version (pushed once this returns), then acks.
        add(&table, "visitors", "z", NOW);
        crate::table::lock(&table).assign_versions();
        writer.write(&table).unwrap();
        {
            let mut t = crate::table::lock(&table);
            for key in t.keys() {
                let version = t.get(key).unwrap().1.version;
                t.ack(key, version);
            }
        }
        writer.write(&table).unwrap();
        assert_eq!(
            restored(dir.path()),
            held(&table),
            "a restart reads back less than the checkpoints reported durable"
        );
    }

    fn filled() -> Table {
        let mut t = Table::new(Arc::new(Config::default()), 42);
        let mut stats = IngestStats::default();
        for (i, tags) in ["a:1", "a:2", ""].iter().enumerate() {
            let id = t.resolve_statsd("visitors", tags, &mut stats).unwrap();
            for j in 0..100 * (i + 1) {
                t.insert(id, NOW, NOW, format!("u{j}").as_bytes(), 1)
                    .unwrap();
            }
        }
        t.mark_live((NOW / 3600) as u32);
        t.assign_versions();
        t
    }

    fn digest(sketches: &[Sketch]) -> u64 {
        let bytes: Vec<u8> = sketches.iter().flat_map(Sketch::encode).collect();
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    /// What a restart would restore, as comparable text: every entry's series, hour,
    /// version, acknowledgement, flag and sketches, and the header fields.
    fn restored(dir: &Path) -> (u64, Option<u32>, Vec<u32>, Vec<String>) {
        let loaded = read(dir).unwrap().unwrap();
        let mut entries: Vec<String> = loaded
            .entries
            .iter()
            .map(|saved| {
                let (s, h, e) = (&saved.series, saved.hour, &saved.entry);
                format!(
                    "{s}@{h} v{} a{} d{} {:x}",
                    e.version,
                    e.acked,
                    e.dirty,
                    digest(&e.sketches)
                )
            })
            .collect();
        entries.sort();
        (
            loaded.last_version,
            loaded.closed_through,
            loaded.live_hours,
            entries,
        )
    }

    /// The same, of a table in memory.
    fn held(table: &Mutex<Table>) -> (u64, Option<u32>, Vec<u32>, Vec<String>) {
        let t = crate::table::lock(table);
        let mut entries: Vec<String> = t
            .keys()
            .into_iter()
            .map(|k| {
                let (s, e) = t.get(k).unwrap();
                format!(
                    "{s}@{} v{} a{} d{} {:x}",
                    k.hour,
                    e.version,
                    e.acked,
                    e.dirty,
                    digest(&e.sketches)
                )
            })
            .collect();
        entries.sort();
        (
            t.last_version(),
            t.closed_through(),
            t.live_hours(),
            entries,
        )
    }

    fn add(table: &Mutex<Table>, metric: &str, item: &str, time: i64) {
        let mut t = crate::table::lock(table);
        let id = t
            .resolve_statsd(metric, "", &mut IngestStats::default())
            .unwrap();
        t.insert_at(id, (time / 3600) as u32, item.as_bytes(), 1);
    }

    #[test]
    fn checkpoints_after_the_first_write_only_what_changed_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let table = Mutex::new(filled());
        let mut writer = Writer::new(dir.path(), "web-1");
        let first = writer.write(&table).unwrap();
        assert!(first.full, "the first checkpoint of a start is a base");
        assert_eq!(restored(dir.path()), held(&table));

        // Nothing changed: a transaction of the header alone.
        let idle = writer.write(&table).unwrap();
        assert!(!idle.full);
        assert!(idle.bytes < 100, "{idle:?}");

        // One entry of three changes: about a third of the table is written.
        add(&table, "visitors", "new-item", NOW);
        crate::table::lock(&table).assign_versions();
        let one = writer.write(&table).unwrap();
        assert!(!one.full);
        assert!(one.bytes < first.bytes / 2, "{one:?} against {first:?}");
        assert_eq!(restored(dir.path()), held(&table));

        // Acknowledgements alone: no sketch is written again.
        {
            let mut t = crate::table::lock(&table);
            for key in t.keys() {
                let version = t.get(key).unwrap().1.version;
                t.ack(key, version);
            }
        }
        let acks = writer.write(&table).unwrap();
        assert!(acks.bytes < 300, "{acks:?}");
        assert_eq!(restored(dir.path()), held(&table));

        // Freed entries are gone after a restart too.
        let freed = crate::table::lock(&table).free_closed(NOW + 3 * 3600);
        assert_eq!(freed, 3);
        add(&table, "later", "x", NOW + 3 * 3600);
        writer.write(&table).unwrap();
        assert_eq!(restored(dir.path()), held(&table));
        assert_eq!(read(dir.path()).unwrap().unwrap().entries.len(), 1);

        // A base alone (as every earlier agent wrote it) still reads.
        std::fs::remove_file(log_path(dir.path())).unwrap();
        assert_eq!(read(dir.path()).unwrap().unwrap().entries.len(), 3);
    }

    #[test]
    fn a_log_left_from_an_older_base_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let table = Mutex::new(filled());
        let mut writer = Writer::new(dir.path(), "web-1");
        writer.write(&table).unwrap();
        add(&table, "visitors", "x", NOW);
        crate::table::lock(&table).assign_versions();
        writer.write(&table).unwrap();
        let old_log = std::fs::read(log_path(dir.path())).unwrap();
        // A compaction (a new base) that crashed before writing its new log: the old log
        // still names the old base.
        Writer::new(dir.path(), "web-1").write(&table).unwrap();
        std::fs::write(log_path(dir.path()), &old_log).unwrap();
        let loaded = read(dir.path()).unwrap().unwrap();
        assert_eq!(loaded.transactions, 0);
        assert_eq!(restored(dir.path()), held(&table));
    }

    #[test]
    fn a_torn_last_transaction_is_ignored_and_damage_before_it_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let table = Mutex::new(filled());
        let mut writer = Writer::new(dir.path(), "web-1");
        writer.write(&table).unwrap();
        add(&table, "visitors", "x", NOW);
        crate::table::lock(&table).assign_versions();
        writer.write(&table).unwrap();
        let before = held(&table);
        let middle = std::fs::read(log_path(dir.path())).unwrap().len();
        add(&table, "visitors", "y", NOW);
        crate::table::lock(&table).assign_versions();
        writer.write(&table).unwrap();
        let whole = std::fs::read(log_path(dir.path())).unwrap();

        // A crash during the last append: the file ends anywhere inside it.
        for cut in [middle + 1, middle + FRAME_HEADER, whole.len() - 1] {
            std::fs::write(log_path(dir.path()), &whole[..cut]).unwrap();
            let loaded = read(dir.path()).unwrap().unwrap();
            assert_eq!((loaded.transactions, loaded.torn_bytes), (1, cut - middle));
            assert_eq!(restored(dir.path()), before, "cut {cut}");
        }
        // A flipped byte in a transaction that was whole: the checkpoint is damaged.
        for at in [LOG_HEADER + 2, LOG_HEADER + FRAME_HEADER + 3, middle + 5] {
            let mut bad = whole.clone();
            bad[at] ^= 0x20;
            std::fs::write(log_path(dir.path()), &bad).unwrap();
            assert!(
                matches!(read(dir.path()), Err(CheckpointError::Corrupt(_))),
                "byte {at}"
            );
        }
    }

    /// A table holding what `loaded` holds, as the agent restores one at start.
    fn restore(loaded: Loaded) -> Table {
        let mut t = Table::new(Arc::new(Config::default()), loaded.epoch);
        t.raise_last_version(loaded.last_version);
        if let Some(hour) = loaded.closed_through {
            t.close_through(hour);
        }
        for e in loaded.entries {
            t.restore(e.series, e.hour, e.entry);
        }
        for hour in loaded.live_hours {
            t.mark_live(hour);
        }
        t
    }

    #[test]
    fn a_restarted_agent_appends_after_the_last_whole_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let table = Mutex::new(filled());
        let mut writer = Writer::new(dir.path(), "web-1");
        writer.write(&table).unwrap();
        add(&table, "visitors", "x", NOW);
        crate::table::lock(&table).assign_versions();
        writer.write(&table).unwrap();
        let whole = std::fs::metadata(log_path(dir.path())).unwrap().len();
        // Killed during the next append: the file ends halfway into it.
        add(&table, "visitors", "lost", NOW);
        crate::table::lock(&table).assign_versions();
        let lost = writer.write(&table).unwrap();
        let log = std::fs::OpenOptions::new()
            .write(true)
            .open(log_path(dir.path()))
            .unwrap();
        log.set_len(whole + lost.bytes / 2).unwrap();
        drop(log);

        let loaded = read(dir.path()).unwrap().unwrap();
        let position = loaded.resume.unwrap();
        assert_eq!(
            (position.log_len, loaded.torn_bytes as u64),
            (whole, lost.bytes / 2)
        );
        let table = Mutex::new(restore(loaded));
        let mut writer = Writer::new(dir.path(), "web-1");
        writer.resume(position).unwrap();
        assert_eq!(
            std::fs::metadata(log_path(dir.path())).unwrap().len(),
            whole,
            "the torn transaction is cut off before anything is appended"
        );
        add(&table, "visitors", "y", NOW);
        add(&table, "new", "y", NOW);
        crate::table::lock(&table).assign_versions();
        let w = writer.write(&table).unwrap();
        assert!(!w.full, "no whole base after a restart");
        let loaded = read(dir.path()).unwrap().unwrap();
        assert_eq!((loaded.transactions, loaded.torn_bytes), (2, 0));
        assert_eq!(restored(dir.path()), held(&table));
    }

    #[test]
    fn the_log_is_compacted_once_larger_than_the_base() {
        let dir = tempfile::tempdir().unwrap();
        let table = Mutex::new(filled());
        let mut writer = Writer::new(dir.path(), "web-1");
        let base = writer.write(&table).unwrap();
        let mut appended = 0;
        let mut last_on_disk = base.on_disk;
        let compacted = loop {
            add(&table, "visitors", &format!("i{appended}"), NOW);
            crate::table::lock(&table).assign_versions();
            let w = writer.write(&table).unwrap();
            if w.full {
                break w;
            }
            last_on_disk = w.on_disk;
            appended += 1;
            assert!(appended < 1000, "never compacted");
        };
        let base_len = base.bytes - LOG_HEADER as u64;
        assert!(
            last_on_disk >= base_len + base_len.max(MIN_COMPACT_BYTES),
            "compacted after {appended} appends, at {last_on_disk} bytes on disk"
        );
        assert!(
            last_on_disk < 2 * (base_len + base_len.max(MIN_COMPACT_BYTES)),
            "not much later than the bound"
        );
        assert_eq!(
            compacted.on_disk, compacted.bytes,
            "after a compaction, the base and an empty log"
        );
        assert_eq!(restored(dir.path()), held(&table));
    }

    /// Bytes written per flush in a steady state, whole-table rewrites (what every flush
    /// wrote before the log) against the log: `cargo test -p hourglass-agent --lib --
    /// --ignored --nocapture bytes_per_flush`. Figures, not a timed assert.
    #[test]
    #[ignore]
    fn bytes_per_flush() {
        // A healthy agent (the open hour alone), and one whose aggregator is three hours
        // away (three closed hours of every series unacknowledged besides).
        for closed_hours in [0u32, 3] {
            bytes_per_flush_with(closed_hours);
        }
    }

    fn bytes_per_flush_with(closed_hours: u32) {
        let series = 200usize;
        let changing = series / 10;
        let flushes = 100;
        let dir = tempfile::tempdir().unwrap();
        let table = Mutex::new(Table::new(Arc::new(Config::default()), 1));
        // Each flush, a tenth of the series get events.
        for s in 0..series {
            for back in 0..=closed_hours {
                add(&table, &format!("m{s}"), "u", NOW - i64::from(back) * 3600);
            }
        }
        crate::table::lock(&table).assign_versions();
        let mut writer = Writer::new(dir.path(), "web-1");
        let (mut full_total, mut full_samples, mut log_total, mut compactions) = (0, 0, 0u64, 0);
        writer.write(&table).unwrap();
        for f in 0..flushes {
            for s in 0..changing {
                let s = (f * changing + s) % series;
                add(&table, &format!("m{s}"), &format!("u{f}"), NOW);
            }
            crate::table::lock(&table).assign_versions();
            let w = writer.write(&table).unwrap();
            log_total += w.bytes;
            compactions += usize::from(w.full);
            if f % 10 == 0 {
                // What the whole-table checkpoint of every flush wrote, sampled.
                let full_dir = tempfile::tempdir().unwrap();
                full_total += write(&table, full_dir.path(), "web-1").unwrap();
                full_samples += 1;
            }
        }
        println!(
            "{series} series x {} hours ({changing} changing per flush), {flushes} flushes: \
             whole table {} bytes/flush; log {} bytes/flush ({compactions} compactions included)",
            closed_hours + 1,
            full_total / full_samples,
            log_total / flushes as u64,
        );
    }

    #[test]
    fn round_trips_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let table = Mutex::new(filled());
        crate::table::lock(&table).close_through(7);
        let written = write(&table, dir.path(), "web-1").unwrap();
        let on_disk = |p: PathBuf| std::fs::metadata(p).unwrap().len();
        assert_eq!(
            written,
            on_disk(path(dir.path())) + on_disk(log_path(dir.path()))
        );
        let loaded = read(dir.path()).unwrap().unwrap();
        assert_eq!(loaded.epoch, 42);
        assert_eq!(loaded.server, "web-1");
        assert_eq!(loaded.closed_through, Some(7));
        let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(
            leftovers, 2,
            "only the checkpoint and its log: no temporary file is left"
        );
        assert_eq!(loaded.last_version, 1);
        assert_eq!(loaded.live_hours, vec![(NOW / 3600) as u32]);
        assert_eq!(loaded.entries.len(), 3);
        let t = table.lock().unwrap();
        for SavedEntry {
            series,
            hour,
            entry,
        } in &loaded.entries
        {
            let held = t.entry(&series.to_string(), *hour).unwrap();
            assert_eq!((entry.version, entry.acked, entry.dirty), (1, 0, false));
            assert_eq!(entry.sketches, held.sketches);
        }
        assert!(read(&dir.path().join("nowhere")).unwrap().is_none());
    }

    #[test]
    fn any_damage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write(&Mutex::new(filled()), dir.path(), "web-1").unwrap();
        let good = std::fs::read(path(dir.path())).unwrap();
        for cut in [0, 5, good.len() / 2, good.len() - 1] {
            assert!(
                matches!(decode(&good[..cut]), Err(CheckpointError::Corrupt(_))),
                "cut {cut}"
            );
        }
        let mut flipped = good.clone();
        flipped[good.len() / 3] ^= 0x40;
        let e = decode(&flipped).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
    }

    #[test]
    fn leftover_temporary_files_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        write(&Mutex::new(filled()), dir.path(), "web-1").unwrap();
        for name in [
            "checkpoint.tmp-123-0",
            "checkpoint.tmp-9-4",
            "lock",
            "notes",
        ] {
            std::fs::write(dir.path().join(name), b"partial").unwrap();
        }
        std::fs::create_dir(dir.path().join("checkpoint.tmp-dir")).unwrap();
        assert_eq!(remove_leftovers(dir.path()).unwrap(), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "checkpoint",
                "checkpoint.log",
                "checkpoint.tmp-dir",
                "lock",
                "notes"
            ]
        );
        assert!(
            read(dir.path()).unwrap().is_some(),
            "the checkpoint is kept"
        );
    }

    proptest! {
        /// A log of arbitrary frames after a valid header, for the base it names, never
        /// panics: it applies, is a torn tail, or is an error.
        #[test]
        fn hostile_logs_never_panic(frames in prop::collection::vec((prop::collection::vec(any::<u8>(), 0..200), any::<u8>(), any::<bool>()), 0..6)) {
            let mut log = LOG_MAGIC.to_vec();
            log.push(LOG_VERSION);
            log.extend_from_slice(&7u64.to_le_bytes());
            for (payload, flags, honest) in frames {
                let mut header = (payload.len() as u32).to_le_bytes().to_vec();
                header.push(flags & 1);
                let sum = if honest { xxhash_rust::xxh3::xxh3_64(&payload) } else { 0 };
                header.extend_from_slice(&sum.to_le_bytes());
                let check = xxhash_rust::xxh3::xxh3_64(&header) as u32;
                header.extend_from_slice(&check.to_le_bytes());
                log.extend_from_slice(&header);
                log.extend_from_slice(&payload);
            }
            let mut loaded = Loaded {
                server: "web-1".into(),
                epoch: 1,
                closed_through: None,
                last_version: 0,
                live_hours: Vec::new(),
                entries: Vec::new(),
                transactions: 0,
                torn_bytes: 0,
                resume: None,
            };
            let _ = apply_log(&mut loaded, 7, &log);
        }

        /// Bytes with a valid checksum but arbitrary content reach the field checks, which
        /// never panic.
        #[test]
        fn hostile_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..300), head in any::<bool>()) {
            let mut bytes = if head { b"HGCP\x02".to_vec() } else { Vec::new() };
            bytes.extend_from_slice(&body);
            let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
            bytes.extend_from_slice(&sum.to_le_bytes());
            let _ = decode(&bytes);
        }
    }
}
