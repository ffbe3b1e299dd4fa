//! The in-memory live hours (`live.rs`): they answer as the records in RocksDB say, at
//! the edges of the id and hour ranges, under concurrency and after retention.
//!
//! The reference is a reading of the records themselves (`old_live_hours` and
//! `old_live_span` below, the implementation before the cache, e813808, read from the
//! same store) and the `MemoryStore`.

use super::*;
use crate::store::MemoryStore;
use crate::store::rules::{mask_span, mask_within, span_union};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

fn open(dir: &tempfile::TempDir) -> RocksStore {
    RocksStore::open(
        dir.path(),
        &StoreOptions {
            sync_writes: false,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

/// e813808's `live_hours`, read from the store (no cache).
fn old_live_hours(store: &RocksStore, server: ServerId, hours: Range<Hour>) -> u64 {
    if is_empty_range(&hours) {
        return 0;
    }
    let meta = store.cf(CF_META);
    let mut masks: BTreeMap<Day, u32> = BTreeMap::new();
    let mut read = ReadOptions::default();
    read.set_iterate_upper_bound(meta::live(server, hours.end));
    let mut it = store.db.raw_iterator_cf_opt(meta, read);
    it.seek(meta::live(server, hours.start));
    while let Some(key) = it.key() {
        let hour = Hour(meta_id(key, after(key, meta::LIVE.len() + 4)).unwrap());
        *masks.entry(hour.day()).or_default() |= hour_bit(hour);
        it.next();
    }
    it.status().unwrap();
    let last_day = Hour(hours.end.0 - 1).day();
    let mut read = ReadOptions::default();
    read.set_iterate_upper_bound(meta::live_day(server, last_day.next()));
    let mut it = store.db.raw_iterator_cf_opt(meta, read);
    it.seek(meta::live_day(server, hours.start.day()));
    while let Some((key, value)) = it.item() {
        let day = Day(meta_id(key, after(key, meta::LIVE_DAY.len() + 4)).unwrap());
        *masks.entry(day).or_default() |= mask_within(day, live_mask(key, value).unwrap(), &hours);
        it.next();
    }
    it.status().unwrap();
    masks.values().map(|m| u64::from(m.count_ones())).sum()
}

/// e813808's `live_span`, except that the upper bound of a server's keys is computed
/// without `prefix_end` (which cannot step past a server id ending in 0xff).
fn old_live_span(store: &RocksStore, server: ServerId) -> Option<Range<Hour>> {
    let meta = store.cf(CF_META);
    // First key, first value, last key, last value.
    type Ends = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);
    let ends = |prefix: &[u8]| -> Option<Ends> {
        let lo = meta::server_start(prefix, server);
        let mut read = ReadOptions::default();
        read.set_iterate_lower_bound(lo.clone());
        let hi = match server.0.checked_add(1) {
            Some(next) => meta::server_start(prefix, ServerId(next)),
            None => prefix_end(prefix),
        };
        read.set_iterate_upper_bound(hi);
        let mut it = store.db.raw_iterator_cf_opt(meta, read);
        it.seek_to_first();
        let (k, v) = it.item()?;
        let (fk, fv) = (k.to_vec(), v.to_vec());
        it.seek_to_last();
        let (lk, lv) = it.item().map(|(k, v)| (k.to_vec(), v.to_vec()))?;
        Some((fk, fv, lk, lv))
    };
    let hourly = ends(meta::LIVE).map(|(first, _, last, _)| {
        let hour = |key: &[u8]| meta_id(key, after(key, meta::LIVE.len() + 4)).unwrap();
        Hour(hour(&first))..Hour(hour(&last) + 1)
    });
    let summaries = ends(meta::LIVE_DAY).and_then(|(fk, fv, lk, lv)| {
        let span = |key: &[u8], mask: &[u8]| {
            let day = Day(meta_id(key, after(key, meta::LIVE_DAY.len() + 4)).unwrap());
            mask_span(day, live_mask(key, mask).unwrap())
        };
        span_union(span(&fk, &fv), span(&lk, &lv))
    });
    span_union(hourly, summaries)
}

/// Interesting range ends around `hours`: day edges, the hours and their neighbours.
fn points(hours: &[u32]) -> Vec<u32> {
    let mut p = BTreeSet::new();
    for &h in hours {
        let first = h - h % 24;
        for x in [
            h.saturating_sub(1),
            h,
            h.saturating_add(1),
            first,
            first.saturating_sub(1),
            first.saturating_add(24),
            first.saturating_add(25),
        ] {
            p.insert(x);
        }
    }
    p.insert(0);
    p.into_iter().collect()
}

/// The new store's answers (asked twice: loaded, then cached) are the old ones and the
/// memory store's, for every range between `points`.
fn assert_same(store: &RocksStore, mem: &MemoryStore, server: ServerId, pts: &[u32], what: &str) {
    for round in ["loaded", "cached"] {
        let span = store.live_span(server).unwrap();
        assert_eq!(
            span,
            old_live_span(store, server),
            "{what} ({round}): span vs old"
        );
        assert_eq!(
            span,
            mem.live_span(server).unwrap(),
            "{what} ({round}): span vs memory"
        );
        for &a in pts {
            for &b in pts {
                let r = Hour(a)..Hour(b);
                let got = store.live_hours(server, r.clone()).unwrap();
                assert_eq!(
                    got,
                    old_live_hours(store, server, r.clone()),
                    "{what} ({round}): live_hours {r:?} vs old"
                );
                assert_eq!(
                    got,
                    mem.live_hours(server, r.clone()).unwrap(),
                    "{what} ({round}): live_hours {r:?} vs memory"
                );
            }
        }
    }
}

/// `with_live` bounds a server's keys with `prefix_end(server_start(..))`,
/// which adds one to the last byte of the server id: for a server id ending in 0xff
/// (255, 511, ... the 255th server registered) that must carry, not overflow (which
/// would panic in debug builds and, in release, leave the server never live).
#[test]
fn a_server_id_ending_in_ff_is_bounded_without_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let mem = MemoryStore::new();
    let hours: Vec<Hour> = [480_000, 480_001, 480_030].map(Hour).to_vec();
    for server in [ServerId(255), ServerId(256)] {
        store.mark_live(server, &hours).unwrap();
        mem.mark_live(server, &hours).unwrap();
    }
    let result = catch_unwind(AssertUnwindSafe(|| {
        (
            store.live_span(ServerId(255)).unwrap(),
            store
                .live_hours(ServerId(255), Hour(480_000)..Hour(480_048))
                .unwrap(),
        )
    }));
    let expected = (
        mem.live_span(ServerId(255)).unwrap(),
        mem.live_hours(ServerId(255), Hour(480_000)..Hour(480_048))
            .unwrap(),
    );
    match result {
        Ok(got) => assert_eq!(got, expected, "server 255's live span and hours"),
        Err(_) => panic!(
            "live_span/live_hours of ServerId(255) panicked (prefix_end overflow); expected {expected:?}"
        ),
    }
}

/// The same bound as a release build (no overflow checks) computes it: were the last
/// byte wrapped to 0, the upper bound would fall below the seek key and server 255 would
/// be cached as never live. `prefix_end` carries past 0xff.
#[test]
fn a_server_id_ending_in_ff_is_live_in_a_release_build() {
    assert_eq!(prefix_end(&[1, 0xff]), vec![2]);
    assert_eq!(prefix_end(&[b'a', 0xff, 0xff]), vec![b'b']);
    assert_eq!(prefix_end(&[b'a', 7]), vec![b'a', 8]);
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    store.mark_live(ServerId(255), &[Hour(480_000)]).unwrap();
    store.mark_live(ServerId(256), &[Hour(480_001)]).unwrap();
    let lo = meta::server_start(meta::LIVE, ServerId(255));
    let mut read = ReadOptions::default();
    read.set_iterate_upper_bound(prefix_end(&lo));
    let mut it = store.db.raw_iterator_cf_opt(store.cf(CF_META), read);
    it.seek(&lo);
    let mut found = 0;
    while it.valid() {
        found += 1;
        it.next();
    }
    assert_eq!(
        found, 1,
        "server 255's bound must hold its one record and not server 256's"
    );
}

/// `LiveMasks::span` uses `mask_span` for `live/` hours too: its
/// `first + 32 - leading_zeros` must not overflow for an hour of the last day of `u32`
/// hours (from 4294967280).
#[test]
fn the_span_of_the_last_day_of_u32_hours_does_not_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let mem = MemoryStore::new();
    let server = ServerId(3);
    let hours = [Hour(u32::MAX - 10)];
    store.mark_live(server, &hours).unwrap();
    mem.mark_live(server, &hours).unwrap();
    let old = old_live_span(&store, server);
    assert_eq!(old, Some(Hour(u32::MAX - 10)..Hour(u32::MAX - 9)));
    assert_eq!(mem.live_span(server).unwrap(), old);
    let got = catch_unwind(AssertUnwindSafe(|| store.live_span(server).unwrap()));
    match got {
        Ok(span) => assert_eq!(span, old),
        Err(_) => panic!("live_span panicked for a live hour of u32's last day; old: {old:?}"),
    }
    assert_eq!(
        store
            .live_hours(server, Hour(u32::MAX - 20)..Hour(u32::MAX))
            .unwrap(),
        1
    );
}

