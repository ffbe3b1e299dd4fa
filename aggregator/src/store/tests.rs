//! One suite of [`Store`] semantics, run against both stores, then what only RocksDB has:
//! persistence, the data dir lock, the schema version, corruption.

use super::*;
use crate::keys::Epoch;
use hourglass_sketch::hll::Hll;
use std::collections::BTreeSet;
use std::sync::Arc;

/// A valid framed sketch whose bytes differ for different `n`.
fn sketch(n: u64) -> Vec<u8> {
    let mut hll = Hll::new(8).unwrap();
    for i in 0..=n {
        hll.insert(&i.to_le_bytes());
    }
    hll.encode()
}

fn key(series: u32, hour: u32, server: u32, epoch: u64) -> HourKey {
    HourKey {
        series: SeriesId(series),
        hour: Hour(hour),
        server: ServerId(server),
        epoch: Epoch(epoch),
    }
}

fn day_key(series: u32, day: u32, server: ServerId) -> DayKey {
    DayKey {
        series: SeriesId(series),
        day: Day(day),
        server,
    }
}

fn scan_all(store: &dyn Store, series: u32, hours: Range<u32>) -> Vec<(HourKey, StoredSketch)> {
    let mut out = Vec::new();
    store
        .scan_hourly(
            SeriesId(series),
            Hour(hours.start)..Hour(hours.end),
            &mut |k, s| {
                out.push((k, s.clone()));
                true
            },
        )
        .unwrap();
    out
}

fn rollups(store: &dyn Store, series: u32, days: Range<u32>) -> Vec<(DayKey, Vec<u8>)> {
    let mut out = Vec::new();
    store
        .scan_rollups(
            SeriesId(series),
            Day(days.start)..Day(days.end),
            &mut |k, s| {
                out.push((k, s.to_vec()));
                true
            },
        )
        .unwrap();
    out
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---- the shared suite ------------------------------------------------------------------

fn upsert_by_version(store: &dyn Store) {
    let k = key(1, 100, 1, 1);
    assert_eq!(
        store.put_hourly(&[(k, 2, sketch(2).into())]).unwrap(),
        [PutOutcome::Stored]
    );
    // Older and equal versions are stale and change nothing.
    assert_eq!(
        store.put_hourly(&[(k, 1, sketch(1).into())]).unwrap(),
        [PutOutcome::Stale { held: 2 }]
    );
    assert_eq!(
        store.put_hourly(&[(k, 2, sketch(99).into())]).unwrap(),
        [PutOutcome::Stale { held: 2 }]
    );
    assert_eq!(scan_all(store, 1, 100..101)[0].1.sketch, sketch(2));
    // Newer replaces.
    assert_eq!(
        store.put_hourly(&[(k, 3, sketch(3).into())]).unwrap(),
        [PutOutcome::Stored]
    );
    assert_eq!(
        scan_all(store, 1, 100..101),
        [(
            k,
            StoredSketch {
                version: 3,
                sketch: sketch(3)
            }
        )]
    );
    // The same key twice in one batch: the later entry competes with the earlier one.
    let k2 = key(1, 100, 2, 1);
    assert_eq!(
        store
            .put_hourly(&[
                (k2, 5, sketch(5).into()),
                (k2, 5, sketch(5).into()),
                (k2, 4, sketch(4).into()),
                (k2, 6, sketch(6).into())
            ])
            .unwrap(),
        [
            PutOutcome::Stored,
            PutOutcome::Stale { held: 5 },
            PutOutcome::Stale { held: 5 },
            PutOutcome::Stored
        ]
    );
    assert_eq!(scan_all(store, 1, 100..101)[1].1.version, 6);
    // An empty batch is a no-op.
    assert_eq!(store.put_hourly(&[]).unwrap(), []);
}

fn hourly_versions_read_each_key_alone(store: &dyn Store) {
    // Several servers and epochs at one (series, hour), one key written twice.
    store
        .put_hourly(&[
            (key(1, 100, 1, 1), 4, sketch(4).into()),
            (key(1, 100, 2, 1), 7, sketch(7).into()),
            (key(1, 100, 2, 2), 9, sketch(9).into()),
            (key(1, 101, 2, 1), 3, sketch(3).into()),
        ])
        .unwrap();
    store
        .put_hourly(&[(key(1, 100, 2, 1), 8, sketch(8).into())])
        .unwrap();
    let asked = [
        key(1, 100, 2, 1), // rewritten: the newest version
        key(1, 100, 3, 1), // another server: nothing
        key(1, 100, 2, 2),
        key(1, 101, 2, 1),
        key(1, 100, 2, 3), // another epoch: nothing
        key(2, 100, 2, 1), // another series: nothing
        key(1, 100, 1, 1),
    ];
    assert_eq!(
        store.hourly_versions(&asked).unwrap(),
        [Some(8), None, Some(9), Some(3), None, None, Some(4)]
    );
    assert_eq!(store.hourly_versions(&[]).unwrap(), []);
}

fn reordering_and_duplicates_are_harmless(store: &dyn Store) {
    // Every order of the same pushes, with retries, ends in the newest snapshot.
    let orders: [&[u64]; 4] = [
        &[1, 2, 3, 4],
        &[4, 3, 2, 1],
        &[2, 4, 4, 1, 3, 2],
        &[3, 1, 3, 4, 2, 4],
    ];
    for (server, order) in orders.iter().enumerate() {
        let k = key(2, 7, server as u32 + 1, 1);
        for &version in *order {
            store
                .put_hourly(&[(k, version, sketch(version).into())])
                .unwrap();
        }
    }
    let rows = scan_all(store, 2, 0..100);
    assert_eq!(rows.len(), orders.len());
    for (_, stored) in rows {
        assert_eq!(
            stored,
            StoredSketch {
                version: 4,
                sketch: sketch(4)
            }
        );
    }
}

fn scan_selects_series_and_hours_in_key_order(store: &dyn Store) {
    let mut batch = Vec::new();
    for series in [3, 4, 5] {
        for hour in [9, 10, 11, 12] {
            for server in [2, 1] {
                for epoch in [1, 0] {
                    batch.push((
                        key(series, hour, server, epoch),
                        1,
                        sketch(u64::from(hour)).into(),
                    ));
                }
            }
        }
    }
    // Also the extremes of every field, which must not leak into neighbouring ranges.
    batch.push((key(4, 12, u32::MAX - 1, u64::MAX), 1, sketch(0).into()));
    batch.push((key(4, 13, 0, 0), 1, sketch(0).into()));
    batch.push((key(4, 9, 0, 0), 1, sketch(0).into()));
    store.put_hourly(&batch).unwrap();

    let got: Vec<HourKey> = scan_all(store, 4, 10..13)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let mut want: Vec<HourKey> = batch
        .iter()
        .map(|(k, _, _)| *k)
        .filter(|k| k.series == SeriesId(4) && (10..13).contains(&k.hour.0))
        .collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(got.len(), 3 * 4 + 1);

    // One hour: the prefix-mode path of RocksStore.
    let one: Vec<HourKey> = scan_all(store, 4, 9..10)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        one,
        [
            key(4, 9, 0, 0),
            key(4, 9, 1, 0),
            key(4, 9, 1, 1),
            key(4, 9, 2, 0),
            key(4, 9, 2, 1)
        ]
    );

    // The visitor stops the scan.
    let mut seen = 0;
    store
        .scan_hourly(SeriesId(4), Hour(0)..Hour(100), &mut |_, _| {
            seen += 1;
            seen < 3
        })
        .unwrap();
    assert_eq!(seen, 3);

    // Empty, reversed and unknown ranges select nothing.
    assert!(scan_all(store, 4, 11..11).is_empty());
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = scan_all(store, 4, 12..10);
    assert!(reversed.is_empty());
    assert!(scan_all(store, 6, 0..u32::MAX).is_empty());
    assert!(scan_all(store, 4, 14..u32::MAX).is_empty());
}

