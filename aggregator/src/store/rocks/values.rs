//! How the RocksDB store reads and writes the bytes of its values and key fields: the
//! version in front of an hourly value, rollup marks, live-hours masks, ids, and the
//! encoded names and labels of the series and server dictionaries. Every reader checks
//! lengths first and names the column and key of a value that does not decode.

use super::*;

pub(super) fn stored_version(key: &[u8], value: &[u8]) -> Result<u64, StoreError> {
    match value.get(..VERSION_LEN) {
        Some(version) if value.len() > VERSION_LEN => {
            let mut bytes = [0u8; VERSION_LEN];
            bytes.copy_from_slice(version);
            Ok(u64::from_be_bytes(bytes))
        }
        _ => Err(StoreError::BadValue {
            column: CF_HOURLY,
            key: key.to_vec(),
            reason: format!(
                "an hourly value is an 8-byte version and a sketch, found {} bytes",
                value.len()
            ),
        }),
    }
}

/// The first bytes of a ZSTD frame (RFC 8878). A sketch frame starts with the sketch
/// format's own magic (docs/FORMAT.md), so a value's bytes after the version say which
/// they hold.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// The largest sketch frame an hourly value may unpack to: a body at the format's bound
/// plus its header and checksum (a generous 64 bytes).
const MAX_SKETCH_FRAME: u64 = hourglass_sketch::format::MAX_BODY_LEN as u64 + 64;

thread_local! {
    /// Each thread's ZSTD contexts, made on first use and reused: a context costs more to
    /// make than a sketch to compress.
    static CODEC: std::cell::RefCell<Option<Codec>> = const { std::cell::RefCell::new(None) };
}

/// A thread's ZSTD contexts: one compressor for dense UltraLogLog registers, one for
/// every other sketch, and a decompressor.
struct Codec {
    registers: zstd::bulk::Compressor<'static>,
    other: zstd::bulk::Compressor<'static>,
    decompressor: zstd::bulk::Decompressor<'static>,
}

/// Whether a sketch frame holds dense UltraLogLog registers (a distinct frame whose body
/// says so), which [`register_compressor`] is for.
pub(super) fn holds_registers(frame: &[u8]) -> bool {
    use hourglass_sketch::format::{HEADER_LEN, Kind};
    frame.get(5) == Some(&Kind::Distinct.code())
        && frame
            .get(HEADER_LEN..)
            .is_some_and(hourglass_sketch::ull::Ull::is_dense_body)
}

/// Runs `f` with this thread's ZSTD contexts; `None` if ZSTD could not make them.
fn with_codec<T>(f: impl FnOnce(&mut Codec) -> T) -> Option<T> {
    CODEC.with(|cell| {
        let mut codec = cell.borrow_mut();
        if codec.is_none() {
            *codec = Some(Codec {
                registers: register_compressor()?,
                other: zstd::bulk::Compressor::new(super::options::ZSTD_FAST_LEVEL).ok()?,
                decompressor: zstd::bulk::Decompressor::new().ok()?,
            });
        }
        Some(f(codec.as_mut()?))
    })
}

/// The compressor of dense UltraLogLog registers: ZSTD's fastest strategy with its match
/// finder all but off, and Huffman coding of the bytes left on. Registers hold a few bits
/// of entropy each and next to no repeats worth a match, so the gain is the entropy
/// coding; the search for matches at level 1 cost more than the coding and found short
/// matches that coded worse than the bytes themselves. Measured on dense frames of 2,100
/// to 5,000 items at p = 13 (docs/STORAGE.md): 28 µs and 27% of the bytes, against 47 µs
/// and 32% at plain level 1. Not for other sketches: long runs of zeros (an empty
/// Count-Min row, a sparse Bloom filter) are matches, and without them a mostly zero
/// 64 KiB frame took 7.9 KB and 317 µs against 274 bytes and 12 µs at level 1. Any ZSTD
/// decoder reads the frames, so values written either way read the same.
fn register_compressor() -> Option<zstd::bulk::Compressor<'static>> {
    use zstd::zstd_safe::{CParameter, ParamSwitch, Strategy};
    let mut compressor = zstd::bulk::Compressor::new(super::options::ZSTD_FAST_LEVEL).ok()?;
    for parameter in [
        CParameter::Strategy(Strategy::ZSTD_fast),
        // The fast strategy's acceleration: it steps past positions ever faster while it
        // finds no match, and turns literal coding off unless it is forced on below.
        CParameter::TargetLength(1000),
        CParameter::MinMatch(7),
        CParameter::HashLog(6),
        CParameter::WindowLog(10),
        CParameter::LiteralCompressionMode(ParamSwitch::Enable),
    ] {
        compressor.set_parameter(parameter).ok()?;
    }
    Some(compressor)
}

