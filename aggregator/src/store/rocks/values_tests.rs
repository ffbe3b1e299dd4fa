//! The compressed hourly values (`values.rs`: `hourly_value` / `hourly_sketch`), the
//! hourly column family without block compression, the WAL without compression, the
//! schema 1 -> 2 upgrade, and what a damaged value does to a rollup pass and a merge.

use super::testing::{get_raw, put_raw};
use super::*;
use crate::keys::{Epoch, Hour, HourKey, ServerId};
use hourglass_sketch::Sketch;

const ZSTD: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// values.rs's bound (private there): the format's largest body plus 64.
const MAX_SKETCH_FRAME: u64 = hourglass_sketch::format::MAX_BODY_LEN as u64 + 64;

fn opts(compression: bool) -> StoreOptions {
    StoreOptions {
        sync_writes: false,
        block_cache_bytes: 8 << 20,
        compression,
        ..StoreOptions::default()
    }
}

fn key(series: u32, hour: u32, server: u32) -> HourKey {
    HourKey {
        series: SeriesId(series),
        hour: Hour(hour),
        server: ServerId(server),
        epoch: Epoch(1),
    }
}

/// A dense UltraLogLog (8 KiB of registers): compresses.
fn dense(seed: u64) -> Vec<u8> {
    let mut ull = hourglass_sketch::ull::Ull::new(13).unwrap();
    for i in 0..5_000u64 {
        ull.insert(&(i ^ (seed << 32)).to_le_bytes());
    }
    Sketch::Distinct(hourglass_sketch::distinct::Distinct::Ull(ull)).encode()
}

/// A tiny HyperLogLog frame.
fn small(n: u64) -> Vec<u8> {
    let mut hll = hourglass_sketch::hll::Hll::new(4).unwrap();
    for i in 0..=n {
        hll.insert(&i.to_le_bytes());
    }
    hll.encode()
}

fn scan(store: &RocksStore, series: u32) -> Vec<(HourKey, StoredSketch)> {
    let mut out = Vec::new();
    store
        .scan_hourly(SeriesId(series), Hour(0)..Hour(u32::MAX), &mut |k, s| {
            out.push((k, s.clone()));
            true
        })
        .unwrap();
    out
}

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

// ---------------------------------------------------------------------------------------
// hourly_value / hourly_sketch
// ---------------------------------------------------------------------------------------

/// Every value reads back as the exact frame and version, compressed or not, whatever
/// the frame (tiny, dense, incompressible), and the version in front is read without
/// unpacking anything.
#[test]
fn values_round_trip_exactly_and_keep_the_version_in_front() {
    let mut seed = 0x1234_5678_9ABC_DEF0u64;
    let noise: Vec<u8> = (0..20_000).map(|_| xorshift(&mut seed) as u8).collect();
    let mut hgsk_noise = b"HGSK".to_vec();
    hgsk_noise.extend_from_slice(&noise);
    let frames = [
        small(0),
        small(100),
        dense(1),
        dense(2),
        noise.clone(),
        hgsk_noise,
        vec![0u8; 1 << 20],
        vec![1u8],
    ];
    for frame in &frames {
        for compress in [false, true] {
            for version in [0u64, 1, 7, u64::MAX, 0x28B5_2FFD_0000_0000] {
                let value = hourly_value(version, frame, compress);
                assert_eq!(value[..8], version.to_be_bytes());
                assert_eq!(stored_version(b"k", &value).unwrap(), version);
                assert_eq!(&hourly_sketch(b"k", &value).unwrap(), frame);
                if !compress {
                    assert_eq!(value[8..], frame[..]);
                }
                if value[8..].starts_with(&ZSTD) {
                    assert!(
                        value.len() - 8 < frame.len(),
                        "compressed only when smaller"
                    );
                } else {
                    assert_eq!(value[8..], frame[..]);
                }
            }
        }
    }
}

