//! Writing checkpoints: a whole new base, or a transaction appended to the log of what
//! changed since the last one.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use hourglass_rpc::series::Series;
use xxhash_rust::xxh3::Xxh3;

use super::format::*;
use crate::table::{Entry, Key, Table};

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
    pub(super) compact_at: u64,
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
            if super::tests::FAIL_DIR_SYNC.with(|f| f.take()) {
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