fn rollups_put_get_scan(store: &dyn Store) {
    assert_eq!(store.get_rollup(day_key(1, 5, ServerId(1))).unwrap(), None);
    for day in [4, 5, 6] {
        for server in [ServerId::ALL, ServerId(2), ServerId(1)] {
            store
                .put_rollup(day_key(1, day, server), sketch(u64::from(day)))
                .unwrap();
        }
    }
    store
        .put_rollup(day_key(2, 5, ServerId::ALL), sketch(9))
        .unwrap();
    assert_eq!(
        store.get_rollup(day_key(1, 5, ServerId::ALL)).unwrap(),
        Some(sketch(5))
    );
    // A rebuilt rollup replaces the old one.
    store
        .put_rollup(day_key(1, 5, ServerId::ALL), sketch(50))
        .unwrap();
    assert_eq!(
        store.get_rollup(day_key(1, 5, ServerId::ALL)).unwrap(),
        Some(sketch(50))
    );
    let keys: Vec<DayKey> = rollups(store, 1, 5..7)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        keys,
        [
            day_key(1, 5, ServerId(1)),
            day_key(1, 5, ServerId(2)),
            day_key(1, 5, ServerId::ALL),
            day_key(1, 6, ServerId(1)),
            day_key(1, 6, ServerId(2)),
            day_key(1, 6, ServerId::ALL),
        ]
    );
    assert_eq!(rollups(store, 2, 0..100).len(), 1);
    assert!(rollups(store, 3, 0..100).is_empty());
}

fn a_copied_day_replaces_its_rollups_and_is_expired(store: &dyn Store) {
    for server in [ServerId(1), ServerId::ALL] {
        store.put_rollup(day_key(1, 5, server), sketch(1)).unwrap();
    }
    store
        .put_rollup(day_key(1, 6, ServerId::ALL), sketch(6))
        .unwrap();
    assert!(!store.is_day_expired(SeriesId(1), Day(5)).unwrap());
    let copied = vec![
        (day_key(1, 5, ServerId(2)), sketch(2)),
        (day_key(1, 5, ServerId::ALL), sketch(3)),
    ];
    store
        .put_copied_day(SeriesId(1), Day(5), copied.clone())
        .unwrap();
    // The day's old rollups are gone (server 1's too), the next day's untouched.
    assert_eq!(rollups(store, 1, 5..6), copied);
    assert_eq!(rollups(store, 1, 6..7).len(), 1);
    assert!(store.is_day_expired(SeriesId(1), Day(5)).unwrap());
    assert!(!store.is_day_expired(SeriesId(1), Day(6)).unwrap());
    // Its hours copied back: no longer expired, its rollups left for the builder.
    store.unexpire_day(SeriesId(1), Day(5)).unwrap();
    assert!(!store.is_day_expired(SeriesId(1), Day(5)).unwrap());
    assert_eq!(rollups(store, 1, 5..6), copied);
    // A bad frame writes nothing.
    let bad = vec![(day_key(1, 7, ServerId::ALL), b"not a sketch".to_vec())];
    assert!(matches!(
        store.put_copied_day(SeriesId(1), Day(7), bad),
        Err(StoreError::InvalidSketch { .. })
    ));
    assert!(!store.is_day_expired(SeriesId(1), Day(7)).unwrap());
}

fn invalid_sketches_are_refused(store: &dyn Store) {
    let good = (key(1, 1, 1, 1), 1, sketch(1).into());
    let mut corrupt = sketch(2);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 1;
    let err = store
        .put_hourly(&[good.clone(), (key(1, 2, 1, 1), 1, corrupt.into())])
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidSketch { .. }), "{err}");
    assert!(err.to_string().contains("entry 1"), "{err}");
    // Nothing of the batch was written, not even its valid entry.
    assert!(scan_all(store, 1, 0..10).is_empty());
    assert!(dirty(store, u32::MAX, 10).is_empty());
    let err = store
        .put_rollup(day_key(1, 1, ServerId::ALL), b"not a sketch".to_vec())
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidSketch { .. }), "{err}");
}

/// No (series, day) kept from hourly retention.
fn none() -> BTreeSet<(SeriesId, Day)> {
    BTreeSet::new()
}

fn retention_deletes_exactly_what_is_older(store: &dyn Store) {
    let mut batch = Vec::new();
    // Hours 20..24 are day 0, 24..30 day 1.
    for series in [1, 2, 3] {
        for hour in 20..30 {
            batch.push((key(series, hour, 1, 0), 1, sketch(1).into()));
            batch.push((key(series, hour, 2, 7), 1, sketch(1).into()));
        }
    }
    // A series with only new data, and ones with only old data.
    batch.push((key(4, 50, 1, 0), 1, sketch(1).into()));
    batch.push((key(5, 3, 1, 0), 1, sketch(1).into()));
    batch.push((key(u32::MAX, 3, 1, 0), 1, sketch(1).into()));
    store.put_hourly(&batch).unwrap();

    assert_eq!(store.delete_hourly_before(Day(0), &none()).unwrap(), 0);
    // Whole days, except the ones kept.
    let keep = BTreeSet::from([(SeriesId(2), Day(0))]);
    assert_eq!(
        store.delete_hourly_before(Day(1), &keep).unwrap(),
        2 * 4 * 2 + 2
    );
    // Idempotent: nothing left to delete.
    assert_eq!(store.delete_hourly_before(Day(1), &keep).unwrap(), 0);
    let hours = |series| -> Vec<u32> {
        scan_all(store, series, 0..100)
            .into_iter()
            .map(|(k, _)| k.hour.0)
            .collect()
    };
    for series in [1, 3] {
        assert_eq!(
            hours(series),
            [24, 24, 25, 25, 26, 26, 27, 27, 28, 28, 29, 29]
        );
    }
    assert_eq!(hours(2).len(), 20, "the kept day stays whole");
    assert_eq!(hours(4), [50]);
    assert!(hours(5).is_empty());
    assert!(store.is_day_expired(SeriesId(1), Day(0)).unwrap());
    assert!(store.is_day_expired(SeriesId(5), Day(0)).unwrap());
    assert!(!store.is_day_expired(SeriesId(2), Day(0)).unwrap());
    assert!(!store.is_day_expired(SeriesId(1), Day(1)).unwrap());
    // Once no longer kept, it goes too.
    assert_eq!(store.delete_hourly_before(Day(1), &none()).unwrap(), 8);
    assert!(store.is_day_expired(SeriesId(2), Day(0)).unwrap());
    // A late snapshot for an expired day can be written again (the collector refuses
    // them; the store does not ban them).
    store
        .put_hourly(&[(key(1, 22, 1, 0), 1, sketch(1).into())])
        .unwrap();
    assert_eq!(scan_all(store, 1, 0..24).len(), 1);

    for day in 0..5 {
        store
            .put_rollup(day_key(1, day, ServerId(1)), sketch(1))
            .unwrap();
        store
            .put_rollup(day_key(1, day, ServerId::ALL), sketch(1))
            .unwrap();
        store
            .put_rollup(day_key(2, day, ServerId::ALL), sketch(1))
            .unwrap();
    }
    store.mark_day_dirty(SeriesId(1), Day(1)).unwrap();
    store.mark_day_dirty(SeriesId(1), Day(3)).unwrap();
    assert_eq!(store.delete_rollups_before(Day(3)).unwrap(), 9);
    assert_eq!(store.delete_rollups_before(Day(3)).unwrap(), 0);
    let days: Vec<u32> = rollups(store, 1, 0..100)
        .into_iter()
        .map(|(k, _)| k.day.0)
        .collect();
    assert_eq!(days, [3, 3, 4, 4]);
    assert_eq!(rollups(store, 2, 0..100).len(), 2);
    // Dirty marks of expired days went with them.
    let marks = dirty(store, 3, 100);
    assert!(marks.iter().all(|(_, day)| *day >= Day(3)), "{marks:?}");
    assert!(!dirty(store, u32::MAX, 100).contains(&(SeriesId(1), Day(1))));
    // So did every hourly row and expiry record of those days.
    assert!(hours(1).is_empty() && hours(2).is_empty());
    assert!(!store.is_day_expired(SeriesId(1), Day(0)).unwrap());
}

