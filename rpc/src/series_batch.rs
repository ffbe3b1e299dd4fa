//! `SeriesBatch`, written by hand rather than generated, so that its `items` cost what
//! `packed_items` costs.
//!
//! Generated, `repeated bytes items` decodes into one `Bytes` per item: a reference count
//! taken and dropped, and a 32-byte handle pushed, for every event (a fifth of an agent's
//! CPU on large batches, docs/BENCHMARKS.md). Here the items are copied as they are read
//! into one buffer with their ends beside it ([`Items`]): a few bytes copied per item and
//! no per-item allocation or reference count, so a client that fills the natural field
//! gets close to the packed form's speed (docs/BENCHMARKS.md, "hourglass beside Redis"). The wire format is the `.proto`'s, unchanged
//! (proto/hourglass/v1/ingest.proto); `build.rs` points the generated code here
//! (`extern_path`).

use std::fmt;

use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// One tag of a series, `key=value` (`hourglass.v1.Tag`, as prost derives it: here
/// rather than generated so that this module needs nothing of the generated code, which
/// names it and [`SeriesBatch`] through `extern_path`).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Tag {
    /// Tag key: letters, digits, `_`, `-`, `.`; at most 64 bytes.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Tag value: any UTF-8 without `,` or `|`; at most 256 bytes.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// Many items of one series: the compact form for high rates (`hourglass.v1.SeriesBatch`).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct SeriesBatch {
    /// Metric name, as in `Event.metric`.
    pub metric: String,
    /// Tags of the series, as in `Event.tags`.
    pub tags: Vec<Tag>,
    /// The items, one event each.
    pub items: Items,
    /// Event times in seconds since the epoch: empty (every item "now"), one value (every
    /// item at that time), or one per item. 0 means "now", as in `Event`.
    pub times_unix_seconds: Vec<i64>,
    /// Weights for the frequency kind: empty (every item 1), one value (every item), or
    /// one per item. 0 means 1, as in `Event`.
    pub weights: Vec<u64>,
    /// The items in one field instead of `items`: each a varint length, then that many
    /// bytes ([`crate::packed`]). A batch uses `items` or `packed_items`, not both.
    pub packed_items: Bytes,
}

/// The most bytes reserved for a batch's items when its first is read.
const FIRST_RESERVE: usize = 64 * 1024;

/// The items of a [`SeriesBatch`]: byte strings kept in one buffer, each ending where
/// `ends` says.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Items {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Items {
    /// No items.
    pub fn new() -> Items {
        Items::default()
    }

    /// The number of items.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Appends `item`.
    pub fn push(&mut self, item: &[u8]) {
        self.bytes.extend_from_slice(item);
        self.ends.push(self.bytes.len());
    }

    /// Item `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        Some(&self.bytes[self.start(i)..end])
    }

    /// The items, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.ends.len()).map(|i| &self.bytes[self.start(i)..self.ends[i]])
    }

    /// Where item `i` (one there is) starts.
    fn start(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.ends[i - 1] }
    }

    /// Removes every item.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Reads one item of `len` bytes (`buf` holds them) from `buf`, copied in after the
    /// others.
    fn read(&mut self, len: usize, buf: &mut impl Buf) {
        if self.ends.is_empty() {
            // The first item: room for what is likely to follow, without a growth of the
            // buffers per doubling (bounded: the rest of the message may be other batches).
            self.bytes.reserve(buf.remaining().min(FIRST_RESERVE));
            self.ends
                .reserve((buf.remaining() / 8).min(FIRST_RESERVE / 8));
        }
        let chunk = buf.chunk();
        if chunk.len() >= len {
            // The whole message is one chunk as the codec hands it over: one copy.
            self.bytes.extend_from_slice(&chunk[..len]);
            buf.advance(len);
        } else {
            let start = self.bytes.len();
            self.bytes.resize(start + len, 0);
            buf.copy_to_slice(&mut self.bytes[start..]);
        }
        self.ends.push(self.bytes.len());
    }
}

impl fmt::Debug for Items {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(Bytes::copy_from_slice))
            .finish()
    }
}

