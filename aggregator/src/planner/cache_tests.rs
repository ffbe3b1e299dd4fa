//! The planner's answers through the hour cache (`store::cache`): byte for byte the
//! answers of the rows themselves, whatever the forms, precisions, selections, bad rows,
//! late writes, retention and server registrations; and a RocksDB store written with
//! the old compression answers as before.
//!
//! Each test asks a cached store and one without a cache (`with_query_cache(0)`, or
//! `query_cache_bytes: 0`) the same questions.

use super::*;
use crate::keys::Epoch;
use crate::rollup::build_dirty_days;
use crate::store::{
    DayConflict, DayWrite, Dictionaries, DirtyDay, HourCache, Hourly, MemoryStore, PutOutcome,
    Replica, Retention, RocksStore, Rollups, ServerIndex, StoreOptions, StoredSketch,
    StreamPosition,
};
use hourglass_sketch::distinct::{Distinct, DistinctForm};
use std::collections::BTreeSet;
use std::sync::Arc;

// ---------------------------------------------------------------------------------------
// Fixtures

/// A distinct sketch of `form` and `precision` holding `n` items named after `salt`.
fn distinct_bytes(form: DistinctForm, precision: u8, n: u32, salt: &str) -> Vec<u8> {
    let mut s = Distinct::new(form, precision).unwrap();
    for i in 0..n {
        s.insert(format!("{salt}-{i}").as_bytes());
    }
    s.encode()
}

/// A small deterministic generator (xorshift), so the fleet is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const SERVERS: [(&str, &str); 5] = [
    ("s-1", "eu"),
    ("s-2", "eu"),
    ("s-3", "us"),
    ("s-4", "us"),
    ("s-5", "ap"),
];

fn series_name(device: &str) -> SeriesName {
    SeriesName::new(
        "visitors",
        vec![("device".into(), device.into())],
        Kind::Distinct,
    )
}

/// Three days of a distinct metric over five servers whose rows mix both forms, four
/// precisions, sparse and dense sketches, two epochs, and missing server-hours.
fn fill_mixed(store: &dyn Store, seed: u64) {
    let mut rng = Rng(seed);
    let mut batch = Vec::new();
    for (name, region) in SERVERS {
        let server = store
            .register_server(name, &[("region".to_string(), region.to_string())])
            .unwrap();
        let live: Vec<Hour> = (0..72).map(Hour).collect();
        store.mark_live(server, &live).unwrap();
        for device in ["mobile", "desktop"] {
            let series = store.series_id_or_create(&series_name(device)).unwrap();
            for hour in 0..72u32 {
                if rng.below(5) == 0 {
                    continue; // a missing server-hour
                }
                for epoch in 1..=(1 + rng.below(2)) {
                    let form = if rng.below(2) == 0 {
                        DistinctForm::Hll
                    } else {
                        DistinctForm::Ull
                    };
                    let precision = [10u8, 11, 12, 14][rng.below(4) as usize];
                    let n = [1u32, 40, 300, 900, 4000][rng.below(5) as usize];
                    let salt = format!("{device}-{}", rng.below(6));
                    let key = HourKey {
                        series,
                        hour: Hour(hour),
                        server,
                        epoch: Epoch(epoch),
                    };
                    batch.push((key, 1, distinct_bytes(form, precision, n, &salt).into()));
                }
            }
        }
    }
    store.put_hourly(&batch).unwrap();
}

fn sel(hours: Range<u32>) -> Selector {
    Selector {
        metric: "visitors".into(),
        kind: Kind::Distinct,
        tags: Vec::new(),
        hours: Hour(hours.start)..Hour(hours.end),
        servers: Vec::new(),
        labels: Vec::new(),
        group_by: GroupBy::None,
    }
}

