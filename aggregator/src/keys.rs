//! Storage keys: every key the aggregator writes is encoded here and nowhere else.
//!
//! Fields are fixed-width and big-endian, so comparing two encoded keys byte by byte (what
//! RocksDB's default comparator does) gives the same order as comparing their fields as a
//! tuple. That is what makes one series' hours, across all servers and epochs, a single
//! contiguous range scan (DESIGN §4).
//!
//! ```text
//! hourly  HourKey  series(4) | hour(4) | server(4) | epoch(8)   20 bytes
//! rollup  DayKey   series(4) | day(4)  | server(4)              12 bytes
//! ```
//!
//! A *series* in storage is (metric, sorted tags, sketch kind), so each kind of a metric
//! has its own [`SeriesId`] and no key needs a kind field. The first [`PREFIX_LEN`] bytes
//! of an hourly key, `series | hour`, are what RocksDB's prefix extractor and prefix Bloom
//! filters see.
//!
//! ```
//! use hourglass_aggregator::keys::{Epoch, Hour, HourKey, SeriesId, ServerId};
//!
//! let key = HourKey { series: SeriesId(7), hour: Hour(474_000), server: ServerId(2), epoch: Epoch(1) };
//! let bytes = key.encode();
//! assert_eq!(bytes.len(), HourKey::LEN);
//! assert_eq!(HourKey::decode(&bytes).unwrap(), key);
//! ```

use std::fmt;
use std::ops::Range;
use thiserror::Error;

/// Bytes of an hourly key that form its prefix for RocksDB's prefix extractor:
/// `series | hour`. One prefix holds one series' hour across all servers and epochs.
pub const PREFIX_LEN: usize = 8;

/// A key had the wrong number of bytes for its kind.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{what} must be {expected} bytes, found {found}")]
pub struct KeyLengthError {
    /// Which key was being decoded (`hourly key`, `rollup key`).
    pub(crate) what: &'static str,
    /// The fixed length of that key.
    pub(crate) expected: usize,
    /// The length given.
    pub(crate) found: usize,
}

/// The id of a series (metric, sorted tags, sketch kind), assigned by the series
/// dictionary of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesId(pub u32);

/// Whole hours since the Unix epoch, UTC: the hour an event happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hour(pub u32);

/// Whole days since the Unix epoch, UTC: the unit of rollups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Day(pub u32);

/// The id of a server (an agent's name), assigned by the server registry of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServerId(pub u32);

/// One lifetime of an agent's state (DESIGN §3): a new epoch starts when an agent lost
/// its checkpoint, so its versions start again from the bottom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(pub u64);

const HOURS_PER_DAY: u32 = 24;

impl Hour {
    /// The UTC day this hour belongs to.
    pub fn day(self) -> Day {
        Day(self.0 / HOURS_PER_DAY)
    }

    /// The hour after this one, saturating at `u32::MAX`.
    pub fn next(self) -> Hour {
        Hour(self.0.saturating_add(1))
    }
}

impl Day {
    /// The first hour of this day. Days whose first hour is past `u32::MAX` hours cannot
    /// come from an [`Hour`]; for them this saturates to `Hour(u32::MAX)`.
    pub fn first_hour(self) -> Hour {
        Hour(self.0.saturating_mul(HOURS_PER_DAY))
    }

    /// The 24 hours of this day, as a half-open range.
    pub fn hours(self) -> Range<Hour> {
        self.first_hour()..Day(self.0.saturating_add(1)).first_hour()
    }

    /// The day after this one, saturating at `u32::MAX`.
    pub fn next(self) -> Day {
        Day(self.0.saturating_add(1))
    }
}

impl ServerId {
    /// The server id of a rollup over all servers. The server registry never assigns it,
    /// and it sorts after every real server of the same (series, day).
    pub const ALL: ServerId = ServerId(u32::MAX);
}

impl fmt::Display for SeriesId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "series {}", self.0)
    }
}