impl<T: AsRef<[u8]>> FromIterator<T> for Items {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Items {
        let mut all = Items::new();
        all.extend(items);
        all
    }
}

impl<T: AsRef<[u8]>> Extend<T> for Items {
    fn extend<I: IntoIterator<Item = T>>(&mut self, items: I) {
        for item in items {
            self.push(item.as_ref());
        }
    }
}

/// The field numbers of `hourglass.v1.SeriesBatch`.
mod field {
    pub(super) const METRIC: u32 = 1;
    pub(super) const TAGS: u32 = 2;
    pub(super) const ITEMS: u32 = 3;
    pub(super) const TIMES: u32 = 4;
    pub(super) const WEIGHTS: u32 = 5;
    pub(super) const PACKED_ITEMS: u32 = 6;
}

impl Message for SeriesBatch {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.metric.is_empty() {
            encoding::string::encode(field::METRIC, &self.metric, buf);
        }
        encoding::message::encode_repeated(field::TAGS, &self.tags, buf);
        for item in self.items.iter() {
            encoding::encode_key(field::ITEMS, WireType::LengthDelimited, buf);
            encoding::encode_varint(item.len() as u64, buf);
            buf.put_slice(item);
        }
        encoding::int64::encode_packed(field::TIMES, &self.times_unix_seconds, buf);
        encoding::uint64::encode_packed(field::WEIGHTS, &self.weights, buf);
        if !self.packed_items.is_empty() {
            encoding::bytes::encode(field::PACKED_ITEMS, &self.packed_items, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let named = |name: &'static str| {
            move |mut e: DecodeError| {
                e.push("SeriesBatch", name);
                e
            }
        };
        match tag {
            field::METRIC => encoding::string::merge(wire_type, &mut self.metric, buf, ctx)
                .map_err(named("metric")),
            field::TAGS => encoding::message::merge_repeated(wire_type, &mut self.tags, buf, ctx)
                .map_err(named("tags")),
            field::ITEMS => merge_item(wire_type, &mut self.items, buf).map_err(named("items")),
            field::TIMES => {
                encoding::int64::merge_repeated(wire_type, &mut self.times_unix_seconds, buf, ctx)
                    .map_err(named("times_unix_seconds"))
            }
            field::WEIGHTS => {
                encoding::uint64::merge_repeated(wire_type, &mut self.weights, buf, ctx)
                    .map_err(named("weights"))
            }
            field::PACKED_ITEMS => {
                encoding::bytes::merge(wire_type, &mut self.packed_items, buf, ctx)
                    .map_err(named("packed_items"))
            }
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let metric = if self.metric.is_empty() {
            0
        } else {
            encoding::string::encoded_len(field::METRIC, &self.metric)
        };
        let key = encoding::key_len(field::ITEMS);
        let items: usize = self
            .items
            .iter()
            .map(|item| key + encoding::encoded_len_varint(item.len() as u64) + item.len())
            .sum();
        let packed = if self.packed_items.is_empty() {
            0
        } else {
            encoding::bytes::encoded_len(field::PACKED_ITEMS, &self.packed_items)
        };
        metric
            + encoding::message::encoded_len_repeated(field::TAGS, &self.tags)
            + items
            + encoding::int64::encoded_len_packed(field::TIMES, &self.times_unix_seconds)
            + encoding::uint64::encoded_len_packed(field::WEIGHTS, &self.weights)
            + packed
    }

    fn clear(&mut self) {
        *self = SeriesBatch::default();
    }
}

/// Reads one `items` value (length-delimited) from `buf` into `items`.
fn merge_item(
    wire_type: WireType,
    items: &mut Items,
    buf: &mut impl Buf,
) -> Result<(), DecodeError> {
    encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
    let len = encoding::decode_varint(buf)?;
    if len > buf.remaining() as u64 {
        // The words prost's own decoders use for a value cut short. (`DecodeError::new` is
        // the one way to make a `DecodeError` by hand, deprecated in prost 0.14 for the
        // next breaking release: the manifest pins 0.14.)
        #[allow(deprecated)]
        return Err(DecodeError::new("buffer underflow"));
    }
    items.read(len as usize, buf);
    Ok(())
}

#[cfg(test)]
mod tests;
