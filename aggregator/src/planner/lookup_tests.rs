//! Membership lookups over a range (`lookup.rs`): which filters a lookup consults (late
//! rows of expired days, every epoch, day rollups) and the rates it states.

use super::*;
use crate::keys::Epoch;
use crate::rollup::build_dirty_days;
use crate::store::{Dictionaries, Hourly, MemoryStore, Retention};
use hourglass_sketch::bloom::Bloom;
use hourglass_sketch::hash::item_hash;
use hourglass_sketch::membership::{RangeAnswer, RangeSizing};

fn filter_of(items: &[&[u8]]) -> Vec<u8> {
    let mut b = Bloom::new(1000, 0.01).unwrap();
    for item in items {
        b.insert(item);
    }
    Sketch::Membership(b).encode()
}

/// One server `s1` live hours 0..48 and one membership series `users`, every hour holding
/// "regular" (epoch 1).
fn store_with_two_days() -> (MemoryStore, SeriesId, ServerId) {
    let store = MemoryStore::new();
    let server = store.register_server("s1", &[]).unwrap();
    let live: Vec<Hour> = (0..48).map(Hour).collect();
    store.mark_live(server, &live).unwrap();
    let series = store
        .series_id_or_create(&SeriesName::new("users", Vec::new(), Kind::Membership))
        .unwrap();
    let batch: Vec<(HourKey, u64, crate::store::Bytes)> = live
        .iter()
        .map(|&hour| {
            let key = HourKey {
                series,
                hour,
                server,
                epoch: Epoch(1),
            };
            (key, 1, filter_of(&[b"regular"]).into())
        })
        .collect();
    store.put_hourly(&batch).unwrap();
    (store, series, server)
}

fn users(hours: Range<Hour>) -> Selector {
    Selector {
        metric: "users".into(),
        kind: Kind::Membership,
        tags: Vec::new(),
        hours,
        servers: Vec::new(),
        labels: Vec::new(),
        group_by: GroupBy::None,
    }
}

fn looked_up(store: &MemoryStore, sel: &Selector, item: &[u8]) -> RangeAnswer {
    let a = Planner::new(store)
        .look_up(item_hash(item))
        .answer(sel)
        .unwrap();
    combine_rows(&a.total.filters).unwrap().answer
}

/// A snapshot stored into a day whose hourly rows retention deleted (the store accepts
/// it; see planner/tests.rs `a_late_row_in_an_expired_day_...`) is a stored filter of the
/// selection, and the rollup builder never rolls late rows in (rollup.rs
/// `keep_expired_day`): a lookup of an expired day consults its late rows beside its
/// rollups (it merges nothing), so an item only in that row is never answered
/// "definitely absent".
#[test]
fn a_late_row_in_an_expired_day_is_consulted() {
    let (store, series, server) = store_with_two_days();
    build_dirty_days(&store, Day(2), 100).unwrap();
    assert!(
        store
            .delete_hourly_before(Day(1), &std::collections::BTreeSet::new())
            .unwrap()
            > 0
    );
    let key = HourKey {
        series,
        hour: Hour(3),
        server,
        epoch: Epoch(9),
    };
    store
        .put_hourly(&[(key, 1, filter_of(&[b"late-user"]).into())])
        .unwrap();
    // The row is stored (and stays stored after a builder pass).
    build_dirty_days(&store, Day(2), 100).unwrap();
    let mut stored = 0;
    store
        .scan_hourly(series, Hour(0)..Hour(24), &mut |_, _| {
            stored += 1;
            true
        })
        .unwrap();
    assert_eq!(stored, 1, "test setup: the late row is stored");
    let a = looked_up(&store, &users(Hour(0)..Hour(24)), b"late-user");
    assert!(
        !a.is_definitely_absent(),
        "an item in a stored filter of the selection (server s1, hour 3, epoch 9) answered {a:?}"
    );
}