impl fmt::Display for Hour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hour {}", self.0)
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "day {}", self.0)
    }
}

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == ServerId::ALL {
            f.write_str("all servers")
        } else {
            write!(f, "server {}", self.0)
        }
    }
}

/// The key of one stored snapshot: a series' hour as one server's epoch saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HourKey {
    /// The series.
    pub series: SeriesId,
    /// The hour the events happened in.
    pub hour: Hour,
    /// The server that counted them.
    pub server: ServerId,
    /// The lifetime of that server's agent state.
    pub epoch: Epoch,
}

impl HourKey {
    /// Encoded length: `series(4) | hour(4) | server(4) | epoch(8)`.
    pub const LEN: usize = 20;

    /// The key's bytes, in an order equal to the tuple order of its fields.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..4].copy_from_slice(&self.series.0.to_be_bytes());
        out[4..8].copy_from_slice(&self.hour.0.to_be_bytes());
        out[8..12].copy_from_slice(&self.server.0.to_be_bytes());
        out[12..20].copy_from_slice(&self.epoch.0.to_be_bytes());
        out
    }

    /// Reads a key written by [`HourKey::encode`].
    pub fn decode(bytes: &[u8]) -> Result<HourKey, KeyLengthError> {
        let bytes: &[u8; Self::LEN] = bytes.try_into().map_err(|_| KeyLengthError {
            what: "hourly key",
            expected: Self::LEN,
            found: bytes.len(),
        })?;
        Ok(HourKey {
            series: SeriesId(be_u32(bytes, 0)),
            hour: Hour(be_u32(bytes, 4)),
            server: ServerId(be_u32(bytes, 8)),
            epoch: Epoch(be_u64(bytes, 12)),
        })
    }

    /// The `series | hour` prefix of this key (see [`PREFIX_LEN`]).
    pub fn prefix(&self) -> [u8; PREFIX_LEN] {
        hour_prefix(self.series, self.hour)
    }

    /// The smallest key of `(series, hour)`: server 0, epoch 0.
    pub(crate) fn first_of(series: SeriesId, hour: Hour) -> HourKey {
        HourKey {
            series,
            hour,
            server: ServerId(0),
            epoch: Epoch(0),
        }
    }

    /// The largest key of `(series, hour)`: every server and epoch sorts at or before it.
    #[cfg(test)]
    pub(crate) fn last_of(series: SeriesId, hour: Hour) -> HourKey {
        HourKey {
            series,
            hour,
            server: ServerId(u32::MAX),
            epoch: Epoch(u64::MAX),
        }
    }
}

/// Half-open byte bounds `[start, end)` of the hourly keys of `series` in `hours`, across
/// all servers and epochs: exactly the keys `k` with `k.series == series` and
/// `hours.start <= k.hour < hours.end`. Both bounds are 8-byte prefixes, which compare
/// before every 20-byte key they prefix, so the range needs no "last key" arithmetic.
pub(crate) fn hour_range_bounds(series: SeriesId, hours: Range<Hour>) -> ([u8; 8], [u8; 8]) {
    (
        hour_prefix(series, hours.start),
        hour_prefix(series, hours.end),
    )
}

/// Half-open byte bounds `[start, end)` of the rollup keys of `series` in `days`, across
/// all servers including [`ServerId::ALL`].
pub(crate) fn day_range_bounds(series: SeriesId, days: Range<Day>) -> ([u8; 8], [u8; 8]) {
    (day_prefix(series, days.start), day_prefix(series, days.end))
}

/// `series | hour`: the prefix RocksDB's prefix extractor takes from an hourly key.
pub(crate) fn hour_prefix(series: SeriesId, hour: Hour) -> [u8; PREFIX_LEN] {
    let mut out = [0u8; PREFIX_LEN];
    out[0..4].copy_from_slice(&series.0.to_be_bytes());
    out[4..8].copy_from_slice(&hour.0.to_be_bytes());
    out
}

/// `series | day`: the first 8 bytes of a rollup key.
pub(crate) fn day_prefix(series: SeriesId, day: Day) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[0..4].copy_from_slice(&series.0.to_be_bytes());
    out[4..8].copy_from_slice(&day.0.to_be_bytes());
    out
}