/// A raw value (a build before compression, or a frame compression does not shrink)
/// starts with the sketch magic and is returned as it is, byte for byte.
#[test]
fn raw_frames_are_never_taken_for_zstd() {
    for frame in [small(3), dense(4)] {
        assert!(frame.starts_with(b"HGSK"));
        let mut value = 9u64.to_be_bytes().to_vec();
        value.extend_from_slice(&frame);
        assert_eq!(hourly_sketch(b"k", &value).unwrap(), frame);
    }
}

/// Values hourly_value never writes, and damaged ones: an error or (for a harmless
/// appended skippable frame) the same bytes; never a panic, never more than a sketch.
#[test]
fn bombs_and_odd_frames_are_refused() {
    let frame = dense(5);
    let good = hourly_value(3, &frame, true);
    assert!(good[8..].starts_with(&ZSTD));
    let z = &good[8..];
    let with = |tail: &[u8]| {
        let mut v = good.clone();
        v.extend_from_slice(tail);
        v
    };
    // Two frames: the header's size is the first one's; the whole is more.
    let second = with(z);
    assert!(hourly_sketch(b"k", &second).is_err());
    // Trailing garbage.
    assert!(hourly_sketch(b"k", &with(b"garbage")).is_err());
    // A skippable frame after it (magic 0x184D2A50, 4-byte length): same content.
    let mut skippable = vec![0x50, 0x2A, 0x4D, 0x18, 3, 0, 0, 0, 1, 2, 3];
    let v = with(&skippable);
    assert_eq!(hourly_sketch(b"k", &v).unwrap(), frame);
    skippable.truncate(6);
    assert!(hourly_sketch(b"k", &with(&skippable)).is_err());
    // A frame without a content size (streaming).
    let mut streamed = 3u64.to_be_bytes().to_vec();
    {
        use std::io::Write;
        let mut enc = zstd::stream::Encoder::new(&mut streamed, 1).unwrap();
        enc.write_all(&frame).unwrap();
        enc.finish().unwrap();
    }
    assert!(streamed[8..].starts_with(&ZSTD));
    if let Ok(got) = hourly_sketch(b"k", &streamed) {
        assert_eq!(got, frame);
    }
    // Headers claiming more than any sketch, and exactly the bound plus one.
    for size in [MAX_SKETCH_FRAME + 1, u64::MAX - 1, 1 << 40] {
        let mut v = 3u64.to_be_bytes().to_vec();
        v.extend_from_slice(&ZSTD);
        v.push(0xE0); // single segment, 8-byte content size
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&[1, 0, 0]); // a last raw block of 0 bytes
        // (u64::MAX - 1 is zstd's own "error" content size: refused as unreadable.)
        let err = hourly_sketch(b"k", &v).unwrap_err();
        assert!(
            size == u64::MAX - 1 || err.to_string().contains("more than any sketch"),
            "{err}"
        );
    }
    // A valid frame of 1 MiB of zeros that says it is: unpacks (within the bound).
    let zeros = vec![0u8; 1 << 20];
    let v = hourly_value(1, &zeros, true);
    assert!(v.len() < 1000);
    assert_eq!(hourly_sketch(b"k", &v).unwrap(), zeros);
    // Every truncation and every single-byte flip: no panic.
    for cut in 8..good.len() {
        let _ = hourly_sketch(b"k", &good[..cut]);
    }
    for at in 8..good.len() {
        let mut v = good.clone();
        v[at] ^= 0x5A;
        if let Ok(got) = hourly_sketch(b"k", &v) {
            // Whatever unpacks must not pass for the frame unless it is the frame.
            if got != frame {
                assert!(Sketch::decode(&got).is_err(), "byte {at}");
            }
        }
    }
}