fn a_day_that_cannot_be_built_is_recorded_until_rebuilt(store: &dyn Store) {
    store
        .put_hourly(&[(key(1, 30, 1, 0), 1, sketch(1).into())])
        .unwrap();
    store
        .put_rollup(day_key(1, 1, ServerId::ALL), sketch(1))
        .unwrap();
    let mark = store.dirty_days(Day(5), 10).unwrap()[0];
    assert!(
        store
            .mark_day_conflict(mark.series, mark.day, mark.mark, "precision differs")
            .unwrap()
    );
    assert!(
        !store.is_day_dirty(SeriesId(1), Day(1)).unwrap(),
        "not retried"
    );
    assert!(
        rollups(store, 1, 0..5).is_empty(),
        "its old rollups are gone"
    );
    assert_eq!(
        store.day_conflicts().unwrap(),
        vec![DayConflict {
            series: SeriesId(1),
            day: Day(1),
            reason: "precision differs".into()
        }]
    );
    // A new snapshot makes it dirty again; a rebuild that succeeds clears the record.
    store
        .put_hourly(&[(key(1, 31, 1, 0), 1, sketch(1).into())])
        .unwrap();
    let mark = store.dirty_days(Day(5), 10).unwrap()[0];
    let built = vec![(day_key(1, 1, ServerId::ALL), sketch(2))];
    assert!(
        store
            .replace_rollups(mark.series, mark.day, built, mark.mark)
            .unwrap()
    );
    assert!(store.day_conflicts().unwrap().is_empty());
    // Rollup retention removes conflict records of the days it deletes.
    let mark = {
        store.mark_day_dirty(SeriesId(2), Day(2)).unwrap();
        store.dirty_days(Day(5), 10).unwrap()[0]
    };
    store
        .mark_day_conflict(mark.series, mark.day, mark.mark, "x")
        .unwrap();
    assert_eq!(store.day_conflicts().unwrap().len(), 1);
    store.delete_rollups_before(Day(3)).unwrap();
    assert!(store.day_conflicts().unwrap().is_empty());
}

fn liveness_outlives_hourly_retention(store: &dyn Store) {
    let hours: Vec<Hour> = [3, 4, 5, 9, 30].into_iter().map(Hour).collect();
    store.mark_live(ServerId(1), &hours).unwrap();
    store.mark_live(ServerId(2), &[Hour(50)]).unwrap();
    assert_eq!(
        store.live_span(ServerId(1)).unwrap(),
        Some(Hour(3)..Hour(31))
    );
    store.delete_hourly_before(Day(1), &none()).unwrap();
    // Day 0 is summarised: the same counts, the same span.
    assert_eq!(store.live_hours(ServerId(1), Hour(0)..Hour(24)).unwrap(), 4);
    assert_eq!(store.live_hours(ServerId(1), Hour(4)..Hour(10)).unwrap(), 3);
    assert_eq!(store.live_hours(ServerId(1), Hour(9)..Hour(31)).unwrap(), 2);
    assert_eq!(
        store.live_span(ServerId(1)).unwrap(),
        Some(Hour(3)..Hour(31))
    );
    // A second summary of the same day merges; an hour both recorded and summarised
    // counts once.
    store.mark_live(ServerId(1), &[Hour(4), Hour(6)]).unwrap();
    assert_eq!(store.live_hours(ServerId(1), Hour(0)..Hour(24)).unwrap(), 5);
    store.delete_hourly_before(Day(1), &none()).unwrap();
    assert_eq!(store.live_hours(ServerId(1), Hour(0)..Hour(24)).unwrap(), 5);
    assert_eq!(
        store.live_span(ServerId(2)).unwrap(),
        Some(Hour(50)..Hour(51))
    );
    assert_eq!(store.live_span(ServerId(3)).unwrap(), None);
    // Rollup retention ends it.
    store.delete_rollups_before(Day(1)).unwrap();
    assert_eq!(store.live_hours(ServerId(1), Hour(0)..Hour(24)).unwrap(), 0);
    assert_eq!(
        store.live_span(ServerId(1)).unwrap(),
        Some(Hour(30)..Hour(31))
    );
}

/// The dirty (series, day) pairs before `before`, without building them.
fn dirty(store: &dyn Store, before: u32, limit: usize) -> Vec<(SeriesId, Day)> {
    store
        .dirty_days(Day(before), limit)
        .unwrap()
        .into_iter()
        .map(|d| (d.series, d.day))
        .collect()
}

/// Lists dirty days and marks each built (with no rollups), as a rollup pass would.
fn take(store: &dyn Store, before: u32, limit: usize) -> Vec<(SeriesId, Day)> {
    let marks = store.dirty_days(Day(before), limit).unwrap();
    for d in &marks {
        assert!(
            store
                .replace_rollups(d.series, d.day, Vec::new(), d.mark)
                .unwrap()
        );
    }
    marks.into_iter().map(|d| (d.series, d.day)).collect()
}

fn a_rebuild_that_races_a_write_leaves_the_day_dirty(store: &dyn Store) {
    store
        .put_hourly(&[(key(1, 5, 1, 0), 1, sketch(1).into())])
        .unwrap();
    assert!(store.is_day_dirty(SeriesId(1), Day(0)).unwrap());
    let marks = store.dirty_days(Day(1), 10).unwrap();
    assert_eq!(marks.len(), 1);
    // A snapshot lands while the builder reads the hours...
    store
        .put_hourly(&[(key(1, 6, 1, 0), 1, sketch(2).into())])
        .unwrap();
    // ...so the rollup it writes is already old: the day must stay dirty.
    let rollup = vec![(day_key(1, 0, ServerId::ALL), sketch(1))];
    assert!(
        !store
            .replace_rollups(SeriesId(1), Day(0), rollup, marks[0].mark)
            .unwrap()
    );
    assert!(store.is_day_dirty(SeriesId(1), Day(0)).unwrap());
    assert_eq!(dirty(store, 1, 10), [(SeriesId(1), Day(0))]);
    // The next pass catches up, and replaces the old rollups rather than adding to them.
    let marks = store.dirty_days(Day(1), 10).unwrap();
    let rollup = vec![(day_key(1, 0, ServerId(1)), sketch(3))];
    assert!(
        store
            .replace_rollups(SeriesId(1), Day(0), rollup, marks[0].mark)
            .unwrap()
    );
    assert!(!store.is_day_dirty(SeriesId(1), Day(0)).unwrap());
    assert_eq!(
        rollups(store, 1, 0..1),
        [(day_key(1, 0, ServerId(1)), sketch(3))]
    );
    // A day never written is not dirty.
    assert!(!store.is_day_dirty(SeriesId(1), Day(7)).unwrap());
}