fn mixed_selections() -> Vec<Selector> {
    let mut out = Vec::new();
    for hours in [0..72, 5..41, 23..25, 30..31, 47..70, 50..72] {
        let all = sel(hours.clone());
        out.push(all.clone());
        out.push(Selector {
            servers: vec!["s-1".into(), "s-3".into()],
            ..all.clone()
        });
        out.push(Selector {
            servers: vec!["s-5".into()],
            ..all.clone()
        });
        out.push(Selector {
            labels: vec![("region".into(), "eu".into())],
            ..all.clone()
        });
        out.push(Selector {
            tags: vec![("device".into(), "mobile".into())],
            ..all.clone()
        });
        out.push(Selector {
            group_by: GroupBy::Server,
            ..all.clone()
        });
        out.push(Selector {
            group_by: GroupBy::Day,
            ..all.clone()
        });
        out.push(Selector {
            group_by: GroupBy::Tag("device".into()),
            servers: vec!["s-2".into(), "s-4".into(), "s-5".into()],
            ..all.clone()
        });
    }
    out.push(Selector {
        group_by: GroupBy::Hour,
        ..sel(20..29)
    });
    out.push(Selector {
        group_by: GroupBy::Hour,
        labels: vec![("region".into(), "us".into())],
        ..sel(44..50)
    });
    out
}

/// The answer, with every sketch also as its encoded bytes, so equality is byte for byte.
/// An answer and the encoded sketch of its total and of each group.
type AnswerBytes = (Answer, Vec<Option<Vec<u8>>>);

fn answer_bytes(store: &dyn Store, s: &Selector) -> Result<AnswerBytes, String> {
    let answer = Planner::new(store).answer(s).map_err(|e| e.to_string())?;
    let mut bytes = vec![answer.total.sketch.as_ref().map(Sketch::encode)];
    bytes.extend(
        answer
            .groups
            .iter()
            .map(|(_, m)| m.sketch.as_ref().map(Sketch::encode)),
    );
    Ok((answer, bytes))
}

fn assert_same(cached: &dyn Store, rows: &dyn Store, selections: &[Selector], why: &str) {
    for s in selections {
        let a = answer_bytes(cached, s);
        let b = answer_bytes(rows, s);
        assert_eq!(a, b, "{why}: {s:?}");
    }
}

/// A distinct sketch's estimate.
fn estimate(sketch: &Option<Sketch>) -> f64 {
    match sketch {
        Some(Sketch::Distinct(d)) => d.estimate().estimate,
        None => 0.0,
        other => panic!("expected a distinct sketch, got {other:?}"),
    }
}

/// A store whose `list_servers` answers a list taken earlier (what a query that listed
/// the servers just before a new server registered holds); everything else, the hour
/// cache included, is the inner store's.
struct ListedEarlier {
    inner: Arc<MemoryStore>,
    servers: Vec<ServerEntry>,
}

impl Hourly for ListedEarlier {
    fn write_push(
        &self,
        live: Option<(ServerId, &[Hour])>,
        batch: &[(HourKey, u64, crate::store::Bytes)],
    ) -> Result<Vec<PutOutcome>, StoreError> {
        self.inner.write_push(live, batch)
    }

    fn hourly_versions(&self, keys: &[HourKey]) -> Result<Vec<Option<u64>>, StoreError> {
        self.inner.hourly_versions(keys)
    }

    fn scan_hourly(
        &self,
        series: SeriesId,
        hours: Range<Hour>,
        visit: &mut dyn FnMut(HourKey, &StoredSketch) -> bool,
    ) -> Result<(), StoreError> {
        self.inner.scan_hourly(series, hours, visit)
    }

    fn hour_cache(&self) -> Option<&HourCache> {
        self.inner.hour_cache()
    }
}

impl Rollups for ListedEarlier {
    fn put_rollup(&self, key: DayKey, sketch: Vec<u8>) -> Result<(), StoreError> {
        self.inner.put_rollup(key, sketch)
    }

    fn get_rollup(&self, key: DayKey) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get_rollup(key)
    }

    fn scan_rollups(
        &self,
        series: SeriesId,
        days: Range<Day>,
        visit: &mut dyn FnMut(DayKey, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.inner.scan_rollups(series, days, visit)
    }

    fn mark_day_dirty(&self, series: SeriesId, day: Day) -> Result<(), StoreError> {
        self.inner.mark_day_dirty(series, day)
    }

    fn dirty_days(&self, before: Day, limit: usize) -> Result<Vec<DirtyDay>, StoreError> {
        self.inner.dirty_days(before, limit)
    }

    fn is_day_dirty(&self, series: SeriesId, day: Day) -> Result<bool, StoreError> {
        self.inner.is_day_dirty(series, day)
    }

    fn write_day(&self, write: DayWrite<'_>) -> Result<(), StoreError> {
        self.inner.write_day(write)
    }

    fn day_conflicts(&self) -> Result<Vec<DayConflict>, StoreError> {
        self.inner.day_conflicts()
    }
}