/// Codecs are per thread: many threads compressing and reading at once get their own
/// values back.
#[test]
fn codecs_are_per_thread() {
    std::thread::scope(|s| {
        for t in 0..8u64 {
            s.spawn(move || {
                for i in 0..20u64 {
                    let frame = if i % 2 == 0 {
                        dense(t * 100 + i)
                    } else {
                        small(t + i)
                    };
                    let v = hourly_value(t * 1000 + i, &frame, true);
                    assert_eq!(stored_version(b"k", &v).unwrap(), t * 1000 + i);
                    assert_eq!(hourly_sketch(b"k", &v).unwrap(), frame);
                }
            });
        }
    });
}

// ---------------------------------------------------------------------------------------
// The store: versions, options, reopening
// ---------------------------------------------------------------------------------------

/// Stale-version comparisons read the version of a compressed value (on disk, after a
/// flush and reopen, and within one batch), and a store opened without compression
/// still reads the compressed values an earlier open wrote.
#[test]
fn versions_read_through_compression_and_a_reopen_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let k = key(1, 10, 1);
    {
        let store = RocksStore::open(dir.path(), &opts(true)).unwrap();
        let out = store
            .put_hourly(&[
                (k, 5, Bytes::from(dense(1))),
                (k, 4, Bytes::from(dense(2))),
                (k, 6, Bytes::from(dense(3))),
            ])
            .unwrap();
        assert_eq!(
            out,
            vec![
                PutOutcome::Stored,
                PutOutcome::Stale { held: 5 },
                PutOutcome::Stored
            ]
        );
        assert!(get_raw(&store, "hourly", &k.encode()).unwrap()[8..].starts_with(&ZSTD));
        store.flush().unwrap();
    }
    let store = RocksStore::open(dir.path(), &opts(false)).unwrap();
    let got = scan(&store, 1);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].1.version, &got[0].1.sketch), (6, &dense(3)));
    assert_eq!(
        store.put_hourly(&[(k, 6, Bytes::from(dense(4)))]).unwrap(),
        vec![PutOutcome::Stale { held: 6 }]
    );
    assert_eq!(
        store.put_hourly(&[(k, 7, Bytes::from(dense(4)))]).unwrap(),
        vec![PutOutcome::Stored]
    );
    assert_eq!(
        get_raw(&store, "hourly", &k.encode()).unwrap()[8..],
        dense(4)[..]
    );
    store.compact().unwrap();
    assert_eq!(scan(&store, 1)[0].1.sketch, dense(4));
}