fn liveness_counts_hours(store: &dyn Store) {
    let hours: Vec<Hour> = [3, 4, 5, 9, 9].into_iter().map(Hour).collect();
    store.mark_live(ServerId(1), &hours).unwrap();
    store.mark_live(ServerId(2), &[Hour(4)]).unwrap();
    assert_eq!(store.live_hours(ServerId(1), Hour(0)..Hour(24)).unwrap(), 4);
    assert_eq!(store.live_hours(ServerId(1), Hour(4)..Hour(9)).unwrap(), 2);
    assert_eq!(store.live_hours(ServerId(2), Hour(0)..Hour(24)).unwrap(), 1);
    assert_eq!(store.live_hours(ServerId(3), Hour(0)..Hour(24)).unwrap(), 0);
    assert_eq!(store.live_hours(ServerId(1), Hour(5)..Hour(5)).unwrap(), 0);
}

fn a_push_writes_liveness_and_snapshots_together(store: &dyn Store) {
    let live = [Hour(30), Hour(31)];
    let outcomes = store
        .put_push(
            Some((ServerId(1), &live)),
            &[
                (key(1, 30, 1, 0), 1, sketch(1).into()),
                (key(1, 31, 1, 0), 1, sketch(2).into()),
            ],
        )
        .unwrap();
    assert_eq!(outcomes, vec![PutOutcome::Stored; 2]);
    assert_eq!(store.live_hours(ServerId(1), Hour(0)..Hour(48)).unwrap(), 2);
    assert_eq!(scan_all(store, 1, 0..48).len(), 2);
    // One bad sketch fails the whole push before anything, liveness included, is written.
    let e = store
        .put_push(
            Some((ServerId(2), &live)),
            &[
                (key(1, 30, 2, 0), 1, sketch(1).into()),
                (key(1, 31, 2, 0), 1, vec![1, 2, 3].into()),
            ],
        )
        .unwrap_err();
    assert!(matches!(e, StoreError::InvalidSketch { .. }), "{e}");
    assert_eq!(store.live_hours(ServerId(2), Hour(0)..Hour(48)).unwrap(), 0);
    assert_eq!(scan_all(store, 1, 0..48).len(), 2);
}

fn the_server_series_index_follows_writes_and_retention(store: &dyn Store) {
    // Server 1: series 1 on days 0 and 2, series 2 on day 1; server 2: series 3 on day 2.
    store
        .put_hourly(&[
            (key(1, 5, 1, 0), 1, sketch(1).into()),
            (key(1, 50, 1, 0), 1, sketch(1).into()),
            (key(2, 30, 1, 0), 1, sketch(1).into()),
            (key(3, 49, 2, 0), 1, sketch(1).into()),
        ])
        .unwrap();
    // A stale write changes nothing.
    store
        .put_hourly(&[(key(2, 30, 1, 0), 1, sketch(2).into())])
        .unwrap();
    let index = |server, since| store.server_series(ServerId(server), Day(since)).unwrap();
    assert_eq!(
        index(1, 0),
        vec![(SeriesId(1), Day(2)), (SeriesId(2), Day(1))]
    );
    assert_eq!(index(1, 2), vec![(SeriesId(1), Day(2))]);
    assert_eq!(index(2, 0), vec![(SeriesId(3), Day(2))]);
    assert_eq!(index(3, 0), vec![]);
    // Retention from hour 40 (day 1) drops day 0's entries and keeps day 1's.
    store.delete_hourly_before(Day(1), &none()).unwrap();
    assert_eq!(
        index(1, 0),
        vec![(SeriesId(1), Day(2)), (SeriesId(2), Day(1))]
    );
    store.delete_hourly_before(Day(2), &none()).unwrap();
    assert_eq!(index(1, 0), vec![(SeriesId(1), Day(2))]);
}

fn dirty_days_follow_writes(store: &dyn Store) {
    // Hours 23 and 24 are on days 0 and 1.
    store
        .put_hourly(&[
            (key(1, 23, 1, 0), 1, sketch(1).into()),
            (key(1, 24, 1, 0), 1, sketch(1).into()),
            (key(2, 47, 1, 0), 1, sketch(1).into()),
            (key(1, 49, 1, 0), 1, sketch(1).into()),
        ])
        .unwrap();
    // Day 2 is still open: it stays marked.
    assert_eq!(
        take(store, 2, 100),
        [
            (SeriesId(1), Day(0)),
            (SeriesId(1), Day(1)),
            (SeriesId(2), Day(1))
        ]
    );
    assert!(take(store, 2, 100).is_empty());
    // A stale write changes nothing, so it marks nothing.
    store
        .put_hourly(&[(key(1, 23, 1, 0), 1, sketch(1).into())])
        .unwrap();
    assert!(take(store, 2, 100).is_empty());
    // A late, newer snapshot of a closed day marks it again.
    store
        .put_hourly(&[(key(1, 23, 1, 0), 2, sketch(2).into())])
        .unwrap();
    store.mark_day_dirty(SeriesId(3), Day(0)).unwrap();
    store.mark_day_dirty(SeriesId(3), Day(0)).unwrap();
    assert_eq!(take(store, 2, 1), [(SeriesId(1), Day(0))]);
    assert_eq!(take(store, 2, 100), [(SeriesId(3), Day(0))]);
    assert_eq!(take(store, 3, 100), [(SeriesId(1), Day(2))]);
    assert!(take(store, 2, 0).is_empty());
}

fn series_dictionary_is_stable(store: &dyn Store) {
    let visitors = SeriesName::new(
        "visitors",
        labels(&[("device", "mobile"), ("country", "de")]),
        Kind::Distinct,
    );
    assert_eq!(store.series_id(&visitors).unwrap(), None);
    let id = store.series_id_or_create(&visitors).unwrap();
    assert_eq!(store.series_id_or_create(&visitors).unwrap(), id);
    assert_eq!(store.series_id(&visitors).unwrap(), Some(id));
    // Tags in another order name the same series.
    let unsorted = SeriesName {
        metric: "visitors".into(),
        tags: labels(&[("device", "mobile"), ("country", "de")]),
        kind: Kind::Distinct,
    };
    assert_eq!(store.series_id(&unsorted).unwrap(), Some(id));
    // Another kind, other tags, or a metric whose name runs into the tags are others.
    let frequency = SeriesName {
        kind: Kind::Frequency,
        ..visitors.clone()
    };
    let fewer_tags = SeriesName::new("visitors", labels(&[("country", "de")]), Kind::Distinct);
    let tricky = SeriesName::new("visitorsa", vec![], Kind::Distinct);
    let ids: Vec<SeriesId> = [&frequency, &fewer_tags, &tricky]
        .iter()
        .map(|s| store.series_id_or_create(s).unwrap())
        .collect();
    let mut all = vec![id];
    all.extend(&ids);
    let mut distinct = all.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{all:?}");
    assert!(all.iter().all(|id| id.0 != 0 && id.0 != u32::MAX));

    let listed = store.list_series().unwrap();
    assert_eq!(
        listed,
        vec![
            (id, visitors.clone()),
            (ids[0], frequency),
            (ids[1], fewer_tags),
            (ids[2], tricky)
        ]
    );
}