/// live/ and liveday/ records together (retention folds some days), an hour in
/// both, hour 0 of a day, ranges crossing days, empty and reversed ranges, a server never
/// live; then writes after the load, and retention forgetting.
#[test]
fn live_hours_and_spans_match_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let mem = MemoryStore::new();
    let server = ServerId(7);
    let never = ServerId(8);
    let d = 20_000u32;
    let raw = [
        d * 24,
        d * 24 + 5,
        d * 24 + 23,
        (d + 1) * 24 + 11,
        (d + 3) * 24,
        (d + 3) * 24 + 1,
        (d + 5) * 24 + 23,
        (d + 6) * 24,
    ];
    let hours: Vec<Hour> = raw.map(Hour).to_vec();
    store.mark_live(server, &hours).unwrap();
    mem.mark_live(server, &hours).unwrap();
    let mut pts = points(&raw);
    pts.push(d * 24 + 100);
    assert_same(&store, &mem, server, &pts, "live/ only");
    assert_same(&store, &mem, never, &pts, "never live");

    // Fold days d..d+3 into liveday/ (the cache is forgotten, then loaded again).
    let keep = BTreeSet::new();
    store.delete_hourly_before(Day(d + 3), &keep).unwrap();
    mem.delete_hourly_before(Day(d + 3), &keep).unwrap();
    assert_same(&store, &mem, server, &pts, "liveday/ and live/");

    // An hour in both (already folded, live again), and new hours while loaded.
    let more: Vec<Hour> = [d * 24 + 5, d * 24 + 6, (d + 3) * 24 + 2, (d + 9) * 24]
        .map(Hour)
        .to_vec();
    store.mark_live(server, &more[..2]).unwrap();
    mem.mark_live(server, &more[..2]).unwrap();
    store
        .put_index(Some((server, &more[2..])), server, &[])
        .unwrap();
    mem.put_index(Some((server, &more[2..])), server, &[])
        .unwrap();
    pts.extend(points(&[(d + 9) * 24]));
    assert_same(
        &store,
        &mem,
        server,
        &pts,
        "hours in both, written after the load",
    );

    // Earlier days before the first: the span's start moves.
    store.mark_live(server, &[Hour((d - 2) * 24 + 13)]).unwrap();
    mem.mark_live(server, &[Hour((d - 2) * 24 + 13)]).unwrap();
    pts.extend(points(&[(d - 2) * 24 + 13]));
    assert_same(&store, &mem, server, &pts, "a new first day");

    // Rollup retention deletes the first days' records: answered without them.
    store.delete_rollups_before(Day(d + 1)).unwrap();
    mem.delete_rollups_before(Day(d + 1)).unwrap();
    assert_same(&store, &mem, server, &pts, "after rollup retention");
    store.delete_rollups_before(Day(d + 20)).unwrap();
    mem.delete_rollups_before(Day(d + 20)).unwrap();
    assert_same(&store, &mem, server, &pts, "after everything expired");
}