/// What a schema-1 build left behind: hourly SST files compressed with ZSTD blocks and a
/// ZSTD-compressed WAL holding writes never flushed. This build opens it, raises it to 2,
/// reads every value (flushed, and replayed from the old WAL), compares versions against
/// them, and still reads them after a full compaction rewrites the old SST files without
/// block compression.
#[test]
fn a_schema_1_store_with_compressed_wal_and_ssts_upgrades_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let flushed = key(1, 10, 1);
    let in_wal = key(1, 11, 1);
    {
        // The version-1 store's options: ZSTD blocks in every column family, ZSTD WAL.
        let cache = rocksdb::Cache::new_lru_cache(8 << 20);
        let mut db_options = Options::default();
        db_options.create_if_missing(true);
        db_options.create_missing_column_families(true);
        db_options.set_wal_compression_type(DBCompressionType::Zstd);
        let descriptors = COLUMN_FAMILIES.iter().map(|name| {
            let mut cf = cf_options(name, &opts(true), &cache);
            cf.set_compression_type(DBCompressionType::Zstd);
            cf.set_bottommost_compression_type(DBCompressionType::Zstd);
            ColumnFamilyDescriptor::new(*name, cf)
        });
        let db = DB::open_cf_descriptors(&db_options, dir.path(), descriptors).unwrap();
        let put = |k: HourKey, version: u64, frame: &[u8]| {
            let mut v = version.to_be_bytes().to_vec();
            v.extend_from_slice(frame);
            db.put_cf(db.cf_handle(CF_HOURLY).unwrap(), k.encode(), v)
                .unwrap();
        };
        db.put_cf(
            db.cf_handle(CF_META).unwrap(),
            meta::SCHEMA_VERSION,
            1u32.to_be_bytes(),
        )
        .unwrap();
        put(flushed, 3, &dense(1));
        db.flush_cf(db.cf_handle(CF_HOURLY).unwrap()).unwrap();
        db.flush_cf(db.cf_handle(CF_META).unwrap()).unwrap();
        put(in_wal, 4, &dense(2));
        db.flush_wal(true).unwrap();
        // Dropped without a flush: the last write is only in the (compressed) WAL.
    }
    let store = RocksStore::open(dir.path(), &opts(true)).unwrap();
    assert_eq!(
        get_raw(&store, "meta", meta::SCHEMA_VERSION).unwrap(),
        2u32.to_be_bytes()
    );
    let got = scan(&store, 1);
    assert_eq!(got.len(), 2, "both version-1 values are read");
    assert_eq!(
        (got[0].0, got[0].1.version, &got[0].1.sketch),
        (flushed, 3, &dense(1))
    );
    assert_eq!(
        (got[1].0, got[1].1.version, &got[1].1.sketch),
        (in_wal, 4, &dense(2))
    );
    assert_eq!(
        store
            .put_hourly(&[
                (flushed, 3, Bytes::from(dense(9))),
                (in_wal, 5, Bytes::from(dense(3)))
            ])
            .unwrap(),
        vec![PutOutcome::Stale { held: 3 }, PutOutcome::Stored]
    );
    store.compact().unwrap();
    drop(store);
    let store = RocksStore::open(dir.path(), &opts(true)).unwrap();
    let got = scan(&store, 1);
    assert_eq!((got[0].1.version, &got[0].1.sketch), (3, &dense(1)));
    assert_eq!((got[1].1.version, &got[1].1.sketch), (5, &dense(3)));
}

/// Versions other than 1 and 2 are still refused, and the message says what it found;
/// a version-2 store is left as it is.
#[test]
fn other_schema_versions_are_refused() {
    for found in [0u32, 3, u32::MAX] {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RocksStore::open(dir.path(), &opts(true)).unwrap();
            put_raw(&store, "meta", meta::SCHEMA_VERSION, &found.to_be_bytes());
        }
        let err = RocksStore::open(dir.path(), &opts(true)).unwrap_err();
        assert!(
            matches!(err, StoreError::SchemaVersion { found: f, supported: 2, .. } if f == found),
            "{err:?}"
        );
        // Refusing did not rewrite it.
        let store = DB::open_cf(&Options::default(), dir.path(), COLUMN_FAMILIES).unwrap();
        assert_eq!(
            store
                .get_cf(store.cf_handle(CF_META).unwrap(), meta::SCHEMA_VERSION)
                .unwrap()
                .unwrap(),
            found.to_be_bytes()
        );
    }
}

// ---------------------------------------------------------------------------------------
// Readers of hourly values: a damaged compressed value
// ---------------------------------------------------------------------------------------

/// A store holding a day (100) one of whose rows does not read, and a good day (101).
/// `compressed`: the damaged row is a compressed value cut short (this change); else a
/// raw frame cut short (what the same damage looked like before).
fn store_with_a_damaged_day(dir: &tempfile::TempDir, compressed: bool) -> (RocksStore, SeriesId) {
    let store = RocksStore::open(dir.path(), &opts(compressed)).unwrap();
    let name = SeriesName::new("visitors", vec![], Kind::Distinct);
    let series = store.series_id_or_create(&name).unwrap();
    let web1 = store.register_server("web-1", &[]).unwrap();
    let web2 = store.register_server("web-2", &[]).unwrap();
    let k = |hour: u32, server: ServerId| HourKey {
        series,
        hour: Hour(hour),
        server,
        epoch: Epoch(1),
    };
    store
        .put_hourly(&[
            (k(100 * 24 + 1, web1), 1, Bytes::from(dense(1))),
            (k(100 * 24 + 1, web2), 1, Bytes::from(dense(2))),
            (k(101 * 24 + 1, web1), 1, Bytes::from(dense(3))),
        ])
        .unwrap();
    let damaged = k(100 * 24 + 1, web2).encode();
    let good = get_raw(&store, "hourly", &damaged).unwrap();
    assert_eq!(good[8..].starts_with(&ZSTD), compressed);
    put_raw(&store, "hourly", &damaged, &good[..good.len() - 20]);
    (store, series)
}