impl Retention for ListedEarlier {
    fn delete_hourly_before(
        &self,
        day: Day,
        keep: &BTreeSet<(SeriesId, Day)>,
    ) -> Result<u64, StoreError> {
        self.inner.delete_hourly_before(day, keep)
    }

    fn delete_rollups_before(&self, day: Day) -> Result<u64, StoreError> {
        self.inner.delete_rollups_before(day)
    }

    fn is_day_expired(&self, series: SeriesId, day: Day) -> Result<bool, StoreError> {
        self.inner.is_day_expired(series, day)
    }
}

impl Dictionaries for ListedEarlier {
    fn series_id(&self, series: &SeriesName) -> Result<Option<SeriesId>, StoreError> {
        self.inner.series_id(series)
    }

    fn series_id_or_create(&self, series: &SeriesName) -> Result<SeriesId, StoreError> {
        self.inner.series_id_or_create(series)
    }

    fn list_series(&self) -> Result<Vec<(SeriesId, SeriesName)>, StoreError> {
        self.inner.list_series()
    }

    fn server_id(&self, name: &str) -> Result<Option<ServerId>, StoreError> {
        self.inner.server_id(name)
    }

    fn register_server(
        &self,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<ServerId, StoreError> {
        self.inner.register_server(name, labels)
    }

    fn list_servers(&self) -> Result<Vec<ServerEntry>, StoreError> {
        Ok(self.servers.clone())
    }
}

impl ServerIndex for ListedEarlier {
    fn server_series(
        &self,
        server: ServerId,
        since: Day,
    ) -> Result<Vec<(SeriesId, Day)>, StoreError> {
        self.inner.server_series(server, since)
    }

    fn live_hours(&self, server: ServerId, hours: Range<Hour>) -> Result<u64, StoreError> {
        self.inner.live_hours(server, hours)
    }

    fn live_span(&self, server: ServerId) -> Result<Option<Range<Hour>>, StoreError> {
        self.inner.live_span(server)
    }
}

impl Replica for ListedEarlier {
    fn put_index(
        &self,
        live: Option<(ServerId, &[Hour])>,
        server: ServerId,
        held: &[(SeriesId, Day)],
    ) -> Result<(), StoreError> {
        self.inner.put_index(live, server, held)
    }

    fn unexpire_day(&self, series: SeriesId, day: Day) -> Result<(), StoreError> {
        self.inner.unexpire_day(series, day)
    }

    fn stream_position(&self, subject: u32) -> Result<Option<StreamPosition>, StoreError> {
        self.inner.stream_position(subject)
    }

