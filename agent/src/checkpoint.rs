//! The agent's checkpoint: its open and unacknowledged sketches, written atomically to
//! the data dir at every flush and at shutdown, and read back at start (DESIGN §3).
//!
//! The file (`checkpoint` in the data dir; layout in docs/FORMAT.md):
//!
//! ```text
//! "HGCP" | format version u8 = 2 | server name len u16 | server name | epoch u64
//!        | last version u64 | closed flag u8 | closed through hour u32
//!        | live hour count u32 | live hours u32…
//! entries: 0x01 | series text len u16 | series text | hour u32 | version u64 | acked u64
//!          | dirty u8 | sketch count u8 | (frame len u32 | framed sketch)…
//! end:     0x00 | xxh3-64 of every byte before it
//! ```
//!
//! Integers are little-endian. It is written to a fresh `checkpoint.tmp-N`, fsynced, renamed over
//! `checkpoint`, and the directory fsynced, so a crash leaves the old file or the new one,
//! never a mix. Reading checks the checksum first and every length after: a damaged file
//! is an error, never a panic.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use hourglass::series::Series;
use hourglass::sketch::Sketch;
use xxhash_rust::xxh3::Xxh3;

use crate::table::{Entry, Table};

const MAGIC: &[u8; 4] = b"HGCP";
const VERSION: u8 = 2;
/// Entries encoded per hold of the table's lock, so ingest waits at most that long.
const ENTRIES_PER_LOCK: usize = 64;

/// The checkpoint file in `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint")
}

/// The prefix of the temporary files a checkpoint is written to before the rename.
const TMP_PREFIX: &str = "checkpoint.tmp-";

/// Removes the temporary files a checkpoint writer left when the agent was killed
/// mid-write; returns how many. Only for a data dir this process holds the lock of: no
/// writer of another agent can be using them.
pub fn remove_leftovers(data_dir: &Path) -> std::io::Result<usize> {
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
    pub server: String,
    /// The epoch it belongs to.
    pub epoch: u64,
    /// Every hour up to this one was closed for good.
    pub closed_through: Option<u32>,
    /// The highest version given in the epoch.
    pub last_version: u64,
    /// Live hours not yet reported.
    pub live_hours: Vec<u32>,
    /// The entries.
    pub entries: Vec<(Series, u32, Entry)>,
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

/// Writes the table's state to `data_dir`'s checkpoint atomically; returns the bytes
/// written. The table is locked for a few entries at a time, never across a disk write
/// of the whole file or the fsync.
pub fn write(table: &Mutex<Table>, data_dir: &Path, server: &str) -> Result<u64, CheckpointError> {
    // A name of its own: a writer still running from a flush that was given up on can
    // never write into this one's file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = data_dir.join(format!("{TMP_PREFIX}{}-{n}", std::process::id()));
    let result = write_to(table, data_dir, server, &tmp);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn write_to(
    table: &Mutex<Table>,
    data_dir: &Path,
    server: &str,
    tmp: &Path,
) -> Result<u64, CheckpointError> {
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
    for chunk in keys.chunks(ENTRIES_PER_LOCK) {
        buf.clear();
        {
            let t = crate::table::lock(table);
            for &key in chunk {
                // Freed since the keys were listed: nothing left to keep.
                let Some((series, entry)) = t.get(key) else {
                    continue;
                };
                encode_entry(&mut buf, series, key.1, entry);
            }
        }
        out.write_all(&buf)?;
    }
    out.write_all(&[0])?;
    let sum = out.hasher.digest();
    out.write_all(&sum.to_le_bytes())?;
    let written = out.written;
    let file = out
        .inner
        .into_inner()
        .map_err(|e| CheckpointError::Io(e.into_error()))?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(tmp, path(data_dir))?;
    // The rename is durable only once the directory is.
    File::open(data_dir)?.sync_all()?;
    Ok(written)
}

fn encode_entry(buf: &mut Vec<u8>, series: &Series, hour: u32, entry: &Entry) {
    let text = series.to_string();
    buf.push(1);
    buf.extend_from_slice(&(text.len() as u16).to_le_bytes());
    buf.extend_from_slice(text.as_bytes());
    buf.extend_from_slice(&hour.to_le_bytes());
    buf.extend_from_slice(&entry.version.to_le_bytes());
    buf.extend_from_slice(&entry.acked.to_le_bytes());
    buf.push(u8::from(entry.dirty));
    buf.push(entry.sketches.len() as u8);
    for sketch in &entry.sketches {
        let frame = sketch.encode();
        buf.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        buf.extend_from_slice(&frame);
    }
}

/// Reads the checkpoint of `data_dir`: `Ok(None)` if there is none.
pub fn read(data_dir: &Path) -> Result<Option<Loaded>, CheckpointError> {
    let bytes = match std::fs::read(path(data_dir)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    decode(&bytes).map(Some)
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
    let live_count = r.u32()? as usize;
    if live_count > r.remaining() / 4 {
        return Err(corrupt("live hour count exceeds the file"));
    }
    let live_hours = (0..live_count).map(|_| r.u32()).collect::<Result<_, _>>()?;
    let mut entries = Vec::new();
    loop {
        match r.u8()? {
            0 => break,
            1 => {}
            tag => {
                return Err(CheckpointError::Corrupt(format!(
                    "unknown record tag {tag}"
                )));
            }
        }
        let len = r.u16()? as usize;
        let text = std::str::from_utf8(r.take(len)?).map_err(|_| corrupt("series is not UTF-8"))?;
        let series = Series::parse(text)
            .map_err(|e| CheckpointError::Corrupt(format!("series {text:?}: {e}")))?;
        let hour = r.u32()?;
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
        entries.push((
            series,
            hour,
            Entry {
                sketches,
                version,
                acked,
                dirty,
            },
        ));
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

    #[test]
    fn round_trips_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let table = Mutex::new(filled());
        crate::table::lock(&table).close_through(7);
        let written = write(&table, dir.path(), "web-1").unwrap();
        assert_eq!(written, std::fs::metadata(path(dir.path())).unwrap().len());
        let loaded = read(dir.path()).unwrap().unwrap();
        assert_eq!(loaded.epoch, 42);
        assert_eq!(loaded.server, "web-1");
        assert_eq!(loaded.closed_through, Some(7));
        let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(
            leftovers, 1,
            "only the checkpoint: no temporary file is left"
        );
        assert_eq!(loaded.last_version, 1);
        assert_eq!(loaded.live_hours, vec![(NOW / 3600) as u32]);
        assert_eq!(loaded.entries.len(), 3);
        let t = table.lock().unwrap();
        for (series, hour, entry) in &loaded.entries {
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
        assert_eq!(left, ["checkpoint", "checkpoint.tmp-dir", "lock", "notes"]);
        assert!(
            read(dir.path()).unwrap().is_some(),
            "the checkpoint is kept"
        );
    }

    proptest! {
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