/// An hourly value: the version (big-endian), then the sketch frame, compressed with ZSTD
/// when `compress` and that makes it smaller, else as it is (docs/STORAGE.md). The store
/// compresses each value once, here: the WAL and the hourly SST files leave them as they
/// are.
pub(super) fn hourly_value(version: u64, sketch: &[u8], compress: bool) -> Vec<u8> {
    if compress {
        let packed = with_codec(|codec| {
            let compressor = if holds_registers(sketch) {
                &mut codec.registers
            } else {
                &mut codec.other
            };
            let mut value = vec![0u8; VERSION_LEN + zstd::zstd_safe::compress_bound(sketch.len())];
            let n = compressor
                .compress_to_buffer(sketch, &mut value[VERSION_LEN..])
                .ok()?;
            (n < sketch.len()).then(|| {
                value.truncate(VERSION_LEN + n);
                value
            })
        })
        .flatten();
        if let Some(mut value) = packed {
            value[..VERSION_LEN].copy_from_slice(&version.to_be_bytes());
            return value;
        }
    }
    let mut value = Vec::with_capacity(VERSION_LEN + sketch.len());
    value.extend_from_slice(&version.to_be_bytes());
    value.extend_from_slice(sketch);
    value
}

/// The sketch frame of an hourly value written by [`hourly_value`] (or by a build before
/// values were compressed: then the frame as it is). The frame itself is checked by
/// whoever decodes it; a ZSTD frame that does not unpack, or would unpack beyond any
/// sketch, is an error naming the key.
pub(super) fn hourly_sketch(key: &[u8], value: &[u8]) -> Result<Vec<u8>, StoreError> {
    let stored = value.get(VERSION_LEN..).unwrap_or_default();
    if !stored.starts_with(&ZSTD_MAGIC) {
        return Ok(stored.to_vec());
    }
    let bad = |reason: String| StoreError::BadValue {
        column: CF_HOURLY,
        key: key.to_vec(),
        reason,
    };
    let size = match zstd::zstd_safe::get_frame_content_size(stored) {
        Ok(Some(size)) if size <= MAX_SKETCH_FRAME => size as usize,
        Ok(Some(size)) => {
            return Err(bad(format!(
                "a compressed hourly value claims {size} bytes, more than any sketch ({MAX_SKETCH_FRAME})"
            )));
        }
        Ok(None) | Err(_) => {
            return Err(bad(
                "a compressed hourly value has no readable content size".into(),
            ));
        }
    };
    let sketch = with_codec(|codec| codec.decompressor.decompress(stored, size))
        .ok_or_else(|| bad("ZSTD could not make a decompression context".into()))?
        .map_err(|e| bad(format!("a compressed hourly value does not unpack: {e}")))?;
    if sketch.len() != size {
        return Err(bad(format!(
            "a compressed hourly value unpacked to {} bytes, its header says {size}",
            sketch.len()
        )));
    }
    Ok(sketch)
}

pub(super) fn series_and_time(cf: &'static str, key: &[u8]) -> Result<(u32, u32), StoreError> {
    let expected = if cf == CF_HOURLY {
        HourKey::LEN
    } else {
        DayKey::LEN
    };
    if key.len() != expected {
        return Err(StoreError::BadKey {
            column: cf,
            source: crate::keys::KeyLengthError {
                what: if cf == CF_HOURLY {
                    "hourly key"
                } else {
                    "rollup key"
                },
                expected,
                found: key.len(),
            },
        });
    }
    Ok((
        u32::from_be_bytes([key[0], key[1], key[2], key[3]]),
        u32::from_be_bytes([key[4], key[5], key[6], key[7]]),
    ))
}

/// The bytes of `key` from `offset` on; none if it is shorter (a damaged key, which the
/// length check of [`meta_id`] then reports).
pub(super) fn after(key: &[u8], offset: usize) -> &[u8] {
    key.get(offset..).unwrap_or(&[])
}