fn server_registry_updates_labels(store: &dyn Store) {
    let eu = labels(&[("role", "web"), ("region", "eu")]);
    assert_eq!(store.server_id("web-1").unwrap(), None);
    let web1 = store.register_server("web-1", &eu).unwrap();
    let web2 = store.register_server("web-2", &[]).unwrap();
    assert_ne!(web1, web2);
    assert_ne!(web1, ServerId::ALL);
    assert_eq!(store.register_server("web-1", &eu).unwrap(), web1);
    // A lookup ignores labels and changes nothing.
    assert_eq!(store.server_id("web-1").unwrap(), Some(web1));
    assert_eq!(
        store.list_servers().unwrap(),
        [
            ServerEntry {
                id: web1,
                name: "web-1".into(),
                labels: labels(&[("region", "eu"), ("role", "web")]),
            },
            ServerEntry {
                id: web2,
                name: "web-2".into(),
                labels: vec![],
            },
        ]
    );
    // Registering again with new labels replaces them and keeps the id.
    let us = labels(&[("region", "us")]);
    assert_eq!(store.register_server("web-1", &us).unwrap(), web1);
    assert_eq!(store.list_servers().unwrap()[0].labels, us);
}

fn concurrent_writers_keep_the_newest(store: Arc<dyn Store>) {
    // Four writers push versions 1..=50 of the same keys in different orders; whatever
    // the interleaving, each key ends with version 50 and nothing errs.
    let keys: Vec<HourKey> = (0..8).map(|i| key(9, 1, i % 2 + 1, u64::from(i))).collect();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let store = Arc::clone(&store);
            let keys = keys.clone();
            std::thread::spawn(move || {
                for step in 0..50u64 {
                    let version = if t % 2 == 0 { step + 1 } else { 50 - step };
                    let batch: Vec<_> = keys
                        .iter()
                        .map(|k| (*k, version, sketch(version).into()))
                        .collect();
                    store.put_hourly(&batch).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let rows = scan_all(store.as_ref(), 9, 0..10);
    assert_eq!(rows.len(), keys.len());
    assert!(
        rows.iter()
            .all(|(_, s)| s.version == 50 && s.sketch == sketch(50))
    );
}

/// The suite as tests, for a store made by `$make`: a pair of a guard that must outlive the
/// store (its temporary directory) and the store.
/// Cluster mode's stream positions: one per subject (the live subject is `u32::MAX`),
/// each replaced whole, none before it is recorded.
fn stream_positions_round_trip(store: &dyn Store) {
    assert_eq!(store.stream_position(3).unwrap(), None);
    let first = StreamPosition {
        stream: "HOURGLASS@1700000000000000001".into(),
        consumer: "apply-agg-1-00000000000000ab-p3@1700000000123456789".into(),
        delivered: 17,
        applied: 1234,
    };
    store.put_stream_position(3, &first).unwrap();
    let live = StreamPosition {
        stream: String::new(),
        consumer: String::new(),
        delivered: 0,
        applied: u64::MAX,
    };
    store.put_stream_position(u32::MAX, &live).unwrap();
    assert_eq!(store.stream_position(3).unwrap(), Some(first.clone()));
    assert_eq!(store.stream_position(u32::MAX).unwrap(), Some(live));
    assert_eq!(store.stream_position(4).unwrap(), None);
    // A new consumer instance: its own deliveries, the applied position kept.
    let second = StreamPosition {
        stream: "HOURGLASS@1700000000000000001".into(),
        consumer: "apply-agg-1-00000000000000ab-p3@1700000099000000000".into(),
        delivered: 0,
        applied: 1234,
    };
    store.put_stream_position(3, &second).unwrap();
    assert_eq!(store.stream_position(3).unwrap(), Some(second));
}

macro_rules! store_suite {
    ($make:expr) => {
        #[test]
        fn upsert_by_version() {
            let (_dir, store) = $make;
            super::upsert_by_version(&*store);
        }
        #[test]
        fn hourly_versions_read_each_key_alone() {
            let (_dir, store) = $make;
            super::hourly_versions_read_each_key_alone(&*store);
        }
        #[test]
        fn reordering_and_duplicates_are_harmless() {
            let (_dir, store) = $make;
            super::reordering_and_duplicates_are_harmless(&*store);
        }
        #[test]
        fn scan_selects_series_and_hours_in_key_order() {
            let (_dir, store) = $make;
            super::scan_selects_series_and_hours_in_key_order(&*store);
        }
        #[test]
        fn rollups_put_get_scan() {
            let (_dir, store) = $make;
            super::rollups_put_get_scan(&*store);
        }
        #[test]
        fn a_copied_day_replaces_its_rollups_and_is_expired() {
            let (_dir, store) = $make;
            super::a_copied_day_replaces_its_rollups_and_is_expired(&*store);
        }
        #[test]
        fn invalid_sketches_are_refused() {
            let (_dir, store) = $make;
            super::invalid_sketches_are_refused(&*store);
        }
        #[test]
        fn retention_deletes_exactly_what_is_older() {
            let (_dir, store) = $make;
            super::retention_deletes_exactly_what_is_older(&*store);
        }
        #[test]
        fn a_day_that_cannot_be_built_is_recorded_until_rebuilt() {
            let (_dir, store) = $make;
            super::a_day_that_cannot_be_built_is_recorded_until_rebuilt(&*store);
        }
        #[test]
        fn liveness_outlives_hourly_retention() {
            let (_dir, store) = $make;
            super::liveness_outlives_hourly_retention(&*store);
        }
        #[test]
        fn dirty_days_follow_writes() {
            let (_dir, store) = $make;
            super::dirty_days_follow_writes(&*store);
        }
        #[test]
        fn a_rebuild_that_races_a_write_leaves_the_day_dirty() {
            let (_dir, store) = $make;
            super::a_rebuild_that_races_a_write_leaves_the_day_dirty(&*store);
        }
        #[test]
        fn liveness_counts_hours() {
            let (_dir, store) = $make;
            super::liveness_counts_hours(&*store);
        }
        #[test]
        fn a_push_writes_liveness_and_snapshots_together() {
            let (_dir, store) = $make;
            super::a_push_writes_liveness_and_snapshots_together(&*store);
        }
        #[test]
        fn the_server_series_index_follows_writes_and_retention() {
            let (_dir, store) = $make;
            super::the_server_series_index_follows_writes_and_retention(&*store);
        }
        #[test]
        fn series_dictionary_is_stable() {
            let (_dir, store) = $make;
            super::series_dictionary_is_stable(&*store);
        }
        #[test]
        fn server_registry_updates_labels() {
            let (_dir, store) = $make;
            super::server_registry_updates_labels(&*store);
        }
        #[test]
        fn stream_positions_round_trip() {
            let (_dir, store) = $make;
            super::stream_positions_round_trip(&*store);
        }
        #[test]
        fn concurrent_writers_keep_the_newest() {
            // Declared after the directory, so dropped (closed) before it.
            let (_dir, store) = $make;
            super::concurrent_writers_keep_the_newest(store);
        }
    };
}

mod memory {
    use super::*;

    store_suite!(((), Arc::new(MemoryStore::new()) as Arc<dyn Store>));
}

mod rocks {
    use super::super::rocks::testing::{get_raw, put_raw};
    use super::*;
    use tempfile::TempDir;

    fn options() -> StoreOptions {
        StoreOptions {
            block_cache_bytes: 8 << 20,
            ..StoreOptions::default()
        }
    }

    /// A store in a temporary directory, and the directory, which must outlive it.
    fn temp_store() -> (TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        // A subdirectory: `open` creates what is missing.
        let store = RocksStore::open(dir.path().join("db"), &options()).unwrap();
        (dir, Arc::new(store))
    }

    store_suite!(temp_store());

    /// The live hours the RocksDB store keeps in memory (rocks/live.rs) answer like the
    /// reference store through a seeded mix of live writes (pushes, index records, marks)
    /// and both retentions, with questions between them so that servers are loaded at
    /// every stage; and like the store reopened (read from disk alone) at the end.
    #[test]
    fn live_hours_in_memory_answer_like_the_records() {
        let dir = tempfile::tempdir().unwrap();
        let rocks = RocksStore::open(dir.path(), &options()).unwrap();
        let reference = MemoryStore::new();
        let mut seed = 0x1234_5678_u64;
        let mut next = |n: u32| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) % u64::from(n)) as u32
        };
        let ask = |rocks: &RocksStore, why: &str| {
            for server in 1..=3 {
                let id = ServerId(server);
                assert_eq!(
                    rocks.live_span(id).unwrap(),
                    reference.live_span(id).unwrap(),
                    "{why}: span of {id}"
                );
                for (a, b) in [(0, 24 * 12), (30, 31), (47, 100), (100, 250), (0, 1)] {
                    let hours = Hour(a)..Hour(b);
                    assert_eq!(
                        rocks.live_hours(id, hours.clone()).unwrap(),
                        reference.live_hours(id, hours.clone()).unwrap(),
                        "{why}: live hours of {id} in {hours:?}"
                    );
                }
            }
        };
        for step in 0..200u32 {
            let server = ServerId(1 + next(3));
            let hours: Vec<Hour> = (0..1 + next(4)).map(|_| Hour(next(24 * 12))).collect();
            let why = format!("step {step}");
            match next(10) {
                0..=3 => {
                    for store in [&rocks as &dyn Store, &reference] {
                        store.mark_live(server, &hours).unwrap();
                    }
                }
                4..=6 => {
                    let batch = [(
                        key(1, hours[0].0, server.0, 0),
                        u64::from(step) + 1,
                        sketch(1).into(),
                    )];
                    for store in [&rocks as &dyn Store, &reference] {
                        store.put_push(Some((server, &hours)), &batch).unwrap();
                    }
                }
                7 => {
                    for store in [&rocks as &dyn Store, &reference] {
                        store
                            .put_index(Some((server, &hours)), server, &[])
                            .unwrap();
                    }
                }
                8 => {
                    let day = Day(next(12));
                    for store in [&rocks as &dyn Store, &reference] {
                        store.delete_hourly_before(day, &BTreeSet::new()).unwrap();
                    }
                }
                _ => {
                    if next(4) == 0 {
                        let day = Day(next(6));
                        for store in [&rocks as &dyn Store, &reference] {
                            store.delete_rollups_before(day).unwrap();
                        }
                    }
                }
            }
            if next(3) == 0 {
                ask(&rocks, &why);
            }
        }
        ask(&rocks, "the end");
        drop(rocks);
        let reopened = RocksStore::open(dir.path(), &options()).unwrap();
        ask(&reopened, "reopened");
    }

    #[test]
    fn a_stale_resend_fills_in_an_index_written_before_the_index_existed() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path(), &options()).unwrap();
        let entry = || [(key(7, 30, 2, 0), 3, sketch(1).into())];
        store.put_hourly(&entry()).unwrap();
        super::super::rocks::testing::drop_server_series_index(&store);
        assert_eq!(store.server_series(ServerId(2), Day(0)).unwrap(), vec![]);
        // The agent resends what the store holds: stale, and now indexed.
        assert_eq!(
            store.put_hourly(&entry()).unwrap(),
            vec![PutOutcome::Stale { held: 3 }]
        );
        assert_eq!(
            store.server_series(ServerId(2), Day(0)).unwrap(),
            vec![(SeriesId(7), Day(1))]
        );
    }

    /// The same suite once more with every write flushed to SST files, so reads go
    /// through the block-based tables, their Bloom filters and range tombstones rather
    /// than only the memtable.
    mod flushed {
        use super::*;

        #[test]
        fn scans_and_retention_read_sst_files() {
            let dir = tempfile::tempdir().unwrap();
            let store = RocksStore::open(dir.path(), &options()).unwrap();
            let batch: Vec<_> = (0..48)
                .flat_map(|hour| {
                    (1..4).map(move |server| (key(1, hour, server, 0), 1, sketch(3).into()))
                })
                .collect();
            store.put_hourly(&batch).unwrap();
            store.flush().unwrap();
            assert_eq!(scan_all(&store, 1, 10..11).len(), 3);
            assert_eq!(scan_all(&store, 1, 10..20).len(), 30);
            assert_eq!(store.delete_hourly_before(Day(1), &none()).unwrap(), 72);
            store.flush().unwrap();
            assert_eq!(scan_all(&store, 1, 0..48).len(), 72);
            assert_eq!(store.delete_hourly_before(Day(1), &none()).unwrap(), 0);
            store.compact().unwrap();
            assert_eq!(scan_all(&store, 1, 0..48).len(), 72);
            let stats = store.stats().unwrap();
            let hourly = &stats.column_families[0];
            assert_eq!(hourly.name, "hourly");
            assert!(hourly.sst_bytes > 0, "{stats:?}");
            assert_eq!(stats.block_cache_capacity_bytes, 8 << 20);
            assert!(!stats.write_stopped);
        }
    }

    #[test]
    fn a_stream_position_survives_reopen_and_a_damaged_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let position = StreamPosition {
            stream: "HOURGLASS@1700000000000000001".into(),
            consumer: "apply-agg-1-00000000000000ab-live@1700000000123456789".into(),
            delivered: 9,
            applied: 40,
        };
        {
            let store = RocksStore::open(dir.path(), &options()).unwrap();
            store.put_stream_position(u32::MAX, &position).unwrap();
        }
        let store = RocksStore::open(dir.path(), &options()).unwrap();
        assert_eq!(store.stream_position(u32::MAX).unwrap(), Some(position));
        put_raw(&store, "meta", b"cluster/position/\0\0\0\x07", &[1, 2, 3]);
        let e = store.stream_position(7).unwrap_err();
        assert!(matches!(e, StoreError::BadValue { .. }), "{e}");
        // A stream name longer than the value holds.
        let mut long = vec![1u8];
        long.extend_from_slice(&[0; 16]);
        long.extend_from_slice(&500u16.to_be_bytes());
        long.extend_from_slice(b"HOURGLASS");
        put_raw(&store, "meta", b"cluster/position/\0\0\0\x08", &long);
        let e = store.stream_position(8).unwrap_err();
        assert!(e.to_string().contains("names a stream of 500 bytes"), "{e}");
        // The layout before positions named their stream reads with no stream, which
        // matches none: the node starts that subject over rather than trust it.
        let mut old = 40u64.to_be_bytes().to_vec();
        old.extend_from_slice(&9u64.to_be_bytes());
        old.extend_from_slice(b"apply-agg-1-p9@1");
        put_raw(&store, "meta", b"cluster/position/\0\0\0\x09", &old);
        let read = store.stream_position(9).unwrap().unwrap();
        assert_eq!(
            (read.stream.as_str(), read.applied, read.delivered),
            ("", 40, 9)
        );
        assert_eq!(read.consumer, "apply-agg-1-p9@1");
        // Arbitrary bytes never panic.
        for len in 0..40 {
            for fill in [0u8, 1, 0xff] {
                put_raw(
                    &store,
                    "meta",
                    b"cluster/position/\0\0\0\x0a",
                    &vec![fill; len],
                );
                let _ = store.stream_position(10);
            }
        }
    }

    #[test]
    fn data_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (series, server) = {
            let store = RocksStore::open(dir.path(), &options()).unwrap();
            let series = store
                .series_id_or_create(&SeriesName::new("hits", vec![], Kind::Frequency))
                .unwrap();
            let server = store
                .register_server("web-1", &labels(&[("region", "eu")]))
                .unwrap();
            store
                .put_hourly(&[(key(series.0, 5, server.0, 1), 3, sketch(3).into())])
                .unwrap();
            store
                .put_rollup(day_key(series.0, 0, ServerId::ALL), sketch(4))
                .unwrap();
            (series, server)
        };
        let store = RocksStore::open(dir.path(), &options()).unwrap();
        assert_eq!(
            scan_all(&store, series.0, 0..24),
            [(
                key(series.0, 5, server.0, 1),
                StoredSketch {
                    version: 3,
                    sketch: sketch(3)
                }
            )]
        );
        assert_eq!(
            store
                .get_rollup(day_key(series.0, 0, ServerId::ALL))
                .unwrap(),
            Some(sketch(4))
        );
        // Ids are stable, and the next new one does not reuse an old one.
        assert_eq!(
            store
                .series_id(&SeriesName::new("hits", vec![], Kind::Frequency))
                .unwrap(),
            Some(series)
        );
        let other = store
            .series_id_or_create(&SeriesName::new("hits", vec![], Kind::Membership))
            .unwrap();
        assert_ne!(other, series);
        assert_eq!(store.server_id("web-1").unwrap(), Some(server));
        assert_eq!(
            store.list_servers().unwrap()[0].labels,
            labels(&[("region", "eu")])
        );
        assert_eq!(super::dirty(&store, 1, 10), [(series, Day(0))]);
        // Versions held before the reopen still decide.
        assert_eq!(
            store
                .put_hourly(&[(key(series.0, 5, server.0, 1), 2, sketch(2).into())])
                .unwrap(),
            [PutOutcome::Stale { held: 3 }]
        );
    }

    #[test]
    fn a_second_open_of_the_same_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = RocksStore::open(dir.path(), &options()).unwrap();
        let err = RocksStore::open(dir.path(), &options()).unwrap_err();
        assert!(matches!(err, StoreError::InUse { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "data dir {} is in use by another process",
                dir.path().display()
            )),
            "{message}"
        );
    }

    #[test]
    fn another_schema_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = RocksStore::open(dir.path(), &options()).unwrap();
            put_raw(&store, "meta", b"schema_version", &3u32.to_be_bytes());
        }
        let err = RocksStore::open(dir.path(), &options()).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::SchemaVersion {
                    found: 3,
                    supported: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .ends_with("was written by schema version 3, this build reads 2"),
            "{err}"
        );
    }

    /// A dense UltraLogLog at precision 13 (an 8 KiB register array): what most hourly
    /// values of a busy series are.
    fn dense_sketch(seed: u64) -> Vec<u8> {
        let mut ull = hourglass_sketch::ull::Ull::new(13).unwrap();
        for i in 0..5_000u64 {
            ull.insert(&(i ^ (seed << 32)).to_le_bytes());
        }
        assert!(!ull.is_sparse());
        hourglass_sketch::Sketch::Distinct(hourglass_sketch::distinct::Distinct::Ull(ull)).encode()
    }

    const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

    #[test]
    fn hourly_values_are_stored_compressed_once_and_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path(), &options()).unwrap();
        let dense = dense_sketch(1);
        let small = sketch(3);
        let (k1, k2) = (key(1, 10, 1, 1), key(1, 11, 1, 1));
        store
            .put_hourly(&[
                (k1, 7, Bytes::from(dense.clone())),
                (k2, 8, Bytes::from(small.clone())),
            ])
            .unwrap();
        let raw = get_raw(&store, "hourly", &k1.encode()).unwrap();
        assert_eq!(raw[..8], 7u64.to_be_bytes());
        assert_eq!(
            raw[8..12],
            ZSTD_MAGIC,
            "a dense sketch is stored compressed"
        );
        assert!(
            raw.len() < dense.len() / 2,
            "{} bytes stored for a {}-byte sketch",
            raw.len(),
            dense.len()
        );
        // A sketch that compression does not shrink is stored as it is.
        let raw = get_raw(&store, "hourly", &k2.encode()).unwrap();
        if raw[8..].starts_with(&ZSTD_MAGIC) {
            assert!(raw.len() - 8 < small.len());
        } else {
            assert_eq!(raw[8..], small[..]);
        }
        let got = scan_all(&store, 1, 0..100);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].1.version, &got[0].1.sketch), (7, &dense));
        assert_eq!((got[1].1.version, &got[1].1.sketch), (8, &small));
        // A version comparison reads the version in front, compressed or not.
        let outcomes = store
            .put_hourly(&[(k1, 7, Bytes::from(dense_sketch(2)))])
            .unwrap();
        assert_eq!(outcomes, vec![PutOutcome::Stale { held: 7 }]);
    }

    #[test]
    fn a_version_1_store_opens_reads_its_raw_values_and_is_raised_to_version_2() {
        let dir = tempfile::tempdir().unwrap();
        let dense = dense_sketch(1);
        let uncompressed = StoreOptions {
            compression: false,
            ..options()
        };
        {
            // What a build before compressed values wrote: raw values, schema version 1.
            let store = RocksStore::open(dir.path(), &uncompressed).unwrap();
            store
                .put_hourly(&[(key(1, 10, 1, 1), 7, Bytes::from(dense.clone()))])
                .unwrap();
            let raw = get_raw(&store, "hourly", &key(1, 10, 1, 1).encode()).unwrap();
            assert_eq!(raw[8..], dense[..]);
            put_raw(&store, "meta", b"schema_version", &1u32.to_be_bytes());
        }
        let store = RocksStore::open(dir.path(), &options()).unwrap();
        assert_eq!(
            get_raw(&store, "meta", b"schema_version").unwrap(),
            2u32.to_be_bytes()
        );
        let later = dense_sketch(2);
        store
            .put_hourly(&[(key(1, 11, 1, 1), 8, Bytes::from(later.clone()))])
            .unwrap();
        let got = scan_all(&store, 1, 0..100);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1.sketch, dense, "the raw value reads as it was");
        assert_eq!(
            got[1].1.sketch, later,
            "the compressed one reads back exactly"
        );
    }

    #[test]
    fn a_damaged_compressed_value_never_decodes_and_never_panics() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path(), &options()).unwrap();
        let k = key(1, 10, 1, 1);
        store
            .put_hourly(&[(k, 7, Bytes::from(dense_sketch(1)))])
            .unwrap();
        let good = get_raw(&store, "hourly", &k.encode()).unwrap();
        let mut cut = good.clone();
        cut.truncate(good.len() - 20);
        let mut flipped = good.clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0xFF;
        // A frame header claiming 2^40 bytes of content.
        let mut huge = 7u64.to_be_bytes().to_vec();
        huge.extend_from_slice(&ZSTD_MAGIC);
        huge.extend_from_slice(&[0xE0, 0, 0, 0, 0, 0, 1, 0, 0]);
        let mut magic_only = 7u64.to_be_bytes().to_vec();
        magic_only.extend_from_slice(&ZSTD_MAGIC);
        for damaged in [cut, flipped, huge, magic_only] {
            put_raw(&store, "hourly", &k.encode(), &damaged);
            let mut seen = 0;
            let result = store.scan_hourly(SeriesId(1), Hour(0)..Hour(100), &mut |_, s| {
                // A flipped bit may still unpack: then the frame's own checksum refuses it.
                assert!(hourglass_sketch::Sketch::decode(&s.sketch).is_err());
                seen += 1;
                true
            });
            match result {
                Err(StoreError::BadValue {
                    column,
                    key,
                    reason,
                }) => {
                    assert_eq!((column, key), ("hourly", k.encode().to_vec()));
                    assert!(reason.contains("compressed hourly value"), "{reason}");
                }
                Ok(()) => assert_eq!(seen, 1),
                Err(other) => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_foreign_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(true);
            let db = rocksdb::DB::open(&opts, dir.path()).unwrap();
            db.put(b"hello", b"world").unwrap();
        }
        let err = RocksStore::open(dir.path(), &options()).unwrap_err();
        assert!(matches!(err, StoreError::NotAStore { .. }), "{err:?}");
    }

    #[test]
    fn corrupt_values_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path(), &options()).unwrap();
        let k = key(1, 1, 1, 1);
        put_raw(&store, "hourly", &k.encode(), &[0, 1, 2]);
        let err = store.scan_hourly(SeriesId(1), Hour(0)..Hour(2), &mut |_, _| true);
        assert!(
            matches!(
                err,
                Err(StoreError::BadValue {
                    column: "hourly",
                    ..
                })
            ),
            "{err:?}"
        );
        // A write over the damaged row reports it rather than guessing the held version.
        let err = store.put_hourly(&[(k, 9, sketch(9).into())]);
        assert!(matches!(err, Err(StoreError::BadValue { .. })), "{err:?}");
        // A key of the wrong length in the hourly column family.
        put_raw(&store, "hourly", &[0, 0, 0, 2, 0, 0, 0, 1, 9], &[0; 30]);
        let err = store.scan_hourly(SeriesId(2), Hour(0)..Hour(5), &mut |_, _| true);
        assert!(matches!(err, Err(StoreError::BadKey { .. })), "{err:?}");
        let err = store.delete_hourly_before(Day(5), &none());
        assert!(matches!(err, Err(StoreError::BadKey { .. })), "{err:?}");
        // Damaged dictionary entries.
        put_raw(&store, "meta", b"series/id/\0\0\0\x07", &[1, 0, 0, 0, 200]);
        let err = store.list_series().unwrap_err();
        assert!(
            matches!(err, StoreError::BadValue { column: "meta", .. }),
            "{err:?}"
        );
        put_raw(&store, "meta", b"server/id/\0\0\0\x07", &[0xff; 4]);
        let err = store.list_servers().unwrap_err();
        assert!(matches!(err, StoreError::BadValue { .. }), "{err:?}");
        put_raw(&store, "meta", b"server/name/x", &[1, 2]);
        let err = store.server_id("x").unwrap_err();
        assert!(matches!(err, StoreError::BadValue { .. }), "{err:?}");
    }

    #[test]
    fn sync_can_be_turned_off() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(
            dir.path(),
            &StoreOptions {
                sync_writes: false,
                ..options()
            },
        )
        .unwrap();
        store
            .put_hourly(&[(key(1, 1, 1, 1), 1, sketch(1).into())])
            .unwrap();
        assert_eq!(scan_all(&store, 1, 0..2).len(), 1);
    }
}