    fn put_stream_position(
        &self,
        subject: u32,
        position: &StreamPosition,
    ) -> Result<(), StoreError> {
        self.inner.put_stream_position(subject, position)
    }
}

/// One server `old` with a row in hours 0..4 of one series, in `store`.
fn one_old_server(store: &dyn Store) -> SeriesId {
    let old = store.register_server("old", &[]).unwrap();
    let series = store.series_id_or_create(&series_name("mobile")).unwrap();
    store
        .mark_live(old, &[Hour(0), Hour(1), Hour(2), Hour(3)])
        .unwrap();
    for hour in 0..4 {
        let key = HourKey {
            series,
            hour: Hour(hour),
            server: old,
            epoch: Epoch(1),
        };
        let bytes = distinct_bytes(DistinctForm::Ull, 12, 100, &format!("old-{hour}"));
        store.put_hourly(&[(key, 1, bytes.into())]).unwrap();
    }
    series
}

/// The new server's backfilled hour 2: 2,000 users no other row has.
fn push_new_server(store: &dyn Store, series: SeriesId) {
    let new = store.register_server("new", &[]).unwrap();
    let key = HourKey {
        series,
        hour: Hour(2),
        server: new,
        epoch: Epoch(1),
    };
    let bytes = distinct_bytes(DistinctForm::Ull, 12, 2000, "new");
    store
        .put_push(Some((new, &[Hour(2)])), &[(key, 1, bytes.into())])
        .unwrap();
}

// ---------------------------------------------------------------------------------------
// Server lists and generations

/// A query lists the servers, then a new server registers and pushes a (backfilled) row
/// into an hour, then the query takes that hour's generation and reads its rows. The
/// query's `keep` leaves the new server's row out; its merge is filed under its own
/// server list, never under "all servers" at the generation that already counts the new
/// row, so a later query of all servers answers with the new server's row.
#[test]
fn an_all_servers_merge_is_not_filed_with_a_stale_server_list() {
    let inner = Arc::new(MemoryStore::new());
    let rows = MemoryStore::with_query_cache(0);
    let series = one_old_server(inner.as_ref());
    one_old_server(&rows);
    // The query in flight listed the servers before `new` registered.
    let listed = ListedEarlier {
        servers: inner.list_servers().unwrap(),
        inner: Arc::clone(&inner),
    };
    push_new_server(inner.as_ref(), series);
    push_new_server(&rows, series);
    let whole = sel(0..4);
    // That query's own answer may leave `new` out: it was concurrent with the push.
    Planner::new(&listed).answer(&whole).unwrap();
    // A query that starts after the push was acknowledged must see it.
    let after = Planner::new(inner.as_ref()).answer(&whole).unwrap();
    let truth = Planner::new(&rows).answer(&whole).unwrap();
    assert!(estimate(&truth.total.sketch) > 2000.0);
    assert!(
        after.total.sketch.as_ref().map(Sketch::encode)
            == truth.total.sketch.as_ref().map(Sketch::encode),
        "the cached hour 2 of all servers misses the new server's row: {} users instead of {}",
        estimate(&after.total.sketch),
        estimate(&truth.total.sketch)
    );
    assert_eq!(after.plan, truth.plan);
}

/// The same without a race: rows stored under a server id the registry does not hold
/// yet are left out of an all-servers merge; registering the server raises no
/// generation, so that merge must be filed under its server list, which the next query's
/// (with the new server) does not match.
#[test]
fn a_server_registered_after_its_rows_counts_in_all_servers_answers() {
    let cached = MemoryStore::new();
    let rows = MemoryStore::with_query_cache(0);
    let whole = sel(0..4);
    for store in [&cached as &dyn Store, &rows] {
        let series = one_old_server(store);
        // The next id the registry will give: `old` is 1.
        let key = HourKey {
            series,
            hour: Hour(2),
            server: ServerId(2),
            epoch: Epoch(1),
        };
        let bytes = distinct_bytes(DistinctForm::Ull, 12, 2000, "new");
        store.put_hourly(&[(key, 1, bytes.into())]).unwrap();
        Planner::new(store).answer(&whole).unwrap();
        assert_eq!(store.register_server("new", &[]).unwrap(), ServerId(2));
    }
    let a = answer_bytes(&cached, &whole).unwrap();
    let b = answer_bytes(&rows, &whole).unwrap();
    assert!(
        a.1 == b.1,
        "registered server's rows missing from the cached answer: {} vs {}",
        estimate(&a.0.total.sketch),
        estimate(&b.0.total.sketch)
    );
    assert_eq!(a.0.plan, b.0.plan);
}

/// The names of a RocksDB directory's column families, opened raw.
fn raw_db(dir: &std::path::Path) -> rocksdb::DB {
    let names = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir).unwrap();
    rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, names).unwrap()
}

fn rocks_options(cache_bytes: usize) -> StoreOptions {
    StoreOptions {
        sync_writes: false,
        query_cache_bytes: cache_bytes,
        ..StoreOptions::default()
    }
}