/// The key of a daily rollup: a series' day for one server, or for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DayKey {
    /// The series.
    pub(crate) series: SeriesId,
    /// The UTC day.
    pub(crate) day: Day,
    /// The server, or [`ServerId::ALL`] for the rollup over every server.
    pub(crate) server: ServerId,
}

impl DayKey {
    /// Encoded length: `series(4) | day(4) | server(4)`.
    pub(crate) const LEN: usize = 12;

    /// The key's bytes, in an order equal to the tuple order of its fields.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..4].copy_from_slice(&self.series.0.to_be_bytes());
        out[4..8].copy_from_slice(&self.day.0.to_be_bytes());
        out[8..12].copy_from_slice(&self.server.0.to_be_bytes());
        out
    }

    /// Reads a key written by [`DayKey::encode`].
    pub fn decode(bytes: &[u8]) -> Result<DayKey, KeyLengthError> {
        let bytes: &[u8; Self::LEN] = bytes.try_into().map_err(|_| KeyLengthError {
            what: "rollup key",
            expected: Self::LEN,
            found: bytes.len(),
        })?;
        Ok(DayKey {
            series: SeriesId(be_u32(bytes, 0)),
            day: Day(be_u32(bytes, 4)),
            server: ServerId(be_u32(bytes, 8)),
        })
    }
}

fn be_u32<const N: usize>(bytes: &[u8; N], at: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(field)
}

fn be_u64<const N: usize>(bytes: &[u8; N], at: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(field)
}

/// Keys of the `meta` column family (docs/STORAGE.md lists them with their values).
/// Ids and times are big-endian, so each family's keys sort by their fields.
pub(crate) mod meta {
    use super::{Day, Hour, SeriesId, ServerId};

    /// `schema_version` → u32: the layout version of the whole store.
    pub(crate) const SCHEMA_VERSION: &[u8] = b"schema_version";
    /// `series/name/<encoded name>` → series id.
    pub(crate) const SERIES_BY_NAME: &[u8] = b"series/name/";
    /// `series/id/<id>` → encoded name.
    pub(crate) const SERIES_BY_ID: &[u8] = b"series/id/";
    /// `server/name/<name>` → server id.
    pub(crate) const SERVER_BY_NAME: &[u8] = b"server/name/";
    /// `server/id/<id>` → encoded name and labels.
    pub(crate) const SERVER_BY_ID: &[u8] = b"server/id/";
    /// `dirty/<day><series>` → the mark of the day's latest stored snapshot.
    pub(crate) const DIRTY: &[u8] = b"dirty/";
    /// `built/<day><series>` → the mark the day's rollups were built from.
    pub(crate) const BUILT: &[u8] = b"built/";
    /// `live/<server><hour>` → empty: the server declared itself up that hour.
    pub(crate) const LIVE: &[u8] = b"live/";
    /// `liveday/<server><day>` → a 4-byte bit mask of the day's live hours, for days past
    /// hourly retention: liveness lives as long as the rollups it describes.
    pub(crate) const LIVE_DAY: &[u8] = b"liveday/";
    /// `conflict/<day><series>` → why that day's rollups could not be built (UTF-8).
    pub(crate) const CONFLICT: &[u8] = b"conflict/";
    /// `expired/<day><series>` → empty: retention deleted the day's hourly rows.
    pub(crate) const EXPIRED: &[u8] = b"expired/";
    /// `sseries/<server><day><series>` → empty, for every stored snapshot: which series a
    /// server holds.
    pub(crate) const SERVER_SERIES: &[u8] = b"sseries/";

    /// `prefix | id`: the dictionary keys by id (`series/id/`, `server/id/`).
    pub(crate) fn by_id(prefix: &[u8], id: u32) -> Vec<u8> {
        [prefix, &id.to_be_bytes()].concat()
    }