/// The mask stored under a `liveday/` key.
pub(super) fn live_mask(key: &[u8], value: &[u8]) -> Result<u32, StoreError> {
    let bytes: [u8; 4] = value.try_into().map_err(|_| StoreError::BadValue {
        column: CF_META,
        key: key.to_vec(),
        reason: format!("a live-hours mask must be 4 bytes, found {}", value.len()),
    })?;
    Ok(u32::from_be_bytes(bytes))
}

/// The (series, day) of a `prefix | day | series` key ([`meta::day_series`]).
pub(super) fn day_series_fields(prefix: &[u8], key: &[u8]) -> Result<(SeriesId, Day), StoreError> {
    meta::day_series_fields(prefix, key).ok_or_else(|| StoreError::BadValue {
        column: CF_META,
        key: key.to_vec(),
        reason: "a day-series key must end in day (4) and series (4)".into(),
    })
}

/// The mark stored under a `dirty/` or `built/` key.
pub(super) fn mark_value(key: &[u8], value: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] = value.try_into().map_err(|_| StoreError::BadValue {
        column: CF_META,
        key: key.to_vec(),
        reason: format!("a rollup mark must be 8 bytes, found {}", value.len()),
    })?;
    Ok(u64::from_be_bytes(bytes))
}

/// The `meta` key of the cluster stream position of `subject` ([`super::super::StreamPosition`]).
pub(super) fn stream_position_key(subject: u32) -> Vec<u8> {
    let mut key = STREAM_POSITION.to_vec();
    key.extend_from_slice(&subject.to_be_bytes());
    key
}

/// The `meta` prefix of cluster stream positions.
pub(super) const STREAM_POSITION: &[u8] = b"cluster/position/";

/// The first byte of a stream position's value in this layout.
const STREAM_POSITION_VERSION: u8 = 1;

/// A stream position's value: `1 | applied (u64 BE) | delivered (u64 BE) | stream length
/// (u16 BE) | stream (UTF-8) | consumer (UTF-8)`. A value without the leading 1 (written
/// before positions named their stream) decodes with no stream, which no stream matches.
pub(super) fn encode_stream_position(position: &StreamPosition) -> Vec<u8> {
    let stream = position.stream.as_bytes();
    // A stream identity is a stream name (at most 255 bytes in NATS) and a timestamp.
    let stream = &stream[..stream.len().min(usize::from(u16::MAX))];
    let mut out = Vec::with_capacity(19 + stream.len() + position.consumer.len());
    out.push(STREAM_POSITION_VERSION);
    out.extend_from_slice(&position.applied.to_be_bytes());
    out.extend_from_slice(&position.delivered.to_be_bytes());
    out.extend_from_slice(&(stream.len() as u16).to_be_bytes());
    out.extend_from_slice(stream);
    out.extend_from_slice(position.consumer.as_bytes());
    out
}

/// The stream position stored under `key`.
pub(super) fn decode_stream_position(
    key: &[u8],
    value: &[u8],
) -> Result<StreamPosition, StoreError> {
    let bad = |reason: String| StoreError::BadValue {
        column: CF_META,
        key: key.to_vec(),
        reason,
    };
    let text = |bytes: &[u8], what: &str| {
        String::from_utf8(bytes.to_vec())
            .map_err(|_| bad(format!("a stream position's {what} is not UTF-8")))
    };
    let u64_at = |bytes: &[u8]| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[..8]);
        u64::from_be_bytes(word)
    };
    if value.first() == Some(&STREAM_POSITION_VERSION) {
        let rest = &value[1..];
        if rest.len() < 18 {
            return Err(bad(format!(
                "a stream position must be at least 19 bytes, found {}",
                value.len()
            )));
        }
        let stream_len = usize::from(u16::from_be_bytes([rest[16], rest[17]]));
        let names = &rest[18..];
        if names.len() < stream_len {
            return Err(bad(format!(
                "a stream position names a stream of {stream_len} bytes in {} bytes",
                names.len()
            )));
        }
        let (stream, consumer) = names.split_at(stream_len);
        return Ok(StreamPosition {
            stream: text(stream, "stream")?,
            consumer: text(consumer, "consumer")?,
            delivered: u64_at(&rest[8..16]),
            applied: u64_at(&rest[..8]),
        });
    }
    // The layout before positions named their stream: `applied | delivered | consumer`.
    if value.len() < 16 {
        return Err(bad(format!(
            "a stream position must be at least 16 bytes, found {}",
            value.len()
        )));
    }
    Ok(StreamPosition {
        stream: String::new(),
        consumer: text(&value[16..], "consumer")?,
        delivered: u64_at(&value[8..16]),
        applied: u64_at(&value[..8]),
    })
}