/// `RocksStore::delete_rollups_before` deletes the hourly rows before the day in one write
/// (`delete_before(CF_HOURLY, ..)`), then goes on with fallible steps (`servers_under`,
/// the meta batch's write). When one of them fails (here a damaged `liveday/` key; in
/// production e.g. ENOSPC on the second write), the rows are gone, and the generation
/// must have moved already: no cached hour answers with rows the store no longer holds.
#[test]
fn a_failed_rollup_retention_leaves_no_deleted_hour_cached() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path(), &rocks_options(64 << 20)).unwrap();
        one_old_server(&store);
    }
    {
        // A damaged meta key under `liveday/` (2 bytes where a server id takes 4).
        let db = raw_db(dir.path());
        let meta = db.cf_handle("meta").unwrap();
        db.put_cf(meta, b"liveday/\x00\x01", [0u8; 4]).unwrap();
    }
    let store = RocksStore::open(dir.path(), &rocks_options(64 << 20)).unwrap();
    let part = sel(1..4);
    let before = Planner::new(&store).answer(&part).unwrap();
    assert_eq!(before.plan.hourly_rows, 3);
    let failed = store.delete_rollups_before(Day(1));
    assert!(
        failed.is_err(),
        "setup: the retention pass should fail after deleting rows"
    );
    let series = store.series_id(&series_name("mobile")).unwrap().unwrap();
    let mut left = 0;
    store
        .scan_hourly(series, Hour(0)..Hour(24), &mut |_, _| {
            left += 1;
            true
        })
        .unwrap();
    assert_eq!(left, 0, "setup: the hourly rows of day 0 are deleted");
    let after = Planner::new(&store).answer(&part).unwrap();
    assert_eq!(
        (after.plan.hourly_rows, after.total.sketch.is_some()),
        (0, false),
        "answered from cached merges of deleted rows"
    );
}

// ---------------------------------------------------------------------------------------
// Answers like the rows'

/// Mixed forms, precisions, sparse and dense rows, two epochs, every kind of selection and
/// grouping, partial days: cold, warm, after rollups and after late writes, the cached
/// answer is the row answer byte for byte, with the same coverage and plan.
#[test]
fn mixed_forms_precisions_and_selections_answer_like_rows() {
    for seed in [7u64, 0x9e37_79b9_7f4a_7c15] {
        let cached = MemoryStore::new();
        let rows = MemoryStore::with_query_cache(0);
        fill_mixed(&cached, seed);
        fill_mixed(&rows, seed);
        let selections = mixed_selections();
        assert_same(&cached, &rows, &selections, "cold");
        let warm_misses = cached.hour_cache().unwrap().stats().misses;
        assert_same(&cached, &rows, &selections, "warm");
        assert_eq!(cached.hour_cache().unwrap().stats().misses, warm_misses);
        for store in [&cached, &rows] {
            build_dirty_days(store, Day(2), 100).unwrap();
        }
        assert_same(&cached, &rows, &selections, "rolled up");
        // Late rows: a dense HLL into a rolled-up day, a sparse ULL at a lower precision
        // into a cached hour, a newer version replacing a row.
        for store in [&cached as &dyn Store, &rows] {
            let series = store.series_id(&series_name("mobile")).unwrap().unwrap();
            let s3 = store.server_id("s-3").unwrap().unwrap();
            let s5 = store.server_id("s-5").unwrap().unwrap();
            let put = |hour: u32, server, version, bytes: Vec<u8>| {
                let key = HourKey {
                    series,
                    hour: Hour(hour),
                    server,
                    epoch: Epoch(1),
                };
                store.put_hourly(&[(key, version, bytes.into())]).unwrap();
            };
            put(
                7,
                s3,
                50,
                distinct_bytes(DistinctForm::Hll, 14, 5000, "late"),
            );
            put(
                30,
                s5,
                50,
                distinct_bytes(DistinctForm::Ull, 9, 20, "low-p"),
            );
            put(60, s3, 50, distinct_bytes(DistinctForm::Ull, 14, 3, "tiny"));
        }
        assert_same(&cached, &rows, &selections, "after late rows");
    }
}