/// Every epoch of a server-hour is its own filter; a day rollup
/// answers past hourly retention; a present item is found in each.
#[test]
fn a_lookup_finds_each_epoch_and_each_rollup() {
    let (store, series, server) = store_with_two_days();
    let key = HourKey {
        series,
        hour: Hour(30),
        server,
        epoch: Epoch(2),
    };
    store
        .put_hourly(&[(key, 1, filter_of(&[b"second-epoch"]).into())])
        .unwrap();
    match looked_up(&store, &users(Hour(24)..Hour(48)), b"second-epoch") {
        RangeAnswer::Seen {
            consulted, where_, ..
        } => {
            assert_eq!(consulted, 25);
            assert_eq!(where_.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    build_dirty_days(&store, Day(2), 100).unwrap();
    store
        .delete_hourly_before(Day(1), &std::collections::BTreeSet::new())
        .unwrap();
    let a = looked_up(&store, &users(Hour(0)..Hour(48)), b"regular");
    match a {
        RangeAnswer::Seen {
            consulted, where_, ..
        } => assert_eq!((consulted, where_.len()), (1 + 25, 1 + 24)),
        other => panic!("{other:?}"),
    }
}

/// `estimated_fpr` (documented in query.proto as "the probability that the 'maybe'
/// answers are all wrong") is `range_fpr` when an item is seen, not
/// `all_false_probability`, the chance that the *particular* filters that said "maybe"
/// would, computed after seeing which did: over N filters an absent item says "maybe"
/// somewhere with probability `range_fpr` ≈ N·f, and then in one filter of rate f, which
/// would state ≈ f, N times smaller than the rate at which absent items get
/// `maybe_present`. Here 200 filters sized for 20% over the range: absent items come back
/// `maybe_present` about 20% of the time.
#[test]
fn estimated_fpr_is_not_understated_for_absent_items() {
    let n_filters = 200u64;
    let sizing = RangeSizing::for_range(n_filters, 100, 0.2).unwrap();
    let filters: Vec<Bloom> = (0..n_filters)
        .map(|f| {
            let mut b = sizing.new_filter().unwrap();
            for i in 0..100u64 {
                b.insert(&(f * 1000 + i).to_le_bytes());
            }
            b
        })
        .collect();
    let probes = 1500u64;
    let (mut maybe, mut stated_sum, mut range_fpr) = (0u64, 0.0f64, 0.0f64);
    for p in 0..probes {
        let hash = item_hash(&(1u64 << 40 | p).to_le_bytes());
        let rows: Vec<FilterRow> = filters
            .iter()
            .enumerate()
            .map(|(i, f)| FilterRow::of(f.clone(), hash, "s1", i as u32, 1, "users{}", 1))
            .collect();
        let a = crate::convert::membership(&rows).unwrap();
        range_fpr = a.range_fpr;
        if a.maybe_present {
            maybe += 1;
            stated_sum += a.estimated_fpr;
            // estimated_fpr is range_fpr when seen, not all_false_probability.
            assert_eq!(a.estimated_fpr, a.range_fpr);
        }
    }
    assert!(maybe > 0, "test setup");
    let measured = maybe as f64 / probes as f64;
    let stated = stated_sum / maybe as f64;
    assert!(
        stated >= measured / 2.0,
        "absent items answered maybe_present {measured:.3} of the time (range_fpr {range_fpr:.3}), \
         each such answer stating estimated_fpr = all_false_probability {stated:.2e} on average"
    );
}

/// Filters of different sizes holding the same items (a metric resized by
/// `membership_range` mid-range, or servers of different capacity) are not multiplied as
/// independent: Lemire-reduced positions make their false positives nearly coincide, so
/// an item absent from both but seen in both is not stated all-false with the product of
/// their rates. (The same rule at the sketch's level is tested in the sketch crate.)
#[test]
fn mixed_sizes_all_false_probability_is_not_understated() {
    let mut old = Bloom::new(1000, 0.05).unwrap();
    let mut new = RangeSizing::for_range(168, 1000, 0.3)
        .unwrap()
        .new_filter()
        .unwrap();
    assert_ne!(old.bits(), new.bits(), "test setup");
    for i in 0..1000u64 {
        old.insert(&i.to_le_bytes());
        new.insert(&i.to_le_bytes());
    }
    let probes = 300_000u64;
    let (mut both, mut stated) = (0u64, None);
    for p in 0..probes {
        let item = (1u64 << 41 | p).to_le_bytes();
        if old.contains(&item) && new.contains(&item) {
            both += 1;
            if stated.is_none() {
                let hash = item_hash(&item);
                let rows = [
                    FilterRow::of(old.clone(), hash, "s1", 0, 1, "users{}", 1),
                    FilterRow::of(new.clone(), hash, "s1", 1, 1, "users{}", 1),
                ];
                stated = Some(
                    crate::convert::membership(&rows)
                        .unwrap()
                        .all_false_probability,
                );
            }
        }
    }
    let measured = both as f64 / probes as f64;
    let stated = stated.expect("test setup: no double positive");
    assert!(
        measured <= 2.0 * stated,
        "stated all_false_probability {stated:.3e}, measured {measured:.3e} ({:.0}x); \
         old {} bits k {} fpr {:.3e}, new {} bits k {} fpr {:.3e}",
        measured / stated,
        old.bits(),
        old.hashes(),
        old.estimated_fpr(),
        new.bits(),
        new.hashes(),
        new.estimated_fpr(),
    );
}