/// `series | time`, the first 8 bytes of both hourly (time = hour) and rollup (time = day)
/// keys; see [`crate::keys::hour_prefix`] and [`crate::keys::day_prefix`].
pub(super) fn series_time_prefix(series: u32, time: u32) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&series.to_be_bytes());
    out[4..].copy_from_slice(&time.to_be_bytes());
    out
}

/// The smallest key greater than every key starting with `prefix`: the prefix with its
/// last byte that is not 0xff raised by one and what follows it dropped. A prefix may end
/// in 0xff: a server id or a day ends in any byte (server 255, day 20735), and raising
/// that byte alone wrapped it to 0, a bound below the prefix. Every prefix here starts
/// with an ASCII name or a series id below 0xffffffff, so one byte can always be raised;
/// a prefix of 0xff bytes alone is extended by one more, which no key of the store reaches.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while end.last() == Some(&0xff) {
        end.pop();
    }
    match end.last_mut() {
        Some(last) => *last += 1,
        None => {
            end = prefix.to_vec();
            end.push(0xff);
        }
    }
    end
}

pub(super) fn meta_id(key: &[u8], bytes: &[u8]) -> Result<u32, StoreError> {
    let bytes: [u8; 4] = bytes.try_into().map_err(|_| StoreError::BadValue {
        column: CF_META,
        key: key.to_vec(),
        reason: format!("an id must be 4 bytes, found {}", bytes.len()),
    })?;
    Ok(u32::from_be_bytes(bytes))
}

pub(super) fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

pub(super) fn put_pairs(out: &mut Vec<u8>, pairs: &[(String, String)]) {
    out.extend_from_slice(&(pairs.len() as u32).to_be_bytes());
    for (k, v) in pairs {
        put_str(out, k);
        put_str(out, v);
    }
}

pub(super) fn encode_series_name(series: &SeriesName) -> Vec<u8> {
    let series = series.canonical();
    let mut out = vec![series.kind.code()];
    put_str(&mut out, &series.metric);
    put_pairs(&mut out, &series.tags);
    out
}

pub(super) fn encode_server(name: &str, sorted_labels: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, name);
    put_pairs(&mut out, sorted_labels);
    out
}

/// A cursor over a `meta` value that checks every length before it reads.
pub(super) struct MetaReader<'a> {
    bytes: &'a [u8],
}

impl<'a> MetaReader<'a> {
    pub(super) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.bytes.len() < n {
            return Err(format!(
                "{what} needs {n} bytes, {} remain",
                self.bytes.len()
            ));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    pub(super) fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(super) fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.u32(what)? as usize;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    pub(super) fn pairs(&mut self, what: &str) -> Result<Vec<(String, String)>, String> {
        let count = self.u32(what)? as usize;
        // Each pair needs at least its two length fields: a corrupt count cannot make us
        // allocate more than the value could hold.
        if count > self.bytes.len() / 8 {
            return Err(format!("{what} count {count} exceeds the value's length"));
        }
        (0..count)
            .map(|_| Ok((self.string(what)?, self.string(what)?)))
            .collect()
    }

    pub(super) fn finish(&self) -> Result<(), String> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected trailing bytes", self.bytes.len()))
        }
    }
}

pub(super) fn decode_series_name(bytes: &[u8]) -> Result<SeriesName, String> {
    let mut r = MetaReader { bytes };
    let code = r.take(1, "kind")?[0];
    let kind = Kind::from_code(code).ok_or_else(|| format!("unknown sketch kind code {code}"))?;
    let metric = r.string("metric")?;
    let tags = r.pairs("tags")?;
    r.finish()?;
    Ok(SeriesName { metric, tags, kind })
}

pub(super) fn decode_server(bytes: &[u8]) -> Result<(String, Vec<(String, String)>), String> {
    let mut r = MetaReader { bytes };
    let name = r.string("server name")?;
    let labels = r.pairs("labels")?;
    r.finish()?;
    Ok((name, labels))
}