/// background.rs's rule ("a day that does not merge stops neither later days nor
/// retention"): a day with a row that does not read is recorded as a conflict and the
/// pass goes on to the next day. True of a damaged raw frame ...
#[test]
fn a_damaged_raw_row_is_a_conflict_and_the_pass_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_a_damaged_day(&dir, false);
    let report = crate::rollup::build_dirty_days(&store, Day(102), 100).unwrap();
    assert_eq!((report.conflicts, report.days), (1, 1), "{report:?}");
}

/// ... and of a damaged compressed value: it is a conflict of its day, not a failure of
/// `scan_hourly` (`StoreError::BadValue`) that would fail the whole pass (before
/// retention) on every pass, so that no later day were ever rolled up.
#[test]
fn a_damaged_compressed_row_is_a_conflict_and_the_pass_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with_a_damaged_day(&dir, true);
    let report = crate::rollup::build_dirty_days(&store, Day(102), 100);
    let report = report.expect("the rollup pass goes on past a day whose rows do not read");
    assert_eq!((report.conflicts, report.days), (1, 1), "{report:?}");
}

/// A query that leaves out the damaged row's server does not decode that row, so the
/// damage does not fail its merge.
#[test]
fn a_damaged_row_of_a_server_left_out_does_not_fail_the_merge() {
    for compressed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (store, series) = store_with_a_damaged_day(&dir, compressed);
        let web1 = store.server_id("web-1").unwrap().unwrap();
        let name = SeriesName::new("visitors", vec![], Kind::Distinct);
        let day = crate::planner::merge_day(
            &store,
            &name,
            series,
            Day(100).hours(),
            &|s| s == web1,
            crate::planner::DayParts {
                all: true,
                per_server: false,
            },
        );
        let day = day.unwrap_or_else(|e| panic!("compressed {compressed}: {e}"));
        assert_eq!(day.rows, 1);
    }
}

/// Dense UltraLogLog registers take the register compressor, every other frame level 1:
/// each round-trips, and a mostly zero frame (a sparse Bloom filter, an empty Count-Min
/// row) still shrinks to almost nothing.
#[test]
fn registers_and_other_sketches_take_their_own_compressor() {
    use hourglass_sketch::distinct::{Distinct, DistinctForm};
    let frame_of = |form: DistinctForm, n: u32| {
        let mut d = Distinct::new(form, 13).unwrap();
        (0..n).for_each(|i| d.insert(&i.to_le_bytes()));
        d.encode()
    };
    let dense = frame_of(DistinctForm::Ull, 5000);
    assert!(super::values::holds_registers(&dense));
    for other in [
        frame_of(DistinctForm::Ull, 100),
        frame_of(DistinctForm::Hll, 5000),
        Sketch::Membership(hourglass_sketch::bloom::Bloom::new(100_000, 0.01).unwrap()).encode(),
    ] {
        assert!(!super::values::holds_registers(&other));
    }
    let bloom =
        Sketch::Membership(hourglass_sketch::bloom::Bloom::new(100_000, 0.01).unwrap()).encode();
    for frame in [&dense, &bloom] {
        let v = hourly_value(1, frame, true);
        assert_eq!(&hourly_sketch(b"k", &v).unwrap(), frame);
    }
    assert!(hourly_value(1, &bloom, true).len() < bloom.len() / 50);
    assert!(hourly_value(1, &dense, true).len() < dense.len() / 2);
}