/// How well each kind's encoding compresses in the store (each hourly value compressed as
/// it is written, since schema version 2): the measurement behind the compression choice
/// in docs/STORAGE.md. Not a check, so ignored by default; run with
/// `cargo test -p hourglass-aggregator --release -- --ignored --nocapture measure_compression`.
#[test]
#[ignore]
fn measure_compression() {
    use hourglass_sketch::bloom::Bloom;
    use hourglass_sketch::frequency::{Frequency, FrequencyParams};

    const ROWS: u32 = 40;
    let item = |row: u32, i: u64| format!("user-{row}-{i}").into_bytes();
    type MakeSketch = Box<dyn Fn(u32) -> Vec<u8>>;
    let ull = move |n: u64| -> MakeSketch {
        Box::new(move |row| {
            let mut s = hourglass_sketch::ull::Ull::new(13).unwrap();
            (0..n).for_each(|i| s.insert(&item(row, i)));
            hourglass_sketch::distinct::Distinct::from(s).encode()
        })
    };
    let kinds: [(&str, MakeSketch); 8] = [
        // The agent's default form and precision, at vs_redis's counts per server-hour
        // (500 to 5,000): sparse up to about 2,350 items, dense above.
        ("distinct, ULL p13 sparse, 500 items", ull(500)),
        ("distinct, ULL p13 sparse, 2,000 items", ull(2_000)),
        ("distinct, ULL p13 dense, 3,000 items", ull(3_000)),
        ("distinct, ULL p13 dense, 5,000 items", ull(5_000)),
        (
            "distinct, sparse (p14, 500 items)",
            Box::new(move |row| {
                let mut s = Hll::new(14).unwrap();
                (0..500).for_each(|i| s.insert(&item(row, i)));
                s.encode()
            }),
        ),
        (
            "distinct, dense (p14, 40k items)",
            Box::new(move |row| {
                let mut s = Hll::new(14).unwrap();
                (0..40_000).for_each(|i| s.insert(&item(row, i)));
                s.encode()
            }),
        ),
        (
            "frequency (eps 0.001, delta 0.01, 20k events)",
            Box::new(move |row| {
                let params = FrequencyParams::from_error(0.001, 0.01).unwrap();
                let mut s = Frequency::new(params).unwrap();
                // Skewed: item i*i mod 5000, so a few items are frequent.
                (0..20_000u64).for_each(|i| s.insert(&item(row, i * i % 5000)).unwrap());
                s.encode()
            }),
        ),
        (
            "membership (100k capacity, 1% fpr, 20k items)",
            Box::new(move |row| {
                let mut s = Bloom::new(100_000, 0.01).unwrap();
                (0..20_000).for_each(|i| s.insert(&item(row, i)));
                s.encode()
            }),
        ),
    ];
    println!("| kind | value bytes | none | compressed, after a flush | after a full compaction |");
    println!("|---|---|---|---|---|");
    for (name, make) in &kinds {
        let batch: Vec<_> = (0..ROWS)
            .map(|row| (key(1, 1, row + 1, 0), 1, Bytes::from(make(row))))
            .collect();
        let raw: usize = batch.iter().map(|(_, _, s)| s.len() + 8).sum();
        let sst_bytes = |compression: bool, compact: bool| {
            let dir = tempfile::tempdir().unwrap();
            let options = StoreOptions {
                compression,
                sync_writes: false,
                ..StoreOptions::default()
            };
            let store = RocksStore::open(dir.path(), &options).unwrap();
            store.put_hourly(&batch).unwrap();
            store.flush().unwrap();
            if compact {
                // Everything moves to the bottommost level.
                store.compact().unwrap();
            }
            store.stats().unwrap().column_families[0].sst_bytes
        };
        let none = sst_bytes(false, false);
        let l0 = sst_bytes(true, false);
        let zstd = sst_bytes(true, true);
        let pct = |n: u64| format!("{n} ({:.0}%)", 100.0 * n as f64 / raw as f64);
        println!(
            "| {name} | {} | {} | {} | {} |",
            raw / ROWS as usize,
            pct(none),
            pct(l0),
            pct(zstd)
        );
    }
}
