//! Reading a checkpoint back: its base, then every whole transaction of the log that
//! follows it; every checksum is checked before a byte is used.

use std::collections::BTreeMap;
use std::path::Path;

use hourglass_rpc::series::Series;
use hourglass_sketch::Sketch;

use super::format::*;
use crate::table::Entry;

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