    /// `prefix | name`: the dictionary keys by name (`series/name/`, `server/name/`).
    pub(crate) fn by_name(prefix: &[u8], name: &[u8]) -> Vec<u8> {
        [prefix, name].concat()
    }

    /// `prefix | day | series`: dirty, built, conflict and expired keys. Day first, so
    /// "every such day before D" is one range.
    pub(crate) fn day_series(prefix: &[u8], series: SeriesId, day: Day) -> Vec<u8> {
        [prefix, &day.0.to_be_bytes(), &series.0.to_be_bytes()].concat()
    }

    /// `prefix | day`: where a [`day_series`] family's keys of `day` begin.
    pub(crate) fn day_start(prefix: &[u8], day: Day) -> Vec<u8> {
        [prefix, &day.0.to_be_bytes()].concat()
    }

    /// The (series, day) of a [`day_series`] key of `prefix`; none if it is not one.
    pub(crate) fn day_series_fields(prefix: &[u8], key: &[u8]) -> Option<(SeriesId, Day)> {
        let fields: [u8; 8] = key.strip_prefix(prefix)?.try_into().ok()?;
        let day = Day(u32::from_be_bytes([
            fields[0], fields[1], fields[2], fields[3],
        ]));
        let series = SeriesId(u32::from_be_bytes([
            fields[4], fields[5], fields[6], fields[7],
        ]));
        Some((series, day))
    }

    /// `prefix | server`: where one server's keys of a per-server family begin
    /// (`live/`, `liveday/`, `sseries/`).
    pub(crate) fn server_start(prefix: &[u8], server: ServerId) -> Vec<u8> {
        [prefix, &server.0.to_be_bytes()].concat()
    }

    /// `live/<server><hour>`.
    pub fn live(server: ServerId, hour: Hour) -> Vec<u8> {
        [LIVE, &server.0.to_be_bytes(), &hour.0.to_be_bytes()].concat()
    }

    /// `liveday/<server><day>`.
    pub(crate) fn live_day(server: ServerId, day: Day) -> Vec<u8> {
        [LIVE_DAY, &server.0.to_be_bytes(), &day.0.to_be_bytes()].concat()
    }

    /// `sseries/<server><day>`: where a server's series index of `day` begins.
    pub(crate) fn server_series_from(server: ServerId, day: Day) -> Vec<u8> {
        [SERVER_SERIES, &server.0.to_be_bytes(), &day.0.to_be_bytes()].concat()
    }