/// A push that fails (a bad sketch, before anything is written) changes neither
/// the store's nor the cache's live hours; a push with an empty batch does.
#[test]
fn a_failed_push_changes_no_live_hour() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let server = ServerId(1);
    store.mark_live(server, &[Hour(1000)]).unwrap();
    assert_eq!(
        store.live_span(server).unwrap(),
        Some(Hour(1000)..Hour(1001))
    );
    let key = HourKey {
        series: SeriesId(1),
        hour: Hour(1010),
        server,
        epoch: crate::keys::Epoch(0),
    };
    let bad = [(key, 1u64, Bytes::from_static(b"not a frame"))];
    assert!(store.put_push(Some((server, &[Hour(1010)])), &bad).is_err());
    assert_eq!(
        store.live_span(server).unwrap(),
        Some(Hour(1000)..Hour(1001))
    );
    assert_eq!(old_live_span(&store, server), Some(Hour(1000)..Hour(1001)));
    store.put_push(Some((server, &[Hour(1010)])), &[]).unwrap();
    assert_eq!(
        store.live_span(server).unwrap(),
        Some(Hour(1000)..Hour(1011))
    );
}

/// Read-your-writes under concurrency. Writers mark hours of four servers while
/// readers ask and a third thread forgets the cache (as retention does) and folds days
/// before the writers' hours: once `mark_live` returned, every later answer counts the
/// hour, and at the end the cache equals a fresh load.
#[test]
fn live_hours_read_their_writes_under_concurrent_loads() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(&dir));
    let base = 500_000u32;
    // Old hours for the folding thread to fold (before every written hour).
    for s in 1..=4 {
        store
            .mark_live(ServerId(s), &[Hour(base - 200), Hour(base - 100)])
            .unwrap();
    }
    const N: u64 = 300;
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..=4).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let hour_of = move |k: u64| Hour(base + (k as u32) * 7);
    let mut threads = Vec::new();
    for s in 1..=4u32 {
        let (store, done) = (Arc::clone(&store), Arc::clone(&done));
        threads.push(std::thread::spawn(move || {
            for k in 0..N {
                let h = [hour_of(k)];
                if k % 2 == 0 {
                    store.mark_live(ServerId(s), &h).unwrap();
                } else {
                    store
                        .put_index(Some((ServerId(s), &h)), ServerId(s), &[])
                        .unwrap();
                }
                done[s as usize].store(k + 1, Ordering::SeqCst);
            }
        }));
    }
    let mut readers = Vec::new();
    for r in 0..3u32 {
        let (store, done, stop) = (Arc::clone(&store), Arc::clone(&done), Arc::clone(&stop));
        readers.push(std::thread::spawn(move || {
            let mut asked = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for s in 1..=4u32 {
                    let s = (s + r) % 4 + 1;
                    let written = done[s as usize].load(Ordering::SeqCst);
                    let n = store
                        .live_hours(ServerId(s), Hour(base)..Hour(base + 7 * N as u32))
                        .unwrap();
                    assert!(
                        n >= written,
                        "server {s}: {n} live hours counted after {written} were written"
                    );
                    let span = store.live_span(ServerId(s)).unwrap().unwrap();
                    if written > 0 {
                        assert!(
                            span.end > hour_of(written - 1),
                            "server {s}: span {span:?} misses hour {:?}",
                            hour_of(written - 1)
                        );
                    }
                    asked += 1;
                }
            }
            asked
        }));
    }
    let forgetter = {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut i = 0u32;
            while !stop.load(Ordering::SeqCst) {
                if i.is_multiple_of(10) {
                    store
                        .delete_hourly_before(Hour(base).day(), &BTreeSet::new())
                        .unwrap();
                } else {
                    store.live_cache.forget();
                }
                i += 1;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for t in readers {
        assert!(t.join().unwrap() > 0);
    }
    forgetter.join().unwrap();
    for s in 1..=4u32 {
        let cached = (
            store.live_span(ServerId(s)).unwrap(),
            store
                .live_hours(ServerId(s), Hour(0)..Hour(u32::MAX))
                .unwrap(),
        );
        store.live_cache.forget();
        let fresh = (
            store.live_span(ServerId(s)).unwrap(),
            store
                .live_hours(ServerId(s), Hour(0)..Hour(u32::MAX))
                .unwrap(),
        );
        assert_eq!(cached, fresh, "server {s}");
        assert_eq!(fresh.1, N + 2);
    }
}

/// Memory: one entry per server asked about (never-live ones too, as empty maps), one
/// mask per live day; retention empties it.
#[test]
fn live_hours_hold_one_entry_per_server_asked() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    store.mark_live(ServerId(1), &[Hour(24), Hour(49)]).unwrap();
    // Ids ending in 0xff are left out: they panic (a_server_id_ending_in_ff_is_bounded_without_overflow).
    let asked: Vec<u32> = (1..=1003).filter(|s| s & 0xff != 0xff).collect();
    assert_eq!(asked.len(), 1000);
    for &s in &asked {
        store.live_span(ServerId(s)).unwrap();
    }
    // The cache's fields are private to live.rs: counted from its Debug form.
    let loaded = || {
        format!("{:?}", store.live_cache)
            .matches("ServerId(")
            .count()
    };
    assert_eq!(
        loaded(),
        1000,
        "never-live servers are kept as empty entries"
    );
    assert_eq!(
        store
            .live_cache
            .with(ServerId(1), |m| format!("{m:?}").matches("Day(").count()),
        Some(2),
        "one mask per live day"
    );
    store.delete_rollups_before(Day(0)).unwrap();
    assert_eq!(loaded(), 0);
}

/// Corrupt data only (no writer stores it): a `liveday/` mask with bits past hour 23.
/// The span takes the last day's merged mask, not the last `liveday/` record's mask end
/// (a `live/` hour may lie on a later day).
#[test]
fn the_span_ignores_mask_bits_past_hour_23() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let server = ServerId(2);
    let d = Day(1000);
    testing::put_raw(
        &store,
        CF_META,
        &meta::live_day(server, d),
        &(1u32 << 31).to_be_bytes(),
    );
    store
        .mark_live(server, &[Hour(d.next().first_hour().0 + 2)])
        .unwrap();
    assert_eq!(
        store.live_span(server).unwrap(),
        old_live_span(&store, server)
    );
}