/// A row that frames but does not decode, and a row of another kind in a distinct
/// series: the cached path falls back to the canonical one and reports the same error,
/// again on the next query (nothing wrong was cached for the day).
#[test]
fn undecodable_and_wrong_kind_rows_fail_like_rows() {
    let cached = MemoryStore::new();
    let rows = MemoryStore::with_query_cache(0);
    for store in [&cached as &dyn Store, &rows] {
        let series = one_old_server(store);
        let old = store.server_id("old").unwrap().unwrap();
        // A distinct frame whose body names representation 9.
        let mut body = Vec::new();
        Distinct::new(DistinctForm::Ull, 12)
            .unwrap()
            .encode_body(&mut body);
        body[2] = 9;
        let bad = hourglass_sketch::format::encode_frame(Kind::Distinct, &body);
        let key = |hour, epoch| HourKey {
            series,
            hour: Hour(hour),
            server: old,
            epoch: Epoch(epoch),
        };
        store.put_hourly(&[(key(2, 2), 1, bad.into())]).unwrap();
        let bloom = hourglass_sketch::bloom::Bloom::new(100, 0.01).unwrap();
        store
            .put_hourly(&[(key(30, 1), 1, Sketch::Membership(bloom).encode().into())])
            .unwrap();
        let next = distinct_bytes(DistinctForm::Ull, 12, 10, "next");
        store.put_hourly(&[(key(31, 1), 1, next.into())]).unwrap();
        store.mark_live(old, &[Hour(30), Hour(31)]).unwrap();
    }
    for hours in [0..4, 1..3, 2..3, 0..40, 29..40] {
        for _ in 0..2 {
            let s = sel(hours.clone());
            assert_same(&cached, &rows, std::slice::from_ref(&s), "a bad row");
            assert!(answer_bytes(&cached, &s).is_err(), "{hours:?}");
        }
    }
    // Hours without the bad rows are answered, and cached.
    assert_same(&cached, &rows, &[sel(0..2), sel(3..4)], "good hours");
}

/// The RocksDB store with and without the cache through writes, hourly retention,
/// rollup retention (which deletes hourly rows kept past hourly retention) and a copied
/// day's return: the same answers, errors included.
#[test]
fn a_cached_rocks_store_answers_like_an_uncached_one_through_retention() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cached = RocksStore::open(d1.path(), &rocks_options(64 << 20)).unwrap();
    let rows = RocksStore::open(d2.path(), &rocks_options(0)).unwrap();
    fill_mixed(&cached, 11);
    fill_mixed(&rows, 11);
    let selections = mixed_selections();
    let check = |why: &str| {
        assert_same(&cached, &rows, &selections, why);
        assert_same(&cached, &rows, &selections, why);
    };
    check("cold and warm");
    for store in [&cached, &rows] {
        build_dirty_days(store, Day(2), 100).unwrap();
    }
    check("rolled up");
    // Day 0 is kept past hourly retention (as if its rollups failed), day 1 expires.
    let series = cached.series_id(&series_name("mobile")).unwrap().unwrap();
    let keep: BTreeSet<(SeriesId, Day)> = [(series, Day(0))].into();
    for store in [&cached, &rows] {
        store.delete_hourly_before(Day(2), &keep).unwrap();
    }
    check("hourly retention");
    for store in [&cached, &rows] {
        store.delete_rollups_before(Day(1)).unwrap();
    }
    check("rollup retention");
    // A copy brings day 1's hours back.
    for store in [&cached as &dyn Store, &rows] {
        let series = store.series_id(&series_name("desktop")).unwrap().unwrap();
        store.unexpire_day(series, Day(1)).unwrap();
        let s1 = store.server_id("s-1").unwrap().unwrap();
        let key = HourKey {
            series,
            hour: Hour(30),
            server: s1,
            epoch: Epoch(1),
        };
        let bytes = distinct_bytes(DistinctForm::Hll, 12, 700, "copied");
        store.put_hourly(&[(key, 9, bytes.into())]).unwrap();
    }
    check("a copied day");
}