    /// `sseries/<server><day><series>`.
    pub(crate) fn server_series(server: ServerId, day: Day, series: SeriesId) -> Vec<u8> {
        [
            SERVER_SERIES,
            &server.0.to_be_bytes(),
            &day.0.to_be_bytes(),
            &series.0.to_be_bytes(),
        ]
        .concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hour_key() -> impl Strategy<Value = HourKey> {
        // Small ranges as well as full ones, so that pairs often share leading fields and
        // the later fields decide the order.
        let small = 0u32..4;
        (
            prop_oneof![small.clone(), any::<u32>()],
            prop_oneof![small.clone(), any::<u32>()],
            prop_oneof![small, any::<u32>()],
            prop_oneof![0u64..4, any::<u64>()],
        )
            .prop_map(|(s, h, v, e)| HourKey {
                series: SeriesId(s),
                hour: Hour(h),
                server: ServerId(v),
                epoch: Epoch(e),
            })
    }

    fn day_key() -> impl Strategy<Value = DayKey> {
        let field = prop_oneof![0u32..4, any::<u32>(), Just(u32::MAX)];
        (field.clone(), field.clone(), field).prop_map(|(s, d, v)| DayKey {
            series: SeriesId(s),
            day: Day(d),
            server: ServerId(v),
        })
    }

    proptest! {
        #[test]
        fn hour_key_byte_order_is_tuple_order(a in hour_key(), b in hour_key()) {
            let logical = (a.series, a.hour, a.server, a.epoch).cmp(&(b.series, b.hour, b.server, b.epoch));
            prop_assert_eq!(a.encode().cmp(&b.encode()), logical);
        }

        #[test]
        fn day_key_byte_order_is_tuple_order(a in day_key(), b in day_key()) {
            let logical = (a.series, a.day, a.server).cmp(&(b.series, b.day, b.server));
            prop_assert_eq!(a.encode().cmp(&b.encode()), logical);
        }

        #[test]
        fn hour_key_round_trips(k in hour_key()) {
            prop_assert_eq!(HourKey::decode(&k.encode()).unwrap(), k);
        }

        #[test]
        fn day_key_round_trips(k in day_key()) {
            prop_assert_eq!(DayKey::decode(&k.encode()).unwrap(), k);
        }

        #[test]
        fn hour_bounds_contain_exactly_the_keys_in_range(
            k in hour_key(),
            series in prop_oneof![0u32..4, any::<u32>()],
            start in prop_oneof![0u32..4, any::<u32>()],
            len in 0u32..4,
        ) {
            let hours = Hour(start)..Hour(start.saturating_add(len));
            let (lo, hi) = hour_range_bounds(SeriesId(series), hours.clone());
            let bytes = k.encode();
            let inside = bytes.as_slice() >= lo.as_slice() && bytes.as_slice() < hi.as_slice();
            let wanted = k.series == SeriesId(series) && hours.contains(&k.hour);
            prop_assert_eq!(inside, wanted);
        }

        #[test]
        fn day_bounds_contain_exactly_the_keys_in_range(
            k in day_key(),
            series in prop_oneof![0u32..4, any::<u32>()],
            start in prop_oneof![0u32..4, any::<u32>()],
            len in 0u32..4,
        ) {
            let days = Day(start)..Day(start.saturating_add(len));
            let (lo, hi) = day_range_bounds(SeriesId(series), days.clone());
            let bytes = k.encode();
            let inside = bytes.as_slice() >= lo.as_slice() && bytes.as_slice() < hi.as_slice();
            prop_assert_eq!(inside, k.series == SeriesId(series) && days.contains(&k.day));
        }

        #[test]
        fn first_and_last_of_bracket_every_key_of_their_hour(k in hour_key()) {
            let first = HourKey::first_of(k.series, k.hour).encode();
            let last = HourKey::last_of(k.series, k.hour).encode();
            prop_assert!(first <= k.encode() && k.encode() <= last);
            prop_assert_eq!(&k.encode()[..PREFIX_LEN], &k.prefix()[..]);
        }
    }

    #[test]
    fn fields_are_big_endian_in_place() {
        let key = HourKey {
            series: SeriesId(0x0102_0304),
            hour: Hour(0x0506_0708),
            server: ServerId(0x090a_0b0c),
            epoch: Epoch(0x0d0e_0f10_1112_1314),
        };
        assert_eq!(
            key.encode(),
            [
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20
            ]
        );
        let day = DayKey {
            series: SeriesId(1),
            day: Day(2),
            server: ServerId::ALL,
        };
        assert_eq!(
            day.encode(),
            [0, 0, 0, 1, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xff]
        );
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let err = HourKey::decode(&[0u8; 19]).unwrap_err();
        assert_eq!(err.to_string(), "hourly key must be 20 bytes, found 19");
        assert!(HourKey::decode(&[0u8; 21]).is_err());
        let err = DayKey::decode(&[]).unwrap_err();
        assert_eq!(err.to_string(), "rollup key must be 12 bytes, found 0");
    }

    #[test]
    fn hours_and_days() {
        // 2023-11-14T22:00Z
        let hour = Hour(472_222);
        assert_eq!(hour.day(), Day(19_675));
        assert_eq!(hour.day().first_hour(), Hour(472_200));
        assert_eq!(hour.day().hours(), Hour(472_200)..Hour(472_224));
        assert!(hour.day().hours().contains(&hour));
        assert_eq!(Hour(23).day(), Day(0));
        assert_eq!(Hour(24).day(), Day(1));
        assert_eq!(Day(u32::MAX).first_hour(), Hour(u32::MAX));
    }
}