/// A store written with the old compression (uncompressed L0, LZ4 elsewhere, no WAL
/// compression) opens with the new options and answers as before: its LZ4 SST files,
/// its uncompressed L0 file and its uncompressed WAL are all read (LZ4 stays linked:
/// Cargo.toml keeps the `lz4` feature; RocksDB records the compression per block and the
/// WAL's per file).
#[test]
fn a_rocks_store_written_with_the_old_compression_answers_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let selections = mixed_selections();
    let expected: Vec<_> = {
        let store = RocksStore::open(dir.path(), &rocks_options(0)).unwrap();
        fill_mixed(&store, 5);
        build_dirty_days(&store, Day(2), 100).unwrap();
        selections.iter().map(|s| answer_bytes(&store, s)).collect()
    };
    {
        // Rewrite everything as the old options did: every SST file LZ4 (the middle
        // levels' choice), then an uncompressed L0 flush, then an uncompressed WAL.
        let names = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir.path()).unwrap();
        let mut db_options = rocksdb::Options::default();
        db_options.set_wal_compression_type(rocksdb::DBCompressionType::None);
        let descriptors = names.iter().map(|name| {
            let mut cf = rocksdb::Options::default();
            cf.set_compression_per_level(&[
                rocksdb::DBCompressionType::None,
                rocksdb::DBCompressionType::Lz4,
                rocksdb::DBCompressionType::Lz4,
                rocksdb::DBCompressionType::Lz4,
                rocksdb::DBCompressionType::Lz4,
                rocksdb::DBCompressionType::Lz4,
                rocksdb::DBCompressionType::Lz4,
            ]);
            cf.set_bottommost_compression_type(rocksdb::DBCompressionType::Lz4);
            if name == "hourly" {
                cf.set_prefix_extractor(rocksdb::SliceTransform::create_fixed_prefix(8));
            }
            rocksdb::ColumnFamilyDescriptor::new(name, cf)
        });
        let db = rocksdb::DB::open_cf_descriptors(&db_options, dir.path(), descriptors).unwrap();
        let mut compact = rocksdb::CompactOptions::default();
        compact.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        let mut all = Vec::new();
        for name in &names {
            let cf = db.cf_handle(name).unwrap();
            db.flush_cf(cf).unwrap();
            db.compact_range_cf_opt(cf, None::<&[u8]>, None::<&[u8]>, &compact);
            let mut it = db.raw_iterator_cf(cf);
            it.seek_to_first();
            while let Some((k, v)) = it.item() {
                all.push((name.clone(), k.to_vec(), v.to_vec()));
                it.next();
            }
        }
        let props = db
            .property_value_cf(
                db.cf_handle("hourly").unwrap(),
                "rocksdb.aggregated-table-properties",
            )
            .unwrap()
            .unwrap_or_default();
        eprintln!("old-style hourly table properties: {props}");
        // Some blocks really are LZ4 (the others LZ4 could not shrink enough, stored raw).
        let stat = |name: &str| -> u64 {
            props
                .split(';')
                .find_map(|kv| kv.trim().strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("{name} in {props}"))
                .trim()
                .parse()
                .unwrap()
        };
        assert!(
            stat("# data blocks compression rejected") < stat("# data blocks"),
            "setup: no LZ4 block was written: {props}"
        );
        // Half the rows again into an uncompressed L0 file, the other half into the WAL.
        let (first, second) = all.split_at(all.len() / 2);
        for (name, k, v) in first {
            db.put_cf(db.cf_handle(name).unwrap(), k, v).unwrap();
        }
        for name in &names {
            db.flush_cf(db.cf_handle(name).unwrap()).unwrap();
        }
        for (name, k, v) in second {
            db.put_cf(db.cf_handle(name).unwrap(), k, v).unwrap();
        }
    }
    let store = RocksStore::open(dir.path(), &rocks_options(64 << 20)).unwrap();
    let got: Vec<_> = selections.iter().map(|s| answer_bytes(&store, s)).collect();
    assert_eq!(got, expected);
    // Compacted with the new options, and reopened: the same again.
    store.flush().unwrap();
    store.compact().unwrap();
    drop(store);
    let store = RocksStore::open(dir.path(), &rocks_options(0)).unwrap();
    let got: Vec<_> = selections.iter().map(|s| answer_bytes(&store, s)).collect();
    assert_eq!(got, expected);
}
